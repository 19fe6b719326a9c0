//! The shapes of load: throughput (split / fan-out, with optional pacing), idle sessions, restart.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::client::{self, ConsumerPlan, Transport};
use crate::gateway::Gateway;
use crate::report::{Progress, Summary};
use crate::Cli;

/// Events per publish request while preloading.
const PUBLISH_BATCH: u64 = 1000;

/// The shared subscription of a `--group` run.
const GROUP: &str = "lt";

struct Http {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Http {
    fn new(base: &str, token: Option<String>) -> Self {
        Self { client: reqwest::Client::new(), base: base.to_string(), token }
    }

    fn auth(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.auth(self.client.get(format!("{}{path}", self.base))).send().await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if !status.is_success() {
            bail!("GET {path}: {status} {body}");
        }
        Ok(body)
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let response = self.auth(self.client.post(format!("{}{path}", self.base))).json(body).send().await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        if !status.is_success() {
            bail!("POST {path}: {status} {answer}");
        }
        Ok(answer)
    }

    async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let response = self.auth(self.client.put(format!("{}{path}", self.base))).json(body).send().await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        if !status.is_success() {
            bail!("PUT {path}: {status} {answer}");
        }
        Ok(answer)
    }

    async fn create_topic(&self, name: &str, partitions: u32) -> anyhow::Result<()> {
        self.post("/topics", &json!({"name": name, "partitions": partitions})).await.map(|_| ())
    }
}

/// The lite parent of `--lite` runs (`rocketmq.lite_parents` of a gateway the loadtest starts).
pub const LITE_PARENT: &str = "ltlite";

/// The topic a client or session of a run reads: its own lite topic with `--lite`.
fn own_topic(cli: &Cli, name: String) -> String {
    if cli.lite {
        format!("{LITE_PARENT}@{name}")
    } else {
        name
    }
}

/// Creates the run's topic: with `--lite`, the lite parent (once; a lite topic needs no creation).
/// On a RocketMQ cluster of several masters whose count divides `--partitions`, the topic is
/// created at the brokers with a queue set on every master, as an operator would with
/// `mqadmin updateTopic -c cluster` (`POST /topics` creates it on the first master only).
async fn create_own_topic(cli: &Cli, http: &Http, topic: &str) -> anyhow::Result<()> {
    static PARENT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    if cli.lite {
        return PARENT.get_or_try_init(|| http.create_topic(LITE_PARENT, 1)).await.map(|_| ());
    }
    if let Some(namesrv) = &cli.rocketmq {
        let broker = ackgate::backend::rocketmq::Broker::new(namesrv.clone(), std::time::Duration::from_secs(5));
        let masters = broker.brokers().await.map_err(|e| anyhow::anyhow!("asking {namesrv} for its masters: {e}"))?.len() as u32;
        if masters > 1 && cli.partitions.is_multiple_of(masters) {
            broker.create_topic_on_every_master(topic, cli.partitions / masters, false).await.map_err(|e| anyhow::anyhow!("creating {topic}: {e}"))?;
            return Ok(());
        }
    }
    http.create_topic(topic, cli.partitions).await
}

/// Partitions of the run's topics: a lite topic has one per broker of its parent (one here).
fn own_partitions(cli: &Cli) -> u32 {
    if cli.lite {
        1
    } else {
        cli.partitions
    }
}

/// A payload of about `bytes` bytes of JSON text.
fn filler(bytes: usize) -> String {
    "x".repeat(bytes.saturating_sub(8))
}

