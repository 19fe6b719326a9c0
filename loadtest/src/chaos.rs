//! `loadtest chaos`: the fault suite (issue 43). Publishers, WebSocket clients (acking each event,
//! in batches, or confirmed with `req`, some reconnecting on their own with resume tokens) and SSE
//! clients (resuming with `Last-Event-ID`) run against the real binary while a nemesis injects
//! faults at seeded random times; then every fault is healed, the clients catch up, and the history
//! checker (`history.rs`) reports every anomaly class. Exits 1 on any anomaly.
//!
//! Backends: the embedded log (one instance; its data dir on the power-loss file system), Kafka
//! (the run starts its own tansu, `--tansu PATH`) or RocketMQ POP (rocketmq-rust through
//! `--rocketmq-script PATH`), with `--instances` gateways on the broker and `cluster.peers`, every
//! data dir on one power-loss file system, so that a power loss is a coordinated one.
//!
//! Faults: `kill` (SIGKILL an instance, start it again), `pause` (SIGSTOP an instance for longer
//! than the pong timeout, then SIGCONT: a zombie that wakes after its clients moved), `restart`
//! (SIGTERM: a drain), `power` (SIGKILL every instance, drop every write no fsync covered, start
//! again), `disk-full` (writes fail with ENOSPC for a while), `clock` (an instance's wall clock
//! steps 30 s back to 45 s ahead, through Debian's libfaketime), `broker-kill` and
//! `broker-pause` (Kafka, RocketMQ).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use crate::gateway::{Gateway, Launch};
use crate::history::{History, Report};
use crate::powerloss::PowerLossMount;
use crate::takeover::{backoff, free_port};

const TOPIC: &str = "chaos";
/// The gateway's keepalive in a chaos run: a dead peer is found within seconds, not a minute.
const PING_INTERVAL_MS: u64 = 1000;
const PONG_TIMEOUT_MS: u64 = 3000;
/// What a client waits for any frame (a keepalive included) before it calls the connection dead.
const CLIENT_SILENCE: Duration = Duration::from_secs(6);
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    Kill,
    Pause,
    Restart,
    Power,
    DiskFull,
    Clock,
    BrokerKill,
    BrokerPause,
}

impl Fault {
    /// The name `--faults` takes and the report prints.
    fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }
}

#[derive(clap::Parser, Clone)]
#[command(name = "loadtest chaos", about = "The fault suite: a workload, a nemesis and the history checker against the real binary")]
pub struct ChaosCli {
    /// How long faults are injected (the settle phase comes after).
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Seeds the fault schedule and the clients' choices (timing still varies run to run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run on Kafka: a tansu broker started from this binary (scripts/kafka-test-broker path).
    #[arg(long)]
    pub tansu: Option<PathBuf>,
    /// Run on RocketMQ (POP): rocketmq-rust through this script (scripts/rocketmq-test-broker).
    #[arg(long, conflicts_with = "tansu")]
    pub rocketmq_script: Option<PathBuf>,
    /// Gateways on the Kafka or RocketMQ broker (the embedded log runs one).
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    /// The faults to inject (default: every one the backend has).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Fault>,
    /// Mean time between two faults.
    #[arg(long, default_value_t = 4.0)]
    pub fault_every_secs: f64,
    #[arg(long, default_value_t = 6)]
    pub ws_clients: usize,
    #[arg(long, default_value_t = 2)]
    pub sse_clients: usize,
    /// Events published per second (in batches of 1-4).
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// How long the clients may take to catch up once the faults stop.
    #[arg(long, default_value_t = 120)]
    pub settle_secs: u64,
    /// The gateway binary (default: `ackgate` next to this executable).
    #[arg(long)]
    pub gateway_bin: Option<PathBuf>,
    /// Write every gateway's log lines here when the run ends.
    #[arg(long)]
    pub gateway_log: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// splitmix64: the run's one source of choices, from `--seed`.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }

    /// Another stream, for a task of its own.
    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// A client's view of its own progress: its resume point per partition, and what was delivered
/// at or above it (what may come again when the session ends: the bound on duplicates).
#[derive(Default)]
struct Progress {
    /// Per partition, the offset its resume token names: the contiguous acked floor (WebSocket)
    /// or the last `id:` token (SSE).
    floor: BTreeMap<u32, u64>,
    /// Offsets delivered at or above the floor: what a fault may deliver again.
    above_floor: BTreeMap<u32, BTreeSet<u64>>,
    /// Offsets acked above the floor (WebSocket).
    acked: BTreeMap<u32, BTreeSet<u64>>,
    /// Per partition, the epoch of the last `subscribed`.
    epochs: BTreeMap<u32, u64>,
}

impl Progress {
    fn in_flight(&self) -> u64 {
        self.above_floor.values().map(|s| s.len() as u64).sum()
    }

    fn raise_floor(&mut self, partition: u32, to: u64) {
        let floor = self.floor.entry(partition).or_insert(to);
        *floor = (*floor).max(to);
        let floor = *floor;
        if let Some(above) = self.above_floor.get_mut(&partition) {
            *above = above.split_off(&floor);
        }
        if let Some(acked) = self.acked.get_mut(&partition) {
            *acked = acked.split_off(&floor);
        }
    }

    fn delivered(&mut self, partition: u32, offset: u64) {
        if self.floor.get(&partition).is_none_or(|f| offset >= *f) {
            self.above_floor.entry(partition).or_default().insert(offset);
        }
    }

