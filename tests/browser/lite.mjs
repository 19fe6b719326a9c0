// Drives the ackgate console in headless Chromium to list a RocketMQ lite parent's lite topics:
// types the parent, submits, and prints each row of the topics table as
// `row: <topic> <partition> <log_start> <log_end>`; then names a parent that is none and prints
// the console's error as `error: <text>`.
//
//   node tests/browser/lite.mjs http://127.0.0.1:PORT PARENT NOT_A_PARENT
//
// Exits non-zero (with the page's log) on any failure. tests/api/rocketmq_lite.rs runs it against
// a gateway on rocketmq-rust and checks the rows.
import { openPage } from "./page.mjs";

const [base, parent, notAParent] = process.argv.slice(2);
if (!base || !parent || !notAParent) {
  console.error("usage: lite.mjs BASE_URL PARENT NOT_A_PARENT");
  process.exit(2);
}

const { browser, page, problems } = await openPage(base);

try {
  await page.goto(base + "/", { waitUntil: "load" });
  await page.fill("#lite-parent", parent);
  await page.click("#lite-list");
  await page.waitForFunction(
    (parent) => [...document.querySelectorAll("#topics tbody tr")].some((tr) => tr.cells[0].textContent.startsWith(`${parent}@`)),
    parent,
    { timeout: 10000 },
  );
  const rows = await page.$$eval("#topics tbody tr", (trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
  for (const [topic, partition, logStart, logEnd] of rows) console.log(`row: ${topic} ${partition} ${logStart} ${logEnd}`);

  await page.fill("#lite-parent", notAParent);
  await page.click("#lite-list");
  await page.waitForFunction(() => document.getElementById("topics-error").textContent.includes("404"), null, { timeout: 10000 });
  console.log(`error: ${await page.locator("#topics-error").textContent()}`);
  // The admin tables keep refreshing: their error line stays empty.
  const adminError = await page.locator("#admin-error").textContent();
  if (adminError) throw new Error(`the admin tables stopped: ${adminError}`);
  if (problems.length) throw new Error(problems.join("\n"));
} catch (e) {
  console.error(`browser test failed: ${e.message}`);
  console.error(problems.join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
