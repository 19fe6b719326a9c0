//! Partition readers: one per `topic#partition` on this instance, shared by its subscribers.
//!
//! A reader pulls at the backend-managed cursor (`ReadFrom::PullCursor`, the pull layer) only while some
//! subscriber waits at the end of what was pulled, and keeps the last `capacity` events in a ring
//! buffer. Subscribers read from the buffer; one that is behind the buffer (slow, or starting from
//! an older committed offset) or ahead of it reads the log directly by offset (a catch-up read).
//! So a slow client never holds back the others, and memory per partition stays bounded: the
//! ring by `delivery.reader_buffer_events` and `delivery.reader_buffer_bytes`, a catch-up read by
//! what its subscriber's window has room for.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::{BackendError, Event, LogBackend, ReadFrom};
use super::log_end;
use super::names::{TopicName, TopicPartition};
use super::offsets::OffsetStore;
use super::waiting::WaitingGuard;

/// How long one long poll of the backend waits for new events.
const PULL_WAIT: Duration = Duration::from_millis(500);
/// The pause before a reader that panicked starts again.
const READER_RESTART_PAUSE: Duration = Duration::from_secs(1);
/// An empty poll answered sooner than this (a broker that refuses the long poll: RocketMQ's POP
/// with a skewed clock answers at once) is followed by a pause of as long: never a busy loop.
const EMPTY_POLL_FLOOR: Duration = Duration::from_millis(50);
/// How long a subscriber waits at the end before looking again on its own.
const FETCH_RECHECK: Duration = Duration::from_millis(1000);
/// Events in a partition's first read by offset, before any size is known: its sizes tell how
/// many the byte budget allows next.
const FIRST_READ_EVENTS: usize = 16;

struct Buffer {
    /// Every event with an offset in `[covered_from, covered_to)` is in `events` (a log with
    /// offset gaps simply has fewer events). `covered_to` is the pull cursor.
    covered_from: u64,
    covered_to: u64,
    events: VecDeque<Arc<Event>>,
    /// Payload bytes of `events`.
    bytes: usize,
    /// When the log was last found to end below the pull cursor (`PartitionReader::truncate`),
    /// as a count of `Readers::truncations` (0: never), and where it ended then: a subscriber
    /// planned before that and standing above that end has nothing left to wait for there.
    truncations: u64,
    truncated_to: u64,
}

impl Buffer {
    /// Drops the oldest events while over either bound (the newest always stays).
    fn trim(&mut self, max_events: usize, max_bytes: usize) {
        while self.events.len() > max_events || (self.bytes > max_bytes && self.events.len() > 1) {
            let Some(oldest) = self.events.pop_front() else { break };
            self.bytes -= oldest.size_bytes();
            self.covered_from = self.events.front().map_or(self.covered_to, |e| e.offset);
        }
    }

    /// Average payload size, for sizing the next pull (1 when empty).
    fn average_event_bytes(&self) -> usize {
        (self.bytes / self.events.len().max(1)).max(1)
    }
}

/// Events taken in order until `max_events`, or until the next one would pass `max_bytes` (the
/// first always goes, whatever its size: an event larger than the budget goes alone).
/// The room a subscriber's read may fill (`PartitionReader::fetch_within`), taken only once
/// there is something to read: a subscriber waiting at the head of its partition holds none.
pub trait ReadRoom: Send {
    /// Events and bytes the read may return now (its first event even when larger); `None`: no
    /// room now, and the read returns nothing.
    fn take(&mut self) -> Option<(usize, usize)>;
    /// The read found nothing after all: the room goes back before the reader waits.
    fn give_back(&mut self);
}

/// A fixed room: `(events, bytes)`.
impl ReadRoom for (usize, usize) {
    fn take(&mut self) -> Option<(usize, usize)> {
        Some(*self)
    }

    fn give_back(&mut self) {}
}

fn take_within<I: Iterator<Item = Arc<Event>>>(events: I, max_events: usize, max_bytes: usize) -> Vec<Arc<Event>> {
    let mut taken = Vec::new();
    let mut bytes = 0usize;
    for event in events.take(max_events) {
        if !taken.is_empty() && bytes + event.size_bytes() > max_bytes {
            break;
        }
        bytes += event.size_bytes();
        taken.push(event);
    }
    taken
}

/// A subscriber parked at the ring's end (`PartitionReader::park`): the reader hands it the
/// events it appends there itself (push fan-out), so an event reaches a session with no wake-up
/// of a task per subscriber to go and fetch it. A parked feeder (`core::feeder`) has no task
/// meanwhile: the reader starts one again (`unparked`) whenever a push cannot be made whole.
pub trait HeadSubscriber: Send + Sync {
    /// Events just appended, the first at the offset the subscriber parked at (or at which its
    /// last push ended). True: all taken, it stays parked. False: it took some or none, and the
    /// reader unparks it.
    fn push(&self, events: &[Arc<Event>]) -> bool;
    /// Taken out of the parked (a push it could not take whole, a truncation, the ring's range
    /// restarted): it goes on from where it stands. Called once per park, outside the reader's
    /// locks.
    fn unparked(self: Arc<Self>);
    /// Its subscription ended: never push to it again.
    fn is_gone(&self) -> bool;
    /// Marks it gone (`PartitionReader::close_parked`, under the parked list's lock).
    fn close(&self);
}

