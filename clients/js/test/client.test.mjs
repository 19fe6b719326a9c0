// ackgate-client against real gateways: ACKGATE_DEV_A and ACKGATE_DEV_B are the http base URLs of two
// running instances (tests/api/js_client.rs starts them, each with its own embedded log; B names
// A in cluster.peers, and the last test drains B). ACKGATE_DEV_C is a third one that checks JWTs
// signed with ACKGATE_DEV_C_SECRET and warns 2 s before a token expires (`refresh_needed`). The tests named "over SSE" run the client with
// `transport: "sse"` on FetchEventSource below (Node has no EventSource).
//
//   ACKGATE_DEV_A=http://127.0.0.1:8080 ACKGATE_DEV_B=http://127.0.0.1:8081 node --experimental-websocket --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, connect as tcpConnect } from "node:net";

import * as ackgate from "../ackgate.js";
import { AckgateClient, AckgateError } from "../ackgate.js";

const A = process.env.ACKGATE_DEV_A;
const B = process.env.ACKGATE_DEV_B;
if (!A || !B) throw new Error("set ACKGATE_DEV_A and ACKGATE_DEV_B to two gateways' http base URLs");
const ws = (base) => `${base.replace(/^http/, "ws")}/ws`;
const C = process.env.ACKGATE_DEV_C;
const C_SECRET = process.env.ACKGATE_DEV_C_SECRET;

/** An HS256 JWT with `claims`, signed with gateway C's secret. */
function jwt(claims) {
  const part = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
  const unsigned = `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}`;
  return `${unsigned}.${createHmac("sha256", C_SECRET).update(unsigned).digest("base64url")}`;
}

async function call(method, url, body) {
  const response = await fetch(url, { method, headers: { "Content-Type": "application/json" }, body: body && JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) throw new Error(`${method} ${url}: ${response.status} ${JSON.stringify(answer)}`);
  return answer;
}

/** Creates `topic` (one partition) on `base` and publishes `n` numbered events. */
async function topicWith(base, topic, n) {
  await call("POST", `${base}/topics`, { name: topic, partitions: 1 });
  const events = Array.from({ length: n }, (_, i) => ({ partition: 0, payload: { n: i } }));
  if (n > 0) await call("POST", `${base}/topics/${topic}/events`, { events });
}

/** The next `n` events of a client's `events()` stream (one stream per client, kept open). */
async function take(stream, n) {
  const events = [];
  while (events.length < n) {
    const { value, done } = await stream.next();
    if (done) throw new Error(`the event stream ended after ${events.length} of ${n}`);
    events.push(value);
  }
  return events;
}

const until = async (what, check) => {
  for (let i = 0; i < 200; i++) {
    const value = await check();
    if (value) return value;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
};

/** A `storage` as a page has it (sessionStorage), in memory. */
function memoryStorage() {
  const items = new Map();
  return { getItem: (k) => items.get(k) ?? null, setItem: (k, v) => items.set(k, String(v)) };
}

/** The live sessions of `clientId` on `base`. */
async function sessionsOf(base, clientId) {
  return (await call("GET", `${base}/admin/sessions`)).sessions.filter((s) => s.client_id === clientId);
}

/** An operator's disconnect (close 4002). */
async function disconnect(base, sessionId) {
  const response = await fetch(`${base}/admin/sessions/${sessionId}`, { method: "DELETE" });
  if (!response.ok) throw new Error(`DELETE session ${sessionId}: ${response.status} ${await response.text()}`);
}

/** An SSE resume token (an event id, a `resume=`) decoded. */

/**
 * A minimal EventSource on fetch's streaming body, as the browser's behaves for the client:
 * named events (`event:`) with `data` and `lastEventId` to their addEventListener listeners,
 * comments ignored, `readyState`, `close()`, and an `error` event (no data) when the answer is not
 * an event stream (CLOSED) or the stream ends or breaks (CONNECTING). Unlike a browser's, it does
 * not reconnect by itself. `drop()` cuts the connection as a network failure would.
 */
class FetchEventSource {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSED = 2;

  constructor(url) {
    this.url = String(url);
    this.readyState = FetchEventSource.CONNECTING;
    this.onopen = this.onmessage = this.onerror = null;
    this.listeners = new Map();
    this.closed = false;
    this.aborter = new AbortController();
    this.#read();
  }

  addEventListener(type, listener) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(listener);
  }

  removeEventListener(type, listener) {
    this.listeners.get(type)?.delete(listener);
  }

  close() {
    this.closed = true;
    this.readyState = FetchEventSource.CLOSED;
    this.aborter.abort();
  }

  drop() {
    this.aborter.abort();
  }

  #emit(event) {
    if (this.closed) return;
    for (const listener of [...(this.listeners.get(event.type) || [])]) listener.call(this, event);
    if (["open", "message", "error"].includes(event.type)) this[`on${event.type}`]?.call(this, event);
  }

  #fail(state) {
    if (this.closed) return;
    this.readyState = state;
    this.#emit({ type: "error" });
  }

  async #read() {
    let response;
    try {
      response = await fetch(this.url, { headers: { Accept: "text/event-stream" }, signal: this.aborter.signal });
    } catch {
      return this.#fail(FetchEventSource.CONNECTING);
    }
    if (!response.ok || !(response.headers.get("content-type") || "").startsWith("text/event-stream")) {
      response.body?.cancel().catch(() => {});
      return this.#fail(FetchEventSource.CLOSED);
    }
    this.readyState = FetchEventSource.OPEN;
    this.#emit({ type: "open" });
    let buffer = "";
    let type = "";
    let data = [];
    let lastEventId = "";
    try {
      for await (const chunk of response.body.pipeThrough(new TextDecoderStream())) {
        buffer += chunk;
        for (let end = buffer.indexOf("\n"); end >= 0; end = buffer.indexOf("\n")) {
          const line = buffer.slice(0, end).replace(/\r$/, "");
          buffer = buffer.slice(end + 1);
          if (line === "") {
            if (data.length > 0) this.#emit({ type: type || "message", data: data.join("\n"), lastEventId });
            type = "";
            data = [];
            continue;
          }
          if (line.startsWith(":")) continue; // a keepalive comment
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") type = value;
          else if (field === "data") data.push(value);
          else if (field === "id" && !value.includes("\0")) lastEventId = value;
        }
      }
    } catch {
      // Aborted (close, drop) or cut.
    }
    this.#fail(FetchEventSource.CONNECTING); // a browser would reconnect now
  }
}

/** FetchEventSource, remembering every instance (its `url`, and to `drop()` it). */
function recordingEventSource() {
  const opened = [];
  const EventSource = class extends FetchEventSource {
    constructor(url) {
      super(url);
      opened.push(this);
    }
  };
  return { EventSource, opened };
}

