//! The ack layer: committed offsets per `topic#client_id#partition` and the store that keeps them
//! (with the dead letters and gaps, `dead_letters.rs`; their expiry is `offset_retention.rs`).
//!
//! A committed offset is the next offset the client has not acknowledged (Kafka's convention).
//! Writes are CAS-max: `OffsetStore::write_offsets` never lowers a stored offset, so a replay after
//! a restart cannot drag a fast client back. Only `reset` moves an offset backwards.

use super::dead_letters::{DeadLetter, DeadLetterId, DeadLetterPage, DeadLetterQuery, Gap, GapPage};
use super::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use super::remembered_publish::{IdempotencyKey, RememberedPublish};

/// Version byte at the start of every stored record value, so the format can change later.
const RECORD_FORMAT_VERSION: u8 = 1;

/// A committed offset's *offset epoch* (docs/semantics.md, "Offset epochs"): 0 for a record never
/// lowered, one more at every lowering (an admin reset, an offset found above the log end). A
/// resume token, a tracker or a queued write made under an older epoch is fenced: it can never
/// lift the offset that lowering set. Its high 32 bits are the partition's log epoch the record
/// is in (`LogEpoch`), its low 32 bits the lowerings within it, so one comparison orders both: a
/// lost log tail outranks every reset made before it.
pub type OffsetEpoch = u64;

/// A partition's *log epoch*: 0 until a reader first found its log's tail lost (a Kafka unclean
/// election, a RocketMQ broker restored from behind), one more at each; `log_end` is where the log
/// ended when it began. Durable in the offset store, so every instance and every client that was
/// away learns it: a committed offset of an older log epoch above `log_end` acked events that are
/// gone, and is lowered to it at the client's next subscribe however far the log has grown back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogEpoch {
    pub epoch: u32,
    pub log_end: u64,
}

impl LogEpoch {
    /// The first offset epoch of this log epoch: above every offset epoch of an older one.
    pub fn first_offset_epoch(&self) -> OffsetEpoch {
        u64::from(self.epoch) << 32
    }

    /// The log epoch an offset epoch is in.
    pub fn of(offset_epoch: OffsetEpoch) -> u32 {
        (offset_epoch >> 32) as u32
    }
}

/// A topic's *incarnation* (docs/protocol.md, "Resume tokens"): which topic of its name this is.
/// `id` is 0 for a topic never deleted here and a new random number at each deletion;
/// `epoch_floor` is the least log epoch of its partitions, one above every log epoch the topics
/// of its name had before, so nothing made under an earlier topic of the name (a token, a map
/// resume, a queued write) can outrank anything of this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicIncarnation {
    pub id: u64,
    pub epoch_floor: u32,
}

impl TopicIncarnation {
    /// The incarnation after this one's topic was deleted: above every log epoch it had (`seen`,
    /// the highest of its partitions'), with a fresh id (`resume_token::new_incarnation_id`).
    pub fn next(&self, seen: u32, id: u64) -> Self {
        Self { id, epoch_floor: self.epoch_floor.max(seen).saturating_add(1) }
    }

    /// A partition's log epoch as stored, raised to the floor.
    pub fn floored(&self, stored: Option<LogEpoch>) -> LogEpoch {
        match stored {
            Some(log) if log.epoch >= self.epoch_floor => log,
            _ => LogEpoch { epoch: self.epoch_floor, log_end: 0 },
        }
    }
}

/// `updated_at` value that means "unknown". Such a record is never considered expired: treating a
/// sentinel as a real timestamp is exactly the KAFKA-8069 bug (offsets expired right after load).
pub const UNKNOWN_TIME: u64 = 0;

/// One stored ack offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetRecord {
    /// Next offset not acknowledged; every offset below it is acknowledged.
    pub committed: u64,
    /// Highest acknowledged offset, for operators; `None` before the first ack.
    pub last_acked: Option<u64>,
    /// Epoch ms of the last write; `UNKNOWN_TIME` when not known.
    pub updated_at: u64,
    /// The offset epoch the record is in (`OffsetEpoch`).
    pub epoch: OffsetEpoch,
}

impl OffsetRecord {
    /// Fixed 33-byte encoding: version, committed, last_acked (+1, 0 = none), updated_at, epoch.
    /// Records written before epochs existed are 25 bytes long and decode as epoch 0.
    pub fn encode(&self) -> [u8; 33] {
        let mut out = [0u8; 33];
        out[0] = RECORD_FORMAT_VERSION;
        out[1..9].copy_from_slice(&self.committed.to_be_bytes());
        out[9..17].copy_from_slice(&self.last_acked.map_or(0, |v| v + 1).to_be_bytes());
        out[17..25].copy_from_slice(&self.updated_at.to_be_bytes());
        out[25..33].copy_from_slice(&self.epoch.to_be_bytes());
        out
    }

