//! Feeders: one task per partition of a subscription that hands events to its session in offset
//! order, with room in the session's in-flight window for each. When the window is full the
//! feeder waits, and nothing more is pushed to that session. A feeder reserves its window's room
//! before it reads and reads only as many events and bytes as the reservation holds: what a
//! session's feeders hold is within its window (docs/operations.md, "Memory bounds").
//!
//! At the head of the log a feeder parks with its partition's reader instead (`Parked`): the
//! reader pushes each new event to every parked feeder's session itself, with room taken in its
//! window, and wakes the feeder only when a push cannot be made whole (no room, a full channel,
//! more events than one batch). One event to many sessions is then one wake-up per session, not
//! two (issue 41, push fan-out).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::backend::Event;
use super::names::TopicName;
use super::reader::{HeadSubscriber, ReadRoom, ReaderLease};
use super::window::{Reservation, Window, WindowPermit};

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

/// The room one read of a feeder may fill: its window's free room, reserved only once the reader
/// has events to hand over (`PartitionReader::fetch_within`).
struct FeederRoom<'a> {
    window: &'a Window,
    batch: usize,
    reservation: Option<Reservation>,
}

impl ReadRoom for FeederRoom<'_> {
    fn take(&mut self) -> Option<(usize, usize)> {
        self.reservation = self.window.try_reserve(self.batch);
        let (slots, bytes) = self.reservation.as_ref()?.room();
        Some((slots, usize::try_from(bytes).unwrap_or(usize::MAX)))
    }

    fn give_back(&mut self) {
        self.reservation = None;
    }
}

/// A feeder parked at its reader's end (`PartitionReader::park`): where it stands, and what a
/// push needs to hand events to its session.
struct Parked {
    /// The next offset to hand over: moved on by each push.
    next: AtomicU64,
    window: Arc<Window>,
    tx: mpsc::Sender<FedBatch>,
    subscription: u64,
    topic: TopicName,
    partition: u32,
    batch: usize,
    woken: Notify,
    gone: AtomicBool,
}

impl HeadSubscriber for Parked {
    fn push(&self, events: &[Arc<Event>]) -> bool {
        let Some(mut reservation) = self.window.try_reserve(self.batch.min(events.len())) else {
            self.wake();
            return false;
        };
        let mut fed = Box::new(Fed {
            subscription: self.subscription,
            topic: self.topic.clone(),
            partition: self.partition,
            gap: None,
            truncated: None,
            events: Vec::with_capacity(events.len().min(self.batch)),
        });
        for event in events {
            let Some(permit) = reservation.take(event.size_bytes()) else { break };
            fed.events.push((event.clone(), permit));
        }
        drop(reservation);
        let (taken, next) = match fed.events.last() {
            Some((last, _)) => (fed.events.len(), last.offset + 1),
            None => (0, 0),
        };
        if taken == 0 || self.tx.try_send(fed).is_err() {
            // No room, or the session's channel is full (or closed): the feeder waits for it,
            // then reads these events from the ring.
            self.wake();
            return false;
        }
        self.next.store(next, Ordering::SeqCst);
        if taken < events.len() {
            self.wake();
            return false;
        }
        true
    }

    fn wake(&self) {
        self.woken.notify_one();
    }

    fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }
}

/// Marks a parked feeder gone when its task stops (cancelled while parked).
struct GoneOnDrop<'a>(&'a Parked);

impl Drop for GoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.gone.store(true, Ordering::Relaxed);
    }
}

/// Runs until `cancel` fires or the session's channel closes.
pub async fn feed_partition(plan: FeedPlan, window: Arc<Window>, tx: mpsc::Sender<FedBatch>, cancel: CancellationToken) {
    let FeedPlan { reader, partition, from: mut next, batch, subscription, topic, truncations: mut known_truncations } = plan;
    let new_batch =
        |capacity: usize| Box::new(Fed { subscription, topic: topic.clone(), partition, gap: None, truncated: None, events: Vec::with_capacity(capacity) });
    // The size of the next event when the last read found it too large for the room reserved:
    // the feeder waits for that much room, then reads it again (holding it meanwhile, each of a
    // session's feeders would pin an event outside its window).
    let mut next_bytes = 1;
    let parked = Arc::new(Parked {
        next: AtomicU64::new(next),
        window: window.clone(),
        tx: tx.clone(),
        subscription,
        topic: topic.clone(),
        partition,
        batch,
        woken: Notify::new(),
        gone: AtomicBool::new(false),
    });
    let _gone = GoneOnDrop(&parked);
    loop {
        // At the end of the ring with room in the window: parked, the reader pushes what comes
        // next (see `Parked`), until it wakes this feeder.
        if next_bytes == 1 && window.free_slots() > 0 {
            parked.next.store(next, Ordering::SeqCst);
            if let Some(place) = reader.park(next, known_truncations, parked.clone()) {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = parked.woken.notified() => {}
                }
                drop(place);
                next = parked.next.load(Ordering::SeqCst);
                continue;
            }
        }
        // Read only what the window has room for, reserved before the read: events never wait
        // outside the window (a whole fetch of large events, held per subscriber, was how a few
        // clients that stop reading pinned gigabytes).
        let mut room = FeederRoom { window: &window, batch, reservation: None };
        let fetched = tokio::select! {
            _ = cancel.cancelled() => return,
            fetched = async {
                window.room_for(next_bytes).await;
                reader.fetch_within(next, &mut room, &mut known_truncations).await
            } => fetched,
        };
        let mut reservation = room.reservation.take();
        let events = match fetched {
            Ok(events) => events,
            Err(super::backend::BackendError::Truncated { log_end, .. }) => {
                drop(reservation);
                let mut fed = new_batch(0);
                fed.truncated = Some(log_end);
                let _ = tx.send(fed).await;
                return;
            }
            Err(e) => {
                drop(reservation);
                tracing::warn!(%topic, error = %e, "reading for a subscriber failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        let mut fed = new_batch(events.len());
        // A read that starts above where this feeder stands skipped offsets: retention took
        // them when they are below the log start (else they never existed: Kafka's transaction
        // markers and compaction leave holes, which are no gap).
        if let Some(first) = events.first().filter(|e| e.offset > next) {
            match reader.log_start().await {
                Ok(log_start) if log_start > next => fed.gap = Some((next, log_start.min(first.offset))),
                Ok(_) => {}
                Err(e) => tracing::debug!(%topic, partition, error = %e, "reading the log start after a skip failed; no gap reported"),
            }
            // Reported once, even when none of these events fits yet.
            if let Some((_, to)) = fed.gap {
                next = to;
            }
        }
        next_bytes = 1;
        for event in events {
            if event.offset < next {
                continue;
            }
            // A read returns its first event even when it is larger than the room: it waits
            // for its room, and is read again then.
            let Some(permit) = reservation.as_mut().and_then(|r| r.take(event.size_bytes())) else {
                next_bytes = event.size_bytes();
                break;
            };
            next = event.offset + 1;
            fed.events.push((event, permit));
        }
        // What the read did not fill goes back before the batch waits on the channel.
        drop(reservation);
        if (!fed.events.is_empty() || fed.gap.is_some()) && tx.send(fed).await.is_err() {
            return;
        }
    }
}
