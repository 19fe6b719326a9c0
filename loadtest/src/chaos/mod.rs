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
//! steps 30 s back to 45 s ahead, through Debian's libfaketime, or on Kafka the gateway's own
//! wall clock through `ACKGATE_DEV_CLOCK_STEP_FILE`), `broker-kill` and `broker-pause` (Kafka,
//! RocketMQ), `broker-cut`, `broker-black-hole` and `broker-slow` (Kafka: the connections between
//! the gateways and tansu reset at once, carrying nothing for 2-8 s, or 50-500 ms late for 3-10 s,
//! in the run's proxy).

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

mod clients;
mod nemesis;

use clients::{key, publish, replay_by_time, AckStyle, ClientPlan, Counters, Progress, Transport};
use nemesis::{nemesis, Broker, Cluster, FaultLog};

const TOPIC: &str = "chaos";
/// The gateway's keepalive in a chaos run: a dead peer is found within seconds, not a minute.
const PING_INTERVAL_MS: u64 = 1000;
const PONG_TIMEOUT_MS: u64 = 3000;
/// What a client waits for any frame (a keepalive included) before it calls the connection dead.
const CLIENT_SILENCE: Duration = Duration::from_secs(6);
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Every session holds a JWT (`auth.jwt_secret`): it expires, is refreshed in band (WebSocket) or
/// replaced by a reconnect (SSE), also while a clock jump moves the gateway's idea of `exp`.
const JWT_SECRET: &str = "the-chaos-suite-jwt-secret-of-32-bytes-at-least";
/// How far a gateway's clock may be from the true one (the clock fault's bound).
const MAX_CLOCK_SKEW_SECS: i64 = 30;
/// A token's life: above the largest skew plus the refresh notice, so a token made here (by the
/// true clock) is never born expired, nor inside its refresh notice, on a gateway whose clock runs
/// ahead; a jump ahead can still take a live session's token past its `exp` (4004).
const TOKEN_LIFETIME_SECS: u64 = 50;
/// `auth.refresh_before_secs`: a session lasting half a minute refreshes its token.
const REFRESH_BEFORE_SECS: u64 = 10;

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
    BrokerCut,
    BrokerBlackHole,
    BrokerSlow,
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

/// The order faults come in: shuffled rounds, every kind once per round. A uniform draw left one
/// kind at 9 of a 20-minute run's 186 faults (the issue asks for 10 of each); in rounds no kind is
/// more than one behind another.
struct FaultDeck {
    kinds: Vec<Fault>,
    left: Vec<Fault>,
}

impl FaultDeck {
    fn new(kinds: &[Fault]) -> Self {
        Self { kinds: kinds.to_vec(), left: Vec::new() }
    }

    fn draw(&mut self, rng: &mut Rng) -> Fault {
        if self.left.is_empty() {
            self.left = self.kinds.clone();
            // Fisher-Yates: each order of the round equally likely.
            for i in (1..self.left.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                self.left.swap(i, j);
            }
        }
        self.left.pop().expect("a fault deck holds at least one kind")
    }
}