/// Parked subscribers.
type Parked = Mutex<Vec<Arc<dyn HeadSubscriber>>>;

/// The same subscriber (an address compare: two `dyn` pointers to one value may differ in
/// their vtable part).
fn same_subscriber(a: &Arc<dyn HeadSubscriber>, b: &Arc<dyn HeadSubscriber>) -> bool {
    std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>())
}

pub struct PartitionReader {
    tp: TopicPartition,
    backend: Arc<dyn LogBackend>,
    capacity: usize,
    /// Payload bytes the ring keeps at most (`delivery.reader_buffer_bytes`).
    capacity_bytes: usize,
    batch: usize,
    buffer: Mutex<Buffer>,
    /// Woken when new events enter the buffer.
    pulled: Notify,
    /// Woken when a subscriber waits at the end.
    demand: Notify,
    waiting: AtomicUsize,
    /// Of the `waiting`, those that wait at the log end ahead of the ring, by the offset they
    /// wait for. When every waiter is ahead (the pull cursor was left behind them by boot
    /// alignment, at an absent client's offset), the reader jumps to the lowest of them instead
    /// of pulling its way up to them with a wake-up of every one of them per pull (issue 21).
    ahead: Mutex<BTreeMap<u64, usize>>,
    pulled_events: metrics::Counter,
    /// Average payload size of the events read last (0: none yet): sizes the first read of a
    /// catch-up read to its byte budget.
    average_bytes: AtomicUsize,
    /// `Readers::truncations`, shared by every reader of this instance.
    truncations_found: Arc<AtomicU64>,
    /// Where a lost tail starts the partition's next log epoch (`truncate`).
    store: Arc<dyn OffsetStore>,
    /// Subscribers parked at the ring's end (`park`), pushed to by `append`; each is counted in
    /// `waiting` while it is here.
    parked: Parked,
}

impl PartitionReader {
    /// Parks `subscriber` at the ring's end when it stands there (`from` is where the ring ends,
    /// and no truncation it has not heard of came since `known_truncations`): from then on the
    /// events appended there are pushed to it (`HeadSubscriber`) until it is unparked. False: it
    /// does not stand at the end (it reads with `fetch_within`), or it is gone.
    pub fn park(&self, from: u64, known_truncations: u64, subscriber: Arc<dyn HeadSubscriber>) -> bool {
        let buffer = self.buffer.lock().unwrap();
        if from != buffer.covered_to || buffer.truncations > known_truncations {
            return false;
        }
        // Under the buffer's lock: an append either sees it parked, or ends the ring past `from`
        // after it (and the next push starts there). Under the parked list's lock: a subscriber
        // closed (`close_parked`) is either seen gone here or taken out there.
        let mut parked = self.parked_list();
        if subscriber.is_gone() {
            return false;
        }
        parked.push(subscriber);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        drop(parked);
        drop(buffer);
        self.demand.notify_one();
        true
    }

    /// Marks `subscriber` gone and takes it out of the parked, if it is there: its subscription
    /// ended, and nothing of it may stay counted as waiting (the reader would go on pulling).
    pub fn close_parked(&self, subscriber: &Arc<dyn HeadSubscriber>) {
        let mut parked = self.parked_list();
        subscriber.close();
        let before = parked.len();
        parked.retain(|p| !same_subscriber(p, subscriber));
        let removed = before - parked.len();
        drop(parked);
        self.waiting.fetch_sub(removed, Ordering::SeqCst);
    }

    /// Hands `events`, just appended at the ring's old end, to every parked subscriber; those
    /// that did not take them all are taken out and unparked. The list is moved out of its lock
    /// (taken under the buffer's lock, `append`), not copied, and the pushes run outside every
    /// lock: a fan-out to thousands holds no lock a feeder or a session waits on meanwhile.
    fn push_to_parked(&self, mut parked: Vec<Arc<dyn HeadSubscriber>>, events: &[Arc<Event>]) {
        let mut unparked = Vec::new();
        parked.retain(|subscriber| {
            let stays = !subscriber.is_gone() && subscriber.push(events);
            if !stays {
                unparked.push(subscriber.clone());
            }
            stays
        });
        // Back with those that parked meanwhile (at the new end). One closed meanwhile was not
        // in the list for `close_parked` to take out: it is seen gone here, under the lock it
        // was closed under, and unparked (its count dropped; no task starts for it).
        let mut list = self.parked_list();
        let newly = std::mem::replace(&mut *list, parked);
        list.extend(newly);
        list.retain(|subscriber| {
            let gone = subscriber.is_gone();
            if gone {
                unparked.push(subscriber.clone());
            }
            !gone
        });
        drop(list);
        self.unparked(unparked);
    }

    /// The parked list. A panic while it was held (none is expected: pushes run outside it)
    /// must not stop every later append and every session's end with it.
    fn parked_list(&self) -> std::sync::MutexGuard<'_, Vec<Arc<dyn HeadSubscriber>>> {
        self.parked.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Unparks every parked subscriber, to look again with `fetch_within`.
    fn unpark_all(&self) {
        let parked = std::mem::take(&mut *self.parked_list());
        self.unparked(parked);
    }

