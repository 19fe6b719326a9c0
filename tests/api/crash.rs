//! The real binary killed with SIGKILL in the middle of a stream of 10,000 events, then started
//! again: every event reaches every client, committed offsets never move backwards.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

const EVENTS: u64 = 10_000;
const PARTITIONS: u32 = 2;
const CLIENTS: [&str; 2] = ["crash-a", "crash-b"];

/// Committed offset of every (client, partition) from the admin route.
async fn committed(base: &str) -> BTreeMap<(String, u64), u64> {
    let (status, body) = get_json(&format!("{base}/admin/offsets?topic=stream")).await;
    assert_eq!(status, 200);
    body["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| ((r["client_id"].as_str().unwrap().to_string(), r["partition"].as_u64().unwrap()), r["committed"].as_u64().unwrap()))
        .collect()
}

fn assert_not_behind(now: &BTreeMap<(String, u64), u64>, before: &BTreeMap<(String, u64), u64>) {
    for (key, old) in before {
        let new = now.get(key).copied().unwrap_or(0);
        assert!(new >= *old, "committed offset of {key:?} moved back from {old} to {new}");
    }
}

/// Receives and acks until every client has seen `until` events in total (or the socket dies).
async fn consume(addr: std::net::SocketAddr, client_id: &str, seen: &mut BTreeSet<u64>, until: usize) {
    let mut client = TestClient::connect(addr, client_id).await;
    client.subscribe("stream", json!({})).await;
    while seen.len() < until {
        let event: Value = client.recv_type("event").await;
        seen.insert(event["payload"]["n"].as_u64().unwrap());
        client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    client.close().await;
}

/// Rounds of the embedded-log crash test in one run (`ACKGATE_DEV_CRASH_ROUNDS` overrides).
const CRASH_ROUNDS: usize = 20;

/// The same crash, 20 times in a row on one build, each round killing the process at another
/// point of the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing_and_never_moves_offsets_back() {
    let rounds = std::env::var("ACKGATE_DEV_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(CRASH_ROUNDS);
    for round in 0..rounds {
        eprintln!("crash round {} of {rounds}", round + 1);
        sigkill_mid_stream_at(&[], 300 + 97 * round).await;
    }
}

/// The body, for any backend: `env` configures the gateway process (the Kafka suite passes its
/// broker).
pub async fn sigkill_mid_stream(env: &[(&str, &str)]) {
    sigkill_mid_stream_at(env, 300).await;
}

/// One crash: the process is killed after the last client has acked `acks_before_kill` more
/// events (the acks of the last ones are still in flight).
async fn sigkill_mid_stream_at(env: &[(&str, &str)], acks_before_kill: usize) {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, env);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "stream", "partitions": PARTITIONS})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let half = EVENTS / 2;
    for chunk in (0..half).collect::<Vec<_>>().chunks(500) {
        let events: Vec<Value> = chunk.iter().map(|n| json!({"key": format!("k{n}"), "payload": {"n": n}})).collect();
        publish(&gw.base, "stream", json!({ "events": events })).await;
    }
    let mut seen: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); CLIENTS.len()];
    // Each client consumes part of the stream; the process dies while acks are in flight.
    for (i, name) in CLIENTS.iter().enumerate() {
        consume(gw.addr, name, &mut seen[i], 2_000 + 1_000 * i).await;
    }
    let mut client = TestClient::connect(gw.addr, "crash-a").await;
    client.subscribe("stream", json!({})).await;
    for _ in 0..acks_before_kill {
        let event = client.recv_type("event").await;
        seen[0].insert(event["payload"]["n"].as_u64().unwrap());
        client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    let before = committed(&gw.base).await;
    assert!(before.values().any(|c| *c > 0), "some progress was committed before the crash");
    gw.kill9();

    let gw = Process::start(&data, env);
    let after_restart = committed(&gw.base).await;
    assert_not_behind(&after_restart, &before);
    for chunk in (half..EVENTS).collect::<Vec<_>>().chunks(500) {
        let events: Vec<Value> = chunk.iter().map(|n| json!({"key": format!("k{n}"), "payload": {"n": n}})).collect();
        publish(&gw.base, "stream", json!({ "events": events })).await;
    }
    for (i, name) in CLIENTS.iter().enumerate() {
        consume(gw.addr, name, &mut seen[i], EVENTS as usize).await;
    }
    let all: BTreeSet<u64> = (0..EVENTS).collect();
    for (i, name) in CLIENTS.iter().enumerate() {
        assert_eq!(seen[i], all, "{name} received every event");
    }
    // Every acknowledgement reached the store: committed equals log end everywhere.
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let mut done = false;
    for _ in 0..100 {
        let now = committed(&gw.base).await;
        assert_not_behind(&now, &after_restart);
        done = CLIENTS.iter().all(|c| {
            (0..PARTITIONS as u64).all(|p| now.get(&(c.to_string(), p)) == topics["topics"][0]["partitions"][p as usize]["log_end"].as_u64().as_ref())
        });
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "committed offsets reach log end: {:?} vs {topics}", committed(&gw.base).await);
    let status = gw.terminate();
    assert!(status.success(), "SIGTERM ends the gateway cleanly: {status:?}");
}

