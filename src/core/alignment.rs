//! Boot alignment (`align_pull_offsets_to_ack`): before serving, each partition's pull cursor goes
//! to the smallest committed offset among the clients known for it, so nothing pulled but not yet
//! acknowledged before a crash is skipped. Partitions without known clients keep their
//! checkpointed cursor, or start where the reset policy says. Committed offsets above the log end
//! are lowered to it on the way (`offsets::lower_to_log_end`).

use std::collections::HashMap;

use super::backend::{BackendError, LogBackend};
use super::dispatcher::ResetPolicy;
use super::names::TopicPartition;
use super::offsets::{lower_to_log_end, OffsetFilter, OffsetStore};

/// Offsets above the log end named one by one per topic before a summary line.
const LOGGED_PER_TOPIC: usize = 10;

/// What alignment did, for the start-up log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AlignmentReport {
    pub partitions: usize,
    /// Cursors set from committed offsets.
    pub aligned: usize,
    /// Cursors set by the reset policy (no clients, no checkpoint).
    pub by_policy: usize,
    /// Committed offsets found above their partition's log end and lowered to it.
    pub lowered: usize,
}

pub async fn align_pull_offsets_to_ack(
    backend: &dyn LogBackend,
    store: &dyn OffsetStore,
    policy: ResetPolicy,
    now_ms: u64,
) -> Result<AlignmentReport, String> {
    let mut report = AlignmentReport::default();
    let topics = backend.topics().await.map_err(|e: BackendError| e.to_string())?;
    for (topic, partitions) in topics {
        let mut bounds = Vec::with_capacity(partitions as usize);
        for partition in 0..partitions {
            let tp = TopicPartition::new(topic.clone(), partition);
            bounds.push(backend.log_bounds(&tp).await.map_err(|e| e.to_string())?);
        }
        let mut smallest: HashMap<u32, u64> = HashMap::new();
        let mut above_log_end = Vec::new();
        let filter = OffsetFilter { topic: Some(topic.clone()), ..Default::default() };
        store
            .scan_each(&filter, &mut |key, record| {
                // A partition the topic no longer has (recreated with fewer) is nobody's cursor.
                let Some(log_end) = bounds.get(key.partition as usize).map(|b| b.log_end) else { return };
                let committed = record.committed.min(log_end);
                if record.committed > log_end {
                    above_log_end.push((key.clone(), record.committed, log_end));
                }
                let entry = smallest.entry(key.partition).or_insert(committed);
                *entry = (*entry).min(committed);
            })
            .map_err(|e| e.to_string())?;
        let count = above_log_end.len();
        for (i, (key, committed, log_end)) in above_log_end.into_iter().enumerate() {
            // Each key is named, up to a point: a log that lost its tail can strand millions.
            if i < LOGGED_PER_TOPIC {
                tracing::warn!(%key, committed, log_end, "committed offset above the log end: lowered to the log end");
            }
            lower_to_log_end(store, &key, log_end, now_ms).map_err(|e| e.to_string())?;
            report.lowered += 1;
        }
        if count > LOGGED_PER_TOPIC {
            tracing::warn!(%topic, lowered = count, "committed offsets above the log end lowered to it (the first {LOGGED_PER_TOPIC} named above)");
        }
        for (partition, bounds) in (0..partitions).zip(bounds) {
            let tp = TopicPartition::new(topic.clone(), partition);
            report.partitions += 1;
            let cursor = match (smallest.get(&partition), backend.pull_offset(&tp)) {
                (Some(committed), _) => {
                    report.aligned += 1;
                    *committed
                }
                (None, Some(checkpointed)) => checkpointed,
                (None, None) => {
                    report.by_policy += 1;
                    match policy {
                        ResetPolicy::Earliest => bounds.log_start,
                        ResetPolicy::Latest => bounds.log_end,
                    }
                }
            };
            // Not `clamp`: it panics on bounds a broker answered inverted.
            backend.seek(&tp, cursor.min(bounds.log_end).max(bounds.log_start));
        }
    }
    Ok(report)
}