    /// `subscribers`, just taken out of the parked, no longer wait here.
    fn unparked(&self, subscribers: Vec<Arc<dyn HeadSubscriber>>) {
        self.waiting.fetch_sub(subscribers.len(), Ordering::SeqCst);
        for subscriber in subscribers {
            subscriber.unparked();
        }
    }

    /// The pull cursor as the reader sees it.
    pub fn pull_offset(&self) -> u64 {
        self.buffer.lock().unwrap().covered_to
    }

    /// The partition's first stored offset now.
    pub async fn log_start(&self) -> Result<u64, BackendError> {
        Ok(self.backend.log_bounds(&self.tp).await?.log_start)
    }

    /// Up to `max` events and about `max_bytes` of them (at least one event) from `from` on, in
    /// offset order; waits when there are none yet. `fetch_within` with a fixed room.
    pub async fn fetch(&self, from: u64, max: usize, max_bytes: usize, known_truncations: &mut u64) -> Result<Vec<Arc<Event>>, BackendError> {
        self.fetch_within(from, &mut (max, max_bytes), known_truncations).await
    }

    /// Events from `from` on, in offset order, as many as `room` has for them once there are
    /// some (at least one event, even when larger); waits when there are none yet, holding no
    /// room meanwhile. A subscriber reserves its window's room only when it reads, so a session's
    /// feeders never hold more than its window (issue 20, issue 40 item 3). Nothing when `room`
    /// has none.
    ///
    /// `known_truncations`: `Readers::truncations` as the caller last knew it (read before its
    /// start was planned). When the log was found to end below `from` since then, the answer is
    /// `BackendError::Truncated`:
    /// what the caller handed out from there on no longer exists, and the events the log writes
    /// next at those offsets are new ones.
    pub async fn fetch_within(&self, from: u64, room: &mut dyn ReadRoom, known_truncations: &mut u64) -> Result<Vec<Arc<Event>>, BackendError> {
        loop {
            let pulled = self.pulled.notified();
            tokio::pin!(pulled);
            pulled.as_mut().enable();
            let (direct, covered_to, _ahead) = {
                let buffer = self.buffer.lock().unwrap();
                if buffer.truncations > *known_truncations {
                    if from > buffer.truncated_to {
                        return Err(BackendError::Truncated { log_end: buffer.truncated_to, certain: true });
                    }
                    *known_truncations = buffer.truncations;
                }
                if from >= buffer.covered_from && from < buffer.covered_to {
                    let first = buffer.events.partition_point(|e| e.offset < from);
                    let Some((max, max_bytes)) = room.take() else { return Ok(Vec::new()) };
                    let events = take_within(buffer.events.range(first..).cloned(), max, max_bytes);
                    if !events.is_empty() {
                        return Ok(events);
                    }
                    room.give_back();
                    (false, buffer.covered_to, None)
                } else {
                    let direct = from != buffer.covered_to;
                    // Counted ahead under the buffer's lock, so a truncation (which takes it too)
                    // either is seen above or forgets this waiter (`truncate`); counted waiting
                    // first, so that the waiters ahead never seem to be all of them while one at
                    // the ring's end is not counted yet (`jump_to_waiters_ahead`).
                    let ahead = (direct && from > buffer.covered_to).then(|| (WaitingGuard::new(&self.waiting), AheadGuard::new(&self.ahead, from)));
                    (direct, buffer.covered_to, ahead)
                }
            };
            // Ahead of the ring, a subscriber waits for the shared reader, which pulls toward it
            // and jumps to it when every waiting subscriber is ahead (`jump_to_waiters_ahead`).
            // It never reads by offset from there: on Kafka each such read holds one of a few
            // catch-up consumers for at least a second, and a subscriber that started one
            // stayed ahead of the ring and read by offset again and again (seconds of delay at
            // the head after a restart, issue 21). Only a subscriber below the ring reads the
            // log by offset.
            if direct && from < covered_to {
                let Some((max, max_bytes)) = room.take() else { return Ok(Vec::new()) };
                let events = self.read_by_offset(from, max, max_bytes).await;
                if !matches!(&events, Ok(events) if events.is_empty()) {
                    return events;
                }
                room.give_back();
            }
            let _waiting = _ahead.is_none().then(|| WaitingGuard::new(&self.waiting));
            self.demand.notify_one();
            let _ = tokio::time::timeout(FETCH_RECHECK, pulled).await;
        }
    }

