//! Takeover across instances (`--instances N [--kill-instance-after SECS]`, Kafka): N gateways on
//! one Kafka broker, each with its own data dir and `cluster.peers` naming the others; `--clients`
//! followers on one topic that behave like clients/js/ackgate.js (ack each event, confirm every
//! 100 acks and when events pause; on any non-final close: backoff 250 ms doubling to 10 s with
//! jitter, ask `/session/recommend` of any instance they know, connect where it says, resubscribe
//! with the last resume token the gateway issued in `subscribed` or `ack_ok`); a publisher paced at `--rate` that spreads over the live instances;
//! the instance holding the most sessions SIGKILLed after SECS.
//!
//! Checks: every follower received every published offset; after a reconnect nothing below its
//! resume token was pushed to it; its committed offsets on the instance it ended on equal the log
//! end. Reports throughput, takeover time (kill to `subscribed` and to the first event on the new
//! instance) p50/p99, reconnects and redeliveries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::client;
use crate::gateway::Gateway;
use crate::report::{Progress, Summary};
use crate::Cli;

/// Closes after which a client must not reconnect by itself (docs/protocol.md).
const FINAL_CLOSES: [u16; 2] = [1008, 4001];
const PROBE_INTERVAL_MS: u64 = 500;
/// A follower confirms (an ack with `req`) every this many acks, and after `CONFIRM_IDLE` without
/// a new event: the JS client's `confirmEveryMs`. A confirmed ack per event made the shape an
/// fsync per event and client, more than two cores carried beside another test (issue 63).
const CONFIRM_EVERY: u32 = 100;
const CONFIRM_IDLE: Duration = Duration::from_millis(100);

/// Log end per partition, known once the publisher is done.
type Target = watch::Receiver<Option<BTreeMap<u32, u64>>>;

/// The moment of the kill and the instance killed.
type Killed = Arc<OnceLock<(Instant, String)>>;

struct Follower {
    /// What the summary reads of this follower even when it never finishes (`Seen`).
    seen: Arc<Mutex<Seen>>,
    client_id: String,
    topic: String,
    known: Arc<Mutex<Vec<String>>>,
    target: Target,
    killed: Killed,
    progress: Arc<AtomicU64>,
}

/// How far a follower got, kept as it goes: a follower that does not finish in time is still
/// counted (it moved, it reconnected) and its last committed offsets are named.
#[derive(Default, Clone)]
struct Seen {
    reconnects: u64,
    takeover_subscribed_us: Option<u64>,
    takeover_event_us: Option<u64>,
    committed: BTreeMap<u32, u64>,
    deliveries: u64,
}

#[derive(Default)]
struct Followed {
    received: HashMap<u32, HashSet<u64>>,
    deliveries: u64,
    /// Deliveries with attempt > 1 (redelivered by the same instance).
    redelivered: u64,
    reconnects: u64,
    /// Events pushed after a reconnect with an offset below the resume token sent.
    below_token: u64,
    /// Kill to `subscribed` / to the first event, for a follower whose instance was killed.
    takeover_subscribed_us: Option<u64>,
    takeover_event_us: Option<u64>,
    /// The instance (http url) of the last session, and the durable committed offsets.
    last_instance: String,
    committed: BTreeMap<u32, u64>,
    /// The last resume token the gateway issued (`subscribed`, `ack_ok`): what a reconnect sends.
    resume_token: Option<String>,
}

/// 250 ms doubling up to 10 s, each with jitter (half to all of it), as the clients do.
pub fn backoff(attempt: u32) -> Duration {
    let full = 250u64.saturating_mul(1 << attempt.min(6).saturating_sub(1)).min(10_000);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
    Duration::from_millis(full / 2 + nanos % (full / 2 + 1))
}

fn authorized(request: reqwest::RequestBuilder, token: &Option<String>) -> reqwest::RequestBuilder {
    match token {
        Some(t) => request.bearer_auth(t),
        None => request,
    }
}

/// An instance to connect to: its `/ws` URL and its http base.
type Endpoint = (String, String);

