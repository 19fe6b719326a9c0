//! One thread that applies ack-offset writes in batches and then fires the deferred broker ACKs.
//!
//! Sessions send a `WriteRequest` and, when the client asked for a receipt, wait for its reply.
//! Everything that arrived while the previous batch was being written goes into the next single
//! store batch (one RocksDB WriteBatch), so many clients acking at once cost one write.
//!
//! Acks without a receipt (plain acks) are not sent to the thread: they are merged into a map of
//! the newest write per key (`PlainAcks`) that the thread takes every
//! `offsets.plain_ack_linger_ms`, or at once with the next request that waits (a confirmed ack, a
//! barrier). So a plain ack wakes no thread, and a key acked many times within a linger is written
//! once. A crash loses at most the linger's plain acks: their events are delivered again
//! (at-least-once), as events acked just before any crash are.

use std::cmp::Ordering as Order;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use super::backend::LogBackend;
use super::names::{OffsetKey, TopicPartition};
use super::offsets::{OffsetRecord, OffsetStore, OffsetWrite, WriteOutcome};
use super::FastMap;

/// Requests coalesced into one store batch at most.
const MAX_REQUESTS_PER_BATCH: usize = 4096;
/// Keys (or broker ACKs) of plain acks held before the writer is woken without waiting for its
/// linger tick.
const PLAIN_KEYS_BEFORE_WAKE: usize = 4096;

pub struct WriteRequest {
    pub writes: Vec<OffsetWrite>,
    /// Events whose broker ACK fires once `writes` are durable.
    pub broker_acks: Vec<(TopicPartition, u64)>,
    /// Answered after the write (and the broker ACKs) when the sender waits for durability.
    pub done: Option<oneshot::Sender<Result<(), String>>>,
}

/// Counters for operators and metrics.
#[derive(Default)]
pub struct OffsetWriteStats {
    pub advanced: AtomicU64,
    pub stale: AtomicU64,
    /// Writes dropped because their topic was deleted since they were made.
    pub obsolete: AtomicU64,
    pub failed_batches: AtomicU64,
    pub broker_acks: AtomicU64,
    /// Broker ACKs not fired because their offset write failed (the client will get the event
    /// again, so the broker must not forget it).
    pub broker_acks_skipped: AtomicU64,
}

/// Handle to the writer thread. Dropping every handle (and calling `join`) drains it.
#[derive(Clone)]
pub struct OffsetWriter {
    tx: mpsc::Sender<WriteRequest>,
    pub stats: Arc<OffsetWriteStats>,
    /// The writer's part, for durable writes done by the caller when the writer is idle.
    applier: Arc<Applier>,
    /// Requests submitted and not yet applied by the thread.
    queued: Arc<AtomicUsize>,
    /// False when a store write may block long (fsync per write): always hand off to the thread.
    inline_when_idle: bool,
    /// Plain acks' writes waiting for the thread's next linger tick.
    plain: Arc<PlainAcks>,
}

/// The writes of plain acks not yet taken by the writer thread: per key the write the store would
/// end with after all of them (`fold`), and their broker ACKs, fired once those are written.
struct PlainAcks {
    /// `offsets.plain_ack_linger_ms`; zero: every burst of plain acks is a request of its own.
    linger: Duration,
    held: Mutex<HeldWrites>,
    /// Keys held (the map's length, kept beside it so a confirmed ack checks it without the lock).
    keys: AtomicUsize,
}

#[derive(Default)]
struct HeldWrites {
    writes: FastMap<OffsetKey, OffsetWrite>,
    broker_acks: Vec<(TopicPartition, u64)>,
}

impl PlainAcks {
    /// Everything held, as one request (none when nothing is).
    fn take(&self) -> Option<WriteRequest> {
        let mut held = self.held.lock().unwrap();
        if held.writes.is_empty() && held.broker_acks.is_empty() {
            return None;
        }
        self.keys.store(0, Ordering::SeqCst);
        let HeldWrites { writes, broker_acks } = std::mem::take(&mut *held);
        Some(WriteRequest { writes: writes.into_values().collect(), broker_acks, done: None })
    }
}

