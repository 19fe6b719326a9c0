// The console as an operator's tool, in headless Chromium, against a gateway with
// auth.admin_token set (issue 62 item 5):
// - with no token entered, the banner at the top says one is needed (on the first screen, also
//   in a narrow viewport) and the admin tables say "admin token needed"; a wrong one says so;
// - with the token saved, the sessions table lists the page's session with its last ack time;
//   the search by client id narrows it, and paging (1 row a page) turns through two sessions;
// - a dead letter's Redrive delivers only that one, its Delete removes only that one (both
//   checked through the admin API from here);
// - Disconnect ends a session (its socket closes with 4002), Reset says 409 while the client is
//   live and sets the offset once it is not.
//
//   node tests/browser/console_admin.mjs BASE_URL ADMIN_TOKEN BANNER.png ADMIN.png NARROW.png
//
// BANNER.png: the full page with no token (1280x900 viewport); ADMIN.png: the full page in use;
// NARROW.png: the first screen of a 390x844 viewport with the banner. The gateway needs no
// topic: the script creates "ops". Prints what it checked; exits non-zero (with the page's log)
// on any failure. tests/api/browser.rs runs it and checks the offset and the dead letters.
import { openPage, until } from "./page.mjs";

const [base, token, bannerShot, adminShot, narrowShot] = process.argv.slice(2);
if (!base || !token || !bannerShot || !adminShot || !narrowShot) {
  console.error("usage: console_admin.mjs BASE_URL ADMIN_TOKEN BANNER.png ADMIN.png NARROW.png");
  process.exit(2);
}
const TOPIC = "ops";
const CLIENT = "ops-1";
const OTHER = "ops-2";

/** An admin request with the token, from here (not the page). */
async function api(method, path, body) {
  const response = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, answer: await response.json().catch(() => null) };
}

const deadOffsets = async () => (await api("GET", `/admin/dead-letters?topic=${TOPIC}&client_id=${CLIENT}`)).answer.dead_letters.map((d) => d.offset);
const sameList = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const created = await api("POST", "/topics", { name: TOPIC, partitions: 1 });
if (created.status !== 200 && created.answer?.error?.code !== "conflict") throw new Error(`creating ${TOPIC}: ${JSON.stringify(created)}`);

const { browser, page, problems } = await openPage(base);
// The 401, 403 and 409 answers this test provokes are logged by Chromium as failed loads.
page.on("console", (m) => m.type() === "error" && !/status of (401|403|409)/.test(m.text()) && problems.push(`console error: ${m.text()}`));
/** The answers to the page's next confirm() or prompt() dialogs, in order. */
const dialogAnswers = [];
page.on("dialog", (dialog) => {
  const answer = dialogAnswers.shift();
  if (answer === undefined) {
    problems.push(`unexpected dialog: ${dialog.message()}`);
    return dialog.dismiss();
  }
  return dialog.accept(dialog.type() === "prompt" ? answer : undefined);
});

const waitText = (selector, pattern, timeout = 10000) =>
  page.waitForFunction(([s, p]) => new RegExp(p).test(document.querySelector(s)?.textContent ?? ""), [selector, pattern.source], { timeout });
const rowsOf = (table) => page.$$eval(`#${table} tbody tr`, (trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));

