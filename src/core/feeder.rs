//! Feeders: one task per partition of a subscription that hands events to its session in offset
//! order, with room in the session's in-flight window for each. When the window is full the feeder waits, and
//! nothing more is pushed to that session.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::backend::Event;
use super::names::TopicName;
use super::reader::ReaderLease;
use super::window::{Window, WindowPermit};

/// An event handed to a session, holding one slot of its in-flight window.
pub struct Fed {
    /// Which subscription of the session it belongs to (events of an ended one are dropped).
    pub subscription: u64,
    pub topic: TopicName,
    pub event: Arc<Event>,
    pub permit: WindowPermit,
}

/// Where and how one feeder reads.
pub struct FeedPlan {
    /// Held for as long as the feeder runs: the reader stops when its last feeder does.
    pub reader: ReaderLease,
    /// First offset to hand over.
    pub from: u64,
    pub batch: usize,
    pub subscription: u64,
    pub topic: TopicName,
}

/// Runs until `cancel` fires or the session's channel closes.
pub async fn feed_partition(plan: FeedPlan, window: Arc<Window>, tx: mpsc::Sender<Fed>, cancel: CancellationToken) {
    let FeedPlan { reader, from: mut next, batch, subscription, topic } = plan;
    loop {
        let fetched = tokio::select! {
            _ = cancel.cancelled() => return,
            fetched = reader.fetch(next, batch) => fetched,
        };
        let events = match fetched {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(%topic, error = %e, "reading for a subscriber failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        for event in events {
            if event.offset < next {
                continue;
            }
            // Room at once is the common case: take it without arming a cancellation waiter.
            let permit = match window.try_acquire(event.payload.len()) {
                Some(permit) => permit,
                None => tokio::select! {
                    _ = cancel.cancelled() => return,
                    permit = window.acquire(event.payload.len()) => match permit {
                        Some(permit) => permit,
                        None => return,
                    },
                },
            };
            next = event.offset + 1;
            let fed = Fed { subscription, topic: topic.clone(), event, permit };
            if tx.send(fed).await.is_err() {
                return;
            }
        }
    }
}
