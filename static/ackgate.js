// ackgate browser client: a small ES module other apps can copy as it is (no dependencies).
//
//   import { AckgateClient } from "./ackgate.js";
//   const client = new AckgateClient("ws://127.0.0.1:8080/ws", { clientId: "alice", onEvent });
//   await client.connect();
//   await client.subscribe("orders");
//   function onEvent(event) { ...; client.ack(event.delivery_id); }
//
// Frames are those of ackgate's PROTOCOL.md. Requests that expect an answer (subscribe,
// unsubscribe, confirmed acks, ping) return promises resolved by the frame carrying the same
// `req`, or rejected by an `error` frame with it.
//
// Following a takeover: on any close that is not final (final: 1008, 4001, or close() called
// here) the client reconnects by itself, with exponential backoff and jitter. Each attempt asks
// `GET /session/recommend` of an instance it knows (the one it was given, `peers`, and every
// instance an answer named), connects to the instance named, and subscribes again to every topic
// with a resume token: per partition, the offset after its contiguous acknowledged floor as the
// gateway confirmed it durable (the `committed` of `ack_ok` frames; every ack carries a `req` so
// that each gets one), or where the subscription started. The new instance starts each partition
// at the larger of that and its own stored offset, so nothing confirmed comes back and nothing
// unconfirmed is skipped (an ack lost with the connection means one redelivery, never a gap).

/** Closes after which a client must not reconnect by itself (PROTOCOL.md): 1008 auth, 4001 taken over. */
export const FINAL_CLOSES = new Set([1008, 4001]);

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
   * @param {string} url      the /ws URL without query, e.g. "ws://host:8080/ws"
   * @param {object} options  clientId (required), token (JWT, optional), onEvent(event),
   *                          onError(error frame without req), onClose({code, reason, final}),
   *                          onFrame(frame), onReconnect({attempt, delayMs, url, error?}) before
   *                          each attempt and ({attempt, url, welcome}) after a success,
   *                          reconnect (default true), peers (other instances' http(s) base URLs),
   *                          backoffMs (first pause, 250), maxBackoffMs (10000)
   */
  constructor(url, options) {
    this.url = url;
    this.options = options;
    this.socket = null;
    this.welcome = null;
    this.nextReq = 1;
    this.pending = new Map();
    this.inFlight = new Map(); // delivery_id -> event
    this.committed = {}; // topic -> partition -> durable committed offset (or the subscription's start)
    this.subscriptions = new Map(); // topic -> the options it was subscribed with
    this.known = new Set([httpBase(url), ...(options.peers || []).map((u) => u.replace(/\/+$/, ""))]);
    this.closedHere = false;
    this.reconnecting = false;
  }

  /** Opens the socket; resolves with the welcome frame. */
  connect() {
    this.closedHere = false;
    return this.#open(this.url);
  }

  #open(url) {
    const query = new URLSearchParams({ client_id: this.options.clientId });
    if (this.options.token) query.set("token", this.options.token);
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
        for (const { reject: fail } of this.pending.values()) fail(new AckgateError("closed", `socket closed (${close.code})`));
        this.pending.clear();
        // Deliveries of the old session are gone with it; the offsets they hold stay unacknowledged
        // in the resume token until they come again and are acknowledged.
        this.inFlight.clear();
        const final = this.closedHere || FINAL_CLOSES.has(close.code) || this.options.reconnect === false;
        this.options.onClose?.({ code: close.code, reason: close.reason, final });
        if (!welcomed) reject(new AckgateError("closed", `socket closed (${close.code}) before the welcome`));
        else if (!final) this.#reconnect();
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
        for (const [topic, options] of this.subscriptions) {
          await this.subscribe(topic, { ...options, resume: this.resumeToken(topic) });
        }
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

  /** Subscribes; remembered, so a reconnect subscribes again (with a resume token). */
  async subscribe(topic, { from, resume } = {}) {
    const frame = { op: "subscribe", topic };
    if (from) frame.from = from;
    if (resume) frame.resume = resume;
    const subscribed = await this.#request(frame);
    this.subscriptions.set(topic, from ? { from } : {});
    const committed = (this.committed[topic] ||= {});
    for (const { partition, from: start } of subscribed.partitions || []) {
      committed[partition] = Math.max(committed[partition] ?? 0, start);
    }
    return subscribed;
  }

  unsubscribe(topic) {
    this.subscriptions.delete(topic);
    return this.#request({ op: "unsubscribe", topic });
  }

  /**
   * Acknowledges one id or many; with `{ confirm: true }` resolves once the offset is durable.
   * Every ack carries a `req`: its `ack_ok` tells the resume token what is durable.
   */
  ack(ids, { confirm = false } = {}) {
    const list = Array.isArray(ids) ? ids : [ids];
    for (const id of list) this.inFlight.delete(id);
    const frame = list.length === 1 ? { op: "ack", delivery_id: list[0] } : { op: "ack", delivery_ids: list };
    const confirmed = this.#request(frame);
    if (confirm) return confirmed;
    confirmed.catch(() => {}); // a lost ack only means a redelivery
    return Promise.resolve();
  }

  nack(id, delayMs = 0) {
    this.inFlight.delete(id);
    this.#send({ op: "nack", delivery_id: id, delay_ms: delayMs });
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

  /** Closes for good: no reconnect follows. */
  close() {
    this.closedHere = true;
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
    const req = this.nextReq++;
    return new Promise((resolve, reject) => {
      this.pending.set(req, { resolve, reject });
      this.#send({ ...frame, req });
    });
  }

  #dispatch(frame) {
    this.options.onFrame?.(frame);
    if (frame.type === "event") {
      this.inFlight.set(frame.delivery_id, frame);
      this.options.onEvent?.(frame);
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
