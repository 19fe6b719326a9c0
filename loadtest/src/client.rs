//! One consumer, over a WebSocket or Server-Sent Events: subscribes, records every offset it
//! receives, and acknowledges each event in the chosen mode. Writes are batched: acks are fed
//! while frames are already waiting and flushed once nothing more is there to read (over SSE,
//! one POST of every frame fed).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::{FutureExt, SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::MaybeTlsStream;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Transport {
    Websocket,
    /// `GET /sse` down, `POST /sse/{id}/frames` up.
    Sse,
}

/// What drives the consumers' sockets.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum ClientEngine {
    /// A task per client (as a browser: each tab its own event loop).
    Task,
    /// One task per worker thread for all its clients' sockets (`multiplexed`): a lean client, so
    /// latency measures the gateway more than the load generator.
    Multiplexed,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum AckMode {
    /// One ack frame per event.
    Each,
    /// One ack frame per `--ack-batch` events (or per burst of frames read together).
    Batch,
    /// Each ack carries `req` and waits for its `ack_ok` (the durable round trip) before the next.
    Confirmed,
}

/// What one consumer saw.
#[derive(Default)]
pub struct Received {
    /// Distinct offsets per partition.
    pub offsets: HashMap<u32, HashSet<u64>>,
    pub deliveries: u64,
    pub redeliveries: u64,
    pub acked: u64,
}

impl Received {
    pub fn distinct(&self) -> u64 {
        self.offsets.values().map(|s| s.len() as u64).sum()
    }
}

pub struct ConsumerPlan {
    pub client_id: String,
    pub topic: String,
    /// Stop after this many distinct events.
    pub expect: u64,
    pub mode: AckMode,
    pub ack_batch: usize,
    /// Counts acknowledged events across consumers, for the progress line.
    pub progress: Arc<AtomicU64>,
    /// Events carry `{"t": ns since this instant}`: record publish-to-delivery latency.
    pub paced_since: Option<Instant>,
    /// Never acknowledge the first this many events (a self-test of the completeness check).
    pub skip_acks: u64,
    /// `from` of the subscribe (`None`: the gateway's reset policy).
    pub from: Option<&'static str>,
    /// Counts consumers whose `subscribed` arrived (a start at `latest` must be in place before
    /// the publisher begins, or the first events fall before it).
    pub subscribed: Arc<AtomicU64>,
    /// A member of this shared subscription: it stops once the members together received
    /// `expect` first deliveries (counted in `SharedPlan::first_deliveries`).
    pub group: Option<SharedPlan>,
}

/// What the members of a `--group` run share.
pub struct SharedPlan {
    pub name: String,
    pub first_deliveries: Arc<AtomicU64>,
}

/// How often a member that waits for a frame looks whether the group is done.
const MEMBER_CHECK: Duration = Duration::from_millis(100);

pub struct ConsumerResult {
    pub received: Received,
    /// Ack round trips (confirmed mode) or publish-to-delivery (paced), in microseconds.
    pub latency_us: Histogram<u64>,
}

pub type Ws = tokio_tungstenite::WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Connections per loopback source address: below the ~28,000 ephemeral ports of one address.
const CONNECTIONS_PER_SOURCE: usize = 20_000;
static CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// Opens the TCP connection. To a loopback gateway, connections are spread over the source
/// addresses 127.0.0.1, 127.0.0.2, ... (20,000 each), so tens of thousands of sockets do not run
/// out of ephemeral ports.
pub(crate) async fn tcp(ws_url: &str) -> anyhow::Result<TcpStream> {
    let authority = ws_url.split("://").nth(1).and_then(|rest| rest.split('/').next()).context("ws url without host")?;
    let server: SocketAddr = match authority.parse() {
        Ok(addr) => addr,
        Err(_) => return Ok(TcpStream::connect(authority).await?),
    };
    if !server.ip().is_loopback() {
        return Ok(TcpStream::connect(server).await?);
    }
    let n = CONNECTIONS.fetch_add(1, Ordering::Relaxed) / CONNECTIONS_PER_SOURCE;
    let source = std::net::Ipv4Addr::new(127, 0, (n / 250) as u8, (1 + n % 250) as u8);
    let socket = tokio::net::TcpSocket::new_v4()?;
    // The port is picked at connect, by the whole address pair, not at bind: the previous run's
    // 10,000 sockets sit in TIME_WAIT for a minute, and a bind that picks a port itself refused
    // theirs ("Address already in use") in back-to-back runs.
    let one: libc::c_int = 1;
    // SAFETY: a valid socket, an int option and its size.
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    socket.bind(SocketAddr::new(source.into(), 0)).with_context(|| format!("binding source address {source}"))?;
    // Nagle stays on, as with `connect_async`: figures stay comparable with earlier runs.
    Ok(socket.connect(server).await?)
}

