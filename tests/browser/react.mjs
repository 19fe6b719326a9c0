// The React example (clients/js/examples/react: the `useAckgate(topic)` hook) in headless
// Chromium (issue 42, item 9). The example is bundled here with esbuild (React from the
// registry, clients/js/node_modules) and served to a page of the gateway's origin; events
// published through the REST API are rendered, and each one rendered is acked (the hook acks in
// an effect, after the render): the client's committed offset reaches the last one.
//
//   node tests/browser/react.mjs http://127.0.0.1:PORT
//
// Needs `npm ci` in clients/js (React, esbuild). Prints `react: ...`; exits non-zero with the
// page's log on any failure.
import { bundle } from "../../clients/js/examples/react/build.mjs";
import { committed, createTopic, keepLog, openPage, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: react.mjs BASE_URL");
  process.exit(2);
}

const run = Date.now().toString(36);
const clientId = `browser-react-${run}`;
const topic = `react-${run}`;
const N = 5;

const { browser, page, problems } = await openPage(base);
const log = keepLog(page);

try {
  const { js } = await bundle();
  await createTopic(base, topic);
  await page.route(`${base}/react/app.js`, (route) => route.fulfill({ contentType: "text/javascript", body: js }));
  await openTestPage(page, base);
  // The example reads what to use from the query, and renders into #root.
  await page.evaluate(
    async ([clientId, topic]) => {
      history.replaceState(null, "", `?client=${clientId}&topic=${topic}`);
      document.body.innerHTML = '<div id="root"></div>';
      await import("/react/app.js");
    },
    [clientId, topic],
  );
  await page.waitForSelector('#state[data-state="connected"]', { timeout: 10000 });
  await publish(base, topic, Array.from({ length: N }, (_, n) => ({ partition: 0, payload: { item: `book ${n}`, n } })));
  await page.waitForFunction((n) => document.querySelectorAll("#events li").length === n, N, { timeout: 10000 });
  const rendered = await page.$$eval("#events li", (items) => items.map((li) => Number(li.dataset.offset)));
  if (JSON.stringify(rendered) !== JSON.stringify([...Array(N).keys()])) throw new Error(`rendered ${JSON.stringify(rendered)}`);
  const offset = await until("the acks after render", async () => (await committed(base, topic, clientId)) === N && N);
  const error = await page.locator("#error").textContent({ timeout: 100 }).catch(() => null);
  if (error) throw new Error(`the page shows an error: ${error}`);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`react: ${rendered.length} events rendered and acked after render (committed ${offset})`);
} catch (e) {
  console.error(`browser react test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
