// ackgate-client/react in headless Chromium (issue 42 item 9, issue 61.5), through the React
// example (clients/js/examples/react): a counter and a list, two components on one topic, under
// StrictMode. The example is bundled here with esbuild (React's development build, where
// StrictMode mounts every component twice; React from clients/js/node_modules) and served to a
// page of the gateway's origin. Checked: both components render the events published through
// the REST API; the page sent one subscribe for both, and its session lists the topic; each
// event rendered is acked (the committed offset reaches the last one). "Pause" unmounts both:
// one unsubscribe. Events published meanwhile come after "Resume", whose StrictMode mount, with
// the session up, sends one subscribe (not subscribe, unsubscribe, subscribe); past the limit the
// list keeps the newest only, and the events it dropped are acked too.
//
//   node tests/browser/react.mjs http://127.0.0.1:PORT
//
// Needs `npm ci` in clients/js (React, esbuild). Prints `react: ...`; exits non-zero with the
// page's log on any failure.
import { bundle } from "../../clients/js/examples/react/build.mjs";
import { call, committed, createTopic, keepLog, openPage, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: react.mjs BASE_URL");
  process.exit(2);
}

const run = Date.now().toString(36);
const clientId = `browser-react-${run}`;
const topic = `react-${run}`;
const N = 5;
const LIMIT = 10;
const MORE = 20;

const { browser, page, problems } = await openPage(base);
const log = keepLog(page);

/** What the counter and the list show: `{count, last, offsets}`. */
const shown = () =>
  page.evaluate(() => {
    const counter = document.querySelector("#counter");
    const offsets = [...document.querySelectorAll("#events li")].map((li) => Number(li.dataset.offset));
    return { count: Number(counter?.dataset.count), last: Number(counter?.dataset.last), offsets };
  });

/** Waits until both components show offsets `from`..`to`-1. */
async function showing(from, to) {
  const want = JSON.stringify(Array.from({ length: to - from }, (_, i) => from + i));
  await until(`both components showing ${from}..${to - 1}`, async () => {
    const { count, last, offsets } = await shown();
    return JSON.stringify(offsets) === want && count === to - from && last === to - 1;
  });
}

/** The page sent `subscribes` subscribe frames and `unsubscribes` unsubscribe frames so far. */
async function expectFrames(subscribes, unsubscribes) {
  await new Promise((resolve) => setTimeout(resolve, 200)); // (a second one would be out by now)
  const ops = await page.evaluate(() => window.ops);
  const count = (op) => ops.filter((o) => o === op).length;
  if (count("subscribe") !== subscribes || count("unsubscribe") !== unsubscribes) {
    throw new Error(`the page sent ${count("subscribe")} subscribes and ${count("unsubscribe")} unsubscribes, not ${subscribes} and ${unsubscribes}: ${ops.join(",")}`);
  }
}

try {
  const { js } = await bundle({ development: true });
  await createTopic(base, topic);
  await page.route(`${base}/react/app.js`, (route) => route.fulfill({ contentType: "text/javascript", body: js }));
  await openTestPage(page, base);
  // The example reads what to use from the query, and renders into #root. The page's frames are
  // counted on their way out.
  await page.evaluate(
    async ([clientId, topic, limit]) => {
      const ops = (window.ops = []);
      const send = WebSocket.prototype.send;
      WebSocket.prototype.send = function (data) {
        ops.push(JSON.parse(data).op);
        return send.call(this, data);
      };
      history.replaceState(null, "", `?client=${clientId}&topic=${topic}&limit=${limit}`);
      document.body.innerHTML = '<div id="root"></div>';
      await import("/react/app.js");
    },
    [clientId, topic, LIMIT],
  );
  await page.waitForSelector('#state[data-state="connected"]', { timeout: 10000 });
  await publish(base, topic, Array.from({ length: N }, (_, n) => ({ partition: 0, payload: { item: `book ${n}`, n } })));
  await showing(0, N);
  const offset = await until("the acks after render", async () => (await committed(base, topic, clientId)) === N && N);

  // One subscription for both components.
  await expectFrames(1, 0);
  const listed = async () => {
    const { answer } = await call("GET", `${base}/admin/sessions?client_id=${clientId}`);
    const sessions = answer?.sessions ?? [];
    if (sessions.length !== 1) throw new Error(`sessions of ${clientId}: ${JSON.stringify(answer)}`);
    return sessions[0].subscriptions.filter((t) => t === topic).length;
  };
  if ((await listed()) !== 1) throw new Error(`the session does not list ${topic} once`);

  // Paused: both unmount, the last one unsubscribes.
  await page.click("#pause");
  await until("the unsubscribe of the last component", async () => (await listed()) === 0);
  await expectFrames(1, 1);

  // Published meanwhile, more than the limit: after Resume the newest LIMIT are shown; every
  // event is acked, the dropped ones too.
  await publish(base, topic, Array.from({ length: MORE }, (_, n) => ({ partition: 0, payload: { item: `book ${N + n}`, n: N + n } })));
  await page.click("#pause");
  const total = N + MORE;
  await showing(total - LIMIT, total);
  const end = await until("the acks of the dropped and rendered events", async () => (await committed(base, topic, clientId)) === total && total);
  await expectFrames(2, 1);
  if ((await listed()) !== 1) throw new Error(`the session does not list ${topic} once after Resume`);

  const error = await page.locator("#error").textContent({ timeout: 100 }).catch(() => null);
  if (error) throw new Error(`the page shows an error: ${error}`);
  const consoleErrors = log.filter((line) => line.startsWith("[page error]"));
  if (consoleErrors.length) throw new Error(`React reported:\n${consoleErrors.join("\n")}`);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`react: ${N} events rendered by both components and acked after render (committed ${offset}), one subscription for both`);
  console.log(`react: paused (one unsubscribe), resumed under StrictMode (one subscribe): limit ${LIMIT} of ${total} events, the list kept ${total - LIMIT}..${total - 1}, the dropped acked too (committed ${end})`);
} catch (e) {
  console.error(`browser react test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
