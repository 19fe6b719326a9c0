//! What survives a restart: floors (not maxima), monotonic offsets, boot alignment, the pull
//! checkpoint, and offset retention without the KAFKA-8069 bug.

use std::sync::Arc;
use std::time::Duration;

use ackgate::core::clock::{Clock, ManualClock, SystemClock};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn only_the_floor_is_durable_delivery_resumes_at_the_gap_after_restart() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "gap").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(10).await;
    assert_eq!(client.ack_confirmed(&ids(&events[1..]), "r").await["committed"], json!({"t": {"0": 0}}));
    client.close().await;
    gw.stop().await;

    let gw = InProcess::start(test_config(&data)).await;
    let mut client = TestClient::connect(gw.addr(), "gap").await;
    let sub = client.subscribe("t", json!({})).await;
    assert_eq!(sub["partitions"][0]["from"], 0);
    let first = client.recv_type("event").await;
    assert_eq!(first["offset"], 0, "the unacknowledged gap is delivered again");
    let row = stored_offset(&gw.base, "t", "gap", 0).await.unwrap();
    assert_eq!((row["committed"].as_u64(), row["last_acked"].as_u64()), (Some(0), Some(9)));
    gw.stop().await;
}

#[tokio::test]
async fn a_replay_after_restart_never_lowers_a_fast_clients_offset() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let fast = consume_and_ack(gw.addr(), "fast", "t", 10).await;
    let slow = consume_and_ack(gw.addr(), "slow", "t", 3).await;
    fast.close().await;
    slow.close().await;
    gw.stop().await;

    let gw = InProcess::start(test_config(&data)).await;
    // Boot alignment put the shared pull cursor at the slowest client's floor...
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["pull_offset"], 3);
    // ...and the replay for the slow client leaves the fast one where it was.
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe("t", json!({})).await;
    let replay = slow.recv_events(7).await;
    assert_eq!(replay[0]["offset"], 3);
    slow.ack_confirmed(&ids(&replay), "s2").await;
    let mut fast = TestClient::connect(gw.addr(), "fast").await;
    let sub = fast.subscribe("t", json!({})).await;
    assert_eq!(sub["partitions"][0]["from"], 10);
    fast.expect_silence(Duration::from_millis(300)).await;
    assert_eq!(stored_offset(&gw.base, "t", "fast", 0).await.unwrap()["committed"], 10);
    assert_eq!(stored_offset(&gw.base, "t", "slow", 0).await.unwrap()["committed"], 10);
    gw.stop().await;
}

#[tokio::test]
async fn the_pull_checkpoint_is_written_at_shutdown_and_read_at_start() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 2, 0, 6).await;
    publish_numbered(&gw.base, "unread", 1, 0, 6).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    client.recv_events(6).await;
    client.close().await;
    gw.stop().await;
    let file = std::fs::read_to_string(data.join("pull-offsets.properties")).unwrap();
    assert!(file.lines().any(|l| l == "t#0=6"), "checkpoint holds the pull cursor:\n{file}");
    // A partition without known clients starts from its checkpointed cursor; one with clients
    // is aligned to their smallest committed offset (client c acked nothing: 0).
    std::fs::write(data.join("pull-offsets.properties"), "t#0=4\nt#1=0\nunread#0=5\n").unwrap();
    let gw = InProcess::start(test_config(&data)).await;
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let pull = |name: &str| topics["topics"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap()["partitions"][0]["pull_offset"].clone();
    assert_eq!((pull("t"), pull("unread")), (json!(0), json!(5)));
    gw.stop().await;
}

/// KAFKA-8069: offsets must not expire right after they are loaded back.
#[tokio::test]
async fn offsets_survive_a_sweep_right_after_restart_and_expire_only_past_retention() {
    let (_dir, data) = temp_dir();
    let day_ms = 86_400_000;
    let mut config = test_config(&data);
    config.offsets.retention_secs = 86_400;
    let start = SystemClock.now_ms();
    let gw = InProcess::start_with_clock(config.clone(), Arc::new(ManualClock::new(start))).await;
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    for name in ["absent", "present"] {
        consume_and_ack(gw.addr(), name, "t", 2).await.close().await;
    }
    gw.stop().await;

    let clock = Arc::new(ManualClock::new(start + 1000));
    let gw = InProcess::start_with_clock(config, clock.clone()).await;
    assert_eq!(gw.handle.sweep_offsets_now().unwrap(), 0, "nothing expires right after a restart");
    let (_, all) = get_json(&format!("{}/admin/offsets", gw.base)).await;
    assert_eq!(all["offsets"].as_array().unwrap().len(), 2);
    let mut present = TestClient::connect(gw.addr(), "present").await;
    clock.advance(day_ms + 2000);
    assert_eq!(gw.handle.sweep_offsets_now().unwrap(), 1);
    assert!(stored_offset(&gw.base, "t", "absent", 0).await.is_none(), "the absent client's offset expired");
    assert_eq!(stored_offset(&gw.base, "t", "present", 0).await.unwrap()["committed"], 2, "a live client's offset never expires");
    present.send(json!({"op": "ping"})).await;
    present.recv_type("pong").await;
    // Leaving counts as being seen: its retention starts now, not at its last ack days ago.
    present.close().await;
    wait_until_offline(&gw.base).await;
    assert_eq!(gw.handle.sweep_offsets_now().unwrap(), 0);
    clock.advance(day_ms + 1);
    assert_eq!(gw.handle.sweep_offsets_now().unwrap(), 1);
    gw.stop().await;
}

