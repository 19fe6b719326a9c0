// Types of ackgate-client/react (react.js). Written by hand; `tsc --noEmit` checks them against
// the React example. Licensed under the Apache License, Version 2.0.
import type { ReactNode, ReactElement } from "react";
import type { AckgateClient, ClientState, EventFrame, Failure, GapFrame, StartFrom } from "./index.js";

export interface AckgateProviderProps {
  /** Made, connected and closed by the app (a subscribe made before `connect()` waits for it). */
  client: AckgateClient<any>;
  children?: ReactNode;
}

/** Hands `client` to the hooks below it. */
export declare function AckgateProvider(props: AckgateProviderProps): ReactElement;

/** The client of the nearest `<AckgateProvider>` (throws without one). */
export declare function useAckgateClient<T = unknown>(): AckgateClient<T>;

/** The client's state and, while it is `"failed"`, why; rendered again at each change. */
export declare function useAckgateState(): { state: ClientState; failure: Failure | null };

export interface TopicOptions {
  /** Where the subscription starts (default: the committed offsets). */
  from?: StartFrom | undefined;
  /** At most this many events are kept, the newest (default 100). */
  limit?: number | undefined;
  /**
   * `"rendered"` (default): each event is acked once a render that showed it was committed, and
   * one dropped from the list before that as it goes. `"manual"`: the app calls `ack(event)`; an
   * event dropped unacked comes again after the gateway's ack timeout.
   */
  ack?: "rendered" | "manual" | undefined;
}

export interface TopicView<T = unknown> {
  /** The newest events (at most `limit`), oldest first; a redelivery replaces its earlier copy. */
  readonly events: readonly EventFrame<T>[];
  /** Events retention removed before they came (the newest `limit`). */
  readonly gaps: readonly GapFrame[];
  /** The subscribe's refusal, or the subscription dropped; null otherwise. */
  readonly error: Error | null;
  /** Acks `event` (once: again does nothing). */
  ack(event: EventFrame<T>): void;
}

/**
 * The events of `topic`. The components of one client that use one topic share one subscription
 * (the first one's options hold until the last one unmounts, which unsubscribes).
 */
export declare function useTopic<T = unknown>(topic: string, options?: TopicOptions): TopicView<T>;