test("acks are plain, with one confirmed ack per partition at most every confirmEveryMs, and every ack lands", async () => {
  await topicWith(A, "js-plain", 50);
  const acksOk = [];
  const client = new AckgateClient(ws(A), { clientId: "js-plain", confirmEveryMs: 60_000, onFrame: (f) => f.type === "ack_ok" && acksOk.push(f) });
  const clientEvents = client.events();
  await client.connect();
  await client.subscribe("js-plain");
  const events = await take(clientEvents, 50);
  assert.deepEqual(events.map((e) => e.payload.n), [...Array(50).keys()]);
  for (const event of events) await client.ack(event.delivery_id);
  await client.ping(); // handled after every ack before it
  const offsets = await until("the plain acks' offset write", async () => {
    const row = await call("GET", `${A}/admin/offsets/js-plain/js-plain`);
    return row.partitions[0].committed === 50 && row;
  });
  assert.equal(offsets.partitions[0].committed, 50);
  assert.equal(acksOk.length, 1, "only the first ack of the minute was confirmed");
  assert.deepEqual(client.resumeToken("js-plain"), { 0: 1 }, "the token is what was confirmed");
  client.close();

  // With a short period, a trailing confirmation brings the token up to the last ack.
  await topicWith(A, "js-trailing", 20);
  const fresh = new AckgateClient(ws(A), { clientId: "js-trailing", confirmEveryMs: 100 });
  const freshEvents = fresh.events();
  await fresh.connect();
  await fresh.subscribe("js-trailing");
  for (const event of await take(freshEvents, 20)) await fresh.ack(event.delivery_id);
  await until("the trailing confirmation", () => fresh.resumeToken("js-trailing")[0] === 20);
  fresh.close();
});

test("requests made while disconnected, and pending ones at a disconnect, reject with closed", async () => {
  const client = new AckgateClient(ws(A), { clientId: "js-closed", reconnect: false });
  const clientEvents = client.events();
  await client.connect();
  const pending = client.ping();
  client.close();
  await assert.rejects(pending, (e) => e instanceof AckgateError && e.code === "closed");
  await assert.rejects(client.ping(), (e) => e instanceof AckgateError && e.code === "closed");
  await assert.rejects(client.subscribe("anything"), (e) => e.code === "closed");
});

