// ackgate-client without a gateway: a fake WebSocket (passed as `options.WebSocket`) plays the
// gateway's side, frame by frame, so the API's promises, states, listeners, iterators and timers
// are checked exactly and fast. Needs no environment (client.test.mjs needs running gateways).
//
//   node --test test/unit.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

import { AckgateClient, AckgateError, FINAL_CLOSES, FINAL_SUBSCRIBE_ERRORS, version } from "../ackgate.js";
import { build } from "../build.mjs";

/**
 * A fake gateway: every socket the client opens is kept in `sockets`; the test opens it
 * (`welcome()`), answers its frames (`answer()`), sends it frames (`send()`) or cuts it.
 */
function fakeGateway() {
  const sockets = [];
  class FakeWebSocket {
    static OPEN = 1;
    readyState = 0; // CONNECTING until the test opens it
    sent = []; // the client's frames, parsed

    constructor(url) {
      this.url = url;
      sockets.push(this);
    }

    send(data) {
      if (this.readyState !== 1) throw new Error("not open");
      this.sent.push(JSON.parse(data));
    }

    close(code = 1005, reason = "") {
      if (this.readyState === 3) return;
      this.readyState = 3;
      this.closedWith = code;
      setTimeout(() => this.onclose?.({ code, reason }));
    }

    /** Opens and sends the welcome. */
    welcome(fields = {}) {
      this.readyState = 1;
      this.send_({ type: "welcome", session_id: `s${sockets.indexOf(this) + 1}`, client_id: "unit", instance: "fake", ack_timeout_ms: 30000, max_in_flight: 1000, ...fields });
    }

    send_(frame) {
      this.onmessage?.({ data: JSON.stringify(frame) });
    }

    /** The last frame the client sent with `op`. */
    last(op) {
      return this.sent.findLast((frame) => frame.op === op);
    }

    /** Answers the last `op` frame with `frame` (its req added). */
    answer(op, frame) {
      this.send_({ ...frame, req: this.last(op).req });
    }

    /** The server closes (or the network drops it: 1006). */
    cut(code = 1006, reason = "") {
      this.readyState = 3;
      this.onclose?.({ code, reason });
    }
  }
  return { WebSocket: FakeWebSocket, sockets, socket: () => sockets.at(-1) };
}

// Waits `ms`, then for every zero-delay timer set before: on a loaded machine the `ms` timer may
// fire first, when the client's own setTimeout(0) (a store's notification, a close) was set by the
// microtasks that ran just after it. Node runs timers of one delay in the order they were set, so
// a setTimeout(0) set now runs after those (the react test failed once in CI without it).
const tick = async (ms = 0) => {
  await new Promise((resolve) => setTimeout(resolve, ms));
  await new Promise((resolve) => setTimeout(resolve, 0));
};

const event = (topic, offset, extra = {}) => ({
  type: "event",
  delivery_id: `${topic}.${offset}`,
  topic,
  partition: 0,
  offset,
  attempt: 1,
  timestamp: 0,
  key: null,
  headers: {},
  payload: { n: offset },
  ...extra,
});

/** A client connected to a fake gateway, subscribed to `topics` (each with one partition). */
async function connected(options = {}, topics = []) {
  const gateway = fakeGateway();
  const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, ...options });
  const welcome = client.connect();
  gateway.socket().welcome();
  await welcome;
  for (const topic of topics) {
    const subscribed = client.subscribe(topic);
    gateway.socket().answer("subscribe", { type: "subscribed", topic, partitions: [{ partition: 0, from: 0, epoch: 0 }] });
    await subscribed;
  }
  return { client, gateway, socket: gateway.socket() };
}

/** Replaces `fetch` for /session/recommend: every instance names ws://fake/ws. */
function recommendFake() {
  const real = globalThis.fetch;
  globalThis.fetch = async () => new Response(JSON.stringify({ instance: "fake", ws_url: "ws://fake/ws", http_url: "http://fake" }));
  return () => (globalThis.fetch = real);
}

test("ack: plain resolves at once with nothing, {confirm: true} resolves with the ack_ok, and an error frame rejects it", async () => {
  const { client, socket } = await connected({ confirmEveryMs: 60_000 }, ["t"]);
  socket.send_(event("t", 0));
  socket.send_(event("t", 1));
  socket.send_(event("t", 2));
  // The first ack of a partition is confirmed (in the background); the next one is plain.
  assert.equal(await client.ack("t.0"), undefined);
  socket.answer("ack", { type: "ack_ok", committed: { t: { 0: 1 } } });
  assert.equal(await client.ack("t.1"), undefined);
  assert.deepEqual(socket.sent.at(-1), { op: "ack", delivery_id: "t.1" }, "plain: no req");
  const confirmed = client.ack(["t.2"], { confirm: true });
  assert.equal(socket.last("ack").delivery_id, "t.2");
  socket.answer("ack", { type: "ack_ok", committed: { t: { 0: 3 } } });
  assert.deepEqual((await confirmed).committed, { t: { 0: 3 } });
  assert.deepEqual(client.resumeToken("t"), { 0: 3 });
  const refused = client.ack("nope", { confirm: true });
  socket.answer("ack", { type: "error", code: "unknown_delivery", message: "no such delivery" });
  await assert.rejects(refused, (e) => e instanceof AckgateError && e.code === "unknown_delivery");
  client.close();
});

test("state: closed, connecting, connected, reconnecting after a lost connection, connected again, closed; a state event for each change", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const seen = [];
    const fromOption = [];
    const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, onState: (s) => fromOption.push(s) });
    client.on("state", (s) => seen.push([s, client.state]));
    assert.equal(client.state, "closed");
    const welcome = client.connect();
    assert.equal(client.state, "connecting");
    gateway.socket().welcome();
    assert.equal((await welcome).session_id, "s1");
    assert.equal(client.welcome?.session_id, "s1");
    gateway.socket().cut(1006);
    assert.equal(client.state, "reconnecting");
    while (gateway.sockets.length < 2) await tick(1);
    gateway.socket().welcome();
    assert.equal(client.state, "connected");
    assert.equal(client.welcome?.session_id, "s2");
    client.close();
    assert.equal(client.state, "closed");
    const states = ["connecting", "connected", "reconnecting", "connected", "closed"];
    assert.deepEqual(seen, states.map((s) => [s, s]), "the getter agrees with each event");
    assert.deepEqual(fromOption, states);
  } finally {
    restore();
  }
});

test("on and off: listeners of every name beside the onX options, the remover on() returns, and unknown names refused", async () => {
  const gateway = fakeGateway();
  const calls = [];
  const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, onEvent: (e) => calls.push(["onEvent", e.offset]) });
  const listener = (e) => calls.push(["listener", e.offset]);
  client.on("event", listener);
  const remove = client.on("event", (e) => calls.push(["removed", e.offset]));
  const frames = [];
  client.on("frame", (f) => frames.push(f.type));
  const connecting = client.connect();
  gateway.socket().welcome();
  await connecting;
  const subscribing = client.subscribe("t");
  gateway.socket().answer("subscribe", { type: "subscribed", topic: "t", partitions: [] });
  await subscribing;
  gateway.socket().send_(event("t", 0));
  remove();
  gateway.socket().send_(event("t", 1));
  client.off("event", listener);
  gateway.socket().send_(event("t", 2));
  assert.deepEqual(calls, [["onEvent", 0], ["listener", 0], ["removed", 0], ["onEvent", 1], ["listener", 1], ["onEvent", 2]]);
  assert.deepEqual(frames, ["welcome", "subscribed", "event", "event", "event"]);
  assert.throws(() => client.on("toString", () => {}), TypeError);
  assert.throws(() => client.on("events", () => {}), /no event "events"/);
  client.close();
});

test("a listener that throws does not stop the client", async () => {
  const { client, socket } = await connected({}, ["t"]);
  // Reported as browsers report an uncaught error (reportError), the client going on.
  const thrown = [];
  globalThis.reportError = (error) => thrown.push(error.message);
  try {
    client.on("event", () => {
      throw new Error("app bug");
    });
    const stream = client.events();
    socket.send_(event("t", 0));
    assert.equal((await stream.next()).value.offset, 0, "the event still reached the iterator");
    assert.deepEqual(thrown, ["app bug"], "the error is reported");
  } finally {
    delete globalThis.reportError;
    client.close();
  }
});

