//! Property: any sequence of CAS-max writes leaves each key at the running maximum, in both
//! stores (RocksDB in a temp dir, and memory), including across a reopen of the RocksDB store.

use std::collections::HashMap;

use ackgate::core::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use ackgate::core::offsets::{LogEpoch, OffsetStore, OffsetWrite, TopicIncarnation, WriteOutcome};
use ackgate::store::memory::MemoryOffsetStore;
use ackgate::store::rocks::RocksOffsetStore;
use proptest::prelude::*;

fn key(k: u8) -> OffsetKey {
    // Names chosen so that unprefixed concatenation would collide ("ab"+"c" vs "a"+"bc").
    let (topic, client) = match k % 3 {
        0 => ("ab", "c"),
        1 => ("a", "bc"),
        _ => ("a", "b"),
    };
    OffsetKey::new(TopicName::parse(topic).unwrap(), ClientId::parse(client).unwrap(), u32::from(k / 3))
}

/// Applies `batches` of writes and checks every outcome and every stored value against a model.
fn check_running_max(store: &dyn OffsetStore, batches: &[Vec<(u8, u64)>], model: &mut HashMap<OffsetKey, u64>) {
    for batch in batches {
        let writes: Vec<OffsetWrite> = batch
            .iter()
            .map(|(k, c)| OffsetWrite { key: key(*k), committed: *c, last_acked: c.checked_sub(1), updated_at: 1, generation: 0, epoch: 0 })
            .collect();
        let outcomes = store.write_offsets(&writes).unwrap();
        for (write, outcome) in writes.iter().zip(outcomes) {
            let current = model.get(&write.key).copied();
            // last_acked = committed - 1 here, so a record advances exactly when committed does.
            let expected = if current.is_none_or(|c| write.committed > c) { WriteOutcome::Advanced } else { WriteOutcome::Stale };
            assert_eq!(outcome, expected, "{write:?} over {current:?}");
            model.insert(write.key.clone(), current.map_or(write.committed, |c| c.max(write.committed)));
        }
        for (k, max) in model.iter() {
            assert_eq!(store.read(k).unwrap().unwrap().committed, *max, "{k}");
        }
    }
}