try {
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto(base + "/", { waitUntil: "load" });

  // 1. No token entered: the banner, at the top of the first screen; the tables say why empty.
  await page.waitForSelector("#admin-banner:not([hidden])", { timeout: 10000 });
  const banner = await page.locator("#admin-banner").textContent();
  if (!banner.includes("Admin token needed")) throw new Error(`banner: ${banner}`);
  const box = await page.locator("#admin-banner").boundingBox();
  if (box.y + box.height > 900) throw new Error(`the banner is below the first screen: ${JSON.stringify(box)}`);
  for (const table of ["sessions", "offsets", "dead-letters"]) await waitText(`#${table} tfoot td.note`, /^admin token needed$/);
  console.log(`banner: ${banner}`);
  await page.screenshot({ path: bannerShot, fullPage: true });
  await page.setViewportSize({ width: 390, height: 844 });
  const narrow = await page.locator("#admin-banner").boundingBox();
  if (narrow.y + narrow.height > 844) throw new Error(`narrow: the banner is below the first screen: ${JSON.stringify(narrow)}`);
  await page.screenshot({ path: narrowShot });
  await page.setViewportSize({ width: 1280, height: 900 });

  // 2. A wrong token: the banner says so (403). The right one: the banner goes, tables fill.
  await page.fill("#admin-token", "not-the-admin-token-of-this-gateway");
  await page.click("#admin-token-save");
  await waitText("#admin-banner", /Admin token wrong/);
  await page.fill("#admin-token", token);
  await page.click("#admin-token-save");
  await page.waitForSelector("#admin-banner[hidden]", { state: "attached", timeout: 10000 });
  await waitText("#sessions tfoot td.note", /^no sessions$/);
  if ((await page.evaluate(() => sessionStorage.getItem("ackgate.console.adminToken"))) !== token) throw new Error("the token is not in sessionStorage");

  // 3. The page's client: subscribe, publish four events from the page (with the saved token),
  // ack the first, term the other three (three dead letters: offsets 1, 2, 3).
  await page.fill("#client-id", CLIENT);
  await page.click("#connect");
  await page.waitForSelector("#status.on", { timeout: 10000 });
  await page.fill("#topic", TOPIC);
  await page.click("#subscribe");
  await page.waitForFunction((t) => document.getElementById("session-info").dataset.subscribed === t, TOPIC, { timeout: 10000 });
  await page.fill("#publish-topic", TOPIC);
  for (let n = 0; n < 4; n++) {
    await page.fill("#publish-payload", JSON.stringify({ n }));
    await page.click("#publish");
    await waitText("#publish-result", new RegExp(`"offset":${n}\\b`));
  }
  await page.waitForFunction(() => document.querySelectorAll("#events tbody tr").length === 4, null, { timeout: 10000 });
  await page.click('#events tr[data-offset="0"] button.ack');
  await page.waitForSelector('#events tr[data-offset="0"][data-state="acked"]', { timeout: 10000 });
  for (const offset of [1, 2, 3]) await page.click(`#events tr[data-offset="${offset}"] button.term`);

  // 4. A second session (a bare WebSocket of client ops-2, which never acks).
  const otherSession = await page.evaluate(
    (clientId) =>
      new Promise((resolve, reject) => {
        const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws?client_id=${clientId}`);
        window.other = { ws, closed: null };
        ws.onmessage = (m) => resolve(JSON.parse(m.data).session_id);
        ws.onerror = () => reject(new Error("the second session did not open"));
        ws.onclose = (e) => (window.other.closed = e.code);
      }),
    OTHER,
  );

  // 5. Sessions: both listed; the page's with a last ack "N s ago", the other "never".
  const sessionRow = (clientId) => page.locator("#sessions tbody tr", { has: page.locator("td:nth-child(2)", { hasText: new RegExp(`^${clientId}$`) }) });
  await sessionRow(OTHER).waitFor({ timeout: 10000 });
  await page.waitForFunction(() => [...document.querySelectorAll("#sessions tbody tr")].some((tr) => / s ago$/.test(tr.querySelector("td.last-ack").textContent)), null, { timeout: 10000 });
  const lastAck = await sessionRow(CLIENT).locator("td.last-ack").textContent();
  const otherLastAck = await sessionRow(OTHER).locator("td.last-ack").textContent();
  if (!/^\d+ s ago$/.test(lastAck) || otherLastAck !== "never") throw new Error(`last ack: ${lastAck} / ${otherLastAck}`);
  console.log(`last ack: ${CLIENT} ${lastAck}, ${OTHER} ${otherLastAck}`);

  // 6. The search by client id narrows the list to that client; an empty search lists both.
  await page.fill("#sessions-client-id", CLIENT);
  await page.click("#sessions-search button[type=submit]");
  await page.waitForFunction(
    (c) => {
      const rows = [...document.querySelectorAll("#sessions tbody tr")];
      return rows.length === 1 && rows[0].cells[1].textContent === c && document.getElementById("sessions-page").textContent.includes(`client_id=${c}`);
    },
    CLIENT,
    { timeout: 10000 },
  );
  console.log(`search: client_id=${CLIENT} lists ${(await rowsOf("sessions")).map((r) => r[1]).join(",")}`);
  await page.fill("#sessions-client-id", "");
  await page.click("#sessions-search button[type=submit]");
  await page.waitForFunction(() => document.querySelectorAll("#sessions tbody tr").length === 2, null, { timeout: 10000 });

  // 7. Paging: one row a page; Next shows the other session, First the first again.
  await page.fill("#page-size", "1");
  await page.press("#page-size", "Tab");
  await page.waitForFunction(() => document.querySelectorAll("#sessions tbody tr").length === 1 && !document.getElementById("sessions-next").disabled, null, { timeout: 10000 });
  const firstId = (await rowsOf("sessions"))[0][0];
  await page.click("#sessions-next");
  await page.waitForFunction(
    (id) => {
      const rows = [...document.querySelectorAll("#sessions tbody tr")];
      return rows.length === 1 && rows[0].cells[0].textContent !== id && document.getElementById("sessions-page").textContent.startsWith("page 2");
    },
    firstId,
    { timeout: 10000 },
  );
  const secondId = (await rowsOf("sessions"))[0][0];
  if (!(await page.locator("#sessions-next").isDisabled())) throw new Error("Next is enabled on the last page");
  await page.click("#sessions-first");
  await page.waitForFunction((id) => document.querySelector("#sessions tbody tr")?.cells[0].textContent === id, firstId, { timeout: 10000 });
  console.log(`paging: page 1 ${firstId}, page 2 ${secondId}`);
  await page.fill("#page-size", "50");
  await page.press("#page-size", "Tab");
  await page.waitForFunction(() => document.querySelectorAll("#sessions tbody tr").length === 2, null, { timeout: 10000 });

  // 8. Dead letters: Redrive on offset 2 delivers that one only; its ack removes it.
  const deadRow = (offset) => page.locator("#dead-letters tbody tr", { has: page.locator("td.offset", { hasText: new RegExp(`^${offset}$`) }) });
  await until("three dead letters", async () => sameList(await deadOffsets(), [1, 2, 3]));
  await page.waitForFunction(() => document.querySelectorAll("#dead-letters tbody tr").length === 3, null, { timeout: 10000 });
  await deadRow(2).locator("button.redrive").click();
  const redriven = page.locator("#events tbody tr", { hasText: "(redrive)" });
  await redriven.first().waitFor({ timeout: 10000 });
  await page.waitForTimeout(1500); // anything else redriven would have come by now
  const redrivenOffsets = await redriven.evaluateAll((trs) => trs.map((tr) => Number(tr.dataset.offset)));
  if (!sameList(redrivenOffsets, [2])) throw new Error(`redriven: ${redrivenOffsets}`);
  await waitText("#dead-letters-result", /redriven 1: /);
  await redriven.first().locator("button.ack").click();
  await until("the redriven dead letter's ack removing it", async () => sameList(await deadOffsets(), [1, 3]));
  console.log(`redrive: offset 2 only; dead letters left ${await deadOffsets()}`);

  // 9. Delete on offset 3 (confirmed) removes that one only.
  await deadRow(3).waitFor({ timeout: 10000 });
  dialogAnswers.push(true);
  await deadRow(3).locator("button.delete").click();
  await until("the deleted dead letter gone", async () => sameList(await deadOffsets(), [1]));
  await page.waitForFunction(() => [...document.querySelectorAll("#dead-letters tbody td.offset")].map((td) => td.textContent).join() === "1", null, { timeout: 10000 });
  await waitText("#dead-letters-result", /deleted 1: /);
  console.log(`delete: offset 3 only; dead letters left ${await deadOffsets()}`);

  // 10. Offsets: log_end and lag; Reset while the client is live says 409 and why.
  const offsetRow = page.locator("#offsets tbody tr", { hasText: `${TOPIC}#${CLIENT}#0` });
  await page.waitForFunction(
    (key) => [...document.querySelectorAll("#offsets tbody tr")].some((tr) => tr.cells[0].textContent === key && tr.querySelector("td.log-end").textContent === "4" && tr.querySelector("td.lag").textContent === "0"),
    `${TOPIC}#${CLIENT}#0`,
    { timeout: 10000 },
  );
  dialogAnswers.push("1");
  await offsetRow.locator("button.reset").click();
  await waitText("#offsets-result", /ops-1 is connected: 409 conflict.*Disconnect its sessions/);
  console.log(`reset while live: ${await page.locator("#offsets-result").textContent()}`);
  await page.screenshot({ path: adminShot, fullPage: true });

  // 11. Disconnect (confirmed) ends the other session: its socket closes with 4002.
  dialogAnswers.push(true);
  await sessionRow(OTHER).locator("button.disconnect").click();
  await page.waitForFunction(() => window.other.closed === 4002, null, { timeout: 10000 });
  await until("the session gone", async () => (await api("GET", `/admin/sessions/${otherSession}`)).status === 404);
  await waitText("#sessions-result", /disconnected session /);
  await page.waitForFunction((c) => ![...document.querySelectorAll("#sessions tbody tr")].some((tr) => tr.cells[1].textContent === c), OTHER, { timeout: 10000 });
  console.log(`disconnected: ${otherSession} (4002)`);

  // 12. The page's client offline (its own Disconnect): Reset to 1 sets the offset.
  await page.click("#disconnect");
  await until("the page's client offline", async () => (await api("GET", `/admin/sessions?client_id=${CLIENT}`)).answer.sessions.length === 0);
  dialogAnswers.push("1");
  await offsetRow.locator("button.reset").click();
  await waitText("#offsets-result", /reset ops#ops-1#0 from 4 to 1/);
  const stored = (await api("GET", `/admin/offsets?topic=${TOPIC}&client_id=${CLIENT}&partition=0`)).answer.offsets[0];
  if (stored.committed !== 1 || stored.lag !== 3) throw new Error(`after the reset: ${JSON.stringify(stored)}`);
  await page.waitForFunction(() => document.querySelector("#offsets tbody td.lag")?.textContent === "3", null, { timeout: 10000 });
  console.log(`reset: committed ${stored.committed}, lag ${stored.lag}`);

  if (dialogAnswers.length) throw new Error(`dialogs not shown: ${dialogAnswers}`);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`screenshots: ${bannerShot} ${adminShot} ${narrowShot}`);
  console.log("console admin: ok");
} catch (e) {
  console.error(`browser test failed: ${e.message}`);
  console.error(problems.join("\n"));
  console.error(await page.locator("#log").textContent().catch(() => ""));
  await page.screenshot({ path: adminShot, fullPage: true }).catch(() => {});
  process.exitCode = 1;
} finally {
  await browser.close();
}
