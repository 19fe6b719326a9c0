//! `loadtest`: drives ackgate over real WebSockets on loopback, then checks that nothing was lost
//! (every client received every offset, and its committed offsets equal the log end).
//!
//! Shapes: throughput (`--clients K --split|--fanout --events N`, acks each / batched /
//! confirmed), paced latency (`--rate R`), idle-session memory (`--idle-sessions S`), restart
//! time with stored offsets (`--restart-offsets M`), takeover across instances on Kafka
//! (`--instances N --kill-instance-after SECS`), ping round trips during a retention sweep
//! (`--sweep-offsets M`) and head latency after a restart with an absent client behind
//! (`--broadcast N --behind M`), and the highest broadcast rate within a latency bound
//! (`--broadcast N --find-rate --p99-ms MS`). With `--rocketmq ... --lite`, the split and idle
//! shapes use RocketMQ lite topics of one parent (`ltlite@...`): one lite topic per client or
//! session. `--json` prints the summary as one object.
//! A run that loses anything exits with status 1.

mod chaos;
mod client;
mod find_rate;
mod gateway;
mod history;
mod multiplexed;
mod nats;
mod powerloss;
mod report;
mod shapes;
mod takeover;

use std::path::PathBuf;

/// `cluster.token_key` of the clusters loadtest starts (`--instances`, chaos).
pub const CLUSTER_TOKEN_KEY: &str = "ackgate-loadtest-cluster-token-key-0123456789";

use clap::Parser;

use client::{AckMode, Transport};
use gateway::{Gateway, Launch};

#[derive(Parser, Clone)]
#[command(about = "Load test for ackgate: throughput, latency, memory, restart time; verifies nothing is lost")]
pub struct Cli {
    /// Target a running gateway instead of starting one (RSS/CPU are then not reported).
    #[arg(long)]
    pub url: Option<String>,
    /// The gateway binary to start (default: `ackgate` next to this executable).
    #[arg(long)]
    pub gateway_bin: Option<PathBuf>,
    /// Start the gateway on Kafka at these brokers instead of the embedded log.
    #[arg(long)]
    pub brokers: Option<String>,
    /// Start the gateway on RocketMQ with this name server (`host:port`) instead of the embedded log.
    #[arg(long, conflicts_with = "brokers")]
    pub rocketmq: Option<String>,
    /// RocketMQ mode with `--rocketmq`: `pop` (5.x, deferred broker ACK) or `pull` (4.x).
    #[arg(long, default_value = "pop")]
    pub rocketmq_mode: String,
    /// With `--rocketmq` (pop): each client (split) or idle session reads its own lite topic of
    /// the parent `ltlite` (`rocketmq.lite_parents`), instead of its own topic.
    #[arg(long, requires = "rocketmq", conflicts_with_all = ["fanout", "broadcast", "instances", "rate"])]
    pub lite: bool,
    /// Consumers (each its own client_id).
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Each client reads its own topic (events are split between them; the default).
    #[arg(long, conflicts_with = "fanout")]
    pub split: bool,
    /// Every client reads the same topic (each receives every event).
    #[arg(long)]
    pub fanout: bool,
    /// N members of one shared subscription (`group`) share one topic's `--events`, each event
    /// to one of them (instead of `--clients` split or fan-out); over WebSockets.
    #[arg(long, conflicts_with_all = ["fanout", "broadcast", "instances", "lite", "rate", "behind"])]
    pub group: Option<usize>,
    /// Events published in total (split) or to the one topic (fan-out).
    #[arg(long, default_value_t = 200_000)]
    pub events: u64,
    /// Partitions per topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Size of each event's JSON payload.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// How the consumers of the throughput, rate and broadcast shapes connect: a WebSocket, or
    /// Server-Sent Events with their frames POSTed (one POST per batch of frames read).
    #[arg(long, value_enum, default_value_t = Transport::Websocket)]
    pub transport: Transport,
    /// What drives the consumers of the fan-out and broadcast shapes: a task per client (the
    /// browser-like default) or `multiplexed`, one task per worker thread for all their sockets
    /// (WebSocket, `--ack each`).
    #[arg(long, value_enum, default_value_t = client::ClientEngine::Task)]
    pub client_engine: client::ClientEngine,
    /// How clients acknowledge.
    #[arg(long, value_enum, default_value_t = AckMode::Each)]
    pub ack: AckMode,
    /// Ids per ack frame with `--ack batch`.
    #[arg(long, default_value_t = 100)]
    pub ack_batch: usize,
    /// Publish at this many events/s while clients consume; reports publish-to-delivery latency.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Broadcast to many: this many clients on one topic (fan-out), events published at `--rate`
    /// (default 100/s) for `--duration-secs`, each acked; reports publish-to-delivery latency.
    #[arg(long, conflicts_with_all = ["split", "instances"])]
    pub broadcast: Option<usize>,
    /// Boot alignment's cost to the head: before a fan-out or broadcast run, publish this many
    /// events, leave one client that acknowledged only each partition's first event and restart
    /// the gateway (its shared reader then starts where that absent client stands); the timed
    /// clients subscribe `from: latest` and read at the head.
    #[arg(long)]
    pub behind: Option<u64>,
    /// With `--broadcast`: find the highest publish rate whose p99 publish-to-delivery stays
    /// within `--p99-ms` (a run of `--duration-secs` per rate tried, on a fresh gateway each:
    /// doubling from `--rate` until one misses, then halving the interval).
    #[arg(long, requires = "broadcast")]
    pub find_rate: bool,
    /// The p99 bound of `--find-rate`, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub p99_ms: u64,
    /// Length of a `--broadcast` run.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Open this many idle sessions (subscribed, no traffic) and report gateway memory.
    #[arg(long)]
    pub idle_sessions: Option<usize>,
    /// With `--idle-sessions`: hold the sessions open (each reading, so pings are answered) for
    /// this many seconds and report the gateway's CPU over the hold, per session-second.
    #[arg(long, default_value_t = 0, requires = "idle_sessions")]
    pub hold_secs: u64,
    /// With `--idle-sessions`: one event waits in each partition, and each session counts once
    /// it has its first event, not at `subscribed` (issue 41's reconnect storm).
    #[arg(long)]
    pub first_event: bool,
    /// Store this many offsets, restart the gateway, and report the time until /readyz.
    #[arg(long)]
    pub restart_offsets: Option<u64>,
    /// Store this many expired offsets, restart the gateway, and report ping round trips while
    /// its first retention sweep removes them.
    #[arg(long)]
    pub sweep_offsets: Option<u64>,
    /// Start this many gateways on one Kafka broker (`--brokers`), each with its own data dir and
    /// `cluster.peers` naming the others; `--clients` followers of one topic follow
    /// /session/recommend across them (the takeover shape, paced by `--rate`, default 2000/s).
    #[arg(long, requires = "brokers")]
    pub instances: Option<usize>,
    /// With `--instances`: SIGKILL the instance holding the most sessions after this many seconds.
    #[arg(long, requires = "instances")]
    pub kill_instance_after: Option<f64>,
    /// With `--instances`: SIGTERM (a drain: `reconnect` and 1012 over `server.drain_ms`) the
    /// instance holding the most sessions after this many seconds, instead of a SIGKILL.
    #[arg(long, requires = "kill_instance_after")]
    pub drain: bool,
    /// Bearer token for publishing and the admin routes (a gateway with auth.admin_token).
    #[arg(long)]
    pub admin_token: Option<String>,
    /// Extra environment for a gateway this loadtest starts, as KEY=VALUE (repeatable), e.g.
    /// `--gateway-env RUST_LOG=info,ackgate::core::reader=debug`.
    #[arg(long)]
    pub gateway_env: Vec<String>,
    /// Write the log lines of the gateway this loadtest started to this file when it ends.
    #[arg(long)]
    pub gateway_log: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// How long committed offsets may take to reach the log end after the last ack.
    #[arg(long, default_value_t = 30)]
    pub settle_secs: u64,
    /// Self-test of the completeness check: each client never acknowledges its first N events,
    /// so the run must end INCOMPLETE (exit 1).
    #[arg(long, default_value_t = 0)]
    pub skip_acks: u64,
}