test("topic() yields that topic's events only, those queued since its subscribe first; events() gets the rest; it ends at unsubscribe", async () => {
  const { client, socket } = await connected({}, ["a", "b"]);
  socket.send_(event("a", 0)); // before any iterator: queued
  socket.send_(event("b", 0));
  const a = client.topic("a");
  const all = client.events();
  socket.send_(event("a", 1));
  socket.send_(event("b", 1));
  const a2 = client.topic("a"); // a second iterator of a gets a's events from now on, too
  socket.send_(event("a", 2));
  const take = async (iterator, n) => {
    const items = [];
    while (items.length < n) items.push((await iterator.next()).value);
    return items.map((e) => `${e.topic}${e.offset}`);
  };
  assert.deepEqual(await take(a, 3), ["a0", "a1", "a2"]);
  assert.deepEqual(await take(a2, 1), ["a2"]);
  assert.deepEqual(await take(all, 2), ["b0", "b1"]);
  // Unsubscribe ends a's iterators (what they held was released by the gateway).
  const waiting = a.next();
  const unsubscribed = client.unsubscribe("a");
  socket.answer("unsubscribe", { type: "unsubscribed", topic: "a" });
  await unsubscribed;
  assert.deepEqual(await waiting, { value: undefined, done: true });
  assert.deepEqual(await a2.next(), { value: undefined, done: true });
  // for-await's break (return()) ends an iterator; the topic's events go to events() again.
  const b = client.topic("b");
  socket.send_(event("b", 2));
  for await (const e of b) {
    assert.equal(e.offset, 2);
    break;
  }
  socket.send_(event("b", 3));
  assert.deepEqual(await take(all, 1), ["b3"]);
  // A final close ends the rest.
  const end = all.next();
  socket.cut(4001, "taken over");
  assert.deepEqual(await end, { value: undefined, done: true });
  assert.deepEqual(await client.topic("b").next(), { value: undefined, done: true }, "a topic() after the end is ended");
});

test("gaps: onGap and on('gap') get every gap, a subscribe's too; iterators yield them only with {gaps: true}", async () => {
  const gaps = [];
  const { client, socket } = await connected({ onGap: (g) => gaps.push(["option", g.from, g.to]) });
  client.on("gap", (g) => gaps.push(["on", g.from, g.to]));
  const plain = client.events();
  const subscribing = client.subscribe("t");
  socket.answer("subscribe", { type: "subscribed", topic: "t", partitions: [{ partition: 0, from: 5, epoch: 0, gap: { from: 2, to: 5 } }] });
  await subscribing;
  socket.send_(event("t", 5));
  socket.send_({ type: "gap", topic: "t", partition: 0, from: 6, to: 9 });
  socket.send_(event("t", 9));
  assert.deepEqual(gaps, [["option", 2, 5], ["on", 2, 5], ["option", 6, 9], ["on", 6, 9]]);
  assert.deepEqual([(await plain.next()).value.offset, (await plain.next()).value.offset], [5, 9], "events() skips the gaps");

  const withGaps = client.topic("t", { gaps: true });
  socket.send_({ type: "gap", topic: "t", partition: 0, from: 10, to: 12 });
  socket.send_(event("t", 12));
  assert.deepEqual((await withGaps.next()).value, { type: "gap", topic: "t", partition: 0, from: 10, to: 12 });
  assert.equal((await withGaps.next()).value.offset, 12);
  // A subscribe's gap (the start wanted was below the log's start) is an item as well.
  const other = client.events({ gaps: true });
  const again = client.subscribe("u");
  socket.answer("subscribe", { type: "subscribed", topic: "u", partitions: [{ partition: 1, from: 7, epoch: 0, gap: { from: 0, to: 7 } }] });
  await again;
  assert.deepEqual((await other.next()).value, { type: "gap", topic: "u", partition: 1, from: 0, to: 7 });
  client.close();
});

test("a request without an answer rejects with timeout after requestTimeoutMs, and a ping then finds the dead connection", async () => {
  const restore = recommendFake();
  try {
    const closes = [];
    const { client, gateway, socket } = await connected({ requestTimeoutMs: 30, heartbeatTimeoutMs: 30, backoffMs: 1, onClose: (c) => closes.push(c) });
    const started = Date.now();
    await assert.rejects(client.ping(), (e) => e instanceof AckgateError && e.code === "timeout" && /requestTimeoutMs/.test(e.message));
    assert.ok(Date.now() - started >= 25);
    assert.equal(socket.sent.filter((f) => f.op === "ping").length, 2, "the connection is checked with a ping");
    // That ping gets no answer either: the connection is abandoned (1006) and the client reconnects.
    while (closes.length === 0) await tick(5);
    assert.deepEqual(closes[0], { code: 1006, reason: "no pong within 30 ms (heartbeatTimeoutMs)", final: false });
    assert.equal(socket.closedWith, 4000);
    while (gateway.sockets.length < 2) await tick(1);
    gateway.socket().welcome();
    const pong = client.ping();
    gateway.socket().answer("ping", { type: "pong" });
    assert.equal((await pong).type, "pong");
    // An answer in time clears its timer: nothing rejects later.
    await tick(50);
    assert.equal(client.state, "connected");
    client.close();
  } finally {
    restore();
  }
});

test("a connect whose welcome does not come within connectTimeoutMs is abandoned (with reconnect: false, connect() rejects with timeout); in a reconnect it is a failed attempt and the next one follows", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const attempts = [];
    const options = { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, connectTimeoutMs: 30, backoffMs: 1, maxBackoffMs: 1 };
    const once = new AckgateClient("ws://fake/ws", { ...options, reconnect: false });
    await assert.rejects(once.connect(), (e) => e.code === "timeout" && /connectTimeoutMs/.test(e.message));
    assert.equal(gateway.sockets[0].closedWith, 4000, "the socket is abandoned");
    assert.equal(once.state, "closed");
    assert.equal(gateway.sockets.length, 1, "reconnect: false: no second attempt");

    const client = new AckgateClient("ws://fake/ws", { ...options, onReconnect: (r) => attempts.push(r) });
    const connecting = client.connect();
    gateway.socket().welcome();
    await connecting;
    gateway.socket().cut(1006);
    while (gateway.sockets.length < 3) await tick(1); // the first reconnect attempt: it never opens
    while (gateway.sockets.length < 4) await tick(5); // abandoned after 30 ms: the next one
    assert.match(attempts.find((a) => a.error)?.error ?? "", /connectTimeoutMs/);
    gateway.socket().welcome();
    while (!attempts.some((a) => a.welcome)) await tick(1);
    assert.equal(client.state, "connected");
    client.close();
  } finally {
    restore();
  }
});

test("FINAL_CLOSES and FINAL_SUBSCRIBE_ERRORS are read-only; 4004 (token expired) is not final: the client reconnects with a new token", async () => {
  assert.deepEqual([...FINAL_CLOSES], [1008, 4001]);
  assert.ok(FINAL_CLOSES.has(4001) && !FINAL_CLOSES.has(4004));
  assert.equal(FINAL_SUBSCRIBE_ERRORS.size, 3);
  assert.throws(() => FINAL_CLOSES.add(4004), TypeError);
  assert.throws(() => FINAL_SUBSCRIBE_ERRORS.delete("forbidden"), TypeError);
  assert.throws(() => Set.prototype.add.call(FINAL_CLOSES, 4004), TypeError, "not a Set underneath");
  assert.throws(() => (FINAL_CLOSES.add = () => {}), TypeError, "frozen");
  assert.ok(!FINAL_CLOSES.has(4004));

  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    let tokens = 0;
    const closes = [];
    const client = new AckgateClient("ws://fake/ws", {
      clientId: "unit",
      WebSocket: gateway.WebSocket,
      heartbeatMs: 0,
      backoffMs: 1,
      tokenProvider: async () => `jwt-${++tokens}`,
      onClose: (c) => closes.push(c),
    });
    const connecting = client.connect();
    await tick(1);
    gateway.socket().welcome();
    await connecting;
    gateway.socket().cut(4004, "token expired");
    assert.deepEqual(closes, [{ code: 4004, reason: "token expired", final: false }]);
    while (gateway.sockets.length < 2) await tick(1);
    assert.equal(new URL(gateway.socket().url).searchParams.get("token"), "jwt-2");
    gateway.socket().welcome();
    gateway.socket().cut(4001, "taken over");
    assert.deepEqual(closes.at(-1), { code: 4001, reason: "taken over", final: true });
    assert.equal(client.state, "failed");
    assert.deepEqual(client.failure, { code: "taken_over", message: "taken over", closeCode: 4001 });
  } finally {
    restore();
  }
});

test("without a WebSocket the constructor throws a TypeError that names the fix", () => {
  const saved = Object.getOwnPropertyDescriptor(globalThis, "WebSocket");
  delete globalThis.WebSocket;
  try {
    assert.throws(() => new AckgateClient("ws://fake/ws", { clientId: "unit" }), (e) => e instanceof TypeError && /--experimental-websocket/.test(e.message) && /options\.WebSocket/.test(e.message));
    // Over SSE no WebSocket is needed; "auto" makes do with an EventSource.
    const EventSource = class {};
    assert.ok(new AckgateClient("ws://fake/ws", { clientId: "unit", transport: "sse", EventSource }));
    assert.ok(new AckgateClient("ws://fake/ws", { clientId: "unit", transport: "auto", EventSource }));
  } finally {
    if (saved) Object.defineProperty(globalThis, "WebSocket", saved);
  }
  assert.throws(() => new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: fakeGateway().WebSocket, tabs: "all" }), /options\.tabs/);
});

