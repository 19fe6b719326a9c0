//! Feeders: one task per partition of a subscription that hands events to its session in offset
//! order, with room in the session's in-flight window for each. When the window is full the
//! feeder waits, and nothing more is pushed to that session. A feeder reads only once the window
//! has room, and only as many events and bytes as it has room for: what a session's feeders hold
//! outside its window is at most one window's worth each (README, "Memory bounds").

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::backend::Event;
use super::names::TopicName;
use super::reader::ReaderLease;
use super::window::{Window, WindowPermit};

/// Events of one partition handed to a session in offset order, each holding one slot of its
/// in-flight window. A batch per fetch, not an event per send: one channel operation and one
/// clock read per batch on the session's side.
pub struct Fed {
    /// Which subscription of the session it belongs to (events of an ended one are dropped).
    pub subscription: u64,
    pub topic: TopicName,
    pub partition: u32,
    /// Offsets `from`..`to`-1 that retention removed before this feeder read them: the session
    /// tells its client (a `gap` frame) before these events.
    pub gap: Option<(u64, u64)>,
    /// The partition's log was found to end here, below this feeder's position: the events the
    /// session holds from there on are gone, and the feeder has stopped (the session closes, so
    /// that its client resubscribes at the new end).
    pub truncated: Option<u64>,
    pub events: Vec<(Arc<Event>, WindowPermit)>,
}

/// A `Fed` as it crosses the channel. Boxed because a tokio channel allocates its first block of
/// 32 slots when it is created: every session, idle or not, paid 32 x 56 bytes for unboxed
/// batches (heaptrack, README "Where the memory goes"); one allocation per batch costs less.
pub type FedBatch = Box<Fed>;

/// Where and how one feeder reads.
pub struct FeedPlan {
    /// Held for as long as the feeder runs: the reader stops when its last feeder does.
    pub reader: ReaderLease,
    pub partition: u32,
    /// First offset to hand over.
    pub from: u64,
    pub batch: usize,
    pub subscription: u64,
    pub topic: TopicName,
    /// `Readers::truncations` when the subscription was planned: a truncation found after it
    /// reaches this feeder (`PartitionReader::fetch`).
    pub truncations: u64,
}

/// Runs until `cancel` fires or the session's channel closes.
pub async fn feed_partition(plan: FeedPlan, window: Arc<Window>, tx: mpsc::Sender<FedBatch>, cancel: CancellationToken) {
    let FeedPlan { reader, partition, from: mut next, batch, subscription, topic, truncations: mut known_truncations } = plan;
    let new_batch =
        |capacity: usize| Box::new(Fed { subscription, topic: topic.clone(), partition, gap: None, truncated: None, events: Vec::with_capacity(capacity) });
    loop {
        // Read only what the window has room for, once it has some: events never wait outside
        // the window in bulk (a whole fetch of large events, held per subscriber, was how a
        // few clients that stop reading pinned gigabytes).
        let fetched = tokio::select! {
            _ = cancel.cancelled() => return,
            fetched = async {
                window.room().await;
                let (slots, bytes) = (window.free_slots().clamp(1, batch), window.free_bytes().max(1));
                reader.fetch(next, slots, usize::try_from(bytes).unwrap_or(usize::MAX), &mut known_truncations).await
            } => fetched,
        };
        let events = match fetched {
            Ok(events) => events,
            Err(super::backend::BackendError::Truncated { log_end }) => {
                let mut fed = new_batch(0);
                fed.truncated = Some(log_end);
                let _ = tx.send(fed).await;
                return;
            }
            Err(e) => {
                tracing::warn!(%topic, error = %e, "reading for a subscriber failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        // Sized for the room there is: with a full window a batch carries one event or a few.
        let mut fed = new_batch(events.len().min(window.free_slots()));
        // A read that starts above where this feeder stands skipped offsets: retention took
        // them when they are below the log start (else they never existed: Kafka's transaction
        // markers and compaction leave holes, which are no gap).
        if let Some(first) = events.first().filter(|e| e.offset > next) {
            match reader.log_start().await {
                Ok(log_start) if log_start > next => fed.gap = Some((next, log_start.min(first.offset))),
                Ok(_) => {}
                Err(e) => tracing::debug!(%topic, partition, error = %e, "reading the log start after a skip failed; no gap reported"),
            }
        }
        for event in events {
            if event.offset < next {
                continue;
            }
            // Room at once is the common case: take it without arming a cancellation waiter.
            let permit = match window.try_acquire(event.size_bytes()) {
                Some(permit) => permit,
                None => {
                    // The window is full: hand over what this batch has so far (the session
                    // cannot free room for events it has not seen), then wait.
                    if !fed.events.is_empty() {
                        let full = std::mem::replace(&mut fed, new_batch(0));
                        if tx.send(full).await.is_err() {
                            return;
                        }
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        permit = window.acquire(event.size_bytes()) => permit,
                    }
                }
            };
            next = event.offset + 1;
            fed.events.push((event, permit));
        }
        if !fed.events.is_empty() && tx.send(fed).await.is_err() {
            return;
        }
    }
}
