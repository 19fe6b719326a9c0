//! An in-memory `OffsetStore`: the CAS-max is a max under one lock. Nothing survives a restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use crate::core::dead_letters::{DeadLetter, DeadLetterId, DeadLetterPage, DeadLetterQuery, Gap, GapPage};
use crate::core::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use crate::core::offsets::{
    LogEpoch, OffsetEpoch, OffsetFilter, OffsetRecord, OffsetStore, OffsetWrite, StoreError, TopicIncarnation, TopicRemoval, WriteOutcome,
};
use crate::core::remembered_publish::{IdempotencyKey, RememberedPublish};

#[derive(Default)]
pub struct MemoryOffsetStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Ordered by (topic, client, partition), the same order as the RocksDB encoding.
    records: BTreeMap<OffsetKey, OffsetRecord>,
    dead_letters: Vec<DeadLetter>,
    /// Generation of each topic deleted at least once (absent = 0).
    generations: HashMap<TopicName, u64>,
    /// Topics whose removal began (`begin_topic_removal`) and has not finished.
    removals_pending: HashMap<TopicName, TopicRemoval>,
    publishes: HashMap<(TopicName, IdempotencyKey), RememberedPublish>,
    gaps: Vec<Gap>,
    /// Dead letters marked for redrive.
    redrives: BTreeSet<DeadLetterId>,
    /// Partitions whose log lost its tail at least once (absent: epoch 0).
    log_epochs: HashMap<TopicPartition, LogEpoch>,
    /// Topics deleted at least once (absent: the first incarnation).
    incarnations: HashMap<TopicName, TopicIncarnation>,
    /// Fences left by operators' deletions of records (`remove_fenced`).
    fences: HashMap<OffsetKey, OffsetEpoch>,
}

impl Inner {
    /// The next incarnation of `topic` (its generation is starting).
    fn start_incarnation(&mut self, topic: &TopicName) {
        let seen = self.log_epochs.iter().filter(|(tp, _)| tp.topic == *topic).map(|(_, l)| l.epoch).max().unwrap_or(0);
        let next = self.incarnations.get(topic).copied().unwrap_or_default().next(seen, crate::core::resume_token::new_incarnation_id());
        self.incarnations.insert(topic.clone(), next);
        self.fences.retain(|key, _| key.topic != *topic);
    }

    fn log_epoch(&self, tp: &TopicPartition) -> LogEpoch {
        self.incarnations.get(&tp.topic).copied().unwrap_or_default().floored(self.log_epochs.get(tp).copied())
    }

