//! The embedded log: a partitioned append-only log in RocksDB, the default backend.
//!
//! One RocksDB database at `<data_dir>/log` with two column families: `topics` (name -> partition
//! count) and `events` (key `len(topic) topic partition(be) offset(be)` -> encoded event). Offsets
//! start at 0 and are contiguous per partition. Appends are serialized by one lock, which also
//! makes a publish batch atomic (one WriteBatch). Retention deletes a prefix of each partition by
//! age and by size.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use codec::StoredEvent;
use rocksdb::{ColumnFamilyDescriptor, DBWithThreadMode, Direction, IteratorMode, MultiThreaded, Options, WriteBatch};
use tokio::sync::Notify;

mod codec;
mod retention;
#[cfg(test)]
mod tests;

use super::checkpoint::{PullCursors, CHECKPOINT_FILE};
use crate::core::backend::{BackendError, Event, LogBackend, NewEvent, PartitionBounds, ReadFrom};
use crate::core::clock::Clock;
use crate::core::names::{topic_prefix, TopicName, TopicPartition};
use crate::store::group_commit::GroupCommit;

type Db = DBWithThreadMode<MultiThreaded>;
/// One item of a RocksDB iterator.
type RawEntry = Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>;

const CF_TOPICS: &str = "topics";
const CF_EVENTS: &str = "events";
/// Log end of partitions whose events retention deleted entirely, so offsets keep counting
/// from there after a restart instead of starting again at 0.
const CF_ENDS: &str = "partition_ends";

/// Settings of the embedded log (from the `[embedded]` config section).
#[derive(Debug, Clone)]
pub struct EmbeddedLogSettings {
    pub default_partitions: u32,
    /// Events older than this are deleted; 0 keeps them forever.
    pub retention_ms: u64,
    /// A partition larger than this loses its oldest events; 0 means no size limit.
    pub retention_bytes_per_partition: u64,
    /// A publish is answered once its events are fsynced (`storage.durability = "power"`):
    /// concurrent publishes share one fsync (`GroupCommit`). Off: written to the WAL without an
    /// fsync, which survives a crash of the process, not of the machine.
    pub durable: bool,
    /// `storage.group_commit_max_wait_us`: how long a publish's fsync waits for concurrent
    /// publishes to join it.
    pub group_commit_max_wait: std::time::Duration,
    /// Topics the log may hold; creating one more is `LimitExceeded`.
    pub max_topics: usize,
    /// `embedded.memtable_bytes`: the write buffer of each column family.
    pub memtable_bytes: usize,
    /// `embedded.block_cache_bytes`: the one block cache of the log's column families.
    pub block_cache_bytes: usize,
}

/// In-memory bounds of one partition, recovered from the keys at open.
struct PartitionLog {
    start: u64,
    end: u64,
    /// Encoded bytes written to the partition before `start` and before `end`: their difference
    /// is the partition's size, used by retention by size.
    bytes_before_start: u64,
    bytes_before_end: u64,
    /// Woken after every append, for long polls.
    appended: Arc<Notify>,
}

/// The embedded log: a handle on its state, which blocking work (a publish that fsyncs, a
/// catch-up read from disk) takes to the blocking pool instead of an async worker.
pub struct EmbeddedLog {
    state: Arc<LogState>,
}

impl std::ops::Deref for EmbeddedLog {
    type Target = LogState;

    fn deref(&self) -> &LogState {
        &self.state
    }
}

pub struct LogState {
    db: Db,
    settings: EmbeddedLogSettings,
    topics: RwLock<HashMap<TopicName, Vec<PartitionLog>>>,
    /// Serializes appends, topic creation and deletion, and retention.
    append_lock: Mutex<()>,
    cursors: PullCursors,
    round_robin: AtomicU32,
    clock: Arc<dyn Clock>,
    /// The newest event timestamp written: an append never stamps below it, so timestamps never
    /// go down along a partition (a clock set back waits for itself) and a search by time is a
    /// binary search.
    last_timestamp: AtomicU64,
    /// The fsync that durable publishes share.
    group_commit: GroupCommit,
    /// Set once a write failed with an I/O error: the database takes no more writes.
    stopped: crate::store::damage::StoppedWrites,
}