    /// A catch-up read from the log, within `max` events and about `max_bytes`: a small first
    /// read, then as many more as its sizes say fit, so a read of large events never holds a whole
    /// batch of them (256 events of 512 KiB were 128 MiB per subscriber).
    async fn read_by_offset(&self, from: u64, max: usize, max_bytes: usize) -> Result<Vec<Arc<Event>>, BackendError> {
        let mut taken: Vec<Arc<Event>> = Vec::new();
        // Sized by the sizes seen last: small events take one read, as before; large ones only
        // what fits.
        let first = match self.average_bytes.load(Ordering::Relaxed) {
            0 => FIRST_READ_EVENTS,
            average => (max_bytes / average).max(1),
        };
        let (mut next, mut bytes, mut chunk) = (from, 0usize, max.min(first));
        while taken.len() < max && chunk > 0 {
            let events = self.backend.poll(&self.tp, ReadFrom::Offset(next), chunk, Duration::ZERO).await?;
            let got = events.len();
            for event in events {
                if !taken.is_empty() && bytes + event.size_bytes() > max_bytes {
                    return Ok(taken);
                }
                bytes += event.size_bytes();
                next = event.offset + 1;
                taken.push(Arc::new(event));
            }
            if got < chunk || taken.is_empty() {
                break; // the end of what the log has now
            }
            let average = (bytes / taken.len()).max(1);
            self.average_bytes.store(average, Ordering::Relaxed);
            chunk = (max_bytes.saturating_sub(bytes) / average).min(max - taken.len());
        }
        Ok(taken)
    }