test("after an operator's disconnect (4002) the client reconnects without its token, so a reset stands", async () => {
  await topicWith(A, "js-reset", 10);
  const closes = [];
  const client = new AckgateClient(ws(A), { clientId: "js-reset", backoffMs: 3000, maxBackoffMs: 3000, onClose: (c) => closes.push(c.code) });
  const clientEvents = client.events();
  const welcome = await client.connect();
  await client.subscribe("js-reset");
  const events = await take(clientEvents, 10);
  await client.ack(events.map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(client.resumeToken("js-reset"), { 0: 10 });
  await call("DELETE", `${A}/admin/sessions/${welcome.session_id}`);
  await until("close 4002", () => closes.includes(4002));
  // While it waits to reconnect, the operator rewinds it (allowed: it has no session).
  await until("the reset", async () => {
    const response = await fetch(`${A}/admin/offsets/js-reset/js-reset/0`, { method: "PUT", body: JSON.stringify({ offset: 0 }) });
    return response.ok;
  });
  const again = await take(clientEvents, 10);
  assert.deepEqual(again.map((e) => e.offset), [...Array(10).keys()], "replayed from the reset, not from the old token");
  client.close();
});

test("a resubscribe refused for good drops that topic and keeps the others", async () => {
  await topicWith(A, "js-keep", 1);
  await topicWith(A, "js-gone", 1);
  const closes = [];
  const dropped = [];
  const client = new AckgateClient(ws(A), {
    clientId: "js-drop",
    backoffMs: 3000,
    maxBackoffMs: 3000,
    onClose: (c) => closes.push(c.code),
    onSubscriptionDropped: (d) => dropped.push(d),
  });
  const clientEvents = client.events();
  const welcome = await client.connect();
  await client.subscribe("js-keep");
  await client.subscribe("js-gone");
  for (const event of await take(clientEvents, 2)) await client.ack(event.delivery_id, { confirm: true });
  await call("DELETE", `${A}/admin/sessions/${welcome.session_id}`);
  await until("close 4002", () => closes.includes(4002));
  await until("the topic's deletion", async () => (await fetch(`${A}/topics/js-gone`, { method: "DELETE" })).ok);
  await until("the dropped subscription", () => dropped.length === 1);
  assert.equal(dropped[0].topic, "js-gone");
  assert.equal(dropped[0].code, "unknown_topic");
  await call("POST", `${A}/topics/js-keep/events`, { payload: { after: "reconnect" } });
  const [event] = await take(clientEvents, 1);
  assert.deepEqual([event.topic, event.payload], ["js-keep", { after: "reconnect" }]);
  client.close();
});

test("with storage, the resume token survives a page reload", async () => {
  await topicWith(A, "js-reload", 10);
  const storage = memoryStorage();
  const first = new AckgateClient(ws(A), { clientId: "js-reload", storage });
  const firstEvents = first.events();
  await first.connect();
  await first.subscribe("js-reload");
  const events = await take(firstEvents, 10);
  await first.ack(events.map((e) => e.delivery_id), { confirm: true });
  first.close();
  // The page comes back: the token the gateway issued, kept in storage, is sent (and applied).
  const reloaded = new AckgateClient(ws(A), { clientId: "js-reload", storage });
  const reloadedEvents = reloaded.events();
  await reloaded.connect();
  const subscribed = await reloaded.subscribe("js-reload");
  assert.equal(subscribed.partitions[0].from, 10);
  assert.equal(subscribed.resume, "applied", "the stored token was sent");
  assert.ok(reloaded.issuedToken("js-reload")?.startsWith("r1."), "the gateway's token is kept");
  reloaded.close();

  // The gateway forgets the client (an operator's deletion): without storage the reset policy applies.
  await until("the offsets' removal", async () => (await fetch(`${A}/admin/offsets/js-reload/js-reload`, { method: "DELETE" })).ok);
  const forgetful = new AckgateClient(ws(A), { clientId: "js-reload" });
  const forgetfulEvents = forgetful.events();
  await forgetful.connect();
  assert.equal((await forgetful.subscribe("js-reload")).partitions[0].from, 0, "without storage the reset policy applies");
  forgetful.close();
});

test("with storage, an operator's reset while the page was away stands: the kept token is fenced by its epoch", async () => {
  await topicWith(A, "js-epoch", 10);
  const storage = memoryStorage();
  const first = new AckgateClient(ws(A), { clientId: "js-epoch", storage });
  const firstEvents = first.events();
  await first.connect();
  assert.equal((await first.subscribe("js-epoch")).partitions[0].epoch, 0);
  const events = await take(firstEvents, 10);
  await first.ack(events.map((e) => e.delivery_id), { confirm: true });
  first.close();
  // The page is closed; the operator rewinds the client to 3.
  await until("the reset", async () => (await fetch(`${A}/admin/offsets/js-epoch/js-epoch/0`, { method: "PUT", body: JSON.stringify({ offset: 3 }) })).ok);

  const reloaded = new AckgateClient(ws(A), { clientId: "js-epoch", storage });
  const reloadedEvents = reloaded.events();
  await reloaded.connect();
  const subscribed = await reloaded.subscribe("js-epoch");
  assert.deepEqual([subscribed.partitions[0].from, subscribed.partitions[0].epoch], [3, 1], "the reset stands over the kept token (10)");
  assert.deepEqual(tokenOf(reloaded), { 0: 3 }, "the token follows the new epoch down");
  const again = await take(reloadedEvents, 7);
  assert.deepEqual(again.map((e) => e.offset), [3, 4, 5, 6, 7, 8, 9]);
  await reloaded.ack(again.map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(tokenOf(reloaded), { 0: 10 });
  reloaded.close();
  assert.deepEqual(JSON.parse(storage.getItem("ackgate:js-epoch:epochs")), { "js-epoch": { 0: 1 } }, "the epoch is kept for the next reload");
});

const tokenOf = (client) => client.resumeToken("js-epoch");

test("over SSE: events arrive, plain acks land in order, a confirmed ack resolves, event ids move the token, POSTs are split and refused as the gateway says", async () => {
  await topicWith(A, "sse-plain", 50);
  const acksOk = [];
  const { EventSource, opened } = recordingEventSource();
  const client = new AckgateClient(ws(A), {
    clientId: "sse-plain",
    transport: "sse",
    EventSource,
    confirmEveryMs: 60_000,
    onFrame: (f) => f.type === "ack_ok" && acksOk.push(f),
  });
  const clientEvents = client.events();
  const welcome = await client.connect();
  assert.equal(welcome.ack_url, `/sse/${welcome.session_id}/frames`);
  const sessions = await sessionsOf(A, "sse-plain");
  assert.deepEqual(sessions.map((s) => [s.session_id, s.transport]), [[welcome.session_id, "sse"]]);
  await client.subscribe("sse-plain");
  const events = await take(clientEvents, 50);
  assert.deepEqual(events.map((e) => e.payload.n), [...Array(50).keys()]);
  for (const event of events) await client.ack(event.delivery_id);
  await client.ping(); // POSTed after every ack before it
  await until("the plain acks' offset write", async () => (await call("GET", `${A}/admin/offsets/sse-plain/sse-plain`)).partitions[0].committed === 50);
  assert.equal(acksOk.length, 1, "only the first ack of the minute was confirmed");
  assert.deepEqual(client.resumeToken("sse-plain"), { 0: 1 }, "the token is what was confirmed");
  // The next event's id is the session's resume token: the plain acks' durable offset (read by
  // the gateway at most every 100 ms, so past that).
  await new Promise((resolve) => setTimeout(resolve, 150));
  await call("POST", `${A}/topics/sse-plain/events`, { payload: { n: 50 } });
  const [next] = await take(clientEvents, 1);
  assert.deepEqual(client.resumeToken("sse-plain"), { 0: 50 }, "the event id moved the token");
  const ok = await client.ack(next.delivery_id, { confirm: true });
  assert.deepEqual(ok.committed, { "sse-plain": { 0: 51 } });
  assert.deepEqual(client.resumeToken("sse-plain"), { 0: 51 });

  // More requests at once than a POST may carry (10000): split, all answered in order.
  const pongs = await Promise.all(Array.from({ length: 10_001 }, () => client.ping()));
  assert.ok(pongs.every((p) => p.type === "pong"));
  // A request pending when the session closes, and one made after, reject with closed.
  const pending = client.ping();
  client.close();
  await assert.rejects(pending, (e) => e instanceof AckgateError && e.code === "closed");
  await assert.rejects(client.ping(), (e) => e instanceof AckgateError && e.code === "closed");
  assert.equal(opened.length, 1);

  // A POST over the gateway's limit is refused: each of its requests rejects with the error's code.
  const greedy = new AckgateClient(ws(A), { clientId: "sse-greedy", transport: "sse", EventSource, maxBatchFrames: 20_000 });
  await greedy.connect();
  const refused = await Promise.allSettled(Array.from({ length: 10_001 }, () => greedy.ping()));
  assert.ok(refused.every((r) => r.status === "rejected" && r.reason instanceof AckgateError && r.reason.code === "limit_exceeded"), "refused with limit_exceeded");
  assert.equal((await greedy.ping()).type, "pong", "still connected");
  greedy.close();
});

test("over SSE, a dropped stream is reopened with a fresh token, its topics and resume=, and nothing is lost", async () => {
  await topicWith(A, "sse-resume", 10);
  const { EventSource, opened } = recordingEventSource();
  const storage = memoryStorage();
  const reconnects = [];
  let tokens = 0;
  const client = new AckgateClient(ws(A), {
    clientId: "sse-resume",
    transport: "sse",
    EventSource,
    storage,
    tokenProvider: async () => `jwt-${++tokens}`, // the test gateways check no JWT
    backoffMs: 100,
    maxBackoffMs: 100,
    onReconnect: (r) => r.welcome && reconnects.push(r),
  });
  const clientEvents = client.events();
  await client.connect();
  await client.subscribe("sse-resume");
  const first = await take(clientEvents, 10);
  await client.ack(first.slice(0, 6).map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(client.resumeToken("sse-resume"), { 0: 6 });
  opened[0].drop(); // what a network failure does: the stream errors while CONNECTING
  await until("the reconnect", () => reconnects.length > 0);
  assert.equal(opened.length, 2);
  const url = new URL(opened[1].url);
  assert.equal(url.pathname, "/sse");
  assert.equal(url.searchParams.get("topics"), "sse-resume");
  assert.ok(url.searchParams.get("resume").startsWith("r1."), "the stream's last id, the token the gateway issued");
  assert.equal(new URL(opened[0].url).searchParams.get("token"), "jwt-1");
  assert.equal(url.searchParams.get("token"), "jwt-2", "the token provider is asked again");
  const again = await take(clientEvents, 4);
  assert.deepEqual(again.map((e) => e.offset), [6, 7, 8, 9], "the unacknowledged ones again, none of the acknowledged");
  await call("POST", `${A}/topics/sse-resume/events`, { payload: { after: "drop" } });
  const [next] = await take(clientEvents, 1);
  assert.equal(next.offset, 10);
  await client.ack([...again, next].map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(JSON.parse(storage.getItem("ackgate:sse-resume:resume")), { "sse-resume": { 0: 11 } }, "storage keeps the one per-topic map");
  client.close();
});

test("over SSE, after an operator's disconnect (4002) the stream is reopened without resume=, and what was not acked comes again", async () => {
  await topicWith(A, "sse-reset", 10);
  const closes = [];
  const { EventSource, opened } = recordingEventSource();
  const client = new AckgateClient(ws(A), { clientId: "sse-reset", transport: "sse", EventSource, backoffMs: 100, maxBackoffMs: 100, onClose: (c) => closes.push(c) });
  const clientEvents = client.events();
  const welcome = await client.connect();
  await client.subscribe("sse-reset");
  const events = await take(clientEvents, 10);
  await client.ack(events.slice(0, 5).map((e) => e.delivery_id), { confirm: true });
  await disconnect(A, welcome.session_id);
  await until("close 4002", () => closes.some((c) => c.code === 4002 && !c.final));
  await until("the new stream", () => opened.length === 2);
  const url = new URL(opened[1].url);
  assert.equal(url.searchParams.get("topics"), "sse-reset");
  assert.equal(url.searchParams.get("resume"), null, "no token after 4002");
  const again = await take(clientEvents, 5);
  assert.deepEqual(again.map((e) => e.offset), [5, 6, 7, 8, 9], "resumed at the stored offset");
  client.close();
});

test("over SSE and WebSocket, a session of the same client takes over (4001) and the older client stops for good", async () => {
  await topicWith(A, "sse-takeover", 3);
  const { EventSource } = recordingEventSource();
  const sseCloses = [];
  const sseAttempts = [];
  const sse = new AckgateClient(ws(A), {
    clientId: "sse-takeover",
    transport: "sse",
    EventSource,
    backoffMs: 100,
    onClose: (c) => sseCloses.push(c),
    onReconnect: (r) => sseAttempts.push(r),
  });
  const sseEvents = sse.events();
  await sse.connect();
  await sse.subscribe("sse-takeover");
  const [first] = await take(sseEvents, 3);
  await sse.ack(first.delivery_id, { confirm: true });

  const wsCloses = [];
  const wsAttempts = [];
  const wsClient = new AckgateClient(ws(A), { clientId: "sse-takeover", backoffMs: 100, onClose: (c) => wsCloses.push(c), onReconnect: (r) => wsAttempts.push(r) });
  const wsEvents = wsClient.events();
  await wsClient.connect();
  await until("4001 on the SSE client", () => sseCloses.some((c) => c.code === 4001 && c.final));
  assert.deepEqual(await sseEvents.next(), { value: undefined, done: true }, "its events end");
  await wsClient.subscribe("sse-takeover");
  const moved = await take(wsEvents, 2);
  assert.deepEqual(moved.map((e) => e.offset), [1, 2], "the unacknowledged deliveries moved to the WebSocket");
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(sseAttempts.length, 0, "the SSE client did not reconnect");
  assert.deepEqual((await sessionsOf(A, "sse-takeover")).map((s) => s.transport), ["websocket"]);

  // And back: a new SSE client takes over from the WebSocket one.
  const back = new AckgateClient(ws(A), { clientId: "sse-takeover", transport: "sse", EventSource });
  const backEvents = back.events();
  await back.connect();
  await until("4001 on the WebSocket client", () => wsCloses.some((c) => c.code === 4001 && c.final));
  await back.subscribe("sse-takeover");
  const last = await take(backEvents, 2);
  assert.deepEqual(last.map((e) => e.offset), [1, 2]);
  const ok = await back.ack(last.map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(ok.committed, { "sse-takeover": { 0: 3 } });
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(wsAttempts.length, 0, "the WebSocket client did not reconnect");
  assert.deepEqual((await sessionsOf(A, "sse-takeover")).map((s) => s.transport), ["sse"]);
  back.close();
});

test("auto falls back to SSE when the WebSocket cannot connect, and stays on SSE; where it can, auto is a WebSocket", async () => {
  await topicWith(A, "sse-auto", 3);
  const refused = [];
  // A WebSocket a proxy refuses: it fails before any frame.
  class RefusedWebSocket {
    static OPEN = 1;
    constructor(url) {
      refused.push(url);
      this.readyState = 0;
      setTimeout(() => {
        this.readyState = 3;
        this.onerror?.({ type: "error" });
        this.onclose?.({ code: 1006, reason: "" });
      }, 10);
    }
    send() {
      throw new Error("not open");
    }
    close() {}
  }
  const { EventSource, opened } = recordingEventSource();
  const reconnects = [];
  const client = new AckgateClient(ws(A), {
    clientId: "sse-auto",
    transport: "auto",
    WebSocket: RefusedWebSocket,
    EventSource,
    backoffMs: 100,
    maxBackoffMs: 100,
    onReconnect: (r) => r.welcome && reconnects.push(r),
  });
  const clientEvents = client.events();
  const welcome = await client.connect();
  assert.deepEqual([refused.length, opened.length], [1, 1]);
  assert.ok(welcome.ack_url, "the welcome came over SSE");
  assert.deepEqual((await sessionsOf(A, "sse-auto")).map((s) => s.transport), ["sse"]);
  await client.subscribe("sse-auto");
  const events = await take(clientEvents, 3);
  const ok = await client.ack(events.map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(ok.committed, { "sse-auto": { 0: 3 } });
  // A reconnect goes straight to SSE.
  await disconnect(A, welcome.session_id);
  await until("the reconnect", () => reconnects.length > 0);
  assert.deepEqual([refused.length, opened.length], [1, 2], "no WebSocket tried again");
  await call("POST", `${A}/topics/sse-auto/events`, { payload: { after: "fallback" } });
  const [next] = await take(clientEvents, 1);
  assert.equal(next.offset, 3);
  client.close();

  const direct = new AckgateClient(ws(A), { clientId: "sse-auto-ws", transport: "auto", EventSource });
  const directWelcome = await direct.connect();
  assert.equal(directWelcome.ack_url, undefined, "the welcome came over a WebSocket");
  assert.deepEqual((await sessionsOf(A, "sse-auto-ws")).map((s) => s.transport), ["websocket"]);
  direct.close();
});

// Issue 39, item 8: the plain acks of 3 and 4 were never confirmed before the drain closed
// the session, so A sent 3 and 4 again. Now the client confirms at the `reconnect` frame and B
// closes once that confirmation went out: A resumes at 5.
test("when its instance goes away the client follows /session/recommend to a peer and resumes there, its last plain acks included", async () => {
  await topicWith(B, "js-move", 5);
  await topicWith(A, "js-move", 6);
  const reconnects = [];
  const client = new AckgateClient(ws(B), { clientId: "js-move", peers: [A], backoffMs: 100, confirmEveryMs: 600_000, onReconnect: (r) => r.welcome && reconnects.push(r) });
  const clientEvents = client.events();
  const welcome = await client.connect();
  await client.subscribe("js-move");
  const events = await take(clientEvents, 3);
  await client.ack(events.map((e) => e.delivery_id), { confirm: true });
  const later = await take(clientEvents, 2);
  await client.ack(later.map((e) => e.delivery_id)); // plain: the next confirmation is 10 minutes away
  // Instance B drains: its sessions get `reconnect`, then 1012, and it recommends its peer A.
  await call("POST", `${B}/admin/drain`);
  await until("the reconnect to A", () => reconnects.length > 0);
  assert.notEqual(reconnects[0].welcome.instance, welcome.instance);
  const [next] = await take(clientEvents, 1);
  assert.equal(next.offset, 5, "resumed on A at the token with the plain acks, not from A's start and not at the last confirmation");
  client.close();
});

// Issue 42, item 1: a token's expiry ended the session for good (1008, final: events() ended and
// tokenProvider was never asked again). Now the gateway sends `refresh_needed` before `exp`, the
// client asks tokenProvider and sends `refresh`, and the same session delivers past the first
// token's expiry: no reconnect, nothing lost.
test("a token that expires mid-stream is refreshed in band: the same session goes on past its exp", async () => {
  if (!C) throw new Error("set ACKGATE_DEV_C and ACKGATE_DEV_C_SECRET");
  await topicWith(C, "js-fresh", 3);
  const now = () => Math.floor(Date.now() / 1000);
  const asked = [];
  const tokenProvider = async () => {
    // The first token lives 3 s; the next ones an hour.
    const exp = asked.length === 0 ? now() + 3 : now() + 3600;
    asked.push(exp);
    return jwt({ sub: "js-fresh", exp });
  };
  const reconnects = [];
  const closes = [];
  const client = new AckgateClient(ws(C), { clientId: "js-fresh", tokenProvider, onReconnect: (r) => reconnects.push(r), onClose: (c) => closes.push(c.code) });
  const stream = client.events();
  const welcome = await client.connect();
  await client.subscribe("js-fresh");
  const first = await take(stream, 3);
  await client.ack(first.map((e) => e.delivery_id), { confirm: true });
  await until("the refresh", () => asked.length >= 2);
  // Past the first token's exp: the session is still the same one.
  await new Promise((r) => setTimeout(r, Math.max(0, (asked[0] + 1) * 1000 - Date.now())));
  await call("POST", `${C}/topics/js-fresh/events`, { partition: 0, payload: { n: 3 } });
  const [later] = await take(stream, 1);
  assert.equal(later.offset, 3);
  const confirmed = await client.ack(later.delivery_id, { confirm: true });
  assert.deepEqual(confirmed.committed, { "js-fresh": { 0: 4 } });
  assert.deepEqual(closes, [], "no close: the session went on");
  assert.deepEqual(reconnects, []);
  assert.equal(client.welcome.session_id, welcome.session_id);
  client.close();
});

// Issue 61 item 4: a bad token, another client's token and no token looked like an outage
// ("unavailable: WebSocket connection ... failed", retried forever), because a page cannot read
// a refused handshake's status. The gateway says why in the socket or the stream now; connect()
// rejects with that code, the close is final (1008) and the client does not come back.
test("refused credentials reject connect() with their code, over WebSocket and SSE, and the client fails", async () => {
  if (!C) throw new Error("set ACKGATE_DEV_C and ACKGATE_DEV_C_SECRET");
  const cases = [
    ["a made-up token", "not.a.jwt", "unauthorized"],
    ["another client's token", jwt({ sub: "someone-else", exp: Math.floor(Date.now() / 1000) + 3600 }), "forbidden"],
    ["no token", undefined, "unauthorized"],
  ];
  for (const transport of ["websocket", "sse"]) {
    for (const [what, token, code] of cases) {
      const closes = [];
      const reconnects = [];
      const client = new AckgateClient(ws(C), {
        clientId: "js-refused",
        token,
        transport,
        EventSource: FetchEventSource,
        onClose: (c) => closes.push(c),
        onReconnect: (r) => reconnects.push(r),
      });
      await assert.rejects(client.connect(), (error) => error instanceof AckgateError && error.code === code, `${transport}, ${what}`);
      await new Promise((r) => setTimeout(r, 300));
      assert.deepEqual(closes.map((c) => [c.code, c.final]), [[1008, true]], `${transport}, ${what}`);
      assert.deepEqual(reconnects, [], `${transport}, ${what}: no reconnect after a final close`);
      // The state says refused for good (not an outage, not close()), with the refusal's code.
      assert.equal(client.state, "failed", `${transport}, ${what}`);
      assert.deepEqual([client.failure?.code, client.failure?.closeCode], [code, 1008], `${transport}, ${what}`);
      client.close();
      assert.equal(client.state, "closed");
    }
  }
});

// Issue 61 item 3: acks were easy to forget, and forgetting failed silently: no `event.ack()`,
// a loop that never acked stopped at the window (still "connected", nothing said), and a handler
// that threw left its event unacked until the ack timeout.
test("events ack themselves; autoAck acks what a handler finished and nacks what it threw; a full window with no ack is said as stalled", async () => {
  await topicWith(A, "js-self-ack", 3);
  const own = new AckgateClient(ws(A), { clientId: "js-self-ack" });
  const ownEvents = own.events();
  await own.connect();
  await own.subscribe("js-self-ack");
  const three = await take(ownEvents, 3);
  assert.deepEqual(Object.keys(three[0]).filter((k) => ["ack", "nack", "extend", "term"].includes(k)), [], "the methods are not the frame's own keys");
  assert.equal(typeof three[0].ack, "function");
  three[0].ack();
  three[1].ack();
  const confirmed = await three[2].ack({ confirm: true });
  assert.deepEqual(confirmed.committed, { "js-self-ack": { 0: 3 } });
  own.close();

  // autoAck: the handler throws on the first attempt of n = 1, and finishes otherwise.
  await topicWith(A, "js-auto-ack", 3);
  const attempts = [];
  const auto = new AckgateClient(ws(A), {
    clientId: "js-auto-ack",
    autoAck: true,
    onEvent: async (event) => {
      attempts.push([event.payload.n, event.attempt]);
      if (event.payload.n === 1 && event.attempt === 1) throw new Error("a handler that fails once");
      await new Promise((r) => setTimeout(r, 5));
    },
  });
  const reported = [];
  const reportError = globalThis.reportError;
  globalThis.reportError = (error) => reported.push(error.message);
  try {
    await auto.connect();
    await auto.subscribe("js-auto-ack");
    await until("every event acked, n = 1 after its redelivery", async () => {
      const offsets = (await call("GET", `${A}/admin/offsets?topic=js-auto-ack`)).offsets;
      return offsets.some((o) => o.client_id === "js-auto-ack" && o.committed === 3);
    });
  } finally {
    globalThis.reportError = reportError;
  }
  assert.ok(attempts.some(([n, attempt]) => n === 1 && attempt === 2), `n = 1 nacked and delivered again: ${JSON.stringify(attempts)}`);
  assert.deepEqual(reported, ["a handler that fails once"]);
  auto.close();

  // A loop that never acks fills the window (the gateway's max_in_flight, 1000): said once.
  await topicWith(A, "js-stall", 1000);
  const stalls = [];
  const stalled = new AckgateClient(ws(A), { clientId: "js-stall", stalledAfterMs: 300, onStalled: (s) => stalls.push(s) });
  stalled.on("event", () => {}); // reads every event, acks none
  await stalled.connect();
  await stalled.subscribe("js-stall");
  await until("stalled", () => stalls.length === 1);
  assert.deepEqual(stalls[0], { held: 1000, window: 1000, sinceMs: 300 });
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(stalls.length, 1, "said once");
  stalled.close();
});

// Issue 42, item 2: events that arrived before `events()` was iterated (here, during a second
// `subscribe()`) were dropped and came back only after the ack timeout, as attempt 2. Now they
// are kept from the first `subscribe()` on.
test("events that arrive before events() is iterated wait for it, first attempts", async () => {
  await topicWith(A, "js-early-a", 5);
  await topicWith(A, "js-early-b", 0);
  const client = new AckgateClient(ws(A), { clientId: "js-early" });
  await client.connect();
  await client.subscribe("js-early-a");
  await new Promise((r) => setTimeout(r, 300)); // a's events arrive meanwhile
  await client.subscribe("js-early-b");
  const stream = client.events();
  const within = (ms) => new Promise((_, reject) => setTimeout(() => reject(new Error(`not within ${ms} ms`)), ms));
  const events = await Promise.race([take(stream, 5), within(4000)]);
  assert.deepEqual(events.map((e) => [e.topic, e.offset, e.attempt]), [0, 1, 2, 3, 4].map((o) => ["js-early-a", o, 1]));
  await client.ack(events.map((e) => e.delivery_id), { confirm: true });
  client.close();
});

// Issue 44: pages of different clients share a topic as members of one group; each event goes
// to one of them, a confirmed ack's token is the group's floor, and the one left gets the rest.
test("members of a shared subscription split the events, each acked once, and the one left gets the rest", async () => {
  await topicWith(A, "js-shared", 0);
  const one = new AckgateClient(ws(A), { clientId: "js-member-1", confirmEveryMs: 50 });
  const two = new AckgateClient(ws(A), { clientId: "js-member-2", confirmEveryMs: 50 });
  const [oneEvents, twoEvents] = [one.events(), two.events()];
  await one.connect();
  await two.connect();
  assert.equal((await one.subscribe("js-shared", { group: "pages", order: "key" })).group, "pages");
  assert.equal((await two.subscribe("js-shared", { group: "pages", order: "key" })).group, "pages");
  const events = Array.from({ length: 40 }, (_, i) => ({ partition: 0, key: `k${i % 4}`, payload: { n: i } }));
  await call("POST", `${A}/topics/js-shared/events`, { events });
  const seen = new Map();
  // A read still waiting when the quiet ends is kept for the next one (a dropped one would take
  // an event that nobody acks).
  const reads = new Map();
  const drain = async (client, stream, name) => {
    for (;;) {
      if (!reads.has(name)) reads.set(name, stream.next());
      const next = await Promise.race([reads.get(name), new Promise((r) => setTimeout(() => r(null), 700))]);
      if (!next) return;
      reads.delete(name);
      seen.set(next.value.payload.n, [...(seen.get(next.value.payload.n) || []), name]);
      await client.ack(next.value.delivery_id);
    }
  };
  await Promise.all([drain(one, oneEvents, "one"), drain(two, twoEvents, "two")]);
  assert.equal(seen.size, 40, "every event reached a member");
  assert.ok([...seen.values()].every((names) => names.length === 1), "each event once");
  const names = new Set([...seen.values()].flat());
  assert.deepEqual([...names].sort(), ["one", "two"], "both members got a share");
  await until("the group's floor in the group's token", () => one.resumeToken("js-shared", "pages")[0] === 40 || two.resumeToken("js-shared", "pages")[0] === 40);
  assert.deepEqual(one.resumeToken("js-shared"), {}, "the group's floor is not the client's own");
  assert.ok(one.issuedToken("js-shared", "pages")?.startsWith("r1."), "the group's token the gateway issued");
  const group = await call("GET", `${A}/admin/groups/js-shared/pages`);
  assert.equal(group.partitions[0].committed, 40);
  one.close();
  await call("POST", `${A}/topics/js-shared/events`, { events: events.slice(0, 10) });
  const rest = [await reads.get("two"), ...(await take(twoEvents, 9)).map((value) => ({ value }))].map((r) => r.value);
  assert.deepEqual(rest.map((e) => e.offset).sort((x, y) => x - y), [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]);
  for (const key of ["k0", "k1", "k2", "k3"]) {
    const offsets = rest.filter((e) => e.key === key).map((e) => e.offset);
    assert.deepEqual(offsets, [...offsets].sort((x, y) => x - y), `${key} in offset order`);
  }
  two.close();
});

// Issue 42, item 6: a page publishes over its session. A publish made while the connection is
// cut waits and goes out after the reconnect, under its idempotency key: the log holds it once.
test("publish goes over the session, waits through a reconnect and is written once", async () => {
  await topicWith(A, "js-pub", 0);
  const client = new AckgateClient(ws(A), { clientId: "js-pub", backoffMs: 50 });
  const welcome = await client.connect();
  const first = await client.publish("js-pub", [{ payload: { n: 0 } }, { partition: 0, payload: { n: 1 } }]);
  assert.deepEqual(first.offsets, [{ partition: 0, offset: 0 }, { partition: 0, offset: 1 }]);
  // Cut by an operator (4002, not final): the publish made meanwhile waits for the next session.
  await disconnect(A, welcome.session_id);
  const later = await client.publish("js-pub", { payload: { n: 2 } }, { idempotencyKey: "js-pub-2" });
  assert.deepEqual(later.offsets, [{ partition: 0, offset: 2 }]);
  const again = await client.publish("js-pub", { payload: { n: 2 } }, { idempotencyKey: "js-pub-2" });
  assert.deepEqual([again.offsets, again.replayed], [[{ partition: 0, offset: 2 }], true]);
  const topics = await call("GET", `${A}/topics`);
  const pub = topics.topics.find((t) => t.name === "js-pub");
  assert.equal(pub.partitions[0].log_end, 3, "each publish written once");
  client.close();
  await assert.rejects(client.publish("js-pub", { payload: {} }), (e) => e.code === "closed");
});

/** A TCP proxy to `base` (on `port`, else one the OS picks) that can black-hole its connections:
 * bytes stop flowing both ways but nothing is closed, as after a laptop sleep or a silent network
 * switch. */
async function blackHoleProxy(base, port = 0) {
  const target = new URL(base);
  const live = new Set();
  let holed = false;
  const server = createServer((client) => {
    const upstream = tcpConnect(Number(target.port), target.hostname);
    const pair = { client, upstream, holed: false };
    live.add(pair);
    client.on("data", (d) => pair.holed || upstream.write(d));
    upstream.on("data", (d) => pair.holed || client.write(d));
    const end = () => { live.delete(pair); client.destroy(); upstream.destroy(); };
    client.on("close", end).on("error", end);
    upstream.on("close", end).on("error", end);
  });
  await new Promise((r) => server.listen(port, "127.0.0.1", r));
  return {
    url: `ws://127.0.0.1:${server.address().port}/ws`,
    /** Black-holes the connections open now; new ones flow. */
    hole: () => { for (const pair of live) pair.holed = true; },
    close: () => { for (const pair of live) { pair.client.destroy(); pair.upstream.destroy(); } server.close(); },
  };
}

// Issue 42, item 4: a connection that stops carrying bytes without closing was never noticed:
// no event came again and every request hung. Now a heartbeat ping unanswered within
// heartbeatTimeoutMs abandons it, and the client reconnects and resumes.
test("a black-holed connection is found by the heartbeat and the client resumes on a new one", async () => {
  await topicWith(A, "js-hole", 2);
  const proxy = await blackHoleProxy(A);
  const closes = [];
  const client = new AckgateClient(proxy.url, { clientId: "js-hole", heartbeatMs: 300, heartbeatTimeoutMs: 500, backoffMs: 50, onClose: (c) => closes.push(c.code) });
  const stream = client.events();
  const welcome = await client.connect();
  await client.subscribe("js-hole");
  const first = await take(stream, 2);
  await client.ack(first.map((e) => e.delivery_id), { confirm: true });
  proxy.hole();
  await until("the dead connection noticed", () => closes.includes(1006));
  await until("a new session", () => client.welcome.session_id !== welcome.session_id);
  await call("POST", `${A}/topics/js-hole/events`, { partition: 0, payload: { n: 2 } });
  const [next] = await take(stream, 1);
  assert.equal(next.offset, 2, "resumed at its token on the new connection");
  client.close();
  proxy.close();
});

/** A port nothing listens on (the OS picks it, then it is let go). */
async function freePort() {
  const server = createServer();
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  return port;
}

// Issue 61, item 2: a page loaded before its gateway was up failed for good (connect() rejected
// at once and was never tried again), and a subscribe() before connect() rejected with `closed:
// not connected`. Now the subscribe waits for the session, and the first connect is tried again
// with the reconnect backoff until the gateway answers.
test("a client started before its gateway is up: subscribe() before connect() waits, connect() is tried again until the gateway answers, and the events come", async () => {
  await topicWith(A, "js-late", 3);
  // A port nothing listens on yet: the gateway comes up there (a proxy to A) after a failed attempt.
  const port = await freePort();
  const attempts = [];
  const client = new AckgateClient(`ws://127.0.0.1:${port}/ws`, { clientId: "js-late", backoffMs: 100, maxBackoffMs: 200, onReconnect: (r) => attempts.push(r) });
  const stream = client.events();
  const subscribed = client.subscribe("js-late");
  const connecting = client.connect();
  await until("a failed attempt", () => attempts.some((a) => a.error));
  assert.equal(client.state, "connecting");
  const proxy = await blackHoleProxy(A, port);
  const welcome = await connecting;
  assert.equal(welcome.client_id, "js-late");
  assert.equal((await subscribed).topic, "js-late");
  const events = await take(stream, 3);
  assert.deepEqual(events.map((e) => e.offset), [0, 1, 2]);
  const ok = await client.ack(events.map((e) => e.delivery_id), { confirm: true });
  assert.deepEqual(ok.committed, { "js-late": { 0: 3 } });
  client.close();
  proxy.close();
});

/** The one `js` block of docs/clients.md that contains `marker` (none or two: the test fails). */
function guideBlock(marker) {
  const guide = readFileSync(new URL("../../../docs/clients.md", import.meta.url), "utf8");
  const blocks = [...guide.matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]).filter((text) => text.includes(marker));
  assert.equal(blocks.length, 1, `docs/clients.md has one js block with ${marker}`);
  return blocks[0];
}

/**
 * Runs a block of docs/clients.md as the body of an async function of `names` (the page's free
 * names, which the test defines) with `values`; its import of "ackgate-client" reads this
 * checkout's module instead. The promise of its end.
 */
function runBlock(block, names, values) {
  const body = block.replace(/^import \{([^}]*)\} from "ackgate-client";.*$/m, "const {$1} = ackgate;");
  const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
  return new AsyncFunction("ackgate", ...names, body)(ackgate, ...values);
}

test("the quickstart of docs/clients.md runs as written against a fresh topic: it subscribes before anything was published, renders and acks", async () => {
  const block = guideBlock("for await (const event of client.events())");
  // Only the package name (the module is this checkout's) and the gateway's address change.
  assert.ok(block.includes('from "ackgate-client"') && block.includes('"ws://127.0.0.1:8080/ws"'), block);
  // What the page has: a signed-in user, a render function, sessionStorage. The second event's
  // render ends the loop (the block runs for ever otherwise).
  const rendered = [];
  const stop = new Error("enough");
  const render = (payload) => {
    rendered.push(payload);
    if (rendered.length === 2) throw stop;
  };
  const running = runBlock(block.replace('"ws://127.0.0.1:8080/ws"', JSON.stringify(ws(A))), ["user", "render", "sessionStorage"], [{ id: "docs-reader" }, render, memoryStorage()]);
  // Its end is awaited below; handled from now on (it may end before that await).
  const ended = running.then(
    () => "the loop ended by itself",
    (error) => error,
  );
  const subscribed = await until("the quickstart's subscription", async () => {
    const sessions = await call("GET", `${A}/admin/sessions?topic=orders`);
    return sessions.sessions.find((s) => s.client_id.startsWith("docs-reader:"));
  });
  await call("POST", `${A}/topics/orders/events`, { events: [{ payload: { n: 1 } }, { payload: { n: 2 } }] });
  assert.equal(await ended, stop);
  assert.deepEqual(rendered.map((p) => p.n).sort(), [1, 2]);
  // The first one's ack lands (a plain ack: written within offsets.plain_ack_linger_ms).
  await until("the first event's ack", async () => {
    const rows = (await call("GET", `${A}/admin/offsets?topic=orders&client_id=${subscribed.client_id}`)).offsets;
    return rows.reduce((sum, r) => sum + r.committed, 0) >= 1;
  });
});

// docs/clients.md's answer to "refused for good, or an outage" (its `failed` and `state`
// listeners), run as written on gateway C (JWTs). A page follows it to sign in again after a
// refused token, to offer the session back after a takeover, and to show that it is offline.
test("docs/clients.md's failed and state listeners run as written: a refused token signs in and connects again, a takeover shows the banner whose action takes the session back, offline while connecting or reconnecting", async () => {
  if (!C) throw new Error("set ACKGATE_DEV_C and ACKGATE_DEV_C_SECRET");
  const block = guideBlock('client.on("failed"');
  const clientId = "js-docs-failed";
  const valid = () => jwt({ sub: clientId, exp: Math.floor(Date.now() / 1000) + 3600 });
  // The page's token until it signs in is one the gateway refuses (unauthorized).
  let token = "not.a.jwt";
  const reconnects = [];
  const client = new AckgateClient(ws(C), { clientId, tokenProvider: async () => token, onReconnect: (r) => reconnects.push(r) });
  const signedIn = [];
  const banners = [];
  const offline = [];
  const signIn = async () => {
    signedIn.push(token);
    token = valid();
  };
  const showBanner = (text, action) => banners.push({ text, action });
  const setOffline = (value) => offline.push(value);
  await runBlock(block, ["client", "showBanner", "signIn", "setOffline"], [client, showBanner, signIn, setOffline]);

  // Refused: signIn, then connect() again with the token it got; no banner. The first connect()
  // rejects with the refusal (it opened a second session beside the listener's before).
  await assert.rejects(client.connect(), (error) => error.code === "unauthorized");
  await until("the connect after signIn", () => client.state === "connected");
  assert.deepEqual(signedIn, ["not.a.jwt"]);
  assert.deepEqual(banners, []);
  // connecting, failed, connecting, connected
  assert.deepEqual(offline, [true, false, true, false]);
  await new Promise((r) => setTimeout(r, 500)); // (a second attempt would be out by now)
  assert.deepEqual(reconnects, [], "one connect after signIn, no other attempt");
  assert.equal((await sessionsOf(C, clientId)).length, 1);
  assert.equal((await sessionsOf(C, clientId))[0].session_id, client.welcome.session_id);

  // An outage (an operator's disconnect, 4002): offline while reconnecting, back by itself.
  const [session] = await sessionsOf(C, clientId);
  await disconnect(C, session.session_id);
  await until("the reconnect after 4002", () => offline.length === 6 && client.state === "connected");
  assert.deepEqual(offline.slice(4), [true, false]);

  // Taken over by another device: the banner, no signIn; its action connects again and takes
  // the session back (the other one fails in turn).
  const other = new AckgateClient(ws(C), { clientId, token: valid() });
  await other.connect();
  await until("the takeover", () => client.state === "failed");
  assert.equal(client.failure.code, "taken_over");
  assert.deepEqual(signedIn, ["not.a.jwt"], "a takeover does not sign in");
  assert.deepEqual(banners.map((b) => b.text), ["Open in another window"]);
  assert.equal(offline.at(-1), false, "failed is not offline");
  await banners[0].action();
  assert.equal(client.state, "connected");
  await until("the other device's failure", () => other.state === "failed");
  assert.equal(other.failure.code, "taken_over");
  assert.deepEqual(offline.slice(6), [false, true, false]);
  other.close();
  client.close();
});

// docs/clients.md's "coming from centrifuge-js" page, the ackgate-client half, run as written on
// gateway C (JWTs: its tokenProvider is what the page's server issues). Only the gateway's
// address changes; the page's user, token server, render, reloadOrders and sessionStorage are
// the test's.
test("docs/clients.md's ackgate-client page beside centrifuge-js runs as written: a token per client id, each event rendered and acked, the resume token kept in sessionStorage", async () => {
  if (!C) throw new Error("set ACKGATE_DEV_C and ACKGATE_DEV_C_SECRET");
  const block = guideBlock('client.topic("orders")');
  assert.ok(block.includes('"wss://gw.example.com/ws"'), block);
  // The deployment made the topic: a JWT session may not create one (embedded.auto_create_topics).
  const created = await fetch(`${C}/topics`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ name: "orders", partitions: 1 }) });
  assert.ok(created.ok || created.status === 409, `creating orders on C: ${created.status}`);
  const user = { id: "docs-comparer" };
  const asked = [];
  const fetchGatewayToken = async (clientId) => {
    asked.push(clientId);
    return jwt({ sub: clientId, exp: Math.floor(Date.now() / 1000) + 3600 });
  };
  const rendered = [];
  const stop = new Error("enough");
  const render = (payload) => {
    rendered.push(payload);
    if (rendered.length === 3) throw stop;
  };
  let reloads = 0;
  const reloadOrders = () => reloads++;
  const sessionStorage = memoryStorage();
  const running = runBlock(
    block.replace('"wss://gw.example.com/ws"', JSON.stringify(ws(C))),
    ["user", "fetchGatewayToken", "render", "reloadOrders", "sessionStorage"],
    [user, fetchGatewayToken, render, reloadOrders, sessionStorage],
  );
  const ended = running.then(
    () => "the loop ended by itself",
    (error) => error,
  );
  const subscribed = await until("the page's subscription", async () => {
    const sessions = await call("GET", `${C}/admin/sessions?topic=orders`);
    return sessions.sessions.find((s) => s.client_id.startsWith("docs-comparer:"));
  });
  assert.deepEqual(asked, [subscribed.client_id], "the token was asked for the device's client id");
  await call("POST", `${C}/topics/orders/events`, { events: [1, 2, 3].map((n) => ({ partition: 0, payload: { n } })) });
  assert.equal(await ended, stop);
  assert.deepEqual(rendered.map((p) => p.n), [1, 2, 3]);
  // The first two rendered were acked (the third's render ended the loop before its ack).
  const committed = await until("the acks of the rendered events", async () => {
    const [row] = (await call("GET", `${C}/admin/offsets?topic=orders&client_id=${subscribed.client_id}`)).offsets;
    return row?.committed >= 2 && row.committed;
  });
  assert.ok(committed >= 2, `committed ${committed}`);
  // The resume token the gateway issued is kept in the page's sessionStorage for a reload.
  await until("the resume token in sessionStorage", () => sessionStorage.getItem(`ackgate:${subscribed.client_id}:tokens`));
  assert.equal(reloads, 0, "nothing was missing: no gap, no reload");
});
