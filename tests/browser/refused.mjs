// Refused credentials in headless Chromium (issue 61, item 4): a browser cannot read the status
// of a refused WebSocket handshake, so the gateway accepts the upgrade, says why in an `error`
// frame and closes with 1008 (over SSE: the same in the stream). The JS client turns that into
// the final `failed` state with the code, rejects connect() with it, and never tries again. A
// token signed with another secret is `unauthorized`, a valid token of another client
// `forbidden`, on a WebSocket and on Server-Sent Events.
//
//   node tests/browser/refused.mjs http://127.0.0.1:PORT JWT_SECRET
//
// Prints one `refused: ...` line per case; exits non-zero with the page's log on any failure.
import { createHmac } from "node:crypto";
import { keepLog, openPage, openTestPage } from "./page.mjs";

const [base, secret] = process.argv.slice(2);
if (!base || !secret) {
  console.error("usage: refused.mjs BASE_URL JWT_SECRET");
  process.exit(2);
}

/** An HS256 JWT for `sub`, signed with `key`, valid for an hour. */
function jwt(sub, key) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part({ sub, exp: Math.floor(Date.now() / 1000) + 3600 })}`;
  return `${unsigned}.${createHmac("sha256", key).update(unsigned).digest("base64url")}`;
}

const { browser, page, problems } = await openPage(base);
const log = keepLog(page);
const run = Date.now().toString(36);
const cases = [
  { transport: "websocket", clientId: `refused-a-${run}`, token: jwt(`refused-a-${run}`, "another-secret-of-at-least-32-bytes!!"), want: "unauthorized" },
  { transport: "websocket", clientId: `refused-b-${run}`, token: jwt(`someone-else-${run}`, secret), want: "forbidden" },
  { transport: "sse", clientId: `refused-c-${run}`, token: jwt(`refused-c-${run}`, "another-secret-of-at-least-32-bytes!!"), want: "unauthorized" },
];

try {
  await openTestPage(page, base);
  for (const { transport, clientId, token, want } of cases) {
    const seen = await page.evaluate(
      async ([transport, clientId, token]) => {
        const { AckgateClient } = await import("/static/ackgate.js");
        // Every connection the client opens, counted: a failure must not be retried.
        const opened = { count: 0 };
        const Counted = (Base) =>
          class extends Base {
            constructor(...args) {
              super(...args);
              opened.count += 1;
            }
          };
        const reports = { reconnects: 0, failed: [], states: [] };
        const client = new AckgateClient(`ws://${location.host}/ws`, {
          clientId,
          token,
          transport,
          WebSocket: Counted(WebSocket),
          EventSource: Counted(EventSource),
          backoffMs: 50,
          onReconnect: () => (reports.reconnects += 1),
          onFailed: (failure) => reports.failed.push(failure),
        });
        client.on?.("state", (state) => reports.states.push(state));
        let rejected = null;
        try {
          await client.connect();
        } catch (e) {
          rejected = e.code;
        }
        // Long enough for several of the backoff's attempts, had it retried.
        await new Promise((r) => setTimeout(r, 2000));
        return { rejected, state: client.state, failure: client.failure, opened: opened.count, ...reports };
      },
      [transport, clientId, token],
    );
    const { rejected, state, failure, opened, reconnects, failed } = seen;
    if (rejected !== want) throw new Error(`${transport} ${want}: connect() rejected with ${rejected}: ${JSON.stringify(seen)}`);
    if (state !== "failed" || failure?.code !== want || failure?.closeCode !== 1008) throw new Error(`${transport} ${want}: not failed for good: ${JSON.stringify(seen)}`);
    if (failed.length !== 1 || failed[0].code !== want) throw new Error(`${transport} ${want}: onFailed ${JSON.stringify(failed)}`);
    if (opened !== 1 || reconnects !== 0) throw new Error(`${transport} ${want}: tried again: ${opened} connections, ${reconnects} reconnects`);
    console.log(`refused: ${transport} ${want}, failed with close 1008, one connection, no retry`);
  }
  if (problems.length) throw new Error(problems.join("\n"));
} catch (e) {
  console.error(`browser refused test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