    fn acked(&mut self, partition: u32, offset: u64) {
        let Some(mut floor) = self.floor.get(&partition).copied() else { return };
        if offset < floor {
            return;
        }
        let acked = self.acked.entry(partition).or_default();
        acked.insert(offset);
        while acked.remove(&floor) {
            floor += 1;
        }
        self.raise_floor(partition, floor);
    }
}

/// Counts the run prints.
#[derive(Default)]
struct Counters {
    next_payload: AtomicU64,
    publish_errors: AtomicU64,
    reconnects: AtomicU64,
    voluntary_reconnects: AtomicU64,
    nacks: AtomicU64,
    error_frames: AtomicU64,
    /// Deliveries that may come again: what was in flight when each session ended and at each
    /// clock jump, plus the nacks.
    duplicate_bound: AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum AckStyle {
    Each,
    Batch,
    Confirmed,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    WebSocket(AckStyle),
    Sse,
}

struct ClientPlan {
    id: String,
    transport: Transport,
    /// Closes its session now and then on its own and resumes.
    wanders: bool,
    urls: Arc<Vec<String>>,
    history: Arc<Mutex<History>>,
    progress: Arc<Mutex<Progress>>,
    counters: Arc<Counters>,
    stop: watch::Receiver<bool>,
    rng: Rng,
    /// Clients on several instances: an SSE token may lawfully trail an `ack_ok` of another
    /// instance (docs/takeover.md), so its confirmed offsets are not held against later starts.
    cluster: bool,
}

/// How a session ended.
enum Ended {
    Stop,
    Again,
}

fn partition_of(frame: &Value) -> (u32, u64) {
    (frame["partition"].as_u64().unwrap_or_default() as u32, frame["offset"].as_u64().unwrap_or_default())
}

fn key(partition: u32) -> (String, u32) {
    (TOPIC.to_string(), partition)
}

impl ClientPlan {
    /// Records a `subscribed` frame.
    fn subscribed(&self, frame: &Value) {
        let mut history = self.history.lock().unwrap();
        let mut progress = self.progress.lock().unwrap();
        for p in frame["partitions"].as_array().into_iter().flatten() {
            let (partition, from) = (p["partition"].as_u64().unwrap_or_default() as u32, p["from"].as_u64().unwrap_or_default());
            history.subscribed(&self.id, key(partition), from);
            if let (Some(gap_from), Some(gap_to)) = (p["gap"]["from"].as_u64(), p["gap"]["to"].as_u64()) {
                history.gap(&self.id, key(partition), gap_from, gap_to);
            }
            if let Some(epoch) = p["epoch"].as_u64() {
                progress.epochs.insert(partition, epoch);
            }
            progress.raise_floor(partition, from);
        }
    }

    /// Records an `event`; returns its delivery id.
    fn delivered(&self, frame: &Value) -> String {
        let (partition, offset) = partition_of(frame);
        let payload = frame["payload"]["id"].as_u64().unwrap_or(u64::MAX);
        self.history.lock().unwrap().delivered(&self.id, key(partition), offset, payload);
        self.progress.lock().unwrap().delivered(partition, offset);
        frame["delivery_id"].as_str().unwrap_or_default().to_string()
    }

    fn confirmed(&self, frame: &Value) {
        if self.cluster && self.transport == Transport::Sse {
            return;
        }
        let mut history = self.history.lock().unwrap();
        for (p, c) in frame["committed"][TOPIC].as_object().into_iter().flatten() {
            if let (Ok(p), Some(c)) = (p.parse::<u32>(), c.as_u64()) {
                history.confirmed(&self.id, key(p), c);
            }
        }
    }

    fn gap(&self, frame: &Value) {
        if let (Some(from), Some(to)) = (frame["from"].as_u64(), frame["to"].as_u64()) {
            let partition = frame["partition"].as_u64().unwrap_or_default() as u32;
            self.history.lock().unwrap().gap(&self.id, key(partition), from, to);
        }
    }

    /// A voluntary end of this session, when the client wanders.
    fn wander_deadline(&mut self) -> Option<tokio::time::Instant> {
        self.wanders.then(|| tokio::time::Instant::now() + self.rng.millis(3_000, 15_000))
    }

