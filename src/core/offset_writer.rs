//! One thread that applies ack-offset writes in batches and then fires the deferred broker ACKs.
//!
//! Sessions send a `WriteRequest` and, when the client asked for a receipt, wait for its reply.
//! Everything that arrived while the previous batch was being written goes into the next single
//! store batch (one RocksDB WriteBatch), so many clients acking at once cost one write.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use super::backend::LogBackend;
use super::names::TopicPartition;
use super::offsets::{OffsetStore, OffsetWrite, WriteOutcome};

/// Requests coalesced into one store batch at most.
const MAX_REQUESTS_PER_BATCH: usize = 4096;

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
    pub fn start(store: Arc<dyn OffsetStore>, backend: Arc<dyn LogBackend>, capacity: usize, inline_when_idle: bool) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(capacity);
        let stats = Arc::new(OffsetWriteStats::default());
        let applier = Arc::new(Applier { store, backend, stats: stats.clone() });
        let queued = Arc::new(AtomicUsize::new(0));
        let (thread_applier, thread_queued) = (applier.clone(), queued.clone());
        let handle = std::thread::Builder::new()
            .name("offset-writer".into())
            .spawn(move || write_loop(rx, thread_applier, thread_queued))
            .expect("spawning the offset writer thread");
        (Self { tx, stats, applier, queued, inline_when_idle }, handle)
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
        let (writes, broker_acks) = if self.inline_when_idle && !writes.is_empty() && self.queued.load(Ordering::SeqCst) == 0 {
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

fn write_loop(mut rx: mpsc::Receiver<WriteRequest>, applier: Arc<Applier>, queued: Arc<AtomicUsize>) {
    let mut batch = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_REQUESTS_PER_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let taken = batch.len();
        let _ = applier.apply(&mut batch);
        // Only now: until the batch is applied, a durable write must queue behind it.
        queued.fetch_sub(taken, Ordering::SeqCst);
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

    /// `submit` with the queue full waits for room (the boxed path) and loses nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // The std guard held across awaits is the gate the writer thread waits at (on its own
    // thread): this task never waits for it.
    #[allow(clippy::await_holding_lock)]
    async fn submit_waits_for_room_when_the_queue_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let store = gated_store();
        let (writer, thread) = OffsetWriter::start(store.clone(), embedded_log(dir.path()), 1, false);
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
        let (writer, thread) = OffsetWriter::start(store.clone(), embedded_log(dir.path()), 16, false);
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
