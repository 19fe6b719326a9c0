// The JS client's first minutes in headless Chromium (issue 61, items 1, 2, 3 and 7), against a
// gateway whose window is 3 events (delivery.max_in_flight = 3):
// - a subscribe() made before connect() to a topic nothing was ever published to waits for the
//   session and creates the topic; with `autoAck` a handler that returns acks its event and one
//   that throws nacks it, so it comes again (attempt 2) and is acked then;
// - a handler that never acks fills the window: `stalled` is emitted once;
// - the browser going offline drops the connection without spending attempts, and online again
//   reconnects at once: what was published meanwhile arrives.
//
//   node tests/browser/lifecycle.mjs http://127.0.0.1:PORT
//
// Prints `lifecycle: ...` lines; exits non-zero with the page's log on any failure.
import { committed, keepLog, openPage, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: lifecycle.mjs BASE_URL");
  process.exit(2);
}

const run = Date.now().toString(36);
const { browser, page, problems } = await openPage(base);
const log = keepLog(page);
const state = () => page.evaluate(() => window.lifecycle);

try {
  await openTestPage(page, base);
  await page.evaluate(() => (window.lifecycle = {}));

  // Items 1 to 3: subscribe first, to a topic that does not exist yet; autoAck.
  const first = { clientId: `browser-first-${run}`, topic: `first-${run}` };
  await page.evaluate(async ({ clientId, topic }) => {
    const { AckgateClient } = await import("/static/ackgate.min.js");
    const seen = (window.lifecycle.first = { attempts: [], subscribed: null, states: [] });
    const client = new AckgateClient(`ws://${location.host}/ws`, {
      clientId,
      tabs: "own",
      autoAck: true,
      onState: (s) => seen.states.push(s),
      onEvent: (event) => {
        seen.attempts.push([event.payload.n, event.attempt]);
        if (event.payload.n === 1 && event.attempt === 1) throw new Error("not this time");
      },
    });
    window.firstClient = client;
    const subscribing = client.subscribe(topic).then((frame) => (seen.subscribed = frame.topic));
    await client.connect();
    await subscribing;
  }, first);
  if ((await state()).first.subscribed !== first.topic) throw new Error(`subscribed: ${JSON.stringify(await state())}`);
  await publish(base, first.topic, [0, 1, 2].map((n) => ({ partition: 0, payload: { n } })));
  await until("the first topic's acks", async () => (await committed(base, first.topic, first.clientId)) === 3);
  const attempts = (await state()).first.attempts.map(([n, a]) => `${n}@${a}`).sort();
  if (JSON.stringify(attempts) !== JSON.stringify(["0@1", "1@1", "1@2", "2@1"])) throw new Error(`attempts ${attempts}`);
  console.log(`lifecycle: subscribed before connect to a new topic, autoAck acked 0 and 2, the throwing handler's 1 came again as attempt 2 and was acked (committed 3)`);
  await page.evaluate(() => window.firstClient.close());

  // Item 3: a handler that never acks fills the window; stalled once.
  const stall = { clientId: `browser-stall-${run}`, topic: `stall-${run}` };
  await page.evaluate(async ({ clientId, topic }) => {
    const { AckgateClient } = await import("/static/ackgate.min.js");
    const seen = (window.lifecycle.stall = { received: 0, stalled: [] });
    const client = new AckgateClient(`ws://${location.host}/ws`, {
      clientId,
      tabs: "own",
      stalledAfterMs: 500,
      onEvent: () => (seen.received += 1),
      onStalled: (info) => seen.stalled.push(info),
    });
    window.stallClient = client;
    await client.connect();
    await client.subscribe(topic);
  }, stall);
  await publish(base, stall.topic, [0, 1, 2, 3, 4].map((n) => ({ partition: 0, payload: { n } })));
  await until("stalled", async () => (await state()).stall.stalled.length > 0);
  await new Promise((r) => setTimeout(r, 1000));
  const stalled = (await state()).stall;
  if (stalled.received !== 3 || stalled.stalled.length !== 1) throw new Error(`stall: ${JSON.stringify(stalled)}`);
  console.log(`lifecycle: a handler that never acks filled the window of 3 and stalled was emitted once`);
  await page.evaluate(() => window.stallClient.close());

  // Item 7: offline drops the connection and waits; online reconnects at once.
  const net = { clientId: `browser-net-${run}`, topic: `net-${run}` };
  await page.evaluate(async ({ clientId, topic }) => {
    const { AckgateClient } = await import("/static/ackgate.min.js");
    const seen = (window.lifecycle.net = { received: [], states: [], reconnects: 0 });
    const client = new AckgateClient(`ws://${location.host}/ws`, {
      clientId,
      tabs: "own",
      autoAck: true,
      backoffMs: 20_000,
      maxBackoffMs: 20_000,
      onState: (s) => seen.states.push(s),
      onReconnect: () => (seen.reconnects += 1),
      onEvent: (event) => seen.received.push(event.payload.n),
    });
    await client.connect();
    await client.subscribe(topic);
  }, net);
  await page.context().setOffline(true);
  await until("reconnecting while offline", async () => (await state()).net.states.at(-1) === "reconnecting");
  await publish(base, net.topic, [0, 1].map((n) => ({ partition: 0, payload: { n } })));
  await new Promise((r) => setTimeout(r, 1000));
  const offline = await state();
  if (offline.net.received.length !== 0) throw new Error(`received while offline: ${JSON.stringify(offline.net)}`);
  const started = Date.now();
  await page.context().setOffline(false);
  // Far sooner than the 20 s backoff: online ends the pause.
  await until("the events after coming back online", async () => (await state()).net.received.length === 2, 10000);
  const back = await state();
  if (back.net.states.at(-1) !== "connected") throw new Error(`after online: ${JSON.stringify(back.net)}`);
  console.log(`lifecycle: offline dropped the connection (reconnecting), online reconnected at once: 2 events published meanwhile arrived ${Date.now() - started} ms after`);
  // The throwing handler's error is reported to the page (as a listener's error is): expected.
  const unexpected = problems.filter((p) => !p.includes("not this time"));
  if (unexpected.length) throw new Error(unexpected.join("\n"));
} catch (e) {
  console.error(`browser lifecycle test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
