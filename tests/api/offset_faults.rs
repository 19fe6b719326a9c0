//! The offset-path faults of the review (issue 9): nothing acknowledged may be undone, nothing
//! unacknowledged skipped. Each test drives the scenario the review describes against the real
//! gateway (RocksDB in a temp dir, WebSockets on 127.0.0.1), with the store held or failing where
//! the scenario needs a slow or broken disk.

use std::sync::Arc;
use std::time::Duration;

use ackgate::backend::embedded::EmbeddedLog;
use ackgate::core::backend::LogBackend;
use ackgate::core::clock::{Clock, ManualClock, SystemClock};
use ackgate::core::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use ackgate::core::offsets::{OffsetStore, OffsetWrite};
use ackgate::core::reader::Readers;
use ackgate::store::rocks::RocksOffsetStore;
use ackgate::Gateway;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::controlled_store::{ControlledStore, LetGo};
use crate::support::*;

async fn start_with(config: ackgate::config::Config, store: Arc<dyn OffsetStore>) -> InProcess {
    let gateway = Gateway::build_with_store(config, Arc::new(SystemClock), Some(store)).await.expect("gateway builds");
    InProcess::from_gateway(gateway)
}

fn key(topic: &str, client: &str, partition: u32) -> OffsetKey {
    OffsetKey::new(TopicName::parse(topic).unwrap(), ClientId::parse(client).unwrap(), partition)
}

/// Retries `attempt` (an admin call answering 409 while the client still counts as live) until
/// it answers something else; returns that status.
async fn until_not_conflict(mut attempt: impl AsyncFnMut() -> u16) -> u16 {
    for _ in 0..200 {
        let status = attempt().await;
        if status != 409 {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("still 409 after 5 s");
}

/// Client `c` acks all 5 events of topic `t` (one partition) while the store holds every write,
/// then leaves; the held writes are let go 500 ms later.
async fn end_a_session_with_its_acks_held(gw: &InProcess, store: &Arc<ControlledStore>) {
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(5).await;
    store.hold_writes();
    for event in &events {
        client.send(json!({"op": "ack", "delivery_id": id(event)})).await;
    }
    // Answered after the acks: they are queued for the (held) offset writer.
    client.send(json!({"op": "ping", "req": "p"})).await;
    client.recv_type("pong").await;
    client.close().await;
    store.release_writes_after(Duration::from_millis(500));
}

/// Fault 1: the acks of a session that just ended are still queued when an operator resets the
/// client's offset; they must not raise it again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_a_session_ends_is_not_undone_by_its_queued_acks() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    end_a_session_with_its_acks_held(&gw, &store).await;
    let status = until_not_conflict(async || put_offset(&gw.base, "t", "c", 0, json!(0)).await).await;
    assert_eq!(status, 200);
    // Long after the held writes were let go: the operator's row stands.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 0, "a late ack write raised the reset offset");
    let mut again = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(again.subscribe("t", json!({})).await["partitions"][0]["from"], 0);
    assert_eq!(again.recv_type("event").await["offset"], 0, "the reset replays from 0");
    gw.stop().await;
}

/// Fault 1, worst case: a topic deleted while a session's acks are queued, then created again
/// by the next publish. The old topic's offsets must not land on the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_topic_recreated_by_a_publish_starts_clean_for_its_old_clients() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    end_a_session_with_its_acks_held(&gw, &store).await;
    let status = until_not_conflict(async || http().delete(format!("{}/topics/t", gw.base)).send().await.unwrap().status().as_u16()).await;
    assert_eq!(status, 200);
    // The next publish creates the topic again (embedded log auto-create).
    for n in 0..3 {
        publish(&gw.base, "t", json!({"partition": 0, "payload": {"n": n}})).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    if let Some(row) = stored_offset(&gw.base, "t", "c", 0).await {
        assert_eq!(row["committed"], 0, "the old topic's offset landed on the new topic: {row}");
    }
    let mut again = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(again.subscribe("t", json!({})).await["partitions"][0]["from"], 0);
    let offsets: Vec<u64> = again.recv_events(3).await.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![0, 1, 2], "every event of the new topic reaches the old client");
    gw.stop().await;
}

async fn above_log_end_count(base: &str) -> f64 {
    metric(base, "ackgate_offsets_above_log_end_total").await
}

/// Fault 2 at boot: the log lost its tail (a power loss with both stores unsynced), so a stored
/// committed offset is above the log end. It is lowered to the log end at start, and the events
/// published next at the reused offsets reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_offset_above_the_log_end_is_lowered_at_boot() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    consume_and_ack(gw.addr(), "c", "t", 10).await.close().await;
    gw.stop().await;
    {
        let store = RocksOffsetStore::open(&data, false).unwrap();
        let write = OffsetWrite { key: key("t", "c", 0), committed: 1000, last_acked: Some(999), updated_at: SystemClock.now_ms(), generation: 0, epoch: 0 };
        store.write_offset(write).unwrap();
    }
    let gw = InProcess::start(test_config(&data)).await;
    let row = stored_offset(&gw.base, "t", "c", 0).await.unwrap();
    assert_eq!(row["committed"], 10, "boot alignment lowers an offset above the log end: {row}");
    assert!(above_log_end_count(&gw.base).await >= 1.0);
    publish(&gw.base, "t", json!({"partition": 0, "payload": "after"})).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(client.subscribe("t", json!({})).await["partitions"][0]["from"], 10);
    assert_eq!(client.recv_type("event").await["offset"], 10);
    gw.stop().await;
}

