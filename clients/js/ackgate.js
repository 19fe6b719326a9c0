// ackgate-client 0.3.0: the JavaScript client of ackgate (https://github.com/ackgate/ackgate), an
// ES module without dependencies for browsers and Node.js 20.10+ (`node --experimental-websocket`
// before Node 22, or `options.WebSocket`). Licensed under the Apache License, Version 2.0 (LICENSE
// in the ackgate repository). Its changes: CHANGELOG.md; `version` says which this is.
//
//   import { AckgateClient } from "ackgate-client";   // or "/static/ackgate.js" from a gateway
//   const client = new AckgateClient("ws://127.0.0.1:8080/ws", { clientId: "alice" });
//   await client.connect();
//   await client.subscribe("orders");
//   for await (const event of client.events()) { ...; client.ack(event.delivery_id); }
//
// Layout: `AckgateClient` is what the app holds: its listeners (`on`, `off`, the `onX` options),
// its state, the iterators (`events()`, `topic()`) and the topics this page asked for. The
// session itself (a `Session`: transport, requests, acks, tokens, reconnects) is either its own
// or, when tabs of one origin share a client id, the one of the leader tab (TabGroup); a Session
// reports through one function, `emit(kind, data)`, whose data a BroadcastChannel can carry.
//
// Frames are those of ackgate's docs/protocol.md. Requests that expect an answer (subscribe,
// unsubscribe, confirmed acks, ping, publish) return promises settled by the frame carrying the
// same `req`, rejected by an `error` frame with it, rejected at once when the socket closes or is
// not open, and rejected with `timeout` after `requestTimeoutMs` without an answer. Subscribes and
// publishes wait instead while there is no session (before connect(), while connecting or
// reconnecting) and go out after the next welcome; they reject at close() or a final close.
//
// Acks: a plain ack by default (the gateway batches its offset writes), and at most every
// `confirmEveryMs` per partition one confirmed ack whose `ack_ok` says what is durable and carries
// the topic's resume token, issued by the gateway (opaque: kept and sent back as it came, per
// topic, and per topic and group for a shared subscription). A partition acked since its last confirmation gets a
// trailing confirmation `confirmEveryMs` later, so the token trails the acks by about that much.
//
// Refused for good (1008: credentials refused, the reason in an `error` frame before it; 4001:
// taken over by a newer session of the client id) the client fails: the state "failed", with
// `failure` {code, message, closeCode} and a `failed` event; `connect()` starts over.
//
// Following a takeover: on any close that is not final (final: 1008, 4001, or close() called
// here; 4004, an expired token, is not) the client reconnects by itself, with exponential backoff
// and jitter (or after the pause a draining instance names); a first connect() that fails is tried
// again the same way (a page may load before its gateway is up). Each attempt asks `GET
// /session/recommend` of an instance it knows (the one it was given, `peers`, and every instance
// an answer named), connects to the instance named, and subscribes again to every topic with the
// newest resume token the gateway issued for it (`subscribed`, `ack_ok`, `progress`): per
// partition the offset after the contiguous acknowledged floor as the gateway confirmed it
// durable, or where the subscription started. The new instance starts at the larger of that and
// its own stored offset: nothing confirmed comes back, nothing unconfirmed is skipped. (Without an
// issued token, its own subscription only: the confirmed offsets, a claim the gateway clamps.)
// After an operator's disconnect (4002) no token is sent: the operator may have reset the offsets.
// Back online (or the page shown again), a reconnect waiting out its backoff goes at once;
// offline, or in the back/forward cache (pagehide, `persisted`; where a page with an open
// connection or a Web Lock is not kept), the connection is closed and no attempt is made until
// online or pageshow. The heartbeat goes by the wall clock and any frame: a throttled or frozen
// tab's late timer does not give a live connection up. The deliveries of a session end with it: acks (nacks, terms, extends) of events that came in an
// earlier session are not sent (the gateway delivers them again, and an id is unique on one
// instance only). A close 1009 (a frame too large) rejects the largest publish in flight with
// `limit_exceeded` instead of sending it again after every reconnect.
//
// Transports (`transport`): "websocket" (the default), "sse" or "auto". Over Server-Sent Events
// the session's frames come down `GET /sse` (an EventSource) and the client's go up as JSON
// arrays POSTed to the welcome's `ack_url`, one POST in flight at a time, the frames queued
// meanwhile sent together by the next. Every `event` message's id is the session's resume token,
// issued by the gateway for all of the stream's topics (the older form, base64url of
// {"<topic>": {"<partition>": offset}}, is still read); the client keeps it, reads the offsets it
// names into the same per-topic map as the confirmed acks, and a reconnect opens the stream with
// `topics=` and `resume=` (that id) so the session subscribes again as it starts. "auto" tries a WebSocket and falls back
// to SSE when the socket fails before its welcome; once it fell back, the client stays on SSE.
// The rest of the client only sees a transport: `isOpen()`, `send(frame)`, `close(code, reason)`.
//
// `debug` (true: console.debug; or a function) logs what the session reports to the client
// (frames received, states, closes, reconnects, ...) and each frame it sends; off, a test a frame.

/** This package's version (package.json's; a unit test keeps them equal). */
export const version = "0.3.0";

/** Logs for the `debug` option (true: to console.debug), called only when it is set: off, a
 * frame costs one test. */
function log(debug, what, data) {
  if (debug === true) console.debug("ackgate", what, data);
  else debug(what, data);
}

/** A random idempotency key (128 bits, hex). */
function randomKey() {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * A set nobody can change (the `ReadonlySet` of index.d.ts): the client decides with the sets
 * below, so an app that added to them would change what the client does. No `add`, `delete` or
 * `clear`, and no way around it (a Set subclass would still yield to `Set.prototype.add.call`).
 */
class FrozenSet {
  #items;
  constructor(items) {
    this.#items = new Set(items);
    Object.freeze(this);
  }
  get size() {
    return this.#items.size;
  }
  has(value) {
    return this.#items.has(value);
  }
  forEach(callback, thisArg) {
    for (const value of this.#items) callback.call(thisArg, value, value, this);
  }
  keys() {
    return this.#items.keys();
  }
  values() {
    return this.#items.values();
  }
  entries() {
    return this.#items.entries();
  }
  [Symbol.iterator]() {
    return this.#items.values();
  }
}

/** Closes after which a client must not reconnect by itself: 1008 auth, 4001 taken over. (4004,
 * an expired token, is not final: the client reconnects with a token from `tokenProvider`.) */
export const FINAL_CLOSES = new FrozenSet([1008, 4001]);

/** Error codes after which a subscription is dropped instead of tried again. */
export const FINAL_SUBSCRIBE_ERRORS = new FrozenSet(["unknown_topic", "forbidden", "invalid_name"]);

/** Close 4002: disconnected by an operator. */
const OPERATOR_CLOSE = 4002;

/** The transports `options.transport` names. */
const TRANSPORTS = ["websocket", "sse", "auto"];

/** The frames an SSE stream names (`event:`); EventSource hands a listener only the names it asked for. */
const SSE_EVENTS = ["welcome", "subscribed", "event", "gap", "reconnect", "error", "pong", "ack_ok", "unsubscribed", "close", "message"];

/** The window's events the client follows in a page (with document's visibilitychange). */
const PAGE_EVENTS = ["online", "offline", "pagehide", "pageshow"];

/** A longer query than this reopens a stream without its topics (they are subscribed by POST). */
const MAX_SSE_QUERY = 6000;

/** How long a POST's 404 waits for the stream's own close (a takeover's 4001 must win). */
const GONE_GRACE_MS = 1000;

/** What `on(name)` takes, and the option called for each (`onEvent`, ...). */
const LISTENED = { event: "onEvent", state: "onState", gap: "onGap", error: "onError", close: "onClose", reconnect: "onReconnect", frame: "onFrame", stalled: "onStalled", failed: "onFailed" };

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

/**
 * Calls an app's listener. One that throws does not stop the client: its error is reported as an
 * uncaught one (reportError, in a page), or on the console where there is no reportError
 * (Node.js, where an error thrown again would be an uncaught exception that ends the process).
 */
function invoke(listener, value) {
  try {
    listener?.(value);
  } catch (error) {
    report(error, "a listener threw");
  }
}

/** An app's error, reported as `invoke` says. */
function report(error, what) {
  if (globalThis.reportError) globalThis.reportError(error);
  else console.error(`ackgate-client: ${what}:`, error);
}

/**
 * Moves `tokens` ({committed, epochs}) to a durable committed offset the gateway named for a
 * partition, in offset epoch `epoch`: within the epoch a token only moves up; a newer epoch (the
 * offset was lowered: an operator's reset, a lost log tail) replaces it. A `subscribed`
 * (`planned`) names the partition's epoch as it stands now: any other epoch than the one known
 * replaces the token. True when it moved.
 */
function learn(tokens, topic, partition, offset, epoch, planned = false) {
  const committed = (tokens.committed[topic] ||= {});
  const epochs = (tokens.epochs[topic] ||= {});
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

/**
 * What a token the gateway issued (`r1.` + base64url) names, read without its MAC (the gateway
 * checks that): `{"<topic>": {"<partition>": [offset, epoch]}}`, or null if it is not one. Numbers
 * above 2^53 lose precision; offsets and epochs stay below it.
 */
function readIssued(text) {
  if (!text.startsWith("r1.")) return null;
  let bytes;
  try {
    const body = text.slice(3);
    bytes = Uint8Array.from(atob(body.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((body.length + 3) % 4)), (c) => c.charCodeAt(0));
  } catch {
    return null;
  }
  let at = 0;
  const end = bytes.length - 16; // the MAC
  const number = () => {
    let n = 0;
    for (let scale = 1; at < end; scale *= 128) {
      const b = bytes[at++];
      n += (b & 0x7f) * scale;
      if ((b & 0x80) === 0) return n;
    }
    throw new Error("truncated");
  };
  const text8 = () => {
    const length = number();
    const value = new TextDecoder().decode(bytes.subarray(at, at + length));
    at += length;
    return value;
  };
  try {
    if (bytes[at++] !== 1) return null;
    at++; // client or group
    text8(); // whose
    number(); // issued at
    const floors = {};
    for (let topics = number(); topics > 0; topics--) {
      const topic = text8();
      number(); // incarnation
      const partitions = (floors[topic] = {});
      for (let count = number(); count > 0; count--) {
        const partition = number();
        partitions[partition] = [number(), number()];
      }
    }
    return floors;
  } catch {
    return null;
  }
}

/** The key of a resume token the gateway issued: the topic's own, or its shared subscription's. */
function issuedKey(topic, group) {
  return group ? `${topic}\u0000${group}` : topic;
}

/** The key of an SSE stream's token (an event's id names every topic of the stream). */
const STREAM_TOKEN = "\u0001stream";

/** Another tab's tokens merged into `tokens` partition by partition, as `learn` moves them (never
 * taken whole: a tab's newer token would go back). True when one moved. */
function merge(tokens, other) {
  let moved = false;
  // Offsets partition by partition; an issued token (opaque) is taken with them: where this tab
  // has none, or where the other's offsets moved this tab's (it is then the newer of the two).
  const movedKeys = new Set();
  for (const [key, partitions] of Object.entries(other.committed || {})) {
    for (const [partition, offset] of Object.entries(partitions)) {
      if (learn(tokens, key, partition, offset, other.epochs?.[key]?.[partition] ?? 0)) {
        moved = true;
        movedKeys.add(key);
      }
    }
  }
  for (const [key, token] of Object.entries(other.issued || {})) {
    if (tokens.issued[key] !== token && (tokens.issued[key] === undefined || movedKeys.has(key))) {
      tokens.issued[key] = token;
      moved = true;
    }
  }
  return moved;
}

/** Keeps the tokens in `options.storage`, for the next page load. */
function store(options, tokens) {
  try {
    options.storage?.setItem(`ackgate:${options.clientId}:resume`, JSON.stringify(tokens.committed));
    options.storage?.setItem(`ackgate:${options.clientId}:epochs`, JSON.stringify(tokens.epochs));
    options.storage?.setItem(`ackgate:${options.clientId}:tokens`, JSON.stringify(tokens.issued));
  } catch {
    // A full or forbidden storage only costs the token's survival across a reload.
  }
}

/** The JSON kept under `key` in `storage`, or {}. */
function load(storage, key) {
  try {
    return JSON.parse(storage?.getItem(key) ?? "{}") || {};
  } catch {
    return {};
  }
}

export class AckgateError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
  }
}

/** The gateway's rule for a client id (docs/protocol.md). */
const CLIENT_ID = /^[A-Za-z0-9._:@-]{1,128}$/;

/** The random part of this device's client id, once made or read (see deviceClientId). */
let deviceId;

/**
 * A client id for this device (a browser profile): `prefix` and a random part made once and kept
 * in `localStorage` under "ackgate:device-id". Each device then keeps its own offsets, and a
 * second device does not take the first one's session over, as with `clientId: user.id` (see
 * docs/clients.md, "Choosing a client id"). Where there is no localStorage (Node.js, a frame that
 * may not use it) the random part lives in memory, for this page load (or process). A `prefix`
 * such as `${user.id}:` keeps two users of one device apart. The id obeys the gateway's rule,
 * `^[A-Za-z0-9._:@-]{1,128}$`: a prefix that would break it is a TypeError.
 */
export function deviceClientId(prefix = "") {
  try {
    const storage = globalThis.localStorage;
    const kept = storage?.getItem("ackgate:device-id");
    if (kept && /^[A-Za-z0-9._:@-]{1,64}$/.test(kept)) deviceId = kept;
    else storage?.setItem("ackgate:device-id", (deviceId ??= randomKey()));
  } catch {
    // A storage this page may not use (blocked, full): the id made here lives as long as the page.
  }
  const id = `${prefix}${(deviceId ??= randomKey())}`;
  if (!CLIENT_ID.test(id)) {
    throw new TypeError(`deviceClientId: ${JSON.stringify(id)} breaks the client id rule ${CLIENT_ID.source}`);
  }
  return id;
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
  let ended = false;
  // The close is reported once: the socket's, or an abandon's (which does not wait for the
  // socket's), so abandon() after the end (offline, the page hidden) is a no-op.
  const end = (close) => {
    if (ended) return;
    ended = true;
    hooks.close(close);
    endedNow();
  };
  const transport = {
    ended: new Promise((resolve) => (endedNow = resolve)),
    // (Closed or abandoned, the socket is no longer OPEN: abandon() closes it.)
    isOpen: () => socket?.readyState === (WebSocketClass?.OPEN ?? 1),
    send: (frame) => socket?.send(JSON.stringify(frame)),
    close: (code, reason) => socket?.close(code, reason),
    abandon: (reason) => {
      if (ended) return;
      try {
        socket?.close(4000, "abandoned");
      } catch {}
      end({ code: 1006, reason });
    },
  };
  try {
    socket = new WebSocketClass(`${url}?${query}`);
  } catch (error) {
    // Refused at once (no WebSocket here, a URL the page may not open): a failed connection.
    setTimeout(() => {
      hooks.error(error.message);
      end({ code: 1006, reason: error.message });
    });
    return transport;
  }
  // An abandoned socket may still bring frames: they belong to a session given up for dead.
  socket.onmessage = (message) => !ended && hooks.frame(JSON.parse(message.data));
  socket.onerror = () => hooks.error();
  socket.onclose = (close) => end({ code: close.code, reason: close.reason });
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
      if (frame.type === "event" && message.lastEventId) hooks.resume(message.lastEventId);
      hooks.frame(frame);
      schedule();
    });
  }
  return transport;
}


