// Drives the ackgate console in headless Chromium: connect, subscribe, publish from the page,
// receive the event, click "ack". Prints `screenshot: <path>` and `acked: <delivery_id>`.
//
//   node tests/browser/console.mjs http://127.0.0.1:PORT /tmp/console.png
//
// Exits non-zero (with the page's log) on any failure. The Rust test tests/api/browser.rs runs
// it and then checks through the admin route that the offset moved.
import { chromium } from "playwright-core";

const [base, screenshot] = process.argv.slice(2);
if (!base || !screenshot) {
  console.error("usage: console.mjs BASE_URL SCREENSHOT_PATH");
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
const problems = [];
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.on("console", (m) => m.type() === "error" && problems.push(`console error: ${m.text()}`));
// Nothing may load from the internet: every request must go to the gateway.
page.on("request", (r) => !r.url().startsWith(base) && problems.push(`request outside the gateway: ${r.url()}`));

try {
  await page.goto(base + "/", { waitUntil: "load" });
  await page.fill("#client-id", "browser-1");
  await page.click("#connect");
  await page.waitForSelector("#status.on", { timeout: 10000 });
  await page.fill("#topic", "web");
  await page.click("#subscribe");
  await page.waitForFunction(() => document.getElementById("session-info").dataset.subscribed === "web", null, { timeout: 10000 });

  await page.fill("#publish-topic", "web");
  await page.fill("#publish-payload", '{"hello": "from the browser"}');
  await page.click("#publish");
  const row = page.locator("#events tbody tr").first();
  await row.waitFor({ timeout: 10000 });
  const deliveryId = await row.getAttribute("data-delivery-id");
  const payload = await row.locator("td.payload").textContent();
  if (!payload.includes("from the browser")) throw new Error(`unexpected payload cell: ${payload}`);
  await row.locator("button.ack").click();
  await page.waitForSelector(`#events tr[data-state="acked"]`, { timeout: 10000 });
  // The offsets table refreshes every 2 s from /admin/offsets: wait for this client's row.
  await page.waitForFunction(
    () => [...document.querySelectorAll("#offsets tbody tr")].some((tr) => tr.cells[0].textContent === "web#browser-1#0" || tr.cells[0].textContent.startsWith("web#browser-1#")),
    null,
    { timeout: 10000 },
  );
  await page.screenshot({ path: screenshot, fullPage: true });
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`acked: ${deliveryId}`);
  console.log(`screenshot: ${screenshot}`);
} catch (e) {
  console.error(`browser test failed: ${e.message}`);
  console.error(problems.join("\n"));
  console.error(await page.locator("#log").textContent().catch(() => ""));
  await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
  process.exitCode = 1;
} finally {
  await browser.close();
}
