// Types of ackgate-client (ackgate.js). Written by hand; `tsc --noEmit` (strict, with
// exactOptionalPropertyTypes) checks them against examples/typed.ts and the React example.
// Licensed under the Apache License, Version 2.0.

/** `{"<partition>": next_offset}`: where each partition of a topic resumes. */
export type ResumeToken = Record<string, number>;

/** Where a subscription starts: see docs/protocol.md (`{last: n}`: the last n events of each partition). */
export type StartFrom = "committed" | "earliest" | "latest" | { time: number } | { last: number };

export type ErrorCode =
  | "bad_frame"
  | "invalid_name"
  | "unknown_topic"
  | "not_subscribed"
  | "unknown_delivery"
  | "limit_exceeded"
  | "unauthorized"
  | "forbidden"
  | "unavailable"
  | "internal"
  | "bad_request"
  | "not_found"
  | "conflict";

export interface WelcomeFrame {
  type: "welcome";
  session_id: string;
  client_id: string;
  instance: string;
  ack_timeout_ms: number;
  max_in_flight: number;
  /** Over Server-Sent Events only: where the client's frames are POSTed (a path on the gateway). */
  ack_url?: string;
}

export interface SubscribedFrame {
  type: "subscribed";
  topic: string;
  req?: string | number;
  /** The shared subscription joined (`subscribe` with `group`). */
  group?: string;
  /** `epoch`: the partition's offset epoch; a token is trusted above the stored offset only within it. */
  partitions: { partition: number; from: number; epoch: number; gap?: { from: number; to: number } }[];
  /** The resume token as of this start (opaque; the client keeps it for the next subscribe). */
  token: string;
  /** When a token was sent: whether it was applied, and why not. A refused token is no error. */
  resume?: "applied" | "refused";
  resume_reason?: "invalid" | "other_client" | "other_group" | "other_incarnation" | "expired";
}

/** One delivery. `T`: the payload's type, as the app knows it (the client does not check it). */
export interface EventFrame<T = unknown> {
  type: "event";
  delivery_id: string;
  topic: string;
  partition: number;
  offset: number;
  /** 1 on the first delivery. */
  attempt: number;
  /** Epoch ms. */
  timestamp: number;
  key: string | null;
  headers: Record<string, string>;
  /** Headers whose value is not UTF-8, base64 (absent when there are none). */
  headers_base64?: Record<string, string>;
  /** True for a dead letter an operator sent again. */
  redrive?: true;
  /** The value, when it is JSON. */
  payload?: T;
  /** The value, base64, when it is not JSON. */
  payload_base64?: string;
  /** `client.ack(this.delivery_id, options)` (not enumerable: JSON.stringify leaves it out). */
  ack(options: { confirm: true }): Promise<AckOkFrame>;
  ack(options?: { confirm?: boolean | undefined }): Promise<AckOkFrame | void>;
  /** `client.nack(this.delivery_id, delayMs)`. */
  nack(delayMs?: number): void;
  /** `client.extend(this.delivery_id)`. */
  extend(): void;
  /** `client.term(this.delivery_id, reason)`. */
  term(reason?: string): void;
}

/** Said once when the window has been full (`held` deliveries not settled, `window` the
 * gateway's `max_in_flight`) with nothing acked, nacked or termed for `sinceMs`. */
export interface StalledInfo {
  held: number;
  window: number;
  sinceMs: number;
}

/**
 * Events `from`..`to`-1 of a partition are gone (removed by retention) and will never come: sent
 * by the gateway mid-session, or named by a `subscribed` frame's partition (`gap`).
 */
export interface GapFrame {
  type: "gap";
  topic: string;
  partition: number;
  from: number;
  to: number;
}

export interface AckOkFrame {
  type: "ack_ok";
  req: string | number;
  committed: Record<string, Record<string, number>>;
  /** A fresh resume token per topic the ack touched. */
  tokens: Record<string, string>;
}

export interface PublishedFrame {
  type: "published";
  req?: string | number;
  /** One per event, in the order given. */
  offsets: { partition: number; offset: number }[];
  /** True when the idempotency key repeated an earlier publish (nothing was written again). */
  replayed?: boolean;
}

export interface UnsubscribedFrame {
  type: "unsubscribed";
  topic: string;
  req?: string | number;
}

export interface PongFrame {
  type: "pong";
  req?: string | number;
}