    async fn run(mut self) -> anyhow::Result<()> {
        let mut attempt = 0u32;
        // SSE: the last `id:` seen, sent back as Last-Event-ID.
        let mut last_event_id: Option<String> = None;
        loop {
            if *self.stop.borrow() {
                return Ok(());
            }
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt.min(3))).await;
            }
            let base = self.urls[self.rng.below(self.urls.len() as u64) as usize].clone();
            let base = recommended(&base, &self.id).await.unwrap_or(base);
            let ended = match self.transport {
                Transport::WebSocket(style) => self.websocket_session(&base, style).await,
                Transport::Sse => self.sse_session(&base, &mut last_event_id).await,
            };
            // Whatever ended the session (a fault, the client itself), what was delivered at or
            // above its resume point may come again.
            let in_flight = self.progress.lock().unwrap().in_flight();
            self.counters.duplicate_bound.fetch_add(in_flight, Ordering::Relaxed);
            match ended {
                Ok(Ended::Stop) => return Ok(()),
                Ok(Ended::Again) => attempt = 1,
                Err(_) => attempt += 1,
            }
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn websocket_session(&mut self, base: &str, style: AckStyle) -> anyhow::Result<Ended> {
        let url = format!("{}/ws?client_id={}", base.replacen("http", "ws", 1), self.id);
        let (mut ws, _) = tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(url)).await.context("connect timed out")??;
        let subscribe = {
            let progress = self.progress.lock().unwrap();
            let resume: serde_json::Map<String, Value> = progress.floor.iter().map(|(p, o)| (p.to_string(), json!(o))).collect();
            let epochs: serde_json::Map<String, Value> = progress.epochs.iter().map(|(p, e)| (p.to_string(), json!(e))).collect();
            json!({"op": "subscribe", "topic": TOPIC, "resume": resume, "epochs": epochs, "req": "sub"}).to_string()
        };
        ws.send(Message::Text(subscribe.clone().into())).await?;
        let wander = self.wander_deadline();
        let mut batch: Vec<(String, u32, u64)> = Vec::new();
        let mut req = 0u64;
        let mut silent_since = Instant::now();
        let mut pinged = false;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(Duration::from_millis(500), ws.next()) => next,
                _ = self.stop.changed() => {
                    let _ = ws.close(None).await;
                    return Ok(Ended::Stop);
                }
                _ = async { tokio::time::sleep_until(wander.expect("guarded")).await }, if wander.is_some() => {
                    self.voluntary();
                    let _ = ws.close(None).await;
                    return Ok(Ended::Again);
                }
            };
            let text = match next {
                Err(_) => {
                    // Nothing for a while: flush a batch, ping, and give up on a silent socket.
                    self.flush_batch(&mut ws, &mut batch).await?;
                    if silent_since.elapsed() > CLIENT_SILENCE {
                        bail!("silent connection");
                    }
                    if !pinged && silent_since.elapsed() > CLIENT_SILENCE / 3 {
                        pinged = true;
                        ws.send(Message::Text(r#"{"op":"ping","req":"alive"}"#.into())).await?;
                    }
                    continue;
                }
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(Message::Close(_)))) | Ok(None) => return Ok(Ended::Again),
                Ok(Some(Ok(_))) => {
                    silent_since = Instant::now();
                    continue;
                }
                Ok(Some(Err(e))) => return Err(e.into()),
            };
            silent_since = Instant::now();
            pinged = false;
            let frame: Value = serde_json::from_str(text.as_str()).context("a frame that is not JSON")?;
            match frame["type"].as_str() {
                Some("subscribed") => self.subscribed(&frame),
                Some("event") => {
                    let id = self.delivered(&frame);
                    let (partition, offset) = partition_of(&frame);
                    if self.rng.chance(0.01) {
                        self.counters.nacks.fetch_add(1, Ordering::Relaxed);
                        self.counters.duplicate_bound.fetch_add(1, Ordering::Relaxed);
                        ws.send(Message::Text(json!({"op": "nack", "delivery_id": id}).to_string().into())).await?;
                        continue;
                    }
                    match style {
                        AckStyle::Each | AckStyle::Confirmed => {
                            let mut ack = json!({"op": "ack", "delivery_id": id});
                            if style == AckStyle::Confirmed {
                                req += 1;
                                ack["req"] = json!(req);
                            }
                            ws.send(Message::Text(ack.to_string().into())).await?;
                            self.progress.lock().unwrap().acked(partition, offset);
                        }
                        AckStyle::Batch => {
                            batch.push((id, partition, offset));
                            if batch.len() >= 20 {
                                self.flush_batch(&mut ws, &mut batch).await?;
                            }
                        }
                    }
                }
                Some("ack_ok") => self.confirmed(&frame),
                Some("gap") => self.gap(&frame),
                Some("error") => {
                    self.counters.error_frames.fetch_add(1, Ordering::Relaxed);
                    if frame["req"] == "sub" {
                        // Not subscribed (the backend unavailable): try again shortly.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        ws.send(Message::Text(subscribe.clone().into())).await?;
                    }
                }
                _ => {}
            }
        }
    }

    async fn flush_batch(&self, ws: &mut crate::client::Ws, batch: &mut Vec<(String, u32, u64)>) -> anyhow::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = batch.iter().map(|(id, _, _)| id.as_str()).collect();
        ws.send(Message::Text(json!({"op": "ack", "delivery_ids": ids}).to_string().into())).await?;
        let mut progress = self.progress.lock().unwrap();
        for (_, partition, offset) in batch.drain(..) {
            progress.acked(partition, offset);
        }
        Ok(())
    }

    fn voluntary(&self) {
        self.counters.voluntary_reconnects.fetch_add(1, Ordering::Relaxed);
    }

    async fn sse_session(&mut self, base: &str, last_event_id: &mut Option<String>) -> anyhow::Result<Ended> {
        let http = reqwest::Client::new();
        let mut request = http.get(format!("{base}/sse?client_id={}&topics={TOPIC}", self.id));
        if let Some(id) = last_event_id.as_ref() {
            request = request.header("Last-Event-ID", id.clone());
        }
        let mut stream = tokio::time::timeout(Duration::from_secs(5), request.send()).await.context("connect timed out")??;
        if !stream.status().is_success() {
            bail!("GET /sse answered {}", stream.status());
        }
        let wander = self.wander_deadline();
        let mut buffer: Vec<u8> = Vec::new();
        let mut frames_url: Option<String> = None;
        let mut req = 0u64;
        loop {
            let chunk = tokio::select! {
                chunk = tokio::time::timeout(CLIENT_SILENCE, stream.chunk()) => chunk,
                _ = self.stop.changed() => return Ok(Ended::Stop),
                _ = async { tokio::time::sleep_until(wander.expect("guarded")).await }, if wander.is_some() => {
                    self.voluntary();
                    return Ok(Ended::Again);
                }
            };
            match chunk.context("silent stream")?? {
                Some(chunk) => buffer.extend_from_slice(&chunk),
                None => return Ok(Ended::Again),
            }
            let mut acks: Vec<String> = Vec::new();
            while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                let message: Vec<u8> = buffer.drain(..end + 2).collect();
                let message = String::from_utf8_lossy(&message).into_owned();
                let (mut kind, mut data, mut id) = ("message", String::new(), None);
                for line in message.lines() {
                    if let Some(k) = line.strip_prefix("event: ") {
                        kind = if k == "event" { "event" } else { k.trim() };
                        if !["event", "welcome", "subscribed", "gap", "close", "reconnect"].contains(&kind) {
                            kind = "other";
                        }
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    } else if let Some(i) = line.strip_prefix("id: ") {
                        id = Some(i.to_string());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let frame: Value = serde_json::from_str(&data).context("SSE data that is not JSON")?;
                match kind {
                    "welcome" => frames_url = frame["ack_url"].as_str().map(|u| format!("{base}{u}")),
                    "subscribed" => self.subscribed(&frame),
                    "event" => {
                        acks.push(self.delivered(&frame));
                        if let Some(id) = id {
                            // The token: the committed offsets as durable when this was written.
                            self.sse_token(&id);
                            *last_event_id = Some(id);
                        }
                    }
                    "gap" => self.gap(&frame),
                    "close" => return Ok(Ended::Again),
                    _ => {}
                }
            }
            if acks.is_empty() {
                continue;
            }
            let Some(url) = frames_url.as_ref() else { bail!("an event before the welcome") };
            req += 1;
            let body = json!([{"op": "ack", "delivery_ids": acks, "req": req}]);
            let answered = tokio::time::timeout(Duration::from_secs(5), http.post(url).json(&body).send()).await.context("POST of acks timed out")??;
            if !answered.status().is_success() {
                return Ok(Ended::Again);
            }
            let answers: Vec<Value> = answered.json().await?;
            for answer in answers {
                if answer["type"] == "ack_ok" {
                    self.confirmed(&answer);
                }
            }
        }
    }

    /// Takes an SSE `id:` token as the client's floor.
    fn sse_token(&self, token: &str) {
        let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token) else { return };
        let Ok(parsed) = serde_json::from_slice::<Value>(&bytes) else { return };
        let mut progress = self.progress.lock().unwrap();
        for (p, o) in parsed[TOPIC].as_object().into_iter().flatten() {
            // `offset`, or `[offset, epoch]` in a non-zero epoch.
            let offset = o.as_u64().or_else(|| o[0].as_u64());
            if let (Ok(p), Some(o)) = (p.parse::<u32>(), offset) {
                progress.raise_floor(p, o);
            }
        }
    }
}