/// Fault 2 at subscribe: the log shrank under a running gateway (a Kafka topic recreated
/// outside ackgate). The client starts at the log end and gets what is published next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_offset_above_the_log_end_is_lowered_at_subscribe() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let before = above_log_end_count(&gw.base).await;
    let write = OffsetWrite { key: key("t", "c", 0), committed: 1000, last_acked: Some(999), updated_at: SystemClock.now_ms(), generation: 0, epoch: 0 };
    store.write_offset(write).unwrap();
    let mut client = TestClient::connect(gw.addr(), "c").await;
    let sub = client.subscribe("t", json!({})).await;
    assert_eq!(sub["partitions"][0]["from"], 10, "starts at the log end, not at 1000: {sub}");
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 10);
    assert!(above_log_end_count(&gw.base).await > before);
    publish(&gw.base, "t", json!({"partition": 0, "payload": "next"})).await;
    let event = client.recv_type("event").await;
    assert_eq!(event["offset"], 10);
    let ack = client.ack_confirmed(&[id(&event)], "a").await;
    assert_eq!(ack["committed"], json!({"t": {"0": 11}}));
    gw.stop().await;
}

/// Fault 3 at the edge: a reset above the partition's log end is refused (docs/protocol.md: 400).
#[tokio::test]
async fn a_reset_above_the_log_end_is_refused() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    for offset in [json!(u64::MAX), json!(1u64 << 63), json!(6)] {
        assert_eq!(put_offset(&gw.base, "t", "c", 0, offset.clone()).await, 400, "reset to {offset}");
    }
    assert_eq!(put_offset(&gw.base, "t", "c", 0, json!(-1)).await, 400);
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await, None, "nothing was written");
    assert_eq!(put_offset(&gw.base, "t", "c", 0, json!(5)).await, 200, "the log end itself is allowed");
    assert_eq!(put_offset(&gw.base, "t", "c", 0, json!(0)).await, 200);
    gw.stop().await;
}

/// An embedded log whose topic `t` holds 10 events on its one partition, and the partition
/// readers over it (stopped by cancelling the token).
async fn ten_events_and_their_readers() -> (tempfile::TempDir, Arc<EmbeddedLog>, Readers, CancellationToken) {
    let dir = tempfile::tempdir().unwrap();
    let log = plain_embedded_log(dir.path());
    let events = (0..10)
        .map(|n| ackgate::core::backend::NewEvent { key: None, partition: Some(0), headers: vec![], payload: vec![b'0' + n], payload_is_json: true })
        .collect();
    log.publish(&TopicName::parse("t").unwrap(), events).await.unwrap();
    let shutdown = CancellationToken::new();
    let readers = Readers::new(
        log.clone(),
        Arc::new(ackgate::store::memory::MemoryOffsetStore::new()),
        100,
        64 << 20,
        10,
        shutdown.clone(),
        TaskTracker::new(),
        metrics::Counter::noop(),
    );
    (dir, log, readers, shutdown)
}

