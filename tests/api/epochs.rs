//! Offset epochs (issue 39, docs/semantics.md "Offset epochs"): an operator's reset or a lost log
//! tail lowers a committed offset in a new epoch, and a resume token, a tracker or a queued write
//! made before it is fenced. Each test failed on the code before epochs (the issue note says how).

use std::collections::BTreeMap;
use std::time::Duration;

use ackgate::core::clock::{Clock, SystemClock};
use ackgate::core::names::{ClientId, OffsetKey, TopicName};
use ackgate::core::offsets::{OffsetStore, OffsetWrite};
use ackgate::store::rocks::RocksOffsetStore;
use serde_json::{json, Value};

use crate::support::*;

/// `PUT /admin/offsets/{topic}/{client}/0` to `offset`, retried while the client still counts
/// as live (409 until its ended session has unregistered); the new row.
async fn reset_offset(base: &str, topic: &str, client: &str, offset: u64) -> Value {
    for _ in 0..200 {
        let response = http().put(format!("{base}/admin/offsets/{topic}/{client}/0")).json(&json!({"offset": offset})).send().await.unwrap();
        match response.status().as_u16() {
            409 => tokio::time::sleep(Duration::from_millis(50)).await,
            200 => return response.json().await.unwrap(),
            other => panic!("reset answered {other}: {}", response.text().await.unwrap()),
        }
    }
    panic!("the client stayed live");
}

fn decode_token(data: &std::path::Path, token: &str) -> BTreeMap<String, BTreeMap<String, Value>> {
    open_token(&data_dir_token_key(data), token)
}

/// Item 1 over the WebSocket, as the issue tried it: a client confirmed acks up to 20, an operator
/// reset it to 5 while it was away, and it came back with `resume: {"0": 20}` (the JS client
/// always sends its token). Before: it started at 20, the rewind silently ignored. Now the token
/// names no epoch (the oldest) and the record is in epoch 1: it starts at 5. A token of the
/// current epoch is trusted as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_token_from_before_an_operator_reset_does_not_undo_it() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "orders", 1, 0, 30).await;
    let mut client = TestClient::connect(gw.addr(), "alice").await;
    let subscribed = client.subscribe("orders", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["epoch"], 0, "{subscribed}");
    let events = client.recv_events(20).await;
    assert_eq!(client.ack_confirmed(&ids(&events), "a").await["committed"], json!({"orders": {"0": 20}}));
    client.close().await;

    let row = reset_offset(&gw.base, "orders", "alice", 5).await;
    assert_eq!(row["committed"], 5);

    let mut client = TestClient::connect(gw.addr(), "alice").await;
    let subscribed = client.subscribe("orders", json!({"resume": {"0": 20}})).await;
    assert_eq!((subscribed["partitions"][0]["from"].as_u64(), subscribed["partitions"][0]["epoch"].as_u64()), (Some(5), Some(1)), "{subscribed}");
    assert_eq!(client.recv_type("event").await["offset"], 5, "the operator's rewind stands");
    client.close().await;
    // A token naming an older epoch explicitly is fenced the same way.
    let mut client = TestClient::connect(gw.addr(), "alice").await;
    let subscribed = client.subscribe("orders", json!({"resume": {"0": 25}, "epochs": {"0": 0}})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 5, "{subscribed}");
    client.close().await;
    // Within the current epoch a token ahead of the stored offset wins, as always.
    let mut client = TestClient::connect(gw.addr(), "alice").await;
    let subscribed = client.subscribe("orders", json!({"resume": {"0": 8}, "epochs": {"0": 1}})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 8, "{subscribed}");
    client.close().await;
    assert_eq!(stored_offset(&gw.base, "orders", "alice", 0).await.unwrap()["committed"], 8);
    gw.stop().await;
}