/// The instance `/session/recommend` names for `client_id`, asked of `base`.
async fn recommended(base: &str, client_id: &str) -> Option<String> {
    let answer = reqwest::Client::new().get(format!("{base}/session/recommend?client_id={client_id}")).timeout(Duration::from_secs(2)).send().await.ok()?;
    let body: Value = answer.json().await.ok()?;
    body["http_url"].as_str().map(str::to_string)
}

/// Publishes batches of 1-4 events with run-unique payload ids at about `rate` events/s, to a
/// random instance each time; records what was answered, and what was only attempted.
async fn publish(urls: Arc<Vec<String>>, rate: u64, history: Arc<Mutex<History>>, counters: Arc<Counters>, mut stop: watch::Receiver<bool>, mut rng: Rng) {
    let http = reqwest::Client::new();
    while !*stop.borrow() {
        let n = 1 + rng.below(4);
        let ids: Vec<u64> = (0..n).map(|_| counters.next_payload.fetch_add(1, Ordering::Relaxed)).collect();
        let events: Vec<Value> = ids.iter().map(|id| json!({"key": format!("k{}", id % 32), "payload": {"id": id}})).collect();
        let base = &urls[rng.below(urls.len() as u64) as usize];
        let sent = http.post(format!("{base}/topics/{TOPIC}/events")).json(&json!({"events": events})).timeout(Duration::from_secs(5)).send().await;
        let answered = match sent {
            Ok(response) if response.status().is_success() => response.json::<Value>().await.ok(),
            _ => None,
        };
        let offsets = answered.as_ref().and_then(|a| a["offsets"].as_array()).filter(|o| o.len() == ids.len());
        {
            let mut history = history.lock().unwrap();
            match offsets {
                Some(offsets) => {
                    for (id, at) in ids.iter().zip(offsets) {
                        let (partition, offset) = partition_of(at);
                        history.published(key(partition), offset, *id);
                    }
                }
                None => {
                    counters.publish_errors.fetch_add(1, Ordering::Relaxed);
                    ids.iter().for_each(|id| history.attempted(*id));
                }
            }
        }
        let pause = if offsets.is_some() { Duration::from_micros(n * 1_000_000 / rate.max(1)) } else { Duration::from_millis(200) };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}

/// The log of the run's own: a tansu broker (Kafka) on a fixed port with its data in a temp dir,
/// or rocketmq-rust's name server and broker through `scripts/rocketmq-test-broker`.
enum Broker {
    /// `port` is the proxy's (what clients use, and tansu advertises), `target` tansu's own port,
    /// a new one at every start.
    Tansu {
        binary: PathBuf,
        dir: tempfile::TempDir,
        port: u16,
        target: Arc<Mutex<u16>>,
        child: Option<std::process::Child>,
    },
    RocketMq {
        script: PathBuf,
        dir: tempfile::TempDir,
        port: u16,
        killed: bool,
    },
}

impl Broker {
    /// tansu behind a proxy of this process on a fixed port: a SIGKILLed tansu leaves its port in
    /// TIME_WAIT for a minute (it cannot listen there again sooner), so each start takes a new
    /// port and the proxy sends new connections there.
    async fn tansu(binary: &Path) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(Mutex::new(0u16));
        tokio::spawn(proxy(listener, target.clone()));
        let mut broker = Self::Tansu { binary: binary.to_path_buf(), dir: tempfile::tempdir()?, port, target, child: None };
        tokio::task::block_in_place(|| broker.run())?;
        Ok(broker)
    }

    fn rocketmq(script: &Path) -> anyhow::Result<Self> {
        let broker = Self::RocketMq { script: script.to_path_buf(), dir: tempfile::tempdir()?, port: free_port()?, killed: false };
        broker.rocketmq_script("start")?;
        Ok(broker)
    }

    /// The gateway's settings for this log.
    fn gateway_env(&self) -> Vec<(String, String)> {
        match self {
            Self::Tansu { port, .. } => {
                vec![("ACKGATE_STORAGE__BACKEND".into(), "kafka".into()), ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS".into(), format!("127.0.0.1:{port}"))]
            }
            Self::RocketMq { port, .. } => vec![
                ("ACKGATE_STORAGE__BACKEND".into(), "rocketmq".into()),
                ("ACKGATE_ROCKETMQ__NAMESRV_ADDR".into(), format!("127.0.0.1:{port}")),
                ("ACKGATE_ROCKETMQ__MODE".into(), "pop".into()),
            ],
        }
    }

    fn rocketmq_script(&self, verb: &str) -> anyhow::Result<()> {
        let Self::RocketMq { script, dir, port, .. } = self else { bail!("not RocketMQ") };
        let mut command = std::process::Command::new("bash");
        command.arg(script).arg(verb).arg(port.to_string());
        if verb == "restart-broker" {
            command.arg("1");
        }
        let status = command.env("ACKGATE_DEV_ROCKETMQ_DATA", dir.path()).stdout(std::process::Stdio::null()).status()?;
        if !status.success() && verb != "stop" {
            bail!("rocketmq-test-broker {verb} failed (data in {})", dir.path().display());
        }
        Ok(())
    }

    fn tansu_url(port: u16) -> String {
        format!("tcp://127.0.0.1:{port}")
    }

    /// Starts the broker again after `kill` (same data).
    fn run(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Tansu { binary, dir, port, target, child } => {
                let own = free_port()?;
                *target.lock().unwrap() = own;
                let url = Self::tansu_url(own);
                let started_child = std::process::Command::new(&*binary)
                    .args(["broker", "--listener-url", &url, "--advertised-listener-url", &Self::tansu_url(*port)])
                    .args(["--storage-engine", "sqlite://tansu.db"])
                    .current_dir(dir.path())
                    .env("RUST_LOG", "warn")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::fs::OpenOptions::new().create(true).append(true).open(dir.path().join("tansu.log"))?)
                    .spawn()
                    .with_context(|| format!("starting {}", binary.display()))?;
                *child = Some(started_child);
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(30) {
                    let listed = std::process::Command::new(&*binary)
                        .args(["topic", "list", "--broker", &url])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status();
                    if listed.is_ok_and(|s| s.success()) {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                bail!("tansu did not answer within 30 s (its log: {})", dir.path().join("tansu.log").display())
            }
            Self::RocketMq { killed, .. } => {
                if std::mem::take(killed) {
                    self.rocketmq_script("restart-broker")?;
                }
                Ok(())
            }
        }
    }

    /// True while the broker is down after `kill`.
    fn is_down(&self) -> bool {
        match self {
            Self::Tansu { child, .. } => child.is_none(),
            Self::RocketMq { killed, .. } => *killed,
        }
    }

    fn kill(&mut self) {
        match self {
            Self::Tansu { child, .. } => {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            Self::RocketMq { .. } => {
                self.signal(libc::SIGKILL);
                if let Self::RocketMq { killed, .. } = self {
                    *killed = true;
                }
            }
        }
    }

    /// A signal to the broker (RocketMQ: its master, not the name server).
    fn signal(&self, signal: libc::c_int) {
        let pid = match self {
            Self::Tansu { child, .. } => child.as_ref().map(|c| c.id() as libc::pid_t),
            Self::RocketMq { dir, .. } => std::fs::read_to_string(dir.path().join("broker-1.pid")).ok().and_then(|p| p.trim().parse().ok()),
        };
        if let Some(pid) = pid {
            // SAFETY: a signal to a process this run started.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        match self {
            Self::Tansu { .. } => self.kill(),
            Self::RocketMq { .. } => {
                let _ = self.rocketmq_script("stop");
            }
        }
    }
}

/// Forwards each connection to `127.0.0.1:target` as it is when the connection comes.
async fn proxy(listener: tokio::net::TcpListener, target: Arc<Mutex<u16>>) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        let port = *target.lock().unwrap();
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The processes under test and the file system under them: what the nemesis acts on.
struct Cluster {
    launches: Vec<Launch>,
    data: Vec<PathBuf>,
    gateways: Vec<Option<Gateway>>,
    mount: PowerLossMount,
    broker: Option<Broker>,
    /// Per instance, libfaketime's offset file and the offset it holds, in seconds.
    clocks: Vec<(PathBuf, i64)>,
    /// Gateway log lines of stopped instances, kept for `--gateway-log`.
    logs: Vec<String>,
}

impl Cluster {
    fn start(&mut self, i: usize) -> anyhow::Result<()> {
        let gateway = Gateway::start_in(&self.launches[i], &self.data[i]).with_context(|| format!("starting instance {i}"))?;
        self.gateways[i] = Some(gateway);
        Ok(())
    }

    fn keep_logs(&mut self, gateway: &Gateway) {
        self.logs.extend(gateway.logs.lock().unwrap().iter().cloned());
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut gateway) = self.gateways[i].take() {
            gateway.kill9();
            self.keep_logs(&gateway);
        }
    }

    fn signal(&self, i: usize, signal: libc::c_int) {
        if let Some(pid) = self.gateways[i].as_ref().and_then(Gateway::pid) {
            // SAFETY: a signal to a child process of ours.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        }
    }

    /// Ready (`/readyz`) and taking writes: a probe event on a topic of its own is answered 200.
    fn writable(&self, i: usize) -> bool {
        let Some(gateway) = &self.gateways[i] else { return false };
        let curl =
            |args: &[&str]| std::process::Command::new("curl").args(["-sf", "-m", "2", "-o", "/dev/null"]).args(args).status().is_ok_and(|s| s.success());
        curl(&[&format!("{}/readyz", gateway.base)])
            && curl(&["-H", "content-type: application/json", "-d", r#"{"payload":{"probe":true}}"#, &format!("{}/topics/{TOPIC}-probe/events", gateway.base)])
    }

    /// Waits until instance `i` takes writes, doing what a supervisor (systemd's
    /// `Restart=on-failure`) does meanwhile: an instance that exited is started again.
    fn wait_writable(&mut self, i: usize, within: Duration, log: &mut FaultLog) -> bool {
        let started = Instant::now();
        while started.elapsed() < within {
            self.supervise(log);
            if self.writable(i) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// A supervisor's round: every instance that exited by itself is started again (a start that
    /// fails is tried again at the next round).
    fn supervise(&mut self, log: &mut FaultLog) {
        for i in 0..self.gateways.len() {
            let exited = self.gateways[i].as_mut().is_some_and(Gateway::has_exited);
            if exited {
                if let Some(gateway) = self.gateways[i].take() {
                    self.keep_logs(&gateway);
                }
                log.exited += 1;
            }
            if self.gateways[i].is_none() && self.start(i).is_ok() && exited {
                eprintln!("chaos: instance {i} exited by itself; started again");
            }
        }
    }
}

/// What the nemesis did, per fault kind, and what it saw.
#[derive(Default, serde::Serialize)]
struct FaultLog {
    injected: BTreeMap<String, u64>,
    /// Instances that exited by themselves (and were started again, as a supervisor would).
    exited: u64,
    /// Instances that did not take writes again within 60 s of a fault's end: each is an
    /// anomaly (the run fails).
    not_writable_after_fault: u64,
}

/// Injects faults until `stop`, then heals everything (every instance running and ready, room on
/// the disk, the broker up).
fn nemesis(cluster: &mut Cluster, faults: &[Fault], mean_every: Duration, stop: &AtomicBool, mut rng: Rng) -> anyhow::Result<FaultLog> {
    let mut log = FaultLog::default();
    let instances = cluster.gateways.len();
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let wait = rng.millis(mean_every.as_millis() as u64 / 2, mean_every.as_millis() as u64 * 3 / 2);
        let until = Instant::now() + wait;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            cluster.supervise(&mut log);
            std::thread::sleep(Duration::from_millis(50));
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let fault = faults[rng.below(faults.len() as u64) as usize];
        let i = rng.below(instances as u64) as usize;
        *log.injected.entry(fault.name()).or_default() += 1;
        eprintln!("chaos: {:>4.0} s: {} (instance {i})", started.elapsed().as_secs_f64(), fault.name());
        match fault {
            Fault::Kill => {
                cluster.kill(i);
                std::thread::sleep(rng.millis(100, 1500));
                cluster.start(i)?;
            }
            Fault::Pause => {
                cluster.signal(i, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(PONG_TIMEOUT_MS) + rng.millis(1000, 4000));
                cluster.signal(i, libc::SIGCONT);
            }
            Fault::Restart => {
                if let Some(mut gateway) = cluster.gateways[i].take() {
                    gateway.stop();
                    cluster.keep_logs(&gateway);
                }
                cluster.start(i)?;
            }
            Fault::Power => {
                for i in 0..instances {
                    cluster.kill(i);
                }
                cluster.mount.cut_power();
                std::thread::sleep(rng.millis(100, 1000));
                cluster.mount.power_on()?;
                for i in 0..instances {
                    cluster.start(i)?;
                }
            }
            Fault::DiskFull => {
                cluster.mount.set_full(true)?;
                let until = Instant::now() + rng.millis(1000, 4000);
                while Instant::now() < until {
                    // An instance that stops on the full disk is started again (and fails to
                    // start while the disk is full), as its supervisor would.
                    cluster.supervise(&mut log);
                    std::thread::sleep(Duration::from_millis(200));
                }
                cluster.mount.set_full(false)?;
                for i in 0..instances {
                    if !cluster.wait_writable(i, Duration::from_secs(60), &mut log) {
                        log.not_writable_after_fault += 1;
                        eprintln!("chaos: instance {i} takes no writes 60 s after the disk got room");
                    }
                }
            }
            Fault::Clock => {
                // An NTP step: the wall clock jumps 30 s back to 45 s ahead of where it is.
                let (file, offset) = &mut cluster.clocks[i];
                *offset += rng.below(76) as i64 - 30;
                std::fs::write(&*file, format!("{offset:+}s"))?;
            }
            Fault::BrokerKill => {
                if let Some(broker) = cluster.broker.as_mut() {
                    broker.kill();
                    std::thread::sleep(rng.millis(500, 3000));
                    broker.run()?;
                }
            }
            Fault::BrokerPause => {
                if let Some(broker) = cluster.broker.as_ref() {
                    broker.signal(libc::SIGSTOP);
                    std::thread::sleep(rng.millis(1000, 5000));
                    broker.signal(libc::SIGCONT);
                }
            }
        }
    }
    Ok(log)
}

/// Every fault the backend has: the embedded log has no broker, and libfaketime must be there
/// for `clock`. tansu 0.6, the Kafka stand-in, is not killed by default: after a SIGKILL under
/// load its SQLite storage panics at every metadata request ("more or less than one row",
/// tansu-storage's lite.rs) and it never serves again, which is tansu's fault, not ackgate's.
fn default_faults(broker: Option<&Broker>) -> Vec<Fault> {
    let mut faults = vec![Fault::Kill, Fault::Pause, Fault::Restart, Fault::Power, Fault::DiskFull];
    if Path::new(LIBFAKETIME).exists() {
        faults.push(Fault::Clock);
    }
    match broker {
        Some(Broker::Tansu { .. }) => faults.push(Fault::BrokerPause),
        Some(Broker::RocketMq { .. }) => faults.extend([Fault::BrokerKill, Fault::BrokerPause]),
        None => {}
    }
    faults
}

pub fn main(args: Vec<String>) -> std::process::ExitCode {
    use clap::Parser;
    let cli = ChaosCli::parse_from(args);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(cli.clone())) {
        Ok((report, faults)) => {
            print(&cli, &report, &faults);
            let anomalies = report.anomalies() + faults.not_writable_after_fault;
            if anomalies > 0 {
                eprintln!("chaos: FAILED: {anomalies} anomalies");
                std::process::ExitCode::FAILURE
            } else {
                std::process::ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("chaos: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn print(cli: &ChaosCli, report: &Report, faults: &FaultLog) {
    if cli.json {
        println!("{}", json!({"seed": cli.seed, "minutes": cli.minutes, "faults": faults, "report": report}));
        return;
    }
    let backend = match (&cli.tansu, &cli.rocketmq_script) {
        (Some(_), _) => format!("kafka (tansu), {} instances", cli.instances),
        (None, Some(_)) => format!("rocketmq (rocketmq-rust, POP), {} instances", cli.instances),
        (None, None) => "embedded".to_string(),
    };
    println!("chaos: {backend}, seed {}, {} minutes of faults", cli.seed, cli.minutes);
    println!("| fault | injected |\n| --- | --- |");
    for (fault, n) in &faults.injected {
        println!("| {fault} | {n} |");
    }
    println!("| (instances that exited by themselves, started again) | {} |", faults.exited);
    println!("| (instances not taking writes 60 s after a fault: anomalies) | {} |", faults.not_writable_after_fault);
    println!("\n| class | count |\n| --- | --- |");
    for (class, n) in report.rows() {
        println!("| {class} | {n} |");
    }
    for example in &report.examples {
        println!("  {example}");
    }
}

async fn run(cli: ChaosCli) -> anyhow::Result<(Report, FaultLog)> {
    let brokered = cli.tansu.is_some() || cli.rocketmq_script.is_some();
    let instances = if brokered { cli.instances.max(1) } else { 1 };
    if !brokered && cli.faults.iter().any(|f| matches!(f, Fault::BrokerKill | Fault::BrokerPause)) {
        bail!("broker faults need a broker: --tansu PATH or --rocketmq-script PATH");
    }
    let mut rng = Rng(cli.seed);
    let temp = tempfile::tempdir()?;
    let script = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/powerloss/powerloss_fs.py"));
    let mount = PowerLossMount::mount(script, &temp.path().join("backing"), &temp.path().join("mnt"), Some(&temp.path().join("disk-full")))?;
    let broker = match (&cli.tansu, &cli.rocketmq_script) {
        (Some(binary), _) => Some(Broker::tansu(binary).await?),
        (None, Some(script)) => Some(tokio::task::block_in_place(|| Broker::rocketmq(script))?),
        (None, None) => None,
    };
    let faults = if cli.faults.is_empty() { default_faults(broker.as_ref()) } else { cli.faults.clone() };
    let ports = (0..instances).map(|_| free_port()).collect::<anyhow::Result<Vec<_>>>()?;
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut launches = Vec::new();
    let mut clocks = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut env: Vec<(String, String)> = [
            ("ACKGATE_SERVER__LISTEN", format!("127.0.0.1:{port}")),
            ("ACKGATE_SERVER__INSTANCE_ID", format!("gw-{i}")),
            ("ACKGATE_SERVER__WS_PING_INTERVAL_MS", PING_INTERVAL_MS.to_string()),
            ("ACKGATE_SERVER__WS_PONG_TIMEOUT_MS", PONG_TIMEOUT_MS.to_string()),
            ("ACKGATE_SERVER__SSE_KEEPALIVE_MS", "1000".to_string()),
            ("ACKGATE_SERVER__DRAIN_MS", "1000".to_string()),
            ("ACKGATE_DELIVERY__ACK_TIMEOUT_MS", "10000".to_string()),
            // Starts and alignments at info: what a start that hangs was doing.
            ("RUST_LOG", "warn,ackgate=info,ackgate::http::request_log=warn".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(broker) = &broker {
            env.extend(broker.gateway_env());
            env.push(("ACKGATE_CLUSTER__PEERS".into(), serde_json::to_string(&urls)?));
            env.push(("ACKGATE_CLUSTER__PROBE_INTERVAL_MS".into(), "500".into()));
        }
        let clock = temp.path().join(format!("clock-{i}"));
        std::fs::write(&clock, "+0s")?;
        if faults.contains(&Fault::Clock) {
            env.push(("LD_PRELOAD".into(), LIBFAKETIME.into()));
            env.push(("FAKETIME_TIMESTAMP_FILE".into(), clock.display().to_string()));
            // Read the offset file at most once a second, not at every clock read.
            env.push(("FAKETIME_CACHE_DURATION".into(), "1".into()));
            // The wall clock only, as an NTP step moves it: the monotonic clock never jumps (and
            // faking it made librdkafka's timed waits last as long as the offset, so a Kafka
            // gateway started after a jump hung in its start).
            env.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
        }
        clocks.push((clock, 0));
        launches.push(Launch { binary: cli.gateway_bin.clone().unwrap_or_else(Launch::default_binary), brokers: None, env, log_file: None });
    }
    let data: Vec<PathBuf> = (0..instances).map(|i| mount.mountpoint().join(format!("gw-{i}")).join("data")).collect();
    for dir in &data {
        std::fs::create_dir_all(dir.parent().expect("a parent"))?;
    }
    let mut cluster = Cluster { launches, data, gateways: (0..instances).map(|_| None).collect(), mount, broker, clocks, logs: Vec::new() };
    tokio::task::block_in_place(|| (0..instances).try_for_each(|i| cluster.start(i)))?;
    let http = reqwest::Client::new();
    // The workload's topic, and the one `Cluster::writable` probes (a broker may not create
    // topics on a publish).
    for (topic, partitions) in [(TOPIC.to_string(), cli.partitions), (format!("{TOPIC}-probe"), 1)] {
        let created = http.post(format!("{}/topics", urls[0])).json(&json!({"name": topic, "partitions": partitions})).send().await?;
        if !created.status().is_success() {
            bail!("creating {topic}: {}", created.text().await?);
        }
    }

    let urls = Arc::new(urls);
    let history: Arc<Mutex<History>> = Default::default();
    let counters: Arc<Counters> = Default::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (stop_publishing_tx, stop_publishing_rx) = watch::channel(false);
    let mut clients = Vec::new();
    let styles = [AckStyle::Each, AckStyle::Confirmed, AckStyle::Batch];
    for c in 0..cli.ws_clients + cli.sse_clients {
        let transport = if c < cli.ws_clients { Transport::WebSocket(styles[c % styles.len()]) } else { Transport::Sse };
        let progress: Arc<Mutex<Progress>> = Default::default();
        let plan = ClientPlan {
            id: format!("chaos-{c}"),
            transport,
            wanders: c % 2 == 1,
            urls: urls.clone(),
            history: history.clone(),
            progress,
            counters: counters.clone(),
            stop: stop_rx.clone(),
            rng: rng.fork(),
            cluster: instances > 1,
        };
        clients.push((plan.id.clone(), tokio::spawn(plan.run())));
    }
    let publishers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(publish(urls.clone(), cli.rate.div_ceil(2), history.clone(), counters.clone(), stop_publishing_rx.clone(), rng.fork())))
        .collect();

    let stop_faults = Arc::new(AtomicBool::new(false));
    let nemesis_thread = {
        let (stop_faults, faults) = (stop_faults.clone(), faults.clone());
        let (every, rng) = (Duration::from_secs_f64(cli.fault_every_secs), rng.fork());
        std::thread::spawn(move || {
            let outcome = nemesis(&mut cluster, &faults, every, &stop_faults, rng);
            // Heal: every instance running, the broker up, room on the disk.
            let _ = cluster.mount.set_full(false);
            if let Some(broker) = cluster.broker.as_mut() {
                broker.signal(libc::SIGCONT);
                if broker.is_down() {
                    let _ = broker.run();
                }
            }
            for i in 0..cluster.gateways.len() {
                cluster.signal(i, libc::SIGCONT);
            }
            let outcome = outcome.map(|mut log| {
                for i in 0..cluster.gateways.len() {
                    if !cluster.wait_writable(i, Duration::from_secs(60), &mut log) {
                        log.not_writable_after_fault += 1;
                        eprintln!("chaos: instance {i} takes no writes 60 s after the faults stopped");
                    }
                }
                log
            });
            (outcome, cluster)
        })
    };

    let started = Instant::now();
    let duration = Duration::from_secs_f64(cli.minutes * 60.0);
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(10).min(duration.saturating_sub(started.elapsed()))).await;
        let (published, deliveries) = history.lock().unwrap().counts();
        eprintln!(
            "chaos: {:>4.0} s: {published} published, {deliveries} delivered, {} reconnects, {} publish errors",
            started.elapsed().as_secs_f64(),
            counters.reconnects.load(Ordering::Relaxed),
            counters.publish_errors.load(Ordering::Relaxed)
        );
    }
    stop_faults.store(true, Ordering::Relaxed);
    let (outcome, mut cluster) = tokio::task::spawn_blocking(move || nemesis_thread.join().expect("the nemesis thread")).await?;
    let _ = stop_publishing_tx.send(true);
    for publisher in publishers {
        publisher.await?;
    }
    let fault_log = outcome?;
    eprintln!("chaos: faults stopped and healed ({:?}); waiting up to {} s for the clients to catch up", fault_log.injected, cli.settle_secs);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(cli.settle_secs) {
        let caught_up = {
            let history = history.lock().unwrap();
            let ids: Vec<String> = clients.iter().map(|(id, _)| id.clone()).collect();
            ids.iter().all(|id| history.caught_up(id))
        };
        if caught_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = stop_tx.send(true);
    for (id, client) in clients {
        if let Err(e) = client.await? {
            eprintln!("chaos: client {id} ended with {e:#}");
        }
    }
    // The committed offsets stored at the end, the largest any instance holds.
    for url in urls.iter() {
        let Ok(answer) = http.get(format!("{url}/admin/offsets?topic={TOPIC}")).send().await else { continue };
        let Ok(body) = answer.json::<Value>().await else { continue };
        let mut history = history.lock().unwrap();
        for row in body["offsets"].as_array().into_iter().flatten() {
            if let (Some(client), Some(partition), Some(committed)) = (row["client_id"].as_str(), row["partition"].as_u64(), row["committed"].as_u64()) {
                history.stored_max(client, key(partition as u32), committed);
            }
        }
    }
    let mut report = history.lock().unwrap().check();
    let bound = counters.duplicate_bound.load(Ordering::Relaxed);
    if report.duplicates > bound {
        report.examples.push(format!(
            "duplicates {} above the bound {bound} (what was in flight when each session ended and at each clock jump, plus nacks)",
            report.duplicates
        ));
    }
    eprintln!(
        "chaos: {} reconnects ({} voluntary), {} nacks, {} error frames, {} publish errors, duplicate bound {bound}",
        counters.reconnects.load(Ordering::Relaxed),
        counters.voluntary_reconnects.load(Ordering::Relaxed),
        counters.nacks.load(Ordering::Relaxed),
        counters.error_frames.load(Ordering::Relaxed),
        counters.publish_errors.load(Ordering::Relaxed)
    );
    for i in 0..cluster.gateways.len() {
        if let Some(mut gateway) = cluster.gateways[i].take() {
            gateway.stop();
            cluster.keep_logs(&gateway);
        }
    }
    if let Some(path) = &cli.gateway_log {
        std::fs::write(path, cluster.logs.join("\n") + "\n")?;
    }
    Ok((report, fault_log))
}
