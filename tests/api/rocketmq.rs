//! The RocketMQ backend against rocketmq-rust (a Rust port of RocketMQ's broker, not Apache's):
//! PULL never leaves an offset on the broker and survives SIGKILL; POP acknowledges each event
//! at the broker only after its client's ack is durable, exactly once, lets the broker revive
//! what a killed gateway never acknowledged, and keeps a slow but live client's events invisible.
//! The behaviour shared with the other backends is in `conformance::rocketmq`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ackgate::backend::rocketmq::Broker;
use serde_json::{json, Value};

use crate::rocketmq_broker::TestRocketMq;
use crate::support::*;

const GROUP: &str = "ackgate-test";

fn pull_config(data: &std::path::Path, broker: &TestRocketMq) -> ackgate::config::Config {
    let mut config = test_config(data);
    config.storage.backend = "rocketmq".into();
    config.rocketmq.namesrv_addr = broker.namesrv();
    config.rocketmq.mode = "pull".into();
    config.rocketmq.consumer_group = GROUP.into();
    config
}

fn rocketmq_env<'a>(broker: &'a str, mode: &'a str, invisible_ms: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("ACKGATE_STORAGE__BACKEND", "rocketmq"),
        ("ACKGATE_ROCKETMQ__NAMESRV_ADDR", broker),
        ("ACKGATE_ROCKETMQ__MODE", mode),
        ("ACKGATE_ROCKETMQ__CONSUMER_GROUP", GROUP),
        ("ACKGATE_ROCKETMQ__INVISIBLE_TIME_MS", invisible_ms),
    ]
}

async fn create_topic(base: &str, name: &str, partitions: u32) {
    let created = http().post(format!("{base}/topics")).json(&json!({"name": name, "partitions": partitions})).send().await.unwrap();
    assert_eq!(created.status(), 200, "create {name}: {:?}", created.text().await);
}

async fn publish_n(base: &str, topic: &str, from: u64, to: u64) {
    let events: Vec<Value> = (from..to).map(|n| json!({"partition": 0, "payload": {"n": n}})).collect();
    publish(base, topic, json!({ "events": events })).await;
}

/// Pops `topic` queue 0 as the gateway's consumer group would, from outside ackgate, for up to
/// `within`: the payload numbers of every message the broker hands out (fresh or revived). What
/// the gateway popped and acknowledged never comes back; what it popped and left unacknowledged
/// comes back once the broker revives it.
async fn pop_from_outside(broker: &TestRocketMq, topic: &str, within: Duration, stop_when: usize) -> BTreeSet<u64> {
    let client = Broker::new(broker.namesrv(), Duration::from_secs(5));
    let addr = broker.broker_addr().await;
    let mut seen = BTreeSet::new();
    let started = Instant::now();
    while started.elapsed() < within && seen.len() < stop_when {
        let (_, messages) = client.pop(&addr, GROUP, topic, 0, 32, Duration::from_secs(60), Duration::from_millis(500)).await.expect("pop");
        for m in messages {
            let payload: Value = serde_json::from_slice(&m.body).unwrap();
            seen.insert(payload["n"].as_u64().unwrap());
        }
    }
    seen
}

async fn metric(base: &str, line_start: &str) -> f64 {
    let text = http().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_mode_never_leaves_an_offset_on_the_broker_and_resumes_from_its_checkpoint() {
    let broker = TestRocketMq::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(pull_config(&data, &broker)).await;
    create_topic(&gw.base, "pulled", 1).await;
    publish_n(&gw.base, "pulled", 0, 20).await;
    consume_and_ack(gw.addr(), "acker", "pulled", 20).await.close().await;
    assert_eq!(stored_offset(&gw.base, "pulled", "acker", 0).await.unwrap()["committed"], 20);
    gw.stop().await;
    let checkpoint = std::fs::read_to_string(data.join("pull-offsets.properties")).unwrap();
    assert!(checkpoint.contains("pulled#0=20"), "the pull cursor is checkpointed: {checkpoint}");
    assert_eq!(broker.consumer_offset(GROUP, "pulled", 0).await, None, "the broker holds no offset for ackgate's group");

    let gw = InProcess::start(pull_config(&data, &broker)).await;
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["pull_offset"], 20, "resumed from the checkpoint: {topics}");
    publish_n(&gw.base, "pulled", 20, 25).await;
    let mut client = WsClient::connect(gw.addr(), "acker").await;
    client.subscribe("pulled", json!({})).await;
    let events = client.recv_events(5).await;
    assert_eq!(events.iter().map(|e| e["payload"]["n"].as_u64().unwrap()).collect::<Vec<_>>(), (20..25).collect::<Vec<_>>());
    client.ack_confirmed(&ids(&events), "rest").await;
    gw.stop().await;
    assert_eq!(broker.consumer_offset(GROUP, "pulled", 0).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_on_rocketmq_pull_loses_nothing_and_never_moves_offsets_back() {
    let broker = TestRocketMq::start();
    let namesrv = broker.namesrv();
    crate::crash::sigkill_mid_stream(&rocketmq_env(&namesrv, "pull", "30000")).await;
}

/// Before the client acks, the broker still holds the events as popped and unacknowledged (a
/// consumer of the same group gets them once the broker revives them); after the client acks,
/// each event is acknowledged at the broker exactly once and never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_acknowledges_at_the_broker_only_after_the_client_and_exactly_once() {
    let broker = TestRocketMq::start();
    let namesrv = broker.namesrv();
    // The real binary: its metrics are its own (gateways inside this test process share one
    // metrics registry).
    let env = rocketmq_env(&namesrv, "pop", "2000");
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &env);
    create_topic(&gw.base, "popped", 1).await;
    publish_n(&gw.base, "popped", 0, 10).await;
    let mut client = WsClient::connect(gw.addr, "reader").await;
    client.subscribe("popped", json!({})).await;
    let events = client.recv_events(10).await;
    client.ack_confirmed(&ids(&events[..6]), "six").await;
    wait_for_broker_acks(&gw.base, 6).await;
    // The client leaves without acking 6..9 and the gateway stops: nothing acknowledges them.
    client.close().await;
    gw.terminate();

    let revived = pop_from_outside(&broker, "popped", Duration::from_secs(90), 4).await;
    assert_eq!(revived, (6..10).collect(), "exactly the unacknowledged events come back from the broker");

    // A second run where the client acks everything: nothing comes back.
    let gw = Process::start(&data, &env);
    publish_n(&gw.base, "popped", 10, 20).await;
    let mut client = WsClient::connect(gw.addr, "reader").await;
    client.subscribe("popped", json!({})).await;
    let events = client.recv_events(14).await;
    assert_eq!(events.iter().map(|e| e["payload"]["n"].as_u64().unwrap()).collect::<Vec<_>>(), (6..20).collect::<Vec<_>>());
    client.ack_confirmed(&ids(&events), "all").await;
    // 10..19 were popped by this run (6..9 were read by offset: popped by the first run).
    wait_for_broker_acks(&gw.base, 10).await;
    client.close().await;
    gw.terminate();
    let revived = pop_from_outside(&broker, "popped", Duration::from_secs(15), 1).await;
    assert!(revived.iter().all(|n| *n < 10), "events acknowledged by the client never come back: {revived:?}");
}

