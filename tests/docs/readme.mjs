// README's "Five minutes with curl and a WebSocket client", run as written against a fresh gateway
// (issue 61: every code block a user copies runs in a test). Each command of the block runs with
// sh from the repository's root, `localhost:8080` replaced by the gateway's address, and its
// answer is checked against what the block says of it:
// - a command followed by `# {...}` lines must print those (the same keys and values; the
//   block's abbreviations: `...` for a value is any value, `,...]` more items, a string ending in
//   `...` a prefix, `host:8080` the gateway's host name and port, a `delivery_id` the same but for
//   its first field, a counter of the whole gateway; keys the block leaves out are allowed);
// - `scripts/client alice orders` runs as written, given the gateway's address first (its
//   optional argument); it runs the walkthrough's client, the example binary `scripts/run` builds
//   (target/release/examples/ws_client): here the debug build given as WS_CLIENT, through a
//   CARGO_TARGET_DIR whose release/examples/ws_client is it. Every frame the block shows must
//   be among those it prints, and it must get an `ack_ok` for each event published above. It
//   runs on while the commands after it read the offsets, the sessions and the topics;
// - the fields a comment names (`log_end`, `lag`, ...) are in the answer of its command, and what
//   it says holds: committed is the log end (every event acked), the session is live with its
//   counters, the topic has the 4 partitions of its first publish.
//
//   node tests/docs/readme.mjs http://127.0.0.1:PORT path/to/target/debug/examples/ws_client
//
// Prints `readme: ...`; exits non-zero with what differs.
import { execFile, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const [base, wsClient] = process.argv.slice(2);
if (!base || !wsClient) {
  console.error("usage: readme.mjs BASE_URL WS_CLIENT_BINARY");
  process.exit(2);
}
const repo = fileURLToPath(new URL("../../", import.meta.url));
const host = new URL(base).host;

// The block: each command (continuation lines joined) with the comment lines after it.
const readme = readFileSync(join(repo, "README.md"), "utf8");
const start = readme.indexOf("\n## Five minutes with curl and a WebSocket client\n");
if (start < 0) throw new Error(`README.md has no "Five minutes with curl and a WebSocket client"`);
const block = readme.slice(start).match(/^```sh\n([\s\S]*?)^```$/m)[1];
const commands = [];
let comments = [];
for (const line of block.replace(/\\\n\s*/g, "").split("\n")) {
  const last = commands.at(-1);
  if (line.startsWith("#")) (last && !last.done ? last.after : comments).push(line.replace(/^# ?/, ""));
  else if (line.trim()) {
    const [text, note = ""] = line.split(/\s+#\s+/);
    commands.push({ text: text.trim().replaceAll("localhost:8080", host), note, before: comments, after: [] });
    comments = [];
  } else if (last) last.done = true; // a blank line ends what a command printed
}

const ANY = Symbol("any value");
const MORE = Symbol("more items");
/** A `# {...}` line as a pattern: the block's `...` abbreviations made markers. */
function pattern(line) {
  const json = line.replace(/:\.\.\.(?=[,}])/g, ':"\\u0000any"').replace(/,\.\.\.\]/g, ',"\\u0000more"]');
  return JSON.parse(json, (key, value) => (value === "\u0000any" ? ANY : value === "\u0000more" ? MORE : value));
}

/** What differs between `want` (a pattern) and `got`, as "path: ..." lines. */
function differences(want, got, path = "") {
  if (want === ANY) return got === undefined ? [`${path}: missing`] : [];
  if (Array.isArray(want)) {
    if (!Array.isArray(got)) return [`${path}: ${JSON.stringify(got)} is not a list`];
    const items = want.filter((item) => item !== MORE);
    const more = items.length < want.length;
    if (more ? got.length < items.length : got.length !== items.length) return [`${path}: ${got.length} items, the block shows ${items.length}${more ? " and more" : ""}`];
    return items.flatMap((item, i) => differences(item, got[i], `${path}[${i}]`));
  }
  if (want && typeof want === "object") {
    if (!got || typeof got !== "object") return [`${path}: ${JSON.stringify(got)} is not an object`];
    return Object.entries(want).flatMap(([key, value]) => differences(value, got[key], `${path}.${key}`));
  }
  if (typeof want === "string" && typeof got === "string") {
    if (path.endsWith(".delivery_id") && want.split(".").slice(1).join(".") === got.split(".").slice(1).join(".")) return [];
    if (want.endsWith("...") && got.startsWith(want.slice(0, -3))) return [];
    if (want === "host:8080" && got.endsWith(`:${new URL(base).port}`)) return [];
  }
  return want === got ? [] : [`${path}: ${JSON.stringify(got)}, the block shows ${JSON.stringify(want)}`];
}

/**
 * The snake_case names a comment gives (`log_end`, `pull_offset`), which the answer must have
 * (a config key, `embedded.default_partitions`, is not one).
 */
const fieldsNamed = (text) => text.match(/(?<![\w.])[a-z]+(?:_[a-z]+)+\b(?!\.)/g) ?? [];
/** Every key in `value`, at any depth. */
const keys = (value) => (value && typeof value === "object" ? Object.entries(value).flatMap(([k, v]) => [...(Array.isArray(value) ? [] : [k]), ...keys(v)]) : []);

const run = async (text) => (await promisify(execFile)("sh", ["-c", text], { cwd: repo })).stdout;
const sum = (rows, field) => rows.reduce((total, row) => total + row[field], 0);
const until = async (what, check, timeoutMs = 10000) => {
  for (const deadline = Date.now() + timeoutMs; Date.now() < deadline; await new Promise((r) => setTimeout(r, 100))) {
    const value = check();
    if (value) return value;
  }
  throw new Error(`timed out waiting for ${what}`);
};

const target = mkdtempSync(join(tmpdir(), "ackgate-readme-"));
mkdirSync(join(target, "release/examples"), { recursive: true });
symlinkSync(wsClient, join(target, "release/examples/ws_client"));
let client = null;
const printed = [];
const seen = [];
try {
  let published = 0;
  for (const command of commands) {
    const { text, note } = command;
    const shown = command.after.filter((line) => line.startsWith("{")).map(pattern);
    const named = fieldsNamed([...command.before, note].join(" "));
    if (text.startsWith("scripts/client ")) {
      // (The block runs it in the foreground, and the user stops it; here it runs on.)
      const args = text.split(/\s+/).slice(1);
      client = spawn(join(repo, "scripts/client"), [`ws://${host}`, ...args], { cwd: repo, env: { ...process.env, CARGO_TARGET_DIR: target } });
      let rest = "";
      client.stdout.on("data", (data) => {
        const lines = (rest + data).split("\n");
        rest = lines.pop();
        printed.push(...lines);
      });
      client.stderr.on("data", (data) => printed.push(`[stderr] ${data}`));
      const frames = () => printed.filter((line) => line.startsWith("{")).map((line) => JSON.parse(line));
      await until(`scripts/client printing the frames the block shows and an ack_ok for each of the ${published} events`, () => {
        const all = frames();
        return shown.every((want) => all.some((got) => differences(want, got).length === 0)) && all.filter((f) => f.type === "ack_ok").length === published;
      }).catch((error) => {
        const all = frames();
        const unmatched = shown.filter((want) => !all.some((got) => differences(want, got).length === 0));
        const near = unmatched.map((want) => `${want.type}: ${all.filter((got) => got.type === want.type).map((got) => differences(want, got).join("; ")).join(" | ") || "none printed"}`);
        throw new Error(`${error.message}\nnot printed as the block shows:\n${near.join("\n")}\nprinted:\n${printed.join("\n")}`);
      });
      const events = frames().filter((f) => f.type === "event");
      if (events.length !== published) throw new Error(`scripts/client got ${events.length} events, ${published} were published`);
      seen.push(`scripts/client received ${events.length} events and got an ack_ok for each, printing the ${shown.length} frames the block shows`);
      continue;
    }
    if (!text.startsWith("curl ")) throw new Error(`a command this test does not know: ${text}`);
    const answer = JSON.parse(await run(text));
    for (const want of shown) {
      const differ = differences(want, answer);
      if (differ.length) throw new Error(`${text}:\n${differ.join("\n")}`);
    }
    const missing = named.filter((name) => !keys(answer).includes(name));
    if (missing.length) throw new Error(`${text}: the block names ${missing.join(", ")}, the answer has none: ${JSON.stringify(answer)}`);
    // What each one's comment says.
    const path = new URL(text.match(/'?(localhost|127\.0\.0\.1)[^' ]*'?/)[0].replaceAll("'", "").replace(/^/, "http://")).pathname;
    if (text.includes("-X POST") && path === "/topics/orders/events") {
      const sent = JSON.parse(text.match(/ -d '([^']*)'/)[1]);
      if (answer.offsets?.length !== (sent.events?.length ?? 1)) throw new Error(`${text}: ${JSON.stringify(answer)}`);
      published += answer.offsets.length;
    } else if (path === "/admin/offsets") {
      // "committed = next offset not yet acknowledged": every event was acked.
      const rows = answer.offsets.filter((row) => row.topic === "orders" && row.client_id === "alice");
      if (rows.length !== 4 || rows.some((row) => row.committed !== row.log_end) || sum(rows, "committed") !== published) throw new Error(`${text}: ${JSON.stringify(answer)}`);
    } else if (path === "/admin/offsets/orders/alice") {
      // "per partition, with log_end and lag"
      const rows = answer.partitions;
      if (rows.length !== 4 || rows.some((row) => row.lag !== 0) || sum(rows, "log_end") !== published) throw new Error(`${text}: ${JSON.stringify(answer)}`);
    } else if (path === "/admin/sessions") {
      // "live sessions and their counters"
      const alice = answer.sessions.filter((s) => s.client_id === "alice");
      if (alice.length !== 1 || alice[0].delivered !== published || alice[0].acked !== published) throw new Error(`${text}: ${JSON.stringify(answer)}`);
    } else if (path === "/topics") {
      // Created by the first publish "with 4 partitions (embedded.default_partitions)".
      const orders = answer.topics.find((t) => t.name === "orders");
      if (orders?.partitions.length !== 4 || sum(orders.partitions, "log_end") !== published) throw new Error(`${text}: ${JSON.stringify(answer)}`);
    } else throw new Error(`a command this test does not know: ${text}`);
    seen.push(`${text.replace(host, "localhost:8080")}${shown.length ? " printed what the block shows" : ""}${named.length ? ` (${named.join(", ")})` : ""}`);
  }
  if (!client) throw new Error("the block does not run scripts/client");
  console.log(`readme: five minutes, ${commands.length} commands as written:\n${seen.map((line) => `readme: ${line}`).join("\n")}`);
} catch (e) {
  console.error(`README test failed: ${e.message}`);
  process.exitCode = 1;
} finally {
  client?.kill();
  rmSync(target, { recursive: true, force: true });
}
