// ackgate-client 0.1.0: the JavaScript client of ackgate (https://github.com/ackgate), an ES
// module without dependencies for browsers and Node.js 20+ (`node --experimental-websocket`, or
// Node 22). Licensed under the Apache License, Version 2.0 (LICENSE in the ackgate repository).
//
//   import { AckgateClient } from "ackgate-client";   // or "/static/ackgate.js" from a gateway
//   const client = new AckgateClient("ws://127.0.0.1:8080/ws", { clientId: "alice" });
//   await client.connect();
//   await client.subscribe("orders");
//   for await (const event of client.events()) { ...; client.ack(event.delivery_id); }
//
// Frames are those of ackgate's docs/protocol.md. Requests that expect an answer (subscribe,
// unsubscribe, confirmed acks, ping) return promises settled by the frame carrying the same
// `req`, rejected by an `error` frame with it, and rejected at once when the socket closes or is
// not open.
//
// Acks: a plain ack by default (the gateway batches its offset writes), and at most every
// `confirmEveryMs` per partition one confirmed ack whose `ack_ok` says what is durable; the
// newest of those is the resume token. A partition acked since its last confirmation gets a
// trailing confirmation `confirmEveryMs` later, so the token trails the acks by about that much.
//
// Following a takeover: on any close that is not final (final: 1008, 4001, or close() called
// here) the client reconnects by itself, with exponential backoff and jitter (or after the pause
// a draining instance names). Each attempt asks `GET /session/recommend` of an instance it knows
// (the one it was given, `peers`, and every instance an answer named), connects to the instance
// named, and subscribes again to every topic with its resume token: per partition the offset
// after the contiguous acknowledged floor as the gateway confirmed it durable, or where the
// subscription started. The new instance starts at the larger of that and its own stored
// offset: nothing confirmed comes back, nothing unconfirmed is skipped. After an operator's
// disconnect (4002) no token is sent: the operator may have reset the client's offsets.

/** Closes after which a client must not reconnect by itself: 1008 auth, 4001 taken over. */
export const FINAL_CLOSES = new Set([1008, 4001]);

/** Error codes after which a subscription is dropped instead of tried again. */
export const FINAL_SUBSCRIBE_ERRORS = new Set(["unknown_topic", "forbidden", "invalid_name"]);

/** Close 4002: disconnected by an operator. */
const OPERATOR_CLOSE = 4002;

/** "ws://host:8080/ws" -> "http://host:8080". */
function httpBase(wsUrl) {
  return wsUrl.replace(/^ws/, "http").replace(/\/ws\/?$/, "").replace(/\/+$/, "");
}

export class AckgateError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
  }
}

export class AckgateClient {
  /**
   * @param {string} url the /ws URL without query, e.g. "ws://host:8080/ws"
   * @param {import("./index.d.ts").AckgateClientOptions} options
   */
  constructor(url, options) {
    if (!options?.clientId) throw new TypeError("options.clientId is required");
    this.url = url;
    this.options = options;
    this.socket = null;
    this.welcome = null;
    this.nextReq = 1;
    this.pending = new Map();
    this.inFlight = new Map(); // delivery_id -> event
    this.subscriptions = new Map(); // topic -> the options it was subscribed with
    this.known = new Set([httpBase(url), ...(options.peers || []).map((u) => u.replace(/\/+$/, ""))]);
    this.closedHere = false;
    this.reconnecting = false;
    this.lastConfirmed = new Map(); // "topic\0partition" -> ms of the last confirmed ack
    this.unconfirmed = new Map(); // "topic\0partition" -> the newest delivery_id acked since
    this.trailing = null; // timer of the trailing confirmations
    this.queue = []; // events waiting for an `events()` reader
    this.readers = []; // `events()` readers waiting for an event
    this.storageKey = `ackgate:${options.clientId}:resume`;
    this.committed = this.#loadToken(); // topic -> partition -> durable committed offset
  }

  /** Opens the socket; resolves with the welcome frame. */
  connect() {
    this.closedHere = false;
    return this.#open(this.url);
  }

