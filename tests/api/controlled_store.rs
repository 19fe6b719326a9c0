//! The real RocksDB offset store behind a switchboard: a test can hold every offset write
//! (as a slow disk or a long queue would) or make writes fail (a full disk), then let go.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ackgate::core::dead_letters::{DeadLetter, DeadLetterId, DeadLetterPage, DeadLetterQuery, Gap, GapPage};
use ackgate::core::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use ackgate::core::offsets::{LogEpoch, OffsetFilter, OffsetRecord, OffsetStore, OffsetWrite, StoreError, WriteOutcome};
use ackgate::core::remembered_publish::{IdempotencyKey, RememberedPublish};
use ackgate::store::rocks::RocksOffsetStore;

/// A switch that makes callers wait while it is held; while held, it can let a number of
/// callers through (`let_through`).
#[derive(Default)]
struct Gate {
    /// Held, and callers still let through while held.
    state: Mutex<(bool, usize)>,
    released: Condvar,
}

impl Gate {
    fn set(&self, held: bool) {
        *self.state.lock().unwrap() = (held, 0);
        self.released.notify_all();
    }

    fn is_held(&self) -> bool {
        self.state.lock().unwrap().0
    }

    fn let_through(&self, callers: usize) {
        self.state.lock().unwrap().1 += callers;
        self.released.notify_all();
    }

    fn wait_while_held(&self) {
        let mut state = self.state.lock().unwrap();
        loop {
            match *state {
                (false, _) => return,
                (true, permits) if permits > 0 => {
                    state.1 -= 1;
                    return;
                }
                _ => state = self.released.wait(state).unwrap(),
            }
        }
    }
}

pub struct ControlledStore {
    inner: RocksOffsetStore,
    /// While held, `write_offsets` waits.
    writes: Gate,
    /// While true, `write_offsets` fails.
    failing: AtomicBool,
    /// While true, `read` fails (a store that stopped answering).
    reads_failing: AtomicBool,
    /// While held, `record_dead_letter` waits.
    dead_letters: Gate,
    /// While true, `record_dead_letter` fails.
    dead_letters_failing: AtomicBool,
    /// While held, removals wait (the retention sweep's, between its scan and its delete).
    removals: Gate,
    /// While held, `touch` waits (a subscribe's touch of the client's records: on the blocking
    /// pool, so holding it suspends a subscription's plan without blocking a runtime worker).
    touches: Gate,
    /// While held, `reset` (an operator's offset reset) waits; `resets_waiting` counts them.
    resets: Gate,
    resets_waiting: AtomicUsize,
    /// While true, `remove_topic` fails (a disk error in the middle of a topic's deletion).
    topic_removals_failing: AtomicBool,
    /// While true, `remove_dead_letters` fails (a disk error after some of a deleted topic's
    /// store was removed).
    dead_letter_removals_failing: AtomicBool,
    /// While true, remembering an idempotent publish's answer fails (as a gateway that died
    /// between the log's write and remembering the answer leaves it).
    answers_failing: AtomicBool,
}

impl ControlledStore {
    pub fn open(data_dir: &std::path::Path) -> Arc<Self> {
        std::fs::create_dir_all(data_dir).unwrap();
        let inner = RocksOffsetStore::open(data_dir, false).unwrap();
        Arc::new(Self {
            inner,
            writes: Gate::default(),
            failing: AtomicBool::new(false),
            reads_failing: AtomicBool::new(false),
            dead_letters: Gate::default(),
            dead_letters_failing: AtomicBool::new(false),
            removals: Gate::default(),
            touches: Gate::default(),
            resets: Gate::default(),
            resets_waiting: AtomicUsize::new(0),
            topic_removals_failing: AtomicBool::new(false),
            dead_letter_removals_failing: AtomicBool::new(false),
            answers_failing: AtomicBool::new(false),
        })
    }

    /// Makes remembering a publish's answer fail (true) or work again (false).
    pub fn fail_publish_answers(&self, failing: bool) {
        self.answers_failing.store(failing, Ordering::SeqCst);
    }

    /// Makes `remove_dead_letters` fail (true) or work again (false).
    pub fn fail_dead_letter_removals(&self, failing: bool) {
        self.dead_letter_removals_failing.store(failing, Ordering::SeqCst);
    }

    /// Makes `remove_topic` fail (true) or work again (false).
    pub fn fail_topic_removals(&self, failing: bool) {
        self.topic_removals_failing.store(failing, Ordering::SeqCst);
    }

    pub fn hold_writes(&self) {
        self.writes.set(true);
    }

    pub fn release_writes(&self) {
        self.writes.set(false);
    }

