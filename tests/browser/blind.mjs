// Requests a page makes blind (issue 40, item 1), in headless Chromium: a page served from
// http://localhost:APP_PORT (an origin the gateway at GATEWAY may or may not allow) points an
// <img>, an <iframe>, a <script> and a no-cors fetch at GATEWAY/sse?client_id=VICTIM&...&from=latest,
// which before the fix opened a session as the victim and moved its committed offsets to the log end
// (browsers send no Origin on these GETs). Then, as the app would, it opens an EventSource and a
// WebSocket of its own client (CORS and WebSocket requests do carry Origin).
//
//   node tests/browser/blind.mjs GATEWAY APP_PORT VICTIM TOPIC
//
// Prints one line per blind request, `blind <kind>: <status>` (the status Chromium saw, or the
// network error it failed with, 0 when it saw neither), then `eventsource: <welcome|error>` and `websocket: <welcome|error>`. The caller checks
// the victim's offsets through the admin routes.
import http from "node:http";
import { openPage } from "./page.mjs";

const [gateway, appPort, victim, topic] = process.argv.slice(2);
if (!topic) {
  console.error("usage: blind.mjs GATEWAY APP_PORT VICTIM TOPIC");
  process.exit(2);
}
const app = `http://localhost:${appPort}`;
const target = `${gateway}/sse?client_id=${victim}&topics=${topic}&from=latest`;
const server = http.createServer((_request, response) => {
  response.writeHead(200, { "content-type": "text/html" });
  response.end("<!doctype html><title>a page</title><body></body>");
});
// Every address (IPv4 and IPv6): Chromium may resolve localhost to either.
await new Promise((resolve) => server.listen(Number(appPort), resolve));

const { browser, page, problems } = await openPage(gateway, app);
const statuses = new Map();
page.on("response", (r) => r.url().startsWith(target) && statuses.set(r.request().resourceType(), r.status()));
// Chromium's Opaque Response Blocking keeps a JSON answer (the 403) from an <img> or <script>:
// the request then fails with net::ERR_BLOCKED_BY_ORB after the answer came.
page.on("requestfailed", (r) => r.url().startsWith(target) && !statuses.has(r.resourceType()) && statuses.set(r.resourceType(), r.failure()?.errorText ?? "failed"));
try {
  await page.goto(`${app}/`, { waitUntil: "load" });
  await page.evaluate((target) => {
    const image = document.createElement("img");
    image.src = `${target}&via=img`;
    const frame = document.createElement("iframe");
    frame.src = `${target}&via=iframe`;
    const script = document.createElement("script");
    script.src = `${target}&via=script`;
    document.body.append(image, frame, script);
    fetch(`${target}&via=fetch`, { mode: "no-cors" }).catch(() => {});
  }, target);
  const kinds = ["image", "document", "script", "fetch"];
  const deadline = Date.now() + 10000;
  while (kinds.some((k) => !statuses.has(k)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  for (const kind of kinds) console.log(`blind ${kind}: ${statuses.get(kind) ?? 0}`);

  const own = await page.evaluate(
    async ({ gateway, topic }) => {
      const opened = (open) => new Promise((resolve) => {
        const timer = setTimeout(() => resolve("timeout"), 10000);
        open((result) => (clearTimeout(timer), resolve(result)));
      });
      const eventsource = await opened((done) => {
        const source = new EventSource(`${gateway}/sse?client_id=app-es&topics=${topic}`);
        source.addEventListener("welcome", () => (source.close(), done("welcome")));
        source.onerror = () => (source.close(), done("error"));
      });
      const websocket = await opened((done) => {
        const socket = new WebSocket(`${gateway.replace(/^http/, "ws")}/ws?client_id=app-ws`);
        socket.onmessage = (m) => (socket.close(), done(JSON.parse(m.data).type));
        socket.onerror = () => done("error");
      });
      return { eventsource, websocket };
    },
    { gateway, topic },
  );
  console.log(`eventsource: ${own.eventsource}`);
  console.log(`websocket: ${own.websocket}`);
  // Problems that are expected here: the refused requests show up as console errors.
  for (const problem of problems.filter((p) => !p.startsWith("console error"))) console.log(`problem: ${problem}`);
} finally {
  await browser.close();
  server.close();
}
