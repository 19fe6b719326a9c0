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
// `req`, or rejected by an `error` frame with it. The client also keeps a resume token per topic
// (`{partition: next_offset}` of what it acknowledged) to pass back on a reconnect elsewhere.

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
   *                          onError(error frame without req), onClose({code, reason}), onFrame(frame)
   */
  constructor(url, options) {
    this.url = url;
    this.options = options;
    this.socket = null;
    this.welcome = null;
    this.nextReq = 1;
    this.pending = new Map();
    this.inFlight = new Map(); // delivery_id -> event
    this.resume = {}; // topic -> {partition: next offset}
  }

  /** Opens the socket; resolves with the welcome frame. */
  connect() {
    const query = new URLSearchParams({ client_id: this.options.clientId });
    if (this.options.token) query.set("token", this.options.token);
    return new Promise((resolve, reject) => {
      const socket = new WebSocket(`${this.url}?${query}`);
      this.socket = socket;
      socket.onmessage = (message) => {
        const frame = JSON.parse(message.data);
        if (frame.type === "welcome") {
          this.welcome = frame;
          resolve(frame);
        }
        this.#dispatch(frame);
      };
      socket.onerror = () => reject(new AckgateError("unavailable", "WebSocket connection failed"));
      socket.onclose = (close) => {
        for (const { reject: fail } of this.pending.values()) fail(new AckgateError("closed", `socket closed (${close.code})`));
        this.pending.clear();
        this.options.onClose?.({ code: close.code, reason: close.reason });
      };
    });
  }

  subscribe(topic, { from, resume } = {}) {
    const frame = { op: "subscribe", topic };
    if (from) frame.from = from;
    if (resume) frame.resume = resume;
    return this.#request(frame);
  }

  unsubscribe(topic) {
    return this.#request({ op: "unsubscribe", topic });
  }

  /** Acknowledges one id or many; with `{ confirm: true }` resolves once the offset is durable. */
  ack(ids, { confirm = false } = {}) {
    const list = Array.isArray(ids) ? ids : [ids];
    for (const id of list) this.#settled(id, true);
    const frame = list.length === 1 ? { op: "ack", delivery_id: list[0] } : { op: "ack", delivery_ids: list };
    if (confirm) return this.#request(frame);
    this.#send(frame);
    return Promise.resolve();
  }

  nack(id, delayMs = 0) {
    this.#settled(id, false);
    this.#send({ op: "nack", delivery_id: id, delay_ms: delayMs });
  }

  extend(id) {
    this.#send({ op: "extend", delivery_id: id });
  }

  term(id, reason) {
    this.#settled(id, true);
    this.#send(reason ? { op: "term", delivery_id: id, reason } : { op: "term", delivery_id: id });
  }

  ping() {
    return this.#request({ op: "ping" });
  }

  close() {
    this.socket?.close(1000, "bye");
  }

  /** The resume token of `topic`: next offset per partition after what was acknowledged here. */
  resumeToken(topic) {
    return { ...(this.resume[topic] || {}) };
  }

  #settled(id, acknowledged) {
    const event = this.inFlight.get(id);
    if (!event) return;
    this.inFlight.delete(id);
    if (acknowledged) {
      const token = (this.resume[event.topic] ||= {});
      token[event.partition] = Math.max(token[event.partition] ?? 0, event.offset + 1);
    }
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