/// Every fault the backend has: the embedded log has no broker, and libfaketime must be there
/// for `clock` (except on Kafka). tansu 0.6, the Kafka stand-in, is not killed by default: after a
/// SIGKILL under load its SQLite storage panics at every metadata request ("more or less than one
/// row", tansu-storage's lite.rs) and it never serves again, which is tansu's fault, not
/// ackgate's; its network is what fails on Kafka instead (`broker-cut`, `broker-black-hole`,
/// `broker-slow`). The clock steps on Kafka move the gateway's own wall clock (every read of it:
/// tokens, offset times, record stamps; `ACKGATE_DEV_CLOCK_STEP_FILE`), not the process's:
/// libfaketime moves the wall clock of one process only, and librdkafka's timed waits hand the
/// kernel absolute deadlines in that clock (`FUTEX_CLOCK_REALTIME`), which the kernel compares
/// with the real one. A clock set back turned every wait into an immediate timeout: each
/// librdkafka thread spun (seen on 2026-12-05: 19 threads, both cores in system time, `futex ...
/// = -1 ETIMEDOUT` in a loop). A real NTP step moves the kernel's clock for every process, so
/// that never happens.
fn default_faults(broker: Option<&Broker>) -> Vec<Fault> {
    let mut faults = vec![Fault::Kill, Fault::Pause, Fault::Restart, Fault::Power, Fault::DiskFull];
    if Path::new(LIBFAKETIME).exists() || matches!(broker, Some(Broker::Tansu { .. })) {
        faults.push(Fault::Clock);
    }
    match broker {
        Some(Broker::Tansu { .. }) => faults.extend([Fault::BrokerPause, Fault::BrokerCut, Fault::BrokerBlackHole, Fault::BrokerSlow]),
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
    println!("| (starts after a fault that failed, left to the supervisor) | {} |", faults.failed_starts);
    println!("| (instances not taking writes 60 s after a fault: anomalies) | {} |", faults.not_writable_after_fault);
    println!("| (fsyncs on the power-loss disk: the offset stores', everything) | {}, {} |", faults.offset_store_fsyncs, faults.fsyncs);
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
    if cli.tansu.is_none() && cli.faults.iter().any(|f| matches!(f, Fault::BrokerCut | Fault::BrokerBlackHole | Fault::BrokerSlow)) {
        bail!("network faults need the Kafka run's proxy: --tansu PATH");
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
            ("ACKGATE_AUTH__JWT_SECRET", JWT_SECRET.to_string()),
            ("ACKGATE_AUTH__REFRESH_BEFORE_SECS", REFRESH_BEFORE_SECS.to_string()),
            // Starts and alignments at info: what a start that hangs was doing.
            ("RUST_LOG", "warn,ackgate=info,ackgate::http::request_log=warn".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(broker) = &broker {
            env.extend(broker.gateway_env());
            env.push(("ACKGATE_CLUSTER__PEERS".into(), serde_json::to_string(&urls)?));
            env.push(("ACKGATE_CLUSTER__TOKEN_KEY".into(), crate::CLUSTER_TOKEN_KEY.into()));
            env.push(("ACKGATE_CLUSTER__PROBE_INTERVAL_MS".into(), "500".into()));
        }
        let clock = temp.path().join(format!("clock-{i}"));
        std::fs::write(&clock, "+0s")?;
        if faults.contains(&Fault::Clock) && matches!(broker, Some(Broker::Tansu { .. })) {
            // The gateway's own wall clock (default_faults says why not libfaketime's here).
            env.push(("ACKGATE_DEV_CLOCK_STEP_FILE".into(), clock.display().to_string()));
        } else if faults.contains(&Fault::Clock) {
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
    // Each instance's directory (its config file's home) as an installer leaves it: synced into
    // the mount's root, so a power loss does not take it.
    std::fs::File::open(mount.mountpoint())?.sync_all()?;
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
            resume_token: None,
        };
        clients.push((plan.id.clone(), tokio::spawn(plan.run())));
    }
    let mut publishers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(publish(urls.clone(), cli.rate.div_ceil(2), history.clone(), counters.clone(), stop_publishing_rx.clone(), rng.fork())))
        .collect();
    publishers.push(tokio::spawn(replay_by_time(urls.clone(), history.clone(), counters.clone(), stop_publishing_rx.clone(), rng.fork())));

    let stop_faults = Arc::new(AtomicBool::new(false));
    let nemesis_thread = {
        let (stop_faults, faults) = (stop_faults.clone(), faults.clone());
        let (every, rng) = (Duration::from_secs_f64(cli.fault_every_secs), rng.fork());
        std::thread::spawn(move || {
            let outcome = nemesis(&mut cluster, &faults, every, &stop_faults, rng);
            // Heal: every instance running, the broker up, room on the disk.
            let _ = cluster.mount.set_full(false);
            if let Some(link) = cluster.broker.as_ref().and_then(Broker::link) {
                link.black_hole(false);
                link.slow(Duration::ZERO);
            }
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
    let mut fault_log = outcome?;
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
    report.apply_duplicate_bound(bound);
    // Every token the workload presents is fresh and within the clocks' bound: a refusal is a bug.
    report.tokens_refused = counters.auth_refusals.load(Ordering::Relaxed);
    report.closed_with_valid_token = counters.closed_with_valid_token.load(Ordering::Relaxed);
    eprintln!(
        "chaos: {} reconnects ({} voluntary, {} at a token's expiry), {} replays by time cut off, {} tokens refreshed in band, {} nacks, {} error frames, {} publish errors, duplicate bound {bound}",
        counters.reconnects.load(Ordering::Relaxed),
        counters.voluntary_reconnects.load(Ordering::Relaxed),
        counters.expired.load(Ordering::Relaxed),
        counters.time_replays_failed.load(Ordering::Relaxed),
        counters.refreshed.load(Ordering::Relaxed),
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
    (fault_log.offset_store_fsyncs, fault_log.fsyncs) = (cluster.mount.fsyncs("/data/offsets/"), cluster.mount.fsyncs("/"));
    Ok((report, fault_log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_kind_comes_once_in_each_round_in_a_shuffled_order() {
        let kinds = [Fault::Kill, Fault::Pause, Fault::Clock, Fault::BrokerKill, Fault::BrokerPause];
        let mut deck = FaultDeck::new(&kinds);
        let mut rng = Rng(7);
        let rounds: Vec<Vec<Fault>> = (0..40).map(|_| (0..kinds.len()).map(|_| deck.draw(&mut rng)).collect()).collect();
        for round in &rounds {
            let mut sorted = round.clone();
            sorted.sort();
            assert_eq!(sorted, kinds.to_vec(), "each kind exactly once per round: {round:?}");
        }
        let orders: BTreeSet<&Vec<Fault>> = rounds.iter().collect();
        assert!(orders.len() > 10, "rounds come in different orders, got {} distinct of 40", orders.len());
        let firsts: BTreeSet<Fault> = rounds.iter().map(|r| r[0]).collect();
        assert_eq!(firsts.len(), kinds.len(), "any kind may open a round");
    }
}