/// Folds `write`, made after `held` for the same key, into `held`, so that writing `held` alone
/// leaves the store where writing both in order would: a write for an older topic generation or
/// offset epoch would be dropped after `held` (obsolete, stale), one for a newer replaces it (the
/// store already moved past `held`'s), and within one the floors only rise (CAS-max).
pub fn fold(held: &mut OffsetWrite, write: OffsetWrite) {
    match (write.generation, write.epoch).cmp(&(held.generation, held.epoch)) {
        Order::Less => {}
        Order::Greater => *held = write,
        Order::Equal => {
            let before = OffsetRecord::from_write(held);
            if before.is_advanced_by(&write) {
                let after = before.advanced_by(&write);
                (held.committed, held.last_acked, held.updated_at) = (after.committed, after.last_acked, write.updated_at);
            }
        }
    }
}

/// What applies a batch: the store, the backend (broker ACKs) and the counters.
struct Applier {
    store: Arc<dyn OffsetStore>,
    backend: Arc<dyn LogBackend>,
    stats: Arc<OffsetWriteStats>,
}

impl OffsetWriter {
    /// Starts the writer thread; `capacity` bounds the queue (senders wait when it is full).
    /// `inline_when_idle`: a durable write may run on the caller when nothing is queued (only
    /// for stores whose writes do not fsync, so the caller never blocks long).
    /// `plain_ack_linger`: how long plain acks' writes may wait for the thread (`PlainAcks`).
    pub fn start(
        store: Arc<dyn OffsetStore>,
        backend: Arc<dyn LogBackend>,
        capacity: usize,
        inline_when_idle: bool,
        plain_ack_linger: Duration,
    ) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(capacity);
        let stats = Arc::new(OffsetWriteStats::default());
        let applier = Arc::new(Applier { store, backend, stats: stats.clone() });
        let queued = Arc::new(AtomicUsize::new(0));
        let plain = Arc::new(PlainAcks { linger: plain_ack_linger, held: Mutex::default(), keys: AtomicUsize::new(0) });
        let (thread_applier, thread_queued, thread_plain) = (applier.clone(), queued.clone(), plain.clone());
        let handle = std::thread::Builder::new()
            .name("offset-writer".into())
            .spawn(move || write_loop(rx, thread_applier, thread_queued, thread_plain))
            .expect("spawning the offset writer thread");
        (Self { tx, stats, applier, queued, inline_when_idle, plain }, handle)
    }

    /// Hands over the writes and broker ACKs of plain acks (no receipt), emptying both vectors
    /// (their capacity stays with the caller: no allocation per ack). Held for the thread's next
    /// linger tick, merged per key; fails only when the writer has stopped (shutdown).
    pub async fn submit_plain(&self, writes: &mut Vec<OffsetWrite>, broker_acks: &mut Vec<(TopicPartition, u64)>) -> Result<(), String> {
        if self.plain.linger.is_zero() {
            // Each key's floor only rises within a burst: the last write of a key carries them all.
            let mut writes = std::mem::take(writes);
            let mut seen = crate::core::FastSet::default();
            writes.reverse();
            writes.retain(|w| seen.insert(w.key.clone()));
            return self.submit(WriteRequest { writes, broker_acks: std::mem::take(broker_acks), done: None }).await;
        }
        if self.tx.is_closed() {
            return Err("offset writer stopped".to_string());
        }
        let keys = {
            let mut held = self.plain.held.lock().unwrap();
            for write in writes.drain(..) {
                match held.writes.get_mut(&write.key) {
                    Some(pending) => fold(pending, write),
                    None => {
                        held.writes.insert(write.key.clone(), write);
                    }
                }
            }
            held.broker_acks.append(broker_acks);
            self.plain.keys.store(held.writes.len(), Ordering::SeqCst);
            held.writes.len().max(held.broker_acks.len())
        };
        if keys >= PLAIN_KEYS_BEFORE_WAKE {
            // Enough for a batch: an empty request wakes the thread, which takes them with it.
            // While the writer is stuck (a stalled store) these fill its queue, and the sessions
            // then wait here as they wait in `submit`: what is held stays bounded.
            return self.submit(WriteRequest { writes: Vec::new(), broker_acks: Vec::new(), done: None }).await;
        }
        Ok(())
    }

    /// Queues a request; fails only when the writer has stopped (shutdown).
    pub async fn submit(&self, request: WriteRequest) -> Result<(), String> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        // Room in the queue is the common case. Waiting for room is boxed: a session's future
        // holds every future it awaits, and every session, idle or not, would carry this one.
        let sent = match self.tx.try_send(request) {
            Ok(()) => true,
            Err(TrySendError::Full(request)) => Box::pin(self.tx.send(request)).await.is_ok(),
            Err(TrySendError::Closed(_)) => false,
        };
        if !sent {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err("offset writer stopped".to_string());
        }
        Ok(())
    }

    /// Writes and returns once the write is durable. With nothing queued for the writer thread,
    /// the write runs here: an `ack_ok` then costs no thread hand-off there and back (the
    /// confirmed-ack round trip). The store serializes writers and CAS-max keeps the result the
    /// same whichever write lands first.
    pub async fn write_durably(&self, writes: Vec<OffsetWrite>, broker_acks: Vec<(TopicPartition, u64)>) -> Result<(), String> {
        // Held plain acks go first (the thread takes them with this request), as they were made first.
        let idle = self.queued.load(Ordering::SeqCst) == 0 && self.plain.keys.load(Ordering::SeqCst) == 0;
        let (writes, broker_acks) = if self.inline_when_idle && !writes.is_empty() && idle {
            let mut batch = vec![WriteRequest { writes, broker_acks, done: None }];
            // Only when the store needs no waiting for it: a stalled store must not freeze this
            // tokio worker (issue 39, item 10); the thread waits instead.
            if let Some(result) = self.applier.try_apply_now(&mut batch) {
                return result;
            }
            let WriteRequest { writes, broker_acks, .. } = batch.remove(0);
            (writes, broker_acks)
        } else {
            (writes, broker_acks)
        };
        let (done, wait) = oneshot::channel();
        self.submit(WriteRequest { writes, broker_acks, done: Some(done) }).await?;
        wait.await.map_err(|_| "offset writer stopped".to_string())?
    }
}