/// What one client saw before a crash: every offset received (of the one partition).
type Received = std::sync::Arc<std::sync::Mutex<BTreeSet<u64>>>;

/// Publishes numbered events in small batches until `stop`, or until the gateway is gone.
async fn publish_until(base: String, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let events: Vec<Value> = (n..n + 20).map(|i| json!({"payload": {"n": i}})).collect();
        let sent = http().post(format!("{base}/topics/stream/events")).json(&json!({ "events": events })).send().await;
        if !sent.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        n += 20;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Acks every event at once but one in 37, whose ack waits for the next such event: a gap is
/// open at any moment, and acks arrive out of order. Runs until the gateway is gone.
async fn ack_with_a_gap_open(addr: std::net::SocketAddr, received: Received) {
    let Some(mut client) = TestClient::try_connect(addr, "gappy").await else { return };
    if !client.try_send(json!({"op": "subscribe", "topic": "stream"})).await {
        return;
    }
    let mut held: Option<Value> = None;
    while let Some(frame) = client.try_recv(Duration::from_secs(30)).await {
        if frame["type"] != "event" {
            continue;
        }
        received.lock().unwrap().insert(frame["offset"].as_u64().unwrap());
        let ack = if frame["offset"].as_u64().unwrap() % 37 == 5 { held.replace(frame["delivery_id"].clone()) } else { Some(frame["delivery_id"].clone()) };
        if let Some(id) = ack {
            if !client.try_send(json!({"op": "ack", "delivery_id": id})).await {
                return;
            }
        }
    }
}

/// Acks in order, closing and opening its session every 150 to 400 ms. Runs until the gateway
/// is gone.
async fn ack_and_reconnect(addr: std::net::SocketAddr, received: Received) {
    for session in 0u64.. {
        let Some(mut client) = TestClient::try_connect(addr, "restless").await else { return };
        if !client.try_send(json!({"op": "subscribe", "topic": "stream"})).await {
            return;
        }
        let until = tokio::time::Instant::now() + Duration::from_millis(150 + 50 * (session % 6));
        while let Ok(frame) = tokio::time::timeout_at(until, client.try_recv(Duration::from_secs(30))).await {
            let Some(frame) = frame else { return };
            if frame["type"] == "event" {
                received.lock().unwrap().insert(frame["offset"].as_u64().unwrap());
                if !client.try_send(json!({"op": "ack", "delivery_id": frame["delivery_id"]})).await {
                    return;
                }
            }
        }
        client.close().await;
    }
}

/// Issue 21: the SIGKILL loop with traffic that overlaps in time. A publisher runs while two
/// clients read one partition, one acking out of order with a gap always open, the other
/// reconnecting every few hundred ms; the process is killed in the middle. After each restart:
/// no committed offset moved back, every offset below a client's committed offset was received by
/// that client, and a new session of each starts at its committed offset and gets every event
/// from there to the log end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_overlapping_traffic_loses_nothing() {
    let rounds = std::env::var("ACKGATE_DEV_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(CRASH_ROUNDS);
    for round in 0..rounds {
        eprintln!("overlapping crash round {} of {rounds}", round + 1);
        sigkill_with_overlapping_traffic(&[], Duration::from_millis(400 + 53 * round as u64)).await;
    }
}

async fn sigkill_with_overlapping_traffic(env: &[(&str, &str)], run_for: Duration) {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, env);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "stream", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = tokio::spawn(publish_until(gw.base.clone(), stop.clone()));
    let (gappy, restless): (Received, Received) = Default::default();
    let clients = [tokio::spawn(ack_with_a_gap_open(gw.addr, gappy.clone())), tokio::spawn(ack_and_reconnect(gw.addr, restless.clone()))];
    tokio::time::sleep(run_for).await;
    let before = committed(&gw.base).await;
    gw.kill9();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    publisher.await.unwrap();
    for client in clients {
        client.await.unwrap();
    }

    let gw = Process::start(&data, env);
    let after = committed(&gw.base).await;
    assert_not_behind(&after, &before);
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let log_end = topics["topics"][0]["partitions"][0]["log_end"].as_u64().unwrap();
    for (name, received) in [("gappy", &gappy), ("restless", &restless)] {
        let committed = after.get(&(name.to_string(), 0)).copied().unwrap_or(0);
        let received = received.lock().unwrap().clone();
        if let Some(missing) = (0..committed).find(|o| !received.contains(o)) {
            panic!("{name}: committed {committed}, but offset {missing} was never received");
        }
        // A new session starts at the committed offset and delivers every offset from there.
        let mut client = TestClient::connect(gw.addr, name).await;
        assert_eq!(client.subscribe("stream", json!({})).await["partitions"][0]["from"], committed, "{name}");
        let mut next = committed;
        while next < log_end {
            let event = client.recv_type("event").await;
            assert_eq!(event["offset"], next, "{name} after the restart");
            client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
            next += 1;
        }
        client.close().await;
    }
    assert!(gw.terminate().success());
}

