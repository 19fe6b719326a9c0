//! The embedded log against a real RocksDB in a temp dir.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::core::clock::ManualClock;

const DAY_MS: u64 = 86_400_000;

fn settings() -> EmbeddedLogSettings {
    EmbeddedLogSettings {
        default_partitions: 2,
        retention_ms: 0,
        retention_bytes_per_partition: 0,
        durable: false,
        group_commit_max_wait: std::time::Duration::ZERO,
        max_topics: 10_000,
        memtable_bytes: 1 << 20,
        block_cache_bytes: 1 << 20,
    }
}

fn event(partition: Option<u32>, key: Option<&str>, n: u32) -> NewEvent {
    NewEvent { key: key.map(String::from), partition, headers: vec![], payload: n.to_string().into_bytes(), payload_is_json: true }
}

fn topic(name: &str) -> TopicName {
    TopicName::parse(name).unwrap()
}

fn tp(name: &str, partition: u32) -> TopicPartition {
    TopicPartition::new(topic(name), partition)
}

async fn offsets_of(log: &EmbeddedLog, tp: &TopicPartition, from: ReadFrom) -> Vec<u64> {
    log.poll(tp, from, 1000, Duration::ZERO).await.unwrap().iter().map(|e| e.offset).collect()
}

#[tokio::test]
async fn offsets_are_contiguous_batches_atomic_and_keys_sticky() {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(1))).unwrap();
    let t = topic("t");
    let assigned = log.publish(&t, (0..5).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    assert_eq!(assigned, (0..5).map(|o| (0, o)).collect::<Vec<_>>());
    // One bad partition refuses the whole batch.
    let bad = log.publish(&t, vec![event(Some(1), None, 9), event(Some(7), None, 9)]).await;
    assert!(matches!(bad, Err(BackendError::UnknownPartition(_))));
    assert_eq!(log.log_bounds(&tp("t", 1)).await.unwrap(), PartitionBounds { log_start: 0, log_end: 0 });
    let keyed = log.publish(&t, (0..6).map(|n| event(None, Some("same"), n)).collect()).await.unwrap();
    assert!(keyed.windows(2).all(|w| w[0].0 == w[1].0), "one key, one partition: {keyed:?}");
    assert!(!log.create_topic(&t, 2).await.unwrap(), "same partition count: already there");
    assert!(matches!(log.create_topic(&t, 3).await, Err(BackendError::Conflict(_))));
    let events = log.poll(&tp("t", 0), ReadFrom::Offset(2), 2, Duration::ZERO).await.unwrap();
    assert_eq!((events[0].offset, events[0].payload.as_slice(), events.len()), (2, b"2".as_slice(), 2));
}

#[tokio::test]
async fn reopening_recovers_topics_ends_and_the_pull_cursor() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(1))).unwrap();
        log.publish(&topic("t"), (0..4).map(|n| event(Some(1), None, n)).collect()).await.unwrap();
        assert_eq!(offsets_of(&log, &tp("t", 1), ReadFrom::PullCursor).await, vec![0, 1, 2, 3]);
        assert_eq!(log.pull_offset(&tp("t", 1)), Some(4));
        log.seek(&tp("t", 1), 2);
        log.checkpoint().unwrap();
    }
    let log = EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(1))).unwrap();
    assert_eq!(log.topics().await.unwrap(), vec![(topic("t"), 2)]);
    assert_eq!(log.pull_offset(&tp("t", 1)), Some(2));
    assert_eq!(offsets_of(&log, &tp("t", 1), ReadFrom::PullCursor).await, vec![2, 3]);
    let next = log.publish(&topic("t"), vec![event(Some(1), None, 4)]).await.unwrap();
    assert_eq!(next, vec![(1, 4)]);
}

