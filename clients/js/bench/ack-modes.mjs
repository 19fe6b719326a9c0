// Events per second one JS client consumes and acks, in each ack mode, against a running gateway:
//
//   node --experimental-websocket bench/ack-modes.mjs http://127.0.0.1:8080 [events] [client module]
//
// Modes: "default" (plain acks, one confirmed ack per partition per second) and "confirm-each"
// (every ack waits for its durable write, what the client did before 0.1.0). The optional third
// argument is another client module to load instead of ../ackgate.js (an older version).
const [base, count = "20000", module = "../ackgate.js"] = process.argv.slice(2);
if (!base) throw new Error("usage: ack-modes.mjs BASE_URL [EVENTS] [CLIENT_MODULE]");
const { AckgateClient } = await import(new URL(module, import.meta.url));
const events = Number(count);
const ws = `${base.replace(/^http/, "ws")}/ws`;

async function publish(topic) {
  await fetch(`${base}/topics`, { method: "POST", body: JSON.stringify({ name: topic, partitions: 4 }) });
  for (let sent = 0; sent < events; sent += 1000) {
    const batch = Array.from({ length: Math.min(1000, events - sent) }, (_, i) => ({ payload: { n: sent + i, pad: "x".repeat(80) } }));
    const response = await fetch(`${base}/topics/${topic}/events`, { method: "POST", body: JSON.stringify({ events: batch }) });
    if (!response.ok) throw new Error(`publish: ${response.status}`);
  }
}

async function consume(topic, mode) {
  let received = 0;
  let done;
  const finished = new Promise((r) => (done = r));
  const client = new AckgateClient(ws, {
    clientId: `bench-${topic}`,
    onEvent: (event) => {
      if (mode === "confirm-each") client.ack(event.delivery_id, { confirm: true }).catch(() => {});
      else client.ack(event.delivery_id);
      if (++received === events) done();
    },
  });
  await client.connect();
  const started = performance.now();
  await client.subscribe(topic);
  await finished;
  await client.ping();
  const seconds = (performance.now() - started) / 1000;
  client.close();
  return Math.round(events / seconds);
}

for (const mode of ["default", "confirm-each"]) {
  const topic = `bench-${mode}-${Date.now()}`;
  await publish(topic);
  console.log(JSON.stringify({ mode, client: module, events, events_per_s: await consume(topic, mode) }));
}