/// Asks the known instances, starting at a different one per attempt, where `client_id` should
/// go; learns the instances the answers name. Returns the instance named and the one that
/// answered (alive by definition: the fallback while its view of a dead peer is still stale).
async fn recommend(http: &reqwest::Client, known: &Mutex<Vec<String>>, client_id: &str, attempt: u32) -> Option<(Endpoint, Endpoint)> {
    let urls = known.lock().unwrap().clone();
    for i in 0..urls.len() {
        let base = &urls[(i + attempt as usize) % urls.len()];
        let answer = http.get(format!("{base}/session/recommend?client_id={client_id}")).timeout(Duration::from_secs(2)).send().await;
        let Ok(answer) = answer else { continue };
        let Ok(body) = answer.json::<Value>().await else { continue };
        if let (Some(ws), Some(http_url)) = (body["ws_url"].as_str(), body["http_url"].as_str()) {
            let mut known = known.lock().unwrap();
            if !known.iter().any(|k| k == http_url) {
                known.push(http_url.to_string());
            }
            let answered = (format!("{}/ws", base.replacen("http", "ws", 1)), base.clone());
            return Some(((ws.to_string(), http_url.to_string()), answered));
        }
    }
    None
}

fn done(target: &Option<BTreeMap<u32, u64>>, committed: &BTreeMap<u32, u64>) -> bool {
    target.as_ref().is_some_and(|t| t.iter().all(|(p, end)| *end == 0 || committed.get(p).is_some_and(|c| c >= end)))
}