/** One event to publish, as the REST body's events. */
export interface NewEvent<T = unknown> {
  payload?: T;
  payload_base64?: string;
  key?: string;
  partition?: number;
  headers?: Record<string, string>;
}

export interface ErrorFrame {
  type: "error";
  /** A protocol error code; in `onError` also `closed` or `timeout` (a failed token refresh's request). */
  code: ErrorCode | "closed" | "timeout";
  message: string;
  req?: string | number;
}

export type ServerFrame<T = unknown> =
  | WelcomeFrame
  | SubscribedFrame
  | EventFrame<T>
  | GapFrame
  | AckOkFrame
  | PublishedFrame
  | UnsubscribedFrame
  | PongFrame
  | ErrorFrame
  | { type: "refresh_needed"; expires_at: number }
  | { type: "refreshed"; req?: string | number; expires_at: number | null }
  | { type: "reconnect"; after_ms: number; instance?: string; ws_url?: string }
  | { type: "progress"; tokens: Record<string, string> };

/**
 * How the client reaches its session: a WebSocket (the default), Server-Sent Events (`GET /sse`
 * down, client frames POSTed up), or `auto`: a WebSocket, falling back to SSE for good when the
 * socket fails before its welcome.
 */
export type Transport = "websocket" | "sse" | "auto";

/**
 * `connecting`: connect() called, no welcome yet (a first connect that fails is tried again in
 * this state); `connected`: a session is open; `reconnecting`: it was lost and the client is
 * getting another; `closed`: before connect(), after close(), or after a final close that is not
 * a refusal (with `reconnect: false`, a lost connection or a first connect() that failed);
 * `failed`: the gateway refused this client for good (credentials refused, 1008; taken over by a
 * newer session of its client id, 4001): `failure` says why, no reconnect follows, and
 * `connect()` starts over.
 */
export type ClientState = "connecting" | "connected" | "reconnecting" | "closed" | "failed";

/** A close of the session; `final`: no reconnect follows. */
export interface CloseInfo {
  code: number;
  reason: string;
  final: boolean;
}

/**
 * Why the client failed (`state` `"failed"`): `code` is the gateway's `error` frame's before the
 * close (`unauthorized`: no credentials, or invalid or expired ones; `forbidden`: valid ones that
 * do not allow this client id), else the close code's meaning (1008: `unauthorized`; 4001:
 * `taken_over`, by a newer session of the same client id); `message` the frame's (else the close
 * reason); `closeCode` the close code (1008 or 4001).
 */
export interface Failure {
  code: ErrorCode | "taken_over";
  message: string;
  closeCode: number;
}

/** Before each reconnect attempt (also those that retry a first connect() that failed) `{attempt, delayMs, url}`, after a failed one `error` too, after a success `{attempt, url, welcome}`. */
export interface ReconnectProgress {
  attempt: number;
  delayMs?: number;
  url: string;
  error?: string;
  welcome?: WelcomeFrame;
}

/** What `on(name, listener)` hands each listener. */
export interface AckgateEvents<T = unknown> {
  /** Every event of this client's topics (as well as to the iterators). */
  event: EventFrame<T>;
  /** Each change of `state`. */
  state: ClientState;
  /** Every gap: events removed by retention that will never come. */
  gap: GapFrame;
  /** An `error` frame that answers no request (over SSE also a refused POST of frames without one, e.g. plain acks; a failed token refresh). */
  error: ErrorFrame;
  close: CloseInfo;
  reconnect: ReconnectProgress;
  /** Every frame received, for logging. */
  frame: ServerFrame<T>;
  /** The window is full and nothing was settled for `stalledAfterMs`: the app is not acking. */
  stalled: StalledInfo;
  /** The gateway refused the client for good: `state` is `"failed"` (that `state` event comes first, the `close` after). */
  failed: Failure;
}

/** What the client uses of an EventSource (the browser's, or one passed as `EventSource`). */
export interface EventSourceLike {
  readonly readyState: number;
  addEventListener(type: string, listener: (event: any) => void): void;
  close(): void;
}

/** What the client uses of a WebSocket (the runtime's, or one passed as `WebSocket`). */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onmessage: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
  onclose: ((event: any) => void) | null;
}

/** What `storage` needs: `sessionStorage` and `localStorage` have it. */
export interface TokenStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
}

