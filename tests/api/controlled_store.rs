//! The real RocksDB offset store behind a switchboard: a test can hold every offset write
//! (as a slow disk or a long queue would) or make writes fail (a full disk), then let go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ackgate::core::names::{OffsetKey, TopicName};
use ackgate::core::offsets::{DeadLetter, DeadLetterPage, DeadLetterQuery, OffsetFilter, OffsetRecord, OffsetStore, OffsetWrite, StoreError, WriteOutcome};
use ackgate::store::rocks::RocksOffsetStore;

pub struct ControlledStore {
    inner: RocksOffsetStore,
    /// While true, `write_offsets` waits.
    held: Mutex<bool>,
    released: Condvar,
    /// While true, `write_offsets` fails.
    failing: AtomicBool,
}

impl ControlledStore {
    pub fn open(data_dir: &std::path::Path) -> Arc<Self> {
        std::fs::create_dir_all(data_dir).unwrap();
        let inner = RocksOffsetStore::open(data_dir, false).unwrap();
        Arc::new(Self { inner, held: Mutex::new(false), released: Condvar::new(), failing: AtomicBool::new(false) })
    }

    pub fn hold_writes(&self) {
        *self.held.lock().unwrap() = true;
    }

    pub fn release_writes(&self) {
        *self.held.lock().unwrap() = false;
        self.released.notify_all();
    }

    /// Releases held writes after `after`, from another thread.
    pub fn release_writes_after(self: &Arc<Self>, after: Duration) {
        let store = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            store.release_writes();
        });
    }

    pub fn fail_writes(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    fn wait_while_held(&self) {
        let mut held = self.held.lock().unwrap();
        while *held {
            held = self.released.wait(held).unwrap();
        }
    }
}

impl OffsetStore for ControlledStore {
    fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        self.inner.read(key)
    }

    fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError> {
        self.wait_while_held();
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Io("disk full (test)".into()));
        }
        self.inner.write_offsets(writes)
    }

    fn scan_each(&self, filter: &OffsetFilter, visit: &mut dyn FnMut(OffsetKey, OffsetRecord)) -> Result<(), StoreError> {
        self.inner.scan_each(filter, visit)
    }

    fn reset(&self, key: &OffsetKey, committed: u64, now: u64) -> Result<OffsetRecord, StoreError> {
        self.inner.reset(key, committed, now)
    }

    fn topic_generation(&self, topic: &TopicName) -> Result<u64, StoreError> {
        self.inner.topic_generation(topic)
    }

    fn remove_topic(&self, topic: &TopicName) -> Result<usize, StoreError> {
        self.inner.remove_topic(topic)
    }

    fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError> {
        self.inner.touch(keys, now)
    }

    fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        self.inner.remove(keys)
    }

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
        self.inner.record_dead_letter(dead)
    }

    fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, StoreError> {
        self.inner.dead_letters(query)
    }

    fn remove_dead_letters_before(&self, at_ms: u64) -> Result<usize, StoreError> {
        self.inner.remove_dead_letters_before(at_ms)
    }

    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
        self.inner.remove_dead_letters(topic)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
}
