//! The RocksDB `OffsetStore` (the default): `<data_dir>/offsets`.
//!
//! Column families: `offsets` (topic-ordered key -> record), `by_client` (client-ordered key ->
//! nothing, the second index that makes a client filter a prefix scan) and `dead_letters`.
//! CAS-max is a conditional write (read, skip unless greater, put) serialized by one lock, so
//! concurrent writers to the same key can never interleave between the read and the put.
//! Writes go through the WAL; `sync_writes` adds an fsync per batch.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use rocksdb::{ColumnFamilyDescriptor, DBWithThreadMode, Direction, IteratorMode, MultiThreaded, Options, WriteBatch, WriteOptions};

use crate::core::names::{client_prefix, topic_prefix, ClientId, OffsetKey, TopicName};
use crate::core::offsets::{DeadLetter, OffsetFilter, OffsetRecord, OffsetStore, OffsetWrite, StoreError, WriteOutcome};

type Db = DBWithThreadMode<MultiThreaded>;
/// Raw `(key, value)` pairs read from a column family.
type RawPairs = Vec<(Box<[u8]>, Box<[u8]>)>;
/// A visitor of raw `(key, value)` pairs that may stop the scan with an error.
type RawVisitor<'a> = &'a mut dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError>;

const CF_OFFSETS: &str = "offsets";
const CF_BY_CLIENT: &str = "by_client";
const CF_DEAD_LETTERS: &str = "dead_letters";

pub struct RocksOffsetStore {
    db: Db,
    sync_writes: bool,
    write_lock: Mutex<()>,
}

fn io_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

