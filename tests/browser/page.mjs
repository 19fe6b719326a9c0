// Headless Chromium for the browser tests: one page, and the problems seen on it (page errors,
// and any request to somewhere other than the given bases: nothing may load from the internet).
// The client's tests (refresh, basics, tabs, blackhole, react) also use the helpers below.
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

/**
 * A browser and one context (the tabs of one profile): `newPage()` opens a tab in it, watched for
 * problems.
 */
export async function openBrowser(...bases) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
  // The reverse-proxy test serves pages over TLS with a certificate made for the test.
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, ignoreHTTPSErrors: true });
  const problems = [];
  const newPage = async () => {
    const page = await context.newPage();
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("request", (r) => !bases.some((base) => r.url().startsWith(base)) && problems.push(`request outside ${bases.join(" and ")}: ${r.url()}`));
    return page;
  };
  return { browser, context, problems, newPage };
}

export async function openPage(...bases) {
  const { browser, problems, newPage } = await openBrowser(...bases);
  return { browser, page: await newPage(), problems };
}

const CLIENT = fileURLToPath(new URL("../../clients/js/ackgate.js", import.meta.url));

/**
 * Serves `${origin}/static/ackgate.js` to `target` (a page or a context) from this checkout (the
 * gateway serves the client it was built with). Any page of that origin can then import it.
 */
export async function serveClient(target, origin) {
  await target.route(`${origin}/static/ackgate.js`, (route) => route.fulfill({ contentType: "text/javascript", path: CLIENT }));
}

/**
 * Opens a blank page of `origin` whose "/static/ackgate.js" is this checkout's client. The
 * document is a real one of that origin (its /healthz, emptied): Chromium does not let a page
 * it did not load from the network reach a loopback address (Local Network Access).
 */
export async function openTestPage(page, origin) {
  await serveClient(page, origin);
  await page.goto(`${origin}/healthz`);
  await page.evaluate(() => (document.body.innerHTML = ""));
}

/** Every console line of `page`, kept for the failure report. */
export function keepLog(page, name = "page") {
  const lines = [];
  page.on("console", (m) => lines.push(`[${name} ${m.type()}] ${m.text()}`));
  return lines;
}

/** A JSON request; the status and the parsed answer (null when not JSON). */
export async function call(method, url, body) {
  const response = await fetch(url, { method, headers: { "Content-Type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: response.status, answer: await response.json().catch(() => null) };
}

/** Publishes `events` to `topic` through the REST API; throws unless it is answered 200. */
export async function publish(base, topic, events) {
  const { status, answer } = await call("POST", `${base}/topics/${topic}/events`, { events });
  if (status !== 200) throw new Error(`publishing to ${topic}: ${status} ${JSON.stringify(answer)}`);
  return answer.offsets;
}

/** Creates `topic` with one partition (it may exist already). */
export async function createTopic(base, topic) {
  const { status, answer } = await call("POST", `${base}/topics`, { name: topic, partitions: 1 });
  if (status !== 200 && answer?.error?.code !== "conflict") throw new Error(`creating ${topic}: ${status} ${JSON.stringify(answer)}`);
}

/** The committed offset of `clientId` on partition 0 of `topic` (null when none is stored). */
export async function committed(base, topic, clientId) {
  const { answer } = await call("GET", `${base}/admin/offsets?topic=${topic}&client_id=${clientId}&partition=0`);
  return answer?.offsets?.[0]?.committed ?? null;
}

/** Polls `check` until it returns something truthy; throws after `timeoutMs`. */
export async function until(what, check, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
