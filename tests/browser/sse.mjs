// The JS client over Server-Sent Events in headless Chromium, on the browser's own EventSource:
// a page from the gateway imports /static/ackgate.js and connects with `transport: "sse"`;
// events published through the REST API arrive and are acked (plain, the last one confirmed),
// the client's committed offset moves (checked through /admin/offsets), /admin/sessions lists
// the session with "transport": "sse", and the page's requests were the stream (GET /sse) and
// POSTs to the welcome's ack_url.
//
//   node tests/browser/sse.mjs http://127.0.0.1:PORT [/tmp/sse.png]
//
// Prints `session: <session_id> (sse)` and `acked: <n> events, committed <offset>`.
//
// With ACKGATE_DEV_SSE_RESTART=1 it then prints `ready for restart` and waits (up to
// ACKGATE_DEV_SSE_RESTART_TIMEOUT_MS, default 60000) for the page's stream to fail and for the client
// to reconnect by itself: to the same URL (restart the gateway at the same address) or to an
// instance in ACKGATE_DEV_SSE_PEERS (comma-separated http base URLs, given to the client as `peers`).
// The reopened stream must carry `resume=`; it then publishes 3 events, which must arrive and be
// acked, and none of the events acked before the restart may come again. Prints
// `received after the restart: <offsets> on <session_id>`.
//
// ACKGATE_DEV_ADMIN_TOKEN, when the gateway has auth.admin_token, is sent on the REST calls.
// Exits non-zero (with the page's state) on any failure.
import { openPage } from "./page.mjs";

const [base, screenshot] = process.argv.slice(2);
if (!base) {
  console.error("usage: sse.mjs BASE_URL [SCREENSHOT_PATH]");
  process.exit(2);
}
const topic = process.env.ACKGATE_DEV_SSE_TOPIC || "web-sse";
const clientId = "browser-sse";
const restart = process.env.ACKGATE_DEV_SSE_RESTART === "1";
const restartTimeout = Number(process.env.ACKGATE_DEV_SSE_RESTART_TIMEOUT_MS || 60000);
const peers = (process.env.ACKGATE_DEV_SSE_PEERS || "").split(",").map((u) => u.trim()).filter(Boolean);
const instances = [base, ...peers];

async function call(method, url, body) {
  const headers = { "Content-Type": "application/json" };
  if (process.env.ACKGATE_DEV_ADMIN_TOKEN) headers.Authorization = `Bearer ${process.env.ACKGATE_DEV_ADMIN_TOKEN}`;
  const response = await fetch(url, { method, headers, body: body && JSON.stringify(body) });
  const answer = await response.json().catch(() => null);
  return { status: response.status, answer };
}

async function publish(at, events) {
  const { status, answer } = await call("POST", `${at}/topics/${topic}/events`, { events });
  if (status !== 200) throw new Error(`publishing to ${at}: ${status} ${JSON.stringify(answer)}`);
}

