// The minimal app (clients/js/examples/minimal.html) on its own origin, as docs/clients.md sets
// it up: a page served by another server (here a node http server on its own port) imports the
// client from the gateway (/static/ackgate.min.js, CORS), opens a session there, lists the events
// published through the REST API and acks each one: the client's committed offset reaches the
// last. The gateway must list this page's origin in server.allowed_origins: the Rust test passes
// the port it reserved for it.
//
//   node tests/browser/own_origin.mjs http://127.0.0.1:GATEWAY_PORT APP_PORT
//
// Prints `own origin: ...`; exits non-zero with the page's log on any failure.
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { committed, createTopic, keepLog, openPage, publish, until } from "./page.mjs";

const [base, appPort] = process.argv.slice(2);
if (!base || !appPort) {
  console.error("usage: own_origin.mjs BASE_URL APP_PORT");
  process.exit(2);
}
const app = `http://127.0.0.1:${appPort}`;
const html = await readFile(new URL("../../clients/js/examples/minimal.html", import.meta.url));
const server = createServer((request, response) => {
  response.writeHead(request.url.startsWith("/minimal.html") ? 200 : 404, { "Content-Type": "text/html" });
  response.end(request.url.startsWith("/minimal.html") ? html : "");
});
await new Promise((resolve) => server.listen(Number(appPort), "127.0.0.1", resolve));

const run = Date.now().toString(36);
const clientId = `own-origin-${run}`;
const N = 4;
const { browser, page, problems } = await openPage(app, base);
const log = keepLog(page);

try {
  await createTopic(base, "orders");
  const before = (await committed(base, "orders", clientId)) ?? 0;
  await page.goto(`${app}/minimal.html?gateway=${encodeURIComponent(base)}&client=${clientId}`);
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("connected"), null, { timeout: 10000 });
  const offsets = await publish(base, "orders", Array.from({ length: N }, (_, n) => ({ partition: 0, payload: { item: `book ${n}` } })));
  await page.waitForFunction((n) => document.querySelectorAll("#events li").length === n, N, { timeout: 10000 });
  const listed = await page.$$eval("#events li", (items) => items.map((li) => Number(li.dataset.offset)));
  const published = offsets.map((o) => o.offset ?? o);
  if (JSON.stringify(listed) !== JSON.stringify(published)) throw new Error(`listed ${JSON.stringify(listed)}, published ${JSON.stringify(published)}`);
  const last = published[published.length - 1];
  const offset = await until("the acks", async () => (await committed(base, "orders", clientId)) === last + 1 && last + 1);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`own origin: a page of ${app} imported the client from ${base}, listed ${listed.length} events and acked them (committed ${before} -> ${offset})`);
} catch (e) {
  console.error(`browser own-origin test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
  server.close();
}
