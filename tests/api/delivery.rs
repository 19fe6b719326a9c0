//! The delivery loop and its rules: ack floors, redelivery, dead letters, windows, start points.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn publish_receive_ack_moves_the_committed_offset_to_log_end() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "orders", 1, 0, 3).await;
    let mut client = TestClient::connect(gw.addr(), "alice").await;
    assert_eq!(client.welcome["client_id"], "alice");
    assert_eq!(client.welcome["max_in_flight"], 1000);
    let subscribed = client.subscribe("orders", json!({})).await;
    assert_eq!(subscribed["partitions"], json!([{"partition": 0, "from": 0, "epoch": 0}]));
    let events = client.recv_events(3).await;
    let offsets: Vec<u64> = events.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![0, 1, 2], "first deliveries go out in offset order");
    assert_eq!(events[1]["payload"], json!({"n": 1}));
    assert_eq!((events[0]["attempt"].as_u64(), events[0]["topic"].as_str()), (Some(1), Some("orders")));
    let ids = ids(&events);
    let ok = client.ack_confirmed(&ids, "a1").await;
    assert_eq!(ok["type"], "ack_ok");
    assert_eq!(ok["committed"], json!({"orders": {"0": 3}}));
    let row = stored_offset(&gw.base, "orders", "alice", 0).await.unwrap();
    assert_eq!((row["committed"].as_u64(), row["last_acked"].as_u64()), (Some(3), Some(2)));
    assert_eq!(row["key"], "orders#alice#0");
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["log_end"], 3);
    // Acking again is a no-op success.
    let again = client.ack_confirmed(&[ids[0]], "a2").await;
    assert_eq!(again["committed"], json!({"orders": {"0": 3}}));
    client.close().await;
    gw.stop().await;
}

#[tokio::test]
async fn out_of_order_acks_keep_the_floor_until_the_gap_closes() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "c1").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(10).await;
    let later = ids(&events[1..]);
    let ok = client.ack_confirmed(&later, "r1").await;
    assert_eq!(ok["committed"], json!({"t": {"0": 0}}));
    let row = stored_offset(&gw.base, "t", "c1", 0).await.unwrap();
    assert_eq!((row["committed"].as_u64(), row["last_acked"].as_u64()), (Some(0), Some(9)));
    let ok = client.ack_confirmed(&[id(&events[0])], "r2").await;
    assert_eq!(ok["committed"], json!({"t": {"0": 10}}));
    assert_eq!(stored_offset(&gw.base, "t", "c1", 0).await.unwrap()["committed"], 10);
    gw.stop().await;
}

#[tokio::test]
async fn fan_out_delivers_every_event_to_every_client() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "fan", 2, 0, 20).await;
    publish(&gw.base, "fan", json!({"events": (0..20).map(|i| json!({"partition": 1, "payload": i})).collect::<Vec<_>>()})).await;
    for name in ["a", "b"] {
        let mut client = TestClient::connect(gw.addr(), name).await;
        client.subscribe("fan", json!({})).await;
        let events = client.recv_events(40).await;
        let seen: BTreeSet<(u64, u64)> = events.iter().map(|e| (e["partition"].as_u64().unwrap(), e["offset"].as_u64().unwrap())).collect();
        assert_eq!(seen.len(), 40, "{name} got every event once");
        let ids = ids(&events);
        let ok = client.ack_confirmed(&ids, "all").await;
        assert_eq!(ok["committed"], json!({"fan": {"0": 20, "1": 20}}));
        client.close().await;
    }
    gw.stop().await;
}

#[tokio::test]
async fn unacked_events_are_redelivered_after_the_timeout_and_late_acks_count() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.ack_timeout_ms = 1000;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let mut client = TestClient::connect(gw.addr(), "slow").await;
    client.subscribe("t", json!({})).await;
    let first = client.recv_type("event").await;
    let second = client.recv_type("event").await;
    assert_eq!((second["offset"].as_u64(), second["attempt"].as_u64()), (Some(0), Some(2)));
    assert_ne!(first["delivery_id"], second["delivery_id"], "a redelivery gets a new id");
    // The superseded id of a still-unacknowledged event counts.
    let ok = client.ack_confirmed(&[id(&first)], "late").await;
    assert_eq!(ok["committed"], json!({"t": {"0": 1}}));
    client.expect_silence(Duration::from_millis(700)).await;
    gw.stop().await;
}

