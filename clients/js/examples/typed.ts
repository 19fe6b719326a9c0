// A typed consumer: `tsc --noEmit -p .` checks index.d.ts against it (CI runs it). The lines
// marked @ts-expect-error must stay errors: they are what the types exist to refuse.
import { AckgateClient, AckgateError, FINAL_CLOSES, deviceClientId, version, type AckOkFrame, type ClientState, type EventFrame, type GapFrame } from "ackgate-client";

interface Order {
  id: string;
  total: number;
}

async function main(): Promise<void> {
  const client = new AckgateClient<Order>("ws://127.0.0.1:8080/ws", {
    // One id per browser: a second device does not take this one's session over.
    clientId: deviceClientId("alice:"),
    tokenProvider: async () => "jwt",
    storage: globalThis.sessionStorage,
    confirmEveryMs: 500,
    connectTimeoutMs: 5000,
    requestTimeoutMs: 5000,
    // A WebSocket where it works, else Server-Sent Events (a proxy that drops WebSocket upgrades).
    transport: "auto",
    tabs: "shared",
    token: undefined, // optional options take an explicit undefined
    EventSource: globalThis.EventSource,
    WebSocket: globalThis.WebSocket,
    maxBatchFrames: 5000,
    onEvent: (event) => console.log(event.payload?.total),
    onGap: ({ topic, partition, from, to }) => console.warn(`${topic}/${partition}: ${from}..${to} are gone`),
    onSubscriptionDropped: ({ topic, code }) => console.warn(`no longer subscribed to ${topic}: ${code}`),
    debug: (what, data) => console.log(`ackgate-client ${version}`, what, data),
  });
  const off = client.on("state", (state: ClientState) => console.log("now", state, client.state));
  client.on("close", ({ code, final }) => console.log(code, final));
  // Refused for good (a bad token, another device took the session): tell the user, don't retry.
  client.on("failed", ({ code, closeCode }) => console.warn(code === "taken_over" ? "opened elsewhere" : `sign in again (${code}, ${closeCode})`));
  if (client.state === "failed") console.log(client.failure?.message);
  off();
  const welcome = await client.connect();
  console.log(welcome.session_id, welcome.max_in_flight, welcome.ack_url ? "over SSE" : "over a WebSocket");
  const subscribed = await client.subscribe("orders", { from: { time: Date.now() - 60_000 } });
  for (const { partition, from, gap } of subscribed.partitions) console.log(partition, from, gap?.to);
  await client.subscribe("audit", { from: { last: 10 } });
  for await (const event of client.events()) {
    handle(event);
    if (event.redrive) console.log("a dead letter, sent again");
    const nothing: void = await client.ack(event.delivery_id);
    void nothing;
  }
  // One topic's events, gaps included (a union to narrow on `type`).
  for await (const item of client.topic("orders", { gaps: true })) {
    if (item.type === "gap") showGap(item);
    else console.log(item.payload?.id);
  }
  // Another payload type for one iterator.
  for await (const audit of client.topic<{ who: string }>("audit")) console.log(audit.payload?.who);
  try {
    const ok: AckOkFrame = await client.ack(["1.0.0.0"], { confirm: true });
    console.log(ok.committed["orders"]?.["0"]);
  } catch (e) {
    if (e instanceof AckgateError && (e.code === "unknown_delivery" || e.code === "timeout")) console.log("already settled, or no answer");
  }
  const published = await client.publish("orders", { key: "o-1", payload: { id: "o-1", total: 3 } }, { idempotencyKey: "o-1" });
  console.log(published.offsets[0]?.offset, published.replayed === true);
  console.log(FINAL_CLOSES.has(4001));
  // @ts-expect-error a prefix is a string
  deviceClientId(42);
  // @ts-expect-error FINAL_CLOSES is read-only
  FINAL_CLOSES.add(4004);
  // @ts-expect-error the state is read-only
  client.state = "connected";
  // @ts-expect-error no such event
  client.on("message", () => {});
  // @ts-expect-error a payload of another shape than the client's
  await client.publish("orders", { payload: { id: 1 } });
  await client.publish<{ who: string }>("audit", { payload: { who: "alice" } });
  client.close();
}

function handle(event: EventFrame<Order>): void {
  console.log(event.topic, event.partition, event.offset, event.payload ?? event.payload_base64);
}

function showGap(gap: GapFrame): void {
  console.log(`lost ${gap.to - gap.from} events of ${gap.topic}/${gap.partition}`);
}

void main();