impl OffsetWriter {
    /// Returns once every request submitted before it has been applied (durable, or failed and
    /// logged): the writer handles requests in order.
    pub async fn barrier(&self) -> Result<(), String> {
        let (done, wait) = oneshot::channel();
        self.submit(WriteRequest { writes: Vec::new(), broker_acks: Vec::new(), done: Some(done) }).await?;
        wait.await.map_err(|_| "offset writer stopped".to_string())?
    }

    /// Returns once what was written to the store so far without an fsync (`OffsetStore::touch`)
    /// survives a power loss: a `barrier`, sharing the writer's fsync with everything queued,
    /// when the store fsyncs (`storage.durability = "power"`, where writes are never inline);
    /// at once otherwise, with no trip through the writer's queue.
    pub async fn make_written_durable(&self) -> Result<(), String> {
        if self.inline_when_idle {
            return Ok(());
        }
        self.barrier().await
    }
}

impl Applier {
    /// One store batch for every request, then each request's broker ACKs and answer.
    fn apply(&self, batch: &mut Vec<WriteRequest>) -> Result<(), String> {
        self.apply_with(batch, |writes| Some(self.store.write_offsets(writes))).unwrap_or_else(|| Err("the write was not made".into()))
    }

    /// `apply` when the store can write without waiting; `None`, and `batch` untouched, otherwise.
    fn try_apply_now(&self, batch: &mut Vec<WriteRequest>) -> Option<Result<(), String>> {
        self.apply_with(batch, |writes| self.store.try_write_offsets(writes))
    }