/// Item 1 over SSE: the browser's EventSource sends the last `id:` it saw as `Last-Event-ID` by
/// itself. Before: after a reset to 3, delivery started at 10 (the id's offset). Now it starts
/// at 3, and the new ids carry the epoch (`[offset, 1]`), which a later reconnect is trusted with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_last_event_id_from_before_a_reset_does_not_undo_it() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "feed", 1, 0, 10).await;
    let mut client = TestClient::connect_sse(gw.addr(), "bob", "topics=feed", &[]).await;
    assert_eq!(client.recv_type("subscribed").await["partitions"][0]["epoch"], 0);
    let events = client.recv_events(10).await;
    client.ack_confirmed(&ids(&events), "a").await;
    // An id's token is read at most every 100 ms (TOKEN_REFRESH): past that, the next has the ack.
    tokio::time::sleep(Duration::from_millis(150)).await;
    publish(&gw.base, "feed", json!({"partition": 0, "payload": "eleventh"})).await;
    client.recv_type("event").await;
    let old_token = client.sse().last_event_id.clone().expect("events carry an id");
    assert_eq!(decode_token(&data, &old_token)["feed"]["0"], json!(10));
    client.close().await;

    reset_offset(&gw.base, "feed", "bob", 3).await;
    let mut client = TestClient::connect_sse(gw.addr(), "bob", "topics=feed", &[("last-event-id", &old_token)]).await;
    let subscribed = client.recv_type("subscribed").await;
    assert_eq!((subscribed["partitions"][0]["from"].as_u64(), subscribed["partitions"][0]["epoch"].as_u64()), (Some(3), Some(1)), "{subscribed}");
    let again = client.recv_events(8).await;
    assert_eq!(again.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), (3..11).collect::<Vec<_>>());
    client.ack_confirmed(&ids(&again[..4]), "b").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    publish(&gw.base, "feed", json!({"partition": 0, "payload": "twelfth"})).await;
    client.recv_type("event").await;
    let new_token = client.sse().last_event_id.clone().expect("events carry an id");
    assert_eq!(decode_token(&data, &new_token)["feed"]["0"], json!([7, 1]), "the id names the epoch");
    client.close().await;
    let mut client = TestClient::connect_sse(gw.addr(), "bob", "topics=feed", &[("last-event-id", &new_token)]).await;
    assert_eq!(client.recv_type("subscribed").await["partitions"][0]["from"], 7);
    client.close().await;
    gw.stop().await;
}

/// Item 1 after a lost log tail: the client acked 20 events, the log came back with 10 (a power
/// loss with unsynced stores), boot lowered its offset to 10, and 10 new events were written at
/// offsets 10..19. The client returns with its token (20). Before: max(stored 10, token 20) = 20,
/// and the ten new events were skipped without a gap. Now the boot alignment started the
/// partition's log epoch 1 (offset epoch 2^32, its first) and the token is fenced: delivery
/// starts at 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_token_from_before_a_lost_log_tail_does_not_skip_the_new_events() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    consume_and_ack(gw.addr(), "c", "t", 10).await.close().await;
    gw.stop().await;
    {
        // What the client confirmed before the log lost its tail: 20.
        let store = RocksOffsetStore::open(&data, false).unwrap();
        let key = OffsetKey::new(TopicName::parse("t").unwrap(), ClientId::parse("c").unwrap(), 0);
        store.write_offset(OffsetWrite { key, committed: 20, last_acked: Some(19), updated_at: SystemClock.now_ms(), generation: 0, epoch: 0 }).unwrap();
    }
    let gw = InProcess::start(test_config(&data)).await;
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 10, "lowered at boot");
    let events: Vec<Value> = (0..10).map(|n| json!({"partition": 0, "payload": {"new": n}})).collect();
    publish(&gw.base, "t", json!({ "events": events })).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    let subscribed = client.subscribe("t", json!({"resume": {"0": 20}})).await;
    assert_eq!((subscribed["partitions"][0]["from"].as_u64(), subscribed["partitions"][0]["epoch"].as_u64()), (Some(10), Some(1 << 32)), "{subscribed}");
    let event = client.recv_type("event").await;
    assert_eq!((event["offset"].as_u64(), event["payload"]["new"].as_u64()), (Some(10), Some(0)));
    gw.stop().await;
}