export interface AckgateClientOptions<T = unknown> {
  /** The client's durable identity (`^[A-Za-z0-9._:@-]{1,128}$`, else the constructor throws a TypeError), e.g. `deviceClientId()`: see docs/clients.md for how to choose it. */
  clientId: string;
  /** `websocket` (default), `sse` or `auto` (a WebSocket, else Server-Sent Events). `sse` without an EventSource throws. */
  transport?: Transport | undefined;
  /**
   * `shared` (the default): in a page with Web Locks and BroadcastChannel, the tabs of one origin
   * with this `clientId` share one session, led by one tab; elsewhere (Node.js), or where Web Locks
   * refuse (an opaque origin, a sandboxed frame), each client has its own. `own`: a session of its own (a second tab with the same id takes it over: 4001).
   */
  tabs?: "shared" | "own" | undefined;
  /** The EventSource constructor for `sse` and `auto` (default `globalThis.EventSource`; Node has none). */
  EventSource?: (new (url: string) => EventSourceLike) | undefined;
  /** The WebSocket constructor (default `globalThis.WebSocket`; Node.js 20 has one only with `--experimental-websocket`). */
  WebSocket?: (new (url: string) => WebSocketLike) | undefined;
  /** SSE: at most this many client frames per POST (default 10000, the gateway's `limits.max_batch_events`). */
  maxBatchFrames?: number | undefined;
  /** A JWT, when the gateway checks tokens (`auth.jwt_secret` or `auth.jwks_url`; in the URL; SSE POSTs send it as `Authorization: Bearer`). */
  token?: string | undefined;
  /** Called before each connect (and reconnect), and when the gateway asks for a refresh, for a fresh JWT; wins over `token`. One that throws at a connect fails that attempt: the next follows. */
  tokenProvider?: (() => string | Promise<string>) | undefined;
  /** Where the resume token survives a page reload (e.g. `sessionStorage`); off by default. */
  storage?: TokenStorage | undefined;
  /** At most one confirmed ack per partition this often (default 1000); the rest are plain. After a draining instance's `reconnect` frame every ack is confirmed. */
  confirmEveryMs?: number | undefined;
  /** An attempt to connect (the first or a reconnect) without its welcome this long (default 10000 ms) is abandoned: a failed attempt, the next follows (with `reconnect: false`, connect() rejects with `timeout`). 0: no limit. */
  connectTimeoutMs?: number | undefined;
  /** A request without its answer this long (default 10000 ms) rejects with `timeout`, and the connection is checked with a ping. 0: no limit. */
  requestTimeoutMs?: number | undefined;
  /** A ping every this many ms (default 20000; 0: none) finds a dead connection. In a page, back online or visible again pings at once. */
  heartbeatMs?: number | undefined;
  /**
   * Nothing heard this long after a heartbeat ping (default 10000 ms; any frame answers it, not
   * only the pong) abandons the connection: the client reconnects. 0: no limit. Wall-clock time:
   * a check whose timer ran late (a throttled or frozen tab, a device asleep) waits one more
   * period for the frames that came meanwhile, so it never gives a live connection up for that.
   */
  heartbeatTimeoutMs?: number | undefined;
  /** Publishes that may wait for a connection (default 100; a follower tab's wait for the leader, too); more reject with `limit_exceeded`. A publish the gateway closes the session for (1009, over its `limits.max_frame_bytes`) rejects with `limit_exceeded`. */
  maxQueuedPublishes?: number | undefined;
  /** Reconnect after a close that is not final, and try a first connect() that fails again (default true). false: connect() rejects at the first failure and a lost session is not replaced. */
  reconnect?: boolean | undefined;
  /** Other instances' http(s) base URLs, asked for `/session/recommend`. */
  peers?: string[] | undefined;
  /** First reconnect pause (default 250); doubles up to `maxBackoffMs` (default 10000), with jitter. The same for the retries of a first connect(). Back online (or the page shown again) ends the pause and starts the backoff over; offline, or in the back/forward cache, no attempt is made (nor counted). */
  backoffMs?: number | undefined;
  maxBackoffMs?: number | undefined;
  /** With `autoAck`, a handler may return a promise: the event is acked once it resolves. */
  onEvent?: ((event: EventFrame<T>) => void | Promise<unknown>) | undefined;
  /** Ack each event once every `event` listener (`onEvent`, `on("event")`) returned or its promise resolved; nack it when one threw or rejected (default false). Iterators are not affected. */
  autoAck?: boolean | undefined;
  /** A full window with nothing acked, nacked or termed this long (default 10000 ms; 0: never) emits `stalled` once. */
  stalledAfterMs?: number | undefined;
  onStalled?: ((stalled: StalledInfo) => void) | undefined;
  onState?: ((state: ClientState) => void) | undefined;
  onGap?: ((gap: GapFrame) => void) | undefined;
  /** An `error` frame that answers no request (over SSE also a refused POST of frames without one, e.g. plain acks). */
  onError?: ((frame: ErrorFrame) => void) | undefined;
  onClose?: ((close: CloseInfo) => void) | undefined;
  onFrame?: ((frame: ServerFrame<T>) => void) | undefined;
  onReconnect?: ((progress: ReconnectProgress) => void) | undefined;
  /** The gateway refused the client for good (see `failure`): a bad token, another client's, a takeover. */
  onFailed?: ((failure: Failure) => void) | undefined;
  /**
   * Logs what the session reports (`frame`: each frame received; `state`, `close`, `reconnect`,
   * `error`, `failed`, `tokens`, ...) and each frame sent (`send`): `true` to
   * `console.debug("ackgate", what, data)`, or to this function. Off by default, when it costs
   * one test per frame. (In a tab that shares its session, the leader tab logs the frames sent.)
   */
  debug?: boolean | ((what: string, data: unknown) => void) | undefined;
  /** A subscription refused for good at a resubscribe (unknown_topic, forbidden, invalid_name). */
  onSubscriptionDropped?: ((dropped: { topic: string; code: ErrorCode; message: string }) => void) | undefined;
}