async fn follow(mut f: Follower) -> anyhow::Result<Followed> {
    let http = reqwest::Client::new();
    let mut out = Followed::default();
    let mut attempt = 0u32;
    let mut lost_on: Option<String> = None;
    let mut req = 0u64;
    loop {
        if attempt > 0 {
            tokio::time::sleep(backoff(attempt)).await;
        }
        let Some((named, answered)) = recommend(&http, &f.known, &f.client_id, attempt).await else {
            attempt += 1;
            continue;
        };
        // The instance named first; if it cannot be reached, the one that answered.
        let mut connected = None;
        for (ws_url, http_url) in [named, answered] {
            if let Ok(Ok(ws)) = tokio::time::timeout(Duration::from_secs(5), client::connect(&ws_url, &f.client_id)).await {
                connected = Some((ws, http_url));
                break;
            }
        }
        let Some((mut ws, http_url)) = connected else {
            attempt += 1;
            continue;
        };
        if lost_on.is_some() {
            out.reconnects += 1;
            f.seen.lock().unwrap().reconnects = out.reconnects;
        }
        out.last_instance = http_url.clone();
        let token = out.committed.clone();
        let mut subscribe = json!({"op": "subscribe", "topic": f.topic, "req": "sub"});
        if let Some(resume) = &out.resume_token {
            subscribe["resume"] = json!(resume);
        }
        if ws.send(Message::Text(subscribe.to_string().into())).await.is_err() {
            lost_on = Some(http_url);
            attempt = 1;
            continue;
        }
        // Was this follower's previous instance the killed one? Then this session is its takeover.
        let taking_over = lost_on.as_ref().zip(f.killed.get()).filter(|(lost, (_, killed))| *lost == killed).map(|(_, (at, _))| *at);
        let mut first_event_seen = false;
        // Per partition, the last delivery acked without `req` since the last confirmed ack (an
        // `ack_ok` names the partitions its ack touched).
        let mut unconfirmed: BTreeMap<u32, Value> = BTreeMap::new();
        let mut since_confirmed = 0u32;
        let ended: Option<u16> = loop {
            let message = tokio::select! {
                message = ws.next() => message,
                _ = f.target.changed() => {
                    if done(&f.target.borrow(), &out.committed) { break None } else { continue }
                }
                // Nothing more came for a moment: the acks so far are confirmed (their `ack_ok`
                // is the token), as the JS client does every `confirmEveryMs`.
                _ = tokio::time::sleep(CONFIRM_IDLE), if !unconfirmed.is_empty() => {
                    req += 1;
                    let ids: Vec<Value> = std::mem::take(&mut unconfirmed).into_values().collect();
                    let ack = json!({"op": "ack", "delivery_ids": ids, "req": req}).to_string();
                    since_confirmed = 0;
                    if ws.send(Message::Text(ack.into())).await.is_err() {
                        break Some(1006);
                    }
                    continue;
                }
            };
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Close(frame))) => break Some(frame.map_or(1005, |c| u16::from(c.code))),
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => break Some(1006),
            };
            let frame: Value = serde_json::from_str(text.as_str()).context("bad frame")?;
            match frame["type"].as_str() {
                Some("subscribed") => {
                    if frame["resume"] == "refused" {
                        bail!("{}: its resume token was refused ({})", f.client_id, frame["resume_reason"]);
                    }
                    if let Some(issued) = frame["token"].as_str() {
                        out.resume_token = Some(issued.to_string());
                    }
                    if let Some(at) = taking_over {
                        let us = *out.takeover_subscribed_us.get_or_insert(at.elapsed().as_micros() as u64);
                        f.seen.lock().unwrap().takeover_subscribed_us = Some(us);
                    }
                    for p in frame["partitions"].as_array().into_iter().flatten() {
                        let (partition, from) = (p["partition"].as_u64().unwrap_or_default() as u32, p["from"].as_u64().unwrap_or_default());
                        if from < token.get(&partition).copied().unwrap_or(0) {
                            bail!("{}: subscribed from {from} below its resume token on partition {partition}", f.client_id);
                        }
                    }
                }
                Some("event") => {
                    let (partition, offset) = (frame["partition"].as_u64().unwrap_or_default() as u32, frame["offset"].as_u64().unwrap_or_default());
                    out.deliveries += 1;
                    if frame["attempt"].as_u64() > Some(1) {
                        out.redelivered += 1;
                    }
                    if offset < token.get(&partition).copied().unwrap_or(0) {
                        out.below_token += 1;
                    }
                    if !first_event_seen {
                        first_event_seen = true;
                        if let Some(at) = taking_over {
                            let us = *out.takeover_event_us.get_or_insert(at.elapsed().as_micros() as u64);
                            f.seen.lock().unwrap().takeover_event_us = Some(us);
                        }
                    }
                    out.received.entry(partition).or_default().insert(offset);
                    // Each event is acked; every CONFIRM_EVERY-th ack (and the last before a
                    // pause) carries req, whose ack_ok names the durable committed offsets.
                    since_confirmed += 1;
                    unconfirmed.insert(partition, frame["delivery_id"].clone());
                    let mut ack = json!({"op": "ack", "delivery_id": frame["delivery_id"]});
                    if since_confirmed >= CONFIRM_EVERY {
                        req += 1;
                        let ids: Vec<Value> = std::mem::take(&mut unconfirmed).into_values().collect();
                        ack = json!({"op": "ack", "delivery_ids": ids, "req": req});
                        since_confirmed = 0;
                    }
                    if ws.send(Message::Text(ack.to_string().into())).await.is_err() {
                        // The instance went away under the ack; the next one redelivers.
                        break Some(1006);
                    }
                    f.progress.fetch_add(1, Ordering::Relaxed);
                }
                Some("ack_ok") => {
                    if let Some(issued) = frame["tokens"][f.topic.as_str()].as_str() {
                        out.resume_token = Some(issued.to_string());
                    }
                    for (p, c) in frame["committed"][f.topic.as_str()].as_object().into_iter().flatten() {
                        let (Ok(p), Some(c)) = (p.parse::<u32>(), c.as_u64()) else { continue };
                        let slot = out.committed.entry(p).or_insert(0);
                        *slot = (*slot).max(c);
                    }
                    {
                        let mut seen = f.seen.lock().unwrap();
                        seen.committed = out.committed.clone();
                        seen.deliveries = out.deliveries;
                    }
                    if done(&f.target.borrow(), &out.committed) {
                        break None;
                    }
                }
                Some("error") => bail!("{}: error frame {frame}", f.client_id),
                _ => {}
            }
        };
        match ended {
            None => {
                let _ = ws.close(None).await;
                return Ok(out);
            }
            Some(code) if FINAL_CLOSES.contains(&code) => bail!("{}: final close {code}", f.client_id),
            Some(_) => {
                lost_on = Some(http_url);
                attempt = 1;
            }
        }
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub async fn run(cli: &Cli, instances: usize) -> anyhow::Result<Summary> {
    if cli.brokers.is_none() {
        bail!("--instances needs --brokers: the instances share one Kafka log");
    }
    if cli.url.is_some() {
        bail!("--instances starts its own gateways; drop --url");
    }
    let rate = cli.rate.unwrap_or(2000);
    let ports = (0..instances).map(|_| free_port()).collect::<anyhow::Result<Vec<_>>>()?;
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut gateways = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut launch = cli.launch();
        launch.env.push(("ACKGATE_SERVER__LISTEN".into(), format!("127.0.0.1:{port}")));
        launch.env.push(("ACKGATE_SERVER__INSTANCE_ID".into(), format!("gw-{i}")));
        launch.env.push(("ACKGATE_CLUSTER__PEERS".into(), serde_json::to_string(&urls)?));
        launch.env.push(("ACKGATE_CLUSTER__TOKEN_KEY".into(), crate::CLUSTER_TOKEN_KEY.into()));
        launch.env.push(("ACKGATE_CLUSTER__PROBE_INTERVAL_MS".into(), PROBE_INTERVAL_MS.to_string()));
        gateways.push(Some(Gateway::start(&launch).with_context(|| format!("starting instance gw-{i}"))?));
    }
    let http = reqwest::Client::new();
    // Wait until every instance sees all the others healthy: its recommendations name them all
    // (otherwise the instances disagree and the followers bunch up on a few).
    let deadline = Instant::now() + Duration::from_secs(30);
    for url in &urls {
        loop {
            let mut named = HashSet::new();
            for i in 0..100 {
                if let Ok(answer) = http.get(format!("{url}/session/recommend?client_id=probe-{i}")).send().await {
                    if let Ok(body) = answer.json::<Value>().await {
                        named.insert(body["instance"].as_str().unwrap_or_default().to_string());
                    }
                }
            }
            if named.len() == instances {
                break;
            }
            if Instant::now() > deadline {
                bail!("{url} did not see the other instances healthy within 30 s ({} of {instances} recommended)", named.len());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let run = format!("lt{}", std::process::id());
    let topic = format!("{run}-takeover");
    let created =
        authorized(http.post(format!("{}/topics", urls[0])), &cli.admin_token).json(&json!({"name": topic, "partitions": cli.partitions})).send().await?;
    if !created.status().is_success() {
        bail!("creating {topic}: {}", created.text().await?);
    }
    let (target_tx, target_rx) = watch::channel(None);
    let killed: Killed = Default::default();
    let acked = Arc::new(AtomicU64::new(0));
    let mut followers = Vec::new();
    for c in 0..cli.clients {
        let seen: Arc<Mutex<Seen>> = Default::default();
        let follower = Follower {
            seen: seen.clone(),
            client_id: format!("{run}-f{c}"),
            topic: topic.clone(),
            // Every instance, as the JS client's `peers` option lists them, starting at another
            // one per follower.
            known: Arc::new(Mutex::new((0..instances).map(|i| urls[(c + i) % instances].clone()).collect())),
            target: target_rx.clone(),
            killed: killed.clone(),
            progress: acked.clone(),
        };
        let client_id = follower.client_id.clone();
        followers.push((client_id, seen, tokio::spawn(follow(follower))));
    }
    // Everyone subscribed before the publisher starts: count sessions across the instances.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sessions_per_instance(&http, &urls, &cli.admin_token).await.iter().sum::<usize>() < cli.clients {
        if Instant::now() > deadline {
            bail!("not every follower connected within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spread = sessions_per_instance(&http, &urls, &cli.admin_token).await;

    let mut summary = Summary::new(format!(
        "takeover: {instances} instances on Kafka, {} followers of one topic ({} partitions), {} events at {rate}/s",
        cli.clients, cli.partitions, cli.events
    ));
    summary.add("sessions_per_instance", json!(spread));
    let _progress = Progress::start("acked", acked.clone(), cli.events * cli.clients as u64);
    let started = Instant::now();
    // The kill: the instance with the most sessions, after SECS.
    let killer = cli.kill_instance_after.map(|secs| {
        let (http, urls, killed, token) = (http.clone(), urls.clone(), killed.clone(), cli.admin_token.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            let counts = sessions_per_instance(&http, &urls, &token).await;
            let victim = (0..counts.len()).max_by_key(|i| counts[*i]).unwrap_or(0);
            (victim, counts[victim], killed)
        })
    });
    let publisher = {
        let (http, urls, topic, token, killed) = (http.clone(), urls.clone(), topic.clone(), cli.admin_token.clone(), killed.clone());
        let (events, payload) = (cli.events, "x".repeat(cli.payload_bytes.saturating_sub(8)));
        tokio::spawn(async move { publish(&http, &urls, &topic, &token, events, rate, &payload, &killed).await })
    };
    let mut killed_sessions = 0;
    let mut draining = None;
    if let Some(killer) = killer {
        let (victim, sessions, killed) = killer.await?;
        let _ = killed.set((Instant::now(), urls[victim].clone()));
        if let Some(mut gateway) = gateways[victim].take() {
            if cli.drain {
                // SIGTERM: the instance drains (its sessions closed over `server.drain_ms`) and
                // exits; waited for on the blocking pool, while the followers move.
                draining = Some(tokio::task::spawn_blocking(move || gateway.stop()));
            } else {
                gateway.kill9();
            }
        }
        killed_sessions = sessions;
        summary.add("killed_instance", format!("gw-{victim} ({sessions} sessions) at {:.1} s", started.elapsed().as_secs_f64()));
    }
    let published = publisher.await??;
    summary.add("publish_events_per_s", (cli.events as f64 / started.elapsed().as_secs_f64()).round());
    // The log end per partition, from a surviving instance; the followers finish there.
    let survivor = gateways.iter().position(Option::is_some).context("no instance left")?;
    let listed: Value = http.get(format!("{}/topics", urls[survivor])).send().await?.json().await?;
    let info = listed["topics"].as_array().and_then(|ts| ts.iter().find(|t| t["name"] == topic.as_str())).context("topic missing from GET /topics")?;
    let log_end: BTreeMap<u32, u64> = info["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (p["partition"].as_u64().unwrap_or_default() as u32, p["log_end"].as_u64().unwrap_or_default()))
        .collect();
    target_tx.send_replace(Some(log_end.clone()));

    let settle = Instant::now() + Duration::from_secs(cli.settle_secs);
    let (mut subscribed, mut first_event) = (Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?, Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?);
    let (mut deliveries, mut redelivered, mut distinct, mut reconnects, mut moved) = (0u64, 0u64, 0u64, 0u64, 0u64);
    // When each follower of the stopped instance subscribed elsewhere (a drain spreads these).
    let mut moved_at_us: Vec<u64> = Vec::new();
    for (client_id, seen, task) in followers {
        let left = settle.saturating_duration_since(Instant::now());
        let result = match tokio::time::timeout(left, task).await {
            Ok(Ok(Ok(result))) => result,
            Ok(Ok(Err(e))) => {
                summary.problem(format!("{e:#}"));
                continue;
            }
            Ok(Err(e)) => {
                summary.problem(format!("{client_id}: {e}"));
                continue;
            }
            Err(_) => {
                // Counted as far as it got: whether it moved and reconnected, and where it was.
                let seen = seen.lock().unwrap().clone();
                reconnects += seen.reconnects;
                if let Some(us) = seen.takeover_subscribed_us {
                    subscribed.saturating_record(us);
                    moved_at_us.push(us);
                    moved += 1;
                }
                if let Some(us) = seen.takeover_event_us {
                    first_event.saturating_record(us);
                }
                summary.problem(format!(
                    "{client_id}: not at the log end {} s after the last publish (confirmed {:?} of {log_end:?}, {} deliveries, {} reconnects, moved: {})",
                    cli.settle_secs,
                    seen.committed,
                    seen.deliveries,
                    seen.reconnects,
                    seen.takeover_subscribed_us.is_some()
                ));
                continue;
            }
        };
        deliveries += result.deliveries;
        redelivered += result.redelivered;
        reconnects += result.reconnects;
        let got: u64 = result.received.values().map(|s| s.len() as u64).sum();
        distinct += got;
        if let Some(us) = result.takeover_subscribed_us {
            subscribed.saturating_record(us);
            moved_at_us.push(us);
            moved += 1;
        }
        if let Some(us) = result.takeover_event_us {
            first_event.saturating_record(us);
        }
        if result.below_token > 0 {
            summary.problem(format!("{client_id}: {} events below its resume token were pushed after a reconnect", result.below_token));
        }
        for (partition, offsets) in &published {
            let missing = offsets.iter().filter(|o| !result.received.get(partition).is_some_and(|s| s.contains(o))).count();
            if missing > 0 {
                summary.problem(format!("{client_id} missed {missing} events of partition {partition}"));
            }
        }
        // Its committed offsets, as stored by the instance it ended on.
        let rows: Value = authorized(http.get(format!("{}/admin/offsets?topic={topic}&client_id={client_id}", result.last_instance)), &cli.admin_token)
            .send()
            .await?
            .json()
            .await?;
        for (partition, end) in &log_end {
            let committed = rows["offsets"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["partition"].as_u64() == Some(u64::from(*partition)))
                .and_then(|r| r["committed"].as_u64());
            if *end > 0 && committed != Some(*end) {
                summary.problem(format!("{client_id} on {}: partition {partition} committed {committed:?}, log end {end}", result.last_instance));
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    summary.add("elapsed_s", (elapsed * 1000.0).round() / 1000.0);
    summary.add("deliveries", deliveries);
    summary.add("delivered_per_s", (deliveries as f64 / elapsed).round());
    summary.add("published", published.values().map(|s| s.len() as u64).sum::<u64>());
    summary.add("duplicate_deliveries", deliveries.saturating_sub(distinct));
    summary.add("redelivered_attempt_gt_1", redelivered);
    summary.add("reconnects", reconnects);
    if cli.kill_instance_after.is_some() {
        summary.add("followers_moved", format!("{moved} of {killed_sessions}"));
        if moved < killed_sessions as u64 {
            summary.problem(format!("only {moved} of the killed instance's {killed_sessions} followers took over"));
        }
        summary.add_latency("takeover_to_subscribed", &subscribed);
        summary.add_latency("takeover_to_first_event", &first_event);
        if let (Some(first), Some(last)) = (moved_at_us.iter().min(), moved_at_us.iter().max()) {
            summary.add("moved_spread_ms", (last - first) / 1000);
        }
    }
    if let Some(draining) = draining {
        let _ = draining.await;
    }
    Ok(summary)
}

async fn sessions_per_instance(http: &reqwest::Client, urls: &[String], token: &Option<String>) -> Vec<usize> {
    let mut counts = Vec::new();
    for url in urls {
        let answer = authorized(http.get(format!("{url}/admin/sessions?limit=10000")), token).timeout(Duration::from_secs(2)).send().await;
        let body = match answer {
            Ok(a) => a.json::<Value>().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        counts.push(body["sessions"].as_array().map_or(0, Vec::len));
    }
    counts
}

/// Publishes `events` at `rate`/s in 10 ms ticks, to the live instances in turn (an instance that
/// fails is skipped from then on; its request is retried elsewhere, which may write it twice:
/// extra offsets, never missing ones). Returns the offsets written per partition.
// The run's knobs one by one (instances, topic, rate, count, ...): a struct would only rename them.
#[allow(clippy::too_many_arguments)]
async fn publish(
    http: &reqwest::Client,
    urls: &[String],
    topic: &str,
    token: &Option<String>,
    events: u64,
    rate: u64,
    payload: &str,
    killed: &Killed,
) -> anyhow::Result<BTreeMap<u32, HashSet<u64>>> {
    let mut written: BTreeMap<u32, HashSet<u64>> = BTreeMap::new();
    let mut down = vec![false; urls.len()];
    let (mut sent, mut next) = (0u64, 0usize);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let start = Instant::now();
    while sent < events {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(events);
        while sent < due {
            let batch = (due - sent).min(1000);
            let body = json!({"events": (0..batch).map(|_| json!({"payload": {"p": payload}})).collect::<Vec<_>>()});
            let mut tries = 0;
            let answer = loop {
                if let Some((_, url)) = killed.get() {
                    down[urls.iter().position(|u| u == url).unwrap_or(0)] = true;
                }
                let i = (0..urls.len()).map(|k| (next + k) % urls.len()).find(|i| !down[*i]).context("no live instance to publish to")?;
                next = (i + 1) % urls.len();
                let response =
                    authorized(http.post(format!("{}/topics/{topic}/events", urls[i])), token).json(&body).timeout(Duration::from_secs(10)).send().await;
                tries += 1;
                if tries > urls.len() * 20 {
                    bail!("publishing failed on every instance");
                }
                match response {
                    Ok(r) if r.status().is_success() => break r.json::<Value>().await?,
                    Ok(r) if r.status().is_client_error() => bail!("publish refused: {} {}", r.status(), r.text().await.unwrap_or_default()),
                    // 503 (the backend busy or reconnecting): the instance lives; try again soon.
                    Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    // Connection refused or cut: the instance is gone.
                    Err(_) => down[i] = true,
                }
            };
            for o in answer["offsets"].as_array().into_iter().flatten() {
                written.entry(o["partition"].as_u64().unwrap_or_default() as u32).or_default().insert(o["offset"].as_u64().unwrap_or_default());
            }
            sent += batch;
        }
    }
    Ok(written)
}
