// ackgate-client/react without a browser: Node.js has no DOM to mount components in, so the
// store behind useTopic (what the hooks subscribe to, as useSyncExternalStore does) is driven
// directly, on a fake gateway as in unit.test.mjs; react-dom/server renders the hooks once.
// Real Chromium mounts them: tests/browser/react.mjs.
//
//   node --test test/react.test.mjs
import { test } from "node:test";
import assert from "node:assert/strict";
import { createElement } from "react";
import { renderToString } from "react-dom/server";

import { AckgateClient } from "../ackgate.js";
import { AckgateProvider, _topicStore, useAckgateState, useTopic } from "../react.js";

/** The gateway's side of each socket the client opens (the minimum of unit.test.mjs's). */
function fakeGateway() {
  const sockets = [];
  class FakeWebSocket {
    static OPEN = 1;
    readyState = 0;
    sent = [];
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
      setTimeout(() => this.onclose?.({ code, reason }));
    }
    welcome() {
      this.readyState = 1;
      this.send_({ type: "welcome", session_id: `s${sockets.indexOf(this) + 1}`, client_id: "unit", instance: "fake", ack_timeout_ms: 30000, max_in_flight: 1000 });
    }
    send_(frame) {
      this.onmessage?.({ data: JSON.stringify(frame) });
    }
    /** The frames the client sent with `op`. */
    ops(op) {
      return this.sent.filter((frame) => frame.op === op);
    }
    answer(op, frame) {
      this.send_({ ...frame, req: this.ops(op).at(-1).req });
    }
  }
  return { WebSocket: FakeWebSocket, socket: () => sockets.at(-1) };
}

// The store tells its components in a timer (a burst of events is one update): 5 ms lets it.
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

/** A client connected to a fake gateway, closed when test `t` ends (a failed one too). */
async function connected(t) {
  const gateway = fakeGateway();
  const client = new AckgateClient("ws://fake/ws", { clientId: "unit", WebSocket: gateway.WebSocket, heartbeatMs: 0, confirmEveryMs: 3_600_000 });
  const welcome = client.connect();
  gateway.socket().welcome();
  t.after(() => client.close());
  await welcome;
  return { client, gateway, socket: gateway.socket() };
}

const subscribed = (socket, topic) => socket.answer("subscribe", { type: "subscribed", topic, partitions: [{ partition: 0, from: 0, epoch: 0 }] });

/** The delivery ids of every ack frame sent. */
const acked = (socket) => socket.ops("ack").flatMap((frame) => frame.delivery_ids ?? [frame.delivery_id]);

/** A component's view: what useSyncExternalStore would render, updated when told. */
function mount(store) {
  const seen = { renders: 0 };
  const unmount = store.subscribe(() => seen.renders++);
  return { unmount, view: () => store.get(), seen };
}

test("react: two components on one topic share one subscription; it ends when the last one unmounts, and a StrictMode remount keeps it", async (t) => {
  const { client, socket } = await connected(t);
  // StrictMode mounts the first component, unmounts it and mounts it again, in one commit.
  mount(_topicStore(client, "t")).unmount();
  const a = mount(_topicStore(client, "t"));
  const b = mount(_topicStore(client, "t"));
  assert.equal(_topicStore(client, "t"), _topicStore(client, "t"), "one store per client and topic");
  await tick(5);
  assert.equal(socket.ops("subscribe").length, 1, "subscribed once for both");
  assert.equal(socket.ops("unsubscribe").length, 0);
  subscribed(socket, "t");
  socket.send_(event("t", 0));
  socket.send_(event("t", 1));
  await tick(5);
  for (const component of [a, b]) assert.deepEqual(component.view().events.map((e) => e.offset), [0, 1]);
  assert.equal(a.seen.renders, 1, "a burst is one update");

  // Remounted (a's place taken by another in one commit): the subscription and its events stay.
  a.unmount();
  const again = mount(_topicStore(client, "t"));
  b.unmount();
  await tick(5);
  assert.equal(socket.ops("unsubscribe").length, 0);
  assert.equal(socket.ops("subscribe").length, 1);
  assert.deepEqual(again.view().events.map((e) => e.offset), [0, 1]);

  again.unmount();
  await tick(5);
  assert.deepEqual(socket.ops("unsubscribe").map((f) => f.topic), ["t"], "the last one unsubscribes");
  assert.deepEqual(_topicStore(client, "t").get().events, [], "and the events go");

  // Mounted again later: subscribed again.
  const later = mount(_topicStore(client, "t"));
  await tick(5);
  assert.equal(socket.ops("subscribe").length, 2);
  later.unmount();
});