export interface SubscribeOptions {
  from?: StartFrom | undefined;
  /** A token kept by the app, sent instead of the one the client holds: the gateway's
   * (`issuedToken`), or the older offsets (`resumeToken`, own subscriptions only). */
  resume?: string | ResumeToken | undefined;
  /** The offset epochs of `resume` (`resumeEpochs`). */
  epochs?: ResumeToken | undefined;
  /** Join that shared subscription of the topic (each event goes to one member). */
  group?: string | undefined;
  /** `key`: each key at one member at a time, in offset order. */
  order?: "none" | "key" | undefined;
}

/**
 * A set nobody can change: what the client's read-only sets have (not a `ReadonlySet`: they have
 * no set algebra methods such as `union`).
 */
export interface FrozenSet<T> extends Iterable<T> {
  readonly size: number;
  has(value: T): boolean;
  forEach(callback: (value: T, key: T, set: FrozenSet<T>) => void, thisArg?: unknown): void;
  keys(): IterableIterator<T>;
  values(): IterableIterator<T>;
  entries(): IterableIterator<[T, T]>;
  [Symbol.iterator](): IterableIterator<T>;
}

/** This package's version, e.g. `"0.3.0"` (package.json's). */
export declare const version: string;

/** Closes after which the client does not reconnect by itself (1008, 4001): the state `failed`. Read-only. */
export declare const FINAL_CLOSES: FrozenSet<number>;
/** Errors after which a resubscribe drops its topic. Read-only. */
export declare const FINAL_SUBSCRIBE_ERRORS: FrozenSet<ErrorCode>;

/**
 * A client id for this device (a browser profile): `prefix` and a random part made once and kept
 * in `localStorage` under `"ackgate:device-id"` (where there is no localStorage, or the page may
 * not use it: in memory, for this page load or process). Each device keeps its own offsets, and a
 * second device does not take the first one's session over (as with `clientId: user.id`). A
 * `prefix` such as `` `${user.id}:` `` keeps two users of one device apart; with JWTs the token's
 * `sub` must be this id. Throws a TypeError when `prefix` would break the client id rule
 * (`^[A-Za-z0-9._:@-]{1,128}$`; the random part is 32 of them).
 */
export declare function deviceClientId(prefix?: string): string;

export declare class AckgateError extends Error {
  constructor(code: string, message: string);
  /**
   * An error code of the protocol (over SSE also of a refused POST), `closed` when the session
   * closed or was not open, `timeout` when no answer (or no welcome) came in time, or
   * `taken_over` when connect() lost its session to a newer one of its client id (4001).
   */
  code: ErrorCode | "closed" | "timeout" | "taken_over";
}

