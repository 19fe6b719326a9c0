//! Feeders: what hands one partition's events to a session in offset order, with room in the
//! session's in-flight window for each. When the window is full the feeder waits, and nothing
//! more is pushed to that session. A feeder reserves its window's room before it reads and reads
//! only as many events and bytes as the reservation holds: what a session's feeders hold is within
//! its window (docs/operations.md, "Memory bounds").
//!
//! A feeder is a task only while it reads or waits for room. At the head of the log it parks with
//! its partition's reader and its task ends (`PartitionReader::park`): the reader pushes each new
//! event to the session itself, with room taken in its window, and starts a feeder task again only
//! when a push cannot be made whole (no room, a full channel, more events than one batch). One
//! event to many sessions is then one wake-up per session, not two (issue 41), and a session
//! waiting at the head holds no task per partition (issue 57: a parked feeder task was about a
//! kilobyte per partition of every idle session).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::Event;
use super::names::TopicName;
use super::reader::{HeadSubscriber, PartitionReader, ReadRoom, ReaderLease};
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
    /// Kept by the session (`PartitionFeed`) for as long as the subscription lasts: the reader
    /// stops when its last subscription does.
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

/// Where the session receives what its feeders hand over, and what ends them.
pub struct FeedTarget {
    pub window: Arc<Window>,
    pub tx: mpsc::Sender<FedBatch>,
    /// The subscription's token: cancelled when it ends (`Subscription`'s drop).
    pub cancel: CancellationToken,
    /// Where feeder tasks are counted, so that shutdown waits for them.
    pub tasks: TaskTracker,
}

/// One partition of a subscription, held by the session: its hold on the reader and where its
/// feeder stands. Dropped when the subscription ends: its token is cancelled then (a running
/// feeder task stops), and a feeder parked at the reader is taken out of its list (a parked
/// feeder has no task that could notice the cancellation).
pub struct PartitionFeed {
    cursor: Arc<FeedCursor>,
    _lease: ReaderLease,
}

impl Drop for PartitionFeed {
    fn drop(&mut self) {
        self.cursor.target.cancel.cancel();
        let subscriber: Arc<dyn HeadSubscriber> = self.cursor.clone();
        self.cursor.reader.close_parked(&subscriber);
    }
}

/// A feeder's state, shared by its task (while it runs) and its place among the reader's parked
/// (while it is parked): what a push needs to hand events to the session, and where the feeder
/// goes on from when it runs again.
struct FeedCursor {
    reader: Arc<PartitionReader>,
    /// The next offset to hand over: moved on by each push, read when the task starts again.
    next: AtomicU64,
    /// `Readers::truncations` as this feeder last knew it.
    known_truncations: AtomicU64,
    target: FeedTarget,
    subscription: u64,
    topic: TopicName,
    partition: u32,
    batch: usize,
    /// Set by `PartitionFeed`'s drop, under the reader's parked list's lock: never parked or
    /// pushed to again.
    closed: AtomicBool,
}

impl FeedCursor {
    fn new_batch(&self, capacity: usize) -> FedBatch {
        Box::new(Fed {
            subscription: self.subscription,
            topic: self.topic.clone(),
            partition: self.partition,
            gap: None,
            truncated: None,
            events: Vec::with_capacity(capacity),
        })
    }
}

impl HeadSubscriber for FeedCursor {
    fn push(&self, events: &[Arc<Event>]) -> bool {
        let Some(mut reservation) = self.target.window.try_reserve(self.batch.min(events.len())) else {
            return false;
        };
        let mut fed = self.new_batch(events.len().min(self.batch));
        for event in events {
            let Some(permit) = reservation.take(event.size_bytes()) else { break };
            fed.events.push((event.clone(), permit));
        }
        drop(reservation);
        let (taken, next) = match fed.events.last() {
            Some((last, _)) => (fed.events.len(), last.offset + 1),
            None => (0, 0),
        };
        // No room, or the session's channel is full (or closed): the feeder goes on from where
        // it stands, and reads these events from the ring.
        if taken == 0 || self.target.tx.try_send(fed).is_err() {
            return false;
        }
        self.next.store(next, Ordering::SeqCst);
        taken == events.len()
    }

    fn unparked(self: Arc<Self>) {
        if !self.is_gone() {
            self.target.tasks.clone().spawn(feed_partition(self));
        }
    }

    fn is_gone(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.target.cancel.is_cancelled()
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
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

/// Starts feeding one partition of a subscription: the session keeps the returned feed for as
/// long as the subscription lasts.
pub fn start_feed(plan: FeedPlan, target: FeedTarget) -> PartitionFeed {
    let FeedPlan { reader, partition, from, batch, subscription, topic, truncations } = plan;
    let cursor = Arc::new(FeedCursor {
        reader: reader.shared(),
        next: AtomicU64::new(from),
        known_truncations: AtomicU64::new(truncations),
        target,
        subscription,
        topic,
        partition,
        batch,
        closed: AtomicBool::new(false),
    });
    cursor.target.tasks.clone().spawn(feed_partition(cursor.clone()));
    PartitionFeed { cursor, _lease: reader }
}

/// A feeder's task: reads from where its cursor stands until it parks at the reader (the task
/// ends; the reader starts it again when it unparks it), the subscription ends, or the session's
/// channel closes.
async fn feed_partition(cursor: Arc<FeedCursor>) {
    let (reader, window, tx, cancel) = (&cursor.reader, &cursor.target.window, &cursor.target.tx, &cursor.target.cancel);
    let (topic, partition, batch) = (&cursor.topic, cursor.partition, cursor.batch);
    let mut next = cursor.next.load(Ordering::SeqCst);
    let mut known_truncations = cursor.known_truncations.load(Ordering::SeqCst);
    // The size of the next event when the last read found it too large for the room reserved:
    // the feeder waits for that much room, then reads it again (holding it meanwhile, each of a
    // session's feeders would pin an event outside its window).
    let mut next_bytes = 1;
    loop {
        if cursor.is_gone() {
            return;
        }
        // At the end of the ring with room in the window: parked, the reader pushes what comes
        // next (see `FeedCursor::push`), until it unparks this feeder and starts its task again.
        if next_bytes == 1 && window.free_slots() > 0 {
            cursor.next.store(next, Ordering::SeqCst);
            cursor.known_truncations.store(known_truncations, Ordering::SeqCst);
            if reader.park(next, known_truncations, cursor.clone()) {
                return;
            }
        }
        // Read only what the window has room for, reserved before the read: events never wait
        // outside the window (a whole fetch of large events, held per subscriber, was how a few
        // clients that stop reading pinned gigabytes).
        let mut room = FeederRoom { window, batch, reservation: None };
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
                let mut fed = cursor.new_batch(0);
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
        let mut fed = cursor.new_batch(events.len());
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