fn io_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Io(e.to_string())
}

fn event_key(topic: &TopicName, partition: u32, offset: u64) -> Vec<u8> {
    let mut key = partition_prefix(topic, partition);
    key.extend_from_slice(&offset.to_be_bytes());
    key
}

fn partition_prefix(topic: &TopicName, partition: u32) -> Vec<u8> {
    let mut key = topic_prefix(topic);
    key.extend_from_slice(&partition.to_be_bytes());
    key
}

/// The column families with the log's memory bounds. RocksDB's defaults are a 64 MiB memtable per
/// column family (a second one fills while the first flushes) and a 32 MiB block cache per
/// column family: one client's 200,000 events of 100 bytes stayed in the events' memtable whole (36 MB of
/// a 55 MB heap), and with a smaller memtable the blocks its reads decompressed filled the cache
/// instead (25 MB) (docs/performance.md, "Memory of one busy client").
fn column_families(settings: &EmbeddedLogSettings) -> Vec<ColumnFamilyDescriptor> {
    crate::store::rocks::bounded_column_families(&[CF_TOPICS, CF_EVENTS, CF_ENDS], settings.memtable_bytes, settings.block_cache_bytes)
}

impl EmbeddedLog {
    /// Opens (or creates) the log under `data_dir`, with its pull checkpoint beside it.
    pub fn open(data_dir: &Path, settings: EmbeddedLogSettings, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        crate::store::damage::refuse_corruption(&mut opts);
        let cfs = column_families(&settings);
        let dir = data_dir.join("log");
        crate::store::damage::refuse_if_marked_damaged(&dir).map_err(io_err)?;
        // RocksDB makes the directory without syncing its entry in data_dir.
        crate::durable_files::create_dir_all(&dir).map_err(io_err)?;
        let db = Db::open_cf_descriptors(&opts, &dir, cfs).map_err(|e| io_err(crate::store::damage::open_error(&dir, e)))?;
        let cursors = PullCursors::load(data_dir.join(CHECKPOINT_FILE)).map_err(io_err)?;
        let log = LogState {
            db,
            settings: settings.clone(),
            topics: RwLock::new(HashMap::new()),
            append_lock: Mutex::new(()),
            cursors,
            round_robin: AtomicU32::new(0),
            clock,
            last_timestamp: AtomicU64::new(0),
            group_commit: GroupCommit::new(settings.group_commit_max_wait),
            stopped: crate::store::damage::StoppedWrites::for_dir(&dir),
        };
        log.recover_topics()?;
        Ok(Self { state: Arc::new(log) })
    }
}

impl LogState {
    fn recover_topics(&self) -> Result<(), BackendError> {
        let cf = self.cf(CF_TOPICS)?;
        let mut recovered = HashMap::new();
        for item in self.db.iterator_cf(&cf, IteratorMode::Start) {
            let (name, value) = item.map_err(io_err)?;
            let topic = std::str::from_utf8(&name).ok().and_then(|n| TopicName::parse(n).ok());
            let count = value.get(..4).map(|b| u32::from_be_bytes(b.try_into().unwrap()));
            let (Some(topic), Some(count)) = (topic, count) else {
                return Err(io_err("corrupt topic record in the embedded log"));
            };
            let partitions = (0..count).map(|p| self.recover_partition(&topic, p)).collect::<Result<_, _>>()?;
            recovered.insert(topic, partitions);
        }
        *self.topics.write().unwrap() = recovered;
        Ok(())
    }