impl RocksOffsetStore {
    pub fn open(data_dir: &Path, sync_writes: bool) -> Result<Self, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs = [CF_OFFSETS, CF_BY_CLIENT, CF_DEAD_LETTERS].map(|n| ColumnFamilyDescriptor::new(n, Options::default()));
        let db = Db::open_cf_descriptors(&opts, data_dir.join("offsets"), cfs).map_err(io_err)?;
        Ok(Self { db, sync_writes, write_lock: Mutex::new(()) })
    }

    fn cf(&self, name: &str) -> Result<std::sync::Arc<rocksdb::BoundColumnFamily<'_>>, StoreError> {
        self.db.cf_handle(name).ok_or_else(|| io_err(format!("missing column family {name}")))
    }

    fn write_opts(&self) -> WriteOptions {
        let mut opts = WriteOptions::default();
        opts.set_sync(self.sync_writes);
        opts
    }

    fn get_record(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        let cf = self.cf(CF_OFFSETS)?;
        match self.db.get_pinned_cf(&cf, key.encode()).map_err(io_err)? {
            Some(bytes) => Ok(Some(decode_record(key, &bytes)?)),
            None => Ok(None),
        }
    }

    /// Calls `f` with every `(key, value)` of `cf` whose key starts with `prefix`, in key order.
    fn for_each_with_prefix(&self, cf_name: &str, prefix: &[u8], f: RawVisitor<'_>) -> Result<(), StoreError> {
        let cf = self.cf(cf_name)?;
        for item in self.db.iterator_cf(&cf, IteratorMode::From(prefix, Direction::Forward)) {
            let (key, value) = item.map_err(io_err)?;
            if !key.starts_with(prefix) {
                break;
            }
            f(&key, &value)?;
        }
        Ok(())
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

fn decode_record(key: &OffsetKey, bytes: &[u8]) -> Result<OffsetRecord, StoreError> {
    OffsetRecord::decode(bytes).ok_or_else(|| StoreError::Corrupt(format!("unreadable record for {key}")))
}

impl OffsetStore for RocksOffsetStore {
    fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError> {
        self.get_record(key)
    }

    fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError> {
        let _serialized = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let (offsets_cf, by_client_cf) = (self.cf(CF_OFFSETS)?, self.cf(CF_BY_CLIENT)?);
        // Records as they will be after this batch, so two writes to one key in a batch compare
        // against each other and not only against the stored value.
        let mut after: HashMap<&OffsetKey, OffsetRecord> = HashMap::new();
        let mut outcomes = Vec::with_capacity(writes.len());
        let mut batch = WriteBatch::default();
        for w in writes {
            let current = match after.get(&w.key) {
                Some(record) => Some(*record),
                None => self.get_record(&w.key)?,
            };
            let record = match current {
                Some(c) if !c.is_advanced_by(w) => {
                    outcomes.push(WriteOutcome::Stale);
                    continue;
                }
                Some(c) => c.advanced_by(w),
                None => {
                    batch.put_cf(&by_client_cf, w.key.encode_by_client(), []);
                    OffsetRecord::from_write(w)
                }
            };
            batch.put_cf(&offsets_cf, w.key.encode(), record.encode());
            after.insert(&w.key, record);
            outcomes.push(WriteOutcome::Advanced);
        }
        if !batch.is_empty() {
            self.db.write_opt(batch, &self.write_opts()).map_err(io_err)?;
        }
        Ok(outcomes)
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
            (Some(topic), Some(client)) => {
                let mut prefix = OffsetKey::new(topic.clone(), client.clone(), 0).encode();
                prefix.truncate(prefix.len() - 4);
                prefix
            }
            (Some(topic), None) => topic_prefix(topic),
            (None, _) => Vec::new(),
        };
        self.for_each_with_prefix(CF_OFFSETS, &prefix, &mut |key, value| match OffsetKey::decode(key) {
            Some(key) => emit(key, value),
            None => Ok(()),
        })
    }

    fn reset(&self, key: &OffsetKey, committed: u64, now: u64) -> Result<OffsetRecord, StoreError> {
        let _serialized = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let last_acked = self.get_record(key)?.and_then(|r| r.last_acked);
        let record = OffsetRecord { committed, last_acked, updated_at: now };
        let mut batch = WriteBatch::default();
        batch.put_cf(&self.cf(CF_OFFSETS)?, key.encode(), record.encode());
        batch.put_cf(&self.cf(CF_BY_CLIENT)?, key.encode_by_client(), []);
        self.db.write_opt(batch, &self.write_opts()).map_err(io_err)?;
        Ok(record)
    }

    fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError> {
        let _serialized = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let cf = self.cf(CF_OFFSETS)?;
        let mut batch = WriteBatch::default();
        let mut touched = 0;
        for key in keys {
            if let Some(record) = self.get_record(key)? {
                batch.put_cf(&cf, key.encode(), OffsetRecord { updated_at: now, ..record }.encode());
                touched += 1;
            }
        }
        self.db.write_opt(batch, &self.write_opts()).map_err(io_err)?;
        Ok(touched)
    }

    fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError> {
        let _serialized = self.write_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut batch = WriteBatch::default();
        let mut removed = 0;
        let unique: std::collections::BTreeSet<&OffsetKey> = keys.iter().collect();
        for key in unique {
            if self.get_record(key)?.is_some() {
                removed += 1;
            }
            batch.delete_cf(&self.cf(CF_OFFSETS)?, key.encode());
            batch.delete_cf(&self.cf(CF_BY_CLIENT)?, key.encode_by_client());
        }
        self.db.write_opt(batch, &self.write_opts()).map_err(io_err)?;
        Ok(removed)
    }

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError> {
        let mut key = OffsetKey::new(dead.topic.clone(), dead.client_id.clone(), dead.partition).encode();
        key.extend_from_slice(&dead.offset.to_be_bytes());
        let mut value = Vec::with_capacity(17 + dead.reason.len());
        value.push(1u8);
        value.extend_from_slice(&dead.attempts.to_be_bytes());
        value.extend_from_slice(&dead.at.to_be_bytes());
        value.extend_from_slice(dead.reason.as_bytes());
        self.db.put_cf_opt(&self.cf(CF_DEAD_LETTERS)?, key, value, &self.write_opts()).map_err(io_err)
    }

    fn dead_letters(&self, topic: Option<&TopicName>, client: Option<&ClientId>) -> Result<Vec<DeadLetter>, StoreError> {
        let prefix = match (topic, client) {
            (Some(t), Some(c)) => {
                let mut p = OffsetKey::new(t.clone(), c.clone(), 0).encode();
                p.truncate(p.len() - 4);
                p
            }
            (Some(t), None) => topic_prefix(t),
            // Dead letters have no client index: a client-only filter scans them all.
            (None, _) => Vec::new(),
        };
        let mut out = Vec::new();
        for (key, value) in self.prefix_scan(CF_DEAD_LETTERS, &prefix)? {
            let Some((key_part, offset)) = key.split_at_checked(key.len().saturating_sub(8)) else { continue };
            let (Some(offset_key), Ok(offset)) = (OffsetKey::decode(key_part), offset.try_into().map(u64::from_be_bytes)) else {
                continue;
            };
            if client.is_some_and(|c| *c != offset_key.client_id) || value.len() < 13 || value[0] != 1 {
                continue;
            }
            out.push(DeadLetter {
                topic: offset_key.topic,
                client_id: offset_key.client_id,
                partition: offset_key.partition,
                offset,
                attempts: u32::from_be_bytes(value[1..5].try_into().unwrap()),
                at: u64::from_be_bytes(value[5..13].try_into().unwrap()),
                reason: String::from_utf8_lossy(&value[13..]).into_owned(),
            });
        }
        Ok(out)
    }

    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError> {
        let keys = self.prefix_scan(CF_DEAD_LETTERS, &topic_prefix(topic))?;
        let cf = self.cf(CF_DEAD_LETTERS)?;
        let mut batch = WriteBatch::default();
        for (key, _) in &keys {
            batch.delete_cf(&cf, key);
        }
        self.db.write_opt(batch, &self.write_opts()).map_err(io_err)?;
        Ok(keys.len())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_wal(true).map_err(io_err)
    }

    fn compact(&self) -> Result<(), StoreError> {
        // Deleted keys stay as tombstones that every scan must step over until compaction.
        for name in [CF_OFFSETS, CF_BY_CLIENT] {
            self.db.compact_range_cf(&self.cf(name)?, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}
