// React hooks on ackgate-client: `useAckgate(topic)` subscribes when its component mounts, keeps
// the topic's events in state, acknowledges each one after it was rendered (an effect runs once
// the render is on the screen), and unsubscribes when the component unmounts. The client comes
// from <AckgateContext.Provider value={client}>, connected before the first render.
import { createContext, useContext, useEffect, useRef, useState, useSyncExternalStore } from "react";
import type { AckgateClient, ClientState, EventFrame, GapFrame, SubscribeOptions } from "ackgate-client";

export const AckgateContext = createContext<AckgateClient | null>(null);

function useClient(): AckgateClient {
  const client = useContext(AckgateContext);
  if (!client) throw new Error("useAckgate needs <AckgateContext.Provider value={client}> above it");
  return client;
}

/** The client's state ("connecting", "connected", "reconnecting", "closed"), rendered again at each change. */
export function useAckgateState(): ClientState {
  const client = useClient();
  return useSyncExternalStore(
    (changed) => client.on("state", changed),
    () => client.state,
  );
}

export interface Topic<T> {
  /** The newest events (at most `keep`), oldest first; each is acked once it was rendered. */
  events: EventFrame<T>[];
  /** Events that retention removed before they could be delivered. */
  gaps: GapFrame[];
  /** The subscribe's error, if it was refused. */
  error: Error | null;
}

/**
 * The events of `topic`, acknowledged after render. One component per topic: an unmount
 * unsubscribes the client from it.
 */
export function useAckgate<T = unknown>(topic: string, options: SubscribeOptions & { keep?: number } = {}): Topic<T> {
  const client = useClient();
  const { keep = 100, ...subscribe } = options;
  const [state, setState] = useState<Topic<T>>({ events: [], gaps: [], error: null });
  const from = JSON.stringify(subscribe.from ?? null);

  useEffect(() => {
    // The iterator first: events that come between the subscribe and the first read wait in it.
    const items = client.topic<T>(topic, { gaps: true });
    client.subscribe(topic, subscribe).catch((error: Error) => setState((s) => ({ ...s, error })));
    void (async () => {
      for await (const item of items) {
        setState((s) => (item.type === "gap" ? { ...s, gaps: [...s.gaps, item] } : { ...s, events: [...s.events, item].slice(-keep) }));
      }
    })();
    return () => {
      void items.return?.();
      client.unsubscribe(topic).catch(() => {}); // also ends the iterator
    };
    // `subscribe` is read at mount: a new `from` (by value) subscribes again.
  }, [client, topic, from, keep]);

  // After each render that showed new events: one plain ack for all of them.
  const acked = useRef(new Set<string>());
  useEffect(() => {
    const ids = state.events.map((e) => e.delivery_id).filter((id) => !acked.current.has(id));
    if (ids.length === 0) return;
    for (const id of ids) acked.current.add(id);
    void client.ack(ids);
  }, [client, state.events]);

  return state;
}