/**
 * One client's session with the gateway, kept alive across reconnects: transport, requests, acks
 * and their confirmations, resume tokens, publishes waiting for a connection, heartbeat. It
 * reports through `emit(kind, data)`: "frame" (every frame received), "state", "close",
 * "reconnect", "dropped" (a subscription refused for good at a resubscribe), "error" (an error
 * that answers no request) and "tokens" (the resume tokens moved).
 */
class Session {
  #url;
  #options;
  #tokens; // {committed, epochs}: topic -> partition -> offset / offset epoch (shared with the client)
  #emit;
  #transport = null; // the current transport (webSocketTransport or sseTransport)
  #sseChosen = false; // "auto" fell back to SSE: it stays there
  #welcome = null;
  #state = "closed";
  #nextReq = 1;
  #pending = new Map(); // req (or "sub:<topic>" for a stream's own subscribe) -> {resolve, reject}
  #initial = new Map(); // SSE: topic -> its subscribe by the stream's URL, answered without req
  // This session's deliveries not settled yet, by id: {key, topic, partition, redrive} (not whole
  // frames: payloads are the app's); and by event ("topic\0partition\0offset" -> the newest id):
  // a redelivery replaces the id before it, so superseded ids do not pile up.
  #inFlight = new Map();
  #newest = new Map();
  #subscriptions = new Map(); // topic -> the options it was subscribed with
  #asked = new Map(); // topic -> the newest subscribe() of it (an object of its own); unsubscribe() deletes it
  #known; // the http base URLs of every instance heard of, asked for /session/recommend
  // close() was called, or a close was final: nothing waits for a connection any more (until
  // the next connect()).
  #closedForGood = false;
  // Aborted (and replaced) by close(): what a run started before it still waits for (a
  // reconnect's backoff and recommend requests, a connect's tokenProvider) stops there, and no
  // session opens after close().
  #stop = new AbortController();
  #wake = null; // ends the reconnect's backoff sleep early (back online, close())
  #reconnecting = false;
  #lastClose;
  #reconnectAfterMs; // a draining instance's `reconnect` frame: when to come back
  #reconnectUrl; // ... and where (a shared subscription's group lives there)
  #lastConfirmed = new Map(); // "topic\0partition" -> ms of the last confirmed ack
  #unconfirmed = new Map(); // "topic\0partition" -> the newest delivery_id acked since
  #trailing = null; // timer of the trailing confirmations
  #draining = false; // a `reconnect` frame came: every ack is confirmed until the next welcome
  #outbox = []; // publishes not answered yet: sent again, with their key, after a reconnect
  // subscribe() calls not answered yet, {topic, options, resolve, reject, sent}: made before the
  // session was up, or cut by a lost connection, they go out after the next welcome.
  #subscribes = new Set();
  #heartbeat = null; // the timer of the pings that find a dead connection
  #checking = null; // the timer of a ping that checks the connection: any frame clears it
  #paused = false; // the page is in the back/forward cache: no attempt until it is shown again
  #run; // the latest connect() call's: a run that failed after another began leaves the session to it

  constructor(url, options, tokens, emit) {
    this.#url = url;
    this.#options = options;
    this.#tokens = tokens;
    this.#emit = emit;
    this.#known = new Set([httpBase(url), ...(options.peers || []).map((u) => u.replace(/\/+$/, ""))]);
  }

  get state() {
    return this.#state;
  }

  get welcome() {
    return this.#welcome;
  }

  /** Whether `topic` is subscribed (and subscribed again at each reconnect). */
  has(topic) {
    return this.#subscriptions.has(topic);
  }

  #setState(state) {
    if (state === this.#state) return;
    this.#state = state;
    this.#emit("state", state);
  }

