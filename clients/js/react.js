// ackgate-client/react: React bindings of ackgate-client (React 18 or later, a peer dependency).
//
//   <AckgateProvider client={client}> ... </AckgateProvider>
//   const { state, failure } = useAckgateState();
//   const { events, gaps, error, ack } = useTopic("orders", { limit: 100 }); // acked once rendered
//
// One store per client and topic holds the newest `limit` events; every component that uses the
// topic reads it, and the client subscribes once for all of them. Plain ESM without JSX, so it
// needs no build step. Licensed under the Apache License, Version 2.0.
import { createContext, createElement, useCallback, useContext, useEffect, useSyncExternalStore } from "react";

const ClientContext = createContext(null);

/**
 * Hands `client` to the hooks below it. The app makes the client (and connects and closes it):
 * its life is the page's, not a component's, which StrictMode mounts twice and React may
 * remount at will; a provider that opened its own connection would open two, and a second one of
 * the same client id takes the first over. (A subscribe made before `connect()` waits for it.)
 */
export function AckgateProvider({ client, children }) {
  return createElement(ClientContext.Provider, { value: client }, children);
}

/** The client of the nearest `<AckgateProvider>`. */
export function useAckgateClient() {
  const client = useContext(ClientContext);
  if (!client) throw new Error("ackgate-client/react: no <AckgateProvider client={client}> above this component");
  return client;
}

/** `{state, failure}` of the client, rendered again at each change. */
export function useAckgateState() {
  const client = useAckgateClient();
  const subscribe = useCallback(
    (changed) => {
      const offs = [client.on("state", changed), client.on("failed", changed)];
      return () => offs.forEach((off) => off());
    },
    [client],
  );
  const state = useSyncExternalStore(subscribe, () => client.state, () => client.state);
  const failure = useSyncExternalStore(subscribe, () => client.failure, () => client.failure);
  return { state, failure };
}

/**
 * The newest events of `topic` (at most `limit`, oldest first), its gaps, the subscribe's
 * error, and `ack(event)`. With `ack: "rendered"` (the default) each event is acked after a
 * render that showed it was committed, and one dropped from the list before that is acked as it
 * goes, so the gateway's window never fills; with `"manual"` the app acks (`ack(event)`) and an
 * event dropped unacked comes again after the ack timeout. The components of one client that
 * use one topic share one subscription: the first one's options hold until the last one unmounts.
 */
export function useTopic(topic, options = {}) {
  const store = _topicStore(useAckgateClient(), topic, options);
  const view = useSyncExternalStore(store.subscribe, store.get, store.get);
  // An effect runs once the render is committed: what it acks was on the screen.
  useEffect(() => store.rendered(view.events), [store, view]);
  return view;
}

const stores = new WeakMap(); // client -> topic -> TopicStore (gone with the client)

/** The store of `client`'s `topic`; `options` apply when nobody uses it yet. (Exported for the tests.) */
export function _topicStore(client, topic, options = {}) {
  let topics = stores.get(client);
  if (!topics) stores.set(client, (topics = new Map()));
  let store = topics.get(topic);
  if (!store) topics.set(topic, (store = new TopicStore(client, topic)));
  store.configure(options);
  return store;
}

class TopicStore {
  #client;
  #topic;
  #options = { limit: 100, ack: "rendered" };
  #users = 0; // subscribed components
  #listeners = new Set();
  #items = null; // the topic() iterator while subscribed
  #ended = false; // the client ended it (closed, or the topic dropped) while in use
  #offState = null;
  #closing = null; // the timer of the last user's unsubscribe
  #notifying = null;
  #events = [];
  #gaps = [];
  #error = null;
  #acked = new WeakSet(); // each event acked once, whichever component rendered it
  #view;

  constructor(client, topic) {
    this.#client = client;
    this.#topic = topic;
    this.#view = this.#snapshot();
  }

