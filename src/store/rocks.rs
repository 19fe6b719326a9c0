//! The RocksDB `OffsetStore` (the default): `<data_dir>/offsets`.
//!
//! Column families: `offsets` (topic-ordered key -> record), `by_client` (client-ordered key ->
//! nothing, the second index that makes a client filter a prefix scan), `dead_letters` with its
//! client-ordered index `dead_letters_by_client`, `topic_generations` (topic -> u64, how many
//! times it was deleted, and while a deletion's removal is pending a ninth byte: 1 begun, 2 the
//! log deleted) and `publishes` (topic prefix + `Idempotency-Key` -> what that publish
//! answered, until when: `core::idempotency`), `gaps` (topic-ordered, like dead letters: the
//! gaps reported to clients) and `redrives` (the dead letters' keys an operator marked for
//! redelivery, until that is settled).
//! CAS-max is a conditional write (read, skip unless greater, put) serialized by one lock, so
//! concurrent writers to the same key can never interleave between the read and the put. The
//! lock also guards the generations, cached in memory, so a write checks its topic's generation
//! and a topic deletion bumps it without a gap between them.
//! Writes go through the WAL. When `durable` (`storage.durability = "power"`), every write but an
//! offset batch is fsynced; offset batches are fsynced by the offset writer when a batch carries
//! a confirmed ack, or a broker ACK of a backend that acknowledges at its broker (`make_durable`),
//! so plain acks share those fsyncs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rocksdb::{ColumnFamilyDescriptor, DBWithThreadMode, Direction, IteratorMode, MultiThreaded, Options, WriteBatch, WriteOptions};

use crate::core::dead_letters::{DeadLetter, DeadLetterId, DeadLetterPage, DeadLetterQuery, Gap, GapPage};
use crate::core::names::{client_prefix, topic_prefix, ClientId, OffsetKey, TopicName, TopicPartition};
use crate::core::offsets::{
    LogEpoch, OffsetEpoch, OffsetFilter, OffsetRecord, OffsetStore, OffsetWrite, StoreError, TopicIncarnation, TopicRemoval, WriteOutcome,
};
use crate::core::remembered_publish::{IdempotencyKey, RememberedPublish};
use crate::core::FastMap;
use crate::store::damage::{open_error, refuse_corruption, refuse_if_marked_damaged, StoppedWrites};

type Db = DBWithThreadMode<MultiThreaded>;
/// Raw `(key, value)` pairs read from a column family.
type RawPairs = Vec<(Box<[u8]>, Box<[u8]>)>;
/// Turns a raw `(key, value)` pair into a row of a page (`None`: not a row of it).
type PageRow<'a, T> = &'a mut dyn FnMut(&[u8], &[u8]) -> Result<Option<T>, StoreError>;
/// A visitor of raw `(key, value)` pairs that may stop the scan with an error.
type RawVisitor<'a> = &'a mut dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError>;

const CF_OFFSETS: &str = "offsets";
const CF_BY_CLIENT: &str = "by_client";
const CF_DEAD_LETTERS: &str = "dead_letters";
const CF_TOPIC_GENERATIONS: &str = "topic_generations";
const CF_DEAD_LETTERS_BY_CLIENT: &str = "dead_letters_by_client";
const CF_PUBLISHES: &str = "publishes";
const CF_GAPS: &str = "gaps";
const CF_REDRIVES: &str = "redrives";
/// `topic` `#` partition (u32, big-endian) -> log epoch (u32) and the log end it began at (u64).
const CF_LOG_EPOCHS: &str = "log_epochs";
/// `topic` -> its incarnation: id (u64) and log epoch floor (u32), for topics deleted at least once.
const CF_TOPIC_INCARNATIONS: &str = "topic_incarnations";
/// Offset key (as in `offsets`) -> the least offset epoch (u64) a record of it may have again,
/// left by an operator's deletion of the record (`remove_fenced`).
const CF_FENCES: &str = "fences";
/// The value of a redrive mark: a format version, nothing else.
const REDRIVE_MARK: [u8; 1] = [1];

/// Records removed or touched per write-lock hold (`remove`, `touch`).
const REMOVE_CHUNK: usize = 1024;

/// Generation of each topic deleted at least once (absent = 0).
type Generations = HashMap<TopicName, u64>;

/// Offset records kept in memory as last written, at most this many, in two generations: when
/// the newer holds half, it becomes the older and the older is forgotten. Keys written again
/// and again stay; a working set larger than the bound loses only part of its hits. 5,000
/// clients acking 4 partitions each are 20,000 keys, about 250 bytes each with the map's overhead.
const RECENT_RECORDS: usize = 65_536;

/// What the write lock guards: every write of offsets happens under it.
#[derive(Default)]
struct Serialized {
    generations: Generations,
    /// Topics whose removal began (`begin_topic_removal`) and has not finished.
    removals_pending: HashMap<TopicName, TopicRemoval>,
    /// Every partition's log epoch that is not 0 (`CF_LOG_EPOCHS`, read at open).
    log_epochs: HashMap<TopicPartition, LogEpoch>,
    /// Every topic deleted at least once (`CF_TOPIC_INCARNATIONS`, read at open).
    incarnations: HashMap<TopicName, TopicIncarnation>,
    /// The offset records this store wrote last, for the compare of the next CAS-max write: a
    /// RocksDB point read per ack was a tenth of the gateway's CPU in a broadcast to 5,000
    /// clients (perf; the memtable holds a version per ack). Exact because every change to the
    /// `offsets` column family (write, reset, touch, remove, topic delete) goes through the
    /// write lock and updates or drops the entry; a key absent here is read from RocksDB.
    recent: FastMap<OffsetKey, OffsetRecord>,
    older: FastMap<OffsetKey, OffsetRecord>,
}

impl Serialized {
    fn cached(&self, key: &OffsetKey) -> Option<&OffsetRecord> {
        self.recent.get(key).or_else(|| self.older.get(key))
    }

    fn remember(&mut self, key: &OffsetKey, record: OffsetRecord) {
        if self.recent.len() >= RECENT_RECORDS / 2 && !self.recent.contains_key(key) {
            self.older = std::mem::take(&mut self.recent);
        }
        self.older.remove(key);
        self.recent.insert(key.clone(), record);
    }

    fn forget(&mut self, key: &OffsetKey) {
        self.recent.remove(key);
        self.older.remove(key);
    }

    fn log_epoch(&self, tp: &TopicPartition) -> LogEpoch {
        self.incarnations.get(&tp.topic).copied().unwrap_or_default().floored(self.log_epochs.get(tp).copied())
    }

    /// The incarnation `topic` starts when its generation does: above every log epoch it had.
    fn next_incarnation(&self, topic: &TopicName) -> TopicIncarnation {
        let seen = self.log_epochs.iter().filter(|(tp, _)| tp.topic == *topic).map(|(_, l)| l.epoch).max().unwrap_or(0);
        self.incarnations.get(topic).copied().unwrap_or_default().next(seen, crate::core::resume_token::new_incarnation_id())
    }

    fn forget_topic(&mut self, topic: &TopicName) {
        self.recent.retain(|key, _| key.topic != *topic);
        self.older.retain(|key, _| key.topic != *topic);
    }
}