#[tokio::test]
async fn nack_redelivers_and_term_and_max_attempts_make_dead_letters() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.ack_timeout_ms = 1000;
    config.delivery.max_attempts = 2;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(3).await;
    // 0: nack -> redelivered at once with attempt 2, then acked.
    client.send(json!({"op": "nack", "delivery_id": id(&events[0])})).await;
    // 1: term -> dead letter with the reason, counts as acknowledged.
    client.send(json!({"op": "term", "delivery_id": id(&events[1]), "reason": "poison"})).await;
    // 2: never acked -> after 2 attempts a dead letter.
    let mut redelivered = None;
    let mut attempts_of_2 = 1;
    while redelivered.is_none() || attempts_of_2 < 2 {
        let e = client.recv_type("event").await;
        match e["offset"].as_u64() {
            Some(0) => {
                client.send(json!({"op": "ack", "delivery_id": id(&e)})).await;
                redelivered = Some(e);
            }
            Some(2) => attempts_of_2 = e["attempt"].as_u64().unwrap(),
            other => panic!("unexpected redelivery of {other:?}"),
        }
    }
    assert_eq!(redelivered.unwrap()["attempt"], 2);
    let mut committed = 0;
    for _ in 0..50 {
        committed = stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"].as_u64().unwrap();
        if committed == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(committed, 3, "dead letters count as acknowledged");
    let (_, dead) = get_json(&format!("{}/admin/dead-letters?topic=t", gw.base)).await;
    let dead: Vec<(u64, String, u64)> = dead["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["offset"].as_u64().unwrap(), d["reason"].as_str().unwrap().to_string(), d["attempts"].as_u64().unwrap()))
        .collect();
    assert_eq!(dead, vec![(1, "poison".to_string(), 1), (2, "max_attempts".to_string(), 2)]);
    // Deleting the topic takes its offsets and dead letters with it.
    client.close().await;
    let mut deleted = None;
    for _ in 0..50 {
        let response = http().delete(format!("{}/topics/t", gw.base)).send().await.unwrap();
        if response.status() == 200 {
            deleted = Some(response.json::<serde_json::Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // until the session has ended
    }
    let deleted = deleted.expect("the topic is deleted once no session subscribes");
    assert_eq!((deleted["offsets_deleted"].as_u64(), deleted["dead_letters_deleted"].as_u64()), (Some(1), Some(2)));
    let (_, dead) = get_json(&format!("{}/admin/dead-letters", gw.base)).await;
    assert_eq!(dead["dead_letters"], json!([]));
    gw.stop().await;
}

#[tokio::test]
async fn extend_keeps_a_delivery_from_being_redelivered() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.ack_timeout_ms = 1500;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let event = client.recv_type("event").await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.send(json!({"op": "extend", "delivery_id": id(&event)})).await;
    }
    // 2.4 s after delivery, far past the 1.5 s timeout, it still was not redelivered.
    client.send(json!({"op": "ping", "req": 1})).await;
    let next = client.recv().await;
    assert_eq!(next["type"], "pong", "no redelivery while extended, got {next}");
    gw.stop().await;
}

#[tokio::test]
async fn a_full_window_stops_pushing_until_acks_arrive() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight = 3;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "w").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(3).await;
    client.expect_silence(Duration::from_millis(800)).await;
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    let session = &sessions["sessions"][0];
    assert_eq!((session["in_flight"].as_u64(), session["window_full"].as_bool()), (Some(3), Some(true)));
    assert_eq!((session["client_id"].as_str(), session["subscriptions"].clone()), (Some("w"), json!(["t"])));
    let (status, detail) = get_json(&format!("{}/admin/sessions/{}", gw.base, session["session_id"].as_str().unwrap())).await;
    assert_eq!(status, 200);
    let deliveries = detail["deliveries"].as_array().unwrap();
    let listed: Vec<(&str, u64, u64)> =
        deliveries.iter().map(|d| (d["delivery_id"].as_str().unwrap(), d["offset"].as_u64().unwrap(), d["attempt"].as_u64().unwrap())).collect();
    let expected: Vec<(&str, u64, u64)> = events.iter().map(|e| (id(e), e["offset"].as_u64().unwrap(), 1)).collect();
    assert_eq!(listed, expected);
    assert!(deliveries.iter().all(|d| d["deadline"].as_u64().unwrap() > session["connected_at"].as_u64().unwrap()));
    client.send(json!({"op": "ack", "delivery_id": id(&events[0])})).await;
    let next = client.recv_type("event").await;
    assert_eq!(next["offset"], 3);
    client.expect_silence(Duration::from_millis(300)).await;
    gw.stop().await;
}