    /// True when `write` moves this record forward: a higher committed offset, or the same one
    /// with a higher `last_acked` (out-of-order acks above the floor). Never backwards, and never
    /// for a write made under an older epoch (before a lowering: it would undo it).
    pub fn is_advanced_by(&self, write: &OffsetWrite) -> bool {
        write.epoch >= self.epoch && (write.committed > self.committed || (write.committed == self.committed && write.last_acked > self.last_acked))
    }

    /// This record after a write that advances it; neither field moves back.
    pub fn advanced_by(&self, write: &OffsetWrite) -> Self {
        Self {
            committed: self.committed.max(write.committed),
            last_acked: self.last_acked.max(write.last_acked),
            updated_at: write.updated_at,
            epoch: self.epoch.max(write.epoch),
        }
    }

    /// The record a write creates where there was none.
    pub fn from_write(write: &OffsetWrite) -> Self {
        Self { committed: write.committed, last_acked: write.last_acked, updated_at: write.updated_at, epoch: write.epoch }
    }

    /// The record a lowering (`OffsetStore::reset`) leaves where `before` was: the new offset, a
    /// `last_acked` kept only below it, and the next epoch (at least `min_epoch`), which fences
    /// everything made before.
    pub fn lowered(before: Option<&OffsetRecord>, committed: u64, min_epoch: OffsetEpoch, now: u64) -> Self {
        let last_acked = before.and_then(|r| r.last_acked).filter(|l| *l < committed);
        Self { committed, last_acked, updated_at: now, epoch: before.map_or(0, |r| r.epoch).saturating_add(1).max(min_epoch) }
    }

    /// Decodes a stored value. A value shorter than the current format (an older or damaged
    /// record) keeps its committed offset and gets `UNKNOWN_TIME`, never an expired time, and
    /// epoch 0.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.first() != Some(&RECORD_FORMAT_VERSION) || bytes.len() < 9 {
            return None;
        }
        let word = |at: usize| bytes.get(at..at + 8).map(|b| u64::from_be_bytes(b.try_into().unwrap()));
        Some(Self {
            committed: word(1)?,
            last_acked: word(9).and_then(|v| v.checked_sub(1)),
            updated_at: word(17).unwrap_or(UNKNOWN_TIME),
            epoch: word(25).unwrap_or(0),
        })
    }
}

/// How far a topic's removal got (`OffsetStore::begin_topic_removal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicRemoval {
    /// Marked; the log may or may not have been deleted.
    Begun,
    /// The log is deleted; the offsets, dead letters and gaps are still to go.
    LogDeleted,
}

/// One CAS-max write: raise `key` to `committed` (and `last_acked`) unless it is already there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetWrite {
    pub key: OffsetKey,
    pub committed: u64,
    pub last_acked: Option<u64>,
    pub updated_at: u64,
    /// The topic generation the write was made for (`OffsetStore::topic_generation` when the
    /// subscription started). A write for an older generation, made before the topic was deleted,
    /// is dropped: it must not land on a new topic of the same name.
    pub generation: u64,
    /// The offset epoch of the record the write's tracker started from: a write made before a
    /// lowering is stale, however high its offset.
    pub epoch: OffsetEpoch,
}

/// What a CAS-max write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The record moved forward (or was created).
    Advanced,
    /// The record was already at or above the write: nothing changed.
    Stale,
    /// The write was made for a topic that has been deleted since: nothing changed.
    Obsolete,
}

/// Which records a scan returns; each present field is an exact match.
#[derive(Debug, Clone, Default)]
pub struct OffsetFilter {
    pub topic: Option<TopicName>,
    pub client_id: Option<ClientId>,
    pub partition: Option<u32>,
}

impl OffsetFilter {
    pub fn matches(&self, key: &OffsetKey) -> bool {
        self.topic.as_ref().is_none_or(|t| *t == key.topic)
            && self.client_id.as_ref().is_none_or(|c| *c == key.client_id)
            && self.partition.is_none_or(|p| p == key.partition)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("offset store I/O: {0}")]
    Io(String),
    #[error("offset store record is corrupt: {0}")]
    Corrupt(String),
}