/// A confirmed ack (`ack` with `req`) is durable when `ack_ok` says so: killed right after it,
/// the gateway comes back with the committed offset at least where `ack_ok` put it (issue 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_ack_survives_sigkill() {
    confirmed_ack_survives_sigkill(&[]).await;
}

/// The body, for any backend (the Kafka suite passes its broker).
pub async fn confirmed_ack_survives_sigkill(env: &[(&str, &str)]) {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, env);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "confirmed", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    publish_numbered(&gw.base, "confirmed", 1, 0, 50).await;
    let mut client = TestClient::connect(gw.addr, "sure").await;
    client.subscribe("confirmed", json!({})).await;
    let events = client.recv_events(50).await;
    // Plain acks for the first 40 (batched, not yet confirmed), then a confirmed one for 40..45.
    for event in &events[..40] {
        client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    let confirmed = client.ack_confirmed(&ids(&events[40..45]), "sure").await;
    let promised = confirmed["committed"]["confirmed"]["0"].as_u64().unwrap();
    assert_eq!(promised, 45, "{confirmed}");
    gw.kill9();
    let gw = Process::start(&data, env);
    let row = stored_offset(&gw.base, "confirmed", "sure", 0).await.expect("a stored offset");
    assert!(row["committed"].as_u64().unwrap() >= promised, "ack_ok said {promised}; after SIGKILL the store says {row}");
    drop(client);
    assert!(gw.terminate().success());
}

