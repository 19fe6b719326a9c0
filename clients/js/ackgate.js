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
//
// Transports (`transport`): "websocket" (the default), "sse" or "auto". Over Server-Sent Events
// the session's frames come down `GET /sse` (an EventSource) and the client's go up as JSON
// arrays POSTed to the welcome's `ack_url`, one POST in flight at a time, the frames queued
// meanwhile sent together by the next. Every `event` message's id is the session's resume token
// (base64url of {"<topic>": {"<partition>": offset}}, durable); the client keeps it in the same
// per-topic map as the confirmed acks, and a reconnect opens the stream with `topics=` and
// `resume=` so the session subscribes again as it starts. "auto" tries a WebSocket and falls back
// to SSE when the socket fails before its welcome; once it fell back, the client stays on SSE.
// The rest of the client only sees a transport: `isOpen()`, `send(frame)`, `close(code, reason)`.

/** A random idempotency key (128 bits, hex). */
function randomKey() {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Closes after which a client must not reconnect by itself: 1008 auth, 4001 taken over. */
export const FINAL_CLOSES = new Set([1008, 4001]);

/** Error codes after which a subscription is dropped instead of tried again. */
export const FINAL_SUBSCRIBE_ERRORS = new Set(["unknown_topic", "forbidden", "invalid_name"]);

/** Close 4002: disconnected by an operator. */
const OPERATOR_CLOSE = 4002;

/** The transports `options.transport` names. */
const TRANSPORTS = new Set(["websocket", "sse", "auto"]);

/** The frames an SSE stream names (`event:`); EventSource hands a listener only the names it asked for. */
const SSE_EVENTS = ["welcome", "subscribed", "event", "gap", "reconnect", "error", "pong", "ack_ok", "unsubscribed", "close", "message"];

/** A longer query than this reopens a stream without its topics (they are subscribed by POST). */
const MAX_SSE_QUERY = 6000;

/** How long a POST's 404 waits for the stream's own close (a takeover's 4001 must win). */
const GONE_GRACE_MS = 1000;

/** "ws://host:8080/ws" -> "http://host:8080". */
function httpBase(wsUrl) {
  return wsUrl.replace(/^ws/, "http").replace(/\/ws\/?$/, "").replace(/\/+$/, "");
}

/**
 * `{"<topic>": {"<partition>": offset}}` -> an SSE resume token (base64url, no padding). A partition
 * whose offset epoch is not 0 is written `[offset, epoch]`.
 */
function encodeToken(token) {
  let binary = "";
  for (const byte of new TextEncoder().encode(JSON.stringify(token))) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

/** An SSE resume token (an event's id) -> `{"<topic>": {"<partition>": offset or [offset, epoch]}}`; null if it is not one. */
function decodeToken(text) {
  try {
    const binary = atob(text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4));
    const token = JSON.parse(new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0))));
    return token && typeof token === "object" ? token : null;
  } catch {
    return null;
  }
}

export class AckgateError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
  }
}

// A transport carries the frames of one session. It reports through `hooks`: `frame(frame)` for
// each server frame, `error(detail)` when the connection fails, `close({code, reason})` once at
// its end, and (SSE only) `refused(frames, code, message)` for a POST the gateway refused and
// `resume(offsets)` for each event's resume token. It has `isOpen()`, `send(frame)`, `close(code,
// reason)`, `abandon(reason)` (a dead connection: reported closed with 1006 at once, without
// waiting for a peer that answers nothing) and `ended` (settled once `close` was reported).

/** Frames both ways on one WebSocket. */
function webSocketTransport(url, query, hooks, WebSocketClass) {
  let socket = null;
  let endedNow;
  let abandoned = false;
  const transport = {
    kind: "websocket",
    ended: new Promise((resolve) => (endedNow = resolve)),
    isOpen: () => !abandoned && socket?.readyState === (WebSocketClass?.OPEN ?? 1),
    send: (frame) => socket?.send(JSON.stringify(frame)),
    close: (code, reason) => socket?.close(code, reason),
    abandon: (reason) => {
      if (abandoned) return;
      abandoned = true;
      try {
        socket?.close(4000, "abandoned");
      } catch {}
      hooks.close({ code: 1006, reason });
      endedNow();
    },
  };
  try {
    socket = new WebSocketClass(`${url}?${query}`);
  } catch (error) {
    // Refused at once (no WebSocket here, a URL the page may not open): a failed connection.
    setTimeout(() => {
      hooks.error(error.message);
      hooks.close({ code: 1006, reason: error.message });
      endedNow();
    });
    return transport;
  }
  socket.onmessage = (message) => hooks.frame(JSON.parse(message.data));
  socket.onerror = () => hooks.error();
  socket.onclose = (close) => {
    if (abandoned) return; // reported already
    hooks.close({ code: close.code, reason: close.reason });
    endedNow();
  };
  return transport;
}

