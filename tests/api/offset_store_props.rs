//! Property: any sequence of CAS-max writes leaves each key at the running maximum, in both
//! stores (RocksDB in a temp dir, and memory), including across a reopen of the RocksDB store.

use std::collections::HashMap;

use ackgate::core::names::{ClientId, OffsetKey, TopicName};
use ackgate::core::offsets::{OffsetStore, OffsetWrite, WriteOutcome};
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
        let writes: Vec<OffsetWrite> =
            batch.iter().map(|(k, c)| OffsetWrite { key: key(*k), committed: *c, last_acked: c.checked_sub(1), updated_at: 1 }).collect();
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
        let writes: Vec<OffsetWrite> = (0..9).map(|k| OffsetWrite { key: key(k), committed: 5, last_acked: Some(4), updated_at: 1 }).collect();
        store.write_offsets(&writes).unwrap();
        let scan = |topic: Option<&str>, client: Option<&str>| -> Vec<String> {
            let filter = OffsetFilter {
                topic: topic.map(|t| TopicName::parse(t).unwrap()),
                client_id: client.map(|c| ClientId::parse(c).unwrap()),
                partition: None,
            };
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