    /// Releases held writes after `after`, from another thread.
    pub fn release_writes_after(self: &Arc<Self>, after: Duration) {
        let store = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            store.release_writes();
        });
    }

    /// Holds every `touch` until `after` has passed, then lets go, from another thread.
    pub fn hold_touches_for(self: &Arc<Self>, after: Duration) {
        self.touches.set(true);
        let store = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            store.touches.set(false);
        });
    }

    /// Holds every operator reset until `after` has passed (a slow disk under the reset's
    /// write), then lets go, from another thread.
    pub fn hold_resets_for(self: &Arc<Self>, after: Duration) {
        self.resets.set(true);
        let store = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            store.resets.set(false);
        });
    }

    /// Operator resets waiting in the store now.
    pub fn resets_waiting(&self) -> usize {
        self.resets_waiting.load(Ordering::SeqCst)
    }

    /// Lets go of held dead-letter writes after `after`, from another thread.
    pub fn release_dead_letters_after(self: &Arc<Self>, after: Duration) {
        let store = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            store.hold_dead_letters(false);
        });
    }

    /// Lets one held dead-letter write through after `after` (the others stay held), from
    /// another thread.
    pub fn let_one_dead_letter_through_after(self: &Arc<Self>, after: Duration) {
        let store = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            store.dead_letters.let_through(1);
        });
    }

    /// Holds (true) or lets go (false) every dead-letter write: a session that `term`s waits.
    pub fn hold_dead_letters(&self, held: bool) {
        self.dead_letters.set(held);
    }

    /// Holds (true) or lets go (false) the retention sweep's removal, which then waits between
    /// its scan and its delete.
    pub fn hold_removals(&self, held: bool) {
        self.removals.set(held);
    }

    pub fn fail_reads(&self, failing: bool) {
        self.reads_failing.store(failing, Ordering::SeqCst);
    }

    pub fn fail_dead_letters(&self, failing: bool) {
        self.dead_letters_failing.store(failing, Ordering::SeqCst);
    }

    pub fn fail_writes(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

/// Lets go of held offset writes, dead-letter writes and removals when dropped: a test that fails while holding
/// them must not leave a blocking thread waiting forever (the runtime would wait for it).
pub struct LetGo(pub Arc<ControlledStore>);

impl Drop for LetGo {
    fn drop(&mut self) {
        self.0.hold_dead_letters(false);
        self.0.hold_removals(false);
        self.0.release_writes();
        self.0.touches.set(false);
        self.0.resets.set(false);
    }
}

impl OffsetStore for ControlledStore {
    fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        if self.reads_failing.load(Ordering::SeqCst) {
            return Err(StoreError::Io("the store stopped answering (test)".into()));
        }
        self.inner.read(key)
    }

    fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError> {
        self.writes.wait_while_held();
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Io("disk full (test)".into()));
        }
        self.inner.write_offsets(writes)
    }

    /// A held write is a stall: the offset writer must not wait for it on a tokio worker.
    fn try_write_offsets(&self, writes: &[OffsetWrite]) -> Option<Result<Vec<WriteOutcome>, StoreError>> {
        if self.writes.is_held() || self.failing.load(Ordering::SeqCst) {
            return None;
        }
        self.inner.try_write_offsets(writes)
    }

    fn scan_each(&self, filter: &OffsetFilter, visit: &mut dyn FnMut(OffsetKey, OffsetRecord)) -> Result<(), StoreError> {
        self.inner.scan_each(filter, visit)
    }

    fn scan_page(&self, filter: &OffsetFilter, after: Option<&OffsetKey>, limit: usize) -> Result<Vec<(OffsetKey, OffsetRecord)>, StoreError> {
        self.inner.scan_page(filter, after, limit)
    }

    fn reset(&self, key: &OffsetKey, committed: u64, min_epoch: u64, now: u64) -> Result<OffsetRecord, StoreError> {
        self.resets_waiting.fetch_add(1, Ordering::SeqCst);
        self.resets.wait_while_held();
        self.resets_waiting.fetch_sub(1, Ordering::SeqCst);
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

    fn topic_incarnation(&self, topic: &TopicName) -> Result<ackgate::core::offsets::TopicIncarnation, StoreError> {
        self.inner.topic_incarnation(topic)
    }

    fn fence(&self, key: &OffsetKey) -> Result<Option<u64>, StoreError> {
        self.inner.fence(key)
    }

    fn remove_fenced(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        self.inner.remove_fenced(keys)
    }

    fn remove_topic(&self, topic: &TopicName) -> Result<usize, StoreError> {
        if self.topic_removals_failing.load(Ordering::SeqCst) {
            return Err(StoreError::Io("injected: the disk failed while removing a topic's offsets".into()));
        }
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

    fn pending_topic_removals(&self) -> Vec<(TopicName, ackgate::core::offsets::TopicRemoval)> {
        self.inner.pending_topic_removals()
    }

    fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError> {
        self.touches.wait_while_held();
        self.inner.touch(keys, now)
    }

    fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        self.removals.wait_while_held();
        self.inner.remove(keys)
    }

    fn remove_unchanged(&self, records: &[(OffsetKey, u64)]) -> Result<usize, StoreError> {
        self.removals.wait_while_held();
        self.inner.remove_unchanged(records)
    }

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
        self.dead_letters.wait_while_held();
        if self.dead_letters_failing.load(Ordering::SeqCst) {
            return Err(StoreError::Io("disk full (test)".into()));
        }
        self.inner.record_dead_letter(dead)
    }

    fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, StoreError> {
        self.inner.dead_letters(query)
    }

    fn remove_dead_letters_before(&self, at_ms: u64) -> Result<usize, StoreError> {
        self.inner.remove_dead_letters_before(at_ms)
    }

    fn remove_dead_letter_ids(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
        self.inner.remove_dead_letter_ids(ids)
    }

    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
        if self.dead_letter_removals_failing.load(Ordering::SeqCst) {
            return Err(StoreError::Io("injected: the disk failed while removing a topic's dead letters".into()));
        }
        self.inner.remove_dead_letters(topic)
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
        // An answer (offsets), not a publish's pending mark (none).
        if self.answers_failing.load(Ordering::SeqCst) && !publish.offsets.is_empty() {
            return Err(StoreError::Io("injected: the disk failed while remembering a publish's answer".into()));
        }
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
}