/** `T`: the payload type of this client's events (not checked at run time). */
export declare class AckgateClient<T = unknown> {
  constructor(url: string, options: AckgateClientOptions<T>);
  /** Where the session stands; a `state` event comes at each change. */
  readonly state: ClientState;
  /** While `state` is `"failed"`, why; else null. */
  readonly failure: Failure | null;
  /** The welcome of the current (or last) session. */
  readonly welcome: WelcomeFrame | null;
  /** Listens beside the `onX` options; returns a function that removes the listener. */
  on<K extends keyof AckgateEvents<T>>(name: K, listener: (value: AckgateEvents<T>[K]) => void): () => void;
  off<K extends keyof AckgateEvents<T>>(name: K, listener: (value: AckgateEvents<T>[K]) => void): void;
  /**
   * Opens the session over the `transport` (or joins the one its tabs share); resolves with its
   * welcome (`ack_url` set when SSE carries it). A gateway that cannot be reached (not up yet, no
   * network) is tried again with the reconnect backoff (`reconnect` events, `state`
   * `"connecting"`) until one answers: it rejects only at `close()` (`closed`), when the gateway
   * refuses the credentials (`unauthorized`, `forbidden`: a final close, the state `"failed"`), or
   * with `reconnect: false` at the first failure. Called again (after a failure, or after
   * `close()`), it starts over.
   */
  connect(): Promise<WelcomeFrame>;
  /**
   * Resolves with `subscribed`. Made before `connect()`, or while connecting or reconnecting, it
   * waits and goes out once the session is up (and again after a reconnect when the connection
   * was cut before its answer). Rejects with the gateway's refusal (an `error` frame), `timeout`
   * once sent, and `closed` at `close()`, a final close, or an `unsubscribe` of the topic before it
   * was sent.
   */
  subscribe(topic: string, options?: SubscribeOptions): Promise<SubscribedFrame>;
  unsubscribe(topic: string): Promise<UnsubscribedFrame>;
  /**
   * Resolves with `ack_ok` once the offsets are durable. (acks, nacks, terms and extends of
   * events that came in an earlier session are not sent: the gateway delivers them again; a
   * confirmed ack of only such ids rejects with `closed`.)
   */
  ack(ids: string | string[], options: { confirm: true }): Promise<AckOkFrame>;
  /** Plain: resolves at once. */
  ack(ids: string | string[], options?: { confirm?: false | undefined }): Promise<void>;
  ack(ids: string | string[], options?: { confirm?: boolean | undefined }): Promise<AckOkFrame | void>;
  nack(id: string, delayMs?: number): void;
  extend(id: string): void;
  term(id: string, reason?: string): void;
  ping(): Promise<PongFrame>;
  /**
   * Publishes over the session (the token's `publish` claim must allow `topic`); waits while
   * disconnected and is sent again after a reconnect under the same idempotency key. The
   * payload is the client's `T` unless named: `publish<Audit>("audit", ...)`.
   */
  publish<P = T>(topic: string, events: NewEvent<NoInfer<P>> | NewEvent<NoInfer<P>>[], options?: { idempotencyKey?: string | undefined }): Promise<PublishedFrame>;
  /** The events of the topics without a `topic()` iterator; ends after a final close. `{gaps: true}`: gaps too. */
  events<U = T>(options?: { gaps?: false | undefined }): AsyncIterableIterator<EventFrame<U>>;
  events<U = T>(options: { gaps: true }): AsyncIterableIterator<EventFrame<U> | GapFrame>;
  /** The events of `topic` only; ends at its unsubscribe (or when it is dropped) and after a final close. */
  topic<U = T>(topic: string, options?: { gaps?: false | undefined }): AsyncIterableIterator<EventFrame<U>>;
  topic<U = T>(topic: string, options: { gaps: true }): AsyncIterableIterator<EventFrame<U> | GapFrame>;
  /** Closes for good: no reconnect follows (a leader tab hands the shared session to another tab). */
  close(): void;
  /** `topic`'s offsets as the gateway confirmed them (with `group`: that shared subscription's). */
  resumeToken(topic: string, group?: string): ResumeToken;
  /** The resume token the gateway last issued for `topic` (with `group`: for that shared
   * subscription of it), as `subscribe`'s `resume` takes it back; undefined before the first. */
  issuedToken(topic: string, group?: string): string | undefined;
  /** The offset epochs of the resume token's partitions (epoch 0 left out). */
  resumeEpochs(topic: string, group?: string): ResumeToken;
}