test("the client's internals are private: its public surface is its methods and getters", async () => {
  const { client } = await connected({}, ["t"]);
  assert.deepEqual(Object.keys(client), []);
  for (const name of ["url", "options", "transport", "pending", "queue", "inFlight", "subscriptions", "committed"]) assert.equal(client[name], undefined, name);
  const surface = Object.getOwnPropertyNames(AckgateClient.prototype).sort();
  assert.deepEqual(surface, ["ack", "close", "connect", "constructor", "events", "extend", "failure", "issuedToken", "nack", "off", "on", "ping", "publish", "resumeEpochs", "resumeToken", "state", "subscribe", "term", "topic", "unsubscribe", "welcome"]);
  assert.throws(() => (client.state = "connected"), TypeError);
  client.close();
});

test("publish waits for the connection and carries an idempotency key; a publish cut by a close is sent again with the same key", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1 });
    const published = client.publish("t", { payload: 1 });
    const connecting = client.connect();
    gateway.socket().welcome();
    await connecting;
    await tick();
    const first = gateway.socket().last("publish");
    assert.match(first.idempotency_key, /^[0-9a-f]{32}$/);
    gateway.socket().cut(1006);
    while (gateway.sockets.length < 2) await tick(1);
    gateway.socket().welcome();
    await tick();
    assert.equal(gateway.socket().last("publish").idempotency_key, first.idempotency_key);
    gateway.socket().answer("publish", { type: "published", offsets: [{ partition: 0, offset: 0 }] });
    assert.deepEqual((await published).offsets, [{ partition: 0, offset: 0 }]);
    client.close();
  } finally {
    restore();
  }
});

// client.test.mjs and tests/browser/docs_react.mjs run docs/clients.md's blocks against a
// gateway; centrifuge-js's half of the comparison cannot run here (it needs a Centrifugo server
// and the centrifuge package, which the suite does not install). This is what is checked of
// every block, that one too: it is a module esbuild parses, and what it imports from the package
// exists (esbuild refuses an import the module does not export).
test("every js and jsx block of docs/clients.md and the package README parses as an ES module and imports only what ackgate-client exports", async () => {
  const esbuild = await import("esbuild");
  const here = new URL("..", import.meta.url).pathname;
  const checked = [];
  for (const doc of ["../../docs/clients.md", "README.md"]) {
    const text = readFileSync(join(here, doc), "utf8");
    for (const [, , lang, block] of text.matchAll(/^( *)```(js|jsx)\n([\s\S]*?)^\1```$/gm)) {
      const line = text.slice(0, text.indexOf(block)).split("\n").length;
      await esbuild
        .build({
          stdin: { contents: block, loader: lang, resolveDir: here, sourcefile: `${doc}:${line}` },
          bundle: true,
          write: false,
          format: "esm",
          jsx: "automatic",
          alias: { "ackgate-client": join(here, "ackgate.js"), "ackgate-client/react": join(here, "react.js") },
          external: ["centrifuge"],
          logLevel: "silent",
        })
        .catch((error) => assert.fail(`${doc}, the ${lang} block at line ${line}: ${error.message}`));
      checked.push(`${doc}:${line}`);
    }
  }
  // docs/clients.md: the quickstart, the failed listeners, centrifuge-js, ackgate-client, React.
  assert.equal(checked.filter((c) => c.includes("clients.md")).length, 5, checked.join(", "));
});

test("the minified build (dist/ackgate.min.js and its source map) is the same client", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "ackgate-build-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const { file, map } = await build(join(dir, "ackgate.min.js"));
  assert.ok(existsSync(file) && existsSync(map));
  assert.ok(JSON.parse(readFileSync(map, "utf8")).sources.some((s) => s.endsWith("ackgate.js")));
  // The package's promise (README): under 12 KB minified and gzipped.
  const gzipped = gzipSync(readFileSync(file)).length;
  assert.ok(gzipped < 12_000, `${gzipped} bytes min+gz`);
  const minified = await import(`${new URL(`file://${file}`)}?${Date.now()}`);
  const gateway = fakeGateway();
  const client = new minified.AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0 });
  const connecting = client.connect();
  gateway.socket().welcome();
  await connecting;
  const subscribing = client.subscribe("t");
  gateway.socket().answer("subscribe", { type: "subscribed", topic: "t", partitions: [{ partition: 0, from: 0, epoch: 0 }] });
  await subscribing;
  gateway.socket().send_(event("t", 0));
  const first = (await client.topic("t").next()).value;
  assert.equal(first.offset, 0);
  const ok = client.ack(first.delivery_id, { confirm: true });
  gateway.socket().answer("ack", { type: "ack_ok", committed: { t: { 0: 1 } } });
  assert.deepEqual((await ok).committed, { t: { 0: 1 } });
  assert.throws(() => minified.FINAL_CLOSES.add(1), TypeError);
  assert.equal(minified.version, version);
  assert.ok(readFileSync(file, "utf8").startsWith(`// ackgate-client ${version} `), "the banner names the version");
  client.close();
});

/** Web Locks as a page has them (exclusive, granted in the order asked, `signal` ends a wait), in memory. */
function memoryLocks() {
  const waiting = new Map(); // name -> grants waiting, in order
  const held = new Set();
  const grantNext = (name) => {
    if (held.has(name) || !waiting.get(name)?.length) return;
    held.add(name);
    waiting.get(name).shift()();
  };
  return {
    held, // (for the tests)
    request(name, options, callback = options) {
      return new Promise((resolve, reject) => {
        const grant = async () => {
          try {
            resolve(await callback({ name }));
          } catch (error) {
            reject(error);
          } finally {
            held.delete(name);
            grantNext(name);
          }
        };
        options.signal?.addEventListener("abort", () => {
          const queue = waiting.get(name);
          if (queue?.includes(grant)) {
            queue.splice(queue.indexOf(grant), 1);
            reject(new DOMException("aborted", "AbortError"));
          }
        });
        waiting.set(name, [...(waiting.get(name) || []), grant]);
        queueMicrotask(() => grantNext(name));
      });
    },
  };
}

const until = async (what, check) => {
  for (let i = 0; i < 1000; i++) {
    if (check()) return;
    await tick(2);
  }
  throw new Error(`timed out waiting for ${what}`);
};

test("tabs of one client id share one session: each gets its own topics' events, a follower's requests go through the leader, and the leader's close hands the session on with the tokens", async () => {
  const restore = recommendFake();
  // A page's APIs (the client shares only in a page: Node.js has no document, nor Web Locks).
  globalThis.document = {};
  Object.defineProperty(globalThis, "navigator", { value: { locks: memoryLocks() }, configurable: true });
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, confirmEveryMs: 60_000 };
    const one = new AckgateClient("ws://fake/ws", options);
    const two = new AckgateClient("ws://fake/ws", options);
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    const socket = gateway.socket();
    socket.welcome();
    const welcome = await connecting;
    assert.equal((await two.connect()).session_id, welcome.session_id, "the second tab joins the leader's session");
    assert.deepEqual([gateway.sockets.length, one.state, two.state], [1, "connected", "connected"]);

    const subscribe = async (client, topic) => {
      const subscribed = client.subscribe(topic);
      await until(`the subscribe to ${topic}`, () => socket.last("subscribe")?.topic === topic);
      socket.answer("subscribe", { type: "subscribed", topic, partitions: [{ partition: 0, from: 0, epoch: 0 }] });
      return subscribed;
    };
    await subscribe(one, "a");
    assert.equal((await subscribe(two, "b")).topic, "b");
    const [oneEvents, twoEvents] = [one.events(), two.events()];
    socket.send_(event("a", 0));
    socket.send_(event("b", 0));
    socket.send_(event("a", 1));
    assert.equal((await oneEvents.next()).value.delivery_id, "a.0");
    assert.equal((await oneEvents.next()).value.delivery_id, "a.1", "tab one did not get tab two's b.0");
    assert.equal((await twoEvents.next()).value.delivery_id, "b.0", "each tab gets its own topics' events");

    const acked = two.ack("b.0", { confirm: true });
    await until("the follower's ack on the leader's socket", () => socket.last("ack")?.delivery_id === "b.0");
    socket.answer("ack", { type: "ack_ok", committed: { b: { 0: 1 } } });
    assert.deepEqual((await acked).committed, { b: { 0: 1 } });
    await until("the token in the follower", () => two.resumeToken("b")[0] === 1);
    const published = two.publish("b", { payload: "from two" });
    await until("the follower's publish", () => socket.last("publish"));
    socket.answer("publish", { type: "published", offsets: [{ partition: 0, offset: 1 }] });
    assert.deepEqual((await published).offsets, [{ partition: 0, offset: 1 }]);

    // The leader tab closes: the other takes the lead, connects and resubscribes with its token.
    const states = [];
    two.on("state", (s) => states.push(s));
    one.close();
    await until("the new leader's socket", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("the resubscribe", () => next.last("subscribe"));
    assert.deepEqual(next.last("subscribe"), { op: "subscribe", topic: "b", resume: { 0: 1 }, epochs: {}, req: next.last("subscribe").req });
    next.answer("subscribe", { type: "subscribed", topic: "b", partitions: [{ partition: 0, from: 1, epoch: 0 }] });
    next.send_(event("b", 1));
    assert.equal((await twoEvents.next()).value.offset, 1);
    assert.deepEqual(states, ["reconnecting", "connected"]);
    assert.equal(next.sent.filter((f) => f.op === "subscribe").length, 1, "only the topics a tab still wants");
    two.close();
    assert.equal(two.state, "closed");
  } finally {
    restore();
    delete globalThis.document;
    delete globalThis.navigator;
  }
});