/// Durable storage of ack offsets (and of dead letters, which count as acknowledged).
/// Implementations: `store::memory` and `store::rocks`.
pub trait OffsetStore: Send + Sync + 'static {
    fn read(&self, key: &OffsetKey) -> Result<Option<OffsetRecord>, StoreError>;

    /// Applies CAS-max writes atomically as one batch; writes to the same key are serialized, so a
    /// stored offset only ever moves forward. Returns one outcome per write, in order.
    fn write_offsets(&self, writes: &[OffsetWrite]) -> Result<Vec<WriteOutcome>, StoreError>;

    /// Calls `visit` for every record matching `filter`, without collecting them (start-up
    /// alignment and the retention sweep read every record). A topic or client filter is a
    /// prefix scan. `visit` must not call back into the store.
    fn scan_each(&self, filter: &OffsetFilter, visit: &mut dyn FnMut(OffsetKey, OffsetRecord)) -> Result<(), StoreError>;

    /// Records matching `filter`, collected (ordered by key for a topic filter or none).
    fn scan(&self, filter: &OffsetFilter) -> Result<Vec<(OffsetKey, OffsetRecord)>, StoreError> {
        let mut rows = Vec::new();
        self.scan_each(filter, &mut |key, record| rows.push((key, record)))?;
        Ok(rows)
    }

    /// At most `limit` records matching `filter` that come after `after` in the store's order
    /// (the order of `scan`): one page of the admin listing, never a whole scan collected.
    fn scan_page(&self, filter: &OffsetFilter, after: Option<&OffsetKey>, limit: usize) -> Result<Vec<(OffsetKey, OffsetRecord)>, StoreError>;

    /// `write_offsets`, done only when it needs no waiting (another writer holding the store, a
    /// RocksDB write stall): `None` then, and nothing was written. The offset writer makes a
    /// confirmed ack's write on the caller's tokio worker this way when nothing is queued, and
    /// hands it to its own thread otherwise, so a stalled store never freezes a worker (issue 39,
    /// item 10). A store that cannot tell answers `None` always.
    fn try_write_offsets(&self, writes: &[OffsetWrite]) -> Option<Result<Vec<WriteOutcome>, StoreError>> {
        let _ = writes;
        None
    }

    /// Sets `key` to `committed`, backwards allowed (the admin reset route, and an offset found
    /// above the log end), in the record's next epoch, at least `min_epoch`
    /// (`OffsetRecord::lowered`). Serialized with CAS-max writes; a write of an older epoch that
    /// comes after it is stale.
    fn reset(&self, key: &OffsetKey, committed: u64, min_epoch: OffsetEpoch, now: u64) -> Result<OffsetRecord, StoreError>;

    /// The partition's log epoch (`LogEpoch::default()` until a lost tail was first found).
    fn log_epoch(&self, tp: &TopicPartition) -> Result<LogEpoch, StoreError>;

    /// A lost tail of `tp`'s log, found by a reader that was in log epoch `seen`: starts the
    /// next log epoch, ending at `log_end`, unless a session or an instance that found the same
    /// loss started it already. Returns the partition's log epoch after it.
    fn step_log_epoch(&self, tp: &TopicPartition, seen: u32, log_end: u64) -> Result<LogEpoch, StoreError>;

    /// The topic's incarnation (`TopicIncarnation`): a new one starts with each generation.
    fn topic_incarnation(&self, topic: &TopicName) -> Result<TopicIncarnation, StoreError>;

    /// The fence an operator's deletion of the key's record left (`remove_fenced`): the least
    /// offset epoch a record of the key may have from then on. `None` where there is none.
    fn fence(&self, key: &OffsetKey) -> Result<Option<OffsetEpoch>, StoreError>;

    /// Removes the records of `keys`, as an operator's deletion does: each leaves a fence one
    /// above its epoch, so a token or a queued write made before the deletion never brings the
    /// old offset back (the fence outlives the record). Returns how many records there were.
    fn remove_fenced(&self, keys: &[OffsetKey]) -> Result<usize, StoreError>;

    /// The current generation of `topic`: 0 until it is first deleted, then one more per deletion.
    fn topic_generation(&self, topic: &TopicName) -> Result<u64, StoreError>;

    /// Removes every offset of a deleted topic and starts its next generation, as one atomic
    /// step serialized with writes: a write made for the deleted topic can never land on a new
    /// topic of the same name. After `topic_log_deleted` the generation has started already:
    /// this finishes that removal and clears its mark. Returns how many offsets there were.
    fn remove_topic(&self, topic: &TopicName) -> Result<usize, StoreError>;

    /// The first step of `DELETE /topics/{topic}`, before the log is deleted: marks its removal
    /// pending, durably, so that a removal cut short (a store error, a crash) is finished by a
    /// retried DELETE or at start, and the old offsets never apply to a topic created again
    /// under the name. The generation stays: the log may still refuse the deletion, and an ack
    /// queued for the topic must then land.
    fn begin_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError>;

    /// The second step: the log is deleted. Starts the topic's next generation (every write made
    /// for the old log is dropped from here); the removal is finished whatever the log holds
    /// under the name later (a topic created again is another topic).
    fn topic_log_deleted(&self, topic: &TopicName) -> Result<(), StoreError>;

    /// The log refused the deletion (the topic stays): its removal is no longer pending, and
    /// nothing else changed.
    fn cancel_topic_removal(&self, topic: &TopicName) -> Result<(), StoreError>;

    /// Topics whose removal began and has not finished, with how far it got.
    fn pending_topic_removals(&self) -> Vec<(TopicName, TopicRemoval)>;

    /// Sets `updated_at` of existing records to `now` without changing their offsets (a client
    /// that leaves counts as seen then). Serialized with CAS-max writes. Returns how many existed.
    /// Never an fsync of its own: durable with the next `make_durable`, which a caller waits for
    /// on the offset writer (`OffsetWriter::make_written_durable`). A storm of subscribes or of
    /// sessions ending then shares the writer's fsyncs instead of making one each, one after
    /// another under the store's write lock.
    fn touch(&self, keys: &[OffsetKey], now: u64) -> Result<usize, StoreError>;

    /// Removes the given records; returns how many existed.
    fn remove(&self, keys: &[OffsetKey]) -> Result<usize, StoreError>;

    /// Removes each record whose `updated_at` is still the one given (read again under the write
    /// lock, serialized with writes and touches): the retention sweep's removal, which must not
    /// take a record that a client touched or wrote after the sweep read it. Returns how many
    /// went.
    fn remove_unchanged(&self, records: &[(OffsetKey, u64)]) -> Result<usize, StoreError>;

    fn record_dead_letter(&self, dead: &DeadLetter) -> Result<(), StoreError>;

    /// One page of dead letters; a topic or client filter is a prefix scan.
    fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterPage, StoreError>;

    /// Removes every dead letter of a (deleted) topic; returns how many there were.
    fn remove_dead_letters(&self, topic: &TopicName) -> Result<usize, StoreError>;

    /// Removes the dead letters recorded before `at_ms` (their retention); returns how many.
    fn remove_dead_letters_before(&self, at_ms: u64) -> Result<usize, StoreError>;

    /// Removes these dead letters with their redrive marks (`POST /admin/dead-letters/delete`);
    /// returns how many there were.
    fn remove_dead_letter_ids(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError>;

    /// Marks dead letters to be delivered again to their client (`POST /admin/dead-letters/redrive`):
    /// the mark stays until the redelivery is acknowledged (the dead letter goes) or given up
    /// on again (`settle_redrive`), so a client offline now gets them at its next subscribe, also
    /// after a restart. Ids without a dead letter are skipped. Returns how many are marked.
    fn mark_redrive(&self, ids: &[DeadLetterId]) -> Result<usize, StoreError>;

    /// Up to `limit` dead letters of `client_id` on `topic` marked for redrive, in partition and
    /// offset order, after `after`.
    fn redrives(&self, topic: &TopicName, client_id: &ClientId, after: Option<&DeadLetterId>, limit: usize) -> Result<Vec<DeadLetter>, StoreError>;

    /// A redriven dead letter is done with: acknowledged (`again` is `None`: the dead letter
    /// goes), or given up on again (it is replaced by `again`, unmarked). One atomic write, and
    /// none when it is no longer marked (settled already by another session, or removed with its
    /// dead letter): an acknowledged dead letter never comes back.
    fn settle_redrive(&self, id: &DeadLetterId, again: Option<&DeadLetter>) -> Result<(), StoreError>;

    /// How many dead letters are marked for redrive: a subscribe looks for its own only when
    /// some are.
    fn redrives_pending(&self) -> usize;

    /// Keeps a gap reported to a client for the admin view (one per partition and `from`).
    fn record_gap(&self, gap: &Gap) -> Result<(), StoreError>;

    /// One page of gaps, filtered like dead letters (`DeadLetterQuery`).
    fn gaps(&self, query: &DeadLetterQuery) -> Result<GapPage, StoreError>;

    /// Removes the gaps recorded before `at_ms` (kept as long as dead letters) or, with `topic`,
    /// every gap of that (deleted) topic; returns how many.
    fn remove_gaps(&self, topic: Option<&TopicName>, before_ms: u64) -> Result<usize, StoreError>;

    /// What a publish with `key` on `topic` answered (idempotent publish), expired or not.
    fn remembered_publish(&self, topic: &TopicName, key: &IdempotencyKey) -> Result<Option<RememberedPublish>, StoreError>;

    /// Remembers what a publish with `key` on `topic` answered, replacing an expired answer.
    fn remember_publish(&self, topic: &TopicName, key: &IdempotencyKey, publish: &RememberedPublish) -> Result<(), StoreError>;

    /// How many publishes are remembered now (expired ones until they are removed).
    fn remembered_publishes(&self) -> usize;

    /// Forgets the publishes whose window ended at or before `now`; returns how many.
    fn forget_publishes_expired_at(&self, now: u64) -> Result<usize, StoreError>;

    /// Makes every write so far durable (called at shutdown).
    fn flush(&self) -> Result<(), StoreError>;

    /// Why the store takes no more writes (a write failed with an I/O error: a full disk, a
    /// failing device), once that happened; the gateway then stops (`Gateway::run`).
    fn write_failure(&self) -> Option<String> {
        None
    }

    /// Makes every offset batch written so far survive a power loss, when the store was opened
    /// for that (`storage.durability = "power"`: one fsync); a no-op otherwise. The offset writer
    /// calls it before an `ack_ok` or a broker ACK of what it wrote.
    fn make_durable(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Reclaims the space of removed records, so later scans do not wade through them (after a
    /// large retention sweep). A no-op where there is nothing to reclaim.
    fn compact(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// The single-write form of `write_offsets`.
    fn write_offset(&self, write: OffsetWrite) -> Result<WriteOutcome, StoreError> {
        Ok(self.write_offsets(std::slice::from_ref(&write))?[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_old_records_get_unknown_time() {
        let record = OffsetRecord { committed: 10, last_acked: Some(9), updated_at: 1_700_000_000_000, epoch: 3 };
        assert_eq!(OffsetRecord::decode(&record.encode()), Some(record));
        let none = OffsetRecord { committed: 0, last_acked: None, updated_at: 5, epoch: u64::MAX };
        assert_eq!(OffsetRecord::decode(&none.encode()), Some(none));
        // A shorter record (no timestamp field) keeps its offset and an unknown time.
        let short = OffsetRecord::decode(&record.encode()[..17]).unwrap();
        assert_eq!((short.committed, short.updated_at, short.epoch), (10, UNKNOWN_TIME, 0));
        // A record written before epochs existed (25 bytes) is in epoch 0.
        let before_epochs = OffsetRecord::decode(&record.encode()[..25]).unwrap();
        assert_eq!(before_epochs, OffsetRecord { epoch: 0, ..record });
        assert_eq!(OffsetRecord::decode(&[9, 0, 0]), None);
    }

    #[test]
    fn a_lowering_starts_an_epoch_that_fences_older_writes() {
        let key = OffsetKey::new(TopicName::parse("t").unwrap(), ClientId::parse("c").unwrap(), 0);
        let write = |committed, epoch| OffsetWrite { key: key.clone(), committed, last_acked: Some(committed - 1), updated_at: 9, generation: 0, epoch };
        let record = OffsetRecord { committed: 20, last_acked: Some(19), updated_at: 1, epoch: 0 };
        let reset = OffsetRecord::lowered(Some(&record), 5, 0, 2);
        assert_eq!(reset, OffsetRecord { committed: 5, last_acked: None, updated_at: 2, epoch: 1 });
        assert!(!reset.is_advanced_by(&write(21, 0)), "a write queued before the reset must not lift it back");
        assert!(reset.is_advanced_by(&write(6, 1)));
        assert_eq!(reset.advanced_by(&write(6, 1)).epoch, 1);
        assert_eq!(OffsetRecord::lowered(None, 3, 0, 2).epoch, 1, "a reset of a client without a record fences its old tokens too");
        let last = OffsetRecord { epoch: u64::MAX, ..record };
        assert_eq!(OffsetRecord::lowered(Some(&last), 3, 0, 2).epoch, u64::MAX, "saturates, never wraps to 0");
        // A lowering into a later log epoch starts at its first offset epoch, above every reset
        // of the older one, and a write of the older log epoch is fenced.
        let log = LogEpoch { epoch: 1, log_end: 5 };
        let reset_often = OffsetRecord { epoch: 7, ..record };
        let moved = OffsetRecord::lowered(Some(&reset_often), 5, log.first_offset_epoch(), 2);
        assert_eq!((moved.epoch, LogEpoch::of(moved.epoch)), (1 << 32, 1));
        assert!(!moved.is_advanced_by(&write(30, 7)));
        assert_eq!(OffsetRecord::lowered(Some(&moved), 3, 0, 2).epoch, (1 << 32) + 1, "a reset within it steps the low half");
    }
}