#[tokio::test]
async fn start_points_follow_from_resume_and_committed() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    let mut latest = TestClient::connect(gw.addr(), "latest").await;
    let sub = latest.subscribe("t", json!({"from": "latest"})).await;
    assert_eq!(sub["partitions"][0]["from"], 5);
    let mut resumed = TestClient::connect(gw.addr(), "resumed").await;
    let sub = resumed.subscribe("t", json!({"resume": {"0": 3}})).await;
    // A claim (the older map) with no stored offset to be clamped to is not applied (issue 55):
    // the reset policy starts it, and `subscribed` says so.
    assert_eq!((sub["partitions"][0]["from"].as_u64(), sub["resume"].as_str()), (Some(0), Some("refused")), "{sub}");
    assert_eq!(resumed.recv_type("event").await["offset"], 0);
    publish(&gw.base, "t", json!({"partition": 0, "payload": "new"})).await;
    let e = latest.recv_type("event").await;
    assert_eq!((e["offset"].as_u64(), e["payload"].as_str()), (Some(5), Some("new")));
    // Starting above the stored offset moves the committed offset there.
    assert_eq!(stored_offset(&gw.base, "t", "latest", 0).await.unwrap()["committed"], 5);
    // A resume token below the stored committed offset does not move it back.
    latest.close().await;
    let mut again = TestClient::connect(gw.addr(), "latest").await;
    let sub = again.subscribe("t", json!({"resume": {"0": 1}})).await;
    assert_eq!(sub["partitions"][0]["from"], 5);
    gw.stop().await;
}

#[tokio::test]
async fn resubscribing_redelivers_only_unacknowledged_events() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(5).await;
    let later = ids(&events[1..]);
    client.ack_confirmed(&later, "x").await;
    client.send(json!({"op": "unsubscribe", "topic": "t", "req": "u"})).await;
    assert_eq!(client.recv_type("unsubscribed").await["req"], "u");
    client.subscribe("t", json!({})).await;
    let again = client.recv_type("event").await;
    assert_eq!((again["offset"].as_u64(), again["attempt"].as_u64()), (Some(0), Some(2)));
    client.expect_silence(Duration::from_millis(500)).await;
    gw.stop().await;
}

#[tokio::test]
async fn a_slow_client_does_not_hold_back_a_fast_one() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.reader_buffer_events = 8;
    config.delivery.fetch_batch = 4;
    config.delivery.max_in_flight = 2;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 0).await;
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe("t", json!({})).await;
    let mut fast = TestClient::connect(gw.addr(), "fast").await;
    fast.subscribe("t", json!({})).await;
    publish(&gw.base, "t", json!({"events": (0..100).map(|i| json!({"payload": i})).collect::<Vec<_>>()})).await;
    for expected in 0..100u64 {
        let e = fast.recv_type("event").await;
        assert_eq!(e["offset"], expected);
        fast.send(json!({"op": "ack", "delivery_id": id(&e)})).await;
    }
    // The slow client got its window's worth and waits; then it catches up from the log.
    let held = slow.recv_events(2).await;
    slow.expect_silence(Duration::from_millis(300)).await;
    let ids = ids(&held);
    slow.ack_confirmed(&ids, "s").await;
    let mut next = 2;
    while next < 100 {
        let e = slow.recv_type("event").await;
        assert_eq!(e["offset"], next);
        next += 1;
        slow.send(json!({"op": "ack", "delivery_id": id(&e)})).await;
    }
    gw.stop().await;
}

#[tokio::test]
async fn takeover_closes_the_old_session_and_hands_in_flight_events_over() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    let mut old = TestClient::connect(gw.addr(), "same").await;
    old.subscribe("t", json!({})).await;
    old.recv_events(2).await;
    let mut new = TestClient::connect(gw.addr(), "same").await;
    assert_eq!(old.close_code().await, 4001);
    new.subscribe("t", json!({})).await;
    let events = new.recv_events(2).await;
    assert!(events.iter().all(|e| e["attempt"] == 2), "attempts count across sessions: {events:?}");
    let ids = ids(&events);
    assert_eq!(new.ack_confirmed(&ids, "k").await["committed"], json!({"t": {"0": 2}}));
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 1);
    gw.stop().await;
}

