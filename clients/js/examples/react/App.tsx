// The page: the connection's state, and two components on one topic, a counter and the list of
// its newest events. They share one subscription (ackgate-client/react keeps one store per
// topic), and each event is acked once a render that showed it is on the screen. "Pause"
// unmounts both: the last one unsubscribes; "Resume" subscribes again from the committed offsets,
// so what came meanwhile comes then.
import { useState } from "react";
import { useAckgateState, useTopic } from "ackgate-client/react";

interface Order {
  item: string;
  n?: number;
}

interface TopicProps {
  topic: string;
  /** The most events kept (the newest); older ones leave the list, acked. */
  limit: number;
}

function Counter({ topic, limit }: TopicProps) {
  const { events } = useTopic<Order>(topic, { limit });
  const last = events.at(-1);
  return (
    <p id="counter" data-count={events.length} data-last={last?.offset ?? ""}>
      {events.length} shown, newest offset {last?.offset ?? "none"}
    </p>
  );
}

function Events({ topic, limit }: TopicProps) {
  const { events, gaps, error } = useTopic<Order>(topic, { limit });
  return (
    <>
      {error && <p id="error">{error.message}</p>}
      {gaps.length > 0 && <p id="gaps">{gaps.map((g) => `${g.from}..${g.to - 1} gone`).join(", ")}</p>}
      <ol id="events">
        {events.map((event) => (
          <li key={event.delivery_id} data-offset={event.offset}>
            {event.partition}/{event.offset}: {event.payload?.item ?? event.payload_base64}
          </li>
        ))}
      </ol>
    </>
  );
}

export function App(props: TopicProps) {
  const { state, failure } = useAckgateState();
  const [paused, setPaused] = useState(false);
  return (
    <main>
      <h1>{props.topic}</h1>
      <p id="state" data-state={state}>
        {state}
        {failure && `: ${failure.code} (${failure.message})`}
      </p>
      <button id="pause" onClick={() => setPaused(!paused)}>
        {paused ? "Resume" : "Pause"}
      </button>
      {!paused && <Counter {...props} />}
      {!paused && <Events {...props} />}
    </main>
  );
}
