// The back/forward cache in headless Chromium (issue 61 item 7). A page that holds a Web Lock or
// an open WebSocket is not kept there; the client, on `pagehide` with `persisted`, closes its
// connection and releases its locks (a tab that shares its session leaves the tabs), and on
// `pageshow` with `persisted` reconnects and subscribes again with its resume tokens. Playwright
// launches Chromium with --disable-back-forward-cache ("avoids surprises" in its own tests): this
// script drops that switch (ignoreDefaultArgs), so a page left by a navigation is cached and
// going back restores it, its JavaScript state and all, without a load event.
//
// The app's pages come from a server of their own (the page that subscribes, another page of the
// same origin, and this checkout's client): no request interception, which a restored page
// would not see again. The gateway must list that origin in server.allowed_origins (the Rust
// test passes the port it reserved for it). Checked: the page, connected and subscribed (tabs
// shared: the default; it leads, holding its Web Lock) receives and acks 3 events; it navigates to
// the other page: the gateway has no session of the client id, and the other page sees no lock of
// it held; 3 events are published meanwhile; back, the page was restored from the cache
// (`pageshow` persisted, the same JavaScript heap: no new load), the client reconnected with its
// lock, received the 3 published while it was away, and acked every one (committed 6).
//
//   node tests/browser/bfcache.mjs http://127.0.0.1:GATEWAY_PORT APP_PORT
//
// Prints `bfcache: ...`; exits non-zero with the page's log, and why Chromium did not restore
// the page (CDP's Page.backForwardCacheNotUsed) when it did not.
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { chromium } from "playwright-core";
import { committed, createTopic, keepLog, publish, until } from "./page.mjs";

const [base, appPort] = process.argv.slice(2);
if (!base || !appPort) {
  console.error("usage: bfcache.mjs BASE_URL APP_PORT");
  process.exit(2);
}
const app = `http://127.0.0.1:${appPort}`;
const run = Date.now().toString(36);
const clientId = `bfcache-${run}`;
const topic = `bfcache-${run}`;

const client = await readFile(new URL("../../clients/js/ackgate.js", import.meta.url));
// The page that subscribes: what it saw is kept in window.seen (the cache keeps it).
const subscriber = `<!doctype html><title>orders</title><script type="module">
  // (A reload, not a restore, would run this again: loads 2.)
  const loads = Number(sessionStorage.getItem("loads") ?? 0) + 1;
  sessionStorage.setItem("loads", loads);
  const seen = (window.seen = { loads, shows: [], hides: [], states: [], offsets: [] });
  addEventListener("pageshow", (event) => seen.shows.push(event.persisted));
  addEventListener("pagehide", (event) => seen.hides.push(event.persisted));
  const query = new URLSearchParams(location.search);
  const { AckgateClient } = await import("/ackgate.js");
  const client = new AckgateClient(query.get("ws"), { clientId: query.get("client"), onState: (state) => seen.states.push(state) });
  await client.connect();
  await client.subscribe(query.get("topic"));
  for await (const event of client.events()) {
    seen.offsets.push(event.offset);
    event.ack();
  }
</script>`;
const server = createServer((request, response) => {
  const path = new URL(request.url, app).pathname;
  const [type, body] = path === "/ackgate.js" ? ["text/javascript", client] : path === "/orders.html" ? ["text/html", subscriber] : path === "/other.html" ? ["text/html", "<!doctype html><title>other</title><p>another page"] : [];
  response.writeHead(body ? 200 : 404, { "Content-Type": type ?? "text/plain" });
  response.end(body ?? "");
});
await new Promise((resolve) => server.listen(Number(appPort), "127.0.0.1", resolve));

// page.mjs's launch, with the back/forward cache left on.
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  ignoreDefaultArgs: ["--disable-back-forward-cache"],
});
const context = await browser.newContext();
const page = await context.newPage();
const problems = [];
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.on("request", (r) => ![app, base].some((b) => r.url().startsWith(b)) && problems.push(`request outside ${app} and ${base}: ${r.url()}`));
const log = keepLog(page);
// Why a page was not restored, as Chromium says it.
const notRestored = [];
const cdp = await context.newCDPSession(page);
await cdp.send("Page.enable");
cdp.on("Page.backForwardCacheNotUsed", (e) => notRestored.push(JSON.stringify(e.notRestoredExplanations)));

const seen = () => page.evaluate(() => window.seen);
const sessions = async () => (await (await fetch(`${base}/admin/sessions?client_id=${clientId}`)).json()).sessions;
const locks = () => page.evaluate(async (name) => (await navigator.locks.query()).held.filter((lock) => lock.name === name).length, `ackgate:${clientId}`);

try {
  await createTopic(base, topic);
  const ws = `${base.replace(/^http/, "ws")}/ws`;
  await page.goto(`${app}/orders.html?${new URLSearchParams({ ws, client: clientId, topic })}`);
  await until("the page connected", async () => (await seen())?.states.includes("connected"));
  await publish(base, topic, [0, 1, 2].map((n) => ({ partition: 0, payload: { n } })));
  await until("3 events received and acked", async () => (await seen()).offsets.length === 3 && (await committed(base, topic, clientId)) === 3);
  if ((await locks()) !== 1) throw new Error(`the leading page does not hold ackgate:${clientId}`);

  // Away: the page goes into the cache, its connection closed and its lock released.
  await page.goto(`${app}/other.html`);
  await until("the session closed at pagehide", async () => (await sessions()).length === 0);
  const heldWhileAway = await locks();
  if (heldWhileAway !== 0) throw new Error(`while the page is in the cache, ${heldWhileAway} lock ackgate:${clientId} is held`);
  await publish(base, topic, [3, 4, 5].map((n) => ({ partition: 0, payload: { n } })));

  // Back: restored from the cache (no load event: wait for the commit), the client reconnects.
  await page.goBack({ waitUntil: "commit" });
  await until("the page shown again", async () => (await seen())?.shows.length === 2);
  const restored = await seen();
  if (JSON.stringify(restored.shows) !== "[false,true]" || restored.loads !== 1) {
    throw new Error(`not restored from the back/forward cache: pageshow persisted ${JSON.stringify(restored.shows)}; Chromium said: ${notRestored.join(" ") || "nothing"}`);
  }
  if (JSON.stringify(restored.hides) !== "[true]") throw new Error(`pagehide persisted ${JSON.stringify(restored.hides)}`);
  await until("the 3 events published while away, acked", async () => (await seen()).offsets.length >= 6 && (await committed(base, topic, clientId)) === 6);
  const { offsets, states } = await seen();
  const missing = [0, 1, 2, 3, 4, 5].filter((n) => !offsets.includes(n));
  if (missing.length) throw new Error(`offsets ${missing.join(",")} never came: ${offsets.join(",")}`);
  if ((await sessions()).length !== 1 || (await locks()) !== 1) throw new Error("back, the page has no session or does not hold its lock again");
  if (problems.length) throw new Error(problems.join("\n"));
  // (An event acked shortly before the page left may come again: the resume token trails the
  // acks. None may be missing.)
  console.log(
    `bfcache: restored from the back/forward cache (pageshow persisted, one load); away, no session and no lock ackgate:${clientId}; back, states ${states.join(" > ")}, the 3 events published meanwhile received: every offset 0..5 (${offsets.length - 6} again), all acked (committed 6)`,
  );
} catch (e) {
  console.error(`browser bfcache test failed: ${e.message}`);
  console.error([...problems, ...notRestored.map((r) => `not restored: ${r}`), ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
  server.close();
}