test("react: at most `limit` events are kept, the newest; ack 'rendered' acks what was rendered once, and what was dropped before it was rendered at once", async (t) => {
  const { client, socket } = await connected(t);
  const store = _topicStore(client, "t", { limit: 3 });
  const view = mount(store);
  await tick(5);
  subscribed(socket, "t");
  for (let offset = 0; offset < 5; offset++) socket.send_(event("t", offset));
  await tick(5);
  assert.deepEqual(view.view().events.map((e) => e.offset), [2, 3, 4], "the newest 3");
  assert.deepEqual(acked(socket), ["t.0", "t.1"], "dropped, never to be shown: acked so the window does not fill");
  // The hook's effect after the commit (each component's: the second acks nothing).
  store.rendered(view.view().events);
  store.rendered(view.view().events);
  assert.deepEqual(acked(socket), ["t.0", "t.1", "t.2", "t.3", "t.4"]);
  // A redelivery takes its earlier copy's place and is acked once rendered.
  socket.send_(event("t", 3, { delivery_id: "t.3.again", attempt: 2 }));
  await tick(5);
  assert.deepEqual(view.view().events.map((e) => e.delivery_id), ["t.2", "t.3.again", "t.4"]);
  store.rendered(view.view().events);
  assert.deepEqual(acked(socket).slice(5), ["t.3.again"]);
  view.unmount();
});

test("react: ack 'manual' acks nothing by itself; ack(event) acks it once; a refused subscribe is the view's error", async (t) => {
  const { client, socket } = await connected(t);
  const store = _topicStore(client, "m", { limit: 1, ack: "manual" });
  const view = mount(store);
  await tick(5);
  subscribed(socket, "m");
  socket.send_(event("m", 0));
  socket.send_(event("m", 1));
  await tick(5);
  store.rendered(view.view().events);
  assert.deepEqual(acked(socket), [], "neither the dropped one nor the rendered one");
  view.view().ack(view.view().events[0]);
  view.view().ack(view.view().events[0]);
  assert.deepEqual(acked(socket), ["m.1"]);
  assert.throws(() => _topicStore(client, "x", { limit: 0 }), TypeError);

  const refused = mount(_topicStore(client, "nope"));
  await tick(5);
  socket.answer("subscribe", { type: "error", code: "forbidden", message: "not yours" });
  await tick(5);
  assert.equal(refused.view().error?.code, "forbidden");
  view.unmount();
  refused.unmount();
});

test("react: a client closed and connected again (a new token after a refusal) is subscribed again for the components still mounted", async (t) => {
  const { client, gateway, socket } = await connected(t);
  const view = mount(_topicStore(client, "t"));
  await tick(5);
  subscribed(socket, "t");
  client.close();
  await tick(5);
  const welcome = client.connect();
  gateway.socket().welcome();
  await welcome;
  await tick(5);
  assert.notEqual(gateway.socket(), socket);
  assert.deepEqual(gateway.socket().ops("subscribe").map((f) => f.topic), ["t"]);
  subscribed(gateway.socket(), "t");
  gateway.socket().send_(event("t", 0));
  await tick(5);
  assert.deepEqual(view.view().events.map((e) => e.offset), [0]);
  view.unmount();
});

test("react: the hooks render on the server (no subscription there), and need a provider", async (t) => {
  const { client, socket } = await connected(t);
  function Orders() {
    const { state } = useAckgateState();
    const { events } = useTopic("ssr");
    return createElement("p", null, `${state}: ${events.length} events`);
  }
  const html = renderToString(createElement(AckgateProvider, { client }, createElement(Orders)));
  assert.equal(html, "<p>connected: 0 events</p>");
  await tick(5);
  assert.equal(socket.ops("subscribe").length, 0);
  assert.throws(() => renderToString(createElement(Orders)), /AckgateProvider/);
});