#[tokio::test]
async fn a_long_poll_wakes_on_publish() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(1))).unwrap());
    log.create_topic(&topic("t"), 1).await.unwrap();
    let waiter = {
        let log = log.clone();
        tokio::spawn(async move { log.poll(&tp("t", 0), ReadFrom::PullCursor, 10, Duration::from_secs(30)).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    log.publish(&topic("t"), vec![event(None, None, 1)]).await.unwrap();
    let events = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert_eq!(events.len(), 1);
}

#[tokio::test]
async fn retention_by_age_deletes_old_events_and_offsets_keep_counting() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(10 * DAY_MS));
    let mut settings = settings();
    settings.retention_ms = DAY_MS;
    {
        let log = EmbeddedLog::open(dir.path(), settings.clone(), clock.clone()).unwrap();
        log.publish(&topic("t"), (0..3).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
        clock.advance(DAY_MS / 2);
        log.publish(&topic("t"), (3..5).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
        clock.advance(DAY_MS / 2 + 1);
        assert_eq!(log.enforce_retention().unwrap(), 3);
        assert_eq!(log.log_bounds(&tp("t", 0)).await.unwrap(), PartitionBounds { log_start: 3, log_end: 5 });
        assert_eq!(offsets_of(&log, &tp("t", 0), ReadFrom::Offset(0)).await, vec![3, 4], "reads below log_start begin at it");
        clock.advance(DAY_MS);
        assert_eq!(log.enforce_retention().unwrap(), 2);
    }
    // Everything went; a reopen must not restart offsets at 0.
    let log = EmbeddedLog::open(dir.path(), settings, clock).unwrap();
    assert_eq!(log.log_bounds(&tp("t", 0)).await.unwrap(), PartitionBounds { log_start: 5, log_end: 5 });
    assert_eq!(log.publish(&topic("t"), vec![event(Some(0), None, 5)]).await.unwrap(), vec![(0, 5)]);
}

#[tokio::test]
async fn retention_by_size_keeps_the_newest_events_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings();
    let clock = Arc::new(ManualClock::new(1));
    let one = StoredEvent::encode(&event(Some(0), None, 1), 1, 0).len() as u64;
    settings.retention_bytes_per_partition = 3 * one;
    let log = EmbeddedLog::open(dir.path(), settings.clone(), clock.clone()).unwrap();
    log.publish(&topic("t"), (0..8).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    assert_eq!(log.enforce_retention().unwrap(), 5);
    assert_eq!(offsets_of(&log, &tp("t", 0), ReadFrom::Offset(0)).await, vec![5, 6, 7]);
    assert_eq!(log.enforce_retention().unwrap(), 0, "within the limit nothing more goes");
    drop(log);
    let log = EmbeddedLog::open(dir.path(), settings, clock).unwrap();
    assert_eq!(log.log_bounds(&tp("t", 0)).await.unwrap(), PartitionBounds { log_start: 5, log_end: 8 });
    assert_eq!(log.enforce_retention().unwrap(), 0, "sizes are recovered at open");
}

#[tokio::test]
async fn deleting_a_topic_removes_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(1))).unwrap();
    log.publish(&topic("gone"), (0..3).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    log.publish(&topic("gone2"), vec![event(Some(0), None, 0)]).await.unwrap();
    assert!(log.delete_topic(&topic("gone")).await.unwrap());
    assert!(!log.delete_topic(&topic("gone")).await.unwrap());
    assert!(matches!(log.log_bounds(&tp("gone", 0)).await, Err(BackendError::UnknownTopic(_))));
    assert_eq!(offsets_of(&log, &tp("gone2", 0), ReadFrom::Offset(0)).await, vec![0], "a topic whose name extends it is untouched");
    log.create_topic(&topic("gone"), 1).await.unwrap();
    assert_eq!(log.log_bounds(&tp("gone", 0)).await.unwrap(), PartitionBounds { log_start: 0, log_end: 0 });
}

/// Issue 40, review finding 4: a publisher that may not create topics had its existence
/// checked before the write, and a `DELETE /topics` in between let the write create the topic
/// anew. `publish_existing` checks under the append lock that deletion also takes.
#[tokio::test]
async fn a_publish_that_may_not_create_never_brings_a_deleted_topic_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(1))).unwrap();
    let t = topic("kept-out");
    assert!(matches!(log.publish_existing(&t, vec![event(Some(0), None, 0)]).await, Err(BackendError::UnknownTopic(_))));
    assert_eq!(log.partitions(&t).await.unwrap(), None, "refused, and not created");
    log.create_topic(&t, 1).await.unwrap();
    assert_eq!(log.publish_existing(&t, vec![event(Some(0), None, 0)]).await.unwrap(), vec![(0, 0)]);
    assert!(log.delete_topic(&t).await.unwrap());
    assert!(matches!(log.publish_existing(&t, vec![event(Some(0), None, 1)]).await, Err(BackendError::UnknownTopic(_))));
    assert_eq!(log.partitions(&t).await.unwrap(), None);
    assert_eq!(log.publish(&t, vec![event(Some(0), None, 2)]).await.unwrap(), vec![(0, 0)], "auto-create still creates");
}