async fn wait_until_offline(base: &str) {
    for _ in 0..100 {
        let (_, sessions) = get_json(&format!("{base}/admin/sessions")).await;
        if sessions["sessions"].as_array().unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the session did not end");
}

#[tokio::test]
async fn an_admin_reset_moves_an_offline_clients_offset_back_and_it_replays() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    consume_and_ack(gw.addr(), "replayer", "t", 5).await.close().await;
    wait_until_offline(&gw.base).await;
    let url = format!("{}/admin/offsets/t/replayer/0", gw.base);
    let reset: serde_json::Value = http().put(&url).json(&json!({"offset": 2})).send().await.unwrap().json().await.unwrap();
    assert_eq!((reset["key"].as_str(), reset["committed"].as_u64()), (Some("t#replayer#0"), Some(2)));
    let (_, view) = get_json(&format!("{}/admin/offsets/t/replayer", gw.base)).await;
    assert_eq!((view["partitions"][0]["committed"].as_u64(), view["partitions"][0]["lag"].as_u64()), (Some(2), Some(3)));
    let mut client = TestClient::connect(gw.addr(), "replayer").await;
    assert_eq!(client.subscribe("t", json!({})).await["partitions"][0]["from"], 2);
    let replay = client.recv_events(3).await;
    assert_eq!(replay.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), vec![2, 3, 4]);
    client.close().await;
    wait_until_offline(&gw.base).await;
    let deleted: serde_json::Value = http().delete(format!("{}/admin/offsets/t/replayer", gw.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(deleted["deleted"], 1);
    assert!(stored_offset(&gw.base, "t", "replayer", 0).await.is_none());
    gw.stop().await;
}

async fn pulled_events(base: &str) -> f64 {
    metric(base, "ackgate_pull_events_total").await
}

/// Issue 21, item 7: boot alignment leaves the pull cursor at an absent client's offset (here
/// 0, with 200 events above it); subscribers at the head must not pay for it. The shared reader
/// moves to them instead of pulling its way up through the 200 (each pull woke every head
/// subscriber, and on Kafka sent each to a catch-up consumer for a second). The real binary:
/// the pull counter is the process's own. Failed before the fix: 201 events pulled to deliver
/// the one new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_subscribers_do_not_pay_for_a_client_left_behind() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "t", 1, 0, 200).await;
    let mut absent = TestClient::connect(gw.addr, "absent").await;
    absent.subscribe("t", json!({})).await;
    absent.close().await;
    consume_and_ack(gw.addr, "head", "t", 200).await.close().await;
    assert!(gw.terminate().success());

    let gw = Process::start(&data, &[]);
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["pull_offset"], 0, "aligned to the absent client: {topics}");
    let before = pulled_events(&gw.base).await;
    let mut heads = Vec::new();
    for i in 0..5 {
        let mut client = TestClient::connect(gw.addr, &format!("head-{i}")).await;
        client.subscribe("t", json!({"from": "latest"})).await;
        heads.push(client);
    }
    let mut head = TestClient::connect(gw.addr, "head").await;
    assert_eq!(head.subscribe("t", json!({})).await["partitions"][0]["from"], 200);
    heads.push(head);
    publish(&gw.base, "t", json!({"partition": 0, "payload": "new"})).await;
    for client in &mut heads {
        assert_eq!(client.recv_type("event").await["offset"], 200);
    }
    let pulled = pulled_events(&gw.base).await - before;
    assert!(pulled <= 1.0, "{pulled} events pulled to deliver one new event");
    // The absent client still gets everything from its offset, read by offset.
    let mut absent = TestClient::connect(gw.addr, "absent").await;
    assert_eq!(absent.subscribe("t", json!({})).await["partitions"][0]["from"], 0);
    let offsets: Vec<u64> = absent.recv_events(201).await.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, (0..201).collect::<Vec<u64>>());
    drop(heads);
    assert!(gw.terminate().success());
}
