// The JS client in headless Chromium, three of issue 42's items on one page of the gateway's origin
// (the client is this checkout's, see page.mjs):
// - events that arrive before `events()` is iterated wait for it (item 2): 5 events come while
//   the page subscribes to a second topic; the loop started afterwards gets all 5, first attempts;
// - `from: {last: 3}` starts each partition at its last 3 events (item 7);
// - the page publishes over its session (item 6): one batch and one event, written once each,
//   received by the same client and acked.
//
//   node tests/browser/basics.mjs http://127.0.0.1:PORT
//
// Prints `early: ...`, `last: ...` and `published: ...`; exits non-zero with the page's log on any
// failure.
import { call, committed, createTopic, keepLog, openPage, openTestPage, publish, until } from "./page.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: basics.mjs BASE_URL");
  process.exit(2);
}

// Topics of their own, so that the script can run again against the same gateway.
const run = Date.now().toString(36);
const [earlyTopic, secondTopic, lastTopic, pubTopic] = ["web-early", "web-early-b", "web-last", "web-pub"].map((t) => `${t}-${run}`);

const { browser, page, problems } = await openPage(base);
const log = keepLog(page);

try {
  for (const topic of [earlyTopic, secondTopic, lastTopic, pubTopic]) await createTopic(base, topic);
  await publish(base, earlyTopic, Array.from({ length: 5 }, (_, n) => ({ partition: 0, payload: { n } })));
  await publish(base, lastTopic, Array.from({ length: 10 }, (_, n) => ({ partition: 0, payload: { n } })));
  await openTestPage(page, base);

  // Item 2: the first subscribe starts keeping events for the loop that comes later.
  const early = await page.evaluate(async ([topic, second]) => {
    const { AckgateClient } = await import("/static/ackgate.js");
    const client = new AckgateClient(`ws://${location.host}/ws`, { clientId: "browser-early" });
    await client.connect();
    await client.subscribe(topic);
    await new Promise((r) => setTimeout(r, 500)); // the first topic's events arrive meanwhile
    await client.subscribe(second);
    const events = [];
    const stream = client.events();
    const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error(`only ${events.length} of 5 events within 4 s`)), 4000));
    await Promise.race([
      (async () => {
        while (events.length < 5) events.push((await stream.next()).value);
      })(),
      timeout,
    ]);
    await client.ack(events.map((e) => e.delivery_id), { confirm: true });
    client.close();
    return events.map((e) => ({ offset: e.offset, attempt: e.attempt }));
  }, [earlyTopic, secondTopic]);
  if (JSON.stringify(early.map((e) => e.offset)) !== "[0,1,2,3,4]" || early.some((e) => e.attempt !== 1)) throw new Error(`early events: ${JSON.stringify(early)}`);
  console.log(`early: ${early.length} events before the loop, attempts ${early.map((e) => e.attempt).join(",")}`);

  // Item 7: the last 3 events of the partition, nothing before them.
  const last = await page.evaluate(async (topic) => {
    const { AckgateClient } = await import("/static/ackgate.js");
    const client = new AckgateClient(`ws://${location.host}/ws`, { clientId: "browser-last" });
    await client.connect();
    const subscribed = await client.subscribe(topic, { from: { last: 3 } });
    const stream = client.topic(topic);
    const events = [];
    while (events.length < 3) events.push((await stream.next()).value);
    // Nothing else comes.
    const more = await Promise.race([stream.next(), new Promise((r) => setTimeout(() => r(null), 700))]);
    await client.ack(events.map((e) => e.delivery_id), { confirm: true });
    client.close();
    return { from: subscribed.partitions[0].from, offsets: events.map((e) => e.offset), more: more?.value?.offset ?? null };
  }, lastTopic);
  if (last.from !== 7 || JSON.stringify(last.offsets) !== "[7,8,9]" || last.more !== null) throw new Error(`from last 3: ${JSON.stringify(last)}`);
  console.log(`last: from ${last.from}, offsets ${last.offsets.join(",")}`);

  // Item 6: published over the session, received and acked by the same client.
  const published = await page.evaluate(async (topic) => {
    const { AckgateClient } = await import("/static/ackgate.js");
    const client = new AckgateClient(`ws://${location.host}/ws`, { clientId: "browser-pub" });
    await client.connect();
    await client.subscribe(topic);
    const batch = await client.publish(topic, [{ payload: { n: 0 } }, { payload: { n: 1 } }, { payload: { n: 2 } }]);
    const one = await client.publish(topic, { key: "k", payload: { n: 3 } }, { idempotencyKey: `${topic}-3` });
    const again = await client.publish(topic, { key: "k", payload: { n: 3 } }, { idempotencyKey: `${topic}-3` });
    const stream = client.topic(topic);
    const events = [];
    while (events.length < 4) events.push((await stream.next()).value);
    await client.ack(events.map((e) => e.delivery_id), { confirm: true });
    client.close();
    return { offsets: [...batch.offsets, ...one.offsets].map((o) => o.offset), replayed: again.replayed === true, received: events.map((e) => e.payload.n) };
  }, pubTopic);
  const topics = (await call("GET", `${base}/topics`)).answer.topics;
  const logEnd = topics.find((t) => t.name === pubTopic).partitions[0].log_end;
  if (JSON.stringify(published.offsets) !== "[0,1,2,3]" || !published.replayed || logEnd !== 4) throw new Error(`publish: ${JSON.stringify(published)}, log_end ${logEnd}`);
  if (JSON.stringify(published.received) !== "[0,1,2,3]") throw new Error(`received ${JSON.stringify(published.received)}`);
  await until("the acks of the published events", async () => (await committed(base, pubTopic, "browser-pub")) === 4);
  if (problems.length) throw new Error(problems.join("\n"));
  console.log(`published: offsets ${published.offsets.join(",")}, written once (log_end ${logEnd}), received and acked`);
} catch (e) {
  console.error(`browser basics test failed: ${e.message}`);
  console.error([...problems, ...log].join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}