/// The log's RocksDB memory is bounded by `embedded.memtable_bytes` and `block_cache_bytes`: 8 MiB
/// of published events leave at most two memtables' worth in memory (RocksDB's default memtable,
/// 64 MiB, held them all: this failed before the bound), and every event still reads back, from
/// the flushed files, after a reopen too.
#[tokio::test]
async fn the_memtables_and_block_cache_stay_within_their_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let bounded = EmbeddedLogSettings { default_partitions: 1, memtable_bytes: 1 << 20, block_cache_bytes: 1 << 20, ..settings() };
    let big = |n: u32| NewEvent { payload: format!("\"{n:01000}\"").into_bytes(), ..event(Some(0), None, n) };
    let t = topic("t");
    {
        let log = EmbeddedLog::open(dir.path(), bounded.clone(), Arc::new(ManualClock::new(1))).unwrap();
        for batch in 0..16u32 {
            log.publish(&t, (batch * 500..(batch + 1) * 500).map(big).collect()).await.unwrap();
        }
        let cf = log.cf(CF_EVENTS).unwrap();
        let in_memtables = log.db.property_int_value_cf(&cf, "rocksdb.size-all-mem-tables").unwrap().unwrap();
        assert!(in_memtables <= 3 << 20, "{in_memtables} bytes of 8 MiB published stay in memtables");
        assert_eq!(log.db.property_int_value_cf(&cf, "rocksdb.block-cache-capacity").unwrap(), Some(1 << 20));
    }
    let log = EmbeddedLog::open(dir.path(), bounded, Arc::new(ManualClock::new(1))).unwrap();
    let mut next = 0u64;
    while next < 8_000 {
        let events = log.poll(&tp("t", 0), ReadFrom::Offset(next), 1_000, Duration::ZERO).await.unwrap();
        for e in &events {
            assert_eq!((e.offset, e.payload.as_slice()), (next, big(next as u32).payload.as_slice()));
            next += 1;
        }
        assert!(!events.is_empty(), "offset {next} is missing");
    }
}

/// Overwrites the stored event at `offset` with bytes that do not decode.
fn flip_bits(log: &EmbeddedLog, tp: &TopicPartition, offset: u64) {
    let cf = log.cf(CF_EVENTS).unwrap();
    log.db.put_cf(&cf, event_key(&tp.topic, tp.partition, offset), [0xffu8]).unwrap();
}