fn batches() -> impl Strategy<Value = Vec<Vec<(u8, u64)>>> {
    prop::collection::vec(prop::collection::vec((0u8..9, 0u64..50), 1..6), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_keeps_the_running_maximum(batches in batches()) {
        check_running_max(&MemoryOffsetStore::new(), &batches, &mut HashMap::new());
    }

    #[test]
    fn rocksdb_store_keeps_the_running_maximum_across_reopen(batches in batches(), replay in batches()) {
        let dir = tempfile::tempdir().unwrap();
        let mut model = HashMap::new();
        {
            let store = RocksOffsetStore::open(dir.path(), false).unwrap();
            check_running_max(&store, &batches, &mut model);
        }
        // After a restart, replayed (older) writes never lower what is stored.
        let store = RocksOffsetStore::open(dir.path(), false).unwrap();
        check_running_max(&store, &replay, &mut model);
    }
}

#[test]
fn prefix_scans_by_topic_by_client_and_both() {
    use ackgate::core::offsets::OffsetFilter;
    let dir = tempfile::tempdir().unwrap();
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    let memory = MemoryOffsetStore::new();
    for store in [&rocks as &dyn OffsetStore, &memory] {
        let writes: Vec<OffsetWrite> =
            (0..9).map(|k| OffsetWrite { key: key(k), committed: 5, last_acked: Some(4), updated_at: 1, generation: 0, epoch: 0 }).collect();
        store.write_offsets(&writes).unwrap();
        let scan = |topic: Option<&str>, client: Option<&str>| -> Vec<String> {
            let filter =
                OffsetFilter { topic: topic.map(|t| TopicName::parse(t).unwrap()), client_id: client.map(|c| ClientId::parse(c).unwrap()), partition: None };
            store.scan(&filter).unwrap().iter().map(|(k, _)| k.to_string()).collect()
        };
        assert_eq!(scan(Some("a"), None).len(), 6, "topic a holds clients bc and b, three partitions each");
        assert_eq!(scan(Some("ab"), None), vec!["ab#c#0", "ab#c#1", "ab#c#2"]);
        assert_eq!(scan(None, Some("b")), vec!["a#b#0", "a#b#1", "a#b#2"]);
        assert_eq!(scan(Some("a"), Some("bc")), vec!["a#bc#0", "a#bc#1", "a#bc#2"]);
        assert_eq!(scan(None, None).len(), 9);
        // touch refreshes the time only.
        let missing = OffsetKey::new(TopicName::parse("zz").unwrap(), ClientId::parse("zz").unwrap(), 0);
        assert_eq!(store.touch(&[key(1), missing], 99).unwrap(), 1);
        let touched = store.read(&key(1)).unwrap().unwrap();
        assert_eq!((touched.committed, touched.last_acked, touched.updated_at), (5, Some(4), 99));
        assert_eq!(store.remove(&[key(0), key(0)]).unwrap(), 1);
        assert_eq!(scan(Some("ab"), None).len(), 2);
        store.compact().unwrap();
        assert_eq!(scan(None, None).len(), 8, "compaction keeps every live record");
        assert_eq!(store.read(&key(1)).unwrap().unwrap().committed, 5);
    }
}

/// A deleted topic's offsets go with a new generation: a write made for the old topic (still
/// queued when it was deleted) is dropped, in both stores and after a RocksDB reopen; writes
/// for the new generation and for other topics go through.
#[test]
fn writes_for_a_deleted_topic_never_land_on_its_successor() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryOffsetStore::new();
    let write = |k: u8, committed: u64, generation: u64| OffsetWrite { key: key(k), committed, last_acked: None, updated_at: 1, generation, epoch: 0 };
    let topic_ab = TopicName::parse("ab").unwrap();
    {
        let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
        for store in [&rocks as &dyn OffsetStore, &memory] {
            assert_eq!(store.topic_generation(&topic_ab).unwrap(), 0);
            store.write_offsets(&[write(0, 5, 0), write(3, 5, 0), write(1, 5, 0)]).unwrap();
            assert_eq!(store.remove_topic(&topic_ab).unwrap(), 2, "both partitions of ab#c");
            assert_eq!(store.topic_generation(&topic_ab).unwrap(), 1);
            assert_eq!(store.read(&key(0)).unwrap(), None);
            assert_eq!(store.read(&key(1)).unwrap().unwrap().committed, 5, "topic a is untouched");
            let outcomes = store.write_offsets(&[write(0, 500, 0), write(1, 6, 0)]).unwrap();
            assert_eq!(outcomes, vec![WriteOutcome::Obsolete, WriteOutcome::Advanced]);
            assert_eq!(store.read(&key(0)).unwrap(), None, "the old topic's write was dropped");
        }
    }
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    assert_eq!(rocks.topic_generation(&topic_ab).unwrap(), 1, "the generation survives a reopen");
    assert_eq!(rocks.write_offset(write(0, 500, 0)).unwrap(), WriteOutcome::Obsolete);
    assert_eq!(rocks.write_offset(write(0, 2, 1)).unwrap(), WriteOutcome::Advanced);
    assert_eq!(rocks.read(&key(0)).unwrap().unwrap().committed, 2);
}

/// One change to the offsets, as operators, retention and sessions make them.
#[derive(Debug, Clone)]
enum Change {
    Write(Vec<(u8, u64)>),
    Reset(u8, u64),
    Touch(u8),
    Remove(u8),
    /// An operator's deletion (it leaves a fence).
    RemoveFenced(u8),
    /// Retention's removal of a record unchanged since it was read.
    RemoveUnchanged(u8),
    RemoveTopic(u8),
}

fn changes() -> impl Strategy<Value = Vec<Change>> {
    let change = prop_oneof![
        4 => prop::collection::vec((0u8..9, 0u64..50), 1..5).prop_map(Change::Write),
        1 => (0u8..9, 0u64..50).prop_map(|(k, c)| Change::Reset(k, c)),
        1 => (0u8..9).prop_map(Change::Touch),
        1 => (0u8..9).prop_map(Change::Remove),
        1 => (0u8..9).prop_map(Change::RemoveFenced),
        1 => (0u8..9).prop_map(Change::RemoveUnchanged),
        1 => (0u8..9).prop_map(Change::RemoveTopic),
    ];
    prop::collection::vec(change, 1..40)
}

