//! `loadtest nats`: the peer side of the benchmarks (issue 41, "Peers in the repository"). The
//! same throughput shapes as `loadtest` runs against ackgate, run against NATS JetStream over
//! WebSocket: Debian's `nats-server`, started fresh in a temp dir for each run (file storage,
//! WebSocket listener without TLS), driven by the small NATS client below over the same
//! tungstenite WebSockets loadtest uses, with TCP_NODELAY on its sockets.
//!
//! Each client is a durable push consumer with explicit acks, `max_ack_pending` = ackgate's
//! default window (1,000 in flight), reading from the first message; every message is acked,
//! the acks read together sent in one WebSocket frame (as loadtest's ackgate client flushes its
//! acks once per read). `--ack confirmed` acks one at a time with a reply subject and waits for
//! the server's answer (`AckSync` in the Go client), timing that round trip. Split: each client
//! has a stream of its own; fan-out: every client has its own consumer of one stream. The run
//! ends complete when every client received every stream sequence and every consumer's ack
//! floor reached the stream's last sequence.
//!
//! `--broadcast N --rate R --duration-secs S` is the browser shape of `loadtest --broadcast`: N
//! clients, each a durable push consumer of one stream, every message acked, R messages a second
//! published for S seconds, each carrying its publish time, and the publish-to-delivery histogram.

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::MaybeTlsStream;

use crate::client::{ws_config, AckMode, Ws};
use crate::gateway::{process_cpu_seconds, process_rss_bytes};
use crate::report::{Progress, Summary};

/// A consumer that hears nothing this long ends the run (a stuck run fails, it does not hang).
const SILENCE_LIMIT: Duration = Duration::from_secs(60);

/// ackgate's `delivery.max_in_flight` default: the same window on both sides.
const WINDOW: u64 = 1000;

#[derive(Parser, Clone)]
#[command(about = "The peer benchmark: loadtest's throughput shapes against NATS JetStream over WebSocket")]
pub struct NatsCli {
    /// The `nats-server` binary (Debian's package).
    #[arg(long, default_value = "nats-server")]
    pub server_bin: String,
    /// Consumers.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Every client reads the same stream (each receives every message); else each its own.
    #[arg(long)]
    pub fanout: bool,
    /// Messages published in total (split) or to the one stream (fan-out).
    #[arg(long, default_value_t = 200_000)]
    pub events: u64,
    /// Size of each message's JSON payload.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// `each` (an ack per message, no answer awaited) or `confirmed` (one at a time, answered).
    #[arg(long, value_enum, default_value_t = AckMode::Each)]
    pub ack: AckMode,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// The browser shape: this many clients on one stream, messages published at `--rate` for
    /// `--duration-secs` (instead of `--events` preloaded).
    #[arg(long, conflicts_with_all = ["clients", "fanout"])]
    pub broadcast: Option<usize>,
    /// With `--broadcast`: messages published per second.
    #[arg(long, default_value_t = 5, requires = "broadcast")]
    pub rate: u64,
    /// With `--broadcast`: how long messages are published.
    #[arg(long, default_value_t = 60, requires = "broadcast")]
    pub duration_secs: u64,
}