    /// `run`, started again a second after a panic (a bug in a backend's read, a record it
    /// chokes on): a reader that died would stall the partition for every subscriber, silently
    /// (issue 40, item 11). Counted in `ackgate_reader_restarts_total` and logged as an error.
    async fn run_supervised(self: Arc<Self>, cancel: CancellationToken, mut previous: Option<CancellationToken>) {
        use futures_util::FutureExt as _;
        loop {
            let run = std::panic::AssertUnwindSafe(self.clone().run(cancel.clone(), previous.take())).catch_unwind();
            let Err(panic) = run.await else { return };
            let why = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            super::metrics::reader_restarts().increment(1);
            tracing::error!(tp = %self.tp, panic = %why, "a partition reader panicked; it starts again in a second");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(READER_RESTART_PAUSE) => {}
            }
            // The run that died may have taken the waiters' wake-up with it.
            self.demand.notify_one();
        }
    }

    /// `previous`: finished once the previous reader of this partition has stopped. Its last
    /// poll may still move the cursor this reader was seeded from (issue 21), so this one starts
    /// pulling only after it, from the cursor as it is then.
    async fn run(self: Arc<Self>, cancel: CancellationToken, previous: Option<CancellationToken>) {
        if let Some(previous) = previous {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = previous.cancelled() => {}
            }
            self.start_at_cursor();
        }
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.demand.notified() => {}
            }
            while self.waiting.load(Ordering::SeqCst) > 0 && !cancel.is_cancelled() {
                self.jump_to_waiters_ahead();
                // Sized so that one pull of large events stays within a quarter of the ring's bytes.
                let (batch, covered_to) = {
                    let buffer = self.buffer.lock().unwrap();
                    ((self.capacity_bytes / 4 / buffer.average_event_bytes()).clamp(1, self.batch), buffer.covered_to)
                };
                // A cursor that is not where this ring ends was moved under it (see `append`).
                let moved = self.backend.pull_offset(&self.tp).is_some_and(|cursor| cursor != covered_to);
                let started = tokio::time::Instant::now();
                let polled = tokio::select! {
                    // A cancelled reader must not take another poll: the next generation of this
                    // partition's reader may already have started from the cursor.
                    biased;
                    _ = cancel.cancelled() => return,
                    polled = self.backend.poll(&self.tp, ReadFrom::PullCursor, batch, PULL_WAIT) => polled,
                };
                match polled {
                    Ok(events) if events.is_empty() => {
                        if started.elapsed() < EMPTY_POLL_FLOOR {
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(EMPTY_POLL_FLOOR) => {}
                            }
                        }
                    }
                    Ok(events) => {
                        self.pulled_events.increment(events.len() as u64);
                        self.append(events, moved)
                    }
                    Err(BackendError::Truncated { log_end, certain }) => {
                        // Read again a moment later before anything moves down (a broker may
                        // answer low for a moment); the wait is also the backoff, since a broker
                        // answers a read above its log end at once.
                        let lowered = tokio::select! {
                            _ = cancel.cancelled() => return,
                            lowered = self.confirm_truncation(log_end, certain) => lowered,
                        };
                        // Not cancellable: the new epoch and the cursor's move go together, or
                        // the next reader of the partition would meet the same loss again and
                        // step the epoch a second time for it.
                        if let Some(confirmed) = lowered {
                            self.truncate(confirmed).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(tp = %self.tp, error = %e, "pull failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
    }

    /// When every waiting subscriber waits ahead of the ring, at the log end (boot alignment
    /// left the pull cursor at an absent client's offset), the cursor and the ring move to the
    /// lowest of them: the shared reader serves the head at once, and a subscriber that later
    /// wants the range below reads it by offset, as any subscriber behind the ring does.
    fn jump_to_waiters_ahead(&self) {
        let lowest = {
            let ahead = self.ahead.lock().unwrap();
            let count: usize = ahead.values().sum();
            match ahead.first_key_value() {
                Some((lowest, _)) if count == self.waiting.load(Ordering::SeqCst) => *lowest,
                _ => return,
            }
        };
        let mut buffer = self.buffer.lock().unwrap();
        if lowest <= buffer.covered_to {
            return;
        }
        tracing::debug!(tp = %self.tp, from = buffer.covered_to, to = lowest, "every subscriber waits ahead of the pull cursor: it moves to them");
        self.backend.seek(&self.tp, lowest);
        buffer.events.clear();
        buffer.bytes = 0;
        buffer.covered_from = lowest;
        buffer.covered_to = lowest;
        drop(buffer);
        self.unpark_all();
        self.pulled.notify_waiters();
    }

    /// The log was found to end at `log_end`, below the pull cursor (a topic recreated outside
    /// ackgate, a failover to a replica behind). Confirmed by a second read (`core::log_end`),
    /// the cursor and the ring move down to the new end and every subscriber waiting above it
    /// is told (`fetch` answers `Truncated`): left alone, the reader would wait for the log to
    /// grow past the old cursor and every event written below it would be skipped. A `certain`
    /// loss (the broker refused the read as out of range) is not undone by a log that grew back
    /// past the cursor by the second read: the events written there since are new ones.
    async fn confirm_truncation(&self, log_end: u64, certain: bool) -> Option<u64> {
        let confirmed = match log_end::read_again(self.backend.as_ref(), std::slice::from_ref(&self.tp)).await {
            Ok(bounds) => bounds[0].log_end,
            Err(e) => {
                tracing::warn!(tp = %self.tp, error = %e, "reading the log end again after a read above it failed; retrying");
                return None;
            }
        };
        let lowered = {
            let buffer = self.buffer.lock().unwrap();
            // The lower of the two reads: what a recreated log wrote in the second between them
            // is new, and is read again rather than skipped.
            let lowered = confirmed.min(log_end);
            if lowered >= buffer.covered_to || (confirmed >= buffer.covered_to && !certain) {
                None
            } else {
                tracing::warn!(tp = %self.tp, cursor = buffer.covered_to, log_end = lowered, "the log ends below the pull cursor (truncated, or recreated outside ackgate): the cursor moves down to the end, and subscribers above it are closed to resubscribe");
                Some(lowered)
            }
        };
        if lowered.is_none() {
            log_end::transient(&self.tp, log_end, confirmed);
        }
        lowered
    }

    /// The log ends at `confirmed`, below the pull cursor: the epoch steps, then the cursor and
    /// the ring move down to the end and every subscriber hears of it.
    async fn truncate(&self, confirmed: u64) {
        // Before any subscriber hears of it, so that each reads the new epoch: one loss, one
        // step, whichever epoch the sessions that meet it planned in (a session from before an
        // earlier loss names an epoch the store has left, and stepped nothing).
        self.start_next_log_epoch(confirmed).await;
        let mut buffer = self.buffer.lock().unwrap();
        super::metrics::log_truncations().increment(1);
        self.backend.seek(&self.tp, confirmed);
        buffer.events.clear();
        buffer.bytes = 0;
        buffer.covered_from = confirmed;
        buffer.covered_to = confirmed;
        buffer.truncations = self.truncations_found.fetch_add(1, Ordering::SeqCst) + 1;
        buffer.truncated_to = confirmed;
        // Waiters above the end are gone once they look again: they must not draw the cursor
        // back up to them (`jump_to_waiters_ahead`) meanwhile.
        self.ahead.lock().unwrap().retain(|from, _| *from <= confirmed);
        drop(buffer);
        self.unpark_all();
        self.pulled.notify_waiters();
    }

    /// Records the lost tail as the partition's next log epoch, ending at `log_end`: every
    /// client of the partition that was away, or is served by another instance, learns of the
    /// loss at its next subscribe (issue 39, item 3). On the blocking pool; a store that fails is
    /// logged, and the partition stays in its epoch (offsets above the end are still lowered by
    /// the sessions that meet the loss).
    async fn start_next_log_epoch(&self, log_end: u64) {
        // Stepped from the current epoch, whoever stepped it last: a loss a subscribe recorded a
        // moment before is stepped once more (its tokens fenced: duplicates), but a loss is never
        // taken for one recorded earlier (a skip). Telling the two apart needs the epoch the pull
        // cursor was read in, kept with the cursor (review of 26209d0: an epoch read when the
        // reader starts is not it).
        let (store, tp) = (self.store.clone(), self.tp.clone());
        let stepped = tokio::task::spawn_blocking(move || {
            let seen = store.log_epoch(&tp)?.epoch;
            store.step_log_epoch(&tp, seen, log_end)
        })
        .await;
        match stepped {
            Ok(Ok(log)) => tracing::warn!(tp = %self.tp, log_end, log_epoch = log.epoch, "the partition's log lost its tail: a new log epoch"),
            Ok(Err(e)) => tracing::warn!(tp = %self.tp, error = %e, "could not record the partition's new log epoch after a lost tail"),
            Err(e) => tracing::warn!(tp = %self.tp, error = %e, "could not record the partition's new log epoch after a lost tail"),
        }
    }

    /// Moves an empty ring to where the pull cursor is now (a subscriber below it reads by
    /// offset), and lets waiting subscribers look again.
    fn start_at_cursor(&self) {
        let Some(cursor) = self.backend.pull_offset(&self.tp) else { return };
        let mut buffer = self.buffer.lock().unwrap();
        if buffer.events.is_empty() && buffer.covered_to != cursor {
            buffer.covered_from = cursor;
            buffer.covered_to = cursor;
        }
        drop(buffer);
        self.unpark_all();
        self.pulled.notify_waiters();
    }

    /// Adds pulled events; `moved`: the pull cursor was not where the ring ends when the poll
    /// began.
    fn append(&self, events: Vec<Event>, moved: bool) {
        let mut buffer = self.buffer.lock().unwrap();
        let first = events[0].offset;
        // The parked stand where the ring ends: they take these events only when they start
        // there (else a restarted range, or a hole of the log, which their feeders look at).
        let at_the_end = first == buffer.covered_to;
        if first < buffer.covered_to || (moved && first != buffer.covered_to) {
            // The cursor was moved under us: back (a seek), or ahead (a poll of the previous
            // reader of this partition, still in flight when this one started from the cursor,
            // moved it). The range restarts here: the ring claims only what it holds, so a
            // subscriber below `first` reads the log by offset instead of skipping to `first`.
            // A first offset above the ring's end from a cursor that was where the ring ends is
            // a gap of the log itself (Kafka compaction, transaction markers): nothing to read
            // there, and the range goes on.
            buffer.events.clear();
            buffer.bytes = 0;
            buffer.covered_from = first;
        }
        let last = events[events.len() - 1].offset;
        buffer.bytes += events.iter().map(|e| e.size_bytes()).sum::<usize>();
        let appended: Vec<Arc<Event>> = events.into_iter().map(Arc::new).collect();
        buffer.events.extend(appended.iter().cloned());
        buffer.covered_to = buffer.covered_to.max(last + 1);
        buffer.trim(self.capacity, self.capacity_bytes);
        self.average_bytes.store(buffer.average_event_bytes(), Ordering::Relaxed);
        // Taken under the buffer's lock: a subscriber parks under it too, so each parked one
        // either gets these events or parked after them (`park`).
        let parked = std::mem::take(&mut *self.parked_list());
        drop(buffer);
        if at_the_end {
            self.push_to_parked(parked, &appended);
        } else {
            self.unparked(parked);
        }
        self.pulled.notify_waiters();
    }
}

/// Counts its holder among the subscribers waiting ahead of the ring, at `from`.
struct AheadGuard<'a> {
    ahead: &'a Mutex<BTreeMap<u64, usize>>,
    from: u64,
}

impl<'a> AheadGuard<'a> {
    fn new(ahead: &'a Mutex<BTreeMap<u64, usize>>, from: u64) -> Self {
        *ahead.lock().unwrap().entry(from).or_insert(0) += 1;
        Self { ahead, from }
    }
}

impl Drop for AheadGuard<'_> {
    fn drop(&mut self) {
        let mut ahead = self.ahead.lock().unwrap();
        if let Some(n) = ahead.get_mut(&self.from) {
            *n -= 1;
            if *n == 0 {
                ahead.remove(&self.from);
            }
        }
    }
}