/// Boot alignment observed where it matters, after a crash: the periodic checkpoint holds the
/// pull cursor past what the client acknowledged (it pulled 20, acked 5). After SIGKILL the
/// shared cursor starts at the committed offset 5, not at the checkpoint's 20, and the shared
/// reader pulls 5..19 again for the client, in order, without a skip. Without alignment the
/// cursor came back at 20 (issue 21).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_the_pull_cursor_restarts_at_the_committed_offset() {
    let (_dir, data) = temp_dir();
    let env = [("ACKGATE_OFFSETS__CHECKPOINT_INTERVAL_MS", "50")];
    let gw = Process::start(&data, &env);
    publish_numbered(&gw.base, "t", 1, 0, 20).await;
    let mut client = TestClient::connect(gw.addr, "c").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(20).await;
    client.ack_confirmed(&ids(&events[..5]), "five").await;
    let checkpoint = data.join("pull-offsets.properties");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&checkpoint).is_ok_and(|f| f.lines().any(|l| l == "t#0=20")) {
        assert!(started.elapsed() < WAIT, "the checkpoint never held the pull cursor at 20");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.kill9();
    let gw = Process::start(&data, &env);
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["pull_offset"], 5, "{topics}");
    let mut client = TestClient::connect(gw.addr, "c").await;
    assert_eq!(client.subscribe("t", json!({})).await["partitions"][0]["from"], 5);
    let again: Vec<u64> = client.recv_events(15).await.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(again, (5..20).collect::<Vec<u64>>());
    // Served by the shared reader: its cursor moved past them.
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["pull_offset"], 20, "{topics}");
    drop(client);
    assert!(gw.terminate().success());
}

/// Issue 39's SIGKILL loop with operator resets and resume tokens in use: a client that always
/// comes back with the newest token it holds (as the JS client does), an operator who rewinds it
/// while it is away, and the process killed with acks in flight and again right after each
/// reset. Every round: a reset stands across the crash (the stored offset is what it set, and the
/// client's older token does not undo it), delivery starts exactly there, and a committed
/// offset never moves back except by a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_operator_resets_and_tokens_keeps_every_rewind() {
    let rounds = std::env::var("ACKGATE_DEV_CRASH_ROUNDS").ok().and_then(|r| r.parse::<u64>().ok()).unwrap_or(CRASH_ROUNDS as u64).min(10);
    let (_dir, data) = temp_dir();
    let mut gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "rewound", 1, 0, 400).await;
    // The newest token the client holds: the offset after the last event it received, and the
    // epoch `subscribed` named then.
    let (mut token, mut token_epoch) = (0u64, 0u64);
    let mut expected_start = 0u64;
    for round in 0..rounds {
        let mut client = TestClient::connect(gw.addr, "holder").await;
        let subscribed = client.subscribe("rewound", json!({"resume": {"0": token}, "epochs": {"0": token_epoch}})).await;
        let start = subscribed["partitions"][0]["from"].as_u64().unwrap();
        assert_eq!(start, expected_start, "round {round}: {subscribed}");
        token_epoch = subscribed["partitions"][0]["epoch"].as_u64().unwrap();
        let events = client.recv_events(20).await;
        assert_eq!(events[0]["offset"].as_u64(), Some(start), "round {round}: delivery starts where the plan said");
        let confirmed = client.ack_confirmed(&ids(&events[..15]), "c").await;
        let committed = confirmed["committed"]["rewound"]["0"].as_u64().unwrap();
        assert_eq!(committed, start + 15);
        // Acks of the last five go out unconfirmed; the process dies with them in flight.
        client.send(json!({"op": "ack", "delivery_ids": ids(&events[15..])})).await;
        token = events[19]["offset"].as_u64().unwrap() + 1;
        gw.kill9();
        gw = Process::start(&data, &[]);
        let after_crash = stored_offset(&gw.base, "rewound", "holder", 0).await.unwrap()["committed"].as_u64().unwrap();
        assert!((committed..=token).contains(&after_crash), "round {round}: {after_crash} not within {committed}..={token}");
        // The operator rewinds the client while it is away, and the process dies right after.
        let rewind_to = after_crash.saturating_sub(5 + 7 * round % 13);
        assert_eq!(put_offset(&gw.base, "rewound", "holder", 0, json!(rewind_to)).await, 200, "round {round}");
        gw.kill9();
        gw = Process::start(&data, &[]);
        let stored = stored_offset(&gw.base, "rewound", "holder", 0).await.unwrap();
        assert_eq!(stored["committed"].as_u64(), Some(rewind_to), "round {round}: the reset stands across the crash: {stored}");
        expected_start = rewind_to;
    }
    let status = gw.terminate();
    assert!(status.success(), "{status:?}");
}