/// 4003 means "no ack progress", not "busy" (issue 21): a client behind a backlog keeps its
/// window full the whole time, yet acks steadily, and must never be closed; one that stops
/// acking is. Failed before the fix: the first client was closed with 4003 after about
/// `slow_client_timeout_ms` although it never stopped acking.
#[tokio::test]
async fn a_client_acking_steadily_behind_a_backlog_is_never_slow() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight = 10;
    config.delivery.slow_client_timeout_ms = 1000;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 300).await;
    let mut steady = TestClient::connect(gw.addr(), "steady").await;
    steady.subscribe("t", json!({})).await;
    // About 10 ms per ack: 300 events take about 3 s, three times the slow-client limit, with
    // the window full at every moment (a backlog of hundreds behind it).
    for expected in 0..300u64 {
        let e = steady.recv_type("event").await;
        assert_eq!(e["offset"], expected, "every event in order, no close in between");
        tokio::time::sleep(Duration::from_millis(10)).await;
        if expected < 299 {
            steady.send(json!({"op": "ack", "delivery_id": id(&e)})).await;
        } else {
            let ok = steady.ack_confirmed(&[id(&e)], "last").await;
            assert_eq!(ok["committed"], json!({"t": {"0": 300}}));
        }
    }

    // A client that stops acking with a full window is closed with 4003.
    let mut stalled = TestClient::connect(gw.addr(), "stalled").await;
    stalled.subscribe("t", json!({})).await;
    let first = stalled.recv_events(10).await;
    stalled.send(json!({"op": "ack", "delivery_ids": ids(&first[..5])})).await;
    assert_eq!(stalled.close_code().await, 4003);
    gw.stop().await;
}

/// Issue 21, item 10: a re-subscribe that fails (here a resume token naming a partition the topic
/// does not have) must leave the running subscription alone. Failed before the fix: the old
/// subscription had already been dropped, and the next event never came.
#[tokio::test]
async fn a_failed_resubscribe_keeps_the_running_subscription() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let first = client.recv_type("event").await;
    client.send(json!({"op": "subscribe", "topic": "t", "resume": {"99": 0}, "req": "again"})).await;
    let refused = client.recv_type("error").await;
    assert_eq!((refused["code"].as_str(), refused["req"].as_str()), (Some("bad_frame"), Some("again")));
    publish(&gw.base, "t", json!({"partition": 0, "payload": {"n": 1}})).await;
    let next = client.recv_type("event").await;
    assert_eq!(next["offset"], 1, "the subscription runs on");
    assert_eq!(client.ack_confirmed(&[id(&first), id(&next)], "both").await["committed"], json!({"t": {"0": 2}}));
    gw.stop().await;
}

/// Issue 21, item 8: partitions added to a topic reach its live subscriptions, from their log
/// start, and a client that subscribed before they were added is not skipped past them by
/// `reset_policy = latest` when it comes back. Failed before the fix (the watch disabled): the
/// event on the new partition never reached the live session, and the returning client started
/// the new partition at its log end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_to_a_topic_reach_its_subscribers() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.reset_policy = ackgate::config::ResetPolicy::Latest;
    let gw = InProcess::start(config).await;
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "grows", "partitions": 2})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let mut live = TestClient::connect(gw.addr(), "live").await;
    live.subscribe("grows", json!({})).await;
    let mut away = TestClient::connect(gw.addr(), "away").await;
    away.subscribe("grows", json!({})).await;
    away.close().await;
    let topic = ackgate::core::names::TopicName::parse("grows").unwrap();
    assert!(gw.handle.dispatcher.backend.add_partitions(&topic, 4).await.unwrap());
    // Published at once, before any session can know of partition 3.
    publish(&gw.base, "grows", json!({"partition": 3, "payload": "on the new partition"})).await;
    let event = live.recv_type("event").await;
    assert_eq!((event["partition"].as_u64(), event["offset"].as_u64()), (Some(3), Some(0)), "{event}");
    live.ack_confirmed(&[id(&event)], "a").await;
    let mut back = TestClient::connect(gw.addr(), "away").await;
    let sub = back.subscribe("grows", json!({})).await;
    assert_eq!(sub["partitions"][3]["from"], 0, "not skipped to the log end: {sub}");
    assert_eq!(back.recv_type("event").await["partition"], 3);
    gw.stop().await;
}