    /// Redrive marks go with their dead letters.
    fn drop_unmatched_marks(&mut self) {
        let dead: BTreeSet<DeadLetterId> = self.dead_letters.iter().map(DeadLetter::id).collect();
        self.redrives.retain(|id| dead.contains(id));
    }
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
        let inner = &mut *inner;
        Ok(writes
            .iter()
            .map(|w| {
                if inner.generations.get(&w.key.topic).copied().unwrap_or(0) != w.generation {
                    return WriteOutcome::Obsolete;
                }
                match inner.records.get_mut(&w.key) {
                    Some(current) if !current.is_advanced_by(w) => WriteOutcome::Stale,
                    Some(current) => {
                        *current = current.advanced_by(w);
                        WriteOutcome::Advanced
                    }
                    None if inner.fences.get(&w.key).is_some_and(|fence| w.epoch < *fence) => WriteOutcome::Stale,
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

    fn scan_page(&self, filter: &OffsetFilter, after: Option<&OffsetKey>, limit: usize) -> Result<Vec<(OffsetKey, OffsetRecord)>, StoreError> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let inner = self.lock();
        Ok(inner.records.range((from, Bound::Unbounded)).filter(|(k, _)| filter.matches(k)).take(limit).map(|(k, r)| (k.clone(), *r)).collect())
    }

    fn reset(&self, key: &OffsetKey, committed: u64, min_epoch: OffsetEpoch, now: u64) -> Result<OffsetRecord, StoreError> {
        let mut inner = self.lock();
        let min_epoch = min_epoch.max(inner.fences.get(key).copied().unwrap_or(0));
        let record = OffsetRecord::lowered(inner.records.get(key), committed, min_epoch, now);
        inner.records.insert(key.clone(), record);
        Ok(record)
    }

    fn log_epoch(&self, tp: &TopicPartition) -> Result<LogEpoch, StoreError> {
        Ok(self.lock().log_epoch(tp))
    }

    fn step_log_epoch(&self, tp: &TopicPartition, seen: u32, log_end: u64) -> Result<LogEpoch, StoreError> {
        let mut inner = self.lock();
        let mut current = inner.log_epoch(tp);
        if current.epoch == seen {
            current = LogEpoch { epoch: seen.saturating_add(1), log_end };
            inner.log_epochs.insert(tp.clone(), current);
        }
        Ok(current)
    }

    fn topic_incarnation(&self, topic: &TopicName) -> Result<TopicIncarnation, StoreError> {
        Ok(self.lock().incarnations.get(topic).copied().unwrap_or_default())
    }

    fn fence(&self, key: &OffsetKey) -> Result<Option<OffsetEpoch>, StoreError> {
        Ok(self.lock().fences.get(key).copied())
    }

    fn remove_fenced(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let mut removed = 0;
        for key in keys {
            if let Some(record) = inner.records.remove(key) {
                removed += 1;
                let fence = inner.fences.entry(key.clone()).or_insert(0);
                *fence = (*fence).max(record.epoch.saturating_add(1));
            }
        }
        Ok(removed)
    }

    fn topic_generation(&self, topic: &TopicName) -> Result<u64, StoreError> {
        Ok(self.lock().generations.get(topic).copied().unwrap_or(0))
    }

    fn remove_topic(&self, topic: &TopicName) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.records.len();
        inner.records.retain(|key, _| key.topic != *topic);
        inner.publishes.retain(|(t, _), _| t != topic);
        if inner.removals_pending.remove(topic) != Some(TopicRemoval::LogDeleted) {
            *inner.generations.entry(topic.clone()).or_insert(0) += 1;
            inner.start_incarnation(topic);
        }
        inner.log_epochs.retain(|tp, _| tp.topic != *topic);
        Ok(before - inner.records.len())
    }

    fn begin_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError> {
        self.lock().removals_pending.entry(topic.clone()).or_insert(TopicRemoval::Begun);
        Ok(())
    }

    fn topic_log_deleted(&self, topic: &TopicName) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if inner.removals_pending.get(topic) == Some(&TopicRemoval::Begun) {
            inner.removals_pending.insert(topic.clone(), TopicRemoval::LogDeleted);
            *inner.generations.entry(topic.clone()).or_insert(0) += 1;
            inner.start_incarnation(topic);
        }
        Ok(())
    }

    fn cancel_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError> {
        self.lock().removals_pending.remove(topic);
        Ok(())
    }

    fn pending_topic_removals(&self) -> Vec<(TopicName, TopicRemoval)> {
        self.lock().removals_pending.iter().map(|(t, s)| (t.clone(), *s)).collect()
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

    fn remove_unchanged(&self, records: &[(OffsetKey, u64)]) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let mut removed = 0;
        for (key, updated_at) in records {
            if inner.records.get(key).is_some_and(|r| r.updated_at == *updated_at) {
                inner.records.remove(key);
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
        // One per (key, offset), as in the RocksDB store: a second term of it replaces the first.
        let mut inner = self.lock();
        inner.dead_letters.retain(|d| d.id() != dead.id());
        inner.dead_letters.push(dead.clone());
        Ok(())
    }

    fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, StoreError> {
        // The RocksDB store's page order: (topic, client, ...) or (client, topic, ...).
        let order = |d: &DeadLetter| match query.by_client() {
            true => (d.client_id.as_str().to_string(), d.topic.as_str().to_string(), d.partition, d.offset),
            false => (d.topic.as_str().to_string(), d.client_id.as_str().to_string(), d.partition, d.offset),
        };
        let after = query.after.as_ref().map(|id| {
            let probe = DeadLetter {
                topic: id.key.topic.clone(),
                client_id: id.key.client_id.clone(),
                partition: id.key.partition,
                offset: id.offset,
                attempts: 0,
                reason: String::new(),
                at: 0,
                log_epoch: 0,
            };
            order(&probe)
        });
        let mut rows: Vec<DeadLetter> =
            self.lock().dead_letters.iter().filter(|d| query.matches(d) && after.as_ref().is_none_or(|a| order(d) > *a)).cloned().collect();
        rows.sort_by_key(order);
        rows.truncate(query.limit + 1);
        Ok(DeadLetterPage::from_rows(rows, query.limit))
    }

    fn remove_dead_letters_before(&self, at_ms: u64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.dead_letters.len();
        inner.dead_letters.retain(|d| d.at >= at_ms);
        inner.drop_unmatched_marks();
        Ok(before - inner.dead_letters.len())
    }

    fn remove_dead_letter_ids(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.dead_letters.len();
        inner.dead_letters.retain(|d| !ids.contains(&d.id()));
        inner.drop_unmatched_marks();
        Ok(before - inner.dead_letters.len())
    }

    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.dead_letters.len();
        inner.dead_letters.retain(|d| d.topic != *topic);
        inner.drop_unmatched_marks();
        Ok(before - inner.dead_letters.len())
    }

    fn mark_redrive(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let existing: Vec<DeadLetterId> = ids.iter().filter(|id| inner.dead_letters.iter().any(|d| d.id() == **id)).cloned().collect();
        let marked = existing.len();
        inner.redrives.extend(existing);
        Ok(marked)
    }

    fn redrives(&self, topic: &TopicName, client_id: &ClientId, after: Option<&DeadLetterId>, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let inner = self.lock();
        let rows = inner
            .redrives
            .iter()
            .filter(|id| id.key.topic == *topic && id.key.client_id == *client_id && after.is_none_or(|a| *id > a))
            .filter_map(|id| inner.dead_letters.iter().find(|d| d.id() == *id).cloned())
            .take(limit)
            .collect();
        Ok(rows)
    }

    fn settle_redrive(&self, id: &DeadLetterId, again: Option<&DeadLetter>) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if !inner.redrives.remove(id) {
            return Ok(()); // settled already: an acknowledged dead letter never comes back
        }
        inner.dead_letters.retain(|d| d.id() != *id);
        inner.dead_letters.extend(again.cloned());
        Ok(())
    }

    fn redrives_pending(&self) -> usize {
        self.lock().redrives.len()
    }

    fn record_gap(&self, gap: &Gap) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let key = |g: &Gap| (g.topic.clone(), g.client_id.clone(), g.partition, g.from);
        match inner.gaps.binary_search_by_key(&key(gap), key) {
            Ok(i) => inner.gaps[i] = gap.clone(),
            Err(i) => inner.gaps.insert(i, gap.clone()),
        }
        Ok(())
    }

