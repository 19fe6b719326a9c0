// docs/clients.md's "A minimal browser app", its steps run as written in headless Chromium: the
// minimal app (clients/js/examples/minimal.html) served by step 3's own command (`python3 -m
// http.server ... --directory clients/js/examples`, from the repository's root) on its own origin
// opens the URL step 3 names, imports the client from the gateway (/static/ackgate.min.js, CORS),
// opens a session there; step 4's curl lines publish an event, which the page lists and acks, and
// read the committed offset, which moves. Only the ports change: the app's 9000 is APP_PORT, and
// the gateway's localhost:8080 the test gateway's address. Step 1 (the gateway lets the app's
// origin in, ACKGATE_SERVER__ALLOWED_ORIGINS) is the Rust test's: it reads the origins from the
// guide and starts the gateway with them, 9000 made APP_PORT; run by hand, start the gateway as
// step 1 says. The gateway must be fresh: the page's client id is the example's, minimal-app.
//
//   node tests/browser/own_origin.mjs http://127.0.0.1:GATEWAY_PORT APP_PORT
//
// Prints `own origin: ...`; exits non-zero with the page's log on any failure.
import { execFile, spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { keepLog, openPage, until } from "./page.mjs";

const [base, appPort] = process.argv.slice(2);
if (!base || !appPort) {
  console.error("usage: own_origin.mjs BASE_URL APP_PORT");
  process.exit(2);
}
const repo = fileURLToPath(new URL("../../", import.meta.url));

// The guide's steps: the sh blocks of its section, each as its lines, with the ports changed.
const guide = await readFile(new URL("../../docs/clients.md", import.meta.url), "utf8");
const start = guide.indexOf("\n## A minimal browser app\n");
const section = guide.slice(start, guide.indexOf("\n## ", start + 1));
const ported = (line) => line.replaceAll("localhost:8080", new URL(base).host).replace(/\b9000\b/g, appPort);
const steps = [...section.matchAll(/^ *```sh\n([\s\S]*?)^ *```$/gm)].map((m) =>
  m[1]
    .split("\n")
    .map((line) => ported(line.trim()))
    .filter(Boolean),
);
if (steps.length !== 3) throw new Error(`"A minimal browser app" has ${steps.length} sh blocks, not 3 (steps 1, 3 and 4)`);
const [serve, open] = steps[1];
const [publishLine, offsetsLine] = steps[2];
if (!serve.endsWith(" &") || !open.startsWith("# open http") || !publishLine.startsWith("curl ") || !offsetsLine.startsWith("curl ")) {
  throw new Error(`the steps are not what this test runs:\n${steps.map((s) => s.join("\n")).join("\n\n")}`);
}
const pageUrl = open.slice("# open ".length);
const app = new URL(pageUrl).origin;

/** Runs a line of the guide with sh, from the repository's root; its output, parsed as JSON. */
async function sh(line) {
  const { stdout } = await promisify(execFile)("sh", ["-c", line], { cwd: repo });
  try {
    return JSON.parse(stdout);
  } catch {
    throw new Error(`${line}: not JSON: ${stdout}`);
  }
}

// Step 3's server (without its `&`: this script keeps it, and stops it at the end).
const server = spawn("sh", ["-c", `exec ${serve.slice(0, -2)}`], { cwd: repo, stdio: "ignore" });
const { browser, page, problems } = await openPage(app, base);
const log = keepLog(page);

try {
  await until("step 3's server", async () => (await fetch(pageUrl).catch(() => null))?.ok);
  await page.goto(pageUrl);
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("connected"), null, { timeout: 10000 });
  /** The committed offsets step 4's second line reads, summed over the partitions. */
  const committed = async () => (await sh(offsetsLine)).offsets.reduce((sum, row) => sum + row.committed, 0);
  const before = await committed();
  const published = await sh(publishLine);
  const [{ partition, offset }] = published.offsets ?? [];
  if (published.offsets?.length !== 1 || typeof offset !== "number") throw new Error(`${publishLine}: ${JSON.stringify(published)}`);
  await page.waitForFunction(() => document.querySelectorAll("#events li").length === 1, null, { timeout: 10000 });
  const listed = await page.$eval("#events li", (li) => li.textContent);
  // (What the page shows of an event: `partition/offset: payload`.)
  const payload = JSON.parse(publishLine.match(/ -d '([^']*)'/)[1]).payload;
  if (listed !== `${partition}/${offset}: ${JSON.stringify(payload)}`) throw new Error(`the page lists ${JSON.stringify(listed)}, published ${JSON.stringify(published)}`);
  const after = await until("the ack, in step 4's offsets", async () => (await committed()) === before + 1 && before + 1);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`own origin: the guide's steps: a page of ${app} (python3 -m http.server) imported the client from ${base}, listed the event curl published (${listed}) and acked it (committed ${before} -> ${after})`);
} catch (e) {
  console.error(`browser own-origin test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
  server.kill();
}