/**
 * Server-Sent Events: the session's frames come down `GET /sse` (an EventSource); the client's
 * go up as JSON arrays POSTed to the welcome's `ack_url`, one POST in flight at a time (frames
 * queued meanwhile go together in the next). Any failure of the stream ends the transport: the
 * client reconnects by itself (EventSource's own reconnect would open a session without the
 * subscriptions made by POST).
 */
function sseTransport(url, query, hooks, { EventSourceClass, token, maxBatch }) {
  const base = httpBase(url);
  const aborter = new AbortController();
  let source = null;
  let ackUrl = null; // known from the welcome
  let ended = false;
  let gone = false; // a POST found no session: the stream's close is awaited a moment
  let queue = [];
  let posting = false;
  let flushing = false;
  let endedNow;
  const end = (close) => {
    if (ended) return;
    ended = true;
    queue = [];
    source?.close(); // else EventSource reconnects by itself
    aborter.abort();
    hooks.close(close);
    endedNow();
  };
  const lost = (reason) => {
    if (gone || ended) return;
    gone = true;
    queue = [];
    setTimeout(() => end({ code: 1006, reason }), GONE_GRACE_MS);
  };
  const schedule = () => {
    if (flushing || posting || ackUrl === null || queue.length === 0) return;
    flushing = true;
    queueMicrotask(flush);
  };
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  async function flush() {
    flushing = false;
    if (ended || gone || posting || queue.length === 0) return;
    posting = true;
    const frames = queue.splice(0, maxBatch);
    try {
      const response = await fetch(`${base}${ackUrl}`, { method: "POST", headers, body: JSON.stringify(frames), signal: aborter.signal });
      if (response.status === 404) return lost("the session is gone (POST 404)");
      const answer = await response.json().catch(() => null);
      if (ended) return;
      if (response.ok && Array.isArray(answer)) {
        for (const frame of answer) {
          if (ended) return;
          hooks.frame(frame);
        }
      } else {
        const error = answer?.error || {};
        hooks.refused(frames, error.code || "unavailable", error.message || `POST ${ackUrl}: HTTP ${response.status}`);
      }
    } catch (error) {
      if (!ended) lost(`POST ${ackUrl} failed: ${error.message}`);
      return;
    } finally {
      posting = false;
    }
    schedule();
  }
  const transport = {
    kind: "sse",
    ended: new Promise((resolve) => (endedNow = resolve)),
    isOpen: () => ackUrl !== null && !ended && !gone,
    send(frame) {
      if (ended || gone) return;
      queue.push(frame);
      schedule();
    },
    close: (code, reason) => end({ code, reason }),
    abandon: (reason) => end({ code: 1006, reason }),
  };
  try {
    source = new EventSourceClass(`${base}/sse?${query}`);
  } catch (error) {
    setTimeout(() => {
      hooks.error(error.message);
      end({ code: 1006, reason: error.message });
    });
    return transport;
  }
  for (const name of SSE_EVENTS) {
    source.addEventListener(name, (message) => {
      if (ended) return;
      // `error` is also EventSource's own event (no data): the stream failed or ended.
      if (name === "error" && typeof message.data !== "string") {
        hooks.error();
        end({ code: 1006, reason: "the event stream failed" });
        return;
      }
      const frame = JSON.parse(message.data);
      if (name === "close") {
        end({ code: frame.code, reason: frame.reason ?? "" });
        return;
      }
      if (frame.type === "welcome") ackUrl = frame.ack_url ?? `/sse/${encodeURIComponent(frame.session_id)}/frames`;
      if (frame.type === "event" && message.lastEventId) {
        const resume = decodeToken(message.lastEventId);
        if (resume) hooks.resume(resume);
      }
      hooks.frame(frame);
      schedule();
    });
  }
  return transport;
}