/// Fault 3 in the reader: a read from an offset at or above 2^63 is a catch-up read like any
/// other; it never becomes a read at the shared pull cursor (which handed this reader the events
/// at the cursor, moved it, and left a gap in the buffer every other subscriber reads).
#[tokio::test]
async fn a_read_from_a_huge_offset_never_moves_the_pull_cursor() {
    let (_dir, _log, readers, shutdown) = ten_events_and_their_readers().await;
    let tp = TopicPartition::new(TopicName::parse("t").unwrap(), 0);
    let reader = readers.get(&tp, 0);
    for from in [1u64 << 63, u64::MAX - 1] {
        let read = tokio::time::timeout(Duration::from_millis(300), reader.fetch(from, 10, usize::MAX, &mut 0)).await;
        if let Ok(events) = read {
            assert!(events.unwrap().is_empty(), "a read from {from} returned events below it");
        }
    }
    // Whatever the reader pulled meanwhile is in its buffer, in order, for a subscriber at 0.
    let offsets: Vec<u64> = reader.fetch(0, 10, usize::MAX, &mut 0).await.unwrap().iter().map(|e| e.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
    shutdown.cancel();
}

/// A parked subscriber (issue 41, push fan-out) as the reader sees it: it records what is pushed
/// and takes at most `room` events in all; the reader unparks it (counted) when it cannot take a
/// push whole.
struct Recorder {
    pushed: std::sync::Mutex<Vec<u64>>,
    room: usize,
    woken: std::sync::atomic::AtomicUsize,
    closed: std::sync::atomic::AtomicBool,
}

impl ackgate::core::reader::HeadSubscriber for Recorder {
    fn push(&self, events: &[Arc<ackgate::core::backend::Event>]) -> bool {
        let mut pushed = self.pushed.lock().unwrap();
        let fits = self.room.saturating_sub(pushed.len()).min(events.len());
        pushed.extend(events[..fits].iter().map(|e| e.offset));
        fits == events.len()
    }
    fn unparked(self: Arc<Self>) {
        self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn is_gone(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The reader pushes what it appends to the subscribers parked at its end, in order, each event
/// once; one that cannot take a push whole is unparked once and pushed to no more; one closed
/// (its subscription ended) is pushed to no more and never unparked; a subscriber that does not
/// stand at the end (or has not heard of a truncation), or is gone, is not parked. If parking did
/// nothing, every delivery would still arrive through the feeders' reads: only this test shows
/// the push path runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_pushes_new_events_to_the_subscribers_parked_at_its_end() {
    use ackgate::core::reader::HeadSubscriber;
    let (_dir, log, readers, shutdown) = ten_events_and_their_readers().await;
    let tp = TopicPartition::new(TopicName::parse("t").unwrap(), 0);
    let reader = readers.get(&tp, 0);
    let read: Vec<u64> = reader.fetch(0, 10, usize::MAX, &mut 0).await.unwrap().iter().map(|e| e.offset).collect();
    assert_eq!(read, (0..10).collect::<Vec<_>>());
    let recorder = |room| Arc::new(Recorder { pushed: Default::default(), room, woken: Default::default(), closed: Default::default() });
    let (roomy, small, closed) = (recorder(100), recorder(4), recorder(100));
    assert!(!reader.park(5, 0, recorder(100)), "offset 5 is not where the ring ends");
    let gone = recorder(100);
    gone.close();
    assert!(!reader.park(10, 0, gone), "a closed subscriber is not parked");
    assert!(reader.park(10, u64::MAX, recorder(100)), "it knows of every truncation");
    assert!(reader.park(10, 0, roomy.clone()), "at the end");
    assert!(reader.park(10, 0, small.clone()), "at the end");
    assert!(reader.park(10, 0, closed.clone()), "at the end");
    let closing: Arc<dyn HeadSubscriber> = closed.clone();
    reader.close_parked(&closing);
    let publish = async |n: u8| {
        let events = (0..n)
            .map(|i| ackgate::core::backend::NewEvent { key: None, partition: Some(0), headers: vec![], payload: vec![b'a' + i], payload_is_json: false })
            .collect();
        log.publish(&TopicName::parse("t").unwrap(), events).await.unwrap();
    };
    publish(3).await;
    wait_for("three events pushed to both", async || roomy.pushed.lock().unwrap().len() == 3 && small.pushed.lock().unwrap().len() == 3).await;
    publish(3).await;
    wait_for("three more pushed to the roomy one", async || roomy.pushed.lock().unwrap().len() == 6).await;
    publish(1).await;
    wait_for("one more pushed to the roomy one", async || roomy.pushed.lock().unwrap().len() == 7).await;
    assert_eq!(*roomy.pushed.lock().unwrap(), (10..17).collect::<Vec<_>>(), "in order, each once");
    assert_eq!(roomy.woken.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(*small.pushed.lock().unwrap(), vec![10, 11, 12, 13], "took what fit of the second push, then nothing more");
    assert_eq!(small.woken.load(std::sync::atomic::Ordering::SeqCst), 1, "unparked once, when a push did not fit");
    assert!(closed.pushed.lock().unwrap().is_empty(), "a closed subscriber got events");
    assert_eq!(closed.woken.load(std::sync::atomic::Ordering::SeqCst), 0, "a closed subscriber was unparked");
    shutdown.cancel();
}

/// Fault 4: a client connected for longer than the retention on a quiet topic, then the
/// gateway is SIGKILLed. The sweep at the next start must not expire its offsets (KAFKA-8069).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_live_at_a_crash_keeps_its_offsets_through_the_boot_sweep() {
    let (_dir, data) = temp_dir();
    let env = [("ACKGATE_OFFSETS__RETENTION_SECS", "4"), ("ACKGATE_OFFSETS__SWEEP_INTERVAL_MS", "200")];
    let gw = Process::start(&data, &env);
    publish_numbered(&gw.base, "quiet", 1, 0, 1).await;
    let mut client = consume_and_ack(gw.addr, "long-lived", "quiet", 1).await;
    // Connected, acking nothing, for longer than the retention.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        client.send(json!({"op": "ping", "req": "p"})).await;
        client.recv_type("pong").await;
    }
    assert!(stored_offset(&gw.base, "quiet", "long-lived", 0).await.is_some(), "a live client never expires");
    gw.kill9();
    let gw = Process::start(&data, &env);
    // Past the boot sweep (it runs at once) and a few more.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let row = stored_offset(&gw.base, "quiet", "long-lived", 0).await;
    assert_eq!(row.map(|r| r["committed"].clone()), Some(json!(1)), "the boot sweep expired a client that was live at the crash");
}

/// Fault 4: `offsets.retention_secs = 0` means "never expire" (as `embedded.retention_secs = 0`
/// means "keep"), not "expire every offline client at each sweep".
#[tokio::test]
async fn retention_zero_never_expires_offsets() {
    let (_dir, data) = temp_dir();
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let mut config = test_config(&data);
    config.offsets.retention_secs = 0;
    let gw = InProcess::start_with_clock(config, clock.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    consume_and_ack(gw.addr(), "c", "t", 2).await.close().await;
    // The session's end refreshes updated_at: let it end before time moves.
    for _ in 0..50 {
        if gw.handle.dispatcher.sessions().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    clock.advance(10 * 365 * 86_400_000);
    assert_eq!(gw.handle.sweep_offsets_now().unwrap(), 0);
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 2);
    gw.stop().await;
}

/// Fault 5: a confirmed ack whose write failed gets `unavailable`; acking again once the store
/// works must make the offset durable before `ack_ok` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_ok_only_reports_what_is_durable_after_a_failed_write() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let event = client.recv_type("event").await;
    store.fail_writes(true);
    client.send(json!({"op": "ack", "delivery_id": id(&event), "req": "a"})).await;
    let failed = client.recv().await;
    assert_eq!((failed["type"].as_str(), failed["code"].as_str(), failed["req"].as_str()), (Some("error"), Some("unavailable"), Some("a")), "{failed}");
    // Issue 20, item 9: a short message with an incident id, never the store's own error text.
    // Failed before the fix: the message was the store's error.
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains("(incident ") && !message.contains("(test)"), "{message}");
    store.fail_writes(false);
    let ok = client.ack_confirmed(&[id(&event)], "b").await;
    assert_eq!(ok["type"], "ack_ok", "{ok}");
    assert_eq!(ok["committed"], json!({"t": {"0": 1}}));
    let row = stored_offset(&gw.base, "t", "c", 0).await.unwrap();
    assert_eq!(row["committed"], 1, "ack_ok said committed 1; the store says {row}");
    gw.stop().await;
}

/// Issue 21, item 2: a session taken over keeps running until it has closed (here it waits for
/// a dead-letter write). Before the fix, the client counted as offline as soon as its newer
/// session ended, so an operator's reset was accepted while the old session could still write
/// over it, and `limits.max_sessions` did not count the old session. Failed before the fix: the
/// reset answered 200 and the other client's session was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_session_keeps_its_client_live_until_it_has_finished() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let mut config = test_config(&data);
    config.limits.max_sessions = 1;
    let gw = start_with(config, store.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    let mut old = TestClient::connect(gw.addr(), "c").await;
    old.subscribe("t", json!({})).await;
    let first = old.recv_type("event").await;
    let _let_go = LetGo(store.clone());
    store.hold_dead_letters(true);
    old.send(json!({"op": "term", "delivery_id": id(&first), "reason": "held"})).await;
    // Let the old session take the term and wait in its dead-letter write.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The newer session takes over (the client had one running session: allowed at the limit),
    // then ends while the old one is still running.
    let newer = TestClient::connect(gw.addr(), "c").await;
    newer.close().await;
    let started = std::time::Instant::now();
    while get_json(&format!("{}/admin/sessions", gw.base)).await.1["sessions"] != json!([]) {
        assert!(started.elapsed() < WAIT, "the newer session never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(put_offset(&gw.base, "t", "c", 0, json!(0)).await, 409, "the old session still runs: the client is live");
    let refused = tokio_tungstenite::connect_async(format!("ws://{}/ws?client_id=other", gw.addr())).await;
    if let Ok((mut ws, _)) = refused {
        use futures_util::StreamExt;
        let mut limit_exceeded = false;
        while let Some(Ok(message)) = tokio::time::timeout(WAIT, ws.next()).await.expect("answered") {
            limit_exceeded |= message.to_text().is_ok_and(|t| t.contains("limit_exceeded"));
            if message.is_close() {
                break;
            }
        }
        assert!(limit_exceeded, "the still-running old session counts against limits.max_sessions");
    }
    store.hold_dead_letters(false);
    assert_eq!(until_not_conflict(async || put_offset(&gw.base, "t", "c", 0, json!(0)).await).await, 200);
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 0);
    drop(old);
    gw.stop().await;
}

/// Issue 21, item 1: a partition reader seeded from a pull cursor that another reader (the
/// previous generation, cancelled while its poll was in flight) then moved ahead. The new reader's
/// ring started at the old cursor and its first pull came from the moved one; before the fix it
/// claimed the offsets in between, so a subscriber starting there was fed from the moved cursor
/// and the ack floor committed past events it never saw. Failed before the fix: the read from 0
/// returned 5..9.
#[tokio::test]
async fn a_reader_never_claims_offsets_its_cursor_skipped() {
    let (_dir, log, readers, shutdown) = ten_events_and_their_readers().await;
    let tp = TopicPartition::new(TopicName::parse("t").unwrap(), 0);
    let reader = readers.get(&tp, 0);
    // The previous generation's poll lands now: the shared cursor moves from 0 to 5 under the
    // new reader, whose ring starts at 0.
    log.seek(&tp, 5);
    // A subscriber starting at 0 waits for the reader, which pulls from the moved cursor (5..9);
    // it gets 0..9 all the same (read from the log), never 5..9 as if 0..4 were held.
    let offsets: Vec<u64> = reader.fetch(0, 10, usize::MAX, &mut 0).await.unwrap().iter().map(|e| e.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
    shutdown.cancel();
}

/// Issue 21, item 5: the retention sweep read a client's records as expired, checked that the
/// client was not live, and removed them later without looking again; a client that connected
/// in between lost its stored offset while live (its subscription, served from memory, never
/// wrote it back). Failed before the fix: the row was gone after the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_during_a_sweep_keeps_its_offsets() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let mut config = test_config(&data);
    config.offsets.retention_secs = 10;
    config.offsets.sweep_interval_ms = 3_600_000;
    let gateway = Gateway::build_with_store(config, clock.clone(), Some(store.clone())).await.expect("gateway builds");
    let gw = InProcess::from_gateway(gateway);
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    let mut first = TestClient::connect(gw.addr(), "c").await;
    first.subscribe("t", json!({})).await;
    let events = first.recv_events(3).await;
    first.ack_confirmed(&ids(&events[..2]), "two").await;
    first.close().await;
    until_not_conflict(async || put_offset(&gw.base, "t", "c", 0, json!(2)).await).await;
    // Away for longer than the retention: its record is expired.
    clock.advance(20_000);
    let _let_go = LetGo(store.clone());
    store.hold_removals(true);
    let handle = gw.handle.clone();
    let sweep = std::thread::spawn(move || handle.sweep_offsets_now());
    // Let the sweep scan and check liveness; it then waits to remove.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut back = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(back.subscribe("t", json!({})).await["partitions"][0]["from"], 2);
    store.hold_removals(false);
    let swept = tokio::task::spawn_blocking(move || sweep.join().unwrap()).await.unwrap().unwrap();
    assert_eq!(swept, 0, "the record changed (the client came back) after the sweep read it");
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.map(|r| r["committed"].clone()), Some(json!(2)), "a live client keeps its stored offset");
    let third = back.recv_type("event").await;
    assert_eq!(back.ack_confirmed(&[id(&third)], "last").await["committed"], json!({"t": {"0": 3}}));
    gw.stop().await;
}

/// Issue 21, item 10: a dead letter whose write failed left its delivery in flight without a
/// deadline (the timer that found it due had consumed it): never tried again, never dead-lettered,
/// its slot held until the session ended. Failed before the fix: no dead letter after the store
/// recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_write_failed_is_tried_again() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let mut config = test_config(&data);
    config.delivery.ack_timeout_ms = 200;
    config.delivery.max_attempts = 1;
    let gw = start_with(config, store.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    store.fail_dead_letters(true);
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    client.recv_type("event").await;
    // Not acked: after 200 ms it is due for a dead letter, whose write fails.
    tokio::time::sleep(Duration::from_millis(600)).await;
    store.fail_dead_letters(false);
    let started = std::time::Instant::now();
    loop {
        let (_, page) = get_json(&format!("{}/admin/dead-letters?topic=t", gw.base)).await;
        if page["dead_letters"].as_array().is_some_and(|d| d.len() == 1) {
            break;
        }
        assert!(started.elapsed() < WAIT, "the dead letter was never written after the store recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It counts as acknowledged once recorded.
    let started = std::time::Instant::now();
    while stored_offset(&gw.base, "t", "c", 0).await.map(|r| r["committed"].clone()) != Some(json!(1)) {
        assert!(started.elapsed() < WAIT, "the dead letter did not move the committed offset");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.stop().await;
}

/// Issue 21, item 3: a subscription that replaces a client's tracker while another session of
/// the client still delivers. Session A (taken over, but still inside its redelivery pass, held
/// in a dead-letter write) redelivers offset 5 after session B's subscribe put a new tracker at 3
/// (B resumes from 3 and waits in its plan's touch of the stored offsets). Before the fix A's
/// redelivery raised the new tracker's delivered end to 6, so B's feeder took 3 and 4 for
/// acknowledged: B's first event was 5, and acking it committed past two events B never saw.
/// Failed before the fix: B's first event had offset 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_session_never_feeds_the_tracker_of_a_newer_subscription() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let mut config = test_config(&data);
    config.delivery.max_attempts = 2;
    let gw = start_with(config, store.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 8).await;
    let mut a = TestClient::connect(gw.addr(), "c").await;
    a.subscribe("t", json!({})).await;
    let events = a.recv_events(8).await;
    // Event 0 reaches its last attempt now; its next redelivery is a dead letter.
    a.send(json!({"op": "nack", "delivery_id": id(&events[0])})).await;
    let again = a.recv_type("event").await;
    assert_eq!((again["offset"].as_u64(), again["attempt"].as_u64()), (Some(0), Some(2)));
    let _let_go = LetGo(store.clone());
    store.hold_dead_letters(true);
    // 0 and 5 come due 100 ms from now, while A is still held in the dead-letter write of its
    // `term` of 7 (let through at 400 ms): A's next redelivery pass takes both, 0 first, and
    // holds in 0's dead-letter write.
    a.send(json!({"op": "nack", "delivery_id": id(&again), "delay_ms": 100})).await;
    a.send(json!({"op": "nack", "delivery_id": id(&events[5]), "delay_ms": 100})).await;
    a.send(json!({"op": "term", "delivery_id": id(&events[7])})).await;
    store.let_one_dead_letter_through_after(Duration::from_millis(400));
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Everything from here is let go of by threads at set times: a hold must never wait for this
    // test's own task. B's plan puts its tracker in place and waits in its touch of the client's
    // records; 300 ms later A's dead letter is written and A goes on with 5; 900 ms after that
    // B's plan goes on.
    let mut b = TestClient::connect(gw.addr(), "c").await;
    store.hold_touches_for(Duration::from_millis(1200));
    b.send(json!({"op": "subscribe", "topic": "t", "resume": {"0": 3}})).await;
    store.release_dead_letters_after(Duration::from_millis(300));
    assert_eq!(b.recv_type("subscribed").await["partitions"][0]["from"], 3);
    let first = b.recv_type("event").await;
    assert_eq!(first["offset"], 3, "B resumes at 3 and must get 3 first: {first}");
    drop(a);
    gw.stop().await;
}

/// Issue 21, item 9: `GET /admin/offsets` pages (`limit`, `after`, `next`) whatever the filter,
/// in the store's order, so an unfiltered listing is never one unbounded answer. Failed before the
/// fix: `limit` was refused as an unknown filter and every row came in one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offsets_listing_comes_in_pages() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    let now = SystemClock.now_ms();
    for topic in ["a", "b"] {
        for client in ["c1", "c2", "c3"] {
            for partition in 0..4 {
                store
                    .write_offset(OffsetWrite {
                        key: key(topic, client, partition),
                        committed: 1,
                        last_acked: Some(0),
                        updated_at: now,
                        generation: 0,
                        epoch: 0,
                    })
                    .unwrap();
            }
        }
    }
    for (filter, expected) in [("", 24), ("client_id=c2&", 8), ("topic=b&", 12), ("partition=3&", 6)] {
        let mut seen = Vec::new();
        let mut after = String::new();
        loop {
            let (status, page) = get_json(&format!("{}/admin/offsets?{filter}limit=5{after}", gw.base)).await;
            assert_eq!(status, 200, "{page}");
            let rows = page["offsets"].as_array().unwrap();
            assert!(rows.len() <= 5);
            seen.extend(rows.iter().map(|r| r["key"].as_str().unwrap().to_string()));
            match page["next"].as_str() {
                Some(next) => after = format!("&after={}", next.replace('#', "%23")),
                None => break,
            }
        }
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!((seen.len(), unique.len()), (expected, expected), "{filter}: {seen:?}");
    }
    let (status, _) = get_json(&format!("{}/admin/offsets?limit=0", gw.base)).await;
    assert_eq!(status, 400);
    let (status, _) = get_json(&format!("{}/admin/offsets?after=nonsense", gw.base)).await;
    assert_eq!(status, 400);
    gw.stop().await;
}

/// Issue 21, item 9: an operator's reset writes the store off the session registry's lock, so
/// while its write waits (a slow disk, an fsync) every other client
/// still connects, subscribes and receives. Failed before the fix: the reset wrote under the
/// registry's lock, so `other`'s session could only register once the reset's write had ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reset_on_a_slow_disk_holds_up_no_other_client() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let _let_go = LetGo(store.clone());
    let gw = start_with(test_config(&data), store.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    store.hold_resets_for(Duration::from_secs(4));
    let resetting = tokio::spawn(put_offset_owned(gw.base.clone(), "t", "offline", 0, json!(1)));
    while store.resets_waiting() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut other = TestClient::connect(gw.addr(), "other").await;
    other.subscribe("t", json!({"from": "earliest"})).await;
    assert_eq!(other.recv_events(3).await.len(), 3);
    assert!(store.resets_waiting() == 1 && !resetting.is_finished(), "other was served only after the reset's write ended");
    assert_eq!(resetting.await.unwrap(), 200);
    assert_eq!(stored_offset(&gw.base, "t", "offline", 0).await.unwrap()["committed"], 1);
    gw.stop().await;
}

async fn put_offset_owned(base: String, topic: &'static str, client: &'static str, partition: u32, offset: serde_json::Value) -> u16 {
    put_offset(&base, topic, client, partition, offset).await
}

/// Issue 21, item 7: a subscriber ahead of the ring whose events are already in the log (it
/// subscribed at the log end while the shared reader stood further back, at an absent client's
/// offset) is served by the shared reader, which moves to it, and never reads the log by offset.
/// On Kafka each read by offset waited for one of a few catch-up consumers for a second, and the
/// subscriber, still ahead of the ring, read by offset again: seconds of delay at the head after
/// a restart. Failed before the fix: the read went by offset and the shared reader stayed at 0.
#[tokio::test]
async fn a_subscriber_ahead_of_the_ring_is_served_by_the_shared_reader() {
    let (_dir, _log, readers, shutdown) = ten_events_and_their_readers().await;
    let tp = TopicPartition::new(TopicName::parse("t").unwrap(), 0);
    let reader = readers.get(&tp, 0);
    assert_eq!(reader.pull_offset(), 0);
    let events = tokio::time::timeout(WAIT, reader.fetch(5, 10, usize::MAX, &mut 0)).await.expect("served").unwrap();
    assert_eq!(events.iter().map(|e| e.offset).collect::<Vec<_>>(), (5..10).collect::<Vec<_>>());
    assert_eq!(reader.pull_offset(), 10, "the shared reader moved to the subscriber and pulled its events");
    // A subscriber below the ring still reads the log by offset.
    let below: Vec<u64> = reader.fetch(0, 3, usize::MAX, &mut 0).await.unwrap().iter().map(|e| e.offset).collect();
    assert_eq!(below, vec![0, 1, 2]);
    shutdown.cancel();
}

/// Issue 39, item 5: a `DELETE /topics` cut short by a store error after the log was deleted. Before:
/// the offsets stayed live, the retried DELETE answered 404 (the log was gone), and a topic created
/// again under the name started its old client at the old offset (3 of its events skipped). Now
/// the removal is marked in the store before the log goes: a retry finishes it (200), and until
/// then a subscribe to a topic created again under the name is refused (`unavailable`) instead of
/// starting at the old offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deletion_cut_short_is_finished_by_its_retry_and_never_leaks_offsets() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    let delete =
        async |topic: &str| until_not_conflict(async || http().delete(format!("{}/topics/{topic}", gw.base)).send().await.unwrap().status().as_u16()).await;
    for topic in ["retried", "recreated"] {
        publish_numbered(&gw.base, topic, 1, 0, 3).await;
        consume_and_ack(gw.addr(), "c", topic, 3).await.close().await;
        store.fail_topic_removals(true);
        assert_eq!(delete(topic).await, 503, "the store failed in the middle of deleting {topic}");
        store.fail_topic_removals(false);
    }
    // The operator retries: the log is gone already, the removal is finished.
    assert_eq!(delete("retried").await, 200, "not 404: the deletion was not over");
    publish_numbered(&gw.base, "retried", 1, 0, 5).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(client.subscribe("retried", json!({})).await["partitions"][0]["from"], 0, "a new topic, a new start");
    client.close().await;
    // The other is created again before anyone retries: its old offsets are not used.
    publish_numbered(&gw.base, "recreated", 1, 0, 5).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.send(json!({"op": "subscribe", "topic": "recreated", "req": "s"})).await;
    let refused = client.recv_type("error").await;
    assert_eq!(refused["code"], "unavailable", "the old offsets must not apply: {refused}");
    client.close().await;
    // A start finishes it as well (the log is there now, so the topic stays, clean).
    gw.stop().await;
    let gw = start_with(test_config(&data), store.clone()).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(client.subscribe("recreated", json!({})).await["partitions"][0]["from"], 0);
    gw.stop().await;
}

/// Review of issue 39, item 5: a deletion cut short after the topic's offsets were removed but
/// before its dead letters were. Before, `remove_topic` cleared the pending mark first: the
/// retried DELETE answered 404 (nothing pending, no log) and the dead letter stayed listed for a
/// topic that no longer exists, redrivable into one created again under the name. Now the mark
/// goes last: the retry finishes the removal (200, the dead letter with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_cut_short_before_its_dead_letters_went_is_finished_by_the_retry() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    publish_numbered(&gw.base, "dl", 1, 0, 2).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("dl", json!({})).await;
    let events = client.recv_events(2).await;
    client.send(json!({"op": "term", "delivery_id": id(&events[0]), "reason": "poison"})).await;
    client.ack_confirmed(&[id(&events[1])], "a").await;
    client.close().await;
    let listed = format!("{}/admin/dead-letters?topic=dl", gw.base);
    wait_for("the dead letter is listed", async || get_json(&listed).await.1["dead_letters"].as_array().map(Vec::len) == Some(1)).await;
    let delete = async || until_not_conflict(async || http().delete(format!("{}/topics/dl", gw.base)).send().await.unwrap().status().as_u16()).await;
    store.fail_dead_letter_removals(true);
    assert_eq!(delete().await, 503, "the store failed while removing the dead letters");
    store.fail_dead_letter_removals(false);
    assert_eq!(delete().await, 200, "the retry finishes the removal, not 404");
    assert_eq!(get_json(&listed).await.1["dead_letters"], json!([]), "the deleted topic's dead letter went with it");
    gw.stop().await;
}