/// One partition's reader and how many feeders hold it.
struct ReaderEntry {
    reader: Arc<PartitionReader>,
    cancel: CancellationToken,
    /// Finished when the reader's task has returned.
    finished: CancellationToken,
    leases: usize,
}

type ReaderMap = Arc<Mutex<HashMap<TopicPartition, ReaderEntry>>>;
/// Readers whose last lease is gone but whose task may still be running, by partition: the token
/// is finished when the task has returned.
type StoppingMap = Arc<Mutex<HashMap<TopicPartition, CancellationToken>>>;

/// A feeder's hold on a partition reader. When the last lease of a reader is dropped the reader
/// stops and is forgotten with its buffer: a partition nobody reads costs nothing (the pull
/// cursor stays with the backend, so a new reader resumes where this one stopped).
pub struct ReaderLease {
    tp: TopicPartition,
    reader: Arc<PartitionReader>,
    map: ReaderMap,
    stopping: StoppingMap,
}

impl ReaderLease {
    /// The reader itself, for a feeder's state (the lease stays with the subscription).
    pub fn shared(&self) -> Arc<PartitionReader> {
        self.reader.clone()
    }
}

impl std::ops::Deref for ReaderLease {
    type Target = PartitionReader;

    fn deref(&self) -> &PartitionReader {
        &self.reader
    }
}

impl Drop for ReaderLease {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap();
        let Some(entry) = map.get_mut(&self.tp).filter(|e| Arc::ptr_eq(&e.reader, &self.reader)) else { return };
        entry.leases -= 1;
        if entry.leases == 0 {
            entry.cancel.cancel();
            // The next reader of this partition waits for this one's task to end.
            self.stopping.lock().unwrap().insert(self.tp.clone(), entry.finished.clone());
            map.remove(&self.tp);
            self.reader.backend.stop_pulling(&self.tp);
        }
    }
}

/// All partition readers of this instance, created on first subscription and dropped when the
/// last subscriber of the partition goes.
pub struct Readers {
    backend: Arc<dyn LogBackend>,
    capacity: usize,
    capacity_bytes: usize,
    batch: usize,
    readers: ReaderMap,
    stopping: StoppingMap,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// `ackgate_pull_events_total`, shared by every reader.
    pulled_events: metrics::Counter,
    /// Truncations found by any reader since start (`PartitionReader::truncate`): it outlives
    /// each partition's readers, which come and go with their subscribers.
    truncations_found: Arc<AtomicU64>,
    store: Arc<dyn OffsetStore>,
}

