// Drives the ackgate console in headless Chromium: connect, subscribe, publish from the page,
// receive the event, click "ack"; then term a second one and redrive it from the dead-letter
// list. Prints `screenshot: <path>`, `acked: <delivery_id>` and `redriven: <delivery_id>`.
//
//   node tests/browser/console.mjs http://127.0.0.1:PORT /tmp/console.png
//
// Exits non-zero (with the page's log) on any failure. The Rust test tests/api/browser.rs runs
// it and then checks through the admin route that the offset moved.
import { openPage } from "./page.mjs";

const [base, screenshot] = process.argv.slice(2);
if (!base || !screenshot) {
  console.error("usage: console.mjs BASE_URL SCREENSHOT_PATH");
  process.exit(2);
}

const { browser, page, problems } = await openPage(base);
page.on("console", (m) => m.type() === "error" && problems.push(`console error: ${m.text()}`));

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

  // The whole cluster (a gateway without peers: itself): the row again, named by its instance.
  await page.check("#cluster-scope");
  await page.waitForFunction(
    () => [...document.querySelectorAll("#offsets tbody tr")].some((tr) => tr.cells[0].textContent.startsWith("web#browser-1#") && tr.querySelector("td.instance").textContent !== ""),
    null,
    { timeout: 10000 },
  );
  await page.uncheck("#cluster-scope");

  // A second event, termed: it shows in the dead-letter list, whose redrive button delivers it
  // again (marked "redrive"); acking that removes the dead letter.
  await page.fill("#publish-payload", '{"hello": "again"}');
  await page.click("#publish");
  const second = page.locator("#events tbody tr", { hasText: "again" }).first();
  await second.waitFor({ timeout: 10000 });
  await second.locator("button.term").click();
  const redriveButton = page.locator("#dead-letters tbody tr", { hasText: "browser-1" }).locator("button.redrive");
  await redriveButton.waitFor({ timeout: 10000 });
  await redriveButton.click();
  const redriven = page.locator("#events tbody tr", { hasText: "(redrive)" }).first();
  await redriven.waitFor({ timeout: 10000 });
  const redrivenId = await redriven.getAttribute("data-delivery-id");
  await redriven.locator("button.ack").click();
  await page.waitForSelector(`#events tr[data-delivery-id="${redrivenId}"][data-state="acked"]`, { timeout: 10000 });
  await page.waitForFunction(() => document.querySelectorAll("#dead-letters tbody tr").length === 0, null, { timeout: 10000 });

  await page.screenshot({ path: screenshot, fullPage: true });
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`acked: ${deliveryId}`);
  console.log(`redriven: ${redrivenId}`);
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