// ---- Review findings (issue 42 follow-up): each test below failed on the client before its fix.

/** A page's APIs for tabs (document, Web Locks; Node has BroadcastChannel); returns the undo. */
function inPage(locks = memoryLocks()) {
  globalThis.document = {};
  Object.defineProperty(globalThis, "navigator", { value: { locks }, configurable: true });
  return () => {
    delete globalThis.document;
    delete globalThis.navigator;
  };
}

/** A `storage` as a page has it (sessionStorage), in memory. */
function memoryStorage(items = {}) {
  const map = new Map(Object.entries(items));
  return { getItem: (k) => map.get(k) ?? null, setItem: (k, v) => map.set(k, String(v)) };
}

/** Settles within `ms`: the value or the error's code, else "pending". */
const settled = (promise, ms = 30) =>
  Promise.race([
    promise.then(
      (value) => ({ value }),
      (error) => ({ code: error.code ?? error.message }),
    ),
    tick(ms).then(() => "pending"),
  ]);

/** Answers the last subscribe of `topic` on `socket`. */
const answerSubscribe = (socket, topic, frame = { type: "subscribed", topic, partitions: [{ partition: 0, from: 0, epoch: 0 }] }) =>
  socket.send_({ ...frame, req: socket.sent.findLast((f) => f.op === "subscribe" && f.topic === topic).req });

test("close() during a reconnect's recommend request stops it: no session comes back", async () => {
  const real = globalThis.fetch;
  let answer;
  globalThis.fetch = () => new Promise((resolve) => (answer = resolve));
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1 });
    socket.cut(1006);
    await until("the recommend request", () => answer);
    client.close();
    answer(new Response(JSON.stringify({ instance: "fake", ws_url: "ws://fake/ws", http_url: "http://fake" })));
    await tick(20);
    assert.equal(gateway.sockets.length, 1, "no socket opened after close()");
    assert.equal(client.state, "closed");
  } finally {
    globalThis.fetch = real;
  }
});

test("close() while the first connect() waits for tokenProvider: connect() rejects with closed and no socket opens", async () => {
  const gateway = fakeGateway();
  let give;
  const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, connectTimeoutMs: 200, tokenProvider: () => new Promise((r) => (give = r)) });
  const connecting = client.connect();
  connecting.catch(() => {});
  await tick();
  client.close();
  give("jwt");
  await tick(5);
  assert.equal(gateway.sockets.length, 0, "no socket opened after close()");
  await assert.rejects(connecting, (e) => e.code === "closed");
});

test("close() while reconnecting rejects the publishes waiting for the connection", async () => {
  const restore = recommendFake();
  try {
    const { client, socket } = await connected({ backoffMs: 20_000, maxBackoffMs: 20_000 });
    socket.cut(1006);
    assert.equal(client.state, "reconnecting");
    const waiting = client.publish("t", { payload: 1 });
    client.close();
    assert.deepEqual(await settled(waiting), { code: "closed" });
  } finally {
    restore();
  }
});

test("tabs: a follower's publish in flight when the leader leaves is not rejected by the old leader: the next leader sends it under the same key", async () => {
  const restore = recommendFake();
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs3", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1 };
    const [one, two] = [new AckgateClient("ws://fake/ws", options), new AckgateClient("ws://fake/ws", options)];
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await two.connect();
    const published = two.publish("t", { payload: "from two" });
    published.catch(() => {});
    const first = gateway.sockets[0];
    await until("the follower's publish on the leader's socket", () => first.last("publish"));
    one.close();
    await until("the new leader's socket", () => gateway.sockets.length === 2);
    gateway.socket().welcome();
    await until("the publish sent again", () => gateway.socket().last("publish"));
    assert.equal(gateway.socket().last("publish").idempotency_key, first.last("publish").idempotency_key);
    gateway.socket().answer("publish", { type: "published", offsets: [{ partition: 0, offset: 0 }] });
    assert.deepEqual(await settled(published), { value: { type: "published", offsets: [{ partition: 0, offset: 0 }], req: gateway.socket().last("publish").req } });
    two.close();
  } finally {
    restore();
    leave();
  }
});

test("unsubscribe() while its subscribe's answer is pending: the topic is not subscribed again at the reconnect", async () => {
  const restore = recommendFake();
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1 }, ["a"]);
    const subscribing = client.subscribe("t");
    const unsubscribing = client.unsubscribe("t");
    answerSubscribe(socket, "t");
    socket.answer("unsubscribe", { type: "unsubscribed", topic: "t" });
    await subscribing;
    await unsubscribing;
    socket.cut(1006);
    await until("the next socket", () => gateway.sockets.length === 2);
    gateway.socket().welcome();
    await until("the resubscribe", () => gateway.socket().last("subscribe"));
    answerSubscribe(gateway.socket(), "a");
    await tick(5);
    assert.deepEqual(gateway.socket().sent.filter((f) => f.op === "subscribe").map((f) => f.topic), ["a"]);
    client.close();
  } finally {
    restore();
  }
});

test("tabs: the leader unsubscribes a topic whose events come though no tab wants it (nobody would ack them)", async () => {
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const one = new AckgateClient("ws://fake/ws", { clientId: "tabs4", WebSocket: gateway.WebSocket, heartbeatMs: 0 });
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    // (A subscribe answered after its requestTimeoutMs, say: the gateway sends its events.)
    gateway.socket().send_(event("zz", 0));
    gateway.socket().send_(event("zz", 1));
    await until("the unsubscribe", () => gateway.socket().last("unsubscribe"));
    assert.equal(gateway.socket().sent.filter((f) => f.op === "unsubscribe" && f.topic === "zz").length, 1);
    one.close();
  } finally {
    leave();
  }
});

test("a publish frame too large for the gateway (close 1009) rejects with limit_exceeded and is not sent again; a smaller one in flight is", async () => {
  const restore = recommendFake();
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1 });
    const big = client.publish("t", { payload: "x".repeat(5000) });
    const small = client.publish("t", { payload: 1 });
    await tick();
    const smallKey = socket.last("publish").idempotency_key;
    socket.cut(1009, "frame too large");
    const outcome = await settled(big);
    assert.equal(outcome.code, "limit_exceeded");
    await until("the next socket", () => gateway.sockets.length === 2);
    gateway.socket().welcome();
    await tick();
    assert.deepEqual(gateway.socket().sent.filter((f) => f.op === "publish").map((f) => f.idempotency_key), [smallKey]);
    gateway.socket().answer("publish", { type: "published", offsets: [{ partition: 0, offset: 0 }] });
    assert.ok((await small).offsets);
    client.close();
  } finally {
    restore();
  }
});

test("back online during a reconnect's backoff: the client reconnects at once", async () => {
  const restore = recommendFake();
  const target = new EventTarget();
  globalThis.addEventListener = target.addEventListener.bind(target);
  globalThis.removeEventListener = target.removeEventListener.bind(target);
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 20_000, maxBackoffMs: 20_000 });
    socket.cut(1006);
    await tick(10);
    assert.equal(gateway.sockets.length, 1, "waiting its backoff");
    target.dispatchEvent(new Event("online"));
    await until("a reconnect right away", () => gateway.sockets.length === 2);
    client.close();
  } finally {
    delete globalThis.addEventListener;
    delete globalThis.removeEventListener;
    restore();
  }
});

test("tabs: resume tokens never move back: a follower keeps its newer token, and the leader learns it from the follower's hello", async () => {
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs7", WebSocket: gateway.WebSocket, heartbeatMs: 0 };
    const one = new AckgateClient("ws://fake/ws", { ...options, storage: memoryStorage() });
    const two = new AckgateClient("ws://fake/ws", { ...options, storage: memoryStorage({ "ackgate:tabs7:resume": '{"b":{"0":7}}' }) });
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await two.connect();
    await tick(5);
    assert.deepEqual(two.resumeToken("b"), { 0: 7 }, "the follower kept its token");
    await until("the leader's token", () => one.resumeToken("b")[0] === 7);
    one.close();
    two.close();
  } finally {
    leave();
  }
});

test("nack, extend and term while the reconnect's socket is still connecting do not throw", async () => {
  const restore = recommendFake();
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1 }, ["t"]);
    socket.cut(1006);
    await until("the next socket", () => gateway.sockets.length === 2);
    assert.equal(gateway.socket().readyState, 0, "connecting");
    assert.doesNotThrow(() => client.nack("x.1"));
    assert.doesNotThrow(() => client.extend("x.1"));
    assert.doesNotThrow(() => client.term("x.1", "bad"));
    client.close();
  } finally {
    restore();
  }
});

