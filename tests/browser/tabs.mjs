// Two tabs of one origin with the same client id share one session (issue 42, item 3), in
// headless Chromium: two pages of one browser context, each subscribed to a topic of its own.
// The gateway sees one session; each tab gets only its own topic's events; the follower's acks
// go through the leader and land. Then the leader tab is closed: the other tab takes the Web
// Lock, connects and subscribes again with its resume token (checked on the frame its socket
// sends: the gateway's stored offset alone would hide a missing token), and the events published
// meanwhile and after reach it: none lost, none acked before the handover delivered again (those
// in flight then may come twice: at least once).
//
//   node tests/browser/tabs.mjs http://127.0.0.1:PORT
//
// Prints `shared: ...` and `handover: ...`; exits non-zero with both pages' logs on any failure.
import { call, committed, createTopic, keepLog, openBrowser, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: tabs.mjs BASE_URL");
  process.exit(2);
}

const run = Date.now().toString(36);
const clientId = `browser-tabs-${run}`;
const [topicA, topicB] = [`tabs-a-${run}`, `tabs-b-${run}`];

const { browser, problems, newPage } = await openBrowser(base);
const one = await newPage();
const two = await newPage();
const logs = [one, two].map((page, i) => keepLog(page, `tab ${i + 1}`));
// The frames tab 2's own sockets send (it has one only once it leads).
const sentByTwo = [];
two.on("websocket", (socket) => socket.on("framesent", ({ payload }) => sentByTwo.push(JSON.parse(String(payload)))));

/** Connects the tab's client, subscribes to `topic` and acks every event it gets. */
async function start(page, topic) {
  await openTestPage(page, base);
  return page.evaluate(
    async ([clientId, topic]) => {
      const { AckgateClient } = await import("/static/ackgate.js");
      const state = (window.tabTest = { received: [], states: [] });
      const client = new AckgateClient(`ws://${location.host}/ws`, { clientId, confirmEveryMs: 200, backoffMs: 100, onState: (s) => state.states.push(s) });
      window.tabClient = client;
      const welcome = await client.connect();
      await client.subscribe(topic);
      void (async () => {
        for await (const event of client.events()) {
          state.received.push({ topic: event.topic, offset: event.offset, session: client.welcome.session_id });
          client.ack(event.delivery_id);
        }
      })();
      return welcome.session_id;
    },
    [clientId, topic],
  );
}

const received = (page) => page.evaluate(() => window.tabTest.received);
const sessions = async () => (await call("GET", `${base}/admin/sessions`)).answer.sessions.filter((s) => s.client_id === clientId);
const numbered = (from, n) => Array.from({ length: n }, (_, i) => ({ partition: 0, payload: { n: from + i } }));

try {
  await createTopic(base, topicA);
  await createTopic(base, topicB);
  const first = await start(one, topicA);
  const second = await start(two, topicB);
  if (first !== second) throw new Error(`two sessions: ${first} and ${second}`);
  const live = await sessions();
  if (live.length !== 1) throw new Error(`the gateway has ${live.length} sessions of ${clientId}: ${JSON.stringify(live)}`);

  await publish(base, topicA, numbered(0, 5));
  await publish(base, topicB, numbered(0, 5));
  await until("each tab's events", async () => (await received(one)).length === 5 && (await received(two)).length === 5);
  const [gotA, gotB] = [await received(one), await received(two)];
  if (gotA.some((e) => e.topic !== topicA) || gotB.some((e) => e.topic !== topicB)) throw new Error(`a tab got another's events: ${JSON.stringify({ gotA, gotB })}`);
  await until("the acks of both tabs", async () => (await committed(base, topicA, clientId)) === 5 && (await committed(base, topicB, clientId)) === 5);
  console.log(`shared: one session ${first} for two tabs, each got its own 5 events, both tabs' acks landed`);

  // Tab 2's token covers its 5 acks (a trailing confirmation, confirmEveryMs after them).
  await until("tab 2's resume token", async () => (await two.evaluate((topic) => window.tabClient.resumeToken(topic)[0], topicB)) === 5);
  // The leader tab goes; events published during the handover and after must reach the other.
  await one.close();
  await publish(base, topicB, numbered(5, 3));
  const next = await until("a new session led by tab 2", async () => {
    const [session] = await sessions();
    return session && session.session_id !== first && session;
  });
  const resubscribe = await until("tab 2's subscribe on its own socket", () => sentByTwo.find((f) => f.op === "subscribe" && f.topic === topicB));
  // The token the gateway issued for the topic (opaque), as the leader was told it.
  if (typeof resubscribe.resume !== "string" || !resubscribe.resume.startsWith("r1.")) throw new Error(`tab 2 subscribed again without its token: ${JSON.stringify(resubscribe)}`);
  await publish(base, topicB, numbered(8, 2));
  await until("tab 2's events after the handover", async () => (await received(two)).length >= 10);
  // Events in flight at the handover may come twice (at least once); none may be missing, and
  // none acked (durably) before the handover may come again.
  const offsets = (await received(two)).map((e) => e.offset);
  const missing = [...Array(10).keys()].filter((o) => !offsets.includes(o));
  const again = offsets.filter((o, i) => o < 5 && offsets.indexOf(o) !== i);
  if (missing.length || again.length || offsets.length > 13) throw new Error(`tab 2 received ${JSON.stringify(offsets)}`);
  await until("tab 2's acks after the handover", async () => (await committed(base, topicB, clientId)) === 10);
  const [session] = await sessions();
  if (JSON.stringify(session.subscriptions) !== JSON.stringify([topicB])) throw new Error(`the new session subscribes ${JSON.stringify(session.subscriptions)}: tab 1's topic must go with it`);
  const states = await two.evaluate(() => window.tabTest.states);
  if (problems.length) throw new Error(problems.join("\n"));
  const twice = offsets.length - 10;
  console.log(`handover: tab 2 leads session ${next.session_id}, resubscribed with its token ${JSON.stringify(resubscribe.resume)}, received ${topicB} 0..9, none lost, none acked before it again (${twice} in flight then came twice), states ${states.join(" > ")}`);
} catch (e) {
  console.error(`browser tabs test failed: ${e.message}`);
  console.error([...problems, ...logs.flat()].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
