// ackgate-client against real gateways: ACKGATE_DEV_A and ACKGATE_DEV_B are the http base URLs of two
// running instances (tests/api/js_client.rs starts them, each with its own embedded log; B names
// A in cluster.peers, and the last test drains B).
//
//   ACKGATE_DEV_A=http://127.0.0.1:8080 ACKGATE_DEV_B=http://127.0.0.1:8081 node --experimental-websocket --test test/
import { test } from "node:test";
import assert from "node:assert/strict";

import { AckgateClient, AckgateError } from "../ackgate.js";

const A = process.env.ACKGATE_DEV_A;
const B = process.env.ACKGATE_DEV_B;
if (!A || !B) throw new Error("set ACKGATE_DEV_A and ACKGATE_DEV_B to two gateways' http base URLs");
const ws = (base) => `${base.replace(/^http/, "ws")}/ws`;

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
  // The gateway forgets the client's offsets (as an instance that never saw it would have none).
  await until("the offsets' removal", async () => (await fetch(`${A}/admin/offsets/js-reload/js-reload`, { method: "DELETE" })).ok);

  const reloaded = new AckgateClient(ws(A), { clientId: "js-reload", storage });
  const reloadedEvents = reloaded.events();
  await reloaded.connect();
  const subscribed = await reloaded.subscribe("js-reload");
  assert.equal(subscribed.partitions[0].from, 10, "the stored token was sent");
  reloaded.close();

  await until("the offsets' removal again", async () => (await fetch(`${A}/admin/offsets/js-reload/js-reload`, { method: "DELETE" })).ok);
  const forgetful = new AckgateClient(ws(A), { clientId: "js-reload" });
  const forgetfulEvents = forgetful.events();
  await forgetful.connect();
  assert.equal((await forgetful.subscribe("js-reload")).partitions[0].from, 0, "without storage the reset policy applies");
  forgetful.close();
});

test("when its instance goes away the client follows /session/recommend to a peer and resumes there", async () => {
  await topicWith(B, "js-move", 5);
  await topicWith(A, "js-move", 5);
  const reconnects = [];
  const client = new AckgateClient(ws(B), { clientId: "js-move", peers: [A], backoffMs: 100, onReconnect: (r) => r.welcome && reconnects.push(r) });
  const clientEvents = client.events();
  const welcome = await client.connect();
  await client.subscribe("js-move");
  const events = await take(clientEvents, 3);
  await client.ack(events.map((e) => e.delivery_id), { confirm: true });
  // Instance B drains: its sessions get `reconnect`, then 1012, and it recommends its peer A.
  await call("POST", `${B}/admin/drain`);
  await until("the reconnect to A", () => reconnects.length > 0);
  assert.notEqual(reconnects[0].welcome.instance, welcome.instance);
  const [next] = await take(clientEvents, 1);
  assert.equal(next.offset, 3, "resumed on A at the token, not from A's start");
  client.close();
});