test("an onSubscriptionDropped that throws does not end the session: the other topics are subscribed again", async () => {
  const restore = recommendFake();
  const thrown = [];
  globalThis.reportError = (error) => thrown.push(error.message);
  try {
    const onSubscriptionDropped = () => {
      throw new Error("app bug");
    };
    const { client, gateway, socket } = await connected({ backoffMs: 1, onSubscriptionDropped }, ["a", "b"]);
    socket.cut(1006);
    await until("the next socket", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("the resubscribe of a", () => next.last("subscribe"));
    answerSubscribe(next, "a", { type: "error", code: "unknown_topic", message: "gone" });
    for (let i = 0; i < 20 && next.last("subscribe").topic !== "b"; i++) await tick(2);
    assert.equal(next.last("subscribe").topic, "b", "b is subscribed on the same socket");
    assert.equal(next.closedWith, undefined);
    assert.deepEqual(thrown, ["app bug"]);
    client.close();
  } finally {
    delete globalThis.reportError;
    restore();
  }
});

test("tabs: publish() before connect() waits for the session, as on a session of one's own", async () => {
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const one = new AckgateClient("ws://fake/ws", { clientId: "tabs15", WebSocket: gateway.WebSocket, heartbeatMs: 0 });
    const published = one.publish("t", { payload: 1 });
    published.catch(() => {});
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await until("the publish", () => gateway.socket().last("publish"));
    gateway.socket().answer("publish", { type: "published", offsets: [{ partition: 0, offset: 0 }] });
    assert.deepEqual((await published).offsets, [{ partition: 0, offset: 0 }]);
    one.close();
  } finally {
    leave();
  }
});

test("an app's resume token without epochs is sent without the epochs the client knows (it counts as the oldest)", async () => {
  const { client, socket } = await connected();
  const first = client.subscribe("t");
  answerSubscribe(socket, "t", { type: "subscribed", topic: "t", partitions: [{ partition: 0, from: 3, epoch: 2 }] });
  await first;
  const again = client.subscribe("t", { resume: { 0: 5 } });
  assert.deepEqual(socket.last("subscribe").resume, { 0: 5 });
  assert.equal(socket.last("subscribe").epochs?.[0], undefined);
  answerSubscribe(socket, "t");
  await again;
  client.close();
});

test("acks, nacks and terms of events delivered in an earlier session are not sent on the new one (an id names a delivery of one instance only)", async () => {
  const restore = recommendFake();
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1 }, ["t"]);
    for (const offset of [0, 1, 2, 3]) socket.send_(event("t", offset));
    socket.cut(1006);
    await until("the next socket", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("the resubscribe", () => next.last("subscribe"));
    answerSubscribe(next, "t");
    client.ack("t.0");
    client.nack("t.1");
    client.term("t.2");
    client.extend("t.3");
    await client.ack("other.9"); // an id this client never held is sent as it is
    assert.deepEqual(next.sent.filter((f) => f.op !== "subscribe").map((f) => `${f.op} ${f.delivery_id}`), ["ack other.9"]);
    client.close();
  } finally {
    restore();
  }
});

test("where there is no reportError (Node.js), a listener that throws is reported on the console, not thrown again", async () => {
  const { client, socket } = await connected({}, ["t"]);
  const saved = console.error;
  const logged = [];
  console.error = (...args) => logged.push(args.map(String).join(" "));
  try {
    assert.equal(globalThis.reportError, undefined);
    client.on("event", () => {
      throw new Error("app bug");
    });
    socket.send_(event("t", 0));
    await tick(5);
    assert.ok(logged.some((line) => line.includes("app bug")), logged.join("\n"));
  } finally {
    console.error = saved;
    client.close();
  }
});

test("tabs: a topic another tab wants, refused by a passing error at a new leader, is subscribed again after a backoff", async () => {
  const restore = recommendFake();
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs14", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, maxBackoffMs: 5 };
    const [one, two, three] = [0, 1, 2].map(() => new AckgateClient("ws://fake/ws", options));
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    const first = gateway.socket();
    first.welcome();
    await connecting;
    await two.connect();
    await three.connect();
    for (const [client, topic] of [[two, "a"], [three, "c"]]) {
      const subscribed = client.subscribe(topic);
      await until(`the subscribe to ${topic}`, () => first.last("subscribe")?.topic === topic);
      answerSubscribe(first, topic);
      await subscribed;
    }
    one.close();
    await until("the new leader's socket", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("the subscribe to c", () => next.sent.some((f) => f.op === "subscribe" && f.topic === "c"));
    answerSubscribe(next, "c", { type: "error", code: "unavailable", message: "backend down" });
    await until("c subscribed again", () => next.sent.filter((f) => f.op === "subscribe" && f.topic === "c").length === 2);
    two.close();
    three.close();
  } finally {
    restore();
    leave();
  }
});

test("tabs: a follower's publishes waiting for a leader are bounded by maxQueuedPublishes", async () => {
  const restore = recommendFake();
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs16", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, maxQueuedPublishes: 1 };
    const [one, two] = [new AckgateClient("ws://fake/ws", options), new AckgateClient("ws://fake/ws", options)];
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await two.connect();
    one.close();
    await until("the leader's bye", () => two.state === "reconnecting");
    const first = two.publish("t", { payload: 1 });
    first.catch(() => {});
    assert.deepEqual(await settled(two.publish("t", { payload: 2 })), { code: "limit_exceeded" });
    two.close();
  } finally {
    restore();
    leave();
  }
});

test("tabs: where Web Locks refuse (an opaque origin, a sandboxed frame), the client falls back to a session of its own", async () => {
  const leave = inPage({ request: () => Promise.reject(new DOMException("denied", "SecurityError")) });
  try {
    const gateway = fakeGateway();
    const client = new AckgateClient("ws://fake/ws", { clientId: "tabs17", WebSocket: gateway.WebSocket, heartbeatMs: 0 });
    const connecting = client.connect();
    connecting.catch(() => {});
    await until("a socket of its own", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    assert.equal((await connecting).session_id, "s1");
    client.close();
  } finally {
    leave();
  }
});

test("heartbeatTimeoutMs: 0 means no limit: an unanswered heartbeat does not abandon the connection", async () => {
  const { client, socket } = await connected({ heartbeatMs: 10, heartbeatTimeoutMs: 0 });
  await until("a heartbeat ping", () => socket.last("ping"));
  await tick(30);
  assert.equal(socket.closedWith, undefined);
  assert.equal(client.state, "connected");
  client.close();
});

test("return() on an events() iterator ends its pending next()", async () => {
  const { client } = await connected({}, ["t"]);
  const stream = client.events();
  const waiting = stream.next();
  await stream.return();
  assert.deepEqual(await settled(waiting), { value: { value: undefined, done: true } });
  client.close();
});

// ---- Issue 61, items 2 and 6: each test below failed on the client before its change.

test("subscribe() before connect() waits for the session and goes out after its welcome; it settles with the gateway's answer, and unsubscribe() drops it unsent", async () => {
  const gateway = fakeGateway();
  const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0 });
  const stream = client.events();
  const subscribed = client.subscribe("t", { from: "earliest" });
  const refused = client.subscribe("nope");
  const dropped = client.subscribe("gone");
  dropped.catch(() => {}); // (settled below)
  client.unsubscribe("gone").catch(() => {}); // (not connected: there is nothing to tell the gateway)
  assert.equal(await settled(subscribed, 5), "pending");
  assert.equal(client.state, "closed");
  const connecting = client.connect();
  const socket = gateway.socket();
  socket.welcome();
  await connecting;
  await until("the subscribes", () => socket.sent.length === 2);
  assert.deepEqual(socket.sent.map((f) => `${f.op} ${f.topic} ${JSON.stringify(f.from)}`), ['subscribe t "earliest"', "subscribe nope undefined"]);
  answerSubscribe(socket, "t");
  answerSubscribe(socket, "nope", { type: "error", code: "unknown_topic", message: "no such topic" });
  assert.equal((await subscribed).topic, "t");
  assert.deepEqual(await settled(refused), { code: "unknown_topic" });
  assert.deepEqual(await settled(dropped), { code: "closed" });
  socket.send_(event("t", 0));
  assert.equal((await stream.next()).value.delivery_id, "t.0");
  client.close();
});

test("subscribe() while reconnecting goes out once after the next welcome; one cut before its answer goes again; close() rejects one still waiting, and one made after it at once", async () => {
  const restore = recommendFake();
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1, maxBackoffMs: 5 }, ["a"]);
    socket.cut(1006);
    assert.equal(client.state, "reconnecting");
    const b = client.subscribe("b");
    await until("the next socket", () => gateway.sockets.length === 2);
    const second = gateway.socket();
    second.welcome();
    const topics = (s) => s.sent.filter((f) => f.op === "subscribe").map((f) => f.topic).sort();
    await until("both subscribes", () => topics(second).length === 2);
    assert.deepEqual(topics(second), ["a", "b"]);
    // Cut before b's answer: b waits again (no rejection) and goes out on the next session.
    answerSubscribe(second, "a");
    await tick(); // (a close is a task of its own, after the answer's)
    second.cut(1006);
    assert.equal(await settled(b, 5), "pending");
    await until("the third socket", () => gateway.sockets.length === 3);
    const third = gateway.socket();
    third.welcome();
    await until("both subscribes again", () => topics(third).length === 2);
    assert.deepEqual(topics(third), ["a", "b"]);
    answerSubscribe(third, "a");
    answerSubscribe(third, "b");
    assert.equal((await b).topic, "b");
    third.cut(1006);
    const c = client.subscribe("c");
    client.close();
    assert.deepEqual(await settled(c), { code: "closed" });
    assert.deepEqual(await settled(client.subscribe("d")), { code: "closed" });
  } finally {
    restore();
  }
});