/// tungstenite zeroes `read_buffer_size` bytes before every read (128 KiB by default): with
/// thousands of clients each reading one small frame at a time, half of this process's CPU went
/// to that memset (perf, `--broadcast 5000`), taken from the gateway on the same cores.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(8 * 1024)
}

pub async fn connect(ws_url: &str, client_id: &str) -> anyhow::Result<Ws> {
    let stream = tcp(ws_url).await.with_context(|| format!("connecting {client_id} to {ws_url}"))?;
    let (mut ws, _) = tokio_tungstenite::client_async_with_config(format!("{ws_url}?client_id={client_id}"), MaybeTlsStream::Plain(stream), Some(ws_config()))
        .await
        .with_context(|| format!("connecting {client_id}"))?;
    let welcome = next_json(&mut ws).await?;
    if welcome["type"] != "welcome" {
        bail!("{client_id}: first frame {welcome}");
    }
    Ok(ws)
}

/// A consumer's connection: a WebSocket, or an SSE stream with its frames POSTed.
pub enum Connection {
    Ws(Box<Ws>),
    Sse(Box<SseConnection>),
}

pub struct SseConnection {
    http: reqwest::Client,
    stream: reqwest::Response,
    buffer: Vec<u8>,
    frames_url: String,
    /// Frames fed and not yet POSTed.
    unsent: Vec<String>,
    /// The POST under way: one at a time, as a browser client does, while the stream is read on
    /// (waiting for each answer before reading on would make every batch of acks a round trip).
    posting: Option<tokio::task::JoinHandle<anyhow::Result<Vec<String>>>>,
    /// POST answers, read before the stream.
    answers: std::collections::VecDeque<String>,
}

/// What a consumer reads next.
enum Incoming {
    Text(String),
    Closed(String),
}

/// Opens a session over `transport` at `base` (`http://host:port`), welcomed.
pub async fn connect_over(transport: Transport, base: &str, client_id: &str) -> anyhow::Result<Connection> {
    match transport {
        Transport::Websocket => Ok(Connection::Ws(Box::new(connect(&format!("{}/ws", base.replacen("http", "ws", 1)), client_id).await?))),
        Transport::Sse => {
            let http = reqwest::Client::new();
            let stream = http.get(format!("{base}/sse?client_id={client_id}")).send().await.with_context(|| format!("connecting {client_id}"))?;
            if !stream.status().is_success() {
                bail!("{client_id}: GET /sse answered {}", stream.status());
            }
            let mut sse =
                SseConnection { http, stream, buffer: Vec::new(), frames_url: String::new(), unsent: Vec::new(), posting: None, answers: Default::default() };
            let Incoming::Text(welcome) = sse.recv().await? else { bail!("{client_id}: closed before its welcome") };
            let welcome: Value = serde_json::from_str(&welcome)?;
            let ack_url = welcome["ack_url"].as_str().with_context(|| format!("{client_id}: welcome without ack_url: {welcome}"))?;
            sse.frames_url = format!("{base}{ack_url}");
            Ok(Connection::Sse(Box::new(sse)))
        }
    }
}

impl SseConnection {
    async fn recv(&mut self) -> anyhow::Result<Incoming> {
        loop {
            if let Some(answer) = self.answers.pop_front() {
                return Ok(Incoming::Text(answer));
            }
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let message: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let message = std::str::from_utf8(&message)?;
                let mut data: Option<String> = None;
                let mut closed = false;
                for line in message.lines() {
                    if let Some(text) = line.strip_prefix("data: ") {
                        // Several data lines are one value joined with newlines.
                        data = Some(match data {
                            Some(before) => format!("{before}\n{text}"),
                            None => text.to_string(),
                        });
                    } else if line == "event: close" {
                        closed = true;
                    }
                }
                match (data, closed) {
                    (Some(data), true) => return Ok(Incoming::Closed(data)),
                    (Some(data), false) => return Ok(Incoming::Text(data)),
                    // A keepalive comment.
                    (None, _) => continue,
                }
            }
            let (stream, posting) = (&mut self.stream, &mut self.posting);
            tokio::select! {
                chunk = stream.chunk() => match chunk? {
                    Some(chunk) => self.buffer.extend_from_slice(&chunk),
                    None => bail!("the event stream ended"),
                },
                answered = async { posting.as_mut().expect("guarded").await }, if posting.is_some() => {
                    self.posting = None;
                    self.answers.extend(answered??);
                    self.start_post();
                }
            }
        }
    }

    /// POSTs the frames fed so far, unless a POST is under way (they go when it is answered).
    fn start_post(&mut self) {
        if self.posting.is_some() || self.unsent.is_empty() {
            return;
        }
        let body = format!("[{}]", self.unsent.join(","));
        self.unsent.clear();
        let request = self.http.post(&self.frames_url).body(body);
        self.posting = Some(tokio::spawn(async move {
            let response = request.send().await?;
            if !response.status().is_success() {
                bail!("POST of frames answered {}", response.status());
            }
            let answers: Vec<Box<serde_json::value::RawValue>> = serde_json::from_slice(&response.bytes().await?)?;
            Ok(answers.into_iter().map(|a| a.get().to_string()).collect())
        }));
    }
}

