//! Partitions added to a topic while clients read it (Kafka's `CreatePartitions`, the embedded
//! log's `add_partitions`): the backend's partition counts are read periodically, and when a
//! topic has more than before, every live subscription of it is extended to the new partitions
//! (`Dispatcher::partitions_grown`), each from its log start. A RocketMQ lite topic has a
//! partition per master of its parent and is listed by no `topics()`: when its parent grows,
//! the lite topics of it that sessions read are read again too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::dispatcher::Dispatcher;
use super::names::TopicName;

/// Reads the partition counts every `every` until `stop`.
pub async fn watch_partition_counts(d: Arc<Dispatcher>, every: Duration, stop: CancellationToken) {
    let mut known: HashMap<TopicName, u32> = HashMap::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
        let topics = match d.backend.topics().await {
            Ok(topics) => topics,
            Err(e) => {
                tracing::debug!(error = %e, "reading partition counts failed; trying again on the next tick");
                continue;
            }
        };
        for (topic, partitions) in topics {
            match known.insert(topic.clone(), partitions) {
                Some(before) if partitions > before => {
                    tracing::info!(%topic, before, partitions, "partitions added to a topic: its subscriptions are extended");
                    d.partitions_grown(&topic, partitions);
                }
                // First seen: it may have grown since a session planned it (a topic created and
                // grown between two reads). Sessions that feed as many already ignore it.
                None => d.partitions_grown(&topic, partitions),
                Some(_) => continue,
            }
            for lite in d.subscribed_lite_topics_of(&topic) {
                match d.backend.partitions(&lite).await {
                    Ok(Some(partitions)) => d.partitions_grown(&lite, partitions),
                    Ok(None) => {}
                    Err(e) => {
                        // Forgotten, so the next tick takes the parent as first seen and asks again.
                        tracing::debug!(topic = %lite, error = %e, "reading a lite topic's partition count failed; trying again on the next tick");
                        known.remove(&topic);
                    }
                }
            }
        }
    }
}