pub struct RocksOffsetStore {
    db: Db,
    durable: bool,
    /// Set once a write failed with an I/O error: the database takes no more writes.
    stopped: StoppedWrites,
    /// Serializes writers; holds the topic generations and the records written last.
    write_lock: Mutex<Serialized>,
    /// Keys in `publishes` (counted at open, then kept under `write_lock`).
    publishes: AtomicUsize,
    /// Keys in `redrives` (counted at open, then kept under `write_lock`).
    redrives: AtomicUsize,
}

/// Memtable size of each column family, chosen for the offsets one (RocksDB's default is 64 MiB). Every ack writes a
/// new version of one small record, so a large memtable is hundreds of thousands of versions of a
/// few thousand keys: each insert walked a skip list that deep, out of cache (issue 26: 7.6% of
/// the gateway's samples in a 5,000-client broadcast, 1.4% at 4 MiB), and the memtables held
/// ~50 MiB of superseded versions. A flush keeps only the newest version of each key, so it is
/// small however many acks came.
const OFFSETS_WRITE_BUFFER_BYTES: usize = 4 << 20;

/// All memtables of the database together (RocksDB flushes the largest column family beyond it).
/// With RocksDB's defaults each of the eleven column families could hold two 64 MiB memtables, and
/// a store remembering many publishes or dead letters filled them before anything flushed.
const DB_WRITE_BUFFERS_BYTES: usize = 16 << 20;

/// One block cache for the database: RocksDB's default is 32 MiB per column family. Reads here
/// are an offset or a page of records, on subscribes and admin routes.
const BLOCK_CACHE_BYTES: usize = 8 << 20;

/// Column families `names` of one database, each with memtables of `memtable_bytes`, all reading
/// through one block cache of `block_cache_bytes` (the offsets store's and the embedded log's).
pub fn bounded_column_families(names: &[&str], memtable_bytes: usize, block_cache_bytes: usize) -> Vec<ColumnFamilyDescriptor> {
    let cache = rocksdb::Cache::new_lru_cache(block_cache_bytes);
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(&cache);
    names
        .iter()
        .map(|name| {
            let mut opts = Options::default();
            opts.set_write_buffer_size(memtable_bytes);
            opts.set_block_based_table_factory(&table);
            ColumnFamilyDescriptor::new(*name, opts)
        })
        .collect()
}

/// Every column family of the offsets store.
const COLUMN_FAMILIES: [&str; 11] = [
    CF_OFFSETS,
    CF_BY_CLIENT,
    CF_DEAD_LETTERS,
    CF_DEAD_LETTERS_BY_CLIENT,
    CF_TOPIC_GENERATIONS,
    CF_PUBLISHES,
    CF_GAPS,
    CF_REDRIVES,
    CF_LOG_EPOCHS,
    CF_TOPIC_INCARNATIONS,
    CF_FENCES,
];

fn io_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