pub fn main(args: Vec<String>) -> std::process::ExitCode {
    let cli = NatsCli::parse_from(args);
    if cli.ack == AckMode::Batch {
        eprintln!("loadtest nats: JetStream has no batched ack; use --ack each or confirmed");
        return std::process::ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let run = async {
        match cli.broadcast {
            Some(clients) => broadcast(&cli, clients).await,
            None => throughput(&cli).await,
        }
    };
    match runtime.block_on(run) {
        Ok(summary) => {
            summary.print(cli.json);
            if summary.complete {
                std::process::ExitCode::SUCCESS
            } else {
                eprintln!("loadtest nats: INCOMPLETE: {}", summary.problems.join("; "));
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("loadtest nats: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// A `nats-server` with JetStream and a WebSocket listener in a temp dir, stopped on drop.
struct NatsServer {
    child: Child,
    ws_url: String,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    fn start(binary: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let mut ws_port = free_port()?;
        while ws_port == port {
            ws_port = free_port()?;
        }
        let config = format!(
            "listen: 127.0.0.1:{port}\nwebsocket {{ listen: \"127.0.0.1:{ws_port}\", no_tls: true }}\njetstream {{ store_dir: \"{}\" }}\n",
            dir.path().join("js").display()
        );
        let config_path = dir.path().join("nats.conf");
        std::fs::write(&config_path, config)?;
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("nats.log"))?)
            .spawn()
            .with_context(|| format!("starting {binary} (Debian's nats-server package: scripts/prereqs installs it)"))?;
        let server = Self { child, ws_url: format!("ws://127.0.0.1:{ws_port}"), _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", ws_port)).is_err() {
            if Instant::now() > deadline {
                bail!("nats-server did not listen on {ws_port} within 10 s: {}", read_log(server._dir.path()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("nats.log")).unwrap_or_default()
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One protocol message from the server.
#[derive(Debug)]
enum Incoming {
    Msg { subject: String, sid: u64, reply: Option<String>, payload: Vec<u8> },
    Info,
    Ok,
    Ping,
    Pong,
}

/// Protocol messages cut out of the bytes the WebSocket frames carried (a frame may end inside a
/// message or hold many).
#[derive(Default)]
struct ProtocolReader {
    buf: Vec<u8>,
    at: usize,
}

impl ProtocolReader {
    fn extend(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at * 2 >= self.buf.len() {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn next(&mut self) -> anyhow::Result<Option<Incoming>> {
        let rest = &self.buf[self.at..];
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let line = std::str::from_utf8(&rest[..eol]).context("a protocol line that is not UTF-8")?;
        let mut words = line.split_ascii_whitespace();
        let op = words.next().unwrap_or("").to_ascii_uppercase();
        let args: Vec<&str> = words.collect();
        let body = |header_len: usize, total: usize| -> Option<(Vec<u8>, usize)> {
            let start = eol + 2;
            (rest.len() >= start + total + 2).then(|| (rest[start + header_len..start + total].to_vec(), start + total + 2))
        };
        let (incoming, used) = match op.as_str() {
            "MSG" => {
                let (subject, sid, reply, len) = match args.as_slice() {
                    [subject, sid, len] => (subject, sid, None, len),
                    [subject, sid, reply, len] => (subject, sid, Some(reply.to_string()), len),
                    _ => bail!("bad MSG line {line:?}"),
                };
                let Some((payload, used)) = body(0, len.parse()?) else { return Ok(None) };
                (Incoming::Msg { subject: subject.to_string(), sid: sid.parse()?, reply, payload }, used)
            }
            "HMSG" => {
                let (subject, sid, reply, header_len, total) = match args.as_slice() {
                    [subject, sid, h, t] => (subject, sid, None, h, t),
                    [subject, sid, reply, h, t] => (subject, sid, Some(reply.to_string()), h, t),
                    _ => bail!("bad HMSG line {line:?}"),
                };
                let (header_len, total): (usize, usize) = (header_len.parse()?, total.parse()?);
                if header_len > total {
                    bail!("bad HMSG line {line:?}: headers longer than the message");
                }
                let Some((payload, used)) = body(header_len, total) else { return Ok(None) };
                (Incoming::Msg { subject: subject.to_string(), sid: sid.parse()?, reply, payload }, used)
            }
            "INFO" => (Incoming::Info, eol + 2),
            "+OK" => (Incoming::Ok, eol + 2),
            "PING" => (Incoming::Ping, eol + 2),
            "PONG" => (Incoming::Pong, eol + 2),
            "-ERR" => bail!("nats-server: {line}"),
            _ => bail!("unknown protocol line {line:?}"),
        };
        self.at += used;
        Ok(Some(incoming))
    }
}

/// The subscription id of a connection's own inbox (request replies).
const INBOX_SID: u64 = 1;
/// The subscription id a consumer's connection reads its deliveries with: JetStream delivers on
/// the deliver subject's subscription, with the subject the message was published to.
const DELIVERIES_SID: u64 = 2;

/// One NATS connection over a WebSocket. What is queued goes out in one frame at `flush`.
struct Conn {
    ws: Ws,
    parser: ProtocolReader,
    out: Vec<u8>,
    /// `_INBOX.<name>.` : replies to this connection's requests come to subjects under it.
    inbox: String,
    next_reply: u64,
}

impl Conn {
    async fn connect(url: &str, name: &str) -> anyhow::Result<Self> {
        let stream = crate::client::tcp(url).await?;
        // What a NATS client does; the server sets it on its side too.
        stream.set_nodelay(true)?;
        let (ws, _) = tokio_tungstenite::client_async_with_config(url, MaybeTlsStream::Plain(stream), Some(ws_config())).await?;
        let inbox = format!("_INBOX.{name}.");
        let mut conn = Self { ws, parser: ProtocolReader::default(), out: Vec::new(), inbox, next_reply: 0 };
        conn.queue(br#"CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1,"lang":"rust-loadtest","version":"0"}"#);
        conn.queue(b"\r\n");
        conn.queue(format!("SUB {}* {INBOX_SID}\r\nPING\r\n", conn.inbox).as_bytes());
        conn.flush().await?;
        while !matches!(conn.next().await?, Incoming::Pong) {}
        Ok(conn)
    }

    fn queue(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn publish(&mut self, subject: &str, reply: Option<&str>, payload: &[u8]) {
        let line = match reply {
            Some(reply) => format!("PUB {subject} {reply} {}\r\n", payload.len()),
            None => format!("PUB {subject} {}\r\n", payload.len()),
        };
        self.queue(line.as_bytes());
        self.queue(payload);
        self.queue(b"\r\n");
    }

    fn new_reply_subject(&mut self) -> String {
        self.next_reply += 1;
        format!("{}{}", self.inbox, self.next_reply)
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if !self.out.is_empty() {
            self.ws.send(Message::binary(std::mem::take(&mut self.out))).await?;
        }
        Ok(())
    }

    /// The next message; PINGs are answered on the way.
    async fn next(&mut self) -> anyhow::Result<Incoming> {
        loop {
            match self.parser.next()? {
                Some(Incoming::Ping) => {
                    self.queue(b"PONG\r\n");
                    self.flush().await?;
                }
                Some(incoming) => return Ok(incoming),
                None => match self.ws.next().await.context("nats-server closed the connection")?? {
                    Message::Binary(bytes) => self.parser.extend(&bytes),
                    Message::Text(text) => self.parser.extend(text.as_bytes()),
                    Message::Close(frame) => bail!("nats-server closed the WebSocket: {frame:?}"),
                    _ => {}
                },
            }
        }
    }

    /// True when a message is already buffered (no read needed).
    fn has_buffered(&self) -> bool {
        self.parser.at < self.parser.buf.len()
    }

    /// JetStream API requests sent together; each answer checked (an `error` is an error here).
    async fn requests(&mut self, requests: &[(String, Value)]) -> anyhow::Result<()> {
        let mut waiting = std::collections::HashSet::new();
        for (subject, body) in requests {
            let reply = self.new_reply_subject();
            self.publish(subject, Some(&reply), body.to_string().as_bytes());
            waiting.insert(reply);
        }
        self.flush().await?;
        while !waiting.is_empty() {
            if let Incoming::Msg { subject, payload, .. } = self.next().await? {
                if waiting.remove(&subject) && payload.windows(7).any(|w| w == b"\"error\"") {
                    bail!("a JetStream request failed: {}", String::from_utf8_lossy(&payload));
                }
            }
        }
        Ok(())
    }

    /// A JetStream API request and its JSON answer (an `error` in it is an error here).
    async fn request(&mut self, subject: &str, body: &Value) -> anyhow::Result<Value> {
        let reply = self.new_reply_subject();
        self.publish(subject, Some(&reply), body.to_string().as_bytes());
        self.flush().await?;
        loop {
            if let Incoming::Msg { subject: got, payload, .. } = self.next().await? {
                if got == reply {
                    let answer: Value = serde_json::from_slice(&payload).with_context(|| format!("{subject}: {}", String::from_utf8_lossy(&payload)))?;
                    if answer.get("error").is_some() {
                        bail!("{subject}: {answer}");
                    }
                    return Ok(answer);
                }
            }
        }
    }
}

/// The server's RSS, and its CPU over the timed part (in all, and per delivery).
fn server_resources(summary: &mut Summary, pid: u32, cpu_before: Option<f64>, elapsed: Duration, deliveries: u64) {
    if let Some(rss) = process_rss_bytes(pid) {
        summary.add("nats_rss_mib", (rss as f64 / 1048576.0 * 10.0).round() / 10.0);
    }
    if let (Some(before), Some(after)) = (cpu_before, process_cpu_seconds(pid)) {
        summary.add("nats_cpu_percent", ((after - before) / elapsed.as_secs_f64() * 1000.0).round() / 10.0);
        summary.add("cpu_us_per_delivery", ((after - before) * 1e6 / deliveries.max(1) as f64 * 10.0).round() / 10.0);
    }
}

/// The JetStream request that creates client `i`'s durable push consumer of `stream`: explicit
/// acks, ackgate's window, from the first message, delivered to `d.<stream>.c<i>`.
fn consumer_create(stream: &str, i: usize) -> (String, Value) {
    let config = json!({
        "durable_name": format!("c{i}"),
        "deliver_subject": format!("d.{stream}.c{i}"),
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": 30_000_000_000u64,
        "max_ack_pending": WINDOW,
    });
    (format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.c{i}"), json!({"stream_name": stream, "config": config}))
}

/// Stream sequence and delivery count from a JetStream ack subject: `$JS.ACK.<stream>.<consumer>.
/// <delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or with the domain and account
/// hash before the stream in the newer form.
fn ack_subject_sequence(reply: &str) -> anyhow::Result<(u64, u64)> {
    let tokens: Vec<&str> = reply.split('.').collect();
    let (delivered, sequence) = match tokens.len() {
        9 => (tokens[4], tokens[5]),
        n if n >= 11 => (tokens[6], tokens[7]),
        _ => bail!("not a JetStream ack subject: {reply}"),
    };
    Ok((delivered.parse()?, sequence.parse()?))
}

/// Publishes `count` messages of `payload_bytes` to `subject`, each answered by JetStream
/// (stored), at most 5,000 unanswered at a time.
async fn preload(conn: &mut Conn, subject: &str, count: u64, payload_bytes: usize, published: &AtomicU64) -> anyhow::Result<()> {
    let reply = conn.new_reply_subject();
    let (mut sent, mut answered) = (0u64, 0u64);
    while answered < count {
        while sent < count && sent - answered < 5000 {
            let head = format!(r#"{{"i":{sent},"f":""#);
            let fill = payload_bytes.saturating_sub(head.len() + 2);
            let payload = format!("{head}{}\"}}", "x".repeat(fill));
            conn.publish(subject, Some(&reply), payload.as_bytes());
            sent += 1;
            if sent % 500 == 0 {
                conn.flush().await?;
            }
        }
        conn.flush().await?;
        if let Incoming::Msg { subject: got, payload, .. } = conn.next().await? {
            if got == reply {
                if payload.windows(7).any(|w| w == b"\"error\"") {
                    bail!("publishing to {subject}: {}", String::from_utf8_lossy(&payload));
                }
                answered += 1;
                published.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// The published payload, as its consumer parses it.
#[derive(serde::Deserialize)]
struct Event {
    #[allow(dead_code)]
    i: u64,
    /// Broadcast: when it was published, in ns since the run's start.
    #[serde(default)]
    t: Option<u64>,
}

struct Consumed {
    sequences: HashSet<u64>,
    deliveries: u64,
    redeliveries: u64,
    acked: u64,
    latency_us: Histogram<u64>,
}

/// Reads `expect` distinct messages of its consumer and acks each. With `since` (broadcast), the
/// histogram is of publish to delivery, from the time each message carries.
async fn consume(mut conn: Conn, expect: u64, mode: AckMode, progress: Arc<AtomicU64>, since: Option<Instant>) -> anyhow::Result<Consumed> {
    let mut got = Consumed { sequences: HashSet::new(), deliveries: 0, redeliveries: 0, acked: 0, latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)? };
    // Confirmed: ack subjects waiting for their turn, and the one whose answer is awaited.
    let mut unsent: std::collections::VecDeque<String> = Default::default();
    let mut awaiting: Option<(String, Instant)> = None;
    while (got.sequences.len() as u64) < expect || awaiting.is_some() || !unsent.is_empty() {
        // Everything already read is handled before one flush.
        loop {
            let Ok(incoming) = tokio::time::timeout(SILENCE_LIMIT, conn.next()).await else {
                bail!("nothing from nats-server for {SILENCE_LIMIT:?}: {} of {expect} messages received, {} acked", got.sequences.len(), got.acked);
            };
            match incoming? {
                Incoming::Msg { sid: DELIVERIES_SID, reply: Some(ack_subject), payload, .. } => {
                    // The event is read as an app reads it (and as loadtest's ackgate client
                    // reads its frames): parsed JSON.
                    let event: Event = serde_json::from_slice(&payload).context("a message that is not the JSON published")?;
                    if let (Some(since), Some(t)) = (since, event.t) {
                        got.latency_us.saturating_record((since.elapsed().as_nanos() as u64).saturating_sub(t) / 1000);
                    }
                    let (delivered, sequence) = ack_subject_sequence(&ack_subject)?;
                    got.deliveries += 1;
                    if delivered > 1 {
                        got.redeliveries += 1;
                    }
                    got.sequences.insert(sequence);
                    match mode {
                        AckMode::Confirmed => unsent.push_back(ack_subject),
                        _ => {
                            conn.publish(&ack_subject, None, b"+ACK");
                            got.acked += 1;
                            progress.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Incoming::Msg { subject, .. } if awaiting.as_ref().is_some_and(|(reply, _)| *reply == subject) => {
                    let (_, sent) = awaiting.take().expect("checked");
                    got.latency_us.saturating_record(sent.elapsed().as_micros() as u64);
                    got.acked += 1;
                    progress.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
            if !conn.has_buffered() {
                break;
            }
        }
        if awaiting.is_none() {
            if let Some(ack_subject) = unsent.pop_front() {
                let reply = conn.new_reply_subject();
                conn.publish(&ack_subject, Some(&reply), b"+ACK");
                awaiting = Some((reply, Instant::now()));
            }
        }
        conn.flush().await?;
    }
    Ok(got)
}

async fn throughput(cli: &NatsCli) -> anyhow::Result<Summary> {
    let server = NatsServer::start(&cli.server_bin)?;
    let pid = server.child.id();
    let clients = cli.clients.max(1);
    let mut admin = Conn::connect(&server.ws_url, "admin").await?;
    // (stream, its consumers' indexes, messages in it)
    let streams: Vec<(String, Vec<usize>, u64)> = if cli.fanout {
        vec![("S0".to_string(), (0..clients).collect(), cli.events)]
    } else {
        let per = cli.events / clients as u64;
        (0..clients).map(|i| (format!("S{i}"), vec![i], per + u64::from((i as u64) < cli.events % clients as u64))).collect()
    };
    let shape = format!(
        "NATS JetStream over WebSocket: {} {clients} clients, {} events, {}-byte payloads, ack {:?}",
        if cli.fanout { "fan-out" } else { "split" },
        cli.events,
        cli.payload_bytes,
        cli.ack
    );
    let mut summary = Summary::new(shape);
    let published = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    {
        let _progress = Progress::start("publish", published.clone(), cli.events);
        for (stream, _, count) in &streams {
            let subject = stream.to_lowercase();
            admin
                .request(&format!("$JS.API.STREAM.CREATE.{stream}"), &json!({"name": stream, "subjects": [subject], "storage": "file", "num_replicas": 1}))
                .await?;
            preload(&mut admin, &subject, *count, cli.payload_bytes, &published).await?;
        }
    }
    summary.add("publish_events_per_s", (cli.events as f64 / started.elapsed().as_secs_f64()).round());

    // Connect everyone first, so the timed part is delivery and acks.
    // Connected and subscribed before the clock starts (a SUB delivers nothing until its
    // consumer exists); the subscription is in place before the consumer is created (the PONG
    // says the server processed the SUB): a push consumer created first may send its first
    // window to a subject without interest, where it is lost until `ack_wait` redelivers it.
    let mut conns: Vec<Option<Conn>> = Vec::with_capacity(clients);
    for i in 0..clients {
        let mut conn = Conn::connect(&server.ws_url, &format!("c{i}")).await?;
        let stream = &streams.iter().find(|(_, readers, _)| readers.contains(&i)).expect("every client reads a stream").0;
        conn.queue(format!("SUB d.{stream}.c{i} {DELIVERIES_SID}\r\nPING\r\n").as_bytes());
        conn.flush().await?;
        while !matches!(conn.next().await?, Incoming::Pong) {}
        conns.push(Some(conn));
    }
    let acked = Arc::new(AtomicU64::new(0));
    let deliveries_expected: u64 = streams.iter().map(|(_, readers, count)| readers.len() as u64 * count).sum();
    let cpu_before = process_cpu_seconds(pid);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut creates = Vec::new();
    for (stream, readers, count) in &streams {
        for &i in readers {
            let conn = conns[i].take().expect("one consumer per connection");
            tasks.push(tokio::spawn(consume(conn, *count, cli.ack, acked.clone(), None)));
            creates.push(consumer_create(stream, i));
        }
    }
    // Every consumer asked for at once, as ackgate's clients subscribe at once.
    admin.requests(&creates).await?;
    let progress = Progress::start("acked", acked.clone(), deliveries_expected);
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut deliveries, mut redeliveries, mut acks) = (0, 0, 0);
    let mut consumed = Vec::new();
    for task in tasks {
        let got = task.await??;
        latency.add(&got.latency_us)?;
        deliveries += got.deliveries;
        redeliveries += got.redeliveries;
        acks += got.acked;
        consumed.push(got);
    }
    let elapsed = started.elapsed();
    drop(progress);
    server_resources(&mut summary, pid, cpu_before, elapsed, deliveries);
    summary.add_deliveries(elapsed, deliveries, acks, redeliveries);
    summary.add_latency("ack_round_trip", &latency);

    // Complete: every client got every sequence of its stream, and every consumer's ack floor
    // reached the stream's end (acks without an answer are applied a moment later). Asked on a
    // connection of its own: the first one read nothing during the run (a long run's unanswered
    // PINGs would have closed it).
    drop(admin);
    let mut admin = Conn::connect(&server.ws_url, "check").await?;
    let mut consumed = consumed.into_iter();
    for (stream, readers, count) in &streams {
        for &i in readers {
            let got = consumed.next().expect("one result per consumer");
            let missing = (1..=*count).filter(|s| !got.sequences.contains(s)).count();
            if missing > 0 {
                summary.problem(format!("c{i} missed {missing} messages of {stream}"));
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let info = admin.request(&format!("$JS.API.CONSUMER.INFO.{stream}.c{i}"), &json!({})).await?;
                let floor = info["ack_floor"]["stream_seq"].as_u64().unwrap_or(0);
                if floor >= *count {
                    break;
                }
                if Instant::now() > deadline {
                    summary.problem(format!("c{i}'s ack floor on {stream} is {floor}, not {count}, 30 s after the last ack"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(summary)
}

/// The browser shape (`--broadcast`): every client a durable push consumer of one stream, messages
/// published at `--rate` for `--duration-secs`, each acked, timed from publish to delivery.
async fn broadcast(cli: &NatsCli, clients: usize) -> anyhow::Result<Summary> {
    let server = NatsServer::start(&cli.server_bin)?;
    let pid = server.child.id();
    let total = cli.rate * cli.duration_secs;
    let mut summary = Summary::new(format!(
        "NATS JetStream over WebSocket: broadcast to {clients} clients, {} messages/s for {} s, {}-byte payloads, each acked",
        cli.rate, cli.duration_secs, cli.payload_bytes
    ));
    let mut admin = Conn::connect(&server.ws_url, "admin").await?;
    admin.request("$JS.API.STREAM.CREATE.B", &json!({"name": "B", "subjects": ["b"], "storage": "file", "num_replicas": 1})).await?;
    // Connected and subscribed first (200 at a time), then every consumer created.
    let connected = Arc::new(AtomicU64::new(0));
    let connecting = Progress::start("connected", connected.clone(), clients as u64);
    let mut conns = Vec::with_capacity(clients);
    for chunk in (0..clients).collect::<Vec<_>>().chunks(200) {
        let opened = futures_util::future::join_all(chunk.iter().map(|&i| {
            let url = server.ws_url.clone();
            async move {
                let mut conn = Conn::connect(&url, &format!("c{i}")).await?;
                conn.queue(format!("SUB d.B.c{i} {DELIVERIES_SID}\r\nPING\r\n").as_bytes());
                conn.flush().await?;
                while !matches!(conn.next().await?, Incoming::Pong) {}
                anyhow::Ok(conn)
            }
        }))
        .await;
        for conn in opened {
            conns.push(conn?);
            connected.fetch_add(1, Ordering::Relaxed);
        }
    }
    drop(connecting);
    let acked = Arc::new(AtomicU64::new(0));
    let since = Instant::now();
    let tasks: Vec<_> = conns.into_iter().map(|conn| tokio::spawn(consume(conn, total, AckMode::Each, acked.clone(), Some(since)))).collect();
    for chunk in (0..clients).collect::<Vec<_>>().chunks(500) {
        let creates: Vec<(String, Value)> = chunk.iter().map(|&i| consumer_create("B", i)).collect();
        admin.requests(&creates).await?;
    }
    let progress = Progress::start("acked", acked.clone(), total * clients as u64);
    let cpu_before = process_cpu_seconds(pid);
    let started = Instant::now();
    // Paced in 1 ms ticks, each message stored (answered) before the run counts as published.
    let reply = admin.new_reply_subject();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sent = 0u64;
    while sent < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * cli.rate as f64) as u64).min(total);
        while sent < due {
            let head = format!(r#"{{"i":{sent},"t":{},"f":""#, since.elapsed().as_nanos());
            let payload = format!("{head}{}\"}}", "x".repeat(cli.payload_bytes.saturating_sub(head.len() + 2)));
            admin.publish("b", Some(&reply), payload.as_bytes());
            sent += 1;
        }
        admin.flush().await?;
    }
    let mut stored = 0;
    while stored < total {
        if let Incoming::Msg { subject, payload, .. } = admin.next().await? {
            if subject == reply {
                if payload.windows(7).any(|w| w == b"\"error\"") {
                    bail!("publishing: {}", String::from_utf8_lossy(&payload));
                }
                stored += 1;
            }
        }
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut deliveries, mut redeliveries, mut acks) = (0, 0, 0);
    for (i, task) in tasks.into_iter().enumerate() {
        let got = task.await??;
        latency.add(&got.latency_us)?;
        deliveries += got.deliveries;
        redeliveries += got.redeliveries;
        acks += got.acked;
        let missing = (1..=total).filter(|s| !got.sequences.contains(s)).count();
        if missing > 0 {
            summary.problem(format!("c{i} missed {missing} messages"));
        }
    }
    let elapsed = started.elapsed();
    drop(progress);
    server_resources(&mut summary, pid, cpu_before, elapsed, deliveries);
    summary.add_deliveries(elapsed, deliveries, acks, redeliveries);
    summary.add_latency("publish_to_delivery", &latency);
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_across_frames_are_put_back_together() {
        let mut parser = ProtocolReader::default();
        parser.extend(b"INFO {}\r\nMSG s0 2 $JS.ACK.S0.c0.1.7.7.1.0 5\r\nhel");
        assert!(matches!(parser.next().unwrap(), Some(Incoming::Info)));
        assert!(parser.next().unwrap().is_none(), "a message whose payload has not all come is not returned");
        parser.extend(b"lo\r\nPING\r\nHMSG _INBOX.a.1 1 12 14\r\nNATS/1.0\r\n\r\nok\r\n");
        match parser.next().unwrap() {
            Some(Incoming::Msg { subject, sid, reply, payload }) => {
                assert_eq!((subject.as_str(), sid), ("s0", 2));
                assert_eq!(ack_subject_sequence(&reply.unwrap()).unwrap(), (1, 7));
                assert_eq!(payload, b"hello");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parser.next().unwrap(), Some(Incoming::Ping)));
        match parser.next().unwrap() {
            Some(Incoming::Msg { subject, sid: 1, reply: None, payload }) => assert_eq!((subject.as_str(), payload.as_slice()), ("_INBOX.a.1", &b"ok"[..])),
            other => panic!("{other:?}"),
        }
        assert!(parser.next().unwrap().is_none());
        assert!(parser.extend_then_next(b"-ERR 'Authorization Violation'\r\n").is_err());
    }

    #[test]
    fn ack_subjects_of_both_forms_name_the_sequence() {
        assert_eq!(ack_subject_sequence("$JS.ACK.S0.c1.3.42.40.1700000000.9").unwrap(), (3, 42));
        assert_eq!(ack_subject_sequence("$JS.ACK.dom.acchash.S0.c1.1.42.40.1700000000.9.rand").unwrap(), (1, 42));
        assert!(ack_subject_sequence("_INBOX.x.1").is_err());
    }

    impl ProtocolReader {
        fn extend_then_next(&mut self, bytes: &[u8]) -> anyhow::Result<Option<Incoming>> {
            self.extend(bytes);
            self.next()
        }
    }
}