export class AckgateClient {
  /**
   * @param {string} url the /ws URL without query, e.g. "ws://host:8080/ws"
   * @param {import("./index.d.ts").AckgateClientOptions} options
   */
  constructor(url, options) {
    if (!options?.clientId) throw new TypeError("options.clientId is required");
    if (options.transport !== undefined && !TRANSPORTS.has(options.transport)) {
      throw new TypeError(`options.transport is "websocket", "sse" or "auto", not ${JSON.stringify(options.transport)}`);
    }
    if (options.transport === "sse" && !(options.EventSource ?? globalThis.EventSource)) {
      throw new TypeError('transport "sse" needs an EventSource: this runtime has none, pass options.EventSource');
    }
    this.url = url;
    this.options = options;
    this.transport = null; // the current transport (webSocketTransport or sseTransport)
    this.sseChosen = false; // "auto" fell back to SSE: it stays there
    this.welcome = null;
    this.nextReq = 1;
    this.pending = new Map(); // req (or "sub:<topic>" for a stream's own subscribe) -> promise
    this.initial = new Map(); // SSE: topic -> its subscribe by the stream's URL, answered without req
    this.inFlight = new Map(); // delivery_id -> event
    this.subscriptions = new Map(); // topic -> the options it was subscribed with
    this.known = new Set([httpBase(url), ...(options.peers || []).map((u) => u.replace(/\/+$/, ""))]);
    this.closedHere = false;
    this.reconnecting = false;
    this.lastConfirmed = new Map(); // "topic\0partition" -> ms of the last confirmed ack
    this.unconfirmed = new Map(); // "topic\0partition" -> the newest delivery_id acked since
    this.trailing = null; // timer of the trailing confirmations
    this.draining = false; // a `reconnect` frame came: every ack is confirmed until the next welcome
    this.queue = []; // events waiting for an `events()` reader (kept from the first subscribe on)
    this.buffering = false; // a subscribe was made: events are queued for a later events()
    this.outbox = []; // publishes not answered yet: sent again, with their key, after a reconnect
    this.heartbeat = null; // the timer of the pings that find a dead connection
    this.checking = false; // a heartbeat ping waits for its pong
    // In a page: back online, or shown again after a sleep, the connection is checked at once.
    if (typeof globalThis.addEventListener === "function") {
      globalThis.addEventListener("online", () => this.#checkAlive());
      globalThis.document?.addEventListener?.("visibilitychange", () => {
        if (globalThis.document.visibilityState === "visible") this.#checkAlive();
      });
    }
    this.readers = []; // `events()` readers waiting for an event
    this.storageKey = `ackgate:${options.clientId}:resume`;
    this.epochsKey = `ackgate:${options.clientId}:epochs`;
    this.committed = this.#load(this.storageKey); // topic -> partition -> durable committed offset
    // topic -> partition -> the offset epoch the gateway last named (`subscribed`, SSE ids): a
    // token is trusted above the stored offset only within its epoch, and a newer epoch (an
    // operator's reset, a lost log tail) replaces the token instead of being outbid by it.
    this.epochs = this.#load(this.epochsKey);
  }

  /** Opens the session; resolves with the welcome frame. */
  connect() {
    this.closedHere = false;
    return this.#open(this.url);
  }

  /**
   * Opens a session on `url` over the transport in use; "auto" falls back to SSE when the
   * WebSocket fails before its welcome. `resubscribing`: an SSE stream subscribes to the topics
   * (with their tokens) as it starts.
   */
  async #open(url, resubscribing = false) {
    const token = this.options.tokenProvider ? await this.options.tokenProvider() : this.options.token;
    const kind = this.sseChosen ? "sse" : (this.options.transport ?? "websocket");
    if (kind !== "auto") return this.#openWith(kind, url, token, resubscribing);
    try {
      return await this.#openWith("websocket", url, token, resubscribing);
    } catch (error) {
      await this.transport?.ended; // the failed socket's close is handled first
      if (this.closedHere || FINAL_CLOSES.has(this.lastClose) || !(this.options.EventSource ?? globalThis.EventSource)) throw error;
      const welcome = await this.#openWith("sse", url, token, resubscribing);
      this.sseChosen = true;
      return welcome;
    }
  }