  configure({ from, limit = 100, ack = "rendered" }) {
    if (!(Number.isInteger(limit) && limit > 0)) throw new TypeError(`limit must be a positive integer, got ${limit}`);
    if (ack !== "rendered" && ack !== "manual") throw new TypeError(`ack must be "rendered" or "manual", got ${JSON.stringify(ack)}`);
    if (this.#users === 0 && !this.#items) this.#options = { from, limit, ack };
  }

  get = () => this.#view;

  subscribe = (listener) => {
    this.#listeners.add(listener);
    clearTimeout(this.#closing);
    this.#closing = null;
    if (this.#users++ === 0 && !this.#items) this.#open();
    return () => {
      this.#listeners.delete(listener);
      // Not at once: StrictMode's second mount, or a remount in the same commit, comes back
      // before the timer, and the subscription (with the events it holds) goes on.
      if (--this.#users === 0) this.#closing = setTimeout(() => this.#close(), 0);
    };
  };

  ack = (event) => this.#ack([event]);

  /** `events` were on the screen. */
  rendered(events) {
    if (this.#options.ack === "rendered") this.#ack(events);
  }

  #ack(events) {
    const fresh = events.filter((event) => !this.#acked.has(event));
    if (fresh.length === 0) return;
    for (const event of fresh) this.#acked.add(event);
    this.#client.ack(fresh.map((event) => event.delivery_id)).catch(() => {}); // lost: it comes again
  }

  #open() {
    // A final close (or close()) ends the topic's iterators; a later connect() starts over
    // without the subscription: take it up again then.
    this.#offState = this.#client.on("state", (state) => {
      if (state === "closed" || state === "failed") this.#ended = true;
      else if (state === "connecting" && this.#ended) this.#start();
    });
    this.#start();
  }

  #start() {
    this.#ended = false;
    this.#error = null;
    // The iterator first: events that come before the subscribe's answer wait in it.
    const items = (this.#items = this.#client.topic(this.#topic, { gaps: true }));
    const { from } = this.#options;
    this.#client.subscribe(this.#topic, from === undefined ? {} : { from }).catch((error) => {
      if (this.#items === items) this.#change(() => (this.#error = error));
    });
    void this.#read(items);
  }

  async #read(items) {
    for await (const item of items) {
      if (this.#items !== items) break;
      this.#change(() => (item.type === "gap" ? (this.#gaps = [...this.#gaps, item].slice(-this.#options.limit)) : this.#add(item)));
    }
    // Ended by the client while it is still up: a resubscribe refused for good.
    if (this.#items === items && !this.#ended && this.#client.state !== "closed" && this.#client.state !== "failed") {
      this.#change(() => (this.#error ??= new Error(`the subscription to ${this.#topic} was dropped`)));
    }
  }

  #add(event) {
    // A redelivery (after a reconnect, an ack timeout) takes its earlier copy's place.
    const at = this.#events.findIndex((e) => e.partition === event.partition && e.offset === event.offset);
    if (at >= 0) return (this.#events = this.#events.map((e, i) => (i === at ? event : e)));
    const events = [...this.#events, event];
    const dropped = events.splice(0, events.length - this.#options.limit);
    this.#events = events;
    this.rendered(dropped); // never to be shown: acked so the window does not fill
  }

  #close() {
    this.#closing = null;
    const items = this.#items;
    this.#items = null;
    this.#offState?.();
    items?.return();
    if (!this.#ended) this.#client.unsubscribe(this.#topic).catch(() => {});
    this.#ended = false;
    this.#change(() => {
      this.#events = [];
      this.#gaps = [];
      this.#error = null;
    });
  }

  /** Applies `update` and tells the components once per task: a burst of events is one render. */
  #change(update) {
    update();
    this.#notifying ??= setTimeout(() => {
      this.#notifying = null;
      this.#view = this.#snapshot();
      for (const listener of [...this.#listeners]) listener();
    }, 0);
  }

  #snapshot() {
    return { events: this.#events, gaps: this.#gaps, error: this.#error, ack: this.ack };
  }
}