/// Applies one change to a store; what it answered, for comparison with another store.
fn apply(store: &dyn OffsetStore, change: &Change, now: u64) -> String {
    match change {
        Change::Write(batch) => {
            let writes: Vec<OffsetWrite> = batch
                .iter()
                .map(|(k, c)| {
                    let generation = store.topic_generation(&key(*k).topic).unwrap();
                    OffsetWrite { key: key(*k), committed: *c, last_acked: c.checked_sub(1), updated_at: now, generation, epoch: 0 }
                })
                .collect();
            format!("{:?}", store.write_offsets(&writes).unwrap())
        }
        Change::Reset(k, c) => format!("{:?}", store.reset(&key(*k), *c, 0, now).unwrap()),
        Change::Touch(k) => format!("{:?}", store.touch(&[key(*k)], now).unwrap()),
        Change::Remove(k) => format!("{:?}", store.remove(&[key(*k)]).unwrap()),
        Change::RemoveFenced(k) => format!("{:?} {:?}", store.remove_fenced(&[key(*k)]).unwrap(), store.fence(&key(*k)).unwrap()),
        Change::RemoveUnchanged(k) => {
            let seen = store.read(&key(*k)).unwrap().map_or(0, |r| r.updated_at);
            format!("{:?}", store.remove_unchanged(&[(key(*k), seen)]).unwrap())
        }
        Change::RemoveTopic(k) => format!("{:?}", store.remove_topic(&key(*k).topic).unwrap()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The RocksDB store keeps the records it wrote last in memory for its CAS-max compare: any
    /// mix of writes, operator resets, touches, retention removals and topic deletes must leave
    /// it answering exactly as the memory store does, before and after a reopen.
    #[test]
    fn rocksdb_store_answers_as_the_memory_store_through_resets_and_removals(changes in changes(), replay in changes()) {
        let dir = tempfile::tempdir().unwrap();
        let memory = MemoryOffsetStore::new();
        let mut now = 1;
        for (round, changes) in [&changes, &replay].into_iter().enumerate() {
            let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
            for change in changes {
                now += 1;
                let (answer, expected) = (apply(&rocks, change, now), apply(&memory, change, now));
                prop_assert_eq!(&answer, &expected, "round {} {:?}", round, change);
                for k in 0..9 {
                    prop_assert_eq!(rocks.read(&key(k)).unwrap(), memory.read(&key(k)).unwrap(), "round {} key {} after {:?}", round, k, change);
                }
            }
        }
    }
}

/// Issue 39, item 4: a lowering (the admin reset, an offset found above the log end) is not undone
/// by a CAS-max write made before it, whenever that write lands (queued in the offset writer,
/// batched, retried): the write carries the offset epoch its tracker started in, and the reset
/// started the next one. Before epochs the queued write lifted the reset back (5 -> 21). In both
/// stores, and across a reopen of RocksDB.
#[test]
fn a_write_made_before_a_reset_never_lifts_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryOffsetStore::new();
    let write = |committed: u64, epoch| OffsetWrite { key: key(0), committed, last_acked: Some(committed - 1), updated_at: 1, generation: 0, epoch };
    {
        let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
        for store in [&rocks as &dyn OffsetStore, &memory] {
            assert_eq!(store.write_offset(write(20, 0)).unwrap(), WriteOutcome::Advanced);
            let reset = store.reset(&key(0), 5, 0, 2).unwrap();
            assert_eq!((reset.committed, reset.last_acked, reset.epoch), (5, None, 1));
            assert_eq!(store.write_offsets(&[write(21, 0), write(6, 1)]).unwrap(), vec![WriteOutcome::Stale, WriteOutcome::Advanced]);
            assert_eq!(store.read(&key(0)).unwrap().map(|r| (r.committed, r.epoch)), Some((6, 1)));
        }
    }
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    assert_eq!(rocks.write_offset(write(u64::MAX, 0)).unwrap(), WriteOutcome::Stale, "the epoch is durable");
    assert_eq!(rocks.read(&key(0)).unwrap().map(|r| (r.committed, r.epoch)), Some((6, 1)));
    let again = rocks.reset(&key(0), 0, 0, 3).unwrap();
    assert_eq!((again.committed, again.epoch), (0, 2), "each reset is an epoch of its own");
}

/// A topic deletion the log refused leaves the topic as it was (review of issue 39, item 5): the
/// pending mark is cleared and no generation starts, so an ack still queued for the topic (a
/// session that had just unsubscribed) lands. Before, `begin_topic_removal` started the next
/// generation at once and the refused deletion dropped that ack as obsolete. A deletion that went
/// through starts exactly one generation, whichever step finishes it, and that survives a reopen.
#[test]
fn a_refused_topic_deletion_drops_no_queued_write() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryOffsetStore::new();
    let topic = key(0).topic;
    let write = |committed: u64, generation| OffsetWrite { key: key(0), committed, last_acked: None, updated_at: 1, generation, epoch: 0 };
    {
        let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
        for store in [&rocks as &dyn OffsetStore, &memory] {
            store.begin_topic_removal(&topic).unwrap();
            store.cancel_topic_removal(&topic).unwrap();
            assert_eq!(store.topic_generation(&topic).unwrap(), 0, "the log refused: the topic is the same topic");
            assert_eq!(store.write_offset(write(4, 0)).unwrap(), WriteOutcome::Advanced, "the queued ack lands");
            // Deleted for real, in the three steps, then a crash-free finish: one generation.
            store.begin_topic_removal(&topic).unwrap();
            store.topic_log_deleted(&topic).unwrap();
            assert_eq!(store.topic_generation(&topic).unwrap(), 1, "writes for the deleted log are dropped from here");
            assert_eq!(store.write_offset(write(9, 0)).unwrap(), WriteOutcome::Obsolete);
            assert_eq!(store.remove_topic(&topic).unwrap(), 1);
            assert_eq!(store.topic_generation(&topic).unwrap(), 1, "one deletion, one generation");
            // A crash after the log's deletion but before it was recorded: the start's
            // `remove_topic` of a removal still `Begun` starts the generation.
            store.begin_topic_removal(&topic).unwrap();
            assert_eq!(store.topic_generation(&topic).unwrap(), 1);
            store.remove_topic(&topic).unwrap();
            assert_eq!(store.topic_generation(&topic).unwrap(), 2);
            assert!(store.pending_topic_removals().is_empty());
        }
    }
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    assert_eq!(rocks.topic_generation(&topic).unwrap(), 2);
    assert!(rocks.pending_topic_removals().is_empty());
}