    fn gaps(&self, query: &DeadLetterQuery) -> Result<GapPage, StoreError> {
        let inner = self.lock();
        let after = query.after.as_ref().map(|a| (a.key.topic.clone(), a.key.client_id.clone(), a.key.partition, a.offset));
        let mut gaps: Vec<Gap> = inner
            .gaps
            .iter()
            .filter(|g| query.topic.as_ref().is_none_or(|t| *t == g.topic) && query.client_id.as_ref().is_none_or(|c| *c == g.client_id))
            .filter(|g| after.as_ref().is_none_or(|a| (g.topic.clone(), g.client_id.clone(), g.partition, g.from) > *a))
            .take(query.limit + 1)
            .cloned()
            .collect();
        let next = (gaps.len() > query.limit).then(|| {
            gaps.truncate(query.limit);
            gaps.last().map(Gap::id)
        });
        Ok(GapPage { gaps, next: next.flatten() })
    }

    fn remove_gaps(&self, topic: Option<&TopicName>, before_ms: u64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.gaps.len();
        inner.gaps.retain(|g| match topic {
            Some(topic) => g.topic != *topic,
            None => g.at >= before_ms,
        });
        Ok(before - inner.gaps.len())
    }

    fn remembered_publish(&self, topic: &TopicName, key: &IdempotencyKey) -> Result<Option<RememberedPublish>, StoreError> {
        Ok(self.lock().publishes.get(&(topic.clone(), key.clone())).cloned())
    }

    fn remember_publish(&self, topic: &TopicName, key: &IdempotencyKey, publish: &RememberedPublish) -> Result<(), StoreError> {
        self.lock().publishes.insert((topic.clone(), key.clone()), publish.clone());
        Ok(())
    }

    fn remembered_publishes(&self) -> usize {
        self.lock().publishes.len()
    }

    fn forget_publishes_expired_at(&self, now: u64) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let before = inner.publishes.len();
        inner.publishes.retain(|_, p| p.expires_at > now);
        Ok(before - inner.publishes.len())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