/// Issue 39, item 10: with `storage.durability = "crash"`, a confirmed ack's offset write ran on the
/// session's tokio worker whenever the writer thread was idle, so a store that stalled (a RocksDB
/// write stall; here writes held) froze that worker, and three clients froze both: `/healthz`
/// went unanswered. Now a write is made on the worker only when the store can make it without
/// waiting, and handed to the writer thread otherwise. Failed before the fix: no answer in 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_offset_store_freezes_no_tokio_worker() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let mut config = test_config(&data);
    // The inline write exists only without an fsync per write.
    config.storage.durability = ackgate::config::Durability::Crash;
    let gw = start_with(config, store.clone()).await;
    let _let_go = LetGo(store.clone());
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    let mut clients = Vec::new();
    for name in ["a", "b", "c"] {
        let mut client = TestClient::connect(gw.addr(), name).await;
        client.subscribe("t", json!({})).await;
        let events = client.recv_events(2).await;
        clients.push((client, events));
    }
    store.hold_writes();
    for (client, events) in &mut clients {
        client.send(json!({"op": "ack", "delivery_ids": ids(events), "req": "confirmed"})).await;
    }
    // Asked from a thread of its own, which then lets the writes go: the test's own tasks share
    // the gateway's two workers (and their timers), which the old code froze.
    let (addr, releasing) = (gw.addr(), store.clone());
    let answer = std::thread::spawn(move || {
        use std::io::{Read, Write};
        std::thread::sleep(Duration::from_millis(300));
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut head = [0u8; 12];
        let answer = tcp.read_exact(&mut head).map(|()| String::from_utf8_lossy(&head).into_owned());
        releasing.release_writes();
        answer
    });
    let answer = tokio::task::spawn_blocking(move || answer.join().unwrap()).await.unwrap();
    assert!(answer.as_ref().is_ok_and(|h| h.ends_with("200")), "/healthz while offset writes stall: {answer:?}");
    for (client, _) in &mut clients {
        let ok = client.recv_type("ack_ok").await;
        assert_eq!(ok["committed"], json!({"t": {"0": 2}}), "{ok}");
    }
    gw.stop().await;
}