    fn recover_partition(&self, topic: &TopicName, partition: u32) -> Result<PartitionLog, BackendError> {
        let cf = self.cf(CF_EVENTS)?;
        let prefix = partition_prefix(topic, partition);
        // Events of this partition from one end: `(offset, stored bytes)`.
        let events_from = |mode: IteratorMode| {
            let prefix = prefix.clone();
            self.db.iterator_cf(&cf, mode).map_while(move |item: RawEntry| match item {
                Ok((key, value)) if key.starts_with(&prefix) && key.len() == prefix.len() + 8 => {
                    Some(Ok((u64::from_be_bytes(key[prefix.len()..].try_into().unwrap()), value)))
                }
                Ok(_) => None,
                Err(e) => Some(Err(io_err(e))),
            })
        };
        let mut log = PartitionLog { start: 0, end: 0, bytes_before_start: 0, bytes_before_end: 0, appended: Arc::new(Notify::new()) };
        let last_key = event_key(topic, partition, u64::MAX);
        let first = events_from(IteratorMode::From(&prefix, Direction::Forward)).next().transpose()?;
        let last = events_from(IteratorMode::From(&last_key, Direction::Reverse)).next().transpose()?;
        if let (Some((start, _)), Some((last_offset, _))) = (first, last) {
            log.start = start;
            log.end = last_offset + 1;
            // The byte counts come from the first event that decodes, counted from each end:
            // an end event that no longer decodes (bits flipped on disk) is counted by its stored
            // size instead of failing the start (it is dead-lettered when read).
            let mut skipped = 0u64;
            for item in events_from(IteratorMode::From(&prefix, Direction::Forward)) {
                let (_, value) = item?;
                if let Some(event) = StoredEvent::decode(&value) {
                    log.bytes_before_start = event.bytes_before.saturating_sub(skipped);
                    break;
                }
                skipped += value.len() as u64;
            }
            let mut after = 0u64;
            for item in events_from(IteratorMode::From(&last_key, Direction::Reverse)) {
                let (_, value) = item?;
                if let Some(event) = StoredEvent::decode(&value) {
                    after += event.bytes_before + event.encoded_len;
                    self.last_timestamp.fetch_max(event.timestamp, Ordering::Relaxed);
                    break;
                }
                after += value.len() as u64;
            }
            log.bytes_before_end = after.max(log.bytes_before_start);
        } else if let Some(end) = self.stored_partition_end(topic, partition)? {
            // Every event was deleted by retention: offsets continue where they were.
            log.start = end;
            log.end = end;
        }
        Ok(log)
    }

    /// The `end` remembered for a partition whose events are all gone (see `remember_end`).
    fn stored_partition_end(&self, topic: &TopicName, partition: u32) -> Result<Option<u64>, BackendError> {
        let cf = self.cf(CF_ENDS)?;
        let value = self.db.get_cf(&cf, end_marker_key(topic, partition)).map_err(io_err)?;
        Ok(value.and_then(|v| v.get(..8).map(|b| u64::from_be_bytes(b.try_into().unwrap()))))
    }

