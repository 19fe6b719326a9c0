// Types of ackgate-client (ackgate.js). Written by hand; `tsc --noEmit` checks them against
// examples/typed.ts. Licensed under the Apache License, Version 2.0.

/** `{"<partition>": next_offset}`: where each partition of a topic resumes. */
export type ResumeToken = Record<string, number>;

export type StartFrom = "committed" | "earliest" | "latest" | { time: number };

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
}

export interface EventFrame {
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
  payload?: unknown;
  /** The value, base64, when it is not JSON. */
  payload_base64?: string;
}

export interface AckOkFrame {
  type: "ack_ok";
  req: string | number;
  committed: Record<string, Record<string, number>>;
}

export interface PublishedFrame {
  type: "published";
  req?: string | number;
  /** One per event, in the order given. */
  offsets: { partition: number; offset: number }[];
  /** True when the idempotency key repeated an earlier publish (nothing was written again). */
  replayed?: boolean;
}

/** One event to publish, as the REST body's events. */
export interface NewEvent {
  payload?: unknown;
  payload_base64?: string;
  key?: string;
  partition?: number;
  headers?: Record<string, string>;
}

export interface ErrorFrame {
  type: "error";
  code: ErrorCode;
  message: string;
  req?: string | number;
}

export type ServerFrame =
  | WelcomeFrame
  | SubscribedFrame
  | EventFrame
  | AckOkFrame
  | PublishedFrame
  | ErrorFrame
  | { type: "refresh_needed"; expires_at: number }
  | { type: "refreshed"; req?: string | number; expires_at: number | null }
  | { type: "unsubscribed"; topic: string; req?: string | number }
  | { type: "pong"; req?: string | number }
  | { type: "gap"; topic: string; partition: number; from: number; to: number }
  | { type: "reconnect"; after_ms: number; instance?: string; ws_url?: string };

/**
 * How the client reaches its session: a WebSocket (the default), Server-Sent Events (`GET /sse`
 * down, client frames POSTed up), or `auto`: a WebSocket, falling back to SSE for good when the
 * socket fails before its welcome.
 */
export type Transport = "websocket" | "sse" | "auto";

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

export interface AckgateClientOptions {
  /** The client's durable identity (`^[A-Za-z0-9._:@-]{1,128}$`). */
  clientId: string;
  /** `websocket` (default), `sse` or `auto` (a WebSocket, else Server-Sent Events). `sse` without an EventSource throws. */
  transport?: Transport;
  /** The EventSource constructor for `sse` and `auto` (default `globalThis.EventSource`; Node has none). */
  EventSource?: new (url: string) => EventSourceLike;
  /** The WebSocket constructor (default `globalThis.WebSocket`). */
  WebSocket?: new (url: string) => WebSocketLike;
  /** SSE: at most this many client frames per POST (default 10000, the gateway's `limits.max_batch_events`). */
  maxBatchFrames?: number;
  /** A JWT, when the gateway has `auth.jwt_secret` (in the URL; SSE POSTs send it as `Authorization: Bearer`). */
  token?: string;
  /** Called before each connect (and reconnect) for a fresh JWT; wins over `token`. */
  tokenProvider?: () => string | Promise<string>;
  /** Where the resume token survives a page reload (e.g. `sessionStorage`); off by default. */
  storage?: TokenStorage;
  /** At most one confirmed ack per partition this often (default 1000); the rest are plain. After a draining instance's `reconnect` frame every ack is confirmed. */
  confirmEveryMs?: number;
  /** A ping every this many ms (default 20000; 0: none) finds a dead connection. */
  heartbeatMs?: number;
  /** A heartbeat ping unanswered this long (default 10000 ms) abandons the connection: the client reconnects. */
  heartbeatTimeoutMs?: number;
  /** Publishes that may wait for a connection (default 100); more reject with `limit_exceeded`. */
  maxQueuedPublishes?: number;
  /** Reconnect after a close that is not final (default true). */
  reconnect?: boolean;
  /** Other instances' http(s) base URLs, asked for `/session/recommend`. */
  peers?: string[];
  /** First reconnect pause (default 250); doubles up to `maxBackoffMs` (default 10000), with jitter. */
  backoffMs?: number;
  maxBackoffMs?: number;
  onEvent?: (event: EventFrame) => void;
  /** An `error` frame that answers no request (over SSE also a refused POST of frames without one, e.g. plain acks). */
  onError?: (frame: ErrorFrame) => void;
  onClose?: (close: { code: number; reason: string; final: boolean }) => void;
  onFrame?: (frame: ServerFrame) => void;
  /** Before each attempt `{attempt, delayMs, url, error?}`, after a success `{attempt, url, welcome}`. */
  onReconnect?: (progress: { attempt: number; delayMs?: number; url: string; error?: string; welcome?: WelcomeFrame }) => void;
  /** A subscription refused for good at a resubscribe (unknown_topic, forbidden, invalid_name). */
  onSubscriptionDropped?: (dropped: { topic: string; code: ErrorCode; message: string }) => void;
}

export declare const FINAL_CLOSES: Set<number>;
export declare const FINAL_SUBSCRIBE_ERRORS: Set<ErrorCode>;

export declare class AckgateError extends Error {
  constructor(code: string, message: string);
  /** An error code of the protocol (over SSE also of a refused POST), or `closed` when the session closed or was not open. */
  code: ErrorCode | "closed";
}

export declare class AckgateClient {
  constructor(url: string, options: AckgateClientOptions);
  /** The last welcome frame. */
  welcome: WelcomeFrame | null;
  /** Opens the session over the `transport`; resolves with its welcome (`ack_url` set when SSE carries it). */
  connect(): Promise<WelcomeFrame>;
  /** `group`: join that shared subscription of the topic (each event goes to one member); `order: "key"` keeps each key at one member at a time, in offset order. */
  subscribe(topic: string, options?: { from?: StartFrom; resume?: ResumeToken; epochs?: ResumeToken; group?: string; order?: "none" | "key" }): Promise<SubscribedFrame>;
  unsubscribe(topic: string): Promise<{ type: "unsubscribed"; topic: string }>;
  /** Plain by default; `{confirm: true}` resolves with `ack_ok` once the offsets are durable. */
  ack(ids: string | string[], options?: { confirm?: boolean }): Promise<AckOkFrame | void>;
  nack(id: string, delayMs?: number): void;
  extend(id: string): void;
  term(id: string, reason?: string): void;
  ping(): Promise<{ type: "pong" }>;
  /**
   * Publishes over the session (the token's `publish` claim must allow `topic`); waits while
   * disconnected and is sent again after a reconnect under the same idempotency key.
   */
  publish(topic: string, events: NewEvent | NewEvent[], options?: { idempotencyKey?: string }): Promise<PublishedFrame>;
  /** Every event from now on; ends after a final close. */
  events(): AsyncIterableIterator<EventFrame>;
  /** Closes for good: no reconnect follows. */
  close(): void;
  resumeToken(topic: string): ResumeToken;
  /** The offset epochs of the resume token's partitions (epoch 0 left out). */
  resumeEpochs(topic: string): ResumeToken;
}