    fn apply_with(
        &self,
        batch: &mut Vec<WriteRequest>,
        write: impl FnOnce(&[OffsetWrite]) -> Option<Result<Vec<WriteOutcome>, super::offsets::StoreError>>,
    ) -> Option<Result<(), String>> {
        let stats = &self.stats;
        let writes: Vec<OffsetWrite> = batch.iter().flat_map(|r| r.writes.iter().cloned()).collect();
        let result = if writes.is_empty() { Ok(Vec::new()) } else { write(&writes)? };
        // Someone waits on this batch (an `ack_ok`, a barrier) or a broker forgets its events
        // once acked (RocketMQ POP): durable first. Plain acks alone are not waited on; they
        // share a later fsync (every backend gets broker ACKs, most only count them).
        let broker_forgets = self.backend.acknowledges_at_broker();
        let must_last = batch.iter().any(|r| r.done.is_some() || (broker_forgets && !r.broker_acks.is_empty()));
        let result = match result {
            Ok(outcomes) if must_last => self.store.make_durable().map(|()| outcomes),
            other => other,
        };
        let result = match result {
            Ok(outcomes) => {
                let count = |kind| outcomes.iter().filter(|o| **o == kind).count() as u64;
                stats.advanced.fetch_add(count(WriteOutcome::Advanced), Ordering::Relaxed);
                stats.stale.fetch_add(count(WriteOutcome::Stale), Ordering::Relaxed);
                stats.obsolete.fetch_add(count(WriteOutcome::Obsolete), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                stats.failed_batches.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, writes = writes.len(), "offset write failed");
                Err(e.to_string())
            }
        };
        for request in batch.drain(..) {
            if result.is_ok() {
                for (tp, offset) in &request.broker_acks {
                    self.backend.ack_pulled_message(tp, *offset);
                }
                stats.broker_acks.fetch_add(request.broker_acks.len() as u64, Ordering::Relaxed);
            } else {
                stats.broker_acks_skipped.fetch_add(request.broker_acks.len() as u64, Ordering::Relaxed);
            }
            if let Some(done) = request.done {
                let _ = done.send(result.clone());
            }
        }
        Some(result)
    }
}