async function until(what, check, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const { browser, page, problems } = await openPage(...instances);
const requests = [];
page.on("console", (m) => m.type() === "error" && problems.push(`console error: ${m.text()}`));
page.on("request", (r) => requests.push({ method: r.method(), url: r.url(), type: r.resourceType() }));
const state = () => page.evaluate(() => window.sseTest).catch(() => null);

try {
  const created = await call("POST", `${base}/topics`, { name: topic, partitions: 1 });
  if (created.status !== 200 && created.answer?.error?.code !== "conflict") throw new Error(`creating ${topic}: ${created.status} ${JSON.stringify(created.answer)}`);

  // A page of the gateway's origin (the console), so the client's POSTs are same-origin.
  await page.goto(base + "/", { waitUntil: "load" });
  const native = await page.evaluate(() => typeof EventSource === "function" && EventSource.toString().includes("[native code]"));
  if (!native) throw new Error("the page has no native EventSource");
  const welcome = await page.evaluate(
    async ({ base, topic, clientId, peers }) => {
      const { AckgateClient } = await import(`${base}/static/ackgate.js`);
      const state = (window.sseTest = { received: [], confirmed: [], closes: [], reconnects: [], errors: [] });
      const client = new AckgateClient(`${base.replace(/^http/, "ws")}/ws`, {
        clientId,
        transport: "sse", // the browser's own EventSource: no EventSource option
        storage: sessionStorage,
        peers,
        backoffMs: 250,
        maxBackoffMs: 2000,
        onClose: ({ code, reason, final }) => state.closes.push({ code, reason, final }),
        onReconnect: ({ attempt, url, welcome, error }) => state.reconnects.push({ attempt, url, session_id: welcome?.session_id, error }),
        onError: (frame) => state.errors.push(`${frame.code}: ${frame.message}`),
      });
      window.sseClient = client;
      state.welcome = await client.connect();
      await client.subscribe(topic);
      (async () => {
        for await (const event of client.events()) {
          state.received.push({ offset: event.offset, attempt: event.attempt, payload: event.payload, session_id: client.welcome.session_id });
          if (event.payload?.last) {
            const ok = await client.ack(event.delivery_id, { confirm: true }).catch((e) => ({ error: e.message }));
            state.confirmed.push(ok);
          } else {
            client.ack(event.delivery_id);
          }
        }
      })();
      return state.welcome;
    },
    { base, topic, clientId, peers },
  );
  if (!welcome.ack_url) throw new Error(`the welcome has no ack_url: ${JSON.stringify(welcome)}`);

  const first = Array.from({ length: 5 }, (_, n) => ({ partition: 0, payload: { batch: "first", n, last: n === 4 } }));
  await publish(base, first);
  await page.waitForFunction(() => window.sseTest.confirmed.length === 1, null, { timeout: 10000 });
  const s = await state();
  const received = s.received.filter((e) => e.payload?.batch === "first");
  if (received.length !== 5) throw new Error(`received ${received.length} of 5: ${JSON.stringify(s.received)}`);
  const [ok] = s.confirmed;
  if (ok.error) throw new Error(`the confirmed ack failed: ${ok.error}`);
  const lastOffset = received[4].offset;
  if (ok.committed?.[topic]?.["0"] !== lastOffset + 1) throw new Error(`ack_ok says ${JSON.stringify(ok)}, expected ${lastOffset + 1}`);
  const committed = await until("the committed offset", async () => {
    const { status, answer } = await call("GET", `${base}/admin/offsets/${topic}/${clientId}`);
    return status === 200 && answer.partitions?.[0]?.committed === lastOffset + 1 && answer.partitions[0].committed;
  });
  const { answer: listed } = await call("GET", `${base}/admin/sessions`);
  const session = listed?.sessions?.find((x) => x.session_id === welcome.session_id);
  if (session?.transport !== "sse" || session.client_id !== clientId) throw new Error(`/admin/sessions: ${JSON.stringify(listed)}`);
  const streams = requests.filter((r) => r.method === "GET" && new URL(r.url).pathname === "/sse");
  const posts = requests.filter((r) => r.method === "POST" && r.url === `${base}${welcome.ack_url}`);
  if (streams.length !== 1 || posts.length === 0) throw new Error(`requests: ${JSON.stringify(requests.filter((r) => r.url.includes("/sse")))}`);
  // The console (another tab) lists the session with its transport.
  const consolePage = await browser.newPage();
  await consolePage.goto(`${base}/`);
  await consolePage.waitForFunction(
    (id) => [...document.querySelectorAll("#sessions tbody tr")].some((row) => row.textContent.includes(id) && [...row.cells].some((c) => c.textContent === "sse")),
    welcome.session_id,
    { timeout: 10000 },
  );
  await consolePage.close();
  console.log(`session: ${welcome.session_id} (sse)`);
  console.log(`acked: ${received.length} events, committed ${committed}`);

  if (restart) {
    console.log("ready for restart");
    await page.waitForFunction(() => window.sseTest.closes.length > 0, null, { timeout: restartTimeout });
    await page.waitForFunction(() => window.sseTest.reconnects.some((r) => r.session_id), null, { timeout: restartTimeout });
    const after = await state();
    const reconnected = after.reconnects.find((r) => r.session_id);
    const reopened = requests.filter((r) => r.method === "GET" && new URL(r.url).pathname === "/sse").slice(1);
    const resumed = reopened.map((r) => new URL(r.url)).find((u) => u.searchParams.get("resume") && u.searchParams.get("topics") === topic);
    if (!resumed) throw new Error(`no reopened stream carried resume=: ${JSON.stringify(reopened)}`);
    const at = new URL(reconnected.url.replace(/^ws/, "http")).origin;
    await publish(at, Array.from({ length: 3 }, (_, n) => ({ partition: 0, payload: { batch: "after", n, last: n === 2 } })));
    await page.waitForFunction(() => window.sseTest.confirmed.length === 2, null, { timeout: 20000 });
    const end = await state();
    if (end.confirmed[1].error) throw new Error(`the confirmed ack after the restart failed: ${end.confirmed[1].error}`);
    const later = end.received.filter((e) => e.payload?.batch === "after");
    const again = end.received.filter((e) => e.payload?.batch === "first").length - 5;
    if (later.length !== 3) throw new Error(`received ${later.length} of 3 after the restart: ${JSON.stringify(end.received)}`);
    if (again !== 0) throw new Error(`${again} events acked before the restart came again: ${JSON.stringify(end.received)}`);
    console.log(`received after the restart: ${later.map((e) => e.offset).join(",")} on ${later[0].session_id}`);
  }

  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  // A restart makes the browser log the refused connections; nothing else may go wrong.
  const fatal = problems.filter((p) => !(restart && (p.includes("ERR_CONNECTION_REFUSED") || p.includes("ERR_INCOMPLETE_CHUNKED_ENCODING") || p.includes("Failed to load resource"))));
  if (fatal.length) throw new Error(fatal.join("\n"));
} catch (e) {
  console.error(`browser SSE test failed: ${e.message}`);
  console.error(problems.join("\n"));
  console.error(JSON.stringify(await state(), null, 1));
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
  process.exitCode = 1;
} finally {
  await page.evaluate(() => window.sseClient?.close()).catch(() => {});
  await browser.close();
}
