//! `LogBackend` implementations, chosen by `storage.backend`: `embedded` (RocksDB, the default)
//! and `kafka`, plus the pull checkpoint file they share.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

pub(crate) mod checkpoint;
pub mod embedded;
pub mod kafka;
pub mod rocketmq;

use crate::config::{BackendKind, Config};
use crate::core::backend::LogBackend;
use crate::core::clock::Clock;
use embedded::{EmbeddedLog, EmbeddedLogSettings};
use kafka::{KafkaLog, KafkaSettings};
use rocketmq::{RocketMqLog, RocketMqSettings};

/// The partition of a keyed event on backends that choose it themselves (embedded, RocketMQ):
/// 32-bit FNV-1a of the key: stable, so a key maps to the same partition across restarts.
pub fn key_partition(key: &str, partitions: u32) -> u32 {
    let hash = key.bytes().fold(0x811c_9dc5u32, |hash, b| (hash ^ u32::from(b)).wrapping_mul(0x0100_0193));
    hash % partitions.max(1)
}

/// Lite topics (`parent@lite`) are RocketMQ's: every other backend refuses to create one.
pub fn refuse_lite_topic(topic: &crate::core::names::TopicName) -> Result<(), crate::core::backend::BackendError> {
    match topic.lite() {
        Some(_) => Err(crate::core::backend::BackendError::InvalidInput(format!(
            "{topic} is a lite topic (parent@lite): lite topics exist only on RocketMQ, under a parent listed in rocketmq.lite_parents"
        ))),
        None => Ok(()),
    }
}

/// The configured backend: the trait object the core uses, plus what only one kind can do.
#[derive(Clone)]
pub enum Backend {
    Embedded(Arc<EmbeddedLog>),
    Kafka(Arc<KafkaLog>),
    RocketMq(Arc<RocketMqLog>),
}

impl Backend {
    pub async fn open(config: &Config, data_dir: &Path, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        if config.storage.backend == BackendKind::Kafka {
            let k = &config.kafka;
            let settings = KafkaSettings {
                bootstrap_servers: k.bootstrap_servers.clone(),
                topics: k.topics.clone(),
                properties: k.properties.clone(),
                replication_factor: k.replication_factor,
                request_timeout: Duration::from_millis(k.request_timeout_ms),
                publish_timeout: Duration::from_millis(k.publish_timeout_ms),
            };
            let log = KafkaLog::open(data_dir, settings).await.with_context(|| format!("connecting to Kafka at {}", k.bootstrap_servers))?;
            return Ok(Self::Kafka(Arc::new(log)));
        }
        if config.storage.backend == BackendKind::RocketMq {
            let r = &config.rocketmq;
            let settings = RocketMqSettings {
                mode: r.mode,
                namesrv_addr: r.namesrv_addr.clone(),
                topics: r.topics.clone(),
                consumer_group: r.consumer_group.clone(),
                invisible_time: Duration::from_millis(r.invisible_time_ms),
                request_timeout: Duration::from_millis(r.request_timeout_ms),
                publish_timeout: Duration::from_millis(r.publish_timeout_ms),
                max_pending_acks: usize::try_from(r.max_pending_acks).unwrap_or(usize::MAX),
                lite_parents: r.lite_parents.clone(),
            };
            let log = RocketMqLog::open(data_dir, settings).await.with_context(|| format!("connecting to RocketMQ at {}", r.namesrv_addr))?;
            return Ok(Self::RocketMq(log));
        }
        let settings = EmbeddedLogSettings {
            default_partitions: config.embedded.default_partitions,
            retention_ms: config.embedded.retention_secs.saturating_mul(1000),
            retention_bytes_per_partition: config.embedded.retention_bytes_per_partition,
            durable: config.storage.durability == crate::config::Durability::Power,
            group_commit_max_wait: std::time::Duration::from_micros(config.storage.group_commit_max_wait_us),
            max_topics: config.limits.max_topics,
            memtable_bytes: usize::try_from(config.embedded.memtable_bytes).unwrap_or(usize::MAX),
            block_cache_bytes: usize::try_from(config.embedded.block_cache_bytes).unwrap_or(usize::MAX),
        };
        let log = EmbeddedLog::open(data_dir, settings, clock).with_context(|| format!("opening the embedded log in {}", data_dir.display()))?;
        Ok(Self::Embedded(Arc::new(log)))
    }

    pub fn log(&self) -> Arc<dyn LogBackend> {
        match self {
            Self::Embedded(log) => log.clone(),
            Self::Kafka(log) => log.clone(),
            Self::RocketMq(log) => log.clone(),
        }
    }

    /// The embedded log, which alone needs retention and a flush at shutdown.
    pub fn embedded(&self) -> Option<&Arc<EmbeddedLog>> {
        match self {
            Self::Embedded(log) => Some(log),
            Self::Kafka(_) | Self::RocketMq(_) => None,
        }
    }
}