/// Waits until the gateway has acknowledged `n` handles at the broker, then checks it stays at
/// exactly `n` (no second ACK for any event).
async fn wait_for_broker_acks(base: &str, n: u64) {
    let acked = async || metric(base, "ackgate_broker_acks_total{result=\"broker_acked\"}").await as u64;
    let started = Instant::now();
    while acked().await < n && started.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(acked().await, n, "one broker ACK per acknowledged event");
}

/// SIGKILL after the gateway popped and delivered but before the client acked: after a restart
/// (short invisible time) the client gets the events again, acks them, and they are all
/// acknowledged at the broker: none lost, none left to come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_sigkill_before_the_client_acks_redelivers_and_settles_everything() {
    let broker = TestRocketMq::start();
    let namesrv = broker.namesrv();
    let env = rocketmq_env(&namesrv, "pop", "3000");
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &env);
    create_topic(&gw.base, "killed", 1).await;
    publish_n(&gw.base, "killed", 0, 30).await;
    let mut client = WsClient::connect(gw.addr, "victim").await;
    client.subscribe("killed", json!({})).await;
    let first = client.recv_events(30).await;
    client.ack_confirmed(&ids(&first[..10]), "ten").await;
    gw.kill9();

    let gw = Process::start(&data, &env);
    let mut client = WsClient::connect(gw.addr, "victim").await;
    let subscribed = client.subscribe("killed", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 10);
    let again = client.recv_events(20).await;
    let numbers: Vec<u64> = again.iter().map(|e| e["payload"]["n"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (10..30).collect::<Vec<_>>(), "what was not acked comes again, in order");
    client.ack_confirmed(&ids(&again), "rest").await;
    assert_eq!(stored_offset(&gw.base, "killed", "victim", 0).await.unwrap()["committed"], 30);
    // The broker revives what the killed gateway popped; the new gateway pops those revived
    // messages, maps them back to their offsets (already acked) and acknowledges them.
    let settled = Instant::now();
    loop {
        let pending = metric(&gw.base, "ackgate_rocketmq_pending_handles").await;
        let acked = metric(&gw.base, "ackgate_broker_acks_total{result=\"broker_acked\"}").await;
        if acked >= 20.0 && pending == 0.0 {
            break;
        }
        assert!(settled.elapsed() < Duration::from_secs(90), "handles settle: acked {acked}, pending {pending}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client.expect_silence(Duration::from_millis(500)).await;
    client.close().await;
    gw.terminate();
    let revived = pop_from_outside(&broker, "killed", Duration::from_secs(20), 1).await;
    assert!(revived.is_empty(), "nothing is left unacknowledged at the broker: {revived:?}");
}

/// A client slower than the invisible time but within its own ack timeout: the gateway extends
/// the invisible time, so the broker never redelivers and the client sees each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_a_slow_live_client_causes_no_broker_redelivery() {
    let broker = TestRocketMq::start();
    let namesrv = broker.namesrv();
    let mut env = rocketmq_env(&namesrv, "pop", "2000");
    env.push(("ACKGATE_DELIVERY__ACK_TIMEOUT_MS", "10000"));
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &env);
    create_topic(&gw.base, "slow", 1).await;
    publish_n(&gw.base, "slow", 0, 5).await;
    let mut client = WsClient::connect(gw.addr, "slowpoke").await;
    client.subscribe("slow", json!({})).await;
    let events = client.recv_events(5).await;
    // Three invisible times pass while the client thinks (its ack timeout is 10 s).
    client.expect_silence(Duration::from_secs(7)).await;
    client.ack_confirmed(&ids(&events), "late").await;
    assert!(metric(&gw.base, "ackgate_broker_invisible_extensions_total").await >= 5.0, "the invisible time was extended");
    wait_for_broker_acks(&gw.base, 5).await;
    client.expect_silence(Duration::from_millis(500)).await;
    client.close().await;
    gw.terminate();
    let revived = pop_from_outside(&broker, "slow", Duration::from_secs(15), 1).await;
    assert!(revived.is_empty(), "no redelivery from the broker: {revived:?}");
}