impl RocksOffsetStore {
    pub fn open(data_dir: &Path, durable: bool) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        refuse_corruption(&mut opts);
        opts.set_db_write_buffer_size(DB_WRITE_BUFFERS_BYTES);
        let cfs = bounded_column_families(&COLUMN_FAMILIES, OFFSETS_WRITE_BUFFER_BYTES, BLOCK_CACHE_BYTES);
        let dir = data_dir.join("offsets");
        refuse_if_marked_damaged(&dir).map_err(StoreError::Io)?;
        // RocksDB makes the directory without syncing its entry in data_dir.
        crate::durable_files::create_dir_all(&dir).map_err(|e| StoreError::Io(e.to_string()))?;
        let db = Db::open_cf_descriptors(&opts, &dir, cfs).map_err(|e| StoreError::Io(open_error(&dir, e)))?;
        let store = Self {
            db,
            durable,
            stopped: StoppedWrites::for_dir(&dir),
            write_lock: Mutex::new(Serialized::default()),
            publishes: AtomicUsize::new(0),
            redrives: AtomicUsize::new(0),
        };
        for (cf, count) in [(CF_PUBLISHES, &store.publishes), (CF_REDRIVES, &store.redrives)] {
            let mut keys = 0;
            store.for_each_with_prefix(cf, &[], &mut |_, _| {
                keys += 1;
                Ok(())
            })?;
            count.store(keys, Ordering::Relaxed);
        }
        let mut generations = Generations::new();
        let mut removals_pending = HashMap::new();
        store.for_each_with_prefix(CF_TOPIC_GENERATIONS, &[], &mut |key, value| {
            let topic = std::str::from_utf8(key).ok().and_then(|t| TopicName::parse(t).ok());
            let generation = value.get(..8).and_then(|v| v.try_into().ok()).map(u64::from_be_bytes);
            let step = match value.get(8..) {
                Some([]) => Some(None),
                Some([1]) => Some(Some(TopicRemoval::Begun)),
                Some([2]) => Some(Some(TopicRemoval::LogDeleted)),
                _ => None,
            };
            match (topic, generation, step) {
                (Some(topic), Some(generation), Some(step)) => {
                    if let Some(step) = step {
                        removals_pending.insert(topic.clone(), step);
                    }
                    generations.insert(topic, generation);
                    Ok(())
                }
                _ => Err(StoreError::Corrupt(format!("unreadable topic generation {:?}", String::from_utf8_lossy(key)))),
            }
        })?;
        let mut log_epochs = HashMap::new();
        store.for_each_with_prefix(CF_LOG_EPOCHS, &[], &mut |key, value| match (decode_partition_key(key), decode_log_epoch(value)) {
            (Some(tp), Some(epoch)) => {
                log_epochs.insert(tp, epoch);
                Ok(())
            }
            _ => Err(StoreError::Corrupt(format!("unreadable log epoch {:?}", String::from_utf8_lossy(key)))),
        })?;
        let mut incarnations = HashMap::new();
        store.for_each_with_prefix(CF_TOPIC_INCARNATIONS, &[], &mut |key, value| {
            let topic = std::str::from_utf8(key).ok().and_then(|t| TopicName::parse(t).ok());
            match (topic, decode_incarnation(value)) {
                (Some(topic), Some(incarnation)) => {
                    incarnations.insert(topic, incarnation);
                    Ok(())
                }
                _ => Err(StoreError::Corrupt(format!("unreadable topic incarnation {:?}", String::from_utf8_lossy(key)))),
            }
        })?;
        let mut serialized = store.lock_writes();
        serialized.incarnations = incarnations;
        serialized.generations = generations;
        serialized.removals_pending = removals_pending;
        serialized.log_epochs = log_epochs;
        drop(serialized);
        store.index_dead_letters_if_missing()?;
        Ok(store)
    }

    fn lock_writes(&self) -> std::sync::MutexGuard<'_, Serialized> {
        self.write_lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cf(&self, name: &str) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>, StoreError> {
        self.db.cf_handle(name).ok_or_else(|| io_err(format!("missing column family {name}")))
    }

    fn write_opts(&self) -> WriteOptions {
        let mut opts = WriteOptions::default();
        opts.set_sync(self.durable);
        opts
    }

    /// Writes a batch; with power-loss durability it is fsynced before this returns, and the
    /// time it took is recorded (`ackgate_fsync_seconds{store="offsets"}`).
    fn write_batch(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let write = || self.db.write_opt(batch, &self.write_opts());
        let written = if self.durable { crate::core::metrics::timed_fsync("offsets", write) } else { write() };
        written.map_err(|e| io_err(self.stopped.check(e)))
    }

    fn get_record(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        let cf = self.cf(CF_OFFSETS)?;
        match self.db.get_pinned_cf(&cf, key.encode()).map_err(|e| io_err(self.stopped.check_read(e)))? {
            Some(bytes) => Ok(Some(decode_record(key, &bytes)?)),
            None => Ok(None),
        }
    }

    /// Calls `f` with every `(key, value)` of `cf` whose key starts with `prefix`, in key order.
    fn for_each_with_prefix(&self, cf_name: &str, prefix: &[u8], f: RawVisitor<'_>) -> Result<(), StoreError> {
        let cf = self.cf(cf_name)?;
        for item in self.db.iterator_cf(&cf, IteratorMode::From(prefix, Direction::Forward)) {
            let (key, value) = item.map_err(|e| io_err(self.stopped.check_read(e)))?;
            if !key.starts_with(prefix) {
                break;
            }
            f(&key, &value)?;
        }
        Ok(())
    }

    /// Removes dead letters (topic-ordered keys), their index entries and redrive marks;
    /// returns how many.
    fn remove_dead_letter_keys<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Result<usize, StoreError> {
        let (cf, index_cf, redrives_cf) = (self.cf(CF_DEAD_LETTERS)?, self.cf(CF_DEAD_LETTERS_BY_CLIENT)?, self.cf(CF_REDRIVES)?);
        let keys: Vec<&[u8]> = keys.collect();
        let mut removed = 0;
        // In chunks, as every removal: a retention sweep never holds ack writes back for more
        // than one chunk.
        for chunk in keys.chunks(REMOVE_CHUNK) {
            // Marks are looked for only while there are some (a mark made meanwhile for a key
            // removed here is found stale and dropped by `redrives`).
            let serialized = (self.redrives.load(Ordering::Relaxed) > 0).then(|| self.lock_writes());
            let mut batch = WriteBatch::default();
            let mut unmarked = 0;
            for key in chunk {
                batch.delete_cf(&cf, key);
                if let Some(id) = decode_dead_letter_key(key) {
                    batch.delete_cf(&index_cf, dead_letter_index_key(&id));
                }
                if serialized.is_some() && self.db.get_pinned_cf(&redrives_cf, key).map_err(io_err)?.is_some() {
                    batch.delete_cf(&redrives_cf, key);
                    unmarked += 1;
                }
                removed += 1;
            }
            self.write_batch(batch)?;
            self.redrives.fetch_sub(unmarked, Ordering::Relaxed);
        }
        Ok(removed)
    }

    /// Removes redrive marks whose dead letter is gone, if they are still there.
    fn drop_stale_marks(&self, keys: &[Vec<u8>]) -> Result<(), StoreError> {
        let _serialized = self.lock_writes();
        let (main_cf, redrives_cf) = (self.cf(CF_DEAD_LETTERS)?, self.cf(CF_REDRIVES)?);
        let mut batch = WriteBatch::default();
        for key in keys {
            let marked = self.db.get_pinned_cf(&redrives_cf, key).map_err(io_err)?.is_some();
            if marked && self.db.get_pinned_cf(&main_cf, key).map_err(io_err)?.is_none() {
                batch.delete_cf(&redrives_cf, key);
            }
        }
        let dropped = batch.len();
        self.write_batch(batch)?;
        self.redrives.fetch_sub(dropped, Ordering::Relaxed);
        Ok(())
    }

    /// Dead letters recorded before the client index existed get their index entries.
    fn index_dead_letters_if_missing(&self) -> Result<(), StoreError> {
        let first = |name| -> Result<bool, StoreError> { Ok(self.db.iterator_cf(&self.cf(name)?, IteratorMode::Start).next().is_some()) };
        if !first(CF_DEAD_LETTERS)? || first(CF_DEAD_LETTERS_BY_CLIENT)? {
            return Ok(());
        }
        let index_cf = self.cf(CF_DEAD_LETTERS_BY_CLIENT)?;
        let mut batch = WriteBatch::default();
        self.for_each_with_prefix(CF_DEAD_LETTERS, &[], &mut |key, _| {
            if let Some(id) = decode_dead_letter_key(key) {
                batch.put_cf(&index_cf, dead_letter_index_key(&id), []);
            }
            Ok(())
        })?;
        self.write_batch(batch)
    }

    /// Up to `limit + 1` rows of one page in key order: the keys of `cf` under `prefix` after
    /// `after`, each turned into a row by `row` (`None` skips it). The extra row only says that
    /// more follow.
    fn page<T>(&self, cf_name: &str, prefix: &[u8], after: Option<&[u8]>, limit: usize, row: PageRow<'_, T>) -> Result<Vec<T>, StoreError> {
        let cf = self.cf(cf_name)?;
        let from = after.filter(|s| *s > prefix).unwrap_or(prefix);
        let mut rows = Vec::new();
        for item in self.db.iterator_cf(&cf, IteratorMode::From(from, Direction::Forward)) {
            let (key, value) = item.map_err(|e| io_err(self.stopped.check_read(e)))?;
            if !key.starts_with(prefix) || rows.len() > limit {
                break;
            }
            if after == Some(&*key) {
                continue;
            }
            if let Some(found) = row(&key, &value)? {
                rows.push(found);
            }
        }
        Ok(rows)
    }

    /// Every `(key bytes, value bytes)` of `cf` that starts with `prefix`.
    fn prefix_scan(&self, cf_name: &str, prefix: &[u8]) -> Result<RawPairs, StoreError> {
        let mut out = Vec::new();
        self.for_each_with_prefix(cf_name, prefix, &mut |key, value| {
            out.push((key.into(), value.into()));
            Ok(())
        })?;
        Ok(out)
    }
}

/// Key of a remembered publish: the topic's length-prefixed bytes, then the idempotency key.
fn publish_key(topic: &TopicName, key: &IdempotencyKey) -> Vec<u8> {
    let mut stored = topic_prefix(topic);
    stored.extend_from_slice(key.as_str().as_bytes());
    stored
}

/// Dead letter key, topic-ordered: the offset key's encoding, then the offset.
fn dead_letter_key(id: &DeadLetterId) -> Vec<u8> {
    let mut key = id.key.encode();
    key.extend_from_slice(&id.offset.to_be_bytes());
    key
}

/// The client-ordered index key of a dead letter.
fn dead_letter_index_key(id: &DeadLetterId) -> Vec<u8> {
    let mut key = id.key.encode_by_client();
    key.extend_from_slice(&id.offset.to_be_bytes());
    key
}

fn split_offset(key: &[u8]) -> Option<(&[u8], u64)> {
    let (head, offset) = key.split_at_checked(key.len().checked_sub(8)?)?;
    Some((head, u64::from_be_bytes(offset.try_into().ok()?)))
}

fn decode_dead_letter_key(key: &[u8]) -> Option<DeadLetterId> {
    let (head, offset) = split_offset(key)?;
    Some(DeadLetterId { key: OffsetKey::decode(head)?, offset })
}

