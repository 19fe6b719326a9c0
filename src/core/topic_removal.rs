//! Removing a deleted topic's offsets, dead letters and gaps, in steps that survive being cut
//! short (issue 39, item 5). `DELETE /topics/{topic}` first marks the removal pending in the store
//! (`OffsetStore::begin_topic_removal`), then deletes the log and records that
//! (`topic_log_deleted`, which starts the topic's next generation), then removes what the store
//! holds of the topic and clears the mark. A removal cut short by a store error is finished by a retried
//! DELETE, and one cut short by a crash is finished at start, before anything is served; until
//! then a subscribe to the name is refused. The old offsets never apply to a topic created again
//! under the name.

use super::backend::LogBackend;
use super::names::TopicName;
use super::offsets::{OffsetStore, StoreError, TopicRemoval};

/// What a finished removal took away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    pub offsets: usize,
    pub dead_letters: usize,
}

/// Removes the topic's gaps, dead letters and offsets, the offsets last: their removal clears the
/// pending mark, so a step cut short before it leaves the removal pending, to be finished by a
/// retry or at start. Blocking (a prefix scan and a delete per key): call it on the blocking pool.
pub fn finish_removal(store: &dyn OffsetStore, topic: &TopicName) -> Result<Removed, StoreError> {
    store.remove_gaps(Some(topic), 0)?;
    let dead_letters = store.remove_dead_letters(topic)?;
    let offsets = store.remove_topic(topic)?;
    Ok(Removed { offsets, dead_letters })
}

/// At start, before serving: each removal a crash cut short is finished once its log was deleted
/// (whatever the log holds under the name now: a topic created since is another), and given up
/// (the mark cleared, everything kept) when the crash came before the log's deletion and the log
/// still has the topic.
pub async fn finish_pending_removals(backend: &dyn LogBackend, store: &dyn OffsetStore) -> Result<(), StoreError> {
    for (topic, step) in store.pending_topic_removals() {
        let exists = match step {
            TopicRemoval::LogDeleted => Ok(None),
            TopicRemoval::Begun => backend.partitions(&topic).await,
        };
        match exists {
            Ok(Some(_)) => {
                tracing::warn!(%topic, "a deletion of this topic was cut short before its log was deleted: the topic stays, with its offsets");
                store.cancel_topic_removal(&topic)?;
            }
            Ok(None) => {
                let removed = finish_removal(store, &topic)?;
                tracing::warn!(%topic, offsets_deleted = removed.offsets, dead_letters_deleted = removed.dead_letters, "finished the removal of a deleted topic's offsets that was cut short");
            }
            Err(e) => {
                // The mark stays: a later start or a retried DELETE finishes it; until then the
                // topic's subscriptions are refused.
                tracing::warn!(%topic, error = %e, "the log could not say whether a topic whose deletion was cut short exists; its removal stays pending");
            }
        }
    }
    Ok(())
}