test("the first connect() to a gateway that is not up yet is tried again with the reconnect backoff until it answers: connect() resolves with that welcome, and what was subscribed before goes out", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const attempts = [];
    const states = [];
    const options = { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, maxBackoffMs: 5 };
    const client = new AckgateClient("ws://fake/ws", { ...options, onReconnect: (r) => attempts.push(r), onState: (s) => states.push(s) });
    const subscribed = client.subscribe("t");
    const connecting = client.connect();
    // The gateway is down: each attempt fails before a welcome.
    for (let n = 1; n <= 3; n++) {
      await until(`attempt ${n}`, () => gateway.sockets.length === n);
      gateway.socket().cut(1006);
    }
    await until("attempt 4", () => gateway.sockets.length === 4);
    assert.equal(await settled(connecting, 5), "pending", "connect() waits meanwhile");
    assert.equal(client.state, "connecting");
    assert.equal(attempts.filter((a) => a.error).length, 2, "the retries are reported as reconnects are");
    gateway.socket().welcome();
    assert.equal((await connecting).session_id, "s4");
    assert.deepEqual(states, ["connecting", "connected"]);
    await until("the subscribe", () => gateway.socket().last("subscribe"));
    answerSubscribe(gateway.socket(), "t");
    assert.equal((await subscribed).topic, "t");
    client.close();
  } finally {
    restore();
  }
});

test("a first connect() being tried again rejects when the gateway refuses the credentials (a final close) and at close(); with reconnect: false at the first failure", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, maxBackoffMs: 5 };
    const refused = new AckgateClient("ws://fake/ws", options);
    const waiting = refused.subscribe("t");
    const first = refused.connect();
    await until("attempt 1", () => gateway.sockets.length === 1);
    gateway.socket().cut(1006);
    await until("attempt 2", () => gateway.sockets.length === 2);
    // The gateway is up now but refuses the token: it says why, then closes with 1008.
    gateway.socket().readyState = 1;
    gateway.socket().send_({ type: "error", code: "unauthorized", message: "bad token" });
    gateway.socket().cut(1008);
    assert.deepEqual(await settled(first), { code: "unauthorized" });
    assert.deepEqual(await settled(waiting), { code: "closed" });
    assert.equal(refused.state, "failed");
    await tick(20);
    assert.equal(gateway.sockets.length, 2, "no attempt after a final close");

    const closing = new AckgateClient("ws://fake/ws", { ...options, backoffMs: 200, maxBackoffMs: 200 });
    const second = closing.connect();
    await until("attempt 1", () => gateway.sockets.length === 3);
    gateway.socket().cut(1006);
    await tick(5); // waiting out the backoff
    closing.close();
    assert.deepEqual(await settled(second), { code: "closed" });
    assert.equal(closing.state, "closed");
    await tick(250);
    assert.equal(gateway.sockets.length, 3, "no attempt after close()");

    const once = new AckgateClient("ws://fake/ws", { ...options, reconnect: false });
    const third = once.connect();
    await until("attempt 1", () => gateway.sockets.length === 4);
    gateway.socket().cut(1006);
    assert.deepEqual(await settled(third), { code: "closed" });
    await tick(20);
    assert.equal(gateway.sockets.length, 4, "reconnect: false: one attempt");
  } finally {
    restore();
  }
});

test("tabs: subscribe() before connect() waits for the tabs to join and goes out once on the shared session", async () => {
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const one = new AckgateClient("ws://fake/ws", { clientId: "tabs18", WebSocket: gateway.WebSocket, heartbeatMs: 0 });
    const subscribed = one.subscribe("t");
    assert.equal(await settled(subscribed, 5), "pending");
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await until("the subscribe", () => gateway.socket().last("subscribe"));
    answerSubscribe(gateway.socket(), "t");
    assert.equal((await subscribed).topic, "t");
    await tick(5);
    assert.equal(gateway.socket().sent.filter((f) => f.op === "subscribe").length, 1);
    one.close();
  } finally {
    leave();
  }
});

test("tabs: a follower's subscribe() while no tab leads waits for the next leader, which subscribes it once", async () => {
  const restore = recommendFake();
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs19", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1 };
    const [one, two] = [new AckgateClient("ws://fake/ws", options), new AckgateClient("ws://fake/ws", options)];
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await two.connect();
    one.close();
    await until("the leader's bye", () => two.state === "reconnecting");
    const subscribed = two.subscribe("t");
    await until("the new leader's socket", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("the subscribe", () => next.last("subscribe"));
    answerSubscribe(next, "t");
    assert.equal((await subscribed).topic, "t");
    await tick(5);
    assert.equal(next.sent.filter((f) => f.op === "subscribe").length, 1);
    two.close();
  } finally {
    restore();
    leave();
  }
});

/** Runs `check` with `globalThis.localStorage` set to `storage` (undefined: none), then puts it back. */
async function withLocalStorage(storage, check) {
  const saved = Object.getOwnPropertyDescriptor(globalThis, "localStorage");
  Object.defineProperty(globalThis, "localStorage", { value: storage, configurable: true, writable: true });
  try {
    await check();
  } finally {
    delete globalThis.localStorage;
    if (saved) Object.defineProperty(globalThis, "localStorage", saved);
  }
}

test("deviceClientId: one random id per device, kept in localStorage under ackgate:device-id, else in memory; a prefix keeps users apart; an id that breaks the client id rule throws, here and in the constructor", async () => {
  // A fresh copy of the module, as a new page load (or process) has.
  const load = async () => (await import(`../ackgate.js?load=${Math.random()}`)).deviceClientId;
  await withLocalStorage(undefined, async () => {
    const deviceClientId = await load();
    const id = deviceClientId();
    assert.match(id, /^[A-Za-z0-9._:@-]{1,128}$/);
    assert.equal(deviceClientId(), id, "the same id while the process lives");
    assert.equal(deviceClientId("alice:"), `alice:${id}`);
    assert.notEqual((await load())(), id, "not kept across loads");
    assert.equal(deviceClientId("x".repeat(128 - id.length)).length, 128);
    assert.throws(() => deviceClientId("x".repeat(129 - id.length)), TypeError);
    assert.throws(() => deviceClientId("a b"), (e) => e instanceof TypeError && e.message.includes("^[A-Za-z0-9._:@-]{1,128}$"));
    assert.ok(new AckgateClient("ws://fake/ws", { clientId: id, WebSocket: fakeGateway().WebSocket }));
    // An id the gateway would refuse at the handshake (which a page sees as an outage, tried
    // again for ever) is refused by the constructor.
    assert.throws(() => new AckgateClient("ws://fake/ws", { clientId: "a b", WebSocket: fakeGateway().WebSocket }), (e) => e instanceof TypeError && /client id rule/.test(e.message));
  });
  const storage = memoryStorage();
  let kept;
  await withLocalStorage(storage, async () => {
    const id = (kept = (await load())("u:"));
    assert.equal(id, `u:${storage.getItem("ackgate:device-id")}`);
    assert.equal((await load())("u:"), id, "the next page load has the same id");
    assert.equal((await load())("v:"), `v:${id.slice(2)}`);
  });
  await withLocalStorage(memoryStorage({ "ackgate:device-id": "bad id!" }), async () => {
    assert.match((await load())(), /^[0-9a-f]{32}$/, "a kept value that is no id is replaced");
  });
  // A cleared storage: a new id (a new client, with its own start point).
  await withLocalStorage(memoryStorage(), async () => {
    assert.notEqual((await load())("u:"), kept);
  });
  // A storage the page may not use (a sandboxed frame): an id in memory all the same.
  const denied = () => {
    throw new DOMException("denied", "SecurityError");
  };
  await withLocalStorage({ getItem: denied, setItem: denied }, async () => {
    const deviceClientId = await load();
    assert.equal(deviceClientId(), deviceClientId());
  });
});

// ---- Issue 61 item 4 (client side): a refusal for good was the state "closed", as after close():
// a page could not tell a bad token from its own close() without reading close codes. Each test
// below failed on the client before the state "failed".

/** An EventSource as the client uses it (named events with `data`), played by the test. */
function fakeEventSources() {
  const sources = [];
  class FakeEventSource {
    readyState = 0;
    listeners = {};
    constructor(url) {
      this.url = url;
      sources.push(this);
    }
    addEventListener(name, listener) {
      this.listeners[name] = listener;
    }
    close() {
      this.readyState = 2;
    }
    /** The gateway writes `event: <name>` with the frame as its data. */
    emit(name, frame) {
      this.listeners[name]({ data: JSON.stringify(frame), lastEventId: "" });
    }
  }
  return { EventSource: FakeEventSource, sources };
}