fn write_loop(mut rx: mpsc::Receiver<WriteRequest>, applier: Arc<Applier>, queued: Arc<AtomicUsize>, plain: Arc<PlainAcks>) {
    // A runtime of this thread alone, for its linger tick beside the queue: everything it runs
    // blocks this thread only.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("building the offset writer's runtime");
    let lingering = !plain.linger.is_zero();
    let mut batch = Vec::new();
    runtime.block_on(async {
        let period = plain.linger.max(Duration::from_millis(1));
        // The first tick a period from now (an interval's first is at once).
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let taken = tokio::select! {
                biased;
                request = rx.recv() => match request {
                    Some(first) => {
                        batch.push(first);
                        while batch.len() < MAX_REQUESTS_PER_BATCH {
                            match rx.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                        batch.len()
                    }
                    None => break,
                },
                _ = tick.tick(), if lingering => 0,
            };
            // Plain acks held so far were made before these requests: first in the batch.
            if let Some(held) = plain.take() {
                batch.insert(0, held);
            }
            if !batch.is_empty() {
                let _ = applier.apply(&mut batch);
            }
            // Only now: until the batch is applied, a durable write must queue behind it.
            queued.fetch_sub(taken, Ordering::SeqCst);
        }
    });
    // Stopped (every handle dropped): what is still held is written before the store's flush.
    if let Some(held) = plain.take() {
        let _ = applier.apply(&mut vec![held]);
    }
    if let Err(e) = applier.store.flush() {
        tracing::error!(error = %e, "offset store flush at shutdown failed");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::backend::embedded::{EmbeddedLog, EmbeddedLogSettings};
    use crate::core::clock::SystemClock;
    use crate::core::dead_letters::{DeadLetter, DeadLetterId, DeadLetterPage, DeadLetterQuery, Gap, GapPage};
    use crate::core::names::{ClientId, OffsetKey, TopicName};
    use crate::core::offsets::{LogEpoch, OffsetFilter, OffsetRecord, StoreError};
    use crate::core::remembered_publish::{IdempotencyKey, RememberedPublish};
    use crate::store::memory::MemoryOffsetStore;

    /// A memory store whose writes wait while the test holds `gate`: fills the writer's queue.
    struct GatedStore {
        inner: MemoryOffsetStore,
        gate: Mutex<()>,
        /// Writes begun: the writer thread is past taking its batch once this is 1.
        entered: AtomicUsize,
        /// `make_durable` calls: the fsyncs of the offset store.
        made_durable: AtomicUsize,
    }

    impl OffsetStore for GatedStore {
        fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
            self.inner.read(key)
        }
        fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let _open = self.gate.lock().unwrap();
            self.inner.write_offsets(writes)
        }
        fn scan_each(&self, filter: &OffsetFilter, visit: &mut dyn FnMut(OffsetKey, OffsetRecord)) -> Result<(), StoreError> {
            self.inner.scan_each(filter, visit)
        }
        fn scan_page(&self, filter: &OffsetFilter, after: Option<&OffsetKey>, limit: usize) -> Result<Vec<(OffsetKey, OffsetRecord)>, StoreError> {
            self.inner.scan_page(filter, after, limit)
        }
        fn reset(&self, key: &OffsetKey, committed: u64, min_epoch: u64, now: u64) -> Result<OffsetRecord, StoreError> {
            self.inner.reset(key, committed, min_epoch, now)
        }
        fn log_epoch(&self, tp: &TopicPartition) -> Result<LogEpoch, StoreError> {
            self.inner.log_epoch(tp)
        }
        fn step_log_epoch(&self, tp: &TopicPartition, seen: u32, log_end: u64) -> Result<LogEpoch, StoreError> {
            self.inner.step_log_epoch(tp, seen, log_end)
        }
        fn topic_generation(&self, topic: &TopicName) -> Result<u64, StoreError> {
            self.inner.topic_generation(topic)
        }
        fn topic_incarnation(&self, topic: &TopicName) -> Result<crate::core::offsets::TopicIncarnation, StoreError> {
            self.inner.topic_incarnation(topic)
        }
        fn fence(&self, key: &OffsetKey) -> Result<Option<u64>, StoreError> {
            self.inner.fence(key)
        }
        fn remove_fenced(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
            self.inner.remove_fenced(keys)
        }
        fn remove_topic(&self, topic: &TopicName) -> Result<usize, StoreError> {
            self.inner.remove_topic(topic)
        }
        fn begin_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError> {
            self.inner.begin_topic_removal(topic)
        }
        fn topic_log_deleted(&self, topic: &TopicName) -> Result<(), StoreError> {
            self.inner.topic_log_deleted(topic)
        }
        fn cancel_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError> {
            self.inner.cancel_topic_removal(topic)
        }
        fn pending_topic_removals(&self) -> Vec<(TopicName, crate::core::offsets::TopicRemoval)> {
            self.inner.pending_topic_removals()
        }
        fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError> {
            self.inner.touch(keys, now)
        }
        fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
            self.inner.remove(keys)
        }
        fn remove_unchanged(&self, records: &[(OffsetKey, u64)]) -> Result<usize, StoreError> {
            self.inner.remove_unchanged(records)
        }
        fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
            self.inner.record_dead_letter(dead)
        }
        fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, StoreError> {
            self.inner.dead_letters(query)
        }
        fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
            self.inner.remove_dead_letters(topic)
        }
        fn remove_dead_letters_before(&self, at_ms: u64) -> Result<usize, StoreError> {
            self.inner.remove_dead_letters_before(at_ms)
        }
        fn remove_dead_letter_ids(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
            self.inner.remove_dead_letter_ids(ids)
        }
        fn mark_redrive(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
            self.inner.mark_redrive(ids)
        }
        fn redrives(&self, topic: &TopicName, client_id: &ClientId, after: Option<&DeadLetterId>, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
            self.inner.redrives(topic, client_id, after, limit)
        }
        fn settle_redrive(&self, id: &DeadLetterId, again: Option<&DeadLetter>) -> Result<(), StoreError> {
            self.inner.settle_redrive(id, again)
        }
        fn redrives_pending(&self) -> usize {
            self.inner.redrives_pending()
        }
        fn record_gap(&self, gap: &Gap) -> Result<(), StoreError> {
            self.inner.record_gap(gap)
        }
        fn gaps(&self, query: &DeadLetterQuery) -> Result<GapPage, StoreError> {
            self.inner.gaps(query)
        }
        fn remove_gaps(&self, topic: Option<&TopicName>, before_ms: u64) -> Result<usize, StoreError> {
            self.inner.remove_gaps(topic, before_ms)
        }
        fn remembered_publish(&self, topic: &TopicName, key: &IdempotencyKey) -> Result<Option<RememberedPublish>, StoreError> {
            self.inner.remembered_publish(topic, key)
        }
        fn remember_publish(&self, topic: &TopicName, key: &IdempotencyKey, publish: &RememberedPublish) -> Result<(), StoreError> {
            self.inner.remember_publish(topic, key, publish)
        }
        fn remembered_publishes(&self) -> usize {
            self.inner.remembered_publishes()
        }
        fn forget_publishes_expired_at(&self, now: u64) -> Result<usize, StoreError> {
            self.inner.forget_publishes_expired_at(now)
        }
        fn flush(&self) -> Result<(), StoreError> {
            self.inner.flush()
        }
        fn make_durable(&self) -> Result<(), StoreError> {
            self.made_durable.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn gated_store() -> Arc<GatedStore> {
        Arc::new(GatedStore { inner: MemoryOffsetStore::new(), gate: Mutex::new(()), entered: AtomicUsize::new(0), made_durable: AtomicUsize::new(0) })
    }

    fn embedded_log(dir: &std::path::Path) -> Arc<EmbeddedLog> {
        let settings = EmbeddedLogSettings {
            default_partitions: 1,
            retention_ms: 0,
            retention_bytes_per_partition: 0,
            durable: false,
            group_commit_max_wait: std::time::Duration::ZERO,
            max_topics: 10_000,
            memtable_bytes: 1 << 20,
            block_cache_bytes: 1 << 20,
        };
        Arc::new(EmbeddedLog::open(dir, settings, Arc::new(SystemClock)).unwrap())
    }

    fn write(client: &str, committed: u64) -> WriteRequest {
        let key = OffsetKey::new(TopicName::parse("t").unwrap(), ClientId::parse(client).unwrap(), 0);
        WriteRequest {
            writes: vec![OffsetWrite { key, committed, last_acked: Some(committed - 1), updated_at: 1, generation: 0, epoch: 0 }],
            broker_acks: Vec::new(),
            done: None,
        }
    }

    fn plain(committed: u64, last_acked: Option<u64>, epoch: u64, generation: u64) -> OffsetWrite {
        let key = OffsetKey::new(TopicName::parse("t").unwrap(), ClientId::parse("a").unwrap(), 0);
        OffsetWrite { key, committed, last_acked, updated_at: committed, generation, epoch }
    }

    /// The merge rule of held plain acks (the engine review's section 3.3).
    #[test]
    fn a_held_write_keeps_what_the_store_would_end_with() {
        let mut held = plain(10, Some(12), 1, 0);
        fold(&mut held, plain(8, Some(9), 1, 0));
        assert_eq!((held.committed, held.last_acked), (10, Some(12)), "a lower floor of the same epoch changes nothing");
        fold(&mut held, plain(15, None, 1, 0));
        assert_eq!((held.committed, held.last_acked, held.updated_at), (15, Some(12), 15), "a higher one advances it");
        fold(&mut held, plain(99, None, 0, 0));
        assert_eq!(held.committed, 15, "a write from before a lowering is dropped, however high");
        fold(&mut held, plain(3, None, 2, 0));
        assert_eq!((held.committed, held.epoch), (3, 2), "a write after a lowering replaces it, however low");
        fold(&mut held, plain(50, None, 5, 0));
        fold(&mut held, plain(4, None, 0, 1));
        assert_eq!((held.committed, held.generation), (4, 1), "a write for a recreated topic replaces one for the deleted");
        fold(&mut held, plain(60, None, 9, 0));
        assert_eq!((held.committed, held.generation), (4, 1), "one for the deleted topic is dropped");
    }

    proptest::proptest! {
        /// Writing the folded write alone leaves the record where writing every write in order
        /// would (the store's CAS-max with epochs). A write of epoch e is made from a record of
        /// epoch e, so when any is written the stored record's epoch is at least every write's.
        #[test]
        fn a_folded_write_lands_where_the_writes_in_order_would(
            start in 0u64..50,
            writes in proptest::collection::vec((0u64..60, 0u64..3), 1..30),
        ) {
            let max_epoch = writes.iter().map(|(_, e)| *e).max().unwrap();
            let stored = OffsetRecord { committed: start, last_acked: None, updated_at: 0, epoch: max_epoch };
            let apply = |record: OffsetRecord, w: &OffsetWrite| if record.is_advanced_by(w) { record.advanced_by(w) } else { record };
            let writes: Vec<OffsetWrite> = writes.into_iter().map(|(c, e)| plain(c, None, e, 0)).collect();
            let in_order = writes.iter().fold(stored, apply);
            let mut held = writes[0].clone();
            for w in &writes[1..] {
                fold(&mut held, w.clone());
            }
            let folded = apply(stored, &held);
            proptest::prop_assert_eq!((folded.committed, folded.epoch), (in_order.committed, in_order.epoch));
        }
    }

    /// Plain acks wait for the linger (no thread wake per ack), are merged per key, and a barrier
    /// writes them at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_acks_wait_for_the_linger_or_a_barrier() {
        let dir = tempfile::tempdir().unwrap();
        let store = gated_store();
        let (writer, thread) = OffsetWriter::start(store.clone(), embedded_log(dir.path()), 16, false, Duration::from_secs(3600));
        let key = OffsetKey::new(TopicName::parse("t").unwrap(), ClientId::parse("a").unwrap(), 0);
        for committed in 1..=5 {
            let (mut writes, mut acks) = (vec![plain(committed, None, 0, 0)], Vec::new());
            writer.submit_plain(&mut writes, &mut acks).await.unwrap();
            assert!(writes.is_empty(), "handed over");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(store.read(&key).unwrap(), None, "held for the linger");
        writer.barrier().await.unwrap();
        assert_eq!(store.read(&key).unwrap().map(|r| r.committed), Some(5));
        assert_eq!(writer.stats.advanced.load(Ordering::SeqCst), 1, "five acks of one key: one write");
        // Held at shutdown: written before the thread ends.
        let (mut writes, mut acks) = (vec![plain(9, None, 0, 0)], Vec::new());
        writer.submit_plain(&mut writes, &mut acks).await.unwrap();
        drop(writer);
        thread.join().unwrap();
        assert_eq!(store.read(&key).unwrap().map(|r| r.committed), Some(9));
    }

    /// `submit` with the queue full waits for room (the boxed path) and loses nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // The std guard held across awaits is the gate the writer thread waits at (on its own
    // thread): this task never waits for it.
    #[allow(clippy::await_holding_lock)]
    async fn submit_waits_for_room_when_the_queue_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let store = gated_store();
        let (writer, thread) = OffsetWriter::start(store.clone(), embedded_log(dir.path()), 1, false, Duration::ZERO);
        let writer = Arc::new(writer);
        let closed = store.gate.lock().unwrap();
        // The writer thread takes the first request and waits at the gate; the second fills the
        // queue of one; the third finds it full.
        writer.submit(write("a", 5)).await.unwrap();
        // Until the thread waits at the gate it may still take more requests into its batch.
        while store.entered.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(writer.tx.capacity(), 1);
        writer.submit(write("b", 6)).await.unwrap();
        assert_eq!(writer.tx.capacity(), 0, "the queue is full");
        let third = tokio::spawn({
            let writer = writer.clone();
            async move { writer.submit(write("c", 7)).await }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!third.is_finished(), "a submit to a full queue waits for room");
        drop(closed);
        third.await.unwrap().unwrap();
        writer.barrier().await.unwrap();
        for (client, committed) in [("a", 5), ("b", 6), ("c", 7)] {
            let key = OffsetKey::new(TopicName::parse("t").unwrap(), ClientId::parse(client).unwrap(), 0);
            assert_eq!(store.read(&key).unwrap().map(|r| r.committed), Some(committed), "write of {client}");
        }
        // The thread counts a batch off after answering it: read the count once it has stopped.
        let queued = writer.queued.clone();
        drop(Arc::into_inner(writer).unwrap());
        thread.join().unwrap();
        assert_eq!(queued.load(Ordering::SeqCst), 0);
    }

    /// Review finding of 5709f3c: every ack carries broker ACKs, whatever the backend, so every
    /// batch with an ack was fsynced. Only a waiter (an `ack_ok`, a barrier) or a backend whose
    /// broker forgets acked events (RocketMQ POP) needs the fsync; plain acks share a later one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn plain_acks_on_a_log_that_only_counts_broker_acks_are_not_fsynced_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = gated_store();
        let (writer, thread) = OffsetWriter::start(store.clone(), embedded_log(dir.path()), 16, false, Duration::ZERO);
        let tp = TopicPartition::new(TopicName::parse("t").unwrap(), 0);
        for committed in 1..=3 {
            let mut plain = write("a", committed);
            plain.broker_acks.push((tp.clone(), committed - 1));
            writer.submit(plain).await.unwrap();
        }
        while writer.stats.advanced.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(store.made_durable.load(Ordering::SeqCst), 0, "plain acks were fsynced on their own");
        let (done, answered) = oneshot::channel();
        writer.submit(WriteRequest { done: Some(done), ..write("a", 4) }).await.unwrap();
        answered.await.unwrap().unwrap();
        assert_eq!(store.made_durable.load(Ordering::SeqCst), 1, "a confirmed ack is fsynced before its answer");
        drop(writer);
        thread.join().unwrap();
    }
}