impl Readers {
    /// Each reader keeps at most `capacity` events and `capacity_bytes` of payload, and pulls at
    /// most `batch` events at a time. A lost tail a reader finds starts the partition's next log
    /// epoch in `store`.
    pub fn new(
        backend: Arc<dyn LogBackend>,
        store: Arc<dyn OffsetStore>,
        capacity: usize,
        capacity_bytes: usize,
        batch: usize,
        shutdown: CancellationToken,
        tasks: TaskTracker,
        pulled_events: metrics::Counter,
    ) -> Self {
        let (readers, stopping) = (Arc::new(Mutex::new(HashMap::new())), Arc::new(Mutex::new(HashMap::new())));
        Self { backend, capacity, capacity_bytes, batch, readers, stopping, shutdown, tasks, pulled_events, truncations_found: Arc::default(), store }
    }

    /// Truncations found so far: read before a subscription is planned, and handed to its
    /// feeders, so that one found after the plan read the log's bounds reaches them.
    pub fn truncations(&self) -> u64 {
        self.truncations_found.load(Ordering::SeqCst)
    }

    /// A lease on the reader of `tp`, started at the backend's pull cursor (or `log_start`) when new.
    pub fn get(&self, tp: &TopicPartition, log_start: u64) -> ReaderLease {
        let mut readers = self.readers.lock().unwrap();
        if let Some(entry) = readers.get_mut(tp) {
            entry.leases += 1;
            return ReaderLease { tp: tp.clone(), reader: entry.reader.clone(), map: self.readers.clone(), stopping: self.stopping.clone() };
        }
        let cursor = self.backend.pull_offset(tp).unwrap_or(log_start).max(log_start);
        self.backend.seek(tp, cursor);
        let reader = Arc::new(PartitionReader {
            tp: tp.clone(),
            backend: self.backend.clone(),
            capacity: self.capacity,
            capacity_bytes: self.capacity_bytes,
            batch: self.batch,
            buffer: Mutex::new(Buffer { covered_from: cursor, covered_to: cursor, events: VecDeque::new(), bytes: 0, truncations: 0, truncated_to: 0 }),
            pulled: Notify::new(),
            demand: Notify::new(),
            waiting: AtomicUsize::new(0),
            ahead: Mutex::new(BTreeMap::new()),
            pulled_events: self.pulled_events.clone(),
            average_bytes: AtomicUsize::new(0),
            truncations_found: self.truncations_found.clone(),
            store: self.store.clone(),
            parked: Mutex::new(Vec::new()),
        });
        let (cancel, finished) = (self.shutdown.child_token(), CancellationToken::new());
        let previous = self.stopping.lock().unwrap().remove(tp).filter(|p| !p.is_cancelled());
        let (running, stop, done, stopping, key) = (reader.clone(), cancel.clone(), finished.clone(), self.stopping.clone(), tp.clone());
        self.tasks.spawn(async move {
            running.run_supervised(stop, previous).await;
            done.cancel();
            let mut stopping = stopping.lock().unwrap();
            if stopping.get(&key).is_some_and(|t| t.is_cancelled()) {
                stopping.remove(&key);
            }
        });
        readers.insert(tp.clone(), ReaderEntry { reader: reader.clone(), cancel, finished, leases: 1 });
        ReaderLease { tp: tp.clone(), reader, map: self.readers.clone(), stopping: self.stopping.clone() }
    }

