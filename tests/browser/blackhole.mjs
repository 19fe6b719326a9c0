// A connection that stops carrying bytes without closing (a laptop that slept, a network that
// changed under it), in headless Chromium (issue 42, item 4). The page is served through a TCP
// proxy in this script (its origin is the proxy's) and connects through it; then the proxy stops
// forwarding on the connections it holds, both ways, and closes nothing. A request made then
// rejects with `timeout` (requestTimeoutMs), the heartbeat finds the connection dead and abandons
// it (1006), and the client reconnects (new connections flow) and resumes at its token: the
// event published meanwhile arrives.
//
//   node tests/browser/blackhole.mjs http://127.0.0.1:PORT
//
// Prints `black hole: ...`; exits non-zero with the page's log on any failure.
import { createServer, connect } from "node:net";
import { committed, createTopic, keepLog, openBrowser, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: blackhole.mjs BASE_URL");
  process.exit(2);
}

const run = Date.now().toString(36);
const clientId = `browser-hole-${run}`;
const topic = `hole-${run}`;

/** A TCP proxy to `base` whose `hole()` stops the bytes of the connections open then. */
async function blackHoleProxy() {
  const target = new URL(base);
  const live = new Set();
  const server = createServer((client) => {
    const upstream = connect(Number(target.port), target.hostname);
    const pair = { client, upstream, holed: false };
    live.add(pair);
    client.on("data", (d) => pair.holed || upstream.write(d));
    upstream.on("data", (d) => pair.holed || client.write(d));
    const end = () => {
      live.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("close", end).on("error", end);
    upstream.on("close", end).on("error", end);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    hole: () => live.forEach((pair) => (pair.holed = true)),
    close: () => {
      live.forEach((pair) => pair.client.destroy());
      server.close();
    },
  };
}

const proxy = await blackHoleProxy();
const { browser, problems, newPage } = await openBrowser(base, proxy.origin);
const page = await newPage();
const log = keepLog(page);

try {
  await createTopic(base, topic);
  await publish(base, topic, [{ partition: 0, payload: { n: 0 } }, { partition: 0, payload: { n: 1 } }]);
  await openTestPage(page, proxy.origin);
  const welcome = await page.evaluate(
    async ([clientId, topic]) => {
      const { AckgateClient } = await import("/static/ackgate.js");
      const state = (window.holeTest = { received: [], closes: [], states: [] });
      const client = new AckgateClient(`ws://${location.host}/ws`, {
        clientId,
        heartbeatMs: 500,
        heartbeatTimeoutMs: 1000,
        requestTimeoutMs: 800,
        backoffMs: 100,
        onClose: (c) => state.closes.push({ ...c, at: Date.now() }),
        onState: (s) => state.states.push(s),
      });
      window.holeClient = client;
      const welcome = await client.connect();
      await client.subscribe(topic);
      void (async () => {
        for await (const event of client.events()) {
          state.received.push({ offset: event.offset, session: client.welcome.session_id });
          await client.ack(event.delivery_id, { confirm: true }).catch(() => {});
        }
      })();
      return welcome;
    },
    [clientId, topic],
  );
  const state = () => page.evaluate(() => window.holeTest);
  await until("the first events", async () => (await state()).received.length === 2);
  // Durable before the hole: the gateway starts the next session past them, whatever token comes.
  await until("their acks", async () => (await committed(base, topic, clientId)) === 2);

  proxy.hole();
  const holedAt = Date.now();
  const ping = await page.evaluate(async () => {
    const started = Date.now();
    try {
      await window.holeClient.ping();
      return { answered: true };
    } catch (e) {
      return { code: e.code, ms: Date.now() - started };
    }
  });
  if (ping.code !== "timeout") throw new Error(`a ping into the black hole: ${JSON.stringify(ping)}`);
  await until("the dead connection noticed", async () => (await state()).closes.some((c) => c.code === 1006), 10000);
  const noticed = (await state()).closes.find((c) => c.code === 1006).at - holedAt;
  await publish(base, topic, [{ partition: 0, payload: { n: 2 } }]);
  await until("the event published meanwhile, on a new session", async () => (await state()).received.length >= 3, 20000);
  const after = await state();
  const last = after.received.at(-1);
  if (last.offset !== 2 || last.session === welcome.session_id) throw new Error(`received ${JSON.stringify(after.received)}`);
  if (after.received.length !== 3) throw new Error(`acked events came again: ${JSON.stringify(after.received)}`);
  const fatal = problems.filter((p) => !p.includes("WebSocket"));
  if (fatal.length) throw new Error(fatal.join("\n"));
  console.log(
    `black hole: a ping rejected with timeout after ${ping.ms} ms, the connection abandoned (1006) ${noticed} ms after the hole, resumed on session ${last.session} at offset ${last.offset} (states ${after.states.join(" > ")})`,
  );
} catch (e) {
  console.error(`browser black hole test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
  proxy.close();
}