/// Issue 20, item 7: events that no longer decode never fail retention. One at the head goes
/// only with the event after it (its age is unknown), so with retention off, or a newer event
/// after it, it stays. Failed before the fix: `enforce_retention` answered "corrupt event".
#[tokio::test]
async fn retention_goes_past_events_that_do_not_decode() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(10 * DAY_MS));
    let mut settings = settings();
    settings.retention_ms = DAY_MS;
    let log = EmbeddedLog::open(dir.path(), settings.clone(), clock.clone()).unwrap();
    log.publish(&topic("t"), (0..3).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    clock.advance(DAY_MS + 1);
    log.publish(&topic("t"), (3..5).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    flip_bits(&log, &tp("t", 0), 0);
    flip_bits(&log, &tp("t", 0), 3);
    // 0 goes with 1 and 2 (old); 3 stays with 4 (new).
    assert_eq!(log.enforce_retention().unwrap(), 3);
    assert_eq!(log.log_bounds(&tp("t", 0)).await.unwrap(), PartitionBounds { log_start: 3, log_end: 5 });
    assert_eq!(log.enforce_retention().unwrap(), 0);
    drop(log);
    // Reopened with its first event undecodable: the bounds come back, and so do the sizes.
    let log = EmbeddedLog::open(dir.path(), settings, clock).unwrap();
    assert_eq!(log.log_bounds(&tp("t", 0)).await.unwrap(), PartitionBounds { log_start: 3, log_end: 5 });
    let read = log.poll(&tp("t", 0), ReadFrom::Offset(0), 10, Duration::ZERO).await.unwrap();
    assert_eq!(read.iter().map(|e| (e.offset, e.undecodable)).collect::<Vec<_>>(), vec![(3, true), (4, false)]);
    assert_eq!(log.publish(&topic("t"), vec![event(Some(0), None, 5)]).await.unwrap(), vec![(0, 5)]);
}

/// Issue 21, item 9: a durable publish (an fsync per batch) waits on the blocking
/// pool, never on a runtime thread: with the append lock held elsewhere (another publish's
/// fsync, retention), the runtime's only thread goes on serving other tasks. Failed before the
/// fix: the publish took the lock on the runtime thread, so nothing else ran until it was free.
#[tokio::test(flavor = "current_thread")]
async fn a_synced_publish_waits_off_the_runtime_thread() {
    let dir = tempfile::tempdir().unwrap();
    let synced = EmbeddedLogSettings { durable: true, ..settings() };
    let log = Arc::new(EmbeddedLog::open(dir.path(), synced, Arc::new(ManualClock::new(1))).unwrap());
    log.create_topic(&topic("t"), 1).await.unwrap();
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let holder = {
        let (state, released) = (log.state.clone(), released.clone());
        std::thread::spawn(move || {
            let _held = state.append_lock.lock().unwrap();
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(2));
            released.store(true, Ordering::SeqCst);
        })
    };
    locked.recv().unwrap();
    let publishing = {
        let log = log.clone();
        tokio::spawn(async move { log.publish(&topic("t"), vec![event(Some(0), None, 1)]).await })
    };
    // The publish runs first and waits for the lock; this task must get the thread back meanwhile.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!released.load(Ordering::SeqCst), "the publish held the runtime thread until the append lock was free");
    assert_eq!(publishing.await.unwrap().unwrap(), vec![(0, 0)]);
    holder.join().unwrap();
}

/// Issue 25, replay by time: the first offset stamped at or after a time, by binary search over
/// timestamps that never go down (a clock set back stamps the newest time again); an event that
/// no longer decodes, of unknown time, is not skipped when the next one is at or after the time;
/// past the newest event the answer is the log end.
#[tokio::test]
async fn an_offset_is_found_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(100));
    let log = EmbeddedLog::open(dir.path(), settings(), clock.clone()).unwrap();
    let t = topic("t");
    log.publish(&t, (0..3).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    clock.advance(100);
    log.publish(&t, (3..6).map(|n| event(Some(0), None, n)).collect()).await.unwrap();
    let tp = tp("t", 0);
    for (time, expected) in [(0, 0), (100, 0), (101, 3), (200, 3), (201, 6), (u64::MAX, 6)] {
        assert_eq!(log.offset_for_time(&tp, time).await.unwrap(), expected, "time {time}");
    }
    flip_bits(&log, &tp, 3);
    assert_eq!(log.offset_for_time(&tp, 150).await.unwrap(), 3, "offset 3 no longer decodes: its time is unknown, so it is not skipped");
    assert_eq!(log.offset_for_time(&tp, 201).await.unwrap(), 6);
    let polled = log.poll(&tp, ReadFrom::Offset(5), 1, Duration::ZERO).await.unwrap();
    assert_eq!(polled[0].timestamp, 200);
}

/// Timestamps never go down along the log, even when the clock does.
#[tokio::test]
async fn a_clock_set_back_never_stamps_an_event_earlier() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1000));
    let log = EmbeddedLog::open(dir.path(), settings(), clock.clone()).unwrap();
    log.publish(&topic("t"), vec![event(Some(0), None, 0)]).await.unwrap();
    drop(log);
    // Reopened with a clock an hour behind: the recovered newest stamp still holds.
    let log = EmbeddedLog::open(dir.path(), settings(), Arc::new(ManualClock::new(10))).unwrap();
    log.publish(&topic("t"), vec![event(Some(0), None, 1)]).await.unwrap();
    let events = log.poll(&tp("t", 0), ReadFrom::Offset(0), 10, Duration::ZERO).await.unwrap();
    assert_eq!(events.iter().map(|e| e.timestamp).collect::<Vec<_>>(), vec![1000, 1000]);
}