  #openWith(kind, url, token, resubscribing) {
    const query = new URLSearchParams({ client_id: this.options.clientId });
    if (token) query.set("token", token);
    this.initial = new Map();
    if (kind === "sse" && resubscribing) this.#streamSubscribes(query);
    return new Promise((resolve, reject) => {
      let transport = null;
      let welcomed = false;
      const current = () => transport === this.transport;
      const hooks = {
        frame: (frame) => {
          if (!current()) return;
          if (frame.type === "welcome") {
            welcomed = true;
            this.draining = false;
            this.#startHeartbeat(transport);
            // Publishes waiting for a connection go out once the session is open.
            queueMicrotask(() => this.outbox.forEach((entry) => this.#sendPublish(entry)));
            this.url = url;
            this.known.add(httpBase(url));
            this.welcome = frame;
            resolve(frame);
          }
          this.#dispatch(frame);
        },
        error: (detail) => {
          const what = kind === "sse" ? `SSE connection to ${httpBase(url)}/sse` : `WebSocket connection to ${url}`;
          if (!welcomed) reject(new AckgateError("unavailable", `${what} failed${detail ? `: ${detail}` : ""}`));
        },
        close: (close) => {
          if (!current()) return;
          clearInterval(this.heartbeat);
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
          if (final) {
            this.#endEvents();
            for (const entry of this.outbox.splice(0)) entry.reject(new AckgateError("closed", `closed for good (${close.code})`));
          }
        },
        refused: (frames, code, message) => {
          if (!current()) return;
          let unanswered = false;
          for (const { req } of frames) {
            const waiting = req !== undefined && this.pending.get(req);
            if (waiting) {
              this.pending.delete(req);
              waiting.reject(new AckgateError(code, message));
            } else unanswered = true;
          }
          // Frames without req (plain acks: redelivered later) are reported as an error frame.
          if (unanswered) this.options.onError?.({ type: "error", code, message });
        },
        resume: (committed) => {
          if (current()) this.#advance(committed);
        },
      };
      transport =
        kind === "sse"
          ? sseTransport(url, query, hooks, {
              EventSourceClass: this.options.EventSource ?? globalThis.EventSource,
              token,
              maxBatch: Math.max(1, this.options.maxBatchFrames ?? 10000),
            })
          : webSocketTransport(url, query, hooks, this.options.WebSocket ?? globalThis.WebSocket);
      this.transport = transport;
    });
  }

  /**
   * SSE: the stream itself subscribes again (`topics=`, `from=`, `resume=` in its URL), which
   * answers on the stream without `req`: one `subscribed` or `error` per topic, in order. The
   * topics whose `from` differs from the first one's (or is a time) are subscribed by POST.
   */
  #streamSubscribes(query) {
    const fromOf = ([, options]) => options.from ?? "committed";
    // Shared subscriptions are joined by POST (the stream's URL subscribes topics directly).
    const entries = [...this.subscriptions].filter(([, options]) => !options.group);
    const from = entries.map(fromOf).find((f) => typeof f === "string");
    if (from === undefined) return;
    const topics = entries.filter((entry) => fromOf(entry) === from).map(([topic]) => topic);
    const token = {};
    for (const topic of topics) {
      if (Object.keys(this.committed[topic] || {}).length > 0) {
        const epochs = this.epochs[topic] || {};
        token[topic] = Object.fromEntries(Object.entries(this.resumeToken(topic)).map(([p, offset]) => [p, epochs[p] ? [offset, epochs[p]] : offset]));
      }
    }
    const extended = new URLSearchParams(query);
    extended.set("topics", topics.join(","));
    if (from !== "committed") extended.set("from", from);
    if (Object.keys(token).length > 0) extended.set("resume", encodeToken(token));
    if (extended.toString().length > MAX_SSE_QUERY) return;
    for (const [key, value] of extended) query.set(key, value);
    for (const topic of topics) {
      const answered = new Promise((resolve, reject) => this.pending.set(`sub:${topic}`, { resolve, reject }));
      answered.catch(() => {}); // awaited by #resubscribe once the stream is welcomed
      this.initial.set(topic, answered);
    }
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
        const sentTo = this.reconnectUrl;
        this.reconnectUrl = undefined;
        const { named, answered } = sentTo ? { named: sentTo, answered: sentTo } : await this.#recommended();
        url = named;
        this.options.onReconnect?.({ attempt, delayMs, url });
        let welcome;
        try {
          welcome = await this.#open(named, true);
        } catch (error) {
          // The instance named is unreachable (the one that answered may not have noticed it
          // died yet): the instance that answered is alive, so use it. Not after a final close.
          if (answered === named || FINAL_CLOSES.has(this.lastClose)) throw error;
          url = answered;
          welcome = await this.#open(answered, true);
        }
        await this.#resubscribe();
        this.options.onReconnect?.({ attempt, url, welcome });
        this.reconnecting = false;
        return;
      } catch (error) {
        this.options.onReconnect?.({ attempt, delayMs, url, error: error.message });
        if (FINAL_CLOSES.has(this.lastClose)) break;
        // A session that opened but could not resubscribe is dropped before the next attempt.
        if (this.transport?.isOpen()) this.transport.close(1000, "resubscribe failed");
      }
    }
    this.reconnecting = false;
  }

  /** Subscribes again to every topic; one refused for good is dropped and reported. */
  async #resubscribe() {
    for (const [topic, options] of [...this.subscriptions]) {
      try {
        const byStream = this.initial.get(topic);
        if (byStream) this.#subscribed(topic, options.from, await byStream);
        else await this.subscribe(topic, { ...options, resume: this.resumeToken(topic) });
      } catch (error) {
        if (!FINAL_SUBSCRIBE_ERRORS.has(error.code)) throw error;
        this.subscriptions.delete(topic);
        this.options.onSubscriptionDropped?.({ topic, code: error.code, message: error.message });
      }
    }
  }

  /** The /ws URL the first instance that answers `/session/recommend` names, and its own. */
  async #recommended() {
    // A member of a shared subscription goes where its group lives.
    const group = [...this.subscriptions.values()].find((o) => o.group)?.group;
    const query = new URLSearchParams(group ? { group } : { client_id: this.options.clientId });
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
  async subscribe(topic, { from, resume, epochs, group, order } = {}) {
    // Events that arrive before `events()` is iterated (during a second subscribe, say) wait
    // for it instead of coming back only after the ack timeout.
    this.buffering = true;
    const frame = { op: "subscribe", topic };
    if (from) frame.from = from;
    // A shared subscription: its token (from `ack_ok`s) is the group's floor, kept per topic.
    if (group) frame.group = group;
    if (order) frame.order = order;
    const token = resume ?? (this.options.storage ? this.committed[topic] : undefined);
    if (token && Object.keys(token).length > 0) {
      frame.resume = token;
      const known = epochs ?? this.epochs[topic] ?? {};
      frame.epochs = Object.fromEntries(Object.keys(token).filter((p) => known[p]).map((p) => [p, known[p]]));
    }
    const subscribed = await this.#request(frame);
    this.#subscribed(topic, from, subscribed, { group, order });
    return subscribed;
  }

  /** Remembers a subscription and where each of its partitions starts. */
  #subscribed(topic, from, subscribed, { group, order } = {}) {
    const options = from ? { from } : {};
    if (group) Object.assign(options, order ? { group, order } : { group });
    this.subscriptions.set(topic, options);
    for (const { partition, from: start, epoch } of subscribed.partitions || []) this.#learn(topic, partition, start, epoch ?? 0, true);
    this.#saveToken();
  }

  /**
   * A durable committed offset the gateway named, in offset epoch `epoch`: within the epoch the
   * token only moves up; a newer epoch (the offset was lowered) replaces it. A `subscribed`
   * (`planned`) names the partition's epoch as it stands now: any other epoch than the one
   * known replaces the token. True when it moved.
   */
  #learn(topic, partition, offset, epoch, planned = false) {
    const committed = (this.committed[topic] ||= {});
    const epochs = (this.epochs[topic] ||= {});
    const known = epochs[partition] ?? 0;
    if (epoch < known && !planned) return false;
    if (epoch !== known || committed[partition] === undefined || offset > committed[partition]) {
      committed[partition] = epoch !== known ? offset : Math.max(committed[partition] ?? 0, offset);
      if (epoch > 0) epochs[partition] = epoch;
      else delete epochs[partition];
      return true;
    }
    return false;
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
    // After a `reconnect` frame every ack is confirmed: the close comes once the token covers them.
    let due = confirm || this.draining;
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
      if (this.transport?.isOpen()) this.#send(frame);
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
    this.trailing = setTimeout(() => this.#confirmNow(), every);
  }

  /** Asks tokenProvider for a new token and sends it as `refresh`; a failure only means the
   * session closes with 4004 at its expiry and the client reconnects with a fresh token. */
  async #refreshToken() {
    if (!this.options.tokenProvider) return;
    try {
      const token = await this.options.tokenProvider();
      if (this.transport?.isOpen()) await this.#request({ op: "refresh", token });
    } catch (error) {
      this.options.onError?.({ type: "error", code: error?.code ?? "unauthorized", message: `token refresh failed: ${error?.message ?? error}` });
    }
  }

  /** Confirms the partitions acked since their last confirmation, now. */
  #confirmNow() {
    clearTimeout(this.trailing);
    this.trailing = null;
    const ids = [...new Set(this.unconfirmed.values())];
    if (ids.length === 0 || !this.transport?.isOpen()) return;
    // Acking an acknowledged event again is a no-op that still reports the durable floor.
    this.#confirming(ids);
    this.#request(ids.length === 1 ? { op: "ack", delivery_id: ids[0] } : { op: "ack", delivery_ids: ids }).catch(() => {});
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
   * Publishes one event (`{payload, key?, partition?, headers?}`) or a list of them to `topic`
   * over the session; resolves with the `published` frame (`offsets` in the order given).
   * While disconnected it waits (at most `maxQueuedPublishes`, default 100, publishes) and goes
   * out after the reconnect; each publish carries an idempotency key (`idempotencyKey`, or a
   * random one), so one sent again after a lost answer is never written twice.
   */
  publish(topic, events, { idempotencyKey } = {}) {
    if (this.closedHere || FINAL_CLOSES.has(this.lastClose)) {
      return Promise.reject(new AckgateError("closed", "the client is closed for good"));
    }
    const most = this.options.maxQueuedPublishes ?? 100;
    if (this.outbox.length >= most) {
      return Promise.reject(new AckgateError("limit_exceeded", `${most} publishes are waiting (maxQueuedPublishes)`));
    }
    const key = idempotencyKey ?? randomKey();
    return new Promise((resolve, reject) => {
      const entry = { topic, events: Array.isArray(events) ? events : [events], key, resolve, reject, sent: false };
      this.outbox.push(entry);
      this.#sendPublish(entry);
    });
  }

  /**
   * Every `heartbeatMs` (20000; 0: never) a ping that must be answered within
   * `heartbeatTimeoutMs` (10000), else the connection counts as dead (a laptop that slept, a
   * network switched, a proxy that black-holes it): it is abandoned and the client reconnects.
   */
  #startHeartbeat(transport) {
    clearInterval(this.heartbeat);
    const every = this.options.heartbeatMs ?? 20000;
    if (!every) return;
    this.heartbeat = setInterval(() => this.#checkAlive(transport), every);
    this.heartbeat.unref?.(); // never keeps node alive by itself
  }

  /** Pings now; no answer within `heartbeatTimeoutMs` abandons `transport`. */
  #checkAlive(transport = this.transport) {
    if (!transport?.isOpen() || transport !== this.transport || this.checking) return;
    this.checking = true;
    const limit = this.options.heartbeatTimeoutMs ?? 10000;
    const timer = setTimeout(() => transport.abandon(`no pong within ${limit} ms (heartbeatTimeoutMs)`), limit);
    this.#request({ op: "ping" })
      .catch(() => {})
      .finally(() => {
        clearTimeout(timer);
        this.checking = false;
      });
  }

  /** Sends a waiting publish if the session is open; one cut by a closed socket waits again. */
  #sendPublish(entry) {
    if (entry.sent || !this.transport?.isOpen() || !this.welcome) return;
    entry.sent = true;
    const done = () => {
      const at = this.outbox.indexOf(entry);
      if (at >= 0) this.outbox.splice(at, 1);
    };
    this.#request({ op: "publish", topic: entry.topic, events: entry.events, idempotency_key: entry.key }).then(
      (published) => {
        done();
        entry.resolve(published);
      },
      (error) => {
        entry.sent = false;
        if (error.code === "closed" && !this.closedHere && this.outbox.includes(entry)) return; // sent again after the reconnect
        done();
        entry.reject(error);
      },
    );
  }

  /**
   * Every event, for `for await (const event of client.events())`, those queued since the first
   * `subscribe()` first; ends after a final close. One reader at a time is the intended use
   * (several share the events).
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
    this.transport?.close(1000, "bye");
  }

  /**
   * The resume token of `topic`: per partition, the offset after the contiguous acknowledged
   * floor the gateway confirmed durable, or where the subscription started.
   */
  resumeToken(topic) {
    return { ...(this.committed[topic] || {}) };
  }

  /**
   * The offset epochs of `topic`'s resume token (`{"<partition>": epoch}`, partitions of epoch 0
   * left out): keep them with a token you store yourself and pass both to `subscribe`.
   */
  resumeEpochs(topic) {
    return { ...(this.epochs[topic] || {}) };
  }

  #send(frame) {
    this.transport?.send(frame);
  }

  #request(frame) {
    if (!this.transport?.isOpen()) {
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

  /** Queues an event for `events()`. Bounded by the window: past it, events no longer in flight
   * (acked, nacked or termed through `onEvent` by an app that never iterates) are dropped. */
  #enqueue(frame) {
    this.queue.push(frame);
    if (this.queue.length > (this.welcome?.max_in_flight ?? 1000)) this.queue = this.queue.filter((e) => this.inFlight.has(e.delivery_id));
  }

  #endEvents() {
    this.eventsEnded = true;
    for (const resolve of this.readers.splice(0)) resolve({ value: undefined, done: true });
  }

  #load(key) {
    try {
      return JSON.parse(this.options.storage?.getItem(key) ?? "{}") || {};
    } catch {
      return {};
    }
  }

  #saveToken() {
    try {
      this.options.storage?.setItem(this.storageKey, JSON.stringify(this.committed));
      this.options.storage?.setItem(this.epochsKey, JSON.stringify(this.epochs));
    } catch {
      // A full or forbidden storage only costs the token's survival across a reload.
    }
  }

  /**
   * Durable committed offsets (an `ack_ok`, an SSE event's id: an offset, or `[offset, epoch]`)
   * move the resume tokens up. An `ack_ok` names no epoch: its session's, which `subscribed` told.
   */
  #advance(offsets) {
    let moved = false;
    for (const [topic, partitions] of Object.entries(offsets)) {
      for (const [partition, value] of Object.entries(partitions)) {
        const [offset, epoch] = Array.isArray(value) ? value : [value, this.epochs[topic]?.[partition] ?? 0];
        if (this.#learn(topic, partition, offset, epoch)) moved = true;
      }
    }
    // Every SSE event carries a token: the storage is written only when one moved.
    if (moved) this.#saveToken();
  }

  /** The request `frame` answers, taken from `pending`. */
  #waiting(frame) {
    let key = frame.req;
    if (key === undefined && this.initial.size > 0) {
      // SSE: the stream's own subscribes are answered in order without req: `subscribed` names
      // its topic, an `error` is the first one still waiting.
      if (frame.type === "subscribed") key = `sub:${frame.topic}`;
      else if (frame.type === "error") key = [...this.pending.keys()].find((k) => typeof k === "string" && k.startsWith("sub:"));
    }
    const waiting = key !== undefined && this.pending.get(key);
    if (waiting) this.pending.delete(key);
    return waiting;
  }

  /** After an operator's disconnect: the operator may have moved the offsets; no token stands. */
  #forgetTokens() {
    this.committed = {};
    this.epochs = {};
    this.#saveToken();
  }

  #dispatch(frame) {
    this.options.onFrame?.(frame);
    if (frame.type === "event") {
      this.inFlight.set(frame.delivery_id, frame);
      this.options.onEvent?.(frame);
      if (this.eventsWanted || this.buffering) {
        const reader = this.readers.shift();
        if (reader) reader({ value: frame, done: false });
        else this.#enqueue(frame);
      }
      return;
    }
    if (frame.type === "refresh_needed") {
      // The session's token expires soon: a new one from tokenProvider replaces it in band
      // (`refresh`); without one the session closes with 4004 and the client reconnects.
      this.#refreshToken();
      return;
    }
    if (frame.type === "reconnect") {
      // The instance drains: it sends no new event and closes once what this client acked is
      // confirmed (server.drain_settle_ms), so the token taken elsewhere covers those acks.
      this.reconnectAfterMs = frame.after_ms;
      // A shared subscription's member sent to the instance its group lives on.
      if (frame.ws_url) this.reconnectUrl = frame.ws_url;
      this.draining = true;
      this.#confirmNow();
      return;
    }
    if (frame.type === "ack_ok") this.#advance(frame.committed || {});
    const waiting = this.#waiting(frame);
    if (waiting) {
      if (frame.type === "error") waiting.reject(new AckgateError(frame.code, frame.message));
      else waiting.resolve(frame);
    } else if (frame.type === "error") {
      this.options.onError?.(frame);
    }
  }
}