/// Issue 39, item 9: an idempotent publish whose answer was never remembered (the gateway died
/// between the log's write and remembering it; here the store fails that write) was written a
/// second time by its retry, which found no key. Now a pending mark is remembered before the
/// write, and the retry that finds it is refused with 409 (the outcome is unknown) instead of
/// writing again. Failed before the fix: the retry answered 200 and the log held the batch twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_publish_whose_answer_was_lost_does_not_write_again() {
    let (_dir, data) = temp_dir();
    let store = ControlledStore::open(&data);
    let gw = start_with(test_config(&data), store.clone()).await;
    let body = json!({"events": [{"payload": 1}, {"payload": 2}]});
    let send = async || {
        let response = http().post(format!("{}/topics/once/events", gw.base)).header("idempotency-key", "order-7").json(&body).send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap())
    };
    store.fail_publish_answers(true);
    let (status, first) = send().await;
    assert_eq!(status, 200, "written, though its answer was not remembered: {first}");
    store.fail_publish_answers(false);
    let (status, retry) = send().await;
    assert_eq!((status, retry["error"]["code"].as_str()), (409, Some("conflict")), "{retry}");
    assert!(retry["error"]["message"].as_str().unwrap().contains("unknown"), "{retry}");
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let written: u64 = topics["topics"][0]["partitions"].as_array().unwrap().iter().map(|p| p["log_end"].as_u64().unwrap()).sum();
    assert_eq!(written, 2, "written once: {topics}");
    // A key whose publish went through answers its retries as before.
    let again = http().post(format!("{}/topics/once/events", gw.base)).header("idempotency-key", "order-8").json(&body).send().await.unwrap();
    assert_eq!(again.status(), 200);
    let replay = http().post(format!("{}/topics/once/events", gw.base)).header("idempotency-key", "order-8").json(&body).send().await.unwrap();
    assert_eq!(replay.status(), 200);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    gw.stop().await;
}

