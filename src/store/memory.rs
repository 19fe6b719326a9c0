//! An in-memory `OffsetStore`: the CAS-max is a max under one lock. Nothing survives a restart.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::core::names::{ClientId, OffsetKey, TopicName};
use crate::core::offsets::{DeadLetter, OffsetFilter, OffsetRecord, OffsetStore, OffsetWrite, StoreError, WriteOutcome};

#[derive(Default)]
pub struct MemoryOffsetStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Ordered by (topic, client, partition), the same order as the RocksDB encoding.
    records: BTreeMap<OffsetKey, OffsetRecord>,
    dead_letters: Vec<DeadLetter>,
}

impl MemoryOffsetStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl OffsetStore for MemoryOffsetStore {
    fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        Ok(self.lock().records.get(key).copied())
    }

    fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError> {
        let mut inner = self.lock();
        Ok(writes
            .iter()
            .map(|w| {
                match inner.records.get_mut(&w.key) {
                    Some(current) if !current.is_advanced_by(w) => WriteOutcome::Stale,
                    Some(current) => {
                        *current = current.advanced_by(w);
                        WriteOutcome::Advanced
                    }
                    None => {
                        inner.records.insert(w.key.clone(), OffsetRecord::from_write(w));
                        WriteOutcome::Advanced
                    }
                }
            })
            .collect())
    }

    fn scan_each(&self, filter: &OffsetFilter, visit: &mut dyn FnMut(OffsetKey, OffsetRecord)) -> Result<(), StoreError> {
        for (key, record) in self.lock().records.iter().filter(|(k, _)| filter.matches(k)) {
            visit(key.clone(), *record);
        }
        Ok(())
    }

    fn reset(&self, key: &OffsetKey, committed: u64, now: u64) -> Result<OffsetRecord, StoreError> {
        let mut inner = self.lock();
        let last_acked = inner.records.get(key).and_then(|r| r.last_acked);
        let record = OffsetRecord { committed, last_acked, updated_at: now };
        inner.records.insert(key.clone(), record);
        Ok(record)
    }

    fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let mut touched = 0;
        for key in keys {
            if let Some(record) = inner.records.get_mut(key) {
                record.updated_at = now;
                touched += 1;
            }
        }
        Ok(touched)
    }

    fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        Ok(keys.iter().filter(|k| inner.records.remove(k).is_some()).count())
    }

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
        self.lock().dead_letters.push(dead.clone());
        Ok(())
    }

    fn dead_letters(&self, topic: Option<&TopicName>, client: Option<&ClientId>) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(self
            .lock()
            .dead_letters
            .iter()
            .filter(|d| topic.is_none_or(|t| *t == d.topic) && client.is_none_or(|c| *c == d.client_id))
            .cloned()
            .collect())
    }

    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.dead_letters.len();
        inner.dead_letters.retain(|d| d.topic != *topic);
        Ok(before - inner.dead_letters.len())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