/// Issue 25, gaps mid-session: a subscriber whose catch-up read falls behind log retention gets a
/// `gap` frame (`from`..`to`-1 are gone) before the events after it, and the admin view lists it.
/// The ring holds one event, so the read after the window frees up goes to the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_read_behind_retention_gets_a_gap_frame() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.embedded.retention_check_interval_ms = 100;
    config.embedded.retention_secs = 3600;
    config.delivery.max_in_flight = 2;
    config.delivery.reader_buffer_events = 1;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let clock = std::sync::Arc::new(ackgate::core::clock::ManualClock::new(now));
    let gw = InProcess::start_with_clock(config, clock.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 10).await;
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe("t", json!({})).await;
    let first = slow.recv_events(2).await;
    clock.advance(3_601_000);
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    for _ in 0..100 {
        if get_json(&format!("{}/topics", gw.base)).await.1["topics"][0]["partitions"][0]["log_start"] == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for event in &first {
        slow.send(json!({"op": "ack", "delivery_id": id(event)})).await;
    }
    let gap = slow.recv_type("gap").await;
    assert_eq!(gap, json!({"type": "gap", "topic": "t", "partition": 0, "from": 2, "to": 10}));
    let after = slow.recv_events(2).await;
    assert_eq!(after.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), vec![10, 11]);
    let mut listed = json!(null);
    for _ in 0..100 {
        listed = get_json(&format!("{}/admin/gaps?client_id=slow", gw.base)).await.1;
        if listed["gaps"].as_array().is_some_and(|g| !g.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((listed["gaps"][0]["from"].as_u64(), listed["gaps"][0]["to"].as_u64()), (Some(2), Some(10)), "{listed}");
    gw.stop().await;
}

/// The in-flight deliveries of the session `welcome` names, from the admin view.
/// Issue 61 item 1: a chat room or a dashboard subscribes before anything was published. On a
/// fresh gateway `subscribe` answered `unknown_topic` (topics existed only after a first publish),
/// so the quickstart failed. Now a first subscribe creates the topic where a publish by the same
/// session would (the embedded log, `embedded.auto_create_topics`, the session's publish rights),
/// within `limits.max_topics`; a subscribe with a resume token, or to a topic an operator deleted
/// (a client coming back to it), does not, and neither does a session that may not publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_subscribe_creates_its_topic_where_a_publish_would() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_topics = 1;
    let gw = InProcess::start(config).await;
    let mut client = TestClient::connect(gw.addr(), "early").await;
    let subscribed = client.subscribe("room", json!({})).await;
    let partitions: Vec<(u64, u64)> =
        subscribed["partitions"].as_array().unwrap().iter().map(|p| (p["partition"].as_u64().unwrap(), p["from"].as_u64().unwrap())).collect();
    assert_eq!(partitions, (0..4).map(|p| (p, 0)).collect::<Vec<_>>(), "embedded.default_partitions, from their start: {subscribed}");
    publish(&gw.base, "room", json!({"partition": 2, "payload": {"hello": 1}})).await;
    let [event] = client.recv_events(1).await.try_into().unwrap();
    assert_eq!((event["topic"].as_str(), event["partition"].as_u64(), event["payload"].clone()), (Some("room"), Some(2), json!({"hello": 1})));
    // With a resume token it is a client coming back: no topic comes back with it.
    client.send(json!({"op": "subscribe", "topic": "deleted", "resume": "r1.bm90LWEtdG9rZW4", "req": "back"})).await;
    let refused = client.recv_type("error").await;
    assert_eq!((refused["code"].as_str(), refused["req"].as_str()), (Some("unknown_topic"), Some("back")), "{refused}");
    // Nor does a subscribe without a token to a topic an operator deleted.
    client.send(json!({"op": "unsubscribe", "topic": "room"})).await;
    client.recv_type("unsubscribed").await;
    let mut deleted = 0;
    for _ in 0..100 {
        deleted = http().delete(format!("{}/topics/room", gw.base)).send().await.unwrap().status().as_u16();
        if deleted != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(deleted, 200);
    client.send(json!({"op": "subscribe", "topic": "room", "req": "again"})).await;
    let refused = client.recv_type("error").await;
    assert_eq!((refused["code"].as_str(), refused["req"].as_str()), (Some("unknown_topic"), Some("again")), "{refused}");
    // Within limits.max_topics (1).
    client.subscribe("second", json!({})).await;
    client.send(json!({"op": "subscribe", "topic": "third", "req": "over"})).await;
    let refused = client.recv_type("error").await;
    assert_eq!((refused["code"].as_str(), refused["req"].as_str()), (Some("limit_exceeded"), Some("over")), "{refused}");
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let names: BTreeSet<&str> = topics["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["second"]));
    gw.stop().await;

    // With the admin token set, sessions do not publish (REST with the token does): nor create.
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.admin_token = "a".repeat(32);
    let gw = InProcess::start(config).await;
    let mut client = TestClient::connect(gw.addr(), "early").await;
    client.send(json!({"op": "subscribe", "topic": "room", "req": "s"})).await;
    assert_eq!(client.recv_type("error").await["code"], "unknown_topic");
    gw.stop().await;
}

async fn in_flight_of(base: &str, welcome: &serde_json::Value) -> Vec<serde_json::Value> {
    let (status, detail) = get_json(&format!("{base}/admin/sessions/{}", welcome["session_id"].as_str().unwrap())).await;
    assert_eq!(status, 200, "{detail}");
    detail["deliveries"].as_array().unwrap().clone()
}

/// Issue 25, redelivery backoff: after an ack timeout the event waits the pause
/// `delivery.redelivery_backoff_ms` names for its attempt before it comes again (the session view
/// shows the attempt unchanged and when the next comes), and a nack without `delay_ms` waits the
/// same pause. Asserted by order and by lower bounds only: a slow machine can only make the pauses
/// longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_wait_the_backoff_of_their_attempt() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.ack_timeout_ms = 300;
    config.delivery.redelivery_backoff_ms = vec![1500, 2500];
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    let mut client = TestClient::connect(gw.addr(), "backoff").await;
    // Both events are delivered after the subscribe is sent, so event 0 cannot come again before
    // `subscribed_at` + 300 ms (ack timeout) + 1500 ms (first pause): every view that came back
    // before then must show its first attempt. Bounds from this instant hold however slow the
    // machine is.
    let subscribed_at = std::time::Instant::now();
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(2).await;
    let received_at = std::time::Instant::now();
    // Event 1 is acked; event 0 times out, then waits 1500 ms. The ack travels on the socket and
    // the view on HTTP: wait until the session has applied it.
    client.send(json!({"op": "ack", "delivery_id": id(&events[1])})).await;
    let mut views = in_flight_of(&gw.base, &client.welcome).await;
    while views.len() != 1 && subscribed_at.elapsed() < Duration::from_millis(1800) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        views = in_flight_of(&gw.base, &client.welcome).await;
    }
    let no_redelivery_before = Duration::from_millis(300 + 1500);
    let mut seen_waiting = false;
    loop {
        let asked_at = received_at.elapsed();
        let views = in_flight_of(&gw.base, &client.welcome).await;
        if subscribed_at.elapsed() >= no_redelivery_before {
            break;
        }
        assert_eq!(views.len(), 1, "{views:?}");
        assert_eq!(views[0]["attempt"], 1, "not delivered again within the ack timeout and the pause: {views:?}");
        let (deadline, next) = (views[0]["deadline"].as_u64().unwrap(), views[0]["next_attempt_at"].as_u64().unwrap());
        if asked_at > Duration::from_millis(300) {
            // Past the ack timeout (once its timer ran): the deadline is the end of the pause, and
            // so is the next attempt.
            seen_waiting |= deadline == next;
        }
        // Before the timeout the next attempt is the pause after the deadline.
        assert!(next >= deadline + 1500 || deadline == next, "{views:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_waiting, "the session view showed the pause");
    let second = client.recv_type("event").await;
    assert_eq!((second["offset"].as_u64(), second["attempt"].as_u64()), (Some(0), Some(2)));
    assert!(subscribed_at.elapsed() >= no_redelivery_before, "at least the timeout and the first pause: {:?}", subscribed_at.elapsed());
    // A nack without delay_ms waits the pause after attempt 2 (2500 ms, the last one repeats).
    let nacked_at = std::time::Instant::now();
    client.send(json!({"op": "nack", "delivery_id": id(&second)})).await;
    let third = client.recv_type("event").await;
    assert_eq!((third["offset"].as_u64(), third["attempt"].as_u64()), (Some(0), Some(3)));
    assert!(nacked_at.elapsed() >= Duration::from_millis(2500), "the nack waited {:?}", nacked_at.elapsed());
    // A nack with delay_ms waits that instead.
    client.send(json!({"op": "nack", "delivery_id": id(&third), "delay_ms": 0})).await;
    let fourth = client.recv_type("event").await;
    assert_eq!(fourth["attempt"], 4);
    client.ack_confirmed(&[id(&fourth)], "done").await;
    gw.stop().await;
}

/// Issue 25: `[delivery.topics."<pattern>"]` gives a topic its own attempts and ack timeout; the
/// exact name wins over a prefix, and other topics keep `[delivery]`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_pattern_has_its_own_redelivery_rules() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.ack_timeout_ms = 60_000;
    let rules =
        |attempts: u32| ackgate::config::TopicDeliveryConfig { ack_timeout_ms: Some(200), max_attempts: Some(attempts), redelivery_backoff_ms: Some(vec![]) };
    config.delivery.topics.insert("jobs.*".into(), rules(3));
    config.delivery.topics.insert("jobs.once".into(), rules(1));
    let gw = InProcess::start(config).await;
    for topic in ["jobs.once", "jobs.retry", "slow"] {
        publish(&gw.base, topic, json!({"partition": 0, "payload": 1})).await;
    }
    let mut client = TestClient::connect(gw.addr(), "rules").await;
    for topic in ["jobs.once", "jobs.retry", "slow"] {
        // Events of the first subscriptions come in between: read below with the rest.
        client.send(json!({"op": "subscribe", "topic": topic})).await;
    }
    // Never acked: jobs.once is a dead letter after 1 delivery, jobs.retry after 3; slow (60 s
    // timeout) is delivered once meanwhile.
    let mut attempts: std::collections::BTreeMap<String, u64> = Default::default();
    let mut dead = Vec::new();
    for _ in 0..200 {
        while let Some(event) = client.try_recv(Duration::from_millis(10)).await {
            if event["type"] == "event" {
                let topic = event["topic"].as_str().unwrap().to_string();
                let entry = attempts.entry(topic).or_default();
                *entry = (*entry).max(event["attempt"].as_u64().unwrap());
            }
        }
        dead = get_json(&format!("{}/admin/dead-letters?client_id=rules", gw.base)).await.1["dead_letters"].as_array().unwrap().clone();
        if dead.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dead: Vec<(&str, u64)> = dead.iter().map(|d| (d["topic"].as_str().unwrap(), d["attempts"].as_u64().unwrap())).collect();
    assert_eq!(dead, vec![("jobs.once", 1), ("jobs.retry", 3)]);
    assert_eq!(attempts, [("jobs.once".to_string(), 1), ("jobs.retry".to_string(), 3), ("slow".to_string(), 1)].into_iter().collect());
    gw.stop().await;
}

/// Issue 42, item 7 (PROTOCOL.md, `from: {"last": n}`): the last `n` events of each partition,
/// as Ably's rewind and Centrifugo's history give. At most `limits.max_rewind_events` (more is
/// `limit_exceeded`); past the log start it starts there; `0` is the log end; and, as for every
/// start a client names, never below what it acknowledged. Failed before: `{"last": 3}` was a
/// `bad_frame`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_from_the_last_n_events_starts_n_before_the_end() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_rewind_events = 50;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "hist", 2, 0, 10).await;
    publish(&gw.base, "hist", json!({"events": [{"partition": 1, "payload": {"n": 0}}, {"partition": 1, "payload": {"n": 1}}]})).await;

    let mut client = TestClient::connect(gw.addr(), "newcomer").await;
    let subscribed = client.subscribe("hist", json!({"from": {"last": 3}})).await;
    let from: Vec<u64> = subscribed["partitions"].as_array().unwrap().iter().map(|p| p["from"].as_u64().unwrap()).collect();
    assert_eq!(from, [7, 0], "3 before the end of partition 0 (10); partition 1 holds only 2: {subscribed}");
    let mut events = client.recv_events(5).await;
    events.sort_by_key(|e| (e["partition"].as_u64(), e["offset"].as_u64()));
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["partition"].as_u64().unwrap(), e["offset"].as_u64().unwrap())).collect();
    assert_eq!(got, [(0, 7), (0, 8), (0, 9), (1, 0), (1, 1)]);
    client.ack_confirmed(&ids(&events), "a").await;
    client.close().await;

    // Never below what the client acknowledged (10 and 2 now), and 0 is the end.
    let mut client = TestClient::connect(gw.addr(), "newcomer").await;
    let again = client.subscribe("hist", json!({"from": {"last": 40}})).await;
    assert_eq!(again["partitions"][0]["from"], 10, "{again}");
    let mut other = TestClient::connect(gw.addr(), "late").await;
    assert_eq!(other.subscribe("hist", json!({"from": {"last": 0}})).await["partitions"][0]["from"], 10);

    for (last, code) in [(json!(51), "limit_exceeded"), (json!(-1), "bad_frame"), (json!("3"), "bad_frame"), (json!(u64::MAX), "limit_exceeded")] {
        other.send(json!({"op": "subscribe", "topic": "hist", "from": {"last": last}, "req": "x"})).await;
        let refused = other.recv_type("error").await;
        assert_eq!((refused["code"].as_str(), refused["req"].as_str()), (Some(code), Some("x")), "last {last}: {refused}");
    }
    gw.stop().await;
}