fn decode_dead_letter_index_key(key: &[u8]) -> Option<DeadLetterId> {
    let (head, offset) = split_offset(key)?;
    Some(DeadLetterId { key: OffsetKey::decode_by_client(head)?, offset })
}

/// Value: version 2, attempts (u32), at (u64), log epoch (u32), then the reason's bytes. Version
/// 1 (before log epochs) has no log epoch and reads as log epoch 0.
fn encode_dead_letter(dead: &DeadLetter) -> Vec<u8> {
    let mut value = Vec::with_capacity(17 + dead.reason.len());
    value.push(2u8);
    value.extend_from_slice(&dead.attempts.to_be_bytes());
    value.extend_from_slice(&dead.at.to_be_bytes());
    value.extend_from_slice(&dead.log_epoch.to_be_bytes());
    value.extend_from_slice(dead.reason.as_bytes());
    value
}

fn decode_dead_letter(id: DeadLetterId, value: &[u8]) -> Option<DeadLetter> {
    let (log_epoch, reason) = match value.first()? {
        1 => (0, value.get(13..)?),
        2 => (u32::from_be_bytes(value.get(13..17)?.try_into().ok()?), value.get(17..)?),
        _ => return None,
    };
    Some(DeadLetter {
        topic: id.key.topic,
        client_id: id.key.client_id,
        partition: id.key.partition,
        offset: id.offset,
        attempts: u32::from_be_bytes(value.get(1..5)?.try_into().ok()?),
        at: u64::from_be_bytes(value.get(5..13)?.try_into().ok()?),
        reason: String::from_utf8_lossy(reason).into_owned(),
        log_epoch,
    })
}

/// Value: version 1, `to` (u64), `at` (u64).
fn decode_gap(id: DeadLetterId, value: &[u8]) -> Option<Gap> {
    if value.len() != 17 || value[0] != 1 {
        return None;
    }
    Some(Gap {
        topic: id.key.topic,
        client_id: id.key.client_id,
        partition: id.key.partition,
        from: id.offset,
        to: u64::from_be_bytes(value[1..9].try_into().ok()?),
        at: u64::from_be_bytes(value[9..17].try_into().ok()?),
    })
}

/// Byte prefix of every key of one client on one topic, in the topic-ordered encoding.
fn topic_client_prefix(topic: &TopicName, client: &ClientId) -> Vec<u8> {
    let mut prefix = OffsetKey::new(topic.clone(), client.clone(), 0).encode();
    prefix.truncate(prefix.len() - 4);
    prefix
}

fn decode_record(key: &OffsetKey, bytes: &[u8]) -> Result<OffsetRecord, StoreError> {
    OffsetRecord::decode(bytes).ok_or_else(|| StoreError::Corrupt(format!("unreadable record for {key}")))
}

impl RocksOffsetStore {
    /// CAS-max writes under the write lock (`write_offsets`). `without_waiting`: a RocksDB write
    /// stall answers `None`, nothing written (`try_write_offsets`).
    fn write_offsets_locked(
        &self,
        mut serialized: std::sync::MutexGuard<'_, Serialized>,
        writes: &[OffsetWrite],
        without_waiting: bool,
    ) -> Result<Option<Vec<WriteOutcome>>, StoreError> {
        let (offsets_cf, by_client_cf) = (self.cf(CF_OFFSETS)?, self.cf(CF_BY_CLIENT)?);
        // Records as they will be after this batch, so two writes to one key in a batch compare
        // against each other and not only against the stored value.
        // With whether the key had a record before this write: only those are remembered (a
        // key written once, as a subscribe's first row of an idle client, may never be written
        // again; 10,000 idle sessions paid ~1 KiB each for remembering theirs).
        let mut after: FastMap<&OffsetKey, (OffsetRecord, bool)> = FastMap::default();
        let mut outcomes = Vec::with_capacity(writes.len());
        let mut batch = WriteBatch::default();
        for w in writes {
            if serialized.generations.get(&w.key.topic).copied().unwrap_or(0) != w.generation {
                outcomes.push(WriteOutcome::Obsolete);
                continue;
            }
            let current = match after.get(&w.key).map(|(record, _)| record).or_else(|| serialized.cached(&w.key)) {
                Some(record) => Some(*record),
                None => self.get_record(&w.key)?,
            };
            let existed = current.is_some();
            let record = match current {
                Some(c) if !c.is_advanced_by(w) => {
                    outcomes.push(WriteOutcome::Stale);
                    continue;
                }
                Some(c) => c.advanced_by(w),
                // A write made before an operator deleted the record (its fence is above the
                // write's epoch) never brings the old offset back.
                None if self.fence(&w.key)?.is_some_and(|fence| w.epoch < fence) => {
                    outcomes.push(WriteOutcome::Stale);
                    continue;
                }
                None => {
                    batch.put_cf(&by_client_cf, w.key.encode_by_client(), []);
                    OffsetRecord::from_write(w)
                }
            };
            batch.put_cf(&offsets_cf, w.key.encode(), record.encode());
            after.insert(&w.key, (record, existed));
            outcomes.push(WriteOutcome::Advanced);
        }
        if !batch.is_empty() {
            // Never an fsync here: the offset writer makes a batch durable when it must
            // (`make_durable`), so plain acks share the fsync of the next confirmed one.
            let mut opts = WriteOptions::default();
            // A stall answers at once (Incomplete, nothing written) instead of waiting it out.
            opts.set_no_slowdown(without_waiting);
            if let Err(e) = self.db.write_opt(batch, &opts) {
                // Whether any of it is stored is unknown now: read these keys again next time.
                for key in after.keys() {
                    serialized.forget(key);
                }
                if without_waiting && e.kind() == rocksdb::ErrorKind::Incomplete {
                    return Ok(None);
                }
                return Err(io_err(self.stopped.check(e)));
            }
        }
        for (key, (record, existed)) in after {
            if existed {
                serialized.remember(key, record);
            }
        }
        Ok(Some(outcomes))
    }
}

