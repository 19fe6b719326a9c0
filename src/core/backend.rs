//! The pull layer's contract: what ackgate needs from a durable log (embedded, Kafka, ...).
//!
//! The backend owns the pull offset of each `topic#partition` (how far this instance has pulled)
//! and checkpoints it; ackgate's own ack offsets live in the `OffsetStore`, never here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::names::{TopicName, TopicPartition};

/// One stored event as read from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub partition: u32,
    pub offset: u64,
    /// Epoch ms at publish.
    pub timestamp: u64,
    pub key: Option<String>,
    pub headers: Vec<(String, String)>,
    /// Headers whose value is not UTF-8 (a Kafka producer may write any bytes); the event frame
    /// carries them base64-encoded in `headers_base64`.
    pub headers_base64: Vec<(String, Vec<u8>)>,
    pub payload: Vec<u8>,
    /// True when `payload` holds valid JSON text (checked once, at publish or at pull).
    pub payload_is_json: bool,
    /// The log holds a record at this offset that could not be decoded: it is never delivered,
    /// but dead-lettered (`undecodable`) for every subscribed client, so the partition goes on.
    pub undecodable: bool,
    /// Its `event` frame without the delivery id and attempt, written by the first session that
    /// delivers it and shared by the others (`core::event_frame`).
    pub frame: super::event_frame::FrameCache,
}

impl Event {
    /// The stand-in for a record at `offset` that could not be decoded.
    pub fn undecodable(partition: u32, offset: u64) -> Self {
        Self {
            partition,
            offset,
            timestamp: 0,
            key: None,
            headers: Vec::new(),
            headers_base64: Vec::new(),
            payload: Vec::new(),
            payload_is_json: false,
            undecodable: true,
            frame: Default::default(),
        }
    }

    /// What the event weighs in every byte bound (a session's window, a reader's buffer, a
    /// catch-up read): its payload, key and headers. Counting the payload alone let events with a
    /// 1-byte payload and a 4 MB header pass every bound (issue 40, item 3).
    pub fn size_bytes(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        let raw_headers: usize = self.headers_base64.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.payload.len() + self.key.as_ref().map_or(0, String::len) + headers + raw_headers
    }

    /// The payload as JSON text, when it is JSON.
    pub fn json_payload(&self) -> Option<&str> {
        if self.payload_is_json {
            std::str::from_utf8(&self.payload).ok()
        } else {
            None
        }
    }
}

/// An event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub key: Option<String>,
    /// Explicit partition; `None` picks one by key hash, or round robin without a key.
    pub partition: Option<u32>,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
    pub payload_is_json: bool,
}

/// Offsets of a partition: `log_start` is the first stored offset, `log_end` the next to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionBounds {
    pub log_start: u64,
    pub log_end: u64,
}

impl PartitionBounds {
    /// The events a client whose committed offset is `committed` has still to acknowledge: from
    /// it (or from the log start, when nothing is stored or retention removed what it had not
    /// read: those are a gap, not lag) to the log end.
    pub fn lag(&self, committed: Option<u64>) -> u64 {
        self.log_end.saturating_sub(committed.unwrap_or(self.log_start).max(self.log_start))
    }

    /// Bounds as a broker answered them, made consistent: negative values (Kafka's -1 for
    /// "unknown") count as 0, and a start above the end (a broker answering low > high for a
    /// moment) becomes an empty range at the start, so no caller ever sees `log_start > log_end`
    /// (`clamp` on such bounds panicked the boot).
    pub fn from_broker(log_start: i64, log_end: i64) -> Self {
        let log_start = log_start.max(0) as u64;
        Self { log_start, log_end: (log_end.max(0) as u64).max(log_start) }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    /// A partition number the topic does not have (the message names both).
    #[error("{0}")]
    UnknownPartition(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    InvalidInput(String),
    /// A bound of the log's own was reached (`limits.max_topics`).
    #[error("{0}")]
    LimitExceeded(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend I/O: {0}")]
    Io(String),
    /// The partition's log ends at `log_end`, below the offset read: it lost its tail (a topic
    /// recreated outside ackgate, a failover to a replica behind, a truncated consume queue).
    /// Answered by a poll at the pull cursor, and by a partition reader to a subscriber that
    /// stood above the new end. `certain`: the broker itself refused the read as out of range
    /// (Kafka's OFFSET_OUT_OF_RANGE), so the loss needs no second look and stands even when the
    /// log has grown back past the cursor since; `log_end` is then the end the refusal named.
    #[error("the log ends at {log_end}, below the offset read")]
    Truncated { log_end: u64, certain: bool },
}

/// Where a `poll` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// At the backend-managed pull cursor, advancing it (the shared partition reader).
    PullCursor,
    /// From this offset on, leaving the cursor alone (catch-up reads by one subscriber).
    Offset(u64),
}

/// How far the clients reading each partition on this instance have durably acknowledged: what a
/// backend that acknowledges events at its broker (RocketMQ POP) needs to know when an event is
/// done with.
pub trait AckFloor: Send + Sync + 'static {
    /// For each of `tps` that some live client on this instance is subscribed to: the lowest
    /// committed offset among those clients (every offset below it is acknowledged by all of
    /// them, or dead-lettered). A partition nobody live reads is absent.
    fn floors(&self, tps: &[TopicPartition]) -> HashMap<TopicPartition, u64>;
}

/// A durable, partitioned log used as a FIFO. Every method is safe to call concurrently.
#[async_trait]
pub trait LogBackend: Send + Sync + 'static {
    /// Every topic with its partition count.
    async fn topics(&self) -> Result<Vec<(TopicName, u32)>, BackendError>;