/// Issue 42, item 6 (PROTOCOL.md, the `publish` frame): a session publishes as the REST route
/// does and gets `published` with the offsets in the order sent; an `idempotency_key` repeated
/// with the same events answers the first offsets with `replayed`, with other events `conflict`;
/// a bad event is `bad_frame` and writes nothing. Failed before: `publish` was an unknown op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_publishes_with_a_publish_frame() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "talk", 1, 0, 0).await;
    let mut reader = TestClient::connect(gw.addr(), "reader").await;
    reader.subscribe("talk", json!({})).await;
    let mut writer = TestClient::connect(gw.addr(), "writer").await;
    let events = json!([{"payload": {"n": 1}}, {"key": "k", "partition": 0, "headers": {"h": "v"}, "payload": {"n": 2}}]);
    writer.send(json!({"op": "publish", "topic": "talk", "events": events, "req": 1})).await;
    let published = writer.recv().await;
    assert_eq!(published, json!({"type": "published", "req": 1, "offsets": [{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1}]}));
    let got = reader.recv_events(2).await;
    assert_eq!((got[1]["key"].as_str(), got[1]["headers"]["h"].as_str(), got[1]["payload"]["n"].as_u64()), (Some("k"), Some("v"), Some(2)));

    let once = json!({"op": "publish", "topic": "talk", "events": [{"payload": {"n": 3}}], "idempotency_key": "k-3", "req": "a"});
    writer.send(once.clone()).await;
    let first = writer.recv().await;
    assert_eq!(first["offsets"], json!([{"partition": 0, "offset": 2}]), "{first}");
    writer.send(once).await;
    let again = writer.recv().await;
    assert_eq!((again["offsets"].clone(), again["replayed"].clone()), (json!([{"partition": 0, "offset": 2}]), json!(true)), "{again}");
    writer.send(json!({"op": "publish", "topic": "talk", "events": [{"payload": {"n": 4}}], "idempotency_key": "k-3", "req": "b"})).await;
    assert_eq!(writer.recv().await["code"], "conflict");
    for bad in [json!([]), json!([{"nothing": 1}]), json!({"payload": 1})] {
        writer.send(json!({"op": "publish", "topic": "talk", "events": bad, "req": "bad"})).await;
        let refused = writer.recv().await;
        assert_eq!((refused["type"].as_str(), refused["code"].as_str()), (Some("error"), Some("bad_frame")), "{refused}");
    }
    writer.send(json!({"op": "publish", "topic": "no such/topic", "events": [{"payload": 1}], "req": "n"})).await;
    assert_eq!(writer.recv().await["code"], "invalid_name");
    assert_eq!(reader.recv_events(1).await[0]["payload"]["n"], 3, "the replay and the refusals wrote nothing");
    reader.expect_silence(std::time::Duration::from_millis(300)).await;
    gw.stop().await;
}
