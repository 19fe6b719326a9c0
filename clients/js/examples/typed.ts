// A typed consumer: `tsc --noEmit -p .` checks index.d.ts against it (CI runs it).
import { AckgateClient, AckgateError, type EventFrame } from "ackgate-client";

async function main(): Promise<void> {
  const client = new AckgateClient("ws://127.0.0.1:8080/ws", {
    clientId: "alice",
    tokenProvider: async () => "jwt",
    storage: globalThis.sessionStorage,
    confirmEveryMs: 500,
    // A WebSocket where it works, else Server-Sent Events (a proxy that drops WebSocket upgrades).
    transport: "auto",
    EventSource: globalThis.EventSource,
    WebSocket: globalThis.WebSocket,
    maxBatchFrames: 5000,
    onSubscriptionDropped: ({ topic, code }) => console.warn(`no longer subscribed to ${topic}: ${code}`),
  });
  const welcome = await client.connect();
  console.log(welcome.session_id, welcome.max_in_flight, welcome.ack_url ? "over SSE" : "over a WebSocket");
  const subscribed = await client.subscribe("orders", { from: { time: Date.now() - 60_000 } });
  for (const { partition, from, gap } of subscribed.partitions) console.log(partition, from, gap?.to);
  for await (const event of client.events()) {
    handle(event);
    if (event.redrive) console.log("a dead letter, sent again");
    await client.ack(event.delivery_id);
  }
  try {
    const ok = await client.ack(["1.0.0.0"], { confirm: true });
    if (ok) console.log(ok.committed["orders"]?.["0"]);
  } catch (e) {
    if (e instanceof AckgateError && e.code === "unknown_delivery") console.log("already settled");
  }
  const published = await client.publish("orders", { key: "o-1", payload: { total: 3 } }, { idempotencyKey: "o-1" });
  console.log(published.offsets[0]?.offset, published.replayed === true);
  client.close();
}

function handle(event: EventFrame): void {
  console.log(event.topic, event.partition, event.offset, event.payload ?? event.payload_base64);
}

void main();