/// A partition's log epoch (issue 39, item 3): stepped once per lost tail however many sessions
/// or instances report it (each names the epoch it was in), durable across a reopen, and gone
/// with its topic, in both stores.
#[test]
fn a_log_epoch_steps_once_per_loss_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryOffsetStore::new();
    let tp = |p| TopicPartition::new(TopicName::parse("ab").unwrap(), p);
    {
        let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
        for store in [&rocks as &dyn OffsetStore, &memory] {
            assert_eq!(store.log_epoch(&tp(0)).unwrap(), LogEpoch::default());
            assert_eq!(store.step_log_epoch(&tp(0), 0, 4).unwrap(), LogEpoch { epoch: 1, log_end: 4 });
            assert_eq!(store.step_log_epoch(&tp(0), 0, 4).unwrap(), LogEpoch { epoch: 1, log_end: 4 }, "the same loss, reported again");
            assert_eq!(store.step_log_epoch(&tp(0), 1, 2).unwrap(), LogEpoch { epoch: 2, log_end: 2 }, "a later loss");
            assert_eq!(store.step_log_epoch(&tp(1), 0, u64::MAX).unwrap(), LogEpoch { epoch: 1, log_end: u64::MAX });
            assert_eq!(store.log_epoch(&tp(2)).unwrap(), LogEpoch::default(), "partitions apart");
        }
    }
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    assert_eq!(rocks.log_epoch(&tp(0)).unwrap(), LogEpoch { epoch: 2, log_end: 2 });
    assert_eq!(rocks.log_epoch(&tp(1)).unwrap(), LogEpoch { epoch: 1, log_end: u64::MAX });
    let mut ids = Vec::new();
    for store in [&rocks as &dyn OffsetStore, &memory] {
        assert_eq!(store.topic_incarnation(&tp(0).topic).unwrap(), TopicIncarnation::default(), "never deleted: the first incarnation");
        store.remove_topic(&tp(0).topic).unwrap();
        // A topic created again is a new incarnation whose every partition's log epoch is above
        // all the old topic had (issue 55: nothing made under it outranks the new one).
        let incarnation = store.topic_incarnation(&tp(0).topic).unwrap();
        assert_eq!(incarnation.epoch_floor, 3, "one above the old topic's highest log epoch (2)");
        assert_ne!(incarnation.id, 0);
        ids.push(incarnation.id);
        for p in [0, 1, 7] {
            assert_eq!(store.log_epoch(&tp(p)).unwrap(), LogEpoch { epoch: 3, log_end: 0 }, "partition {p}");
        }
        assert_eq!(store.step_log_epoch(&tp(0), 3, 9).unwrap(), LogEpoch { epoch: 4, log_end: 9 }, "a loss in the new topic steps from its floor");
        assert_eq!(store.step_log_epoch(&tp(1), 0, 9).unwrap(), LogEpoch { epoch: 3, log_end: 0 }, "a reader of the old topic's epoch steps nothing");
    }
    drop(rocks);
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    assert_eq!(rocks.log_epoch(&tp(1)).unwrap(), LogEpoch { epoch: 3, log_end: 0 }, "the floor survives a reopen");
    assert_eq!(rocks.log_epoch(&tp(0)).unwrap(), LogEpoch { epoch: 4, log_end: 9 });
    assert_eq!(rocks.topic_incarnation(&tp(0).topic).unwrap().id, ids[0]);
    rocks.remove_topic(&tp(0).topic).unwrap();
    let next = rocks.topic_incarnation(&tp(0).topic).unwrap();
    assert_eq!(next.epoch_floor, 5);
    assert_ne!(next.id, ids[0], "each deletion a new id");
}

