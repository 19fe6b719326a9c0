// The console follows a takeover in headless Chromium: loaded from instance A and connected
// there (with B given as another instance), subscribed with auto-ack; the Rust test kills A when
// this prints `subscribed`, then publishes through B. The page must reconnect by itself
// (recommend asked of B, resubscribe with its resume token) and receive that event.
//
//   node tests/browser/takeover.mjs http://127.0.0.1:A http://127.0.0.1:B /tmp/takeover.png
//
// Prints `received after the kill: <delivery_id> on <instance>`; exits non-zero with the page's
// log on any failure.
import { openPage } from "./page.mjs";

const [baseA, baseB, screenshot] = process.argv.slice(2);
if (!baseA || !baseB || !screenshot) {
  console.error("usage: takeover.mjs BASE_A BASE_B SCREENSHOT_PATH");
  process.exit(2);
}

// Only the two instances may be asked anything (the dead one's refusals are expected noise).
const { browser, page, problems } = await openPage(baseA, baseB);

try {
  await page.goto(baseA + "/", { waitUntil: "load" });
  await page.fill("#client-id", "browser-takeover");
  await page.fill("#peers", baseB);
  await page.click("#connect");
  await page.waitForSelector("#status.on", { timeout: 10000 });
  await page.fill("#topic", "web");
  await page.check("#auto-ack");
  await page.click("#subscribe");
  await page.waitForFunction(() => document.getElementById("session-info").dataset.subscribed === "web", null, { timeout: 10000 });
  console.log("subscribed");

  // A is killed now; the badge goes to "reconnecting", then back to connected on B.
  await page.waitForFunction(() => document.getElementById("status").textContent.includes("reconnect"), null, { timeout: 30000 });
  await page.waitForSelector("#status.on", { timeout: 60000 });
  const row = page.locator("#events tbody tr", { hasText: "after the kill" }).first();
  await row.waitFor({ timeout: 60000 });
  await page.waitForSelector(`#events tr[data-state="acked"]`, { timeout: 10000 });
  const deliveryId = await row.getAttribute("data-delivery-id");
  const status = await page.locator("#status").textContent();
  await page.screenshot({ path: screenshot, fullPage: true });
  const fatal = problems.filter((p) => !p.includes("WebSocket") && !p.includes("ERR_CONNECTION_REFUSED"));
  if (fatal.length) throw new Error(fatal.join("\n"));
  console.log(`received after the kill: ${deliveryId} (${status})`);
} catch (e) {
  console.error(`browser takeover test failed: ${e.message}`);
  console.error(problems.join("\n"));
  console.error(await page.locator("#log").textContent().catch(() => ""));
  await page.screenshot({ path: screenshot, fullPage: true }).catch(() => {});
  process.exitCode = 1;
} finally {
  await browser.close();
}