    /// Partition count of `topic`, `None` when it does not exist.
    async fn partitions(&self, topic: &TopicName) -> Result<Option<u32>, BackendError>;

    /// Creates a topic. `Ok(false)` when it already exists with the same partition count,
    /// `Conflict` when it exists with another.
    async fn create_topic(&self, topic: &TopicName, partitions: u32) -> Result<bool, BackendError>;

    /// Deletes a topic and its events; `Ok(false)` when there was none.
    async fn delete_topic(&self, topic: &TopicName) -> Result<bool, BackendError>;

    /// Appends events; answers `(partition, offset)` per event in the order given. The embedded
    /// log creates a missing topic (`embedded.auto_create_topics`); Kafka and RocketMQ never do.
    async fn publish(&self, topic: &TopicName, events: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError>;

    /// `publish`, but a missing topic is `UnknownTopic` on every backend. For a publisher that
    /// may not create topics: its own existence check could race a `DELETE /topics`, after
    /// which `publish` would create the topic anew (issue 40, review finding 4).
    async fn publish_existing(&self, topic: &TopicName, events: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
        self.publish(topic, events).await
    }

    async fn log_bounds(&self, tp: &TopicPartition) -> Result<PartitionBounds, BackendError>;

    /// Reads up to `max` events from where `from` says. Waits up to `wait` when nothing is there
    /// yet; reads below `log_start` begin at it.
    async fn poll(&self, tp: &TopicPartition, from: ReadFrom, max: usize, wait: Duration) -> Result<Vec<Event>, BackendError>;

    /// Grows `topic` to `partitions`; `Ok(false)` when it has that many already. A topic never
    /// shrinks. Live subscriptions learn of the new partitions from `core::partition_watch`.
    async fn add_partitions(&self, topic: &TopicName, _partitions: u32) -> Result<bool, BackendError> {
        Err(BackendError::InvalidInput(format!("this backend cannot add partitions to {topic}")))
    }

    /// The first offset of `tp` whose timestamp is at or after `time_ms` (epoch ms), the log end
    /// when there is none; never below the log start (replay by time).
    async fn offset_for_time(&self, tp: &TopicPartition, _time_ms: u64) -> Result<u64, BackendError> {
        Err(BackendError::InvalidInput(format!("this backend cannot find offsets of {tp} by time")))
    }

    /// The lite topics (`parent@lite`) of `parent`, sorted by name: RocketMQ 5.x only.
    async fn lite_topics(&self, parent: &TopicName) -> Result<Vec<TopicName>, BackendError> {
        Err(BackendError::UnknownTopic(format!("{parent} is no lite parent: lite topics exist only on RocketMQ, under rocketmq.lite_parents")))
    }

    /// Moves the pull cursor (boot alignment, rewinds).
    fn seek(&self, tp: &TopicPartition, offset: u64);

    /// Nobody on this instance reads `tp` now: resources held for pulling it (a broker
    /// assignment, prefetched messages) may go. The cursor stays.
    fn stop_pulling(&self, _tp: &TopicPartition) {}

    /// The pull cursor: next offset `poll(-1)` reads; `None` before the first poll or seek.
    fn pull_offset(&self, tp: &TopicPartition) -> Option<u64>;

    /// The deferred broker ACK, fired after a client's ack is durable. Log backends only count it.
    fn ack_pulled_message(&self, tp: &TopicPartition, offset: u64);

    /// Gives the backend the clients' acknowledged floors (called once, at start). Backends
    /// without broker-side acknowledgement ignore it.
    fn set_ack_floor(&self, _floor: Arc<dyn AckFloor>) {}

    /// True when the backend acknowledges events at its broker and reads the clients' floors.
    fn acknowledges_at_broker(&self) -> bool {
        false
    }

    /// A client left with durable offsets: what its floor allows may be settled now.
    fn settle_soon(&self) {}

    /// At graceful shutdown, once every session has ended and its offset writes are durable:
    /// acknowledges at the broker what the clients' offsets allow (bounded in time).
    async fn settle_before_exit(&self) {}

    /// Writes the pull cursors to the checkpoint file (atomically).
    fn checkpoint(&self) -> Result<(), BackendError>;

    /// Whether the backend can serve reads and writes now (readiness).
    async fn is_ready(&self) -> bool;

    /// Why the backend's own storage takes no more writes, once that happened (the embedded
    /// log after a write failed with an I/O error); the gateway then stops (`Gateway::run`).
    fn write_failure(&self) -> Option<String> {
        None
    }

    /// Topics whose partitions are all unavailable now while the backend itself is ready (a
    /// RocketMQ route that would renumber them): `/readyz` names them, sorted.
    fn unavailable_topics(&self) -> Vec<String> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::PartitionBounds;

    #[test]
    fn broker_bounds_are_never_inverted_or_negative() {
        assert_eq!(PartitionBounds::from_broker(3, 10), PartitionBounds { log_start: 3, log_end: 10 });
        assert_eq!(PartitionBounds::from_broker(10, 3), PartitionBounds { log_start: 10, log_end: 10 });
        assert_eq!(PartitionBounds::from_broker(-1, -1), PartitionBounds { log_start: 0, log_end: 0 });
        assert_eq!(PartitionBounds::from_broker(i64::MAX, i64::MIN), PartitionBounds { log_start: i64::MAX as u64, log_end: i64::MAX as u64 });
    }
}
