// The page: the connection's state and the events of one topic, newest last. Each event shown
// is acknowledged by useAckgate once it is on the screen.
import { useAckgate, useAckgateState } from "./useAckgate.js";

interface Order {
  item: string;
  n?: number;
}

export function App({ topic }: { topic: string }) {
  const state = useAckgateState();
  const { events, gaps, error } = useAckgate<Order>(topic);
  return (
    <main>
      <h1>{topic}</h1>
      <p id="state" data-state={state}>
        {state}
      </p>
      {error && <p id="error">{error.message}</p>}
      {gaps.length > 0 && <p id="gaps">{gaps.map((g) => `${g.from}..${g.to - 1} gone`).join(", ")}</p>}
      <ol id="events">
        {events.map((event) => (
          <li key={event.delivery_id} data-offset={event.offset}>
            {event.partition}/{event.offset}: {event.payload?.item ?? event.payload_base64}
          </li>
        ))}
      </ol>
    </main>
  );
}