/// An operator's deletion of a record leaves a fence (issue 55, item 4): a write made before it
/// never brings the old offset back, a reset after it steps above it, and it outlives a reopen.
#[test]
fn a_deleted_record_leaves_a_fence_that_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryOffsetStore::new();
    let k = key(0);
    let write = |committed, epoch| OffsetWrite { key: k.clone(), committed, last_acked: None, updated_at: 1, generation: 0, epoch };
    {
        let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
        for store in [&rocks as &dyn OffsetStore, &memory] {
            assert_eq!(store.fence(&k).unwrap(), None);
            store.write_offsets(&[write(20, 0)]).unwrap();
            assert_eq!(store.reset(&k, 5, 0, 2).unwrap().epoch, 1);
            assert_eq!(store.remove_fenced(&[k.clone(), key(3)]).unwrap(), 1, "only the key that had a record counts");
            assert_eq!(store.read(&k).unwrap(), None);
            assert_eq!(store.fence(&k).unwrap(), Some(2), "one above the deleted record's epoch");
            assert_eq!(store.fence(&key(3)).unwrap(), None, "no record, no fence");
            assert_eq!(store.write_offsets(&[write(20, 1)]).unwrap(), vec![WriteOutcome::Stale], "a write of before the deletion");
            assert_eq!(store.read(&k).unwrap(), None);
        }
    }
    let rocks = RocksOffsetStore::open(dir.path(), false).unwrap();
    assert_eq!(rocks.fence(&k).unwrap(), Some(2), "durable");
    for store in [&rocks as &dyn OffsetStore, &memory] {
        assert_eq!(store.reset(&k, 3, 0, 3).unwrap().epoch, 2, "a reset of a deleted record steps from its fence");
        assert_eq!(store.write_offsets(&[write(9, 2)]).unwrap(), vec![WriteOutcome::Advanced]);
        store.remove_topic(&k.topic).unwrap();
        assert_eq!(store.fence(&k).unwrap(), None, "the topic's fences go with it (its incarnation's floor is above them)");
    }
}