/// The review's sequence: a reset (epoch 1, which the client learns), then the client's offsets
/// deleted by an operator, then a return with its epoch-1 claim: the deletion's fence (epoch 2)
/// stands for the record, so the claim counts for nothing and the next reset steps to 3, fencing
/// every token of before. (Had the record started over at epoch 0, the next reset would be epoch 1
/// again and the old token would undo it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_never_start_over_when_a_clients_offsets_are_deleted() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "orders", 1, 0, 30).await;
    consume_and_ack(gw.addr(), "bob", "orders", 20).await.close().await;
    assert_eq!(reset_offset(&gw.base, "orders", "bob", 5).await["committed"], 5);
    let deleted = http().delete(format!("{}/admin/offsets/orders/bob", gw.base)).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    // The deletion left a fence above the reset's epoch (issue 55, item 4): a claim of epoch 1
    // has no record to be clamped to and counts for nothing; the record starts again in epoch 2.
    let mut client = TestClient::connect(gw.addr(), "bob").await;
    let subscribed = client.subscribe("orders", json!({"resume": {"0": 8}, "epochs": {"0": 1}})).await;
    assert_eq!((subscribed["partitions"][0]["from"].as_u64(), subscribed["partitions"][0]["epoch"].as_u64()), (Some(0), Some(2)), "{subscribed}");
    assert_eq!((subscribed["resume"].as_str(), subscribed["resume_reason"].as_str()), (Some("refused"), Some("invalid")), "{subscribed}");
    let token = subscribed["token"].as_str().unwrap().to_string();
    client.close().await;
    let row = reset_offset(&gw.base, "orders", "bob", 2).await;
    assert_eq!((row["committed"].as_u64(), row["epoch"].as_u64()), (Some(2), Some(3)), "{row}");
    for resume in [json!({"0": 15}), json!(token)] {
        let mut client = TestClient::connect(gw.addr(), "bob").await;
        let subscribed = client.subscribe("orders", json!({ "resume": resume, "epochs": {"0": 2} })).await;
        assert_eq!((subscribed["partitions"][0]["from"].as_u64(), subscribed["partitions"][0]["epoch"].as_u64()), (Some(2), Some(3)), "{resume}: {subscribed}");
        client.close().await;
    }
    gw.stop().await;
}

/// Item 2, the operator's side: a client left offset 5 unacknowledged and acked 6 to 9, so its
/// tracker, kept while it is away, held them as acked above the floor 5; an operator reset it to
/// 5 (everything from 5 again), the floor its tracker starts at. Were the tracker kept, 6 to 9
/// would count as acked and only 5 come back. This passed on the code before epochs too (an
/// admin reset forgets the offline client's state); it guards that, and the reset's epoch fences
/// the tracker as well. The lost-tail side, which failed before, is in tests/api/kafka.rs
/// (`acks_made_in_a_lost_log_tail_do_not_count_for_the_events_written_there_next`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracker_of_acks_from_before_a_reset_is_dropped() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(10).await;
    let all_but_five: Vec<&str> = events.iter().filter(|e| e["offset"] != 5).map(id).collect();
    assert_eq!(client.ack_confirmed(&all_but_five, "a").await["committed"], json!({"t": {"0": 5}}));
    client.close().await;

    let row = reset_offset(&gw.base, "t", "c", 5).await;
    assert_eq!(row["committed"], 5, "{row}");

    let mut client = TestClient::connect(gw.addr(), "c").await;
    let subscribed = client.subscribe("t", json!({})).await;
    assert_eq!((subscribed["partitions"][0]["from"].as_u64(), subscribed["partitions"][0]["epoch"].as_u64()), (Some(5), Some(1)), "{subscribed}");
    let again = client.recv_events(5).await;
    let offsets: Vec<u64> = again.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![5, 6, 7, 8, 9], "the reset delivers everything from 5 again");
    assert_eq!(client.ack_confirmed(&ids(&again), "b").await["committed"], json!({"t": {"0": 10}}));
    client.close().await;
    gw.stop().await;
}