  /**
   * Opens the session; resolves with the welcome frame. A first attempt that fails (a gateway
   * not up yet, no network yet) is tried again as a lost connection is, with the same backoff
   * and `reconnect` reports, until a welcome (whichever attempt's: connect() resolves with it), a
   * final close (credentials refused: it rejects with their code) or close() (`closed`). With
   * `reconnect: false` it rejects at the first failure, as before.
   */
  async connect() {
    this.#closedForGood = false;
    // (The close that ended the last run, final maybe, must not end this one's retries.)
    this.#lastClose = undefined;
    const stop = this.#stop.signal;
    const run = (this.#run = {});
    this.#setState("connecting");
    try {
      return await this.#open(this.#url, false, stop);
    } catch (error) {
      // connect() was called again meanwhile (a `failed` listener that signs in again): that run
      // has the session, and this one rejects with its own failure instead of opening another.
      if (run !== this.#run) throw error;
      // (A failed attempt's close set the state "closed" when it was final.)
      if (this.#state !== "connecting" || stop.aborted) {
        this.#setState("closed");
        throw error;
      }
      const welcome = await this.#reconnect();
      if (!welcome) throw new AckgateError("closed", "closed before it connected");
      return welcome;
    }
  }

  /**
   * Starts as after a lost connection: recommend, connect, subscribe to `topics` (topic ->
   * options) with their resume tokens. A tab that takes over the lead of its client id does so.
   */
  resume(topics) {
    for (const [topic, options] of topics) this.#subscriptions.set(topic, options);
    this.#setState("reconnecting");
    this.#reconnect().catch(() => {}); // a final close: reported as such
  }

  /**
   * Opens a session on `url` over the transport in use; "auto" falls back to SSE when the
   * WebSocket fails before its welcome. `resubscribing`: an SSE stream subscribes to the topics
   * (with their tokens) as it starts. `stop`: the run's signal (aborted by close()).
   */
  async #open(url, resubscribing, stop) {
    const token = this.#options.tokenProvider ? await this.#options.tokenProvider() : this.#options.token;
    // close() may have come while the token was fetched: no session opens after it.
    if (stop.aborted) throw new AckgateError("closed", "closed before it connected");
    const kind = this.#sseChosen ? "sse" : (this.#options.transport ?? "websocket");
    if (kind !== "auto") return this.#openWith(kind, url, token, resubscribing, stop);
    try {
      return await this.#openWith("websocket", url, token, resubscribing, stop);
    } catch (error) {
      await this.#transport?.ended; // the failed socket's close is handled first
      if (stop.aborted || this.#held() || FINAL_CLOSES.has(this.#lastClose) || !(this.#options.EventSource ?? globalThis.EventSource)) throw error;
      const welcome = await this.#openWith("sse", url, token, resubscribing, stop);
      this.#sseChosen = true;
      return welcome;
    }
  }

  #openWith(kind, url, token, resubscribing, stop) {
    const query = new URLSearchParams({ client_id: this.#options.clientId });
    if (token) query.set("token", token);
    this.#initial = new Map();
    if (kind === "sse" && resubscribing) this.#streamSubscribes(query);
    return new Promise((resolve, reject) => {
      let transport = null;
      let welcomed = false;
      // Credentials refused: the gateway says why in an `error` frame before its 1008 (a page
      // cannot read a refused handshake's status); connect() rejects with that code.
      let refusal = null;
      const current = () => transport === this.#transport;
      // A connection that never brings its welcome (a proxy that holds the upgrade, a network
      // that drops it) is abandoned: it counts as a failed attempt, and the next one follows.
      const limit = this.#options.connectTimeoutMs ?? 10000;
      const timer =
        limit > 0 &&
        setTimeout(() => {
          const why = `no welcome within ${limit} ms (connectTimeoutMs)`;
          reject(new AckgateError("timeout", why));
          transport.abandon(why);
        }, limit);
      const hooks = {
        frame: (frame) => {
          if (!current()) return;
          // Any frame proves the connection, as a pong would (see #checkAlive). (clearTimeout
          // returns undefined: the check is over.)
          this.#checking = clearTimeout(this.#checking);
          if (stop.aborted) {
            // close() came first (while the connection opened, or before its close arrived):
            // this session must not come back, nor hand out more events.
            if (!welcomed) reject(new AckgateError("closed", "closed before it connected"));
            transport.close(1000, "bye");
            return;
          }
          if (!welcomed && frame.type === "error" && frame.req === undefined) refusal = frame;
          if (frame.type === "welcome") {
            welcomed = true;
            clearTimeout(timer);
            this.#draining = false;
            this.#startHeartbeat(transport);
            // Publishes and subscribes waiting for a connection go out once the session is open.
            queueMicrotask(() => {
              this.#outbox.forEach((entry) => this.#sendPublish(entry));
              this.#subscribes.forEach((entry) => this.#sendSubscribe(entry));
            });
            this.#url = url;
            this.#known.add(httpBase(url));
            this.#welcome = frame;
            resolve(frame);
          }
          this.#dispatch(frame);
          if (frame.type === "welcome") this.#setState("connected");
        },
        error: (detail) => {
          const what = kind === "sse" ? `SSE connection to ${httpBase(url)}/sse` : `WebSocket connection to ${url}`;
          if (!welcomed) reject(new AckgateError("unavailable", `${what} failed${detail ? `: ${detail}` : ""}`));
        },
        close: (close) => {
          if (!current()) return;
          clearTimeout(timer);
          clearInterval(this.#heartbeat);
          this.#lastClose = close.code;
          if (close.code === 1009) this.#refuseTooLarge();
          this.#failPending(`socket closed (${close.code})`);
          // Deliveries of the old session are gone with it; their offsets stay unacknowledged in
          // the resume token until they come again and are acknowledged.
          this.#inFlight.clear();
          this.#newest.clear();
          this.#unconfirmed.clear();
          if (close.code === OPERATOR_CLOSE) this.#forgetTokens();
          const final = this.#closedForGood || FINAL_CLOSES.has(close.code) || this.#options.reconnect === false;
          // Refused for good by the gateway (not closed here): a failure, with the code of the
          // refusal's `error` frame, else the one the close code means. (The client reports it
          // before the state "closed", which then does not replace "failed".)
          const failure = !this.#closedForGood &&
            FINAL_CLOSES.has(close.code) && {
              code: refusal?.code ?? (close.code === 4001 ? "taken_over" : "unauthorized"),
              message: refusal?.message ?? close.reason,
              closeCode: close.code,
            };
          if (failure) this.#emit("failed", failure);
          if (final) this.#setState("closed");
          else if (welcomed) this.#setState("reconnecting");
          this.#emit("close", { code: close.code, reason: close.reason, final });
          const why = failure || refusal;
          if (!welcomed) reject(why ? new AckgateError(why.code, why.message) : new AckgateError("closed", `socket closed (${close.code}) before the welcome`));
          else if (!final) this.#reconnect().catch(() => {}); // a final close: reported as such
          if (final) this.#giveUp(`closed for good (${close.code})`);
        },
        refused: (frames, code, message) => {
          if (!current()) return;
          let unanswered = false;
          for (const { req } of frames) {
            const waiting = req !== undefined && this.#pending.get(req);
            if (waiting) {
              this.#pending.delete(req);
              waiting.reject(new AckgateError(code, message));
            } else unanswered = true;
          }
          // Frames without req (plain acks: redelivered later) are reported as an error frame.
          if (unanswered) this.#emit("error", { type: "error", code, message });
        },
        resume: (id) => {
          if (!current()) return;
          // An issued token names the stream's topics' offsets (kept to send back as is); the
          // older form names them too.
          const offsets = readIssued(id) ?? decodeToken(id);
          if (id.startsWith("r1.") && this.#tokens.issued[STREAM_TOKEN] !== id) {
            this.#tokens.issued[STREAM_TOKEN] = id;
            this.#advance(offsets ?? {});
            this.#saveToken();
          } else if (offsets) this.#advance(offsets);
        },
      };
      transport =
        kind === "sse"
          ? sseTransport(url, query, hooks, {
              EventSourceClass: this.#options.EventSource ?? globalThis.EventSource,
              token,
              maxBatch: Math.max(1, this.#options.maxBatchFrames ?? 10000),
            })
          : webSocketTransport(url, query, hooks, this.#options.WebSocket ?? globalThis.WebSocket);
      this.#transport = transport;
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
    const entries = [...this.#subscriptions].filter(([, options]) => !options.group);
    const from = entries.map(fromOf).find((f) => typeof f === "string");
    if (from === undefined) return;
    const topics = entries.filter((entry) => fromOf(entry) === from).map(([topic]) => topic);
    const token = {};
    for (const topic of topics) {
      const committed = this.#tokens.committed[topic] || {};
      if (Object.keys(committed).length > 0) {
        const epochs = this.#tokens.epochs[topic] || {};
        token[topic] = Object.fromEntries(Object.entries(committed).map(([p, offset]) => [p, epochs[p] ? [offset, epochs[p]] : offset]));
      }
    }
    const extended = new URLSearchParams(query);
    extended.set("topics", topics.join(","));
    if (from !== "committed") extended.set("from", from);
    // The stream's last id, a token the gateway issued, else the offsets in the older form.
    const issued = this.#tokens.issued[STREAM_TOKEN];
    if (issued) extended.set("resume", issued);
    else if (Object.keys(token).length > 0) extended.set("resume", encodeToken(token));
    if (extended.toString().length > MAX_SSE_QUERY) return;
    for (const [key, value] of extended) query.set(key, value);
    for (const topic of topics) {
      const answered = new Promise((resolve, reject) => this.#pending.set(`sub:${topic}`, { resolve, reject }));
      answered.catch(() => {}); // awaited by #resubscribe once the stream is welcomed
      this.#initial.set(topic, answered);
    }
  }

  /**
   * Reconnects until it succeeds, a final close or close(): recommend, connect, resubscribe with
   * tokens. After each wait the run's `stop` is checked: close() ends the run wherever it is.
   * Resolves with the welcome; with nothing after close() (or while another run goes on); rejects
   * with the error of a final close.
   */
  async #reconnect() {
    if (this.#reconnecting) return;
    this.#reconnecting = true;
    const stop = this.#stop.signal;
    const base = this.#options.backoffMs ?? 250;
    const max = this.#options.maxBackoffMs ?? 10000;
    try {
      for (let attempt = 1; !stop.aborted; attempt++) {
        // A draining instance says when to come back (a `reconnect` frame, then close 1012).
        const told = attempt === 1 ? this.#reconnectAfterMs : undefined;
        this.#reconnectAfterMs = undefined;
        const delayMs = told ?? Math.round(Math.min(max, base * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2));
        // Woken early (back online, the page shown again): the backoff starts over.
        if (await this.#sleep(delayMs)) attempt = 1;
        // Offline, or in the back/forward cache, no attempt could work (or should start): none is
        // made, nor counted, until online or the page shown again (nudge) wakes it.
        while (this.#held() && !stop.aborted) await this.#sleep();
        if (stop.aborted) return;
        let url = this.#url;
        try {
          const sentTo = this.#reconnectUrl;
          this.#reconnectUrl = undefined;
          const { named, answered } = sentTo ? { named: sentTo, answered: sentTo } : await this.#recommended(stop);
          if (stop.aborted) return;
          url = named;
          this.#emit("reconnect", { attempt, delayMs, url });
          let welcome;
          try {
            welcome = await this.#open(named, true, stop);
          } catch (error) {
            // The instance named is unreachable (the one that answered may not have noticed it
            // died yet): the instance that answered is alive, so use it. Not after a final close.
            if (answered === named || this.#held() || FINAL_CLOSES.has(this.#lastClose) || stop.aborted) throw error;
            url = answered;
            welcome = await this.#open(answered, true, stop);
          }
          await this.#resubscribe();
          if (stop.aborted) return;
          this.#emit("reconnect", { attempt, url, welcome });
          return welcome;
        } catch (error) {
          if (stop.aborted) return;
          this.#emit("reconnect", { attempt, delayMs, url, error: error.message });
          if (FINAL_CLOSES.has(this.#lastClose)) throw error;
          // A session that opened but could not resubscribe is dropped before the next attempt.
          if (this.#transport?.isOpen()) this.#transport.close(1000, "resubscribe failed");
        }
      }
    } finally {
      // (After close() a later connect() may have started a run of its own: its flag stays.)
      if (!stop.aborted) this.#reconnecting = false;
    }
  }

  /** Waits `ms` (undefined: until woken); true when woken before (nudge(), close()). */
  #sleep(ms) {
    return new Promise((resolve) => {
      const timer =
        ms >= 0 &&
        setTimeout(() => {
          this.#wake = null;
          resolve(false);
        }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        this.#wake = null;
        resolve(true);
      };
    });
  }

  /** Back online, or the page visible again: a reconnect waiting out its backoff goes at once;
   * an open connection is checked with a ping. `offline`: the connection is given up at once (it
   * cannot work), and the reconnect waits for online (#held). */
  nudge(offline) {
    if (offline) this.#transport?.abandon("offline");
    else if (this.#wake) this.#wake();
    else this.#checkAlive();
  }

  /** Whether an attempt must wait: offline (no attempt could work) or in the back/forward cache. */
  #held() {
    return this.#paused || globalThis.navigator?.onLine === false;
  }

  /** The page went into the back/forward cache (`on`), where a page with an open connection is
   * not kept: the connection closes and the reconnect waits, holding what it resumes with; or
   * it came back: the reconnect goes at once. */
  pause(on) {
    this.#paused = on;
    if (on) this.#transport?.abandon("pagehide");
    else this.nudge();
  }

  /** Subscribes again to every topic; one refused for good is dropped and reported. */
  async #resubscribe() {
    for (const [topic, options] of [...this.#subscriptions]) {
      if (!this.#subscriptions.has(topic)) continue; // unsubscribed meanwhile
      // Subscribed again by the app while disconnected: its own subscribe (sent at the welcome) decides.
      if ([...this.#subscribes].some((entry) => entry.topic === topic)) continue;
      try {
        const byStream = this.#initial.get(topic);
        if (byStream) {
          const answer = await byStream;
          if (this.#subscriptions.has(topic)) this.#subscribed(topic, options.from, answer, options);
        } else {
          // The token the gateway issued for the topic (its shared subscription's, for a member),
          // else the client's own offsets with their epochs; a group gets only its own token.
          const { committed, epochs, issued } = this.#tokens;
          const token = issued[issuedKey(topic, options.group)];
          const resume = token ?? (options.group ? undefined : { ...committed[topic] });
          await this.#subscribe(topic, { ...options, resume, epochs: { ...epochs[topic] } });
        }
      } catch (error) {
        if (!FINAL_SUBSCRIBE_ERRORS.has(error.code)) throw error;
        this.#subscriptions.delete(topic);
        this.#emit("dropped", { topic, code: error.code, message: error.message });
      }
    }
    // SSE: a topic the stream's URL subscribed again and unsubscribe() dropped before the welcome
    // (when its unsubscribe found no connection to go out on) is unsubscribed now.
    for (const topic of this.#initial.keys()) {
      if (!this.#subscriptions.has(topic)) this.#request({ op: "unsubscribe", topic }).catch(() => {});
    }
  }

  /** The /ws URL the first instance that answers `/session/recommend` names, and its own. */
  async #recommended(stop) {
    // A member of a shared subscription goes where its group lives.
    const group = [...this.#subscriptions.values()].find((o) => o.group)?.group;
    const query = new URLSearchParams(group ? { group } : { client_id: this.#options.clientId });
    for (const base of [...this.#known]) {
      if (stop.aborted) break;
      try {
        // Each request gives up after 2 s, or at close().
        const signal = AbortSignal.any ? AbortSignal.any([stop, AbortSignal.timeout(2000)]) : AbortSignal.timeout(2000);
        const response = await fetch(`${base}/session/recommend?${query}`, { signal });
        if (!response.ok) continue;
        const answer = await response.json();
        if (answer.http_url) this.#known.add(answer.http_url.replace(/\/+$/, ""));
        if (answer.ws_url) return { named: answer.ws_url, answered: `${base.replace(/^http/, "ws")}/ws` };
      } catch {
        // That instance is down or unreachable: ask the next one.
      }
    }
    throw new AckgateError("unavailable", "no known instance answered /session/recommend");
  }

  /**
   * Subscribes; remembered once answered, so a reconnect subscribes again (with a resume token).
   * While the session is not up (before connect(), connecting, reconnecting, or cut before the
   * answer) it waits and goes out after the next welcome. It rejects with the gateway's refusal,
   * `timeout` once sent, and `closed` at close() or a final close (at once after them).
   */
  subscribe(topic, options = {}) {
    if (this.#closedForGood) return Promise.reject(new AckgateError("closed", "the client is closed for good"));
    return new Promise((resolve, reject) => {
      const entry = { topic, options, resolve, reject, sent: false };
      this.#subscribes.add(entry);
      this.#sendSubscribe(entry);
    });
  }

  /** Sends a waiting subscribe if the session is up. */
  #sendSubscribe(entry) {
    if (entry.sent || this.#state !== "connected") return;
    entry.sent = true;
    this.#subscribe(entry.topic, entry.options).then(
      (subscribed) => {
        this.#subscribes.delete(entry);
        entry.resolve(subscribed);
      },
      (error) => {
        entry.sent = false;
        // Cut by a lost connection: sent again after the reconnect (unless unsubscribed, or
        // given up by close() or a final close, meanwhile).
        if (error.code === "closed" && this.#subscribes.has(entry)) return;
        this.#subscribes.delete(entry);
        entry.reject(error);
      },
    );
  }

  /**
   * Subscribes now (the session is open). Without an explicit `resume`, a token kept in `storage`
   * (from before a page reload) is sent.
   */
  async #subscribe(topic, { from, resume, epochs, group, order } = {}) {
    const frame = { op: "subscribe", topic };
    if (from) frame.from = from;
    // A shared subscription: its token (from `ack_ok`s) is the group's floor, kept per topic.
    if (group) frame.group = group;
    if (order) frame.order = order;
    const own = resume === undefined;
    const kept = this.#options.storage ? (this.#tokens.issued[issuedKey(topic, group)] ?? (group ? undefined : this.#tokens.committed[topic])) : undefined;
    const token = own ? kept : resume;
    if (typeof token === "string") {
      // A token the gateway issued: it names its own epochs.
      frame.resume = token;
    } else if (token && Object.keys(token).length > 0 && !group) {
      // The older map: a client's claim, never a group's (the gateway would refuse it).
      frame.resume = token;
      // The client's epochs label its own token only: an app's token without `epochs` may be from
      // before a reset, and counts as the oldest (the gateway fences it).
      const known = (own ? this.#tokens.epochs[topic] : epochs) ?? {};
      frame.epochs = Object.fromEntries(Object.keys(token).filter((p) => known[p]).map((p) => [p, known[p]]));
    }
    const asked = {};
    this.#asked.set(topic, asked);
    const subscribed = await this.#request(frame);
    // Unsubscribed (or subscribed again) while the answer was on its way: that request decides;
    // added back, the topic would be subscribed again at every reconnect. (The unsubscribe went
    // out on the same connection after this subscribe, so the gateway ends unsubscribed.)
    if (this.#asked.get(topic) === asked) this.#subscribed(topic, from, subscribed, { group, order });
    return subscribed;
  }

  /** Remembers a subscription and where each of its partitions starts. */
  #subscribed(topic, from, subscribed, { group, order } = {}) {
    const options = from ? { from } : {};
    if (group) Object.assign(options, order ? { group, order } : { group });
    this.#subscriptions.set(topic, options);
    const key = issuedKey(topic, group);
    if (subscribed.token) this.#tokens.issued[key] = subscribed.token;
    // A group's floor is kept apart from the client's own offsets.
    for (const { partition, from: start, epoch } of subscribed.partitions || []) learn(this.#tokens, key, partition, start, epoch ?? 0, true);
    this.#saveToken();
  }

  unsubscribe(topic) {
    this.#subscriptions.delete(topic);
    this.#asked.delete(topic);
    // Its subscribes waiting for a connection are not sent (one in flight gets its answer).
    for (const entry of this.#subscribes) {
      if (entry.topic !== topic) continue;
      this.#subscribes.delete(entry);
      if (!entry.sent) entry.reject(new AckgateError("closed", "unsubscribed before it was sent"));
    }
    return this.#request({ op: "unsubscribe", topic });
  }

  /** Whether a tab's `session` (the session_id its events came in) is not this session: ids are
   * unique per instance only, so here they may name other deliveries. */
  #elsewhere(session) {
    return session !== undefined && session !== this.#welcome?.session_id;
  }

  /** Tracks a delivery of this session; a redelivery of the same event replaces the one before. */
  #track({ delivery_id: id, topic, partition, offset, redrive }) {
    const key = `${topic}\0${partition}\0${offset}${redrive ? "\0redrive" : ""}`;
    const before = this.#newest.get(key);
    if (before !== undefined) this.#inFlight.delete(before);
    this.#newest.set(key, id);
    this.#inFlight.set(id, { key, topic, partition, redrive });
  }

  /** The delivery `id` is settled here (acked, nacked, termed); what it was, if it is tracked. */
  #settle(id) {
    const delivery = this.#inFlight.get(id);
    if (!delivery) return undefined;
    this.#inFlight.delete(id);
    if (this.#newest.get(delivery.key) === id) this.#newest.delete(delivery.key);
    return delivery;
  }

  /**
   * Acknowledges one id or many. `{ confirm: true }` resolves once the offsets are durable
   * (`ack_ok`); otherwise the ack is plain, except that a partition not confirmed for
   * `confirmEveryMs` gets a confirmed one (its `ack_ok` refreshes the resume token).
   */
  ack(ids, { confirm = false, session } = {}) {
    if (this.#elsewhere(session)) {
      // Delivered by an earlier session: released at its end, they come again.
      return confirm ? Promise.reject(new AckgateError("closed", "the session that delivered them ended: they come again")) : Promise.resolve();
    }
    const list = Array.isArray(ids) ? ids : [ids];
    const every = this.#options.confirmEveryMs ?? 1000;
    const now = Date.now();
    // After a `reconnect` frame every ack is confirmed: the close comes once the token covers them.
    let due = confirm || this.#draining;
    for (const id of list) {
      const event = this.#settle(id);
      if (!event || event.redrive) continue; // a redriven event moves no offset
      const key = `${event.topic}\0${event.partition}`;
      if (now - (this.#lastConfirmed.get(key) ?? 0) >= every) due = true;
      this.#unconfirmed.set(key, id);
    }
    const frame = list.length === 1 ? { op: "ack", delivery_id: list[0] } : { op: "ack", delivery_ids: list };
    if (!due) {
      this.#send(frame);
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
    for (const [key, id] of [...this.#unconfirmed]) {
      if (ids.includes(id)) {
        this.#unconfirmed.delete(key);
        this.#lastConfirmed.set(key, now);
      }
    }
  }

  /** Confirms, `every` ms from now, the partitions acked since their last confirmation. */
  #armTrailing(every) {
    if (this.#trailing || this.#closedForGood) return;
    this.#trailing = setTimeout(() => this.#confirmNow(), every);
  }

  /** Asks tokenProvider for a new token and sends it as `refresh`; a failure only means the
   * session closes with 4004 at its expiry and the client reconnects with a fresh token. */
  async #refreshToken() {
    if (!this.#options.tokenProvider) return;
    try {
      const token = await this.#options.tokenProvider();
      if (this.#transport?.isOpen()) await this.#request({ op: "refresh", token });
    } catch (error) {
      this.#emit("error", { type: "error", code: error?.code ?? "unauthorized", message: `token refresh failed: ${error?.message ?? error}` });
    }
  }

  /** Confirms the partitions acked since their last confirmation, now. */
  #confirmNow() {
    clearTimeout(this.#trailing);
    this.#trailing = null;
    const ids = [...new Set(this.#unconfirmed.values())];
    if (ids.length === 0 || !this.#transport?.isOpen()) return;
    // Acking an acknowledged event again is a no-op that still reports the durable floor.
    this.#confirming(ids);
    this.#request(ids.length === 1 ? { op: "ack", delivery_id: ids[0] } : { op: "ack", delivery_ids: ids }).catch(() => {});
  }

  // nack, extend and term: `session` as for ack.
  nack(id, delayMs, session) {
    if (this.#elsewhere(session)) return;
    this.#settle(id);
    this.#send(delayMs === undefined ? { op: "nack", delivery_id: id } : { op: "nack", delivery_id: id, delay_ms: delayMs });
  }

  extend(id, session) {
    if (!this.#elsewhere(session)) this.#send({ op: "extend", delivery_id: id });
  }

  term(id, reason, session) {
    if (this.#elsewhere(session)) return;
    this.#settle(id);
    this.#send(reason ? { op: "term", delivery_id: id, reason } : { op: "term", delivery_id: id });
  }

  ping() {
    return this.#request({ op: "ping" });
  }

  /**
   * Publishes `events` to `topic` over the session; resolves with the `published` frame. While
   * disconnected it waits (at most `maxQueuedPublishes`, default 100, publishes) and goes out
   * after the reconnect, under its idempotency key, so one sent again is never written twice.
   */
  publish(topic, events, { idempotencyKey } = {}) {
    if (this.#closedForGood) {
      return Promise.reject(new AckgateError("closed", "the client is closed for good"));
    }
    const most = this.#options.maxQueuedPublishes ?? 100;
    if (this.#outbox.length >= most) {
      return Promise.reject(new AckgateError("limit_exceeded", `${most} publishes are waiting (maxQueuedPublishes)`));
    }
    const key = idempotencyKey ?? randomKey();
    return new Promise((resolve, reject) => {
      const entry = { topic, events: Array.isArray(events) ? events : [events], key, resolve, reject, sent: false };
      this.#outbox.push(entry);
      this.#sendPublish(entry);
    });
  }

  /**
   * Every `heartbeatMs` (20000; 0: never) a ping that must be answered within
   * `heartbeatTimeoutMs` (10000), else the connection counts as dead (a laptop that slept, a
   * network switched, a proxy that black-holes it): it is abandoned and the client reconnects.
   */
  #startHeartbeat(transport) {
    clearInterval(this.#heartbeat);
    const every = this.#options.heartbeatMs ?? 20000;
    if (!every) return;
    this.#heartbeat = setInterval(() => this.#checkAlive(transport), every);
    this.#heartbeat.unref?.(); // never keeps node alive by itself
  }

  /**
   * Pings now; nothing heard within `heartbeatTimeoutMs` (0: no limit) abandons `transport`. Any
   * frame answers it (the pong may come behind a slow client's events), and the time is the
   * wall clock's: a timer that ran late (a background tab's throttled timers, a frozen tab, a
   * device asleep) may run before the frames that came meanwhile, so the verdict then waits one
   * more period from now. A connection that went silent is given up all the same.
   */
  #checkAlive(transport = this.#transport) {
    if (!transport?.isOpen() || transport !== this.#transport || this.#checking) return;
    const limit = this.#options.heartbeatTimeoutMs ?? 10000;
    const sent = Date.now();
    let late = 0;
    // Dead, unless this timer ran late (twice the limit or more after the ping) for the first
    // time: then once more, `limit` from now.
    const check = () =>
      (this.#checking = Date.now() - sent < 2 * limit || late++ ? transport.abandon(`no pong within ${limit} ms (heartbeatTimeoutMs)`) : setTimeout(check, limit));
    if (limit > 0) this.#checking = setTimeout(check, limit);
    this.#send({ op: "ping" });
  }

  /** Sends a waiting publish if the session is open; one cut by a closed socket waits again. */
  #sendPublish(entry) {
    if (entry.sent || !this.#transport?.isOpen() || !this.#welcome) return;
    entry.sent = true;
    const done = () => {
      const at = this.#outbox.indexOf(entry);
      if (at >= 0) this.#outbox.splice(at, 1);
    };
    this.#request({ op: "publish", topic: entry.topic, events: entry.events, idempotency_key: entry.key }).then(
      (published) => {
        done();
        entry.resolve(published);
      },
      (error) => {
        entry.sent = false;
        // Taken out of the outbox already (by close(), a final close, a 1009): settled there.
        if (!this.#outbox.includes(entry)) return;
        if (error.code === "closed" && !this.#closedForGood) return; // cut by a lost connection: sent again after the reconnect
        done();
        entry.reject(error);
      },
    );
  }

  /**
   * After a close 1009 (a frame over the gateway's `limits.max_frame_bytes`, which the welcome
   * does not name): the largest publish in flight is taken for that frame (the client's other
   * frames are small) and rejected, instead of being sent again after every welcome and closed
   * again, for ever. The other publishes in flight go again under their keys.
   */
  #refuseTooLarge() {
    const sent = this.#outbox.filter((entry) => entry.sent).map((entry) => [entry, new TextEncoder().encode(JSON.stringify(entry.events)).length]);
    const largest = Math.max(...sent.map(([, bytes]) => bytes));
    for (const [entry, bytes] of sent) {
      if (bytes < largest) continue;
      this.#outbox.splice(this.#outbox.indexOf(entry), 1);
      const why = `closed with 1009 (over limits.max_frame_bytes): this publish (${bytes} bytes) was the largest in flight; not sent again`;
      entry.reject(new AckgateError("limit_exceeded", why));
    }
  }

  /** Closes for good: no reconnect follows, and nothing waits any more. */
  close() {
    this.#closedForGood = true;
    // A reconnect in progress (or a connect waiting for its token) stops at its next step.
    this.#stop.abort();
    this.#stop = new AbortController();
    this.#wake?.();
    this.#reconnecting = false;
    clearTimeout(this.#trailing);
    this.#trailing = null;
    clearInterval(this.#heartbeat);
    // (A check's timer must not report its verdict as the close of close()'s connection.)
    this.#checking = clearTimeout(this.#checking);
    // While reconnecting no socket's close settles these: they end here.
    this.#failPending("the client is closed");
    this.#giveUp("the client is closed");
    this.#transport?.close(1000, "bye");
    this.#setState("closed");
  }

  /**
   * Closed for good (close(), a final close): what waits for a connection is rejected, and the
   * subscriptions are forgotten (a later connect() starts without them, whichever attempt
   * succeeds).
   */
  #giveUp(why) {
    this.#closedForGood = true;
    for (const entry of [...this.#outbox.splice(0), ...this.#subscribes]) entry.reject(new AckgateError("closed", why));
    this.#subscribes.clear();
    this.#subscriptions.clear();
  }

  /** Sends `frame` if the connection is open (a socket still connecting would throw); else it is
   * lost, as it would be with the connection: the gateway redelivers what was not acked. */
  #send(frame) {
    if (this.#transport?.isOpen()) {
      if (this.#options.debug) log(this.#options.debug, "send", frame); // (the client logs what comes)
      this.#transport.send(frame);
    }
  }

  /**
   * Sends `frame` with a new `req`; settled by the answer carrying it. An answer that does not
   * come within `requestTimeoutMs` rejects with `timeout`, and the connection is checked at once
   * (as by the heartbeat): a connection that black-holes is found and replaced.
   */
  #request(frame) {
    if (!this.#transport?.isOpen()) {
      return Promise.reject(new AckgateError("closed", "not connected"));
    }
    const req = this.#nextReq++;
    const limit = this.#options.requestTimeoutMs ?? 10000;
    return new Promise((resolve, reject) => {
      const timer =
        limit > 0 &&
        setTimeout(() => {
          this.#pending.delete(req);
          reject(new AckgateError("timeout", `no answer to ${frame.op} within ${limit} ms (requestTimeoutMs)`));
          this.#checkAlive();
        }, limit);
      const settle = (done) => (value) => {
        clearTimeout(timer);
        done(value);
      };
      this.#pending.set(req, { resolve: settle(resolve), reject: settle(reject) });
      this.#send({ ...frame, req });
    });
  }

  #failPending(why) {
    for (const { reject } of this.#pending.values()) reject(new AckgateError("closed", why));
    this.#pending.clear();
  }

  #saveToken() {
    store(this.#options, this.#tokens);
    this.#emit("tokens", this.#tokens);
  }

  /**
   * Durable committed offsets (an `ack_ok`, an SSE event's id: an offset, or `[offset, epoch]`)
   * move the resume tokens up. An `ack_ok` names no epoch: its session's, which `subscribed` told.
   */
  #advance(offsets, tokens = {}) {
    let moved = false;
    for (const [topic, token] of Object.entries(tokens)) {
      const key = issuedKey(topic, this.#subscriptions.get(topic)?.group);
      if (this.#tokens.issued[key] !== token) {
        this.#tokens.issued[key] = token;
        moved = true;
      }
    }
    for (const [topic, partitions] of Object.entries(offsets)) {
      // A member's ack_ok names its group's floor: kept apart from the client's own offsets.
      const key = issuedKey(topic, this.#subscriptions.get(topic)?.group);
      for (const [partition, value] of Object.entries(partitions)) {
        const [offset, epoch] = Array.isArray(value) ? value : [value, this.#tokens.epochs[key]?.[partition] ?? 0];
        if (learn(this.#tokens, key, partition, offset, epoch)) moved = true;
      }
    }
    // Every SSE event carries a token: the storage is written only when one moved.
    if (moved) this.#saveToken();
  }

  /** The request `frame` answers, taken from `pending`. */
  #waiting(frame) {
    let key = frame.req;
    if (key === undefined && this.#initial.size > 0) {
      // SSE: the stream's own subscribes are answered in order without req: `subscribed` names
      // its topic, an `error` is the first one still waiting.
      if (frame.type === "subscribed") key = `sub:${frame.topic}`;
      else if (frame.type === "error") key = [...this.#pending.keys()].find((k) => typeof k === "string" && k.startsWith("sub:"));
    }
    const waiting = key !== undefined && this.#pending.get(key);
    if (waiting) this.#pending.delete(key);
    return waiting;
  }

  /** After an operator's disconnect: the operator may have moved the offsets; no token stands. */
  #forgetTokens() {
    this.#tokens.committed = {};
    this.#tokens.epochs = {};
    this.#tokens.issued = {};
    this.#saveToken();
  }

  #dispatch(frame) {
    if (frame.type === "event") this.#track(frame);
    this.#emit("frame", frame);
    if (frame.type === "event") return;
    if (frame.type === "refresh_needed") {
      // The session's token expires soon: a new one from tokenProvider replaces it in band
      // (`refresh`); without one the session closes with 4004 and the client reconnects.
      this.#refreshToken();
      return;
    }
    if (frame.type === "reconnect") {
      // The instance drains: it sends no new event and closes once what this client acked is
      // confirmed (server.drain_settle_ms), so the token taken elsewhere covers those acks.
      this.#reconnectAfterMs = frame.after_ms;
      // A shared subscription's member sent to the instance its group lives on.
      if (frame.ws_url) this.#reconnectUrl = frame.ws_url;
      this.#draining = true;
      this.#confirmNow();
      return;
    }
    if (frame.type === "ack_ok") this.#advance(frame.committed || {}, frame.tokens || {});
    if (frame.type === "progress") this.#advance({}, frame.tokens || {});
    const waiting = this.#waiting(frame);
    if (waiting) {
      if (frame.type === "error") waiting.reject(new AckgateError(frame.code, frame.message));
      else waiting.resolve(frame);
    } else if (frame.type === "error") {
      this.#emit("error", frame);
    }
  }
}

// Tabs of one origin with the same client id share one session (`tabs: "shared"`). The gateway
// allows one session per client id: without this, a second tab would take over the first, which
// closes with 4001 for good. One tab leads: it holds the Web Lock "ackgate:<clientId>" while it
// leads, runs the session and subscribes to the union of every tab's topics; the others follow
// over the BroadcastChannel of the same name: the leader posts every report of its session
// (frames, state, closes, resume tokens) and each tab keeps the events of its own topics; a
// follower's requests (subscribe, ack, publish, ...) go to the leader, which makes them and
// answers. When the leader tab goes, its lock goes to a waiting tab, which leads from then on: it
// connects and subscribes again to every topic with the resume tokens it was sent, as after a
// lost connection (what was not acknowledged comes again, nothing is skipped).
//
// Each tab also holds a lock of its own, "ackgate:<clientId>:tab:<id>", for its life: the leader
// asks for it, is granted it when that tab is gone, and then unsubscribes from the topics only
// that tab wanted (their events would fill the window with deliveries nobody acks).
//
// Messages, `{t, from, to?, ...}`: "hello" (a tab, its topics and tokens: when it joins, and to
// each new leader), "leader" (the leader's state, welcome and tokens: when it starts leading, and
// in answer to a hello), "up" (one report of the leader's session), "call" and "reply" (a
// follower's request and its answer), "bye" (a tab leaves). Tokens are merged partition by
// partition both ways (never taken whole), so none moves back within its epoch.
//
// Where Web Locks refuse (an opaque origin, a sandboxed frame: SecurityError) the client runs a
// session of its own instead.

/** How long a leader that leaves keeps its lock after its bye (or a final close): the tabs hear
 * it before one of them can win the lock and connect again. */
const HANDOVER_MS = 100;

/** Requests sent without waiting for an answer, as on a session of one's own. */
const silent = (method, args) => method === "nack" || method === "extend" || method === "term" || (method === "ack" && !args[1]?.confirm);

/** Requests that wait for a leader (and go to the next one when it goes), as for a connection. */
const waits = (method) => method === "publish" || method === "subscribe";

/** The other requests a follower may ask of the leader's session. */
const CALLS = ["ack", "nack", "extend", "term", "ping", "publish"];

/** An AckgateError as another tab made it (its message already names the code). */
function remoteError({ code, message }) {
  const error = new AckgateError(code, "");
  error.message = message;
  return error;
}

class TabGroup {
  #options;
  #local; // the client of this tab: {topics, tokens, receive(kind, data), session(emit)}
  #name; // "ackgate:<clientId>": the leader's lock and the channel
  #id = randomKey().slice(0, 16);
  #channel = null;
  #left = false;
  #failed = null; // the failure (credentials refused, taken over) that ended the session this tab led
  #quit = new AbortController(); // ends the wait for the leader's lock
  #releaseTab = null; // ends this tab's own lock
  #joining = null; // {resolve, reject, timer} of the connect() in progress
  #leader = null; // the leading tab's id (this tab's own while it leads)
  #session = null; // while this tab leads
  #stopLeading = null;
  #wanted = new Map(); // while leading: topic -> {options, tabs: Set of tab ids, frame, pending}
  #watched = new Set(); // while leading: the tabs whose lock it waits for
  #calls = new Map(); // call id -> {method, args, resolve, reject, timer}: waiting for the leader
  #nextCall = 1;
  #unwanted = new Set(); // while leading: topics unsubscribed because no tab wants them
  #retry = null; // while leading: the timer of the next #sync after a subscribe refused for now
  #failures = 0; // ... and how many came in a row (its backoff)
  #locksRefused = false;

  constructor(options, local) {
    this.#options = options;
    this.#local = local;
    this.#name = `ackgate:${options.clientId}`;
  }

  /** The session, while this tab leads. */
  get session() {
    return this.#session;
  }

  /** Web Locks refused this page (join() failed for it): the client runs a session of its own. */
  get locksRefused() {
    return this.#locksRefused;
  }

  /**
   * Joins the tabs of this client id; resolves with the welcome of the session they share. It
   * waits as the leader's connect() does (which tries until a welcome); only with `reconnect:
   * false` is it bounded by `connectTimeoutMs`.
   */
  join() {
    const locks = globalThis.navigator.locks;
    const limit = this.#options.reconnect === false ? (this.#options.connectTimeoutMs ?? 10000) : 0;
    return new Promise((resolve, reject) => {
      const why = `no session within ${limit} ms (connectTimeoutMs)`;
      this.#joining = { resolve, reject, timer: limit > 0 && setTimeout(() => this.#failJoin(new AckgateError("timeout", why)), limit) };
      // This tab's own lock, held for its life: the leader learns of its end by being granted it.
      const held = (release) => {
        if (this.#left) return release();
        this.#releaseTab = release;
        this.#channel = new BroadcastChannel(this.#name);
        this.#channel.onmessage = ({ data }) => this.#message(data);
        locks.request(this.#name, { signal: this.#quit.signal }, () => this.#lead()).catch(() => {}); // aborted: left first
        this.#hello();
      };
      const refused = () => {
        this.#locksRefused = true;
        // (connect() then runs a session of its own: this error is not seen.)
        this.#failJoin(new AckgateError("unavailable", "tabs cannot share a session here"));
      };
      try {
        locks.request(`${this.#name}:tab:${this.#id}`, () => new Promise(held)).catch(refused);
      } catch (error) {
        refused(error);
      }
    });
  }

  /** Tells the tabs (the leader) this tab's topics and resume tokens. */
  #hello() {
    this.#post({ t: "hello", topics: Object.fromEntries(this.#local.topics), tokens: this.#local.tokens });
  }

  #joined(welcome) {
    const joining = this.#joining;
    if (!joining) return;
    this.#joining = null;
    clearTimeout(joining.timer);
    joining.resolve(welcome);
  }

  #failJoin(error) {
    const joining = this.#joining;
    if (!joining) return;
    this.#joining = null;
    clearTimeout(joining.timer);
    this.leave();
    joining.reject(error);
  }

  /** Leaves: a leader closes its session and hands the lock on; every call waiting fails. `now`:
   * the locks go at once (a page that holds one is not kept in the back/forward cache). */
  leave(now) {
    if (this.#left) return;
    this.#left = true;
    this.#failJoin(this.#failed ?? new AckgateError("closed", "closed before it connected"));
    this.#quit.abort();
    for (const { reject, timer } of this.#calls.values()) {
      clearTimeout(timer);
      reject(new AckgateError("closed", "the client is closed"));
    }
    this.#calls.clear();
    clearTimeout(this.#retry);
    const session = this.#session;
    this.#session = null; // its reports are no longer passed on
    session?.close();
    this.#post({ t: "bye" });
    if (now) {
      this.#stopLeading?.();
      this.#releaseTab?.();
    }
    setTimeout(
      () => {
        this.#stopLeading?.();
        this.#releaseTab?.();
        this.#channel?.close();
        this.#channel = null;
      },
      session && !now ? HANDOVER_MS : 0,
    );
  }

  /** Granted the leader's lock: runs the session until this tab leaves (or closes). */
  async #lead() {
    if (this.#left) return;
    this.#leader = this.#id;
    const session = this.#local.session((kind, data) => this.#up(session, kind, data));
    this.#session = session;
    for (const [topic, options] of this.#local.topics) this.#want(this.#id, topic, options);
    const leading = new Promise((stop) => (this.#stopLeading = stop));
    this.#post({ t: "leader", ...this.#status() }); // the other tabs say hello with their topics
    this.#recall();
    if (this.#joining) {
      clearTimeout(this.#joining.timer); // the session's connect has its own timeout
      session.connect().then(
        (welcome) => this.#joined(welcome),
        (error) => this.#failJoin(error),
      );
    } else {
      // It followed a leader that is gone: as after a lost connection, with the tokens it was sent.
      session.resume([...this.#wanted].map(([topic, { options }]) => [topic, options]));
    }
    await leading;
  }

  #status() {
    const session = this.#session;
    return { state: session.state, welcome: session.welcome, tokens: this.#local.tokens };
  }

  /** A report of the session this tab leads: to this tab's client and to every other tab. */
  #up(session, kind, data) {
    if (session !== this.#session) return;
    if (kind === "frame" && data.type === "subscribed" && this.#wanted.has(data.topic)) this.#wanted.get(data.topic).frame = data;
    if (kind === "frame" && data.type === "event" && !this.#wanted.has(data.topic) && !this.#unwanted.has(data.topic)) {
      // Events of a topic no tab wants (its subscribe answered after its timeout, say): every tab
      // drops them, nobody acks, they would fill the window and stall every topic. Not nacked
      // (they would only come again): unsubscribed.
      this.#unsubscribe(data.topic).catch(() => {});
    }
    if (kind === "dropped") this.#wanted.delete(data.topic);
    // A join the failure ends rejects with its code, not "closed" (the client leaves the tabs
    // at the failure's final close, before the session's connect() rejects).
    if (kind === "failed") this.#failed = new AckgateError(data.code, data.message);
    if (kind === "state" && data === "connected") this.#unwanted.clear(); // a new session: none of them
    // A failed first connect is no news to the others: the next leader tries its own.
    if (kind !== "state" || data !== "closed") this.#post({ t: "up", kind, data });
    this.#local.receive(kind, data);
    if (kind === "state" && data === "connected") this.#sync();
  }

  /** Subscribes, with the tokens this tab holds, to the topics tabs want that the session lacks. */
  #sync() {
    const session = this.#session;
    if (session?.state !== "connected") return;
    const { committed, epochs, issued } = this.#local.tokens;
    for (const [topic, entry] of this.#wanted) {
      if (session.has(topic) || entry.pending) continue;
      // The gateway's token for it, else (a topic's own subscription only) the offsets.
      const token = issued?.[issuedKey(topic, entry.options.group)];
      const resume = token ?? (entry.options.group ? undefined : { ...committed[topic] });
      this.#subscribe(topic, entry, { ...entry.options, resume, epochs: { ...epochs[topic] } }).then(
        () => (this.#failures = 0),
        (error) => {
          // Refused for good: dropped for every tab. Refused for now (unavailable, a timeout):
          // tried again after a backoff, as a reconnect is; the tab that wants it would get
          // nothing until the next welcome.
          if (FINAL_SUBSCRIBE_ERRORS.has(error.code)) this.#up(session, "dropped", { topic, code: error.code, message: error.message });
          else if (!this.#retry && session === this.#session) {
            const delay = Math.min(this.#options.maxBackoffMs ?? 10000, (this.#options.backoffMs ?? 250) * 2 ** this.#failures++);
            this.#retry = setTimeout(() => {
              this.#retry = null;
              this.#sync();
            }, delay);
          }
        },
      );
    }
  }

  /** Unsubscribes the session from a topic no tab wants. */
  #unsubscribe(topic) {
    this.#unwanted.add(topic);
    return this.#session.unsubscribe(topic);
  }

  #subscribe(topic, entry, options) {
    entry.pending ??= this.#session
      .subscribe(topic, options)
      .then((frame) => (entry.frame = frame))
      .finally(() => (entry.pending = null));
    return entry.pending;
  }

  #want(tab, topic, { resume, epochs, ...options }) {
    let entry = this.#wanted.get(topic);
    this.#unwanted.delete(topic);
    // (Kept without a token: a later subscribe, by a new leader, sends the tokens of that time.)
    if (!entry) this.#wanted.set(topic, (entry = { options, tabs: new Set(), frame: null, pending: null }));
    entry.tabs.add(tab);
    return entry;
  }

  /** `tab` no longer wants `topic`; true when no tab does. */
  #unwant(tab, topic) {
    const entry = this.#wanted.get(topic);
    entry?.tabs.delete(tab);
    if (entry?.tabs.size) return false;
    this.#wanted.delete(topic);
    return true;
  }

  /** A tab is gone (its lock came to this leader, or it said bye): its topics go with it. */
  #tabGone(tab) {
    this.#watched.delete(tab);
    for (const [topic, entry] of [...this.#wanted]) {
      if (this.#session && entry.tabs.has(tab) && this.#unwant(tab, topic)) this.#unsubscribe(topic).catch(() => {});
    }
  }

  /** The leader makes a request of `tab` (its own included) on its session. */
  async #handle(tab, method, args) {
    const session = this.#session;
    if (method === "subscribe") {
      const [topic, options] = args;
      const entry = this.#want(tab, topic, options);
      // A topic another tab subscribed to is subscribed once: this tab gets its events from now on.
      if (session.has(topic) && entry.frame) return entry.frame;
      try {
        return await this.#subscribe(topic, entry, options);
      } catch (error) {
        this.#unwant(tab, topic);
        throw error;
      }
    }
    if (method === "unsubscribe") {
      const [topic] = args;
      return this.#unwant(tab, topic) ? this.#unsubscribe(topic) : { type: "unsubscribed", topic };
    }
    if (!CALLS.includes(method)) throw new AckgateError("bad_frame", `no request ${method}`);
    return session[method](...args);
  }

  /** A request of this tab's client: made here while leading, else sent to the leader. */
  call(method, args) {
    if (this.#session) return this.#handle(this.#id, method, args);
    if (silent(method, args)) {
      if (this.#leader) this.#post({ t: "call", to: this.#leader, method, args });
      return undefined;
    }
    if (!this.#leader && !waits(method)) return Promise.reject(new AckgateError("closed", "no leader tab"));
    const most = this.#options.maxQueuedPublishes ?? 100;
    if (method === "publish" && [...this.#calls.values()].filter((call) => call.method === "publish").length >= most) {
      return Promise.reject(new AckgateError("limit_exceeded", `${most} publishes are waiting (maxQueuedPublishes)`));
    }
    return new Promise((resolve, reject) => {
      const id = this.#nextCall++;
      // A publish or a subscribe waits for a leader, as for a connection; the rest are bounded
      // like requests.
      const limit = this.#options.requestTimeoutMs ?? 10000;
      const expire = () => {
        this.#calls.delete(id);
        reject(new AckgateError("timeout", `no answer from the leader tab within ${limit} ms (requestTimeoutMs)`));
      };
      const timer = !waits(method) && limit > 0 && setTimeout(expire, limit);
      this.#calls.set(id, { method, args, resolve, reject, timer });
      if (this.#leader) this.#post({ t: "call", to: this.#leader, id, method, args });
    });
  }

  /**
   * The leader changed: calls sent to the old one fail as on a lost connection, except
   * publishes (under their idempotency key) and subscribes (of topics this tab still wants),
   * which go to the new one (this tab, when it leads).
   */
  #recall() {
    for (const [id, call] of [...this.#calls]) {
      const unwanted = call.method === "subscribe" && !this.#local.topics.has(call.args[0]);
      if (!waits(call.method) || unwanted) {
        this.#calls.delete(id);
        clearTimeout(call.timer);
        call.reject(new AckgateError("closed", unwanted ? "unsubscribed before it was sent" : "the leader tab is gone"));
      } else if (this.#session) {
        this.#calls.delete(id);
        this.#handle(this.#id, call.method, call.args).then(call.resolve, call.reject);
      } else if (this.#leader) {
        this.#post({ t: "call", to: this.#leader, id, method: call.method, args: call.args });
      }
    }
  }

  /** What a follower shows: the leader's state, or connecting until it first connected. */
  #show(state) {
    this.#local.receive("state", state === "connected" ? "connected" : this.#joining ? "connecting" : "reconnecting");
  }

  #message(m) {
    if (this.#left || (m.to !== undefined && m.to !== this.#id)) return;
    const leading = this.#session !== null;
    if (m.t === "hello" && leading) {
      // The tab's tokens may be newer than this one's (kept in its storage, heard from a leader
      // before): the session must resume from them too.
      if (m.tokens) this.#local.receive("tokens", m.tokens);
      for (const [topic, options] of Object.entries(m.topics)) this.#want(m.from, topic, options);
      if (!this.#watched.has(m.from)) {
        this.#watched.add(m.from);
        // (Given up when this tab leaves: a page waiting for a lock is not kept in the back/forward cache.)
        globalThis.navigator.locks.request(`${this.#name}:tab:${m.from}`, { signal: this.#quit.signal }, () => this.#tabGone(m.from)).catch(() => {});
      }
      this.#post({ t: "leader", to: m.from, ...this.#status() });
      this.#sync();
    } else if (m.t === "leader" && !leading) {
      if (m.from !== this.#leader) {
        this.#leader = m.from;
        this.#recall();
        if (m.to === undefined) this.#hello();
      }
      this.#local.receive("tokens", m.tokens);
      if (m.welcome) this.#local.receive("welcome", m.welcome);
      this.#show(m.state);
      if (m.state === "connected") this.#joined(m.welcome);
    } else if (m.t === "up" && m.from === this.#leader && !leading) {
      if (m.kind === "state") this.#show(m.data);
      else this.#local.receive(m.kind, m.data);
      if (m.kind === "state" && m.data === "connected") this.#joined(this.#local.welcome);
    } else if (m.t === "call" && leading) {
      const answer = this.#handle(m.from, m.method, m.args);
      if (m.id === undefined) return void answer.catch(() => {});
      // None after leave(): the tab sends its call again to the next leader, and this session's
      // answer then (a publish rejected by its close, though maybe written) must not settle it.
      const reply = (fields) => !this.#left && this.#post({ t: "reply", to: m.from, id: m.id, ...fields });
      answer.then(
        (value) => reply({ value }),
        (error) => reply({ error: { code: error.code ?? "internal", message: error.message } }),
      );
    } else if (m.t === "reply" && m.from === this.#leader) {
      // (A reply of a leader that is gone: the call went again to the next one, which answers it.)
      const call = this.#calls.get(m.id);
      if (!call) return;
      this.#calls.delete(m.id);
      clearTimeout(call.timer);
      if (m.error) call.reject(remoteError(m.error));
      else call.resolve(m.value);
    } else if (m.t === "bye") {
      if (leading) this.#tabGone(m.from);
      else if (m.from === this.#leader) {
        this.#leader = null;
        this.#recall();
        this.#show("reconnecting");
      }
    }
  }

  #post(message) {
    this.#channel?.postMessage({ ...message, from: this.#id });
  }
}

/**
 * The items (events, and gaps for readers that asked for them) of `events()` or of one
 * `topic()` iterator, queued until read. The readers of one feed share its items.
 */
class Feed {
  #topic; // null: events()
  #items; // not read yet
  #readers = []; // {resolve, gaps}: reads waiting for an item
  #ended = false;

  constructor(topic, items = []) {
    this.#topic = topic;
    this.#items = items;
  }

  get topic() {
    return this.#topic;
  }

  get ended() {
    return this.#ended;
  }

  /** Takes the queued items of `topic` out. */
  take(topic) {
    const taken = this.#items.filter((item) => item.topic === topic);
    this.#items = this.#items.filter((item) => item.topic !== topic);
    return taken;
  }

  /** Past `bound` queued items (the window), those `keep` refuses are dropped. */
  push(item, bound, keep) {
    const at = this.#readers.findIndex((reader) => reader.gaps || item.type === "event");
    if (at >= 0) this.#readers.splice(at, 1)[0].resolve({ value: item, done: false });
    else if (this.#readers.length === 0) {
      // (A gap that none of the waiting readers wants is dropped.)
      this.#items.push(item);
      if (this.#items.length > bound) this.#items = this.#items.filter(keep);
    }
  }

  /** Nothing more comes; `drop`: not even what is queued. */
  end(drop) {
    this.#ended = true;
    if (drop) this.#items = [];
    for (const { resolve } of this.#readers.splice(0)) resolve({ value: undefined, done: true });
  }

  iterator(gaps, onReturn) {
    const owner = {}; // marks this iterator's waiting reads
    let returned = false;
    const done = { value: undefined, done: true };
    const next = () => {
      if (returned) return Promise.resolve(done);
      while (this.#items.length > 0) {
        const item = this.#items.shift();
        if (gaps || item.type === "event") return Promise.resolve({ value: item, done: false });
      }
      if (this.#ended) return Promise.resolve(done);
      return new Promise((resolve) => this.#readers.push({ resolve, gaps, owner }));
    };
    return {
      [Symbol.asyncIterator]() {
        return this;
      },
      next,
      return: () => {
        returned = true;
        // Its reads still waiting end now (those of the feed's other iterators go on).
        const mine = this.#readers.filter((reader) => reader.owner === owner);
        this.#readers = this.#readers.filter((reader) => reader.owner !== owner);
        for (const reader of mine) reader.resolve(done);
        onReturn?.();
        return Promise.resolve(done);
      },
    };
  }
}

export class AckgateClient {
  #url;
  #options;
  #shared; // tabs share one session (tabs: "shared" where the page has the APIs for it)
  #session = null; // the session of its own (not shared)
  #tabs = null; // shared: the TabGroup, from connect() to close()
  #state = "closed";
  #failure = null; // while "failed": {code, message, closeCode}
  #welcome = null;
  #tokens; // {committed, epochs}: topic -> partition -> durable committed offset / its offset epoch
  #listeners = new Map(); // event name -> Set of listeners
  #topics = new Map(); // topic -> options: the topics this client subscribed to
  #main = new Feed(null); // the items of events()
  #feeds = new Set(); // the feeds of the open topic() iterators
  #buffering = false; // from the first subscribe() or events() on, events wait for a reader
  // Delivery ids handed out and not acked, nacked or termed here -> the session_id they came in.
  // (Kept across reconnects, oldest dropped past twice the window: see #current.)
  #held = new Map();
  #settledCount = 0; // acks, nacks and terms made: a stall is a full window with none of them
  #stallTimer = null; // the `stalled` check armed while the window is full (#watchStall)
  #joined = false; // shared: the tabs joined (before that, publishes and subscribes wait in #early)
  #early = []; // shared: publishes and subscribes made before the tabs joined: {method, args, resolve, reject}
  // A page's network and lifecycle events (Node.js has none): back online, or visible again after
  // a sleep, a reconnect waiting out its backoff goes at once and an open connection is checked;
  // offline, the connection is given up and no attempt is made until online; into the
  // back/forward cache and out of it (pagehide and pageshow, `persisted`): #cache.
  #page = ({ type, persisted }) => {
    if (type.startsWith("page")) persisted && this.#cache(type === "pagehide");
    else if (type !== "visibilitychange" || globalThis.document.visibilityState === "visible") this.#live()?.nudge(type === "offline");
  };

  /**
   * @param {string} url the /ws URL without query, e.g. "ws://host:8080/ws"
   * @param {import("./index.d.ts").AckgateClientOptions} options
   */
  constructor(url, options) {
    // Missing or not what the gateway takes (it refuses such an id at the handshake, which a page
    // sees as an outage only, tried again for ever).
    if (!CLIENT_ID.test(options?.clientId ?? "")) throw new TypeError(`options.clientId ${JSON.stringify(options?.clientId)} breaks the client id rule ${CLIENT_ID.source}`);
    const transport = options.transport ?? "websocket";
    if (!TRANSPORTS.includes(transport)) {
      throw new TypeError(`options.transport is "websocket", "sse" or "auto", not ${JSON.stringify(options.transport)}`);
    }
    const hasEventSource = Boolean(options.EventSource ?? globalThis.EventSource);
    if (transport === "sse" && !hasEventSource) {
      throw new TypeError('transport "sse" needs an EventSource: pass options.EventSource');
    }
    if (transport !== "sse" && !(options.WebSocket ?? globalThis.WebSocket) && !(transport === "auto" && hasEventSource)) {
      throw new TypeError(
        "no WebSocket here: use Node.js 22+ (20: --experimental-websocket) or pass options.WebSocket",
      );
    }
    if (options.tabs !== undefined && options.tabs !== "shared" && options.tabs !== "own") {
      throw new TypeError(`options.tabs is "shared" or "own", not ${JSON.stringify(options.tabs)}`);
    }
    this.#url = url;
    this.#options = options;
    // Tabs share a session where a page has Web Locks and BroadcastChannel (elsewhere, e.g. in
    // Node.js, two clients of one id in one process are two sessions, as they always were).
    this.#shared = options.tabs !== "own" && globalThis.document !== undefined && typeof globalThis.BroadcastChannel === "function" && Boolean(globalThis.navigator?.locks);
    this.#tokens = {
      committed: load(options.storage, `ackgate:${options.clientId}:resume`),
      // topic -> partition -> the offset epoch the gateway last named (`subscribed`, SSE ids): a
      // token is trusted above the stored offset only within its epoch, and a newer epoch (an
      // operator's reset, a lost log tail) replaces the token instead of being outbid by it.
      epochs: load(options.storage, `ackgate:${options.clientId}:epochs`),
      // topic (or topic and group) -> the resume token the gateway last issued for it: sent back
      // as is when the subscription starts again.
      issued: load(options.storage, `ackgate:${options.clientId}:tokens`),
    };
    if (!this.#shared) this.#session = this.#newSession((kind, data) => this.#receive(kind, data));
  }

  /** "connecting", "connected", "reconnecting", "closed" (also before connect()) or "failed"
   * (the gateway refused this client for good: see `failure`). */
  get state() {
    return this.#state;
  }

  /** While `state` is "failed", why: `{code, message, closeCode}`; else null. */
  get failure() {
    return this.#failure;
  }

  /** The welcome of the current (or last) session. */
  get welcome() {
    return this.#welcome;
  }

  /** Calls `listener` on each `name` ("event", "state", "gap", ...); returns what removes it. */
  on(name, listener) {
    if (!Object.hasOwn(LISTENED, name)) throw new TypeError(`no event ${JSON.stringify(name)}: ${Object.keys(LISTENED).join(", ")}`);
    if (!this.#listeners.has(name)) this.#listeners.set(name, new Set());
    this.#listeners.get(name).add(listener);
    return () => this.off(name, listener);
  }

  off(name, listener) {
    this.#listeners.get(name)?.delete(listener);
  }

  /**
   * Opens the session (or joins the one tabs of this client id share); resolves with the welcome
   * frame. A gateway that cannot be reached is tried again with the reconnect backoff: it rejects
   * only at close(), a final close (credentials refused: their code), or with `reconnect: false`
   * at the first failure.
   */
  async connect() {
    this.#failure = null; // (a failed client starts over)
    if (this.#main.ended) this.#main = new Feed(null); // connected again after a close
    for (const name of PAGE_EVENTS) globalThis.addEventListener?.(name, this.#page);
    globalThis.document?.addEventListener?.("visibilitychange", this.#page);
    if (!this.#shared) return this.#session.connect();
    this.#tabs?.leave();
    this.#joined = false;
    const client = this;
    const tabs = new TabGroup(this.#options, {
      topics: this.#topics,
      tokens: this.#tokens,
      get welcome() {
        return client.#welcome;
      },
      receive: (kind, data) => this.#tabs === tabs && this.#receive(kind, data),
      session: (emit) => this.#newSession(emit),
    });
    this.#tabs = tabs;
    this.#receive("state", "connecting");
    try {
      const welcome = await tabs.join();
      if (this.#tabs === tabs) {
        this.#joined = true;
        this.#flush();
      }
      return welcome;
    } catch (error) {
      if (this.#tabs !== tabs) throw error;
      this.#tabs = null;
      if (tabs.locksRefused) {
        // Web Locks refused (an opaque origin, a sandboxed frame): a session of its own.
        this.#shared = false;
        this.#session = this.#newSession((kind, data) => this.#receive(kind, data));
        this.#flush();
        return this.#session.connect();
      }
      this.#receive("state", "closed");
      throw error;
    }
  }

  /**
   * Into the back/forward cache (`hidden`) and out of it. A page with an open connection, or one
   * that holds a Web Lock, is not kept there: its connection closes, its session waiting with what
   * it resumes from; a tab that shares its session leaves the tabs at once (its locks go, and the
   * lead to another tab). Shown again, it reconnects, or joins the tabs again, with the resume
   * tokens it holds, as after a lost connection.
   */
  #cache(hidden) {
    if (!this.#shared) return this.#session.pause(hidden);
    // (Closed: a connect() that failed, whose listeners stay; there are no tabs to leave or join.)
    if (this.#state === "closed") return;
    if (!hidden) return this.connect().catch(() => {}); // (a failure is reported as such)
    this.#tabs?.leave(true);
    this.#tabs = null;
    this.#joined = false;
    this.#receive("state", "reconnecting");
  }

  /** Sends on the publishes and subscribes made before the tabs joined (not those of a topic
   * unsubscribed meanwhile). */
  #flush() {
    for (const { method, args, resolve, reject } of this.#early.splice(0)) {
      if (method === "subscribe" && !this.#topics.has(args[0])) reject(new AckgateError("closed", "unsubscribed before it was sent"));
      else this.#call(method, args).then(resolve, reject);
    }
  }

  #newSession(emit) {
    return new Session(this.#url, this.#options, this.#tokens, emit);
  }

  /** The session this page runs, if any (its own, or the tabs' while this one leads). */
  #live() {
    return this.#shared ? this.#tabs?.session : this.#session;
  }

  /** A request: to its own session, or through the tabs' leader. */
  #call(method, args) {
    if (!this.#shared) return this.#session[method](...args);
    if ((method === "publish" || method === "subscribe") && !this.#joined) {
      // Until the tabs joined (before connect(), say), a publish or a subscribe waits, as it
      // waits for the connection on a session of its own; not after close() (the events() feed
      // ended then).
      if (this.#main.ended) return Promise.reject(new AckgateError("closed", "the client is closed for good"));
      const most = this.#options.maxQueuedPublishes ?? 100;
      if (method === "publish" && this.#early.filter((call) => call.method === method).length >= most) {
        return Promise.reject(new AckgateError("limit_exceeded", `${most} publishes are waiting (maxQueuedPublishes)`));
      }
      return new Promise((resolve, reject) => this.#early.push({ method, args, resolve, reject }));
    }
    if (this.#tabs) return this.#tabs.call(method, args);
    return silent(method, args) ? undefined : Promise.reject(new AckgateError("closed", "not connected"));
  }

  /**
   * Subscribes; remembered, so a reconnect subscribes again (with a resume token). Without an
   * explicit `resume`, a token kept in `storage` (from before a page reload) is sent. Before
   * connect(), or while (re)connecting, it waits for the session; it rejects when the gateway
   * refuses it, and at close() or a final close.
   */
  async subscribe(topic, options = {}) {
    // Events that arrive before `events()` is iterated (during a second subscribe, say) wait
    // for it instead of coming back only after the ack timeout.
    this.#buffering = true;
    const known = this.#topics.has(topic);
    // Taken before the answer: with tabs sharing a session, the first events may come first.
    const { resume, epochs, ...kept } = options;
    this.#topics.set(topic, kept);
    try {
      return await this.#call("subscribe", [topic, options]);
    } catch (error) {
      if (!known) this.#topics.delete(topic);
      throw error;
    }
  }

  unsubscribe(topic) {
    this.#drop(topic);
    return this.#call("unsubscribe", [topic]);
  }

  /**
   * Acknowledges one id or many. `{ confirm: true }` resolves with `ack_ok` once the offsets are
   * durable; otherwise the ack is plain, except that a partition not confirmed for
   * `confirmEveryMs` gets a confirmed one (its `ack_ok` refreshes the resume token).
   */
  ack(ids, options = {}) {
    const list = this.#current(Array.isArray(ids) ? ids : [ids], true);
    if (list.length === 0) {
      return options.confirm ? Promise.reject(new AckgateError("closed", "the session that delivered them ended: they come again")) : Promise.resolve();
    }
    const session = this.#welcome?.session_id;
    return this.#call("ack", [Array.isArray(ids) ? list : list[0], { ...options, session }]) ?? Promise.resolve();
  }

  nack(id, delayMs) {
    if (this.#current([id], true).length) this.#call("nack", [id, delayMs, this.#welcome?.session_id]);
  }

  extend(id) {
    if (this.#current([id], false).length) this.#call("extend", [id, this.#welcome?.session_id]);
  }

  term(id, reason) {
    if (this.#current([id], true).length) this.#call("term", [id, reason, this.#welcome?.session_id]);
  }

  /**
   * The ids of `ids` that may be sent on the current session: not those of events that came in
   * an earlier one. The gateway released them when that session ended and delivers them again;
   * and a delivery id is unique on its instance only, so on another one it may name another
   * event (acked, it would be lost). Ids this client never handed out go as they are. `settle`:
   * they are no longer held. The session (leader tab) checks the session named with them too.
   */
  #current(ids, settle) {
    const session = this.#welcome?.session_id;
    if (settle) this.#settledCount++;
    return ids.filter((id) => {
      const from = this.#held.get(id);
      if (settle) this.#held.delete(id);
      return from === undefined || from === session;
    });
  }

  ping() {
    return this.#call("ping", []);
  }

  /**
   * Publishes one event (`{payload, key?, partition?, headers?}`) or a list of them to `topic`
   * over the session; resolves with the `published` frame (`offsets` in the order given).
   * While disconnected it waits (at most `maxQueuedPublishes`, default 100, publishes) and goes
   * out after the reconnect; each publish carries an idempotency key (`idempotencyKey`, or a
   * random one), so one sent again after a lost answer is never written twice.
   */
  publish(topic, events, { idempotencyKey = randomKey() } = {}) {
    return this.#call("publish", [topic, events, { idempotencyKey }]);
  }

  /**
   * Every event of the topics without a `topic()` iterator, for `for await (const event of
   * client.events())`, those queued since the first `subscribe()` first; ends after a final
   * close. `{gaps: true}`: gaps come too (items of type "gap"). Readers share the events.
   */
  events({ gaps = false } = {}) {
    this.#buffering = true;
    return this.#main.iterator(gaps);
  }

  /**
   * The events of `topic` only (each `topic()` iterator gets all of them; `events()` no longer
   * does), those that came since its subscribe first; ends at its unsubscribe, when a
   * resubscribe is refused for good, and after a final close. `{gaps: true}` as for `events()`.
   */
  topic(topic, { gaps = false } = {}) {
    const feed = new Feed(topic, this.#main.take(topic));
    if (this.#main.ended) feed.end(false);
    else this.#feeds.add(feed);
    return feed.iterator(gaps, () => {
      this.#feeds.delete(feed);
      feed.end(true);
    });
  }

  /** Closes for good: no reconnect follows. */
  close() {
    this.#failure = null; // (a failed client closes too: "closed" from now on)
    if (this.#shared) {
      const connected = this.#tabs !== null;
      this.#tabs?.leave();
      this.#tabs = null;
      this.#receive("state", "closed");
      if (connected) this.#emit("close", { code: 1000, reason: "bye", final: true });
    } else {
      this.#session.close();
    }
    this.#finish();
  }

  /**
   * The resume token of `topic`: per partition, the offset after the contiguous acknowledged
   * floor the gateway confirmed durable, or where the subscription started.
   */
  resumeToken(topic, group) {
    return { ...this.#tokens.committed[issuedKey(topic, group)] };
  }

  /**
   * The resume token the gateway last issued for `topic` (with `group`: for that shared
   * subscription), as `subscribe`'s `resume` takes it back; undefined before the first.
   */
  issuedToken(topic, group) {
    return this.#tokens.issued[issuedKey(topic, group)];
  }

  /**
   * The offset epochs of `topic`'s resume token (`{"<partition>": epoch}`, partitions of epoch 0
   * left out): keep them with a token you store yourself and pass both to `subscribe`.
   */
  resumeEpochs(topic, group) {
    return { ...this.#tokens.epochs[issuedKey(topic, group)] };
  }

  /** Calls the `onX` option and the `on()` listeners of `name` (see `invoke`: one that throws
   * does not stop the client). */
  #emit(name, value) {
    for (const listener of [this.#options[LISTENED[name]], ...(this.#listeners.get(name) || [])]) invoke(listener, value);
  }

  /** A report of the session (its own, or the one tabs share): see Session. */
  #receive(kind, data) {
    // A state it has already, or "closed" while a failure stands (until close() or connect(): the
    // final close's "closed" does not replace "failed"), is no change.
    if (kind === "state" && (data === this.#state || (this.#failure && data === "closed"))) return;
    if (this.#options.debug) log(this.#options.debug, kind, data);
    if (kind === "frame") return this.#frame(data);
    if (kind === "tokens") {
      // Another tab's tokens (the leader's; a follower's hello, at the leader): merged.
      if (data !== this.#tokens && merge(this.#tokens, data)) store(this.#options, this.#tokens);
    } else if (kind === "welcome") {
      this.#welcome = data;
    } else if (kind === "state") {
      this.#state = data;
      this.#emit("state", data);
    } else if (kind === "dropped") {
      if (!this.#topics.has(data.topic)) return; // another tab's topic
      this.#drop(data.topic);
      invoke(this.#options.onSubscriptionDropped, data);
    } else {
      if (kind === "failed") {
        this.#failure = data;
        this.#receive("state", kind);
      }
      this.#emit(kind, data);
      if (kind === "close" && data.final) this.#finish();
    }
  }

  #frame(frame) {
    if (frame.type === "welcome") this.#welcome = frame;
    // Tabs that share a session share its frames: each takes those of its own topics.
    if (this.#shared && frame.topic !== undefined && !this.#topics.has(frame.topic)) return;
    this.#emit("frame", frame);
    if (frame.type === "event") {
      this.#held.set(frame.delivery_id, this.#welcome?.session_id);
      // Ids never settled here (events the app dropped, superseded by a redelivery) go, oldest
      // first, past twice the window.
      if (this.#held.size > 2 * this.#window()) this.#held.delete(this.#held.keys().next().value);
      this.#settlers(frame);
      this.#watchStall();
      this.#emitEvent(frame);
      this.#deliver(frame);
    } else if (frame.type === "gap") {
      this.#gap(frame);
    } else if (frame.type === "subscribed") {
      // Events that were gone from the log before the subscription started are a gap too.
      for (const { partition, gap } of frame.partitions || []) {
        if (gap) this.#gap({ type: "gap", topic: frame.topic, partition, from: gap.from, to: gap.to });
      }
    }
  }

  #gap(gap) {
    this.#emit("gap", gap);
    this.#deliver(gap);
  }

  /** `event.ack()`, `nack()`, `extend()` and `term()`: the client's, for this delivery. Not
   * enumerable: the frame stays the gateway's object for JSON.stringify and logs. */
  #settlers(frame) {
    const id = frame.delivery_id;
    Object.defineProperties(frame, {
      ack: { value: (options) => this.ack(id, options) },
      nack: { value: (delayMs) => this.nack(id, delayMs) },
      extend: { value: () => this.extend(id) },
      term: { value: (reason) => this.term(id, reason) },
    });
  }

  /** To the `event` listeners; with `autoAck`, acked once every listener returned (or its promise
   * resolved) and nacked when one threw (or rejected): a handler cannot forget it. */
  #emitEvent(frame) {
    if (!this.#options.autoAck) return this.#emit("event", frame);
    const listeners = [this.#options.onEvent, ...(this.#listeners.get("event") || [])].filter(Boolean);
    if (listeners.length === 0) return;
    const outcomes = listeners.map((listener) => {
      try {
        return Promise.resolve(listener(frame));
      } catch (error) {
        return Promise.reject(error);
      }
    });
    Promise.all(outcomes).then(
      () => frame.ack().catch(() => {}), // closed meanwhile: the event comes again
      (error) => {
        frame.nack();
        report(error, "an event handler threw; the event is nacked");
      },
    );
  }

  /** A full window with nothing settled for `stalledAfterMs` (default 10000; 0: never) is said
   * once with a `stalled` event: a loop that never acks stops at the window, still connected. */
  #watchStall() {
    const after = this.#options.stalledAfterMs ?? 10000;
    if (after <= 0 || this.#stallTimer || this.#held.size < this.#window()) return;
    const settled = this.#settledCount;
    this.#stallTimer = setTimeout(() => {
      this.#stallTimer = null;
      if (this.#settledCount !== settled || this.#held.size < this.#window()) return;
      this.#emit("stalled", { held: this.#held.size, window: this.#window(), sinceMs: after });
    }, after);
  }

  /** The session's window: at most this many deliveries unacknowledged. */
  #window() {
    return this.#welcome?.max_in_flight ?? 1000;
  }

  /** To the topic's iterators, or else (once asked for) to events(). */
  #deliver(item) {
    const bound = this.#window();
    // Past the window, events no longer held (acked, nacked or termed through `on("event")` by
    // an app that never iterates) are dropped from the queues.
    const keep = (queued) => queued.type !== "event" || this.#held.has(queued.delivery_id);
    let taken = false;
    for (const feed of this.#feeds) {
      if (feed.topic === item.topic) {
        feed.push(item, bound, keep);
        taken = true;
      }
    }
    if (!taken && this.#buffering) this.#main.push(item, bound, keep);
  }

  /** The topic is no longer subscribed here: its iterators end. */
  #drop(topic) {
    this.#topics.delete(topic);
    for (const feed of [...this.#feeds]) {
      if (feed.topic === topic) {
        this.#feeds.delete(feed);
        feed.end(true);
      }
    }
  }

  /** Closed for good: the iterators end once they gave what they hold; the tabs are left; the
   * page's listeners go; publishes waiting for the tabs are rejected. */
  #finish() {
    clearTimeout(this.#stallTimer);
    this.#stallTimer = null;
    for (const name of PAGE_EVENTS) globalThis.removeEventListener?.(name, this.#page);
    globalThis.document?.removeEventListener?.("visibilitychange", this.#page);
    this.#joined = false;
    for (const { reject } of this.#early.splice(0)) reject(new AckgateError("closed", "the client is closed"));
    this.#receive("state", "closed");
    this.#main.end(false);
    for (const feed of this.#feeds) feed.end(false);
    this.#feeds.clear();
    if (this.#tabs) {
      this.#tabs.leave();
      this.#tabs = null;
    }
  }
}
