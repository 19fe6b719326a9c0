//! Boot alignment (`align_pull_offsets_to_ack`): before serving, each partition's pull cursor goes
//! to the smallest committed offset among the clients known for it, so nothing pulled but not yet
//! acknowledged before a crash is skipped. Partitions without known clients keep their
//! checkpointed cursor, or start where the reset policy says.

use std::collections::HashMap;

use super::backend::{BackendError, LogBackend};
use super::dispatcher::ResetPolicy;
use super::names::TopicPartition;
use super::offsets::{OffsetFilter, OffsetStore};

/// What alignment did, for the start-up log line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AlignmentReport {
    pub partitions: usize,
    /// Cursors set from committed offsets.
    pub aligned: usize,
    /// Cursors set by the reset policy (no clients, no checkpoint).
    pub by_policy: usize,
}

pub async fn align_pull_offsets_to_ack(
    backend: &dyn LogBackend,
    store: &dyn OffsetStore,
    policy: ResetPolicy,
) -> Result<AlignmentReport, String> {
    let mut report = AlignmentReport::default();
    let topics = backend.topics().await.map_err(|e: BackendError| e.to_string())?;
    for (topic, partitions) in topics {
        let mut smallest: HashMap<u32, u64> = HashMap::new();
        let filter = OffsetFilter { topic: Some(topic.clone()), ..Default::default() };
        store
            .scan_each(&filter, &mut |key, record| {
                let entry = smallest.entry(key.partition).or_insert(record.committed);
                *entry = (*entry).min(record.committed);
            })
            .map_err(|e| e.to_string())?;
        for partition in 0..partitions {
            let tp = TopicPartition::new(topic.clone(), partition);
            let bounds = backend.log_bounds(&tp).await.map_err(|e| e.to_string())?;
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
            backend.seek(&tp, cursor.clamp(bounds.log_start, bounds.log_end));
        }
    }
    Ok(report)
}
