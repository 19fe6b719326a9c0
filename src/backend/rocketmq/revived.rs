//! Revived POP messages: a copy the broker re-queued in the group's retry topic because it was
//! popped and not acknowledged in time. It is settled at the original's partition and offset,
//! known from the `UNIQ_KEY` table (`pop::Positions`) or, for an original this instance has not
//! read since it started, looked up at the broker by that key.

use std::time::Duration;

use super::layout::{self, PartitionQueue};
use super::message::{StoredMessage, UNIQ_KEY};
use super::pop::{self, Handle};
use super::{broker, RocketMqLog};
use crate::core::names::{TopicName, TopicPartition};

/// How long the lookup of a revived message's original may take (it holds the reader's poll).
const REVIVED_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);
/// Keys of revived messages not found at the broker that are not looked up again (then forgotten
/// all at once).
const REVIVED_MISSES_REMEMBERED: usize = 10_000;

impl RocketMqLog {
    /// The original partition and offset of a popped message, and its receipt handle. A revived
    /// message whose original this instance has not read since it started (the `UNIQ_KEY` table
    /// is in memory) is looked up at the broker that popped it; `None` when that fails too (left
    /// to the broker, counted).
    pub(super) async fn handle_of(
        &self,
        q: &PartitionQueue,
        polled: &TopicPartition,
        header: &broker::PopHeader,
        m: &StoredMessage,
    ) -> Option<(TopicPartition, u64, Handle)> {
        let popped = pop::receipt(&self.settings.consumer_group, q, polled, header, m, &self.positions);
        if popped.is_some() || !pop::is_revived(m) {
            return popped;
        }
        let uniq = m.property(UNIQ_KEY);
        let found = match uniq {
            Some(uniq) => self.find_original(q, &polled.topic, uniq, m.born_timestamp).await,
            None => None,
        };
        let Some((tp, offset)) = found else {
            crate::core::metrics::rocketmq_unmapped_revived().increment(1);
            tracing::warn!(topic = %polled.topic, uniq_key = uniq.unwrap_or("-"), "a revived message whose original is not found is left to the broker");
            return None;
        };
        self.positions.learn(uniq.expect("found by it"), &tp, offset);
        tracing::info!(%tp, offset, "a revived message's original found at the broker by its UNIQ_KEY");
        Some((tp, offset, pop::handle(&self.settings.consumer_group, q, polled, header, m)))
    }

    /// Where the original of a revived message is: QUERY_MESSAGE by its `UNIQ_KEY` (the broker's
    /// index) at the broker that popped the copy, which is the one that holds the original (the
    /// revive service writes the copy where the original's checkpoint is). A revived copy names
    /// neither the original's queue nor its offset (Apache's `PopReviveService` copies the
    /// properties and the born time only), so the index is the one way back after a restart.
    /// Exactly one stored message of `topic` with that key and that born time must match (a
    /// producer's retried send keeps the key, with a new born time); a key that found nothing is
    /// not asked again (`REVIVED_MISSES_REMEMBERED`). It runs inside the partition reader's poll:
    /// one broker, a short timeout, no resend.
    async fn find_original(&self, q: &PartitionQueue, topic: &TopicName, uniq: &str, born: u64) -> Option<(TopicPartition, u64)> {
        if self.revived_misses.lock().unwrap().contains(uniq) {
            return None;
        }
        let route = self.route(topic).await.ok()??;
        let timeout = self.settings.request_timeout.min(REVIVED_LOOKUP_TIMEOUT);
        let found = match self.broker.query_by_uniq_key(&q.broker_addr, topic.as_str(), uniq, timeout).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(%topic, broker = %q.broker_name, uniq_key = uniq, error = %e, "looking up a revived message's original failed");
                return None;
            }
        };
        let mut matching = found.into_iter().flatten().filter(|m| m.topic == topic.as_str() && m.property(UNIQ_KEY) == Some(uniq) && m.born_timestamp == born);
        let original = match (matching.next(), matching.next()) {
            (Some(original), None) => layout::partition_of(&route.layout, &q.broker_name, original.queue_id).map(|p| (p, original.queue_offset)),
            _ => None,
        };
        match original {
            Some((partition, offset)) => Some((TopicPartition::new(topic.clone(), partition), offset)),
            None => {
                let mut misses = self.revived_misses.lock().unwrap();
                if misses.len() >= REVIVED_MISSES_REMEMBERED {
                    misses.clear();
                }
                misses.insert(uniq.to_string());
                None
            }
        }
    }
}
