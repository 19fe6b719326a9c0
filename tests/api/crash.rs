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
    let mut client = WsClient::connect(addr, client_id).await;
    client.subscribe("stream", json!({})).await;
    while seen.len() < until {
        let event: Value = client.recv_type("event").await;
        seen.insert(event["payload"]["n"].as_u64().unwrap());
        client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    client.close().await;
}

/// Rounds of the embedded-log crash test in one run (`ACKGATE_CRASH_ROUNDS` overrides).
const CRASH_ROUNDS: usize = 20;

/// The same crash, 20 times in a row on one build, each round killing the process at another
/// point of the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_nothing_and_never_moves_offsets_back() {
    let rounds = std::env::var("ACKGATE_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(CRASH_ROUNDS);
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
    let mut client = WsClient::connect(gw.addr, "crash-a").await;
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