impl OffsetStore for RocksOffsetStore {
    fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        self.get_record(key)
    }

    fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError> {
        // A write allowed to wait is always made (`None` is a stall it was not allowed to wait for).
        let written = self.write_offsets_locked(self.lock_writes(), writes, false)?;
        written.ok_or_else(|| StoreError::Io("the write was not made".into()))
    }

    fn try_write_offsets(&self, writes: &[OffsetWrite]) -> Option<Result<Vec<WriteOutcome>, StoreError>> {
        if self.durable {
            // An fsync waits on the disk, which `no_slowdown` does not cover: never on a worker.
            return None;
        }
        let serialized = match self.write_lock.try_lock() {
            Ok(serialized) => serialized,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        self.write_offsets_locked(serialized, writes, true).transpose()
    }

    fn scan_each(&self, filter: &OffsetFilter, visit: &mut dyn FnMut(OffsetKey, OffsetRecord)) -> Result<(), StoreError> {
        let mut emit = |key: OffsetKey, value: &[u8]| -> Result<(), StoreError> {
            if filter.matches(&key) {
                let record = decode_record(&key, value)?;
                visit(key, record);
            }
            Ok(())
        };
        if let (None, Some(client)) = (&filter.topic, &filter.client_id) {
            // The client-ordered index names the keys; each record is then one point read.
            let offsets_cf = self.cf(CF_OFFSETS)?;
            return self.for_each_with_prefix(CF_BY_CLIENT, &client_prefix(client), &mut |index_key, _| {
                let Some(key) = OffsetKey::decode_by_client(index_key) else { return Ok(()) };
                match self.db.get_pinned_cf(&offsets_cf, key.encode()).map_err(io_err)? {
                    Some(value) => emit(key, &value),
                    None => Ok(()),
                }
            });
        }
        let prefix = match (&filter.topic, &filter.client_id) {
            (Some(topic), Some(client)) => topic_client_prefix(topic, client),
            (Some(topic), None) => topic_prefix(topic),
            (None, _) => Vec::new(),
        };
        self.for_each_with_prefix(CF_OFFSETS, &prefix, &mut |key, value| match OffsetKey::decode(key) {
            Some(key) => emit(key, value),
            None => Ok(()),
        })
    }

    fn scan_page(&self, filter: &OffsetFilter, after: Option<&OffsetKey>, limit: usize) -> Result<Vec<(OffsetKey, OffsetRecord)>, StoreError> {
        // The same order as `scan_each`: the client index when only the client filters.
        let by_client = filter.topic.is_none() && filter.client_id.is_some();
        let prefix = match (&filter.topic, &filter.client_id) {
            (None, Some(client)) => client_prefix(client),
            (Some(topic), Some(client)) => topic_client_prefix(topic, client),
            (Some(topic), None) => topic_prefix(topic),
            (None, None) => Vec::new(),
        };
        let encoded_after = after.map(|k| if by_client { k.encode_by_client() } else { k.encode() });
        let start = encoded_after.clone().map_or_else(|| prefix.clone(), |a| a.max(prefix.clone()));
        let (cf, offsets_cf) = (self.cf(if by_client { CF_BY_CLIENT } else { CF_OFFSETS })?, self.cf(CF_OFFSETS)?);
        let mut rows = Vec::new();
        for item in self.db.iterator_cf(&cf, IteratorMode::From(&start, Direction::Forward)) {
            if rows.len() >= limit {
                break;
            }
            let (raw, value) = item.map_err(io_err)?;
            if !raw.starts_with(&prefix) {
                break;
            }
            if encoded_after.as_deref() == Some(&*raw) {
                continue;
            }
            let key = if by_client { OffsetKey::decode_by_client(&raw) } else { OffsetKey::decode(&raw) };
            let Some(key) = key.filter(|k| filter.matches(k)) else { continue };
            let record = if by_client {
                match self.db.get_pinned_cf(&offsets_cf, key.encode()).map_err(io_err)? {
                    Some(value) => decode_record(&key, &value)?,
                    None => continue,
                }
            } else {
                decode_record(&key, &value)?
            };
            rows.push((key, record));
        }
        Ok(rows)
    }

    fn log_epoch(&self, tp: &TopicPartition) -> Result<LogEpoch, StoreError> {
        Ok(self.lock_writes().log_epoch(tp))
    }

    fn step_log_epoch(&self, tp: &TopicPartition, seen: u32, log_end: u64) -> Result<LogEpoch, StoreError> {
        let mut serialized = self.lock_writes();
        let current = serialized.log_epoch(tp);
        if current.epoch != seen {
            return Ok(current);
        }
        let next = LogEpoch { epoch: seen.saturating_add(1), log_end };
        let mut value = next.epoch.to_be_bytes().to_vec();
        value.extend_from_slice(&log_end.to_be_bytes());
        self.db.put_cf_opt(&self.cf(CF_LOG_EPOCHS)?, partition_key(tp), value, &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
        serialized.log_epochs.insert(tp.clone(), next);
        Ok(next)
    }

    fn reset(&self, key: &OffsetKey, committed: u64, min_epoch: OffsetEpoch, now: u64) -> Result<OffsetRecord, StoreError> {
        let mut serialized = self.lock_writes();
        let before = self.get_record(key)?;
        // Where an operator deleted the record, its fence stands for it.
        let min_epoch = match before {
            Some(_) => min_epoch,
            None => min_epoch.max(self.fence(key)?.unwrap_or(0)),
        };
        let record = OffsetRecord::lowered(before.as_ref(), committed, min_epoch, now);
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_OFFSETS)?, key.encode(), record.encode());
        batch.put_cf(&self.cf(CF_BY_CLIENT)?, key.encode_by_client(), []);
        // Dropped before the write: a failed write must not leave a record nobody stored.
        serialized.forget(key);
        self.write_batch(batch)?;
        serialized.remember(key, record);
        Ok(record)
    }

    fn topic_incarnation(&self, topic: &TopicName) -> Result<TopicIncarnation, StoreError> {
        Ok(self.lock_writes().incarnations.get(topic).copied().unwrap_or_default())
    }

    fn fence(&self, key: &OffsetKey) -> Result<Option<OffsetEpoch>, StoreError> {
        let value = self.db.get_cf(&self.cf(CF_FENCES)?, key.encode()).map_err(io_err)?;
        match value {
            None => Ok(None),
            Some(v) => v.as_slice().try_into().map(|b| Some(u64::from_be_bytes(b))).map_err(|_| StoreError::Corrupt(format!("unreadable fence of {key}"))),
        }
    }

    fn remove_fenced(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        let (offsets_cf, by_client_cf, fences_cf) = (self.cf(CF_OFFSETS)?, self.cf(CF_BY_CLIENT)?, self.cf(CF_FENCES)?);
        let mut removed = 0;
        for chunk in keys.chunks(REMOVE_CHUNK) {
            let mut serialized = self.lock_writes();
            let mut batch = WriteBatch::default();
            for key in chunk {
                let Some(record) = self.get_record(key)? else { continue };
                let fence = self.fence(key)?.unwrap_or(0).max(record.epoch.saturating_add(1));
                serialized.forget(key);
                removed += 1;
                batch.delete_cf(&offsets_cf, key.encode());
                batch.delete_cf(&by_client_cf, key.encode_by_client());
                batch.put_cf(&fences_cf, key.encode(), fence.to_be_bytes());
            }
            self.write_batch(batch)?;
        }
        Ok(removed)
    }

    fn topic_generation(&self, topic: &TopicName) -> Result<u64, StoreError> {
        Ok(self.lock_writes().generations.get(topic).copied().unwrap_or(0))
    }

    fn remove_topic(&self, topic: &TopicName) -> Result<usize, StoreError> {
        let mut serialized = self.lock_writes();
        serialized.forget_topic(topic);
        let (offsets_cf, by_client_cf) = (self.cf(CF_OFFSETS)?, self.cf(CF_BY_CLIENT)?);
        let mut batch = WriteBatch::default();
        let mut removed = 0;
        self.for_each_with_prefix(CF_OFFSETS, &topic_prefix(topic), &mut |key, _| {
            if let Some(decoded) = OffsetKey::decode(key) {
                batch.delete_cf(&by_client_cf, decoded.encode_by_client());
            }
            batch.delete_cf(&offsets_cf, key);
            removed += 1;
            Ok(())
        })?;
        // What publishes to the deleted topic answered means nothing for a new topic of its name.
        let publishes_cf = self.cf(CF_PUBLISHES)?;
        let mut publishes = 0;
        self.for_each_with_prefix(CF_PUBLISHES, &topic_prefix(topic), &mut |key, _| {
            batch.delete_cf(&publishes_cf, key);
            publishes += 1;
            Ok(())
        })?;
        // Fences of the old topic's records: its next incarnation's epoch floor is above them all.
        let fences_cf = self.cf(CF_FENCES)?;
        self.for_each_with_prefix(CF_FENCES, &topic_prefix(topic), &mut |key, _| {
            batch.delete_cf(&fences_cf, key);
            Ok(())
        })?;
        // After `topic_log_deleted` the generation (and incarnation) has started; only the mark goes.
        let started = serialized.removals_pending.get(topic) == Some(&TopicRemoval::LogDeleted);
        let incarnation = if started { serialized.incarnations.get(topic).copied().unwrap_or_default() } else { serialized.next_incarnation(topic) };
        batch.put_cf(&self.cf(CF_TOPIC_INCARNATIONS)?, topic.as_str(), encode_incarnation(&incarnation));
        // A topic created again under the name starts its log epochs at the incarnation's floor,
        // above every epoch of the old one (a token or a resume map of it never counts).
        let log_epochs_cf = self.cf(CF_LOG_EPOCHS)?;
        self.for_each_with_prefix(CF_LOG_EPOCHS, &topic_prefix(topic), &mut |key, _| {
            batch.delete_cf(&log_epochs_cf, key);
            Ok(())
        })?;
        let next = serialized.generations.get(topic).copied().unwrap_or(0) + u64::from(!started);
        batch.put_cf(&self.cf(CF_TOPIC_GENERATIONS)?, topic.as_str(), next.to_be_bytes());
        self.write_batch(batch)?;
        serialized.log_epochs.retain(|tp, _| tp.topic != *topic);
        serialized.incarnations.insert(topic.clone(), incarnation);
        serialized.generations.insert(topic.clone(), next);
        serialized.removals_pending.remove(topic);
        self.publishes.fetch_sub(publishes, Ordering::Relaxed);
        Ok(removed)
    }

    fn begin_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError> {
        let mut serialized = self.lock_writes();
        if serialized.removals_pending.contains_key(topic) {
            return Ok(());
        }
        let mut value = serialized.generations.get(topic).copied().unwrap_or(0).to_be_bytes().to_vec();
        value.push(1);
        self.db.put_cf_opt(&self.cf(CF_TOPIC_GENERATIONS)?, topic.as_str(), value, &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
        serialized.removals_pending.insert(topic.clone(), TopicRemoval::Begun);
        Ok(())
    }

    fn topic_log_deleted(&self, topic: &TopicName) -> Result<(), StoreError> {
        let mut serialized = self.lock_writes();
        if serialized.removals_pending.get(topic) != Some(&TopicRemoval::Begun) {
            return Ok(());
        }
        let next = serialized.generations.get(topic).copied().unwrap_or(0) + 1;
        let mut value = next.to_be_bytes().to_vec();
        value.push(2);
        let incarnation = serialized.next_incarnation(topic);
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_TOPIC_GENERATIONS)?, topic.as_str(), value);
        batch.put_cf(&self.cf(CF_TOPIC_INCARNATIONS)?, topic.as_str(), encode_incarnation(&incarnation));
        self.write_batch(batch)?;
        serialized.generations.insert(topic.clone(), next);
        serialized.incarnations.insert(topic.clone(), incarnation);
        serialized.removals_pending.insert(topic.clone(), TopicRemoval::LogDeleted);
        Ok(())
    }

    fn cancel_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError> {
        let mut serialized = self.lock_writes();
        if !serialized.removals_pending.contains_key(topic) {
            return Ok(());
        }
        let generation = serialized.generations.get(topic).copied().unwrap_or(0);
        self.db
            .put_cf_opt(&self.cf(CF_TOPIC_GENERATIONS)?, topic.as_str(), generation.to_be_bytes(), &self.write_opts())
            .map_err(|e| io_err(self.stopped.check(e)))?;
        serialized.removals_pending.remove(topic);
        Ok(())
    }

    fn pending_topic_removals(&self) -> Vec<(TopicName, TopicRemoval)> {
        self.lock_writes().removals_pending.iter().map(|(t, s)| (t.clone(), *s)).collect()
    }

    fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError> {
        let cf = self.cf(CF_OFFSETS)?;
        let mut touched = 0;
        // In chunks, like `remove`: refreshing every live client's records is one call.
        for chunk in keys.chunks(REMOVE_CHUNK) {
            let mut serialized = self.lock_writes();
            let mut batch = WriteBatch::default();
            for key in chunk {
                let record = match serialized.cached(key) {
                    Some(record) => Some(*record),
                    None => self.get_record(key)?,
                };
                // Not remembered: a client's records are touched when it leaves (or every minute
                // while it is live), and may never be written again.
                serialized.forget(key);
                if let Some(record) = record {
                    batch.put_cf(&cf, key.encode(), OffsetRecord { updated_at: now, ..record }.encode());
                    touched += 1;
                }
            }
            // Never an fsync here (`OffsetStore::touch`); nothing to refresh (a new client's
            // subscribe) is no write at all.
            if !batch.is_empty() {
                self.db.write_opt(batch, &WriteOptions::default()).map_err(|e| io_err(self.stopped.check(e)))?;
            }
        }
        Ok(touched)
    }

    fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        let unique: Vec<&OffsetKey> = keys.iter().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let (offsets_cf, by_client_cf) = (self.cf(CF_OFFSETS)?, self.cf(CF_BY_CLIENT)?);
        let mut removed = 0;
        // In chunks, each its own batch under the write lock: a sweep of a million expired
        // records never holds back ack writes for more than one chunk.
        for chunk in unique.chunks(REMOVE_CHUNK) {
            let mut serialized = self.lock_writes();
            let mut batch = WriteBatch::default();
            for key in chunk {
                serialized.forget(key);
                if self.get_record(key)?.is_some() {
                    removed += 1;
                }
                batch.delete_cf(&offsets_cf, key.encode());
                batch.delete_cf(&by_client_cf, key.encode_by_client());
            }
            self.write_batch(batch)?;
        }
        Ok(removed)
    }

    fn remove_unchanged(&self, records: &[(OffsetKey, u64)]) -> Result<usize, StoreError> {
        let (offsets_cf, by_client_cf) = (self.cf(CF_OFFSETS)?, self.cf(CF_BY_CLIENT)?);
        let mut removed = 0;
        // In chunks, like `remove`.
        for chunk in records.chunks(REMOVE_CHUNK) {
            let mut serialized = self.lock_writes();
            let mut batch = WriteBatch::default();
            for (key, updated_at) in chunk {
                serialized.forget(key);
                if self.get_record(key)?.is_some_and(|r| r.updated_at == *updated_at) {
                    batch.delete_cf(&offsets_cf, key.encode());
                    batch.delete_cf(&by_client_cf, key.encode_by_client());
                    removed += 1;
                }
            }
            self.write_batch(batch)?;
        }
        Ok(removed)
    }

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
        let id = dead.id();
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_DEAD_LETTERS)?, dead_letter_key(&id), encode_dead_letter(dead));
        batch.put_cf(&self.cf(CF_DEAD_LETTERS_BY_CLIENT)?, dead_letter_index_key(&id), []);
        self.write_batch(batch)
    }

    fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, StoreError> {
        let (cf_name, prefix, start) = if query.by_client() {
            let client = query.client_id.as_ref().expect("by_client has a client");
            (CF_DEAD_LETTERS_BY_CLIENT, client_prefix(client), query.after.as_ref().map(dead_letter_index_key))
        } else {
            let prefix = match (&query.topic, &query.client_id) {
                (Some(topic), Some(client)) => topic_client_prefix(topic, client),
                (Some(topic), None) => topic_prefix(topic),
                (None, _) => Vec::new(),
            };
            (CF_DEAD_LETTERS, prefix, query.after.as_ref().map(dead_letter_key))
        };
        let main_cf = self.cf(CF_DEAD_LETTERS)?;
        let rows = self.page(cf_name, &prefix, start.as_deref(), query.limit, &mut |key, value| {
            let dead = if query.by_client() {
                let Some(id) = decode_dead_letter_index_key(key) else { return Ok(None) };
                match self.db.get_pinned_cf(&main_cf, dead_letter_key(&id)).map_err(io_err)? {
                    Some(value) => decode_dead_letter(id, &value),
                    None => None,
                }
            } else {
                decode_dead_letter_key(key).and_then(|id| decode_dead_letter(id, value))
            };
            Ok(dead.filter(|d| query.matches(d)))
        })?;
        Ok(DeadLetterPage::from_rows(rows, query.limit))
    }

    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
        let keys = self.prefix_scan(CF_DEAD_LETTERS, &topic_prefix(topic))?;
        self.remove_dead_letter_keys(keys.iter().map(|(key, _)| &**key))
    }

    fn remove_dead_letters_before(&self, at_ms: u64) -> Result<usize, StoreError> {
        let mut old = Vec::new();
        self.for_each_with_prefix(CF_DEAD_LETTERS, &[], &mut |key, value| {
            let at = value.get(5..13).map(|b| u64::from_be_bytes(b.try_into().unwrap()));
            if at.is_some_and(|at| at < at_ms) {
                old.push(key.to_vec());
            }
            Ok(())
        })?;
        self.remove_dead_letter_keys(old.iter().map(Vec::as_slice))
    }

    fn remove_dead_letter_ids(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
        // Only those there: a dead letter settled meanwhile (its redrive acknowledged) is not
        // counted as deleted.
        let main_cf = self.cf(CF_DEAD_LETTERS)?;
        let mut keys = Vec::with_capacity(ids.len());
        for id in ids {
            let key = dead_letter_key(id);
            if self.db.get_pinned_cf(&main_cf, &key).map_err(io_err)?.is_some() {
                keys.push(key);
            }
        }
        self.remove_dead_letter_keys(keys.iter().map(Vec::as_slice))
    }

    fn mark_redrive(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError> {
        let _serialized = self.lock_writes();
        let (main_cf, redrives_cf) = (self.cf(CF_DEAD_LETTERS)?, self.cf(CF_REDRIVES)?);
        let mut batch = WriteBatch::default();
        let (mut marked, mut new) = (0, 0);
        for id in ids {
            let key = dead_letter_key(id);
            if self.db.get_pinned_cf(&main_cf, &key).map_err(io_err)?.is_none() {
                continue;
            }
            marked += 1;
            if self.db.get_pinned_cf(&redrives_cf, &key).map_err(io_err)?.is_none() {
                batch.put_cf(&redrives_cf, &key, REDRIVE_MARK);
                new += 1;
            }
        }
        self.write_batch(batch)?;
        self.redrives.fetch_add(new, Ordering::Relaxed);
        Ok(marked)
    }

    fn redrives(&self, topic: &TopicName, client_id: &ClientId, after: Option<&DeadLetterId>, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let main_cf = self.cf(CF_DEAD_LETTERS)?;
        let start = after.map(dead_letter_key);
        let mut stale = Vec::new();
        let mut rows = self.page(CF_REDRIVES, &topic_client_prefix(topic, client_id), start.as_deref(), limit, &mut |key, _| {
            let Some(id) = decode_dead_letter_key(key) else { return Ok(None) };
            match self.db.get_pinned_cf(&main_cf, key).map_err(io_err)? {
                Some(value) => Ok(decode_dead_letter(id, &value)),
                None => {
                    stale.push(key.to_vec());
                    Ok(None)
                }
            }
        })?;
        rows.truncate(limit);
        if !stale.is_empty() {
            self.drop_stale_marks(&stale)?;
        }
        Ok(rows)
    }

    fn settle_redrive(&self, id: &DeadLetterId, again: Option<&DeadLetter>) -> Result<(), StoreError> {
        let _serialized = self.lock_writes();
        let (main_cf, index_cf, redrives_cf) = (self.cf(CF_DEAD_LETTERS)?, self.cf(CF_DEAD_LETTERS_BY_CLIENT)?, self.cf(CF_REDRIVES)?);
        let key = dead_letter_key(id);
        // Settled already (by another session's ack or exhaustion), or removed with its dead
        // letter: nothing to do, and an acknowledged dead letter never comes back.
        if self.db.get_pinned_cf(&redrives_cf, &key).map_err(io_err)?.is_none() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        batch.delete_cf(&redrives_cf, &key);
        match again {
            Some(dead) => {
                batch.put_cf(&main_cf, &key, encode_dead_letter(dead));
                batch.put_cf(&index_cf, dead_letter_index_key(id), []);
            }
            None => {
                batch.delete_cf(&main_cf, &key);
                batch.delete_cf(&index_cf, dead_letter_index_key(id));
            }
        }
        self.write_batch(batch)?;
        self.redrives.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    fn redrives_pending(&self) -> usize {
        self.redrives.load(Ordering::Relaxed)
    }

    fn record_gap(&self, gap: &Gap) -> Result<(), StoreError> {
        let mut value = Vec::with_capacity(17);
        value.push(1u8);
        value.extend_from_slice(&gap.to.to_be_bytes());
        value.extend_from_slice(&gap.at.to_be_bytes());
        self.db.put_cf_opt(&self.cf(CF_GAPS)?, dead_letter_key(&gap.id()), value, &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))
    }

    fn gaps(&self, query: &DeadLetterQuery) -> Result<GapPage, StoreError> {
        // Gaps are rare: a client filter without a topic reads every gap and keeps its own.
        let prefix = match (&query.topic, &query.client_id) {
            (Some(topic), Some(client)) => topic_client_prefix(topic, client),
            (Some(topic), None) => topic_prefix(topic),
            (None, _) => Vec::new(),
        };
        let start = query.after.as_ref().map(dead_letter_key);
        let mut gaps = self.page(CF_GAPS, &prefix, start.as_deref(), query.limit, &mut |key, value| {
            let gap = decode_dead_letter_key(key).and_then(|id| decode_gap(id, value));
            Ok(gap.filter(|g| query.client_id.as_ref().is_none_or(|c| *c == g.client_id)))
        })?;
        let next = (gaps.len() > query.limit).then(|| {
            gaps.truncate(query.limit);
            gaps.last().map(Gap::id)
        });
        Ok(GapPage { gaps, next: next.flatten() })
    }

    fn remove_gaps(&self, topic: Option<&TopicName>, before_ms: u64) -> Result<usize, StoreError> {
        let prefix = topic.map(topic_prefix).unwrap_or_default();
        let cf = self.cf(CF_GAPS)?;
        let mut batch = WriteBatch::default();
        self.for_each_with_prefix(CF_GAPS, &prefix, &mut |key, value| {
            let at = value.get(9..17).map(|b| u64::from_be_bytes(b.try_into().unwrap()));
            if topic.is_some() || at.is_none_or(|at| at < before_ms) {
                batch.delete_cf(&cf, key);
            }
            Ok(())
        })?;
        let removed = batch.len();
        self.write_batch(batch)?;
        Ok(removed)
    }

    fn remembered_publish(&self, topic: &TopicName, key: &IdempotencyKey) -> Result<Option<RememberedPublish>, StoreError> {
        match self.db.get_pinned_cf(&self.cf(CF_PUBLISHES)?, publish_key(topic, key)).map_err(io_err)? {
            Some(bytes) => RememberedPublish::decode(&bytes)
                .map(Some)
                .ok_or_else(|| StoreError::Corrupt(format!("unreadable idempotency key {:?} of {topic}", key.as_str()))),
            None => Ok(None),
        }
    }

    fn remember_publish(&self, topic: &TopicName, key: &IdempotencyKey, publish: &RememberedPublish) -> Result<(), StoreError> {
        let _serialized = self.lock_writes();
        let (cf, stored_key) = (self.cf(CF_PUBLISHES)?, publish_key(topic, key));
        let existed = self.db.get_pinned_cf(&cf, &stored_key).map_err(io_err)?.is_some();
        self.db.put_cf_opt(&cf, &stored_key, publish.encode(), &self.write_opts()).map_err(|e| io_err(self.stopped.check(e)))?;
        if !existed {
            self.publishes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn remembered_publishes(&self) -> usize {
        self.publishes.load(Ordering::Relaxed)
    }

    fn forget_publishes_expired_at(&self, now: u64) -> Result<usize, StoreError> {
        let mut expired: Vec<Box<[u8]>> = Vec::new();
        self.for_each_with_prefix(CF_PUBLISHES, &[], &mut |key, value| {
            // An unreadable value goes too: it can never answer a retry.
            if RememberedPublish::expires_at_of(value).is_none_or(|at| at <= now) {
                expired.push(key.into());
            }
            Ok(())
        })?;
        let cf = self.cf(CF_PUBLISHES)?;
        let mut forgotten = 0;
        for chunk in expired.chunks(REMOVE_CHUNK) {
            let _serialized = self.lock_writes();
            let mut batch = WriteBatch::default();
            for key in chunk {
                // Read again under the lock: a publish may have remembered the key anew since.
                let still_expired =
                    self.db.get_pinned_cf(&cf, key).map_err(io_err)?.is_some_and(|v| RememberedPublish::expires_at_of(&v).is_none_or(|at| at <= now));
                if still_expired {
                    batch.delete_cf(&cf, key);
                }
            }
            let removed = batch.len();
            self.write_batch(batch)?;
            self.publishes.fetch_sub(removed, Ordering::Relaxed);
            forgotten += removed;
        }
        Ok(forgotten)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_wal(true).map_err(|e| io_err(self.stopped.check(e)))
    }

    fn write_failure(&self) -> Option<String> {
        self.stopped.reason()
    }

    fn make_durable(&self) -> Result<(), StoreError> {
        if self.durable {
            crate::core::metrics::timed_fsync("offsets", || self.db.flush_wal(true)).map_err(|e| io_err(self.stopped.check(e)))?;
        }
        Ok(())
    }

    fn compact(&self) -> Result<(), StoreError> {
        // Deleted keys stay as tombstones that every scan must step over until compaction.
        for name in [CF_OFFSETS, CF_BY_CLIENT] {
            self.db.compact_range_cf(&self.cf(name)?, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}

/// The `CF_LOG_EPOCHS` key of a partition: its topic's prefix (the length-prefixed name), then
/// the partition.
fn partition_key(tp: &TopicPartition) -> Vec<u8> {
    let mut key = topic_prefix(&tp.topic);
    key.extend_from_slice(&tp.partition.to_be_bytes());
    key
}

fn decode_partition_key(key: &[u8]) -> Option<TopicPartition> {
    let len = usize::from(u16::from_be_bytes(key.get(..2)?.try_into().ok()?));
    let topic = TopicName::parse(std::str::from_utf8(key.get(2..2 + len)?).ok()?).ok()?;
    let partition = key.get(2 + len..).filter(|p| p.len() == 4)?;
    Some(TopicPartition::new(topic, u32::from_be_bytes(partition.try_into().ok()?)))
}

fn encode_incarnation(incarnation: &TopicIncarnation) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&incarnation.id.to_be_bytes());
    out[8..].copy_from_slice(&incarnation.epoch_floor.to_be_bytes());
    out
}

fn decode_incarnation(value: &[u8]) -> Option<TopicIncarnation> {
    let id = u64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let epoch_floor = u32::from_be_bytes(value.get(8..12)?.try_into().ok()?);
    (value.len() == 12).then_some(TopicIncarnation { id, epoch_floor })
}

fn decode_log_epoch(value: &[u8]) -> Option<LogEpoch> {
    let epoch = u32::from_be_bytes(value.get(..4)?.try_into().ok()?);
    let log_end = u64::from_be_bytes(value.get(4..12)?.try_into().ok()?);
    Some(LogEpoch { epoch, log_end })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database's memory is bounded whatever is written: 24 MiB of remembered publishes leave
    /// at most two 4 MiB memtables of them (RocksDB's default memtable, 64 MiB, held them all),
    /// the cache is the one of 8 MiB, and every record reads back after a reopen.
    #[test]
    fn the_memtables_and_block_cache_stay_within_their_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let topic = TopicName::parse("t").unwrap();
        let key = |n: u32| IdempotencyKey::parse(format!("k:{n}").as_bytes()).unwrap();
        let publish = |n: u32| RememberedPublish { digest: [n as u8; 32], offsets: (0..100).map(|p| (p, u64::from(n))).collect(), expires_at: u64::MAX };
        let records = 24 * 1024 * 1024 / publish(0).encode().len() as u32;
        {
            let store = RocksOffsetStore::open(dir.path(), false).unwrap();
            for n in 0..records {
                store.remember_publish(&topic, &key(n), &publish(n)).unwrap();
            }
            let cf = store.cf(CF_PUBLISHES).unwrap();
            let in_memtables = store.db.property_int_value_cf(&cf, "rocksdb.size-all-mem-tables").unwrap().unwrap();
            assert!(in_memtables <= 10 << 20, "{in_memtables} bytes of 24 MiB stay in memtables");
            assert_eq!(store.db.property_int_value_cf(&cf, "rocksdb.block-cache-capacity").unwrap(), Some(BLOCK_CACHE_BYTES as u64));
        }
        let store = RocksOffsetStore::open(dir.path(), false).unwrap();
        assert_eq!(store.remembered_publishes(), records as usize);
        for n in [0, records / 2, records - 1] {
            assert_eq!(store.remembered_publish(&topic, &key(n)).unwrap().unwrap().digest, [n as u8; 32]);
        }
    }
}