test("credentials refused for good: state failed, client.failure, a failed event (onFailed and on); no reconnect follows, and connect() starts over; taken over (4001) fails too", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const seen = [];
    const failures = [];
    const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1, onFailed: (f) => failures.push(["option", f]) });
    client.on("failed", (f) => failures.push(["on", f, client.state]));
    client.on("state", (s) => seen.push(s));
    client.on("close", (c) => seen.push(`close ${c.code} ${c.final}`));
    const stream = client.events();
    const connecting = client.connect();
    // The gateway accepts the upgrade, says why in an error frame, and closes with 1008.
    gateway.socket().readyState = 1;
    gateway.socket().send_({ type: "error", code: "unauthorized", message: "bad token" });
    gateway.socket().cut(1008);
    await assert.rejects(connecting, (e) => e instanceof AckgateError && e.code === "unauthorized");
    const failure = { code: "unauthorized", message: "bad token", closeCode: 1008 };
    assert.equal(client.state, "failed");
    assert.deepEqual(client.failure, failure);
    assert.deepEqual(failures, [["option", failure], ["on", failure, "failed"]]);
    assert.deepEqual(seen, ["connecting", "failed", "close 1008 true"], "failed stays: the final close's closed does not replace it");
    assert.deepEqual(await stream.next(), { value: undefined, done: true }, "events() ended");
    await tick(20);
    assert.equal(gateway.sockets.length, 1, "no reconnect after a failure");
    // connect() starts over: the state leaves failed, and the failure goes with it.
    const again = client.connect();
    assert.deepEqual([client.state, client.failure], ["connecting", null]);
    gateway.socket().welcome();
    await again;
    assert.equal(client.state, "connected");
    // Taken over by a newer session of this client id: failed as well, its code from the close.
    gateway.socket().cut(4001, "taken over by a newer session");
    assert.deepEqual([client.state, client.failure], ["failed", { code: "taken_over", message: "taken over by a newer session", closeCode: 4001 }]);
    await tick(20);
    assert.equal(gateway.sockets.length, 2, "no reconnect after a takeover");
    // close() of a failed client: closed, without a failure.
    client.close();
    assert.deepEqual([client.state, client.failure], ["closed", null]);
    assert.deepEqual(seen.slice(3), ["connecting", "connected", "failed", "close 4001 true", "closed"]);
  } finally {
    restore();
  }
});

// docs/clients.md's `failed` listener signs in and calls connect() again at once. The first
// connect() then went on trying beside it (its run saw the state "connecting" the listener set)
// and opened a second session, which took the listener's over.
test("a failed listener that calls connect() at once: the first connect() rejects with the refusal, and only the listener's run connects", async () => {
  const restore = recommendFake();
  try {
    const gateway = fakeGateway();
    const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1 });
    let again;
    client.on("failed", () => Promise.resolve().then(() => (again = client.connect())));
    const first = client.connect();
    gateway.socket().readyState = 1;
    gateway.socket().send_({ type: "error", code: "unauthorized", message: "bad token" });
    gateway.socket().cut(1008);
    assert.deepEqual(await settled(first), { code: "unauthorized" });
    await until("the listener's connect", () => gateway.sockets.length === 2);
    gateway.socket().welcome();
    assert.equal((await again).session_id, "s2");
    await tick(20);
    assert.equal(gateway.sockets.length, 2, "no other attempt");
    assert.equal(client.state, "connected");
    client.close();
  } finally {
    restore();
  }
});

test("failed is for the gateway's refusals only: close() and a lost connection with reconnect: false are closed, 4002 reconnects; over SSE a refusal fails as on a WebSocket; a 1008 without its error frame is unauthorized", async () => {
  const restore = recommendFake();
  try {
    const states = (client) => {
      const seen = [];
      client.on("state", (s) => seen.push(s));
      return seen;
    };
    // close(): closed, never failed.
    const { client: closing } = await connected();
    const closingStates = states(closing);
    closing.close();
    assert.deepEqual([closingStates, closing.failure], [["closed"], null]);
    // reconnect: false and a lost connection: final, but an outage, not a refusal.
    const { client: once, socket: onceSocket } = await connected({ reconnect: false });
    onceSocket.cut(1006);
    assert.deepEqual([once.state, once.failure], ["closed", null]);
    // 4002, an operator's disconnect: the client reconnects.
    const { client: kicked, gateway, socket } = await connected({ backoffMs: 1 });
    socket.cut(4002, "operator");
    assert.deepEqual([kicked.state, kicked.failure], ["reconnecting", null]);
    await until("the reconnect", () => gateway.sockets.length === 2);
    // A 1008 mid-session, without an error frame: unauthorized (what 1008 means), its reason kept.
    gateway.socket().welcome();
    await until("connected again", () => kicked.state === "connected");
    gateway.socket().cut(1008, "token revoked");
    assert.deepEqual([kicked.state, kicked.failure], ["failed", { code: "unauthorized", message: "token revoked", closeCode: 1008 }]);
    kicked.close();

    // Over SSE: an `event: error` then an `event: close` with 1008.
    const { EventSource, sources } = fakeEventSources();
    const sse = new AckgateClient("ws://fake/ws", { clientId: "unit", transport: "sse", EventSource, heartbeatMs: 0, backoffMs: 1 });
    const connecting = sse.connect();
    await until("the stream", () => sources.length === 1);
    sources[0].emit("error", { type: "error", code: "forbidden", message: "another client's token" });
    sources[0].emit("close", { code: 1008, reason: "" });
    await assert.rejects(connecting, (e) => e.code === "forbidden");
    assert.deepEqual([sse.state, sse.failure], ["failed", { code: "forbidden", message: "another client's token", closeCode: 1008 }]);
    await tick(20);
    assert.equal(sources.length, 1, "no stream after a failure");
  } finally {
    restore();
  }
});

test("tabs: a refusal of the shared session fails every tab, with the leader's failure", async () => {
  const leave = inPage();
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs20", WebSocket: gateway.WebSocket, heartbeatMs: 0 };
    const [one, two] = [new AckgateClient("ws://fake/ws", options), new AckgateClient("ws://fake/ws", options)];
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    gateway.socket().welcome();
    await connecting;
    await two.connect();
    const failed = [];
    two.on("failed", (f) => failed.push(f.code));
    gateway.socket().cut(4001, "taken over");
    const failure = { code: "taken_over", message: "taken over", closeCode: 4001 };
    assert.deepEqual([one.state, one.failure], ["failed", failure]);
    await until("the follower's failure", () => two.state === "failed");
    assert.deepEqual([two.failure, failed], [failure, ["taken_over"]]);
    await tick(120);
    assert.deepEqual([one.state, two.state, gateway.sockets.length], ["failed", "failed", 1], "no tab takes the lead again");
    one.close();
    two.close();
  } finally {
    leave();
  }
});

// ---- Issue 61 item 7, the page's lifecycle: a tab holding a Web Lock (or an open socket) for
// its whole life never entered the back/forward cache, offline went unnoticed until the
// heartbeat, and the heartbeat's timers, late in a throttled or frozen tab, could give up a live
// connection. Each test below failed on the client before.

/** A page's window (an EventTarget) in place of the global addEventListener the client uses in a
 * page; `dispatch(type, fields)` fires an event with those fields (`persisted`, ...). */
function fakeWindow() {
  const target = new EventTarget();
  globalThis.addEventListener = target.addEventListener.bind(target);
  globalThis.removeEventListener = target.removeEventListener.bind(target);
  return {
    dispatch: (type, fields = {}) => target.dispatchEvent(Object.assign(new Event(type), fields)),
    restore: () => {
      delete globalThis.addEventListener;
      delete globalThis.removeEventListener;
    },
  };
}