impl Connection {
    async fn recv(&mut self) -> anyhow::Result<Incoming> {
        match self {
            Connection::Ws(ws) => loop {
                match ws.next().await {
                    Some(Ok(Message::Text(text))) => return Ok(Incoming::Text(text.as_str().to_owned())),
                    Some(Ok(Message::Close(frame))) => return Ok(Incoming::Closed(format!("{frame:?}"))),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e.into()),
                    None => bail!("socket ended"),
                }
            },
            Connection::Sse(sse) => sse.recv().await,
        }
    }

    async fn feed(&mut self, text: String) -> anyhow::Result<()> {
        match self {
            Connection::Ws(ws) => Ok(ws.feed(Message::Text(text.into())).await?),
            Connection::Sse(sse) => {
                sse.unsent.push(text);
                Ok(())
            }
        }
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        match self {
            Connection::Ws(ws) => Ok(ws.flush().await?),
            Connection::Sse(sse) => {
                sse.start_post();
                Ok(())
            }
        }
    }

    async fn send(&mut self, text: String) -> anyhow::Result<()> {
        self.feed(text).await?;
        self.flush().await
    }

    async fn close(self) {
        if let Connection::Ws(mut ws) = self {
            let _ = Ws::close(&mut ws, None).await;
        }
    }
}

async fn next_json(ws: &mut Ws) -> anyhow::Result<Value> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => return Ok(serde_json::from_str(text.as_str())?),
            Some(Ok(Message::Close(frame))) => bail!("closed by the gateway: {frame:?}"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
            None => bail!("socket ended"),
        }
    }
}

/// Subscribes answered `unavailable` and sent again since the loadtest started (in the summary
/// when any; `--find-rate` sums its runs).
pub static SUBSCRIBE_RETRIES: AtomicU64 = AtomicU64::new(0);
/// Subscribes of one consumer answered `unavailable` after which the run fails (500 ms apart).
const MAX_SUBSCRIBE_RETRIES: u32 = 120;

/// The fields of an `event` frame the loadtest needs (the payload is skipped, not parsed into a tree).
#[derive(serde::Deserialize)]
struct Frame<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    delivery_id: Option<&'a str>,
    #[serde(default)]
    partition: u32,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    attempt: u32,
    #[serde(default)]
    payload: Option<Paced>,
    #[serde(default)]
    req: Option<Value>,
    #[serde(default)]
    code: Option<&'a str>,
}

#[derive(serde::Deserialize)]
struct Paced {
    #[serde(default)]
    t: Option<u64>,
}

