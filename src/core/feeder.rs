//! Feeders: one task per partition of a subscription that hands events to its session in offset
//! order, one in-flight window slot per event. When the window is full the feeder waits, and
//! nothing more is pushed to that session.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::backend::Event;
use super::names::TopicName;
use super::reader::PartitionReader;

/// An event handed to a session, holding one slot of its in-flight window.
pub struct Fed {
    /// Which subscription of the session it belongs to (events of an ended one are dropped).
    pub subscription: u64,
    pub topic: TopicName,
    pub event: Arc<Event>,
    pub permit: OwnedSemaphorePermit,
}

/// Where and how one feeder reads.
pub struct FeedPlan {
    pub reader: Arc<PartitionReader>,
    /// First offset to hand over.
    pub from: u64,
    pub batch: usize,
    pub subscription: u64,
    pub topic: TopicName,
}

/// Runs until `cancel` fires or the session's channel closes.
pub async fn feed_partition(plan: FeedPlan, window: Arc<Semaphore>, tx: mpsc::Sender<Fed>, cancel: CancellationToken) {
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
            // A free slot is the common case: take it without arming a cancellation waiter.
            let permit = match window.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => tokio::select! {
                    _ = cancel.cancelled() => return,
                    permit = window.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
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