impl Cli {
    fn launch(&self) -> Launch {
        let mut env = Vec::new();
        if let Some(namesrv) = &self.rocketmq {
            env.push(("ACKGATE_STORAGE__BACKEND".to_string(), "rocketmq".to_string()));
            env.push(("ACKGATE_ROCKETMQ__NAMESRV_ADDR".to_string(), namesrv.clone()));
            env.push(("ACKGATE_ROCKETMQ__MODE".to_string(), self.rocketmq_mode.clone()));
            if self.lite {
                env.push(("ACKGATE_ROCKETMQ__LITE_PARENTS".to_string(), format!("[{:?}]", shapes::LITE_PARENT)));
            }
        }
        for pair in &self.gateway_env {
            if let Some((key, value)) = pair.split_once('=') {
                env.push((key.to_string(), value.to_string()));
            }
        }
        Launch {
            binary: self.gateway_bin.clone().unwrap_or_else(Launch::default_binary),
            brokers: self.brokers.clone(),
            env,
            log_file: self.gateway_log.clone(),
        }
    }

    fn gateway(&self) -> anyhow::Result<Gateway> {
        match &self.url {
            Some(url) => Ok(Gateway::at_url(url)),
            None => Gateway::start(&self.launch()),
        }
    }
}

fn main() -> std::process::ExitCode {
    // `loadtest chaos ...`: the fault suite, with options of its own.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("chaos") {
        return chaos::main(args.into_iter().skip(1).collect());
    }
    // `loadtest nats ...`: the same throughput shapes against NATS JetStream (the peer column).
    if args.get(1).map(String::as_str) == Some("nats") {
        return nats::main(args.into_iter().skip(1).collect());
    }
    let mut cli = Cli::parse();
    if let Some(clients) = cli.broadcast {
        // A fan-out at a paced rate: every client receives every event.
        let rate = cli.rate.unwrap_or(100);
        cli = Cli { clients, fanout: true, rate: Some(rate), events: rate * cli.duration_secs, ..cli };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let outcome = runtime.block_on(async {
        if cli.find_rate {
            find_rate::run(&cli).await
        } else if let Some(instances) = cli.instances {
            takeover::run(&cli, instances.max(1)).await
        } else if let Some(sessions) = cli.idle_sessions {
            shapes::idle_sessions(&cli, sessions).await
        } else if let Some(offsets) = cli.restart_offsets {
            shapes::restart(&cli, offsets).await
        } else if let Some(offsets) = cli.sweep_offsets {
            shapes::sweep(&cli, offsets).await
        } else {
            shapes::throughput(&cli).await
        }
    });
    match outcome {
        Ok(summary) => {
            summary.print(cli.json);
            if summary.complete {
                std::process::ExitCode::SUCCESS
            } else {
                eprintln!("loadtest: INCOMPLETE: {}", summary.problems.join("; "));
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("loadtest: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
