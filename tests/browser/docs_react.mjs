// docs/clients.md's "A React app" block, run as written in headless Chromium (issue 61: every code
// block of the guide runs against a fresh gateway). The block is read from the guide, bundled with
// esbuild (React's development build, which reports what it finds wrong on the console) and
// served to a page of the gateway's origin. Only the gateway's address changes; the page gives
// it the one free name it uses, `root` (a React root on #root, made by a module that runs before
// it in the same bundle, so both use one React). Checked: Status shows the state, `connected`;
// Orders lists the events published through the REST API (60, over the 4 partitions the
// subscribe made the topic with), `limit: 50` of them; every event is acked, the rendered ones
// and those the limit dropped (the committed offsets reach the log end); taken over by another
// browser, Status shows `failed: taken_over`.
//
//   node tests/browser/docs_react.mjs http://127.0.0.1:PORT
//
// Needs `npm ci` in clients/js (React, esbuild). Prints `docs react: ...`; exits non-zero with the
// page's log on any failure.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { call, keepLog, openPage, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: docs_react.mjs BASE_URL");
  process.exit(2);
}
const pkg = fileURLToPath(new URL("../../clients/js/", import.meta.url));
const esbuild = createRequire(`${pkg}package.json`)("esbuild");

// The guide's React block (the one jsx block that renders into `root`).
const guide = readFileSync(new URL("../../docs/clients.md", import.meta.url), "utf8");
const blocks = [...guide.matchAll(/^```jsx\n([\s\S]*?)^```$/gm)].map((m) => m[1]).filter((b) => b.includes("root.render("));
if (blocks.length !== 1) throw new Error(`docs/clients.md has ${blocks.length} jsx blocks that render into root, not one`);
const address = '"wss://gw.example.com/ws"';
if (!blocks[0].includes(address)) throw new Error(`the React block does not connect to ${address}:\n${blocks[0]}`);
const block = blocks[0].replace(address, JSON.stringify(`${base.replace(/^http/, "ws")}/ws`));

/** The page's bundle: a React root on #root as `root`, then the block, one React for both. */
async function bundle() {
  const modules = {
    entry: 'import "docs:root";\nimport "docs:block";\n',
    root: 'import { createRoot } from "react-dom/client";\nglobalThis.root = createRoot(document.getElementById("root"));\n',
    block,
  };
  const result = await esbuild.build({
    entryPoints: ["docs:entry"],
    bundle: true,
    write: false,
    format: "esm",
    target: "es2022",
    jsx: "automatic",
    // This checkout's package, as its `exports` name it.
    alias: { "ackgate-client": `${pkg}ackgate.js`, "ackgate-client/react": `${pkg}react.js` },
    define: { "process.env.NODE_ENV": '"development"' },
    logLevel: "warning",
    plugins: [
      {
        name: "docs",
        setup(build) {
          build.onResolve({ filter: /^docs:/ }, (args) => ({ path: args.path.slice(5), namespace: "docs" }));
          // (React and the package resolve from clients/js.)
          build.onLoad({ filter: /.*/, namespace: "docs" }, (args) => ({ contents: modules[args.path], loader: "jsx", resolveDir: pkg }));
        },
      },
    ],
  });
  return result.outputFiles[0].text;
}

const N = 60;
const LIMIT = 50; // the block's `useTopic("orders", { limit: 50 })`
const { browser, page, problems } = await openPage(base);
const log = keepLog(page);

/** What the app shows: Status's text and Orders' items. */
const shown = () => page.evaluate(() => ({ status: document.querySelector("#root p")?.textContent, items: [...document.querySelectorAll("#root li")].map((li) => li.textContent) }));

/** The committed offsets of `clientId` on orders, summed over the partitions, and the log end's. */
async function progress(clientId) {
  const { answer } = await call("GET", `${base}/admin/offsets?topic=orders&client_id=${clientId}`);
  const rows = answer?.offsets ?? [];
  return { committed: rows.reduce((sum, r) => sum + r.committed, 0), end: rows.reduce((sum, r) => sum + r.log_end, 0) };
}

try {
  const js = await bundle();
  await page.route(`${base}/docs/react.js`, (route) => route.fulfill({ contentType: "text/javascript", body: js }));
  await openTestPage(page, base);
  await page.evaluate(async () => {
    document.body.innerHTML = '<div id="root"></div>';
    await import("/docs/react.js");
  });
  await until("Status showing connected", async () => (await shown()).status === "connected");
  const clientId = await page.evaluate(() => localStorage.getItem("ackgate:device-id"));
  if (!clientId) throw new Error("deviceClientId() kept no id in localStorage");

  // A fresh gateway: the block's subscribe made the topic (4 partitions). The events, each with
  // its item, spread over them.
  const items = Array.from({ length: N }, (_, n) => `item ${n}`);
  await publish(base, "orders", items.map((item) => ({ key: item, payload: { item } })));
  const acked = await until("every event acked, rendered or dropped by the limit", async () => {
    const { committed, end } = await progress(clientId);
    return end === N && committed === N && committed;
  });
  const { items: listed } = await until(`Orders listing ${LIMIT} events`, async () => {
    const now = await shown();
    return now.items.length === LIMIT && now;
  });
  if (new Set(listed).size !== LIMIT || !listed.every((item) => items.includes(item))) throw new Error(`Orders lists ${JSON.stringify(listed)}`);

  // Another browser with this client id takes the session over: the client fails for good, and
  // Status says so with the failure's code.
  const other = await browser.newContext();
  const otherPage = await other.newPage();
  await otherPage.goto(`${base}/healthz`);
  await otherPage.evaluate(
    (url) =>
      new Promise((resolve, reject) => {
        const socket = new WebSocket(url);
        socket.onmessage = (m) => JSON.parse(m.data).type === "welcome" && resolve();
        socket.onerror = () => reject(new Error("the other browser's WebSocket failed"));
      }),
    `${base.replace(/^http/, "ws")}/ws?client_id=${clientId}`,
  );
  await until("Status showing the takeover", async () => (await shown()).status === "failed: taken_over");
  await other.close();

  const consoleErrors = log.filter((line) => line.startsWith("[page error]"));
  if (consoleErrors.length) throw new Error(`React reported:\n${consoleErrors.join("\n")}`);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`docs react: the guide's app listed ${listed.length} of ${N} events (limit ${LIMIT}) and acked all of them (committed ${acked} of ${N}); Status showed connected, then failed: taken_over`);
} catch (e) {
  console.error(`browser docs react test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