test("into the back/forward cache (pagehide, persisted) the connection closes and no attempt is made; shown again (pageshow) the client reconnects at once and resumes with the token it holds", async () => {
  const restore = recommendFake();
  const page = fakeWindow();
  try {
    const { client, gateway, socket } = await connected({ backoffMs: 1, maxBackoffMs: 1 }, ["t"]);
    const stream = client.events();
    socket.send_(event("t", 0));
    assert.equal((await stream.next()).value.offset, 0);
    const acked = client.ack("t.0", { confirm: true });
    socket.answer("ack", { type: "ack_ok", committed: { t: { 0: 1 } }, tokens: { t: "token-1" } });
    await acked;
    const states = [];
    client.on("state", (s) => states.push(s));
    page.dispatch("pagehide", { persisted: true });
    assert.equal(socket.closedWith, 4000, "closed at once");
    assert.equal(client.state, "reconnecting");
    await tick(30);
    assert.equal(gateway.sockets.length, 1, "no attempt while the page is in the cache");
    page.dispatch("pageshow", { persisted: true });
    await until("the reconnect", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("the resubscribe", () => next.last("subscribe"));
    assert.equal(next.last("subscribe").resume, "token-1", "resumed with the token it holds");
    answerSubscribe(next, "t");
    next.send_(event("t", 1));
    assert.equal((await stream.next()).value.offset, 1, "the iterators go on");
    assert.deepEqual(states, ["reconnecting", "connected"]);
    // A pagehide that does not go into the cache (the page unloads) and a first pageshow: nothing.
    page.dispatch("pagehide", { persisted: false });
    page.dispatch("pageshow", { persisted: false });
    assert.deepEqual([next.closedWith, client.state], [undefined, "connected"]);
    client.close();
  } finally {
    page.restore();
    restore();
  }
});

test("offline: the connection is given up at once and no attempt is made (nor counted) until online, which reconnects at once", async () => {
  const restore = recommendFake();
  const page = fakeWindow();
  const navigator = { onLine: true };
  Object.defineProperty(globalThis, "navigator", { value: navigator, configurable: true });
  try {
    const attempts = [];
    const { client, gateway, socket } = await connected({ backoffMs: 1, maxBackoffMs: 1, onReconnect: (r) => attempts.push(r) });
    navigator.onLine = false;
    page.dispatch("offline");
    assert.deepEqual([socket.closedWith, client.state], [4000, "reconnecting"]);
    await tick(30);
    assert.deepEqual([gateway.sockets.length, attempts.length], [1, 0], "no attempt while offline");
    navigator.onLine = true;
    page.dispatch("online");
    await until("the reconnect", () => gateway.sockets.length === 2);
    assert.equal(attempts[0].attempt, 1);
    gateway.socket().welcome();
    await until("connected", () => client.state === "connected");
    client.close();
  } finally {
    delete globalThis.navigator;
    page.restore();
    restore();
  }
});

test("tabs: a leader going into the back/forward cache leaves the tabs at once (its locks go: another tab leads without waiting); shown again, it joins the tabs again and gets its topic back", async () => {
  const restore = recommendFake();
  const locks = memoryLocks();
  const leave = inPage(locks);
  const pages = [];
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs21", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1 };
    const [one, two] = [new AckgateClient("ws://fake/ws", options), new AckgateClient("ws://fake/ws", options)];
    // Each tab its own window (connect() starts listening to it).
    pages.push(fakeWindow());
    const connecting = one.connect();
    await until("the leader's socket", () => gateway.sockets.length === 1);
    const first = gateway.socket();
    first.welcome();
    await connecting;
    pages.push(fakeWindow());
    await two.connect();
    for (const [client, topic] of [[one, "a"], [two, "b"]]) {
      const subscribed = client.subscribe(topic);
      await until(`the subscribe to ${topic}`, () => first.last("subscribe")?.topic === topic);
      answerSubscribe(first, topic);
      await subscribed;
    }
    assert.equal(locks.held.size, 3, "the lead and each tab's own");
    pages[0].dispatch("pagehide", { persisted: true });
    assert.equal(first.closedWith, 1000, "the leader's session closed");
    assert.equal(one.state, "reconnecting");
    // The locks went at once, not after a timer (a frozen page runs none): the other tab leads,
    // and holds its own lock; tab one holds none.
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(locks.held.size, 2, "tab one's locks went at once");
    await until("the other tab's socket", () => gateway.sockets.length === 2);
    const next = gateway.socket();
    next.welcome();
    await until("b subscribed again", () => next.last("subscribe")?.topic === "b");
    answerSubscribe(next, "b");
    pages[0].dispatch("pageshow", { persisted: true });
    await until("a subscribed for the tab back from the cache", () => next.last("subscribe")?.topic === "a");
    answerSubscribe(next, "a");
    await until("connected", () => one.state === "connected");
    next.send_(event("a", 5));
    assert.equal((await one.events().next()).value.offset, 5);
    assert.equal(gateway.sockets.length, 2);
    one.close();
    two.close();
  } finally {
    for (const page of pages) page.restore();
    leave();
    restore();
  }
});

test("tabs: a client whose connect() failed stays closed through a pagehide and a pageshow (its page listeners stay, but there is nothing to leave or join again)", async () => {
  const restore = recommendFake();
  const leave = inPage();
  const pages = [];
  try {
    const gateway = fakeGateway();
    const options = { clientId: "tabs22", WebSocket: gateway.WebSocket, heartbeatMs: 0, backoffMs: 1 };
    // The leader never gets its welcome; the other tab gives up waiting for it (reconnect: false).
    const one = new AckgateClient("ws://fake/ws", options);
    pages.push(fakeWindow());
    one.connect().catch(() => {});
    await until("the leader's socket", () => gateway.sockets.length === 1);
    const two = new AckgateClient("ws://fake/ws", { ...options, reconnect: false, connectTimeoutMs: 20 });
    pages.push(fakeWindow());
    await assert.rejects(two.connect(), (e) => e.code === "timeout");
    assert.equal(two.state, "closed");
    const states = [];
    two.on("state", (state) => states.push(state));
    pages[1].dispatch("pagehide", { persisted: true });
    pages[1].dispatch("pageshow", { persisted: true });
    await tick(50);
    assert.deepEqual([two.state, states], ["closed", []], "not revived");
    one.close();
  } finally {
    for (const page of pages) page.restore();
    leave();
    restore();
  }
});

test("heartbeat: any frame answers its ping; a check whose timer ran late (a throttled or frozen tab) waits one more period for the frames queued meanwhile; a silent connection is still given up", async () => {
  const restore = recommendFake();
  const page = fakeWindow();
  // The page frozen (or its timers held back) for `ms`: nothing runs meanwhile.
  const freeze = (ms) => {
    const end = Date.now() + ms;
    while (Date.now() < end);
  };
  try {
    const closes = [];
    const { client, gateway, socket } = await connected({ heartbeatTimeoutMs: 100, backoffMs: 1, onClose: (c) => closes.push(c) });
    // (Back online checks the connection at once: a ping.)
    page.dispatch("online");
    assert.equal(socket.sent.filter((f) => f.op === "ping").length, 1);
    // An event comes, the pong does not (it waits behind the events): the connection is alive.
    socket.send_(event("t", 0));
    await tick(200);
    assert.deepEqual(closes, []);
    // The page is frozen 300 ms; the pong came meanwhile and waits behind the check's timer.
    page.dispatch("online");
    setTimeout(() => socket.send_({ type: "pong" }), 150);
    freeze(300);
    await tick(200);
    assert.deepEqual(closes, [], "a live connection is kept");
    // Frozen again, and nothing comes: given up one period after the late check.
    page.dispatch("online");
    freeze(300);
    await until("the verdict", () => closes.length === 1);
    assert.deepEqual(closes[0], { code: 1006, reason: "no pong within 100 ms (heartbeatTimeoutMs)", final: false });
    assert.equal(socket.closedWith, 4000);
    await until("the reconnect", () => gateway.sockets.length === 2);
    client.close();
  } finally {
    page.restore();
    restore();
  }
});

// ---- Issue 61 item 8, the package: no changelog, no version a program could read, and no way to
// see what the client sends and receives. Each test below failed on the client before.

test("the version: the module's `version` export, package.json's, ackgate.js's header and CHANGELOG.md's newest entry agree, and the changelog ships", () => {
  const read = (path) => readFileSync(new URL(path, import.meta.url), "utf8");
  const pkg = JSON.parse(read("../package.json"));
  assert.equal(version, pkg.version);
  assert.ok(read("../ackgate.js").startsWith(`// ackgate-client ${pkg.version}: `), "the header of ackgate.js");
  assert.equal(read("../CHANGELOG.md").match(/^## (\S+)/m)?.[1], pkg.version, "CHANGELOG.md's newest entry");
  assert.ok(pkg.files.includes("CHANGELOG.md"), "in the package's files");
  assert.equal(JSON.parse(read("../package-lock.json")).version, pkg.version, "package-lock.json");
});

test("debug: a function gets what the session reports (frames received, states, closes) and each frame sent; true logs them on console.debug; off, nothing is logged", async () => {
  const lines = [];
  const name = (data) => data.type ?? data.op ?? data.code ?? data;
  const { client, socket } = await connected({ debug: (what, data) => lines.push(`${what} ${name(data)}`) });
  const pong = client.ping();
  socket.answer("ping", { type: "pong" });
  await pong;
  client.close();
  await tick(5);
  assert.deepEqual(lines, ["state connecting", "frame welcome", "state connected", "send ping", "frame pong", "state closed", "close 1000"]);

  const saved = console.debug;
  const logged = [];
  console.debug = (...args) => logged.push(args);
  try {
    const on = await connected({ debug: true });
    assert.deepEqual(logged.slice(0, 2).map(([prefix, what, data]) => [prefix, what, name(data)]), [["ackgate", "state", "connecting"], ["ackgate", "frame", "welcome"]]);
    on.client.close();
    await tick(5); // (its close comes from the socket)
    logged.length = 0;
    const off = await connected();
    const ping = off.client.ping();
    off.socket.answer("ping", { type: "pong" });
    await ping;
    off.client.close();
    await tick(5);
    assert.deepEqual(logged, [], "off by default");
  } finally {
    console.debug = saved;
  }
});