    /// Partitions with a running reader.
    pub fn len(&self) -> usize {
        self.readers.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops and forgets the readers of a deleted topic.
    pub fn remove_topic(&self, topic: &TopicName) {
        self.readers.lock().unwrap().retain(|tp, entry| {
            let keep = tp.topic != *topic;
            if !keep {
                entry.cancel.cancel();
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::core::backend::{NewEvent, PartitionBounds};

    /// A backend whose polls all answer empty at once; it notes when the hundredth came.
    #[derive(Default)]
    struct AnswersAtOnce {
        polls: AtomicUsize,
        hundredth: Mutex<Option<tokio::time::Instant>>,
        done: Notify,
    }

    #[async_trait]
    impl LogBackend for AnswersAtOnce {
        async fn topics(&self) -> Result<Vec<(TopicName, u32)>, BackendError> {
            Ok(Vec::new())
        }
        async fn partitions(&self, _: &TopicName) -> Result<Option<u32>, BackendError> {
            Ok(Some(1))
        }
        async fn create_topic(&self, _: &TopicName, _: u32) -> Result<bool, BackendError> {
            Err(BackendError::Unavailable("not in this test".into()))
        }
        async fn delete_topic(&self, _: &TopicName) -> Result<bool, BackendError> {
            Err(BackendError::Unavailable("not in this test".into()))
        }
        async fn publish(&self, _: &TopicName, _: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
            Err(BackendError::Unavailable("not in this test".into()))
        }
        async fn log_bounds(&self, _: &TopicPartition) -> Result<PartitionBounds, BackendError> {
            Ok(PartitionBounds { log_start: 0, log_end: 0 })
        }
        async fn poll(&self, _: &TopicPartition, _: ReadFrom, _: usize, _: Duration) -> Result<Vec<Event>, BackendError> {
            tokio::task::yield_now().await;
            if self.polls.fetch_add(1, Ordering::SeqCst) + 1 == 100 {
                *self.hundredth.lock().unwrap() = Some(tokio::time::Instant::now());
                self.done.notify_one();
            }
            Ok(Vec::new())
        }
        fn seek(&self, _: &TopicPartition, _: u64) {}
        fn pull_offset(&self, _: &TopicPartition) -> Option<u64> {
            Some(0)
        }
        fn ack_pulled_message(&self, _: &TopicPartition, _: u64) {}
        fn checkpoint(&self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn is_ready(&self) -> bool {
            true
        }
    }

    /// A backend whose first poll panics; the next answers the event at offset 0 (moving the pull
    /// cursor past it), and later ones nothing.
    #[derive(Default)]
    struct PanicsOnce {
        polls: AtomicUsize,
    }

    #[async_trait]
    impl LogBackend for PanicsOnce {
        async fn topics(&self) -> Result<Vec<(TopicName, u32)>, BackendError> {
            Ok(Vec::new())
        }
        async fn partitions(&self, _: &TopicName) -> Result<Option<u32>, BackendError> {
            Ok(Some(1))
        }
        async fn create_topic(&self, _: &TopicName, _: u32) -> Result<bool, BackendError> {
            Err(BackendError::Unavailable("not in this test".into()))
        }
        async fn delete_topic(&self, _: &TopicName) -> Result<bool, BackendError> {
            Err(BackendError::Unavailable("not in this test".into()))
        }
        async fn publish(&self, _: &TopicName, _: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
            Err(BackendError::Unavailable("not in this test".into()))
        }
        async fn log_bounds(&self, _: &TopicPartition) -> Result<PartitionBounds, BackendError> {
            Ok(PartitionBounds { log_start: 0, log_end: 1 })
        }
        async fn poll(&self, _: &TopicPartition, _: ReadFrom, _: usize, _: Duration) -> Result<Vec<Event>, BackendError> {
            match self.polls.fetch_add(1, Ordering::SeqCst) {
                0 => panic!("a backend bug on the first read"),
                1 => {
                    let mut event = Event::undecodable(0, 0);
                    (event.undecodable, event.payload) = (false, b"1".to_vec());
                    Ok(vec![event])
                }
                _ => Ok(Vec::new()),
            }
        }
        fn seek(&self, _: &TopicPartition, _: u64) {}
        fn pull_offset(&self, _: &TopicPartition) -> Option<u64> {
            Some(u64::from(self.polls.load(Ordering::SeqCst) >= 2))
        }
        fn ack_pulled_message(&self, _: &TopicPartition, _: u64) {}
        fn checkpoint(&self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn is_ready(&self) -> bool {
            true
        }
    }

    /// Readers of `backend` with a ring of 100 events, an offset store in memory and no metrics.
    fn small_readers(backend: Arc<dyn LogBackend>) -> Readers {
        let store = Arc::new(crate::store::memory::MemoryOffsetStore::new());
        Readers::new(backend, store, 100, 1 << 20, 10, CancellationToken::new(), TaskTracker::new(), metrics::Counter::noop())
    }

    /// Issue 40, item 11: a reader task that panicked stayed dead, and the partition stalled for
    /// every subscriber (this fetch waited for ever). Now it starts again a second later.
    #[tokio::test(start_paused = true)]
    async fn a_reader_that_panicked_starts_again() {
        let backend = Arc::new(PanicsOnce::default());
        let readers = small_readers(backend.clone());
        let lease = readers.get(&TopicPartition::new(TopicName::parse("t").unwrap(), 0), 0);
        let fetched = tokio::time::timeout(Duration::from_secs(60), lease.fetch(0, 10, 1 << 20, &mut 0)).await;
        let events = fetched.expect("the reader came back").expect("a read");
        assert_eq!(events.iter().map(|e| e.offset).collect::<Vec<_>>(), vec![0]);
        assert!(backend.polls.load(Ordering::SeqCst) >= 2);
    }

    /// Issue 22, item 9: a backend that answers every poll empty and at once (RocketMQ's POP with
    /// a skewed clock) made the reader poll it in a busy loop: 100 polls in no time (on the
    /// paused clock). Now each such answer is followed by a pause.
    #[tokio::test(start_paused = true)]
    async fn empty_polls_answered_at_once_are_paced() {
        let backend = Arc::new(AnswersAtOnce::default());
        let readers = small_readers(backend.clone());
        let lease = readers.get(&TopicPartition::new(TopicName::parse("t").unwrap(), 0), 0);
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn(async move { lease.fetch(0, 10, 1 << 20, &mut 0).await });
        backend.done.notified().await;
        let took = backend.hundredth.lock().unwrap().expect("set with the notification") - started;
        assert!(took >= EMPTY_POLL_FLOOR * 99, "100 empty polls within {took:?}: a busy loop");
        waiting.abort();
    }
}