    fn cf(&self, name: &'static str) -> Result<Arc<rocksdb::BoundColumnFamily<'_>>, BackendError> {
        self.db.cf_handle(name).ok_or_else(|| io_err(format!("missing column family {name}")))
    }

    /// Topic changes: fsynced when durable (rare). Events are written without and synced by
    /// their publish's group commit (`append_durably`).
    fn write_opts(&self) -> rocksdb::WriteOptions {
        let mut opts = rocksdb::WriteOptions::default();
        opts.set_sync(self.settings.durable);
        opts
    }

    /// `append`, answered once its events are fsynced, in one fsync with whatever concurrent
    /// publishes wrote meanwhile. Blocking: on the blocking pool.
    fn append_durably(&self, topic: &TopicName, events: Vec<NewEvent>, now: u64, missing: MissingTopic) -> Result<Vec<(u32, u64)>, BackendError> {
        let writing = self.group_commit.writing();
        let assigned = self.append(topic, events, now, missing)?;
        let ticket = writing.done();
        self.group_commit
            .wait_durable(ticket, || crate::core::metrics::timed_fsync("log", || self.db.flush_wal(true)).map_err(|e| self.stopped.check(e)))
            .map_err(io_err)?;
        Ok(assigned)
    }

    fn create_topic_locked(&self, topic: &TopicName, partitions: u32) -> Result<bool, BackendError> {
        super::refuse_lite_topic(topic)?;
        if let Some(existing) = self.topics.read().unwrap().get(topic) {
            return if existing.len() as u32 == partitions {
                Ok(false)
            } else {
                Err(BackendError::Conflict(format!("topic {topic} exists with {} partitions", existing.len())))
            };
        }
        if partitions == 0 || partitions > 10_000 {
            return Err(BackendError::InvalidInput(format!("partitions must be 1 to 10000, got {partitions}")));
        }
        let topics = self.topics.read().unwrap().len();
        if topics >= self.settings.max_topics {
            return Err(BackendError::LimitExceeded(format!("the log holds {topics} topics, its maximum (limits.max_topics); delete one first")));
        }
        let cf = self.cf(CF_TOPICS)?;
        self.db.put_cf_opt(&cf, topic.as_str(), partitions.to_be_bytes(), &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
        let logs =
            (0..partitions).map(|_| PartitionLog { start: 0, end: 0, bytes_before_start: 0, bytes_before_end: 0, appended: Arc::new(Notify::new()) }).collect();
        self.topics.write().unwrap().insert(topic.clone(), logs);
        tracing::info!(%topic, partitions, "topic created");
        Ok(true)
    }

    /// Grows `topic` to `partitions` (Kafka's `CreatePartitions`): the new ones start empty at
    /// offset 0. `Ok(false)` when it has that many already; never shrinks.
    pub fn add_partitions(&self, topic: &TopicName, partitions: u32) -> Result<bool, BackendError> {
        let _guard = self.append_lock.lock().unwrap();
        let count = self.topics.read().unwrap().get(topic).map(|ps| ps.len() as u32).ok_or_else(|| BackendError::UnknownTopic(topic.to_string()))?;
        if partitions <= count {
            return if partitions == count {
                Ok(false)
            } else {
                Err(BackendError::InvalidInput(format!("{topic} has {count} partitions; a topic never shrinks")))
            };
        }
        if partitions > 10_000 {
            return Err(BackendError::InvalidInput(format!("partitions must be 1 to 10000, got {partitions}")));
        }
        let cf = self.cf(CF_TOPICS)?;
        self.db.put_cf_opt(&cf, topic.as_str(), partitions.to_be_bytes(), &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
        let added: Vec<PartitionLog> = (count..partitions).map(|p| self.recover_partition(topic, p)).collect::<Result<_, _>>()?;
        self.topics.write().unwrap().get_mut(topic).ok_or_else(|| BackendError::UnknownTopic(topic.to_string()))?.extend(added);
        tracing::info!(%topic, before = count, partitions, "partitions added");
        Ok(true)
    }

    fn pick_partition(&self, event: &NewEvent, count: u32) -> Result<u32, BackendError> {
        match (event.partition, &event.key) {
            (Some(p), _) if p < count => Ok(p),
            (Some(p), _) => Err(BackendError::UnknownPartition(format!("partition {p} does not exist; the topic has {count}"))),
            (None, Some(key)) => Ok(super::key_partition(key, count)),
            (None, None) => Ok(self.round_robin.fetch_add(1, Ordering::Relaxed) % count),
        }
    }

    /// Appends `events` as one atomic batch under the append lock, without an fsync (see
    /// `append_durably`); answers `(partition, offset)` per event.
    fn append(&self, topic: &TopicName, events: Vec<NewEvent>, now: u64, missing: MissingTopic) -> Result<Vec<(u32, u64)>, BackendError> {
        let _guard = self.append_lock.lock().unwrap();
        let count = match self.topics.read().unwrap().get(topic) {
            Some(ps) => ps.len() as u32,
            None => 0,
        };
        let count = if count == 0 {
            if missing == MissingTopic::Refuse {
                return Err(BackendError::UnknownTopic(topic.to_string()));
            }
            if topic.lite().is_some() {
                // Not auto-created: a lite topic (`parent@lite`) is RocketMQ's, unknown here.
                return Err(BackendError::UnknownTopic(format!("{topic} (lite topics exist only on RocketMQ)")));
            }
            self.create_topic_locked(topic, self.settings.default_partitions)?;
            self.settings.default_partitions
        } else {
            count
        };
        let targets = events.iter().map(|e| self.pick_partition(e, count)).collect::<Result<Vec<_>, _>>()?;
        let now = now.max(self.last_timestamp.load(Ordering::Relaxed));
        // Assign offsets from a copy of the ends, so a failed write changes nothing.
        let mut ends: Vec<(u64, u64)> = self.topics.read().unwrap()[topic].iter().map(|p| (p.end, p.bytes_before_end)).collect();
        let cf = self.cf(CF_EVENTS)?;
        let mut batch = WriteBatch::default();
        let mut assigned = Vec::with_capacity(events.len());
        for (event, partition) in events.into_iter().zip(targets) {
            let (end, bytes) = &mut ends[partition as usize];
            let value = StoredEvent::encode(&event, now, *bytes);
            batch.put_cf(&cf, event_key(topic, partition, *end), &value);
            assigned.push((partition, *end));
            *end += 1;
            *bytes += value.len() as u64;
        }
        self.db.write(batch).map_err(|e| io_err(self.stopped.check(e)))?;
        self.last_timestamp.store(now, Ordering::Relaxed);
        let mut topics = self.topics.write().unwrap();
        let partitions = topics.get_mut(topic).ok_or_else(|| BackendError::UnknownTopic(topic.to_string()))?;
        for (p, (end, bytes)) in partitions.iter_mut().zip(ends) {
            if p.end != end {
                p.end = end;
                p.bytes_before_end = bytes;
                p.appended.notify_waiters();
            }
        }
        Ok(assigned)
    }

    /// The first offset in `from..end` whose event decodes, with its timestamp.
    fn first_timestamp_from(&self, tp: &TopicPartition, from: u64, end: u64) -> Result<Option<(u64, u64)>, BackendError> {
        let cf = self.cf(CF_EVENTS)?;
        let prefix = partition_prefix(&tp.topic, tp.partition);
        let start_key = event_key(&tp.topic, tp.partition, from);
        for item in self.db.iterator_cf(&cf, IteratorMode::From(&start_key, Direction::Forward)) {
            let (key, value) = item.map_err(|e| io_err(self.stopped.check_read(e)))?;
            let Some(offset) = key.strip_prefix(prefix.as_slice()).and_then(|o| o.try_into().ok()).map(u64::from_be_bytes) else { break };
            if offset >= end {
                break;
            }
            if let Some(event) = StoredEvent::decode(&value) {
                return Ok(Some((offset, event.timestamp)));
            }
        }
        Ok(None)
    }

    /// Binary search over the partition's timestamps, which never go down (`last_timestamp`).
    fn search_time(&self, tp: &TopicPartition, time_ms: u64) -> Result<u64, BackendError> {
        let (mut low, end) = self.bounds(tp)?;
        let mut high = end;
        while low < high {
            let middle = low + (high - low) / 2;
            match self.first_timestamp_from(tp, middle, high)? {
                Some((_, timestamp)) if timestamp >= time_ms => high = middle,
                Some((offset, _)) => low = offset + 1,
                // Nothing that decodes in middle..high: the answer is below middle.
                None => high = middle,
            }
        }
        Ok(low)
    }

    /// Reads up to `max` events from `from` (clamped to the partition's start), never past `end`.
    fn read_events(&self, tp: &TopicPartition, from: u64, max: usize) -> Result<Vec<Event>, BackendError> {
        let (start, end) = self.bounds(tp)?;
        let from = from.max(start);
        if from >= end || max == 0 {
            return Ok(Vec::new());
        }
        let cf = self.cf(CF_EVENTS)?;
        let prefix = partition_prefix(&tp.topic, tp.partition);
        let first = event_key(&tp.topic, tp.partition, from);
        let mut events = Vec::with_capacity(max.min((end - from) as usize));
        for item in self.db.iterator_cf(&cf, IteratorMode::From(&first, Direction::Forward)) {
            let (key, value) = item.map_err(|e| io_err(self.stopped.check_read(e)))?;
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 8 {
                break;
            }
            let offset = u64::from_be_bytes(key[prefix.len()..].try_into().unwrap());
            if offset >= end {
                break;
            }
            // A record that does not decode (a disk that flipped bits, a log written by a newer
            // build) must not stop the partition: it goes out as a stand-in that every
            // subscriber dead-letters, and the partition goes on.
            match StoredEvent::decode(&value) {
                Some(stored) => events.push(stored.into_event(tp.partition, offset)),
                None => {
                    crate::core::metrics::undecodable_records().increment(1);
                    tracing::error!(%tp, offset, bytes = value.len(), "an event in the log cannot be decoded; it is dead-lettered for every subscriber");
                    events.push(Event::undecodable(tp.partition, offset));
                }
            }
            if events.len() == max {
                break;
            }
        }
        Ok(events)
    }

    fn bounds(&self, tp: &TopicPartition) -> Result<(u64, u64), BackendError> {
        self.with_partition(tp, |p| (p.start, p.end))
    }

    fn with_partition<T>(&self, tp: &TopicPartition, f: impl FnOnce(&PartitionLog) -> T) -> Result<T, BackendError> {
        let topics = self.topics.read().unwrap();
        let partitions = topics.get(&tp.topic).ok_or_else(|| BackendError::UnknownTopic(tp.topic.to_string()))?;
        let partition = partitions
            .get(tp.partition as usize)
            .ok_or_else(|| BackendError::UnknownPartition(format!("partition {} does not exist in {}", tp.partition, tp.topic)))?;
        Ok(f(partition))
    }

    /// Flushes the WAL and memtables; called at shutdown.
    pub fn flush(&self) -> Result<(), BackendError> {
        self.db.flush_wal(true).map_err(|e| io_err(self.stopped.check(e)))
    }
}

fn end_marker_key(topic: &TopicName, partition: u32) -> Vec<u8> {
    partition_prefix(topic, partition)
}

/// What an append does when its topic does not exist.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum MissingTopic {
    /// Creates it with `embedded.default_partitions` (auto-create on publish).
    Create,
    /// Answers `UnknownTopic`: checked under the append lock, so no deletion slips in between.
    Refuse,
}

impl EmbeddedLog {
    async fn append_now(&self, topic: &TopicName, events: Vec<NewEvent>, missing: MissingTopic) -> Result<Vec<(u32, u64)>, BackendError> {
        let now = self.clock.now_ms();
        if !self.settings.durable {
            // No fsync: a write to the memtable and the WAL's page cache, microseconds.
            return self.append(topic, events, now, missing);
        }
        let (state, topic) = (self.state.clone(), topic.clone());
        tokio::task::spawn_blocking(move || state.append_durably(&topic, events, now, missing)).await.map_err(io_err)?
    }
}

#[async_trait]
impl LogBackend for EmbeddedLog {
    async fn topics(&self) -> Result<Vec<(TopicName, u32)>, BackendError> {
        let mut topics: Vec<_> = self.topics.read().unwrap().iter().map(|(t, ps)| (t.clone(), ps.len() as u32)).collect();
        topics.sort();
        Ok(topics)
    }

    async fn partitions(&self, topic: &TopicName) -> Result<Option<u32>, BackendError> {
        Ok(self.topics.read().unwrap().get(topic).map(|ps| ps.len() as u32))
    }

    async fn create_topic(&self, topic: &TopicName, partitions: u32) -> Result<bool, BackendError> {
        let _guard = self.append_lock.lock().unwrap();
        self.create_topic_locked(topic, partitions)
    }

    async fn delete_topic(&self, topic: &TopicName) -> Result<bool, BackendError> {
        let _guard = self.append_lock.lock().unwrap();
        let Some(partitions) = self.topics.write().unwrap().remove(topic) else {
            return Ok(false);
        };
        let cf = self.cf(CF_EVENTS)?;
        let topics_cf = self.cf(CF_TOPICS)?;
        let ends_cf = self.cf(CF_ENDS)?;
        let mut batch = WriteBatch::default();
        let mut upper = topic_prefix(topic);
        upper.extend_from_slice(&[0xff; 13]);
        batch.delete_range_cf(&cf, topic_prefix(topic), upper);
        batch.delete_cf(&topics_cf, topic.as_str());
        for p in 0..partitions.len() as u32 {
            batch.delete_cf(&ends_cf, end_marker_key(topic, p));
        }
        self.db.write_opt(batch, &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
        self.cursors.remove_topic(topic);
        for p in &partitions {
            p.appended.notify_waiters();
        }
        tracing::info!(%topic, "topic deleted");
        Ok(true)
    }

    async fn publish(&self, topic: &TopicName, events: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
        self.append_now(topic, events, MissingTopic::Create).await
    }

    async fn publish_existing(&self, topic: &TopicName, events: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
        self.append_now(topic, events, MissingTopic::Refuse).await
    }

    async fn log_bounds(&self, tp: &TopicPartition) -> Result<PartitionBounds, BackendError> {
        let (log_start, log_end) = self.bounds(tp)?;
        Ok(PartitionBounds { log_start, log_end })
    }

    async fn poll(&self, tp: &TopicPartition, from: ReadFrom, max: usize, wait: Duration) -> Result<Vec<Event>, BackendError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let appended = self.with_partition(tp, |p| p.appended.clone())?;
            let notified = appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let start = match from {
                ReadFrom::Offset(offset) => offset,
                ReadFrom::PullCursor => {
                    let (log_start, _) = self.bounds(tp)?;
                    self.cursors.get(tp).unwrap_or(log_start).max(log_start)
                }
            };
            // Inline, catch-up reads too: on the blocking pool they cost the fan-out loadtest
            // 5-10% (a thread hop per read of up to `fetch_batch` events, README Performance);
            // a read is bounded by `max` events and is served from RocksDB's cache when recent.
            let events = self.read_events(tp, start, max)?;
            if let (ReadFrom::PullCursor, Some(last)) = (from, events.last()) {
                self.cursors.set(tp, last.offset + 1);
            }
            if !events.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(events);
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    async fn add_partitions(&self, topic: &TopicName, partitions: u32) -> Result<bool, BackendError> {
        let (state, topic) = (self.state.clone(), topic.clone());
        tokio::task::spawn_blocking(move || state.add_partitions(&topic, partitions)).await.map_err(io_err)?
    }

    async fn offset_for_time(&self, tp: &TopicPartition, time_ms: u64) -> Result<u64, BackendError> {
        // A few point reads per partition (log2 of its length): from RocksDB's cache when recent.
        self.search_time(tp, time_ms)
    }

    fn seek(&self, tp: &TopicPartition, offset: u64) {
        self.cursors.set(tp, offset);
    }

    fn pull_offset(&self, tp: &TopicPartition) -> Option<u64> {
        self.cursors.get(tp)
    }

    fn ack_pulled_message(&self, _tp: &TopicPartition, _offset: u64) {
        // A log has nothing to acknowledge; the offset writer counts these calls.
    }

    fn checkpoint(&self) -> Result<(), BackendError> {
        self.cursors.save().map_err(io_err)
    }

    async fn is_ready(&self) -> bool {
        self.stopped.reason().is_none()
    }

    fn write_failure(&self) -> Option<String> {
        self.stopped.reason()
    }
}