  async #open(url) {
    const query = new URLSearchParams({ client_id: this.options.clientId });
    const token = this.options.tokenProvider ? await this.options.tokenProvider() : this.options.token;
    if (token) query.set("token", token);
    return new Promise((resolve, reject) => {
      const socket = new WebSocket(`${url}?${query}`);
      this.socket = socket;
      let welcomed = false;
      socket.onmessage = (message) => {
        if (socket !== this.socket) return;
        const frame = JSON.parse(message.data);
        if (frame.type === "welcome") {
          welcomed = true;
          this.url = url;
          this.known.add(httpBase(url));
          this.welcome = frame;
          resolve(frame);
        }
        this.#dispatch(frame);
      };
      socket.onerror = () => {
        if (!welcomed) reject(new AckgateError("unavailable", `WebSocket connection to ${url} failed`));
      };
      socket.onclose = (close) => {
        if (socket !== this.socket) return;
        this.lastClose = close.code;
        this.#failPending(`socket closed (${close.code})`);
        // Deliveries of the old session are gone with it; their offsets stay unacknowledged in
        // the resume token until they come again and are acknowledged.
        this.inFlight.clear();
        this.unconfirmed.clear();
        if (close.code === OPERATOR_CLOSE) this.#forgetTokens();
        const final = this.closedHere || FINAL_CLOSES.has(close.code) || this.options.reconnect === false;
        this.options.onClose?.({ code: close.code, reason: close.reason, final });
        if (!welcomed) reject(new AckgateError("closed", `socket closed (${close.code}) before the welcome`));
        else if (!final) this.#reconnect();
        if (final) this.#endEvents();
      };
    });
  }

  /** Reconnects until it succeeds or a final close: recommend, connect, resubscribe with tokens. */
  async #reconnect() {
    if (this.reconnecting) return;
    this.reconnecting = true;
    const base = this.options.backoffMs ?? 250;
    const max = this.options.maxBackoffMs ?? 10000;
    for (let attempt = 1; !this.closedHere; attempt++) {
      // A draining instance says when to come back (a `reconnect` frame, then close 1012).
      const told = attempt === 1 ? this.reconnectAfterMs : undefined;
      this.reconnectAfterMs = undefined;
      const delayMs = told ?? Math.round(Math.min(max, base * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2));
      await new Promise((r) => setTimeout(r, delayMs));
      if (this.closedHere) break;
      let url = this.url;
      try {
        const { named, answered } = await this.#recommended();
        url = named;
        this.options.onReconnect?.({ attempt, delayMs, url });
        let welcome;
        try {
          welcome = await this.#open(named);
        } catch (error) {
          // The instance named is unreachable (the one that answered may not have noticed it
          // died yet): the instance that answered is alive, so use it. Not after a final close.
          if (answered === named || FINAL_CLOSES.has(this.lastClose)) throw error;
          url = answered;
          welcome = await this.#open(answered);
        }
        await this.#resubscribe();
        this.options.onReconnect?.({ attempt, url, welcome });
        this.reconnecting = false;
        return;
      } catch (error) {
        this.options.onReconnect?.({ attempt, delayMs, url, error: error.message });
        if (FINAL_CLOSES.has(this.lastClose)) break;
        // A socket that opened but could not resubscribe is dropped before the next attempt.
        if (this.socket?.readyState === WebSocket.OPEN) this.socket.close(1000, "resubscribe failed");
      }
    }
    this.reconnecting = false;
  }

  /** Subscribes again to every topic; one refused for good is dropped and reported. */
  async #resubscribe() {
    for (const [topic, options] of [...this.subscriptions]) {
      try {
        await this.subscribe(topic, { ...options, resume: this.resumeToken(topic) });
      } catch (error) {
        if (!FINAL_SUBSCRIBE_ERRORS.has(error.code)) throw error;
        this.subscriptions.delete(topic);
        this.options.onSubscriptionDropped?.({ topic, code: error.code, message: error.message });
      }
    }
  }

  /** The /ws URL the first instance that answers `/session/recommend` names, and its own. */
  async #recommended() {
    const query = new URLSearchParams({ client_id: this.options.clientId });
    for (const base of [...this.known]) {
      try {
        const response = await fetch(`${base}/session/recommend?${query}`, { signal: AbortSignal.timeout(2000) });
        if (!response.ok) continue;
        const answer = await response.json();
        if (answer.http_url) this.known.add(answer.http_url.replace(/\/+$/, ""));
        if (answer.ws_url) return { named: answer.ws_url, answered: `${base.replace(/^http/, "ws")}/ws` };
      } catch {
        // That instance is down or unreachable: ask the next one.
      }
    }
    throw new AckgateError("unavailable", "no known instance answered /session/recommend");
  }

  /**
   * Subscribes; remembered, so a reconnect subscribes again (with a resume token). Without an
   * explicit `resume`, a token kept in `storage` (from before a page reload) is sent.
   */
  async subscribe(topic, { from, resume } = {}) {
    const frame = { op: "subscribe", topic };
    if (from) frame.from = from;
    const token = resume ?? (this.options.storage ? this.committed[topic] : undefined);
    if (token && Object.keys(token).length > 0) frame.resume = token;
    const subscribed = await this.#request(frame);
    this.subscriptions.set(topic, from ? { from } : {});
    const committed = (this.committed[topic] ||= {});
    for (const { partition, from: start } of subscribed.partitions || []) {
      committed[partition] = Math.max(committed[partition] ?? 0, start);
    }
    this.#saveToken();
    return subscribed;
  }

  unsubscribe(topic) {
    this.subscriptions.delete(topic);
    return this.#request({ op: "unsubscribe", topic });
  }

  /**
   * Acknowledges one id or many. `{ confirm: true }` resolves once the offsets are durable
   * (`ack_ok`); otherwise the ack is plain, except that a partition not confirmed for
   * `confirmEveryMs` gets a confirmed one (its `ack_ok` refreshes the resume token).
   */
  ack(ids, { confirm = false } = {}) {
    const list = Array.isArray(ids) ? ids : [ids];
    const every = this.options.confirmEveryMs ?? 1000;
    const now = Date.now();
    let due = confirm;
    for (const id of list) {
      const event = this.inFlight.get(id);
      this.inFlight.delete(id);
      if (!event || event.redrive) continue; // a redriven event moves no offset
      const key = `${event.topic}\0${event.partition}`;
      if (now - (this.lastConfirmed.get(key) ?? 0) >= every) due = true;
      this.unconfirmed.set(key, id);
    }
    const frame = list.length === 1 ? { op: "ack", delivery_id: list[0] } : { op: "ack", delivery_ids: list };
    if (!due) {
      if (this.socket?.readyState === WebSocket.OPEN) this.#send(frame);
      this.#armTrailing(every);
      return Promise.resolve();
    }
    this.#confirming(list);
    const confirmed = this.#request(frame);
    if (confirm) return confirmed;
    confirmed.catch(() => {}); // a lost ack only means a redelivery
    return Promise.resolve();
  }

  /** The partitions of `ids` count as confirmed now. */
  #confirming(ids) {
    const now = Date.now();
    for (const [key, id] of [...this.unconfirmed]) {
      if (ids.includes(id)) {
        this.unconfirmed.delete(key);
        this.lastConfirmed.set(key, now);
      }
    }
  }

  /** Confirms, `every` ms from now, the partitions acked since their last confirmation. */
  #armTrailing(every) {
    if (this.trailing) return;
    this.trailing = setTimeout(() => {
      this.trailing = null;
      const ids = [...new Set(this.unconfirmed.values())];
      if (ids.length === 0 || this.socket?.readyState !== WebSocket.OPEN) return;
      // Acking an acknowledged event again is a no-op that still reports the durable floor.
      this.#confirming(ids);
      this.#request(ids.length === 1 ? { op: "ack", delivery_id: ids[0] } : { op: "ack", delivery_ids: ids }).catch(() => {});
    }, every);
  }

  nack(id, delayMs) {
    this.inFlight.delete(id);
    this.#send(delayMs === undefined ? { op: "nack", delivery_id: id } : { op: "nack", delivery_id: id, delay_ms: delayMs });
  }

  extend(id) {
    this.#send({ op: "extend", delivery_id: id });
  }

  term(id, reason) {
    this.inFlight.delete(id);
    this.#send(reason ? { op: "term", delivery_id: id, reason } : { op: "term", delivery_id: id });
  }

  ping() {
    return this.#request({ op: "ping" });
  }

  /**
   * Every event from now on, for `for await (const event of client.events())`; ends after a
   * final close. One reader at a time is the intended use (several share the events).
   */
  events() {
    this.eventsWanted = true;
    const client = this;
    return {
      [Symbol.asyncIterator]() {
        return this;
      },
      next() {
        if (client.queue.length > 0) return Promise.resolve({ value: client.queue.shift(), done: false });
        if (client.eventsEnded) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => client.readers.push(resolve));
      },
      return() {
        client.eventsWanted = false;
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }

  /** Closes for good: no reconnect follows. */
  close() {
    this.closedHere = true;
    clearTimeout(this.trailing);
    this.trailing = null;
    this.socket?.close(1000, "bye");
  }

  /**
   * The resume token of `topic`: per partition, the offset after the contiguous acknowledged
   * floor the gateway confirmed durable, or where the subscription started.
   */
  resumeToken(topic) {
    return { ...(this.committed[topic] || {}) };
  }

  #send(frame) {
    this.socket.send(JSON.stringify(frame));
  }

  #request(frame) {
    if (this.socket?.readyState !== WebSocket.OPEN) {
      return Promise.reject(new AckgateError("closed", "not connected"));
    }
    const req = this.nextReq++;
    return new Promise((resolve, reject) => {
      this.pending.set(req, { resolve, reject });
      this.#send({ ...frame, req });
    });
  }

  #failPending(why) {
    for (const { reject } of this.pending.values()) reject(new AckgateError("closed", why));
    this.pending.clear();
  }

  #endEvents() {
    this.eventsEnded = true;
    for (const resolve of this.readers.splice(0)) resolve({ value: undefined, done: true });
  }

  #loadToken() {
    try {
      return JSON.parse(this.options.storage?.getItem(this.storageKey) ?? "{}") || {};
    } catch {
      return {};
    }
  }

  #saveToken() {
    try {
      this.options.storage?.setItem(this.storageKey, JSON.stringify(this.committed));
    } catch {
      // A full or forbidden storage only costs the token's survival across a reload.
    }
  }

  /** After an operator's disconnect: the operator may have moved the offsets; no token stands. */
  #forgetTokens() {
    this.committed = {};
    this.#saveToken();
  }

  #dispatch(frame) {
    this.options.onFrame?.(frame);
    if (frame.type === "event") {
      this.inFlight.set(frame.delivery_id, frame);
      this.options.onEvent?.(frame);
      if (this.eventsWanted) {
        const reader = this.readers.shift();
        if (reader) reader({ value: frame, done: false });
        else this.queue.push(frame);
      }
      return;
    }
    if (frame.type === "reconnect") {
      this.reconnectAfterMs = frame.after_ms;
      return;
    }
    if (frame.type === "ack_ok") {
      for (const [topic, partitions] of Object.entries(frame.committed || {})) {
        const committed = (this.committed[topic] ||= {});
        for (const [partition, offset] of Object.entries(partitions)) committed[partition] = Math.max(committed[partition] ?? 0, offset);
      }
      this.#saveToken();
    }
    const waiting = frame.req !== undefined && this.pending.get(frame.req);
    if (waiting) {
      this.pending.delete(frame.req);
      if (frame.type === "error") waiting.reject(new AckgateError(frame.code, frame.message));
      else waiting.resolve(frame);
    } else if (frame.type === "error") {
      this.options.onError?.(frame);
    }
  }
}
