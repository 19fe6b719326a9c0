//! `--client-engine multiplexed`: consumers without a task each. One engine task per worker
//! thread drives its share of the WebSockets: it reads whichever sockets are ready (one wake-up
//! of the engine for all of them), reads only the fields the check needs from each event frame
//! (`client::scan_event`), queues each socket's acks and writes every socket that has some once
//! per pass. So a broadcast's latency measures the gateway more than 10,000 client tasks on the
//! same two cores. The task-per-client engine (`client::consume`) stays the default: it is the
//! browser-like one (each tab its own event loop).
//!
//! Supported: WebSocket consumers of a fan-out or broadcast acking each event (`--ack each`).

use std::sync::atomic::Ordering;

use anyhow::{bail, Context};
use futures_util::stream::{SelectAll, SplitSink};
use futures_util::{FutureExt, SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{scan_event, ConsumerPlan, ConsumerResult, Received, Ws};

/// Messages handled in one pass before the dirty sockets are written.
const PASS_MESSAGES: usize = 4096;

/// Where one consumer stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Receiving,
    /// Got every event; its closing `ping` is out, waiting for the `pong` (every ack before it was
    /// handled by its session).
    Finishing,
    Done,
}

struct Consumer {
    plan: ConsumerPlan,
    sink: SplitSink<Ws, Message>,
    received: Received,
    latency_us: Histogram<u64>,
    stage: Stage,
    /// Frames queued since the last write.
    dirty: bool,
}

/// Consumes every socket with `engines` engine tasks (socket `i` on engine `i % engines`);
/// results in the order of `consumers`.
pub async fn consume_all(consumers: Vec<(ConsumerPlan, Ws)>, engines: usize) -> anyhow::Result<Vec<ConsumerResult>> {
    let engines = engines.max(1);
    let total = consumers.len();
    let mut shares: Vec<Vec<(usize, ConsumerPlan, Ws)>> = (0..engines).map(|_| Vec::new()).collect();
    for (i, (plan, ws)) in consumers.into_iter().enumerate() {
        shares[i % engines].push((i, plan, ws));
    }
    let tasks: Vec<_> = shares.into_iter().map(|share| tokio::spawn(engine(share))).collect();
    let mut results: Vec<Option<ConsumerResult>> = (0..total).map(|_| None).collect();
    for task in tasks {
        for (i, result) in task.await?? {
            results[i] = Some(result);
        }
    }
    Ok(results.into_iter().map(|r| r.expect("every consumer reports")).collect())
}

async fn engine(share: Vec<(usize, ConsumerPlan, Ws)>) -> anyhow::Result<Vec<(usize, ConsumerResult)>> {
    let mut consumers = Vec::with_capacity(share.len());
    let mut indexes = Vec::with_capacity(share.len());
    let mut incoming = SelectAll::new();
    for (slot, (index, plan, ws)) in share.into_iter().enumerate() {
        let (sink, stream) = ws.split();
        incoming.push(stream.map(move |message| (slot, message)));
        consumers.push(Consumer {
            plan,
            sink,
            received: Received::default(),
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            stage: Stage::Receiving,
            dirty: false,
        });
        indexes.push(index);
    }
    for c in &mut consumers {
        let mut subscribe = json!({"op": "subscribe", "topic": c.plan.topic, "req": "sub"});
        if let Some(from) = c.plan.from {
            subscribe["from"] = json!(from);
        }
        c.sink.send(Message::Text(subscribe.to_string().into())).await?;
    }
    let mut left = consumers.len();
    while left > 0 {
        let Some(first) = incoming.next().await else { bail!("every socket ended with {left} consumers unfinished") };
        let mut next = Some(first);
        let mut handled = 0;
        // Everything already readable is handled before the writes.
        while let Some((slot, message)) = next.take() {
            handled += 1;
            if handled < PASS_MESSAGES {
                next = incoming.next().now_or_never().flatten();
            }
            let c = &mut consumers[slot];
            let text = match message.with_context(|| format!("{}: reading", c.plan.client_id))? {
                Message::Text(text) => text,
                Message::Close(frame) => bail!("{}: closed by the gateway: {frame:?}", c.plan.client_id),
                _ => continue,
            };
            if on_text(c, text.as_str())? {
                left -= 1;
            }
        }
        for c in consumers.iter_mut().filter(|c| c.dirty) {
            c.dirty = false;
            c.sink.flush().await?;
        }
    }
    let mut results = Vec::with_capacity(consumers.len());
    for (c, index) in consumers.into_iter().zip(indexes) {
        results.push((index, ConsumerResult { received: c.received, latency_us: c.latency_us }));
    }
    Ok(results)
}

/// Handles one frame of a consumer; true when the consumer finished with it.
fn on_text(c: &mut Consumer, text: &str) -> anyhow::Result<bool> {
    if let Some(event) = scan_event(text) {
        if let (Some(since), Some(t)) = (c.plan.paced_since, event.published_ns) {
            c.latency_us.saturating_record((since.elapsed().as_nanos() as u64).saturating_sub(t) / 1000);
        }
        c.received.deliveries += 1;
        if event.attempt > 1 {
            c.received.redeliveries += 1;
        }
        c.received.offsets.entry(event.partition).or_default().insert(event.offset);
        queue(c, format!(r#"{{"op":"ack","delivery_id":"{}"}}"#, event.delivery_id))?;
        c.received.acked += 1;
        c.plan.progress.fetch_add(1, Ordering::Relaxed);
        if c.stage == Stage::Receiving && c.received.distinct() >= c.plan.expect {
            c.stage = Stage::Finishing;
            queue(c, json!({"op": "ping", "req": "done"}).to_string())?;
        }
        return Ok(false);
    }
    let frame: Value = serde_json::from_str(text).with_context(|| format!("bad frame {text}"))?;
    match frame["type"].as_str().unwrap_or_default() {
        "subscribed" => {
            c.plan.subscribed.fetch_add(1, Ordering::Relaxed);
        }
        "pong" if c.stage == Stage::Finishing => {
            c.stage = Stage::Done;
            return Ok(true);
        }
        "pong" | "progress" => {}
        // No retry of a subscribe answered `unavailable` here: the task-per-client engine has it.
        _ => bail!("{}: unexpected frame {text}", c.plan.client_id),
    }
    Ok(false)
}

/// Queues a frame on the consumer's socket, written at the end of the pass.
fn queue(c: &mut Consumer, text: String) -> anyhow::Result<()> {
    // `start_send` of tungstenite's sink only buffers (the write happens at flush); the sink is
    // always ready between flushes.
    match c.sink.feed(Message::Text(text.into())).now_or_never() {
        Some(result) => result?,
        None => bail!("{}: the socket's write buffer is full", c.plan.client_id),
    }
    c.dirty = true;
    Ok(())
}
