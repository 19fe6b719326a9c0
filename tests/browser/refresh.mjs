// A token that expires mid-stream, in headless Chromium (issue 42, item 1): the gateway checks
// JWTs (auth.jwt_secret) and sends `refresh_needed` auth.refresh_before_secs before one expires.
// The page's tokenProvider (signed here, HS256 with the secret given) hands out a first token
// that lives 4 s, then tokens of an hour. Events published before and after the first token's
// exp all arrive on the same session (refreshed in band, no close, no reconnect) and are acked.
//
//   node tests/browser/refresh.mjs http://127.0.0.1:PORT JWT_SECRET
//
// The gateway needs auth.refresh_before_secs below 4 (e.g. 2). Prints `refreshed: ...`; exits
// non-zero with the page's log on any failure.
import { createHmac } from "node:crypto";
import { committed, createTopic, keepLog, openPage, openTestPage, publish, until } from "./page.mjs";

const [base, secret] = process.argv.slice(2);
if (!base || !secret) {
  console.error("usage: refresh.mjs BASE_URL JWT_SECRET");
  process.exit(2);
}

const run = Date.now().toString(36);
const clientId = `browser-refresh-${run}`;
const topic = `refresh-${run}`;

/** An HS256 JWT for `clientId` that expires in `seconds`. */
function jwt(seconds) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part({ sub: clientId, exp: Math.floor(Date.now() / 1000) + seconds })}`;
  return `${unsigned}.${createHmac("sha256", secret).update(unsigned).digest("base64url")}`;
}

const { browser, page, problems } = await openPage(base);
const log = keepLog(page);

try {
  await createTopic(base, topic);
  const minted = [];
  await page.exposeFunction("mintToken", () => {
    const seconds = minted.length === 0 ? 4 : 3600;
    minted.push(Date.now() + seconds * 1000);
    return jwt(seconds);
  });
  await publish(base, topic, Array.from({ length: 3 }, (_, n) => ({ partition: 0, payload: { n } })));
  await openTestPage(page, base);
  const welcome = await page.evaluate(
    async ([clientId, topic]) => {
      const { AckgateClient } = await import("/static/ackgate.js");
      const state = (window.refreshTest = { received: [], closes: [], reconnects: [], errors: [] });
      const client = new AckgateClient(`ws://${location.host}/ws`, {
        clientId,
        tokenProvider: () => window.mintToken(),
        onClose: (c) => state.closes.push(c),
        onReconnect: (r) => state.reconnects.push(r),
        onError: (f) => state.errors.push(`${f.code}: ${f.message}`),
      });
      const welcome = await client.connect();
      await client.subscribe(topic);
      void (async () => {
        for await (const event of client.events()) {
          state.received.push({ offset: event.offset, session: client.welcome.session_id });
          client.ack(event.delivery_id);
        }
      })();
      return welcome;
    },
    [clientId, topic],
  );
  const state = () => page.evaluate(() => window.refreshTest);
  await until("the first events", async () => (await state()).received.length === 3);
  await until("the refreshed token", () => minted.length >= 2, 10000);
  // Past the first token's exp (the gateway would have closed with 4004 without the refresh).
  await new Promise((r) => setTimeout(r, Math.max(0, minted[0] - Date.now() + 1000)));
  await publish(base, topic, Array.from({ length: 3 }, (_, n) => ({ partition: 0, payload: { n: 3 + n } })));
  await until("the events after the exp", async () => (await state()).received.length >= 6);
  await until("every ack", async () => (await committed(base, topic, clientId)) === 6);
  const after = await state();
  const offsets = after.received.map((e) => e.offset);
  if (JSON.stringify(offsets) !== "[0,1,2,3,4,5]") throw new Error(`received ${JSON.stringify(offsets)}`);
  if (after.received.some((e) => e.session !== welcome.session_id)) throw new Error(`another session: ${JSON.stringify(after.received)}`);
  if (after.closes.length || after.reconnects.length || after.errors.length) throw new Error(`closes ${JSON.stringify(after.closes)}, reconnects ${JSON.stringify(after.reconnects)}, errors ${JSON.stringify(after.errors)}`);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`refreshed: session ${welcome.session_id} went on past its first token's exp, ${offsets.length} of 6 events received and acked, ${minted.length} tokens minted`);
} catch (e) {
  console.error(`browser refresh test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