/// Publishes `count` events spread over the partitions; returns the offsets written per partition.
async fn preload(
    http: &Http,
    topic: &str,
    partitions: u32,
    count: u64,
    payload_bytes: usize,
    progress: &AtomicU64,
) -> anyhow::Result<BTreeMap<u32, HashSet<u64>>> {
    let filler = filler(payload_bytes);
    let mut written: BTreeMap<u32, HashSet<u64>> = BTreeMap::new();
    let mut n = 0;
    while n < count {
        let size = PUBLISH_BATCH.min(count - n);
        let events: Vec<Value> = (n..n + size).map(|i| json!({"partition": (i % partitions as u64) as u32, "payload": {"p": filler}})).collect();
        let answer = http.post(&format!("/topics/{topic}/events"), &json!({ "events": events })).await?;
        for o in answer["offsets"].as_array().context("publish answer without offsets")? {
            written.entry(o["partition"].as_u64().unwrap_or_default() as u32).or_default().insert(o["offset"].as_u64().unwrap_or_default());
        }
        n += size;
        progress.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(written)
}

fn resources(summary: &mut Summary, gateway: &Gateway, cpu_before: Option<f64>, elapsed: Duration) {
    if let Some(rss) = gateway.rss_bytes() {
        summary.add("gateway_rss_mib", (rss as f64 / 1048576.0 * 10.0).round() / 10.0);
    }
    if let (Some(before), Some(after)) = (cpu_before, gateway.cpu_seconds()) {
        summary.add("gateway_cpu_percent", ((after - before) / elapsed.as_secs_f64() * 1000.0).round() / 10.0);
    }
}

/// Every topic `GET /topics` lists, and with `lite` every lite topic of `LITE_PARENT` (listed
/// by its parent, in pages).
async fn list_topics(http: &Http, lite: bool) -> anyhow::Result<Vec<Value>> {
    let mut listed: Vec<Value> = http.get("/topics").await?["topics"].as_array().cloned().unwrap_or_default();
    if !lite {
        return Ok(listed);
    }
    let mut after = String::new();
    loop {
        let page = http.get(&format!("/topics?parent={LITE_PARENT}&limit=1000{after}")).await?;
        listed.extend(page["topics"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => return Ok(listed),
        }
    }
}

/// Waits until every client's committed offsets equal the log end of every partition it reads.
async fn check_committed(http: &Http, topics: &[(String, Vec<String>)], settle: Duration, summary: &mut Summary) -> anyhow::Result<()> {
    let deadline = Instant::now() + settle;
    loop {
        let mut behind = Vec::new();
        let listed = list_topics(http, topics.iter().any(|(t, _)| t.contains('@'))).await?;
        for (topic, clients) in topics {
            let Some(info) = listed.iter().find(|t| t["name"] == topic.as_str()) else {
                bail!("topic {topic} missing from GET /topics");
            };
            // Indexed: a broadcast run has 10,000 clients times the partitions. Every page: the
            // listing is paged (it read only the first 1,000 rows, and a broadcast to more than
            // 250 clients of 4 partitions ended INCOMPLETE with the rest "committed None").
            let mut stored: std::collections::HashMap<(String, u64), u64> = std::collections::HashMap::new();
            let mut after = String::new();
            loop {
                let rows = http.get(&format!("/admin/offsets?topic={topic}&limit=10000{after}")).await?;
                for r in rows["offsets"].as_array().into_iter().flatten() {
                    if let (Some(client), Some(p), Some(committed)) = (r["client_id"].as_str(), r["partition"].as_u64(), r["committed"].as_u64()) {
                        stored.insert((client.to_string(), p), committed);
                    }
                }
                match rows["next"].as_str() {
                    Some(next) => after = format!("&after={}", next.replace('#', "%23")),
                    None => break,
                }
            }
            for partition in info["partitions"].as_array().into_iter().flatten() {
                let (p, end) = (partition["partition"].as_u64().unwrap_or_default(), partition["log_end"].as_u64().unwrap_or_default());
                for client in clients {
                    let committed = stored.get(&(client.clone(), p)).copied();
                    if end > 0 && committed != Some(end) {
                        behind.push(format!("{topic}#{client}#{p}: committed {committed:?}, log end {end}"));
                    }
                }
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            for b in behind.into_iter().take(10) {
                summary.problem(b);
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn throughput(cli: &Cli) -> anyhow::Result<Summary> {
    let mut gateway = cli.gateway()?;
    let mut http = Http::new(&gateway.base, cli.admin_token.clone());
    // Unique per run of this process too: `--find-rate` runs the shape several times, and with
    // `--url` they share one gateway.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = format!("lt{}r{}", std::process::id(), RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let clients: Vec<String> = (0..cli.clients).map(|i| format!("{run}-c{i}")).collect();
    // (topic, its clients, events to publish there)
    let assignments: Vec<(String, Vec<String>, u64)> = if let Some(members) = cli.group {
        let members: Vec<String> = (0..members).map(|i| format!("{run}-m{i}")).collect();
        vec![(format!("{run}-grp"), members, cli.events)]
    } else if cli.fanout {
        vec![(format!("{run}-fan"), clients.clone(), cli.events)]
    } else {
        let per = cli.events / cli.clients as u64;
        clients
            .iter()
            .enumerate()
            .map(|(i, c)| (own_topic(cli, format!("{run}-t{i}")), vec![c.clone()], per + u64::from((i as u64) < cli.events % cli.clients as u64)))
            .collect()
    };
    let paced = cli.rate.is_some();
    let shape = if paced {
        format!(
            "paced {} events/s for {} events, {} {} clients, {} partitions",
            cli.rate.unwrap_or(0),
            cli.events,
            if cli.fanout { "fan-out to" } else { "split over" },
            cli.clients,
            cli.partitions
        )
    } else if let Some(members) = cli.group {
        format!("group of {members} members, {} events, {} partitions, {}-byte payloads, ack {:?}", cli.events, cli.partitions, cli.payload_bytes, cli.ack)
    } else {
        format!(
            "{} {} clients, {} events, {} partitions, {}-byte payloads, ack {:?}",
            if cli.fanout { "fan-out" } else { "split" },
            cli.clients,
            cli.events,
            own_partitions(cli),
            cli.payload_bytes,
            cli.ack
        )
    };
    // Named only when it is not the default, so earlier WebSocket figures keep their shape names.
    let shape = if cli.transport == Transport::Sse { format!("{shape}, over SSE") } else { shape };
    let shape = if cli.lite { format!("{shape}, each client on its own lite topic") } else { shape };
    let mut summary = Summary::new(shape);
    let mut expected: BTreeMap<String, BTreeMap<u32, HashSet<u64>>> = BTreeMap::new();
    for (topic, _, _) in &assignments {
        create_own_topic(cli, &http, topic).await?;
    }
    if let Some(behind) = cli.behind {
        if !cli.fanout || cli.url.is_some() {
            bail!("--behind needs a fan-out (--fanout or --broadcast) on a gateway of its own (no --url)");
        }
        leave_one_behind(cli, &mut gateway, &http, &assignments[0].0, behind, &mut summary).await?;
        http = Http::new(&gateway.base, cli.admin_token.clone());
    }
    if !paced {
        let published = Arc::new(AtomicU64::new(0));
        let _progress = Progress::start("publish", published.clone(), assignments.iter().map(|a| a.2).sum());
        let started = Instant::now();
        for (topic, _, count) in &assignments {
            expected.insert(topic.clone(), preload(&http, topic, own_partitions(cli), *count, cli.payload_bytes, &published).await?);
        }
        summary.add("publish_events_per_s", (cli.events as f64 / started.elapsed().as_secs_f64()).round());
    }

    // Connect everyone first (200 handshakes at a time), so the timed part is delivery and acks.
    let planned: Vec<(String, String, u64)> =
        assignments.iter().flat_map(|(topic, readers, count)| readers.iter().map(move |c| (topic.clone(), c.clone(), *count))).collect();
    let connected = Arc::new(AtomicU64::new(0));
    let connecting = (planned.len() > 1000).then(|| Progress::start("connected", connected.clone(), planned.len() as u64));
    let mut sockets = Vec::with_capacity(planned.len());
    for chunk in planned.chunks(200) {
        let opened = futures_util::future::join_all(chunk.iter().map(|(_, client_id, _)| client::connect_over(cli.transport, &gateway.base, client_id))).await;
        for ((topic, client_id, count), ws) in chunk.iter().zip(opened) {
            sockets.push((topic.clone(), client_id.clone(), *count, ws?));
            connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    drop(connecting);
    let acked = Arc::new(AtomicU64::new(0));
    let deliveries_expected: u64 = match cli.group {
        Some(_) => cli.events,
        None => assignments.iter().map(|(_, readers, count)| readers.len() as u64 * count).sum(),
    };
    let first_deliveries = Arc::new(AtomicU64::new(0));
    let paced_since = paced.then(Instant::now);
    let cpu_before = gateway.cpu_seconds();
    let own_cpu_before = crate::gateway::process_cpu_seconds(std::process::id());
    let started = Instant::now();
    let mut tasks = Vec::new();
    let subscribed = Arc::new(AtomicU64::new(0));
    let consumers = sockets.len() as u64;
    let multiplexed = cli.client_engine == client::ClientEngine::Multiplexed;
    if multiplexed && (cli.transport != Transport::Websocket || cli.ack != client::AckMode::Each || cli.group.is_some() || !cli.fanout) {
        bail!("--client-engine multiplexed drives WebSocket consumers of a fan-out or broadcast acking each event (--ack each)");
    }
    let mut engine_consumers = Vec::new();
    for (topic, client_id, count, ws) in sockets {
        let plan = ConsumerPlan {
            client_id,
            topic,
            expect: count,
            mode: cli.ack,
            ack_batch: cli.ack_batch.max(1),
            progress: acked.clone(),
            paced_since,
            skip_acks: cli.skip_acks,
            from: cli.behind.map(|_| "latest"),
            subscribed: subscribed.clone(),
            group: cli.group.map(|_| client::SharedPlan { name: GROUP.to_string(), first_deliveries: first_deliveries.clone() }),
        };
        match ws {
            client::Connection::Ws(ws) if multiplexed => engine_consumers.push((plan, *ws)),
            ws => tasks.push(tokio::spawn(client::consume(plan, ws))),
        }
    }
    let engines = (!engine_consumers.is_empty()).then(|| {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::spawn(crate::multiplexed::consume_all(engine_consumers, workers))
    });
    let progress = Progress::start("acked", acked.clone(), deliveries_expected);
    if cli.behind.is_some() {
        // From `latest`: every subscription in place before the first event is published.
        let deadline = Instant::now() + Duration::from_secs(120);
        while subscribed.load(std::sync::atomic::Ordering::Relaxed) < consumers {
            if Instant::now() > deadline {
                bail!("only {} of {consumers} subscriptions were answered within 120 s", subscribed.load(std::sync::atomic::Ordering::Relaxed));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    if let (Some(rate), Some(since)) = (cli.rate, paced_since) {
        for (topic, written) in paced_publish(&http, &assignments, rate, cli.payload_bytes, since).await? {
            expected.insert(topic, written);
        }
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut deliveries, mut redeliveries, mut acks) = (0, 0, 0);
    let mut per_client = Vec::new();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await??);
    }
    if let Some(engines) = engines {
        results.extend(engines.await??);
    }
    for result in results {
        latency.add(&result.latency_us)?;
        deliveries += result.received.deliveries;
        redeliveries += result.received.redeliveries;
        acks += result.received.acked;
        per_client.push(result.received);
    }
    let elapsed = started.elapsed();
    drop(progress);
    resources(&mut summary, &gateway, cpu_before, elapsed);
    // The load generator shares the cores: its own CPU beside the gateway's.
    if let (Some(before), Some(after)) = (own_cpu_before, crate::gateway::process_cpu_seconds(std::process::id())) {
        summary.add("loadtest_cpu_percent", ((after - before) / elapsed.as_secs_f64() * 1000.0).round() / 10.0);
    }
    if let (Some(before), Some(after)) = (cpu_before, gateway.cpu_seconds()) {
        summary.add("cpu_us_per_delivery", ((after - before) * 1e6 / deliveries.max(1) as f64 * 10.0).round() / 10.0);
    }
    summary.add_deliveries(elapsed, deliveries, acks, redeliveries);
    let latency_name = if paced { "publish_to_delivery" } else { "ack_round_trip" };
    summary.add_latency(latency_name, &latency);

    if cli.group.is_some() {
        // Completeness of a group: its members together received every offset, and the
        // group's floor reached the log end.
        let mut union: BTreeMap<u32, HashSet<u64>> = BTreeMap::new();
        for got in &per_client {
            for (partition, offsets) in &got.offsets {
                union.entry(*partition).or_default().extend(offsets);
            }
        }
        for (partition, offsets) in expected.get(&assignments[0].0).into_iter().flatten() {
            let missing = offsets.iter().filter(|o| !union.get(partition).is_some_and(|s| s.contains(o))).count();
            if missing > 0 {
                summary.problem(format!("the group missed {missing} events of partition {partition}"));
            }
        }
        let shares: Vec<u64> = per_client.iter().map(|r| r.distinct()).collect();
        summary.add("member_events_min", shares.iter().min().copied().unwrap_or(0));
        summary.add("member_events_max", shares.iter().max().copied().unwrap_or(0));
        let group = vec![(assignments[0].0.clone(), vec![format!("${GROUP}")])];
        check_committed(&http, &group, Duration::from_secs(cli.settle_secs), &mut summary).await?;
        return Ok(summary);
    }
    // Completeness: every client received every offset written to its topic...
    let mut i = 0;
    for (topic, readers, _) in &assignments {
        for client_id in readers {
            let got = &per_client[i];
            i += 1;
            for (partition, offsets) in expected.get(topic).into_iter().flatten() {
                let missing = offsets.iter().filter(|o| !got.offsets.get(partition).is_some_and(|s| s.contains(o))).count();
                if missing > 0 {
                    summary.problem(format!("{client_id} missed {missing} events of {topic}#{partition}"));
                }
            }
        }
    }
    // ...and its committed offsets reached the log end.
    let readers: Vec<(String, Vec<String>)> = assignments.iter().map(|(t, r, _)| (t.clone(), r.clone())).collect();
    check_committed(&http, &readers, Duration::from_secs(cli.settle_secs), &mut summary).await?;
    Ok(summary)
}

/// Publishes `behind` events to `topic`, stores offset 0 on every partition for a client that
/// never connects (an operator's reset, as if it had been away since the start), and restarts
/// the gateway on the same data dir: boot alignment then starts the shared reader of every
/// partition where that absent client stands, `behind` events back.
async fn leave_one_behind(cli: &Cli, gateway: &mut Gateway, http: &Http, topic: &str, behind: u64, summary: &mut Summary) -> anyhow::Result<()> {
    preload(http, topic, cli.partitions, behind, cli.payload_bytes, &AtomicU64::new(0)).await?;
    let absent = format!("{topic}-absent");
    for partition in 0..cli.partitions {
        http.put(&format!("/admin/offsets/{topic}/{absent}/{partition}"), &json!({"offset": 0})).await?;
    }
    gateway.restart(&cli.launch())?;
    let ready = Http::new(&gateway.base, cli.admin_token.clone());
    while ready.client.get(format!("{}/readyz", ready.base)).send().await.map_or(true, |r| !r.status().is_success()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    summary.add("absent_client_behind", behind);
    Ok(())
}

/// Publishes each topic's events at `rate` events/s in total, in 1 ms ticks, each event carrying
/// its publish time (`t`, ns since `since`).
async fn paced_publish(
    http: &Http,
    assignments: &[(String, Vec<String>, u64)],
    rate: u64,
    payload_bytes: usize,
    since: Instant,
) -> anyhow::Result<BTreeMap<String, BTreeMap<u32, HashSet<u64>>>> {
    let filler = filler(payload_bytes.saturating_sub(24));
    let total: u64 = assignments.iter().map(|a| a.2).sum();
    let mut written: BTreeMap<String, BTreeMap<u32, HashSet<u64>>> = BTreeMap::new();
    let mut sent = 0u64;
    // Events still to publish per topic: each topic gets exactly what its readers expect.
    let mut left: Vec<u64> = assignments.iter().map(|a| a.2).collect();
    let mut next_topic = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let start = Instant::now();
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        while sent < due {
            // Round robin over the topics that still have events to get.
            while left[next_topic] == 0 {
                next_topic = (next_topic + 1) % left.len();
            }
            let (topic, _, _) = &assignments[next_topic];
            let batch = (due - sent).min(PUBLISH_BATCH).min(left[next_topic]);
            left[next_topic] -= batch;
            next_topic = (next_topic + 1) % left.len();
            let t = since.elapsed().as_nanos() as u64;
            let events: Vec<Value> = (0..batch).map(|_| json!({"payload": {"t": t, "p": filler}})).collect();
            let answer = http.post(&format!("/topics/{topic}/events"), &json!({ "events": events })).await?;
            for o in answer["offsets"].as_array().into_iter().flatten() {
                written
                    .entry(topic.clone())
                    .or_default()
                    .entry(o["partition"].as_u64().unwrap_or_default() as u32)
                    .or_default()
                    .insert(o["offset"].as_u64().unwrap_or_default());
            }
            sent += batch;
        }
    }
    Ok(written)
}

/// Sessions of `--idle-sessions` connecting and subscribing at once.
const STORM_IN_FLIGHT: usize = 500;

pub async fn idle_sessions(cli: &Cli, sessions: usize) -> anyhow::Result<Summary> {
    let gateway = cli.gateway()?;
    let http = Http::new(&gateway.base, cli.admin_token.clone());
    let run = format!("idle{}", std::process::id());
    // One topic for every session; with `--lite`, one lite topic per session.
    let topic_of = |i: usize| if cli.lite { own_topic(cli, format!("{run}-{i}")) } else { run.clone() };
    create_own_topic(cli, &http, &run).await?;
    let mut shape = match cli.lite {
        true => format!("{sessions} idle sessions, each subscribed to its own lite topic"),
        false => format!("{sessions} idle sessions, each subscribed to a {}-partition topic", cli.partitions),
    };
    if cli.first_event {
        if cli.lite {
            bail!("--first-event publishes to one shared topic; drop --lite");
        }
        preload(&http, &run, cli.partitions, cli.partitions as u64, cli.payload_bytes, &AtomicU64::new(0)).await?;
        shape.push_str(", each counted at its first event");
    }
    let first_event = cli.first_event;
    let mut summary = Summary::new(shape);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = gateway.rss_bytes();
    let connected = Arc::new(AtomicU64::new(0));
    let progress = Progress::start("sessions", connected.clone(), sessions as u64);
    // Each session its own task (both of this process's worker threads at work, not one task
    // polling them all), at most STORM_IN_FLIGHT connecting at once: a reconnect storm, with no
    // batch waiting for its slowest before the next starts.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(STORM_IN_FLIGHT));
    let started = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|i| {
            let (ws_url, topic, connected, in_flight) = (gateway.ws.clone(), topic_of(i), connected.clone(), in_flight.clone());
            tokio::spawn(async move {
                let _connecting = in_flight.acquire_owned().await?;
                let mut ws = client::connect(&ws_url, &format!("idle-{i}")).await?;
                use futures_util::{SinkExt, StreamExt};
                ws.send(tokio_tungstenite::tungstenite::Message::Text(json!({"op": "subscribe", "topic": topic}).to_string().into())).await?;
                let answer = ws.next().await.context("no answer to subscribe")??;
                if !answer.to_text().unwrap_or_default().contains("subscribed") {
                    bail!("subscribe answered {answer}");
                }
                if first_event {
                    let event = ws.next().await.context("no event after subscribed")??;
                    if !event.to_text().unwrap_or_default().contains("\"event\"") {
                        bail!("the frame after subscribed is {event}, not an event");
                    }
                }
                connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                anyhow::Ok(ws)
            })
        })
        .collect();
    let mut open = Vec::with_capacity(sessions);
    for task in tasks {
        open.push(task.await??);
    }
    summary.add("connect_s", (started.elapsed().as_secs_f64() * 100.0).round() / 100.0);
    drop(progress);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = gateway.rss_bytes();
    // Every page of the listing (1,000 sessions a page by default).
    let mut live = 0;
    let mut page = http.get("/admin/sessions?limit=10000").await?;
    loop {
        live += page["sessions"].as_array().map_or(0, |s| s.len());
        let Some(next) = page["next"].as_str() else { break };
        page = http.get(&format!("/admin/sessions?limit=10000&after={next}")).await?;
    }
    summary.add("sessions_live", live);
    if live < sessions {
        summary.problem(format!("only {live} of {sessions} sessions are live"));
    }
    if let (Some(before), Some(after)) = (before, after) {
        summary.add("gateway_rss_before_mib", (before as f64 / 1048576.0 * 10.0).round() / 10.0);
        summary.add("gateway_rss_mib", (after as f64 / 1048576.0 * 10.0).round() / 10.0);
        summary.add("kib_per_session", ((after.saturating_sub(before)) as f64 / 1024.0 / sessions as f64 * 10.0).round() / 10.0);
    }
    if cli.hold_secs > 0 {
        hold_idle(cli, &gateway, &mut summary, open).await;
    }
    Ok(summary)
}

/// Holds idle sessions open for `--hold-secs`, each read by its own task (pings are answered, as
/// a browser does), and reports what they cost the gateway per session-second: the cost of a
/// session that waits (the engine review's "b"), apart from any delivery.
async fn hold_idle<S>(cli: &Cli, gateway: &Gateway, summary: &mut Summary, open: Vec<S>)
where
    S: futures_util::Stream<Item = Result<tokio_tungstenite::tungstenite::Message, tokio_tungstenite::tungstenite::Error>> + Unpin + Send + 'static,
{
    use futures_util::StreamExt;
    let sessions = open.len();
    let closed = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = open
        .into_iter()
        .map(|mut ws| {
            let closed = closed.clone();
            tokio::spawn(async move {
                while let Some(Ok(_)) = ws.next().await {}
                closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
        })
        .collect();
    // Settle after the connect storm (its writes, the readers' first polls) before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (gateway_before, own_before) = (gateway.cpu_seconds(), crate::gateway::process_cpu_seconds(std::process::id()));
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(cli.hold_secs)).await;
    let held = started.elapsed().as_secs_f64();
    let (gateway_after, own_after) = (gateway.cpu_seconds(), crate::gateway::process_cpu_seconds(std::process::id()));
    summary.add("hold_s", (held * 10.0).round() / 10.0);
    if let (Some(before), Some(after)) = (gateway_before, gateway_after) {
        summary.add("gateway_cpu_percent_held", ((after - before) / held * 1000.0).round() / 10.0);
        summary.add("us_per_session_second", ((after - before) * 1e6 / held / sessions as f64 * 100.0).round() / 100.0);
    }
    if let (Some(before), Some(after)) = (own_before, own_after) {
        summary.add("loadtest_cpu_percent_held", ((after - before) / held * 1000.0).round() / 10.0);
    }
    let closed = closed.load(std::sync::atomic::Ordering::Relaxed);
    if closed > 0 {
        summary.problem(format!("{closed} of {sessions} idle sessions were closed during the hold"));
    }
    for reader in readers {
        reader.abort();
    }
}

pub async fn restart(cli: &Cli, offsets: u64) -> anyhow::Result<Summary> {
    use ackgate::core::names::{ClientId, OffsetKey, TopicName};
    use ackgate::core::offsets::{OffsetStore, OffsetWrite};
    if cli.url.is_some() {
        bail!("--restart-offsets starts and restarts its own gateway; drop --url");
    }
    let launch = cli.launch();
    let mut gateway = Gateway::start(&launch)?;
    let data = gateway.data_dir.clone().context("a started gateway has a data dir")?;
    let topic = "restart";
    let http = Http::new(&gateway.base, cli.admin_token.clone());
    http.create_topic(topic, cli.partitions).await?;
    preload(&http, topic, cli.partitions, 1000 * cli.partitions as u64, cli.payload_bytes, &AtomicU64::new(0)).await?;
    gateway.stop();

    let mut summary = Summary::new(format!("restart with {offsets} stored offsets ({} partitions)", cli.partitions));
    let started = Instant::now();
    {
        // Written straight into the stopped gateway's offset store: as many clients as needed.
        let store = ackgate::store::rocks::RocksOffsetStore::open(&data, false).map_err(|e| anyhow::anyhow!("{e}"))?;
        let topic = TopicName::parse(topic).map_err(|e| anyhow::anyhow!(e.0))?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
        let mut batch = Vec::with_capacity(10_000);
        let mut written = 0;
        'clients: for c in 0.. {
            let client = ClientId::parse(&format!("client-{c}")).map_err(|e| anyhow::anyhow!(e.0))?;
            for p in 0..cli.partitions {
                if written == offsets {
                    break 'clients;
                }
                batch.push(OffsetWrite {
                    key: OffsetKey::new(topic.clone(), client.clone(), p),
                    committed: 1 + (c % 900),
                    last_acked: Some(c % 900),
                    updated_at: now,
                    generation: 0,
                    epoch: 0,
                });
                written += 1;
                if batch.len() == 10_000 {
                    store.write_offsets(&batch).map_err(|e| anyhow::anyhow!("{e}"))?;
                    batch.clear();
                }
            }
        }
        store.write_offsets(&batch).map_err(|e| anyhow::anyhow!("{e}"))?;
        store.flush().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    summary.add("preload_s", (started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    for round in ["ready_ms_first_restart", "ready_ms_second_restart"] {
        let started = Instant::now();
        let restarted = Gateway::start_in(&launch, &data)?;
        let http = Http::new(&restarted.base, cli.admin_token.clone());
        loop {
            if http.client.get(format!("{}/readyz", http.base)).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if started.elapsed() > Duration::from_secs(120) {
                bail!("not ready after 120 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        summary.add(round, started.elapsed().as_millis() as u64);
        let stored = http.get(&format!("/admin/offsets?topic={topic}&client_id=client-0")).await?;
        if stored["offsets"].as_array().map_or(0, |r| r.len()) != cli.partitions as usize {
            summary.problem(format!("client-0's offsets did not survive the restart: {stored}"));
        }
        if let Some(rss) = restarted.rss_bytes() {
            summary.add("gateway_rss_mib", (rss as f64 / 1048576.0 * 10.0).round() / 10.0);
        }
        drop(restarted);
    }
    Ok(summary)
}

/// Writes `offsets` expired records (`updated_at` two days ago) straight into a stopped gateway's
/// offset store, with plain RocksDB and the column families the store already has: so the same
/// data dir can be swept by this build's gateway and by an older one (`--gateway-bin`).
fn write_expired_offsets(data: &std::path::Path, topic: &str, partitions: u32, offsets: u64) -> anyhow::Result<()> {
    use ackgate::core::names::{ClientId, OffsetKey, TopicName};
    use ackgate::core::offsets::OffsetRecord;
    let path = data.join("offsets");
    let families = rocksdb::DB::list_cf(&rocksdb::Options::default(), &path)?;
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), &path, &families)?;
    let (offsets_cf, by_client_cf) = (db.cf_handle("offsets").context("offsets column family")?, db.cf_handle("by_client").context("by_client column family")?);
    let topic = TopicName::parse(topic).map_err(|e| anyhow::anyhow!(e.0))?;
    let two_days_ago = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64 - 2 * 86_400_000;
    let mut batch = rocksdb::WriteBatch::default();
    for n in 0..offsets {
        let client = ClientId::parse(&format!("gone-{}", n / partitions as u64)).map_err(|e| anyhow::anyhow!(e.0))?;
        let key = OffsetKey::new(topic.clone(), client, (n % partitions as u64) as u32);
        let record = OffsetRecord { committed: 1, last_acked: Some(0), updated_at: two_days_ago, epoch: 0 };
        batch.put_cf(&offsets_cf, key.encode(), record.encode());
        batch.put_cf(&by_client_cf, key.encode_by_client(), []);
        if batch.len() >= 20_000 {
            db.write(std::mem::take(&mut batch))?;
        }
    }
    db.write(batch)?;
    db.flush_wal(true)?;
    Ok(())
}

/// Ping round trips while the gateway's first retention sweep removes `offsets` expired records:
/// the sweep must not stall the sessions (nor ack writes, which wait on the same store lock).
pub async fn sweep(cli: &Cli, offsets: u64) -> anyhow::Result<Summary> {
    if cli.url.is_some() {
        bail!("--sweep-offsets starts and restarts its own gateway; drop --url");
    }
    let mut launch = cli.launch();
    let topic = "sweep";
    let mut gateway = Gateway::start(&launch)?;
    let data = gateway.data_dir.clone().context("a started gateway has a data dir")?;
    let http = Http::new(&gateway.base, cli.admin_token.clone());
    http.create_topic(topic, cli.partitions).await?;
    // One event per partition: the preloaded committed offset 1 is then the log end, not above it.
    preload(&http, topic, cli.partitions, cli.partitions as u64, cli.payload_bytes, &AtomicU64::new(0)).await?;
    gateway.stop();
    let mut summary = Summary::new(format!("ping round trips during a sweep of {offsets} expired offsets"));
    let started = Instant::now();
    write_expired_offsets(&data, topic, cli.partitions, offsets)?;
    summary.add("preload_s", (started.elapsed().as_secs_f64() * 10.0).round() / 10.0);

    // One hour of retention: every preloaded record (two days old) expires in the first sweep,
    // which runs at start; no second sweep during the run.
    launch.env.push(("ACKGATE_OFFSETS__RETENTION_SECS".into(), "3600".into()));
    launch.env.push(("ACKGATE_OFFSETS__SWEEP_INTERVAL_MS".into(), "3600000".into()));
    launch.env.push(("RUST_LOG".into(), "warn,ackgate::gateway=info".into()));
    let started = Instant::now();
    let restarted = Gateway::start_in(&launch, &data)?;
    let mut ws = client::connect(&restarted.ws, "pinger").await?;
    let mut rtt = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut sweep_secs = None;
    while started.elapsed() < Duration::from_secs(300) {
        let sent = Instant::now();
        client::ping(&mut ws).await?;
        rtt.record(sent.elapsed().as_micros().max(1) as u64)?;
        if restarted.logged("expired offsets of absent clients") {
            sweep_secs = Some(started.elapsed().as_secs_f64());
            break;
        }
    }
    let Some(sweep_secs) = sweep_secs else { bail!("the sweep did not end within 300 s") };
    summary.add("sweep_done_after_start_s", (sweep_secs * 100.0).round() / 100.0);
    summary.add("pings", rtt.len());
    summary.add_latency("ping_rtt_us", &rtt);
    let left = Http::new(&restarted.base, cli.admin_token.clone()).get(&format!("/admin/offsets?client_id=gone-0&topic={topic}")).await?;
    if left["offsets"].as_array().is_none_or(|rows| !rows.is_empty()) {
        summary.problem(format!("expired offsets survived the sweep: {left}"));
    }
    Ok(summary)
}
