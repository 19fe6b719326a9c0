//! Log retention: deletes the oldest events of each partition by age and by size.

use std::sync::Arc;

use rocksdb::{Direction, IteratorMode, WriteBatch};
use tokio::sync::Notify;

use super::codec::StoredEvent;
use super::{end_marker_key, event_key, io_err, partition_prefix, LogState, CF_ENDS, CF_EVENTS};
use crate::core::backend::BackendError;
use crate::core::names::TopicName;

impl LogState {
    /// Deletes the oldest events of every partition that break the age or size limit. Returns how
    /// many events went. Called periodically by the gateway.
    pub fn enforce_retention(&self) -> Result<u64, BackendError> {
        let now = self.clock.now_ms();
        type Target = (TopicName, u32, u64, u64, u64, Arc<Notify>);
        let targets: Vec<Target> = self
            .topics
            .read()
            .unwrap()
            .iter()
            .flat_map(|(t, ps)| ps.iter().enumerate().map(|(i, p)| (t.clone(), i as u32, p.start, p.end, p.bytes_before_end, p.appended.clone())))
            .filter(|(_, _, start, end, _, _)| start < end)
            .collect();
        let mut removed = 0;
        for (topic, partition, start, end, bytes_before_end, incarnation) in targets {
            // The scan for the cut runs without the append lock: publishes only add events at
            // the end, above anything it reads, so it never makes them wait.
            let (new_start, new_bytes_before_start) = self.retention_cut(&topic, partition, start, end, bytes_before_end, now)?;
            if new_start == start {
                continue;
            }
            let _guard = self.append_lock.lock().unwrap();
            // The same partition as scanned: not deleted and created again meanwhile (a new
            // topic has new `appended` notifiers), and not trimmed by anyone else.
            let unchanged = self
                .topics
                .read()
                .unwrap()
                .get(&topic)
                .and_then(|ps| ps.get(partition as usize))
                .is_some_and(|p| Arc::ptr_eq(&p.appended, &incarnation) && p.start == start);
            if !unchanged {
                continue;
            }
            let cf = self.cf(CF_EVENTS)?;
            let mut batch = WriteBatch::default();
            batch.delete_range_cf(&cf, event_key(&topic, partition, start), event_key(&topic, partition, new_start));
            if new_start == end {
                let ends_cf = self.cf(CF_ENDS)?;
                batch.put_cf(&ends_cf, end_marker_key(&topic, partition), end.to_be_bytes());
            }
            self.db.write_opt(batch, &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
            if let Some(p) = self.topics.write().unwrap().get_mut(&topic).and_then(|ps| ps.get_mut(partition as usize)) {
                p.start = new_start;
                p.bytes_before_start = new_bytes_before_start;
            }
            removed += new_start - start;
            tracing::debug!(%topic, partition, from = start, to = new_start, "retention deleted events");
        }
        Ok(removed)
    }

    /// First offset to keep in one partition, and the bytes written before it.
    fn retention_cut(&self, topic: &TopicName, partition: u32, start: u64, end: u64, bytes_before_end: u64, now: u64) -> Result<(u64, u64), BackendError> {
        let max_age = self.settings.retention_ms;
        let max_bytes = self.settings.retention_bytes_per_partition;
        let cf = self.cf(CF_EVENTS)?;
        let prefix = partition_prefix(topic, partition);
        let mut keep_from = (start, 0);
        // A run of events that do not decode: its first offset and the bytes before it.
        let mut undecodable_from: Option<(u64, u64)> = None;
        for item in self.db.iterator_cf(&cf, IteratorMode::From(&event_key(topic, partition, start), Direction::Forward)) {
            let (key, value) = item.map_err(io_err)?;
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 8 {
                break;
            }
            let offset = u64::from_be_bytes(key[prefix.len()..].try_into().unwrap());
            let Some(stored) = StoredEvent::decode(&value) else {
                // Bits flipped on disk: its age is unknown, so it goes only with the event after
                // it (never a failed retention pass, never deleted while retention is off).
                if offset >= end {
                    break;
                }
                undecodable_from.get_or_insert((offset, keep_from.1));
                continue;
            };
            let too_old = max_age > 0 && now.saturating_sub(stored.timestamp) > max_age;
            let too_big = max_bytes > 0 && bytes_before_end.saturating_sub(stored.bytes_before) > max_bytes;
            if !(too_old || too_big) || offset >= end {
                return Ok(undecodable_from.unwrap_or((offset, stored.bytes_before)));
            }
            if undecodable_from.take().is_some() {
                tracing::warn!(%topic, partition, before = offset, "retention deleted events that could not be decoded");
            }
            keep_from = (offset + 1, stored.bytes_before + stored.encoded_len);
        }
        Ok(undecodable_from.unwrap_or(keep_from))
    }
}