/// Issue 39, items 1 and 3, at boot: the log lost its tail in a power loss (both stores unsynced),
/// found at start by an offset above the log end. Another client's stored offset (8) was below
/// the new end, but its resume token (12) was not: it had read events that are gone. Before, its
/// token was trusted once the log had grown back past it, and the events written at 10 and 11
/// since were skipped without a gap. Now the boot alignment starts the partition's next log
/// epoch, the client's record moves into it at its subscribe, and its older token is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_tail_found_at_boot_fences_tokens_from_before_it() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    gw.stop().await;
    {
        let store = RocksOffsetStore::open(&data, false).unwrap();
        let write = |client: &str, committed: u64| OffsetWrite {
            key: key("t", client, 0),
            committed,
            last_acked: Some(committed - 1),
            updated_at: SystemClock.now_ms(),
            generation: 0,
            epoch: 0,
        };
        store.write_offsets(&[write("c", 1000), write("d", 8)]).unwrap();
    }
    let gw = InProcess::start(test_config(&data)).await;
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 10);
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    let mut client = TestClient::connect(gw.addr(), "d").await;
    let subscribed = client.subscribe("t", json!({"resume": {"0": 12}, "epochs": {"0": 0}})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 8, "the token from before the loss is fenced: {subscribed}");
    let offsets: Vec<u64> = client.recv_events(7).await.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, (8..15).collect::<Vec<_>>());
    gw.stop().await;
}