pub async fn consume(plan: ConsumerPlan, mut ws: Connection) -> anyhow::Result<ConsumerResult> {
    let mut received = Received::default();
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut subscribe = json!({"op": "subscribe", "topic": plan.topic, "req": "sub"});
    if let Some(from) = plan.from {
        subscribe["from"] = json!(from);
    }
    if let Some(group) = &plan.group {
        subscribe["group"] = json!(group.name);
    }
    ws.send(subscribe.to_string()).await?;
    let group_done = || plan.group.as_ref().is_some_and(|g| g.first_deliveries.load(Ordering::Relaxed) >= plan.expect);
    let mut pending_ids: Vec<String> = Vec::new();
    // Confirmed mode: the ack waiting for its ack_ok, and when it was sent.
    let mut awaiting: Option<(u64, Instant)> = None;
    let mut next_req = 1u64;
    let mut unsent: std::collections::VecDeque<String> = Default::default();
    let mut retries_here = 0u32;
    loop {
        let acked_before = received.acked;
        let message = match &plan.group {
            None => ws.recv().await,
            // A member may get nothing more: the others took the rest.
            Some(_) => match tokio::time::timeout(MEMBER_CHECK, ws.recv()).await {
                Ok(message) => message,
                Err(_) if group_done() && awaiting.is_none() && unsent.is_empty() => break,
                Err(_) => continue,
            },
        }
        .with_context(|| format!("{}: reading", plan.client_id))?;
        let mut batch = vec![message];
        while let Some(more) = ws.recv().now_or_never() {
            batch.push(more?);
            if batch.len() >= 1024 {
                break;
            }
        }
        for message in batch {
            let text = match message {
                Incoming::Text(text) => text,
                Incoming::Closed(frame) => bail!("{}: closed by the gateway: {frame}", plan.client_id),
            };
            let text = text.as_str();
            {
                // Paced events without a scannable `t` go through the parser below.
                if let Some(event) = scan_event(text).filter(|e| plan.paced_since.is_none() || e.published_ns.is_some()) {
                    // The common case, without a JSON parse: the client must not be the bottleneck
                    // (a broadcast runs 10,000 of these on the gateway's machine).
                    if let (Some(since), Some(t)) = (plan.paced_since, event.published_ns) {
                        let now = since.elapsed().as_nanos() as u64;
                        latency_us.saturating_record(now.saturating_sub(t) / 1000);
                    }
                    received.deliveries += 1;
                    if event.attempt > 1 {
                        received.redeliveries += 1;
                    } else if let Some(group) = &plan.group {
                        group.first_deliveries.fetch_add(1, Ordering::Relaxed);
                    }
                    received.offsets.entry(event.partition).or_default().insert(event.offset);
                    if received.deliveries <= plan.skip_acks {
                        continue;
                    }
                    match plan.mode {
                        AckMode::Each => {
                            ws.feed(format!(r#"{{"op":"ack","delivery_id":"{}"}}"#, event.delivery_id)).await?;
                            received.acked += 1;
                        }
                        AckMode::Batch => pending_ids.push(event.delivery_id.to_string()),
                        AckMode::Confirmed => unsent.push_back(event.delivery_id.to_string()),
                    }
                    continue;
                }
            }
            let frame: Frame = serde_json::from_str(text).with_context(|| format!("bad frame {text}"))?;
            match frame.kind {
                "event" => {
                    received.deliveries += 1;
                    if frame.attempt > 1 {
                        received.redeliveries += 1;
                    } else if let Some(group) = &plan.group {
                        group.first_deliveries.fetch_add(1, Ordering::Relaxed);
                    }
                    received.offsets.entry(frame.partition).or_default().insert(frame.offset);
                    if let (Some(since), Some(Paced { t: Some(t) })) = (plan.paced_since, &frame.payload) {
                        let now = since.elapsed().as_nanos() as u64;
                        latency_us.saturating_record(now.saturating_sub(*t) / 1000);
                    }
                    let id = frame.delivery_id.unwrap_or_default().to_string();
                    match plan.mode {
                        AckMode::Each => {
                            ws.feed(format!(r#"{{"op":"ack","delivery_id":"{id}"}}"#)).await?;
                            received.acked += 1;
                        }
                        AckMode::Batch => pending_ids.push(id),
                        AckMode::Confirmed => unsent.push_back(id),
                    }
                }
                "ack_ok" => {
                    if let Some((req, sent)) = awaiting {
                        if frame.req.as_ref().and_then(Value::as_u64) == Some(req) {
                            latency_us.saturating_record(sent.elapsed().as_micros() as u64);
                            received.acked += 1;
                            plan.progress.fetch_add(1, Ordering::Relaxed);
                            awaiting = None;
                        }
                    }
                }
                "error" if frame.code == Some("unavailable") && frame.req.as_ref().and_then(Value::as_str) == Some("sub") => {
                    // What a client does with `unavailable`: subscribe again a little later (a
                    // broker too busy to answer the subscribe's offset queries in time), for a
                    // minute at most.
                    retries_here += 1;
                    if retries_here > MAX_SUBSCRIBE_RETRIES {
                        bail!("{}: still unavailable after {MAX_SUBSCRIBE_RETRIES} subscribes: {text}", plan.client_id);
                    }
                    SUBSCRIBE_RETRIES.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    ws.send(subscribe.to_string()).await?;
                }
                "error" => bail!("{}: error frame {text}", plan.client_id),
                "subscribed" => {
                    plan.subscribed.fetch_add(1, Ordering::Relaxed);
                }
                // Fresh resume tokens for plain acks (every `delivery.progress_interval_ms`): a
                // client that resumes would keep them; this one never reconnects.
                "pong" | "progress" => {}
                other => bail!("{}: unexpected frame type {other} ({:?})", plan.client_id, frame.code),
            }
        }
        match plan.mode {
            AckMode::Each => {}
            AckMode::Batch => {
                for chunk in pending_ids.chunks(plan.ack_batch) {
                    ws.feed(json!({"op": "ack", "delivery_ids": chunk}).to_string()).await?;
                    received.acked += chunk.len() as u64;
                }
                pending_ids.clear();
            }
            AckMode::Confirmed => {
                if awaiting.is_none() {
                    if let Some(id) = unsent.pop_front() {
                        let req = next_req;
                        next_req += 1;
                        ws.feed(format!(r#"{{"op":"ack","delivery_id":"{id}","req":{req}}}"#)).await?;
                        awaiting = Some((req, Instant::now()));
                    }
                }
            }
        }
        ws.flush().await?;
        if plan.mode != AckMode::Confirmed {
            // Progress counts acks sent (confirmed mode counts ack_ok answers as they come).
            plan.progress.fetch_add(received.acked - acked_before, Ordering::Relaxed);
        }
        let received_all = match &plan.group {
            Some(_) => group_done(),
            None => received.distinct() >= plan.expect,
        };
        let done = received_all && (plan.mode != AckMode::Confirmed || (awaiting.is_none() && unsent.is_empty()));
        if done {
            break;
        }
    }
    finish(&mut ws, &mut received).await?;
    ws.close().await;
    Ok(ConsumerResult { received, latency_us })
}

/// One `ping` answered by its `pong` (a session that is idle otherwise).
pub async fn ping(ws: &mut Ws) -> anyhow::Result<()> {
    ws.send(Message::Text(r#"{"op":"ping","req":1}"#.into())).await?;
    loop {
        if next_json(ws).await?["type"] == "pong" {
            return Ok(());
        }
    }
}

/// Sends `ping` and waits for `pong`: every ack sent before it has been processed (frames of a
/// session are handled in order) and queued for the offset writer.
async fn finish(ws: &mut Connection, received: &mut Received) -> anyhow::Result<()> {
    ws.send(json!({"op": "ping", "req": "done"}).to_string()).await?;
    loop {
        let frame: Value = match ws.recv().await? {
            Incoming::Text(text) => serde_json::from_str(&text)?,
            Incoming::Closed(frame) => bail!("closed by the gateway: {frame}"),
        };
        match frame["type"].as_str() {
            Some("pong") => return Ok(()),
            Some("event") => {
                // A redelivery that raced the end: acknowledge it too.
                received.deliveries += 1;
                received.redeliveries += 1;
                let id = frame["delivery_id"].as_str().unwrap_or_default();
                ws.send(format!(r#"{{"op":"ack","delivery_id":"{id}"}}"#)).await?;
            }
            _ => {}
        }
    }
}

pub(crate) struct ScannedEvent<'a> {
    pub delivery_id: &'a str,
    pub partition: u32,
    pub offset: u64,
    pub attempt: u32,
    /// `t` of a paced event's payload `{"t":N,...}`: its publish time.
    pub published_ns: Option<u64>,
}

/// Reads the few fields the loadtest needs from an `event` frame as the gateway writes it
/// (`{"type":"event","delivery_id":"..","topic":"..","partition":N,"offset":N,"attempt":N,...`);
/// `None` for anything else, which then goes through the JSON parser.
pub(crate) fn scan_event(text: &str) -> Option<ScannedEvent<'_>> {
    let rest = text.strip_prefix(r#"{"type":"event","delivery_id":""#)?;
    let (delivery_id, rest) = rest.split_once('"')?;
    let number = |rest: &str, field: &str| -> Option<u64> {
        let at = rest.find(field)? + field.len();
        let digits: &str = &rest[at..];
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        digits[..end].parse().ok()
    };
    let after_topic = &rest[rest.find(r#","partition":"#)?..];
    Some(ScannedEvent {
        delivery_id,
        partition: number(after_topic, r#""partition":"#)? as u32,
        offset: number(after_topic, r#""offset":"#)?,
        attempt: number(after_topic, r#""attempt":"#)? as u32,
        published_ns: number(after_topic, r#""payload":{"t":"#),
    })
}
