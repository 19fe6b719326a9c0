//! RocketMQ 5.x lite topics (`rocketmq.lite_parents`, issue 27) against rocketmq-rust: a lite
//! topic `parent@lite` is published, subscribed, acknowledged and resumed like any topic, reads
//! from its own light message queue only, and survives a SIGKILL of the gateway mid-stream.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::rocketmq_broker::TestRocketMq;
use crate::support::*;

fn lite_env(namesrv: &str) -> Vec<(&'static str, &str)> {
    vec![
        ("ACKGATE_STORAGE__BACKEND", "rocketmq"),
        ("ACKGATE_ROCKETMQ__NAMESRV_ADDR", namesrv),
        ("ACKGATE_ROCKETMQ__MODE", "pop"),
        ("ACKGATE_ROCKETMQ__CONSUMER_GROUP", "ackgate-lite-test"),
        ("ACKGATE_ROCKETMQ__LITE_PARENTS", "[\"chat\"]"),
        ("ACKGATE_OFFSETS__CHECKPOINT_INTERVAL_MS", "200"),
    ]
}

/// A test broker and a gateway serving lite parent `chat`, created.
struct LiteGateway {
    broker: TestRocketMq,
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    gateway: Process,
}

impl LiteGateway {
    async fn start() -> Self {
        let broker = TestRocketMq::start();
        let (dir, data) = temp_dir();
        let gateway = Process::start(&data, &lite_env(&broker.namesrv()));
        create_parent(&gateway.base).await;
        Self { broker, _dir: dir, data, gateway }
    }
}

async fn create_parent(base: &str) {
    let created = http().post(format!("{base}/topics")).json(&json!({"name": "chat", "partitions": 2})).send().await.unwrap();
    assert_eq!(created.status(), 200, "create chat: {:?}", created.text().await);
}

/// Publishes `{"room", "n"}` for `from..to` to `chat@room`; answers the offsets.
async fn publish_room(base: &str, room: &str, from: u64, to: u64) -> Vec<u64> {
    let events: Vec<Value> = (from..to).map(|n| json!({"payload": {"room": room, "n": n}})).collect();
    let answer = publish(base, &format!("chat@{room}"), json!({ "events": events })).await;
    answer["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            assert_eq!(o["partition"], 0, "one broker: a lite topic has one partition");
            o["offset"].as_u64().unwrap()
        })
        .collect()
}

fn payload_numbers(events: &[Value], room: &str) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            assert_eq!(e["topic"], format!("chat@{room}"), "{e}");
            assert_eq!(e["payload"]["room"], room, "an event of another lite topic: {e}");
            e["payload"]["n"].as_u64().unwrap()
        })
        .collect()
}

/// Two lite topics of one parent: each publish answers its own lite queue's offsets (from 0),
/// each client gets its own lite topic's events only, in order, and its acks commit under
/// `parent@lite#client#0`; the pull cursor is checkpointed under the seed's `parent#lite@queue`
/// key. Creating or deleting a lite topic is a clear 400, and the parent is created as a lite
/// parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lite_topics_deliver_their_own_events_and_commit_per_lite_topic() {
    let lite = LiteGateway::start().await;
    let (gw, data) = (&lite.gateway, &lite.data);
    assert_eq!(publish_room(&gw.base, "room-1", 0, 5).await, vec![0, 1, 2, 3, 4]);
    assert_eq!(publish_room(&gw.base, "room-2", 100, 103).await, vec![0, 1, 2]);

    let mut one = TestClient::connect(gw.addr, "reader-1").await;
    let subscribed = one.subscribe("chat@room-1", json!({"from": "earliest"})).await;
    assert_eq!(subscribed["topic"], "chat@room-1", "{subscribed}");
    let events = one.recv_events(5).await;
    assert_eq!(payload_numbers(&events, "room-1"), vec![0, 1, 2, 3, 4]);
    assert_eq!(events.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    one.ack_confirmed(&ids(&events), "all").await;
    one.expect_silence(Duration::from_millis(500)).await;

    let mut two = consume_and_ack(gw.addr, "reader-2", "chat@room-2", 3).await;
    assert_eq!(stored_offset(&gw.base, "chat@room-1", "reader-1", 0).await.unwrap()["committed"], 5);
    let row = stored_offset(&gw.base, "chat@room-2", "reader-2", 0).await.unwrap();
    assert_eq!((row["committed"].as_u64(), row["key"].as_str()), (Some(3), Some("chat@room-2#reader-2#0")));

    // Live delivery after the subscribe.
    publish_room(&gw.base, "room-1", 5, 7).await;
    let live = one.recv_events(2).await;
    assert_eq!(payload_numbers(&live, "room-1"), vec![5, 6]);
    two.expect_silence(Duration::from_millis(500)).await;

    wait_for("the pull cursor of chat@room-1 is checkpointed", async || {
        std::fs::read_to_string(data.join("pull-offsets.properties")).is_ok_and(|t| t.lines().any(|l| l == "chat#room-1@0=7"))
    })
    .await;

    let (status, body) = post_json(&format!("{}/topics", gw.base), json!({"name": "chat@room-9", "partitions": 1})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{body}");
    let deleted = http().delete(format!("{}/topics/chat@room-9", gw.base)).send().await.unwrap();
    assert_eq!(deleted.status(), 400);
    // A batch naming a partition the lite topic lacks is refused whole: nothing of it is stored
    // (room-2's log end stays 3 below).
    let (status, body) =
        post_json(&format!("{}/topics/chat@room-2/events", gw.base), json!({"events": [{"payload": 1}, {"partition": 1, "payload": 2}]})).await;
    assert_eq!(status, 404, "{body}");
    // The parent's lite topics, paged, with their bounds.
    publish_room(&gw.base, "room-0", 0, 1).await;
    let (status, page) = get_json(&format!("{}/topics?parent=chat&limit=2", gw.base)).await;
    assert_eq!(status, 200, "{page}");
    let names: Vec<&str> = page["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!((names, page["next"].as_str()), (vec!["chat@room-0", "chat@room-1"], Some("chat@room-1")), "{page}");
    let room_1 = &page["topics"][1]["partitions"][0];
    assert_eq!((room_1["log_start"].as_u64(), room_1["log_end"].as_u64(), room_1["pull_offset"].as_u64()), (Some(0), Some(7), Some(7)), "{page}");
    let (_, last) = get_json(&format!("{}/topics?parent=chat&limit=2&after=chat@room-1", gw.base)).await;
    assert_eq!(last["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect::<Vec<_>>(), vec!["chat@room-2"], "{last}");
    assert!(last.get("next").is_none(), "the last page has no next: {last}");
    assert_eq!(last["topics"][0]["partitions"][0]["log_end"], 3, "{last}");
    for bad in ["parent=chat&limit=0", "parent=chat&page=2", "parent=chat@room-1"] {
        let (status, body) = get_json(&format!("{}/topics?{bad}", gw.base)).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, body) = get_json(&format!("{}/topics?parent=orders", gw.base)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_topic")), "{body}");
    // Without parent, limit and after page the regular topics the same way.
    let (status, body) = get_json(&format!("{}/topics?limit=1", gw.base)).await;
    assert_eq!((status, body["topics"][0]["name"].as_str(), body["next"].as_str()), (200, Some("chat"), None), "{body}");
    // A lite topic of a parent not in rocketmq.lite_parents does not exist.
    let (status, body) = post_json(&format!("{}/topics/other@room-1/events", gw.base), json!({"payload": 1})).await;
    assert_eq!(status, 404, "{body}");
}

/// A client subscribed to a lite topic nothing was ever published to gets the first event
/// published later (the broker has no queue for it until then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lite_topic_subscribed_before_its_first_message_gets_it() {
    let lite = LiteGateway::start().await;
    let gw = &lite.gateway;
    let mut client = TestClient::connect(gw.addr, "early").await;
    client.subscribe("chat@empty-room", json!({})).await;
    client.expect_silence(Duration::from_millis(1500)).await;
    publish_room(&gw.base, "empty-room", 0, 1).await;
    let events = client.recv_events(1).await;
    assert_eq!(payload_numbers(&events, "empty-room"), vec![0]);
    assert_eq!(events[0]["offset"], 0);
}

/// The crash test: 200 lite topics of one parent, one client on each, events published to
/// every one while the gateway is SIGKILLed mid-stream and restarted. Every client gets every
/// event of its own lite topic and none of another's, and no committed offset moves back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_on_200_lite_topics_loses_nothing_and_mixes_nothing() {
    const ROOMS: usize = 200;
    const PER_ROOM: u64 = 6;
    let LiteGateway { broker, _dir, data, gateway: gw } = LiteGateway::start().await;
    let namesrv = broker.namesrv();
    let env = lite_env(&namesrv);
    let rooms: Vec<String> = (0..ROOMS).map(|i| format!("r{i}")).collect();
    for room in &rooms {
        publish_room(&gw.base, room, 0, PER_ROOM / 2).await;
    }
    // Each client takes and acks what it gets for a moment; then the gateway dies under them.
    let mut seen: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut clients = Vec::new();
    for room in &rooms {
        let mut client = TestClient::connect(gw.addr, &format!("c-{room}")).await;
        client.subscribe(&format!("chat@{room}"), json!({})).await;
        clients.push(client);
    }
    for (room, client) in rooms.iter().zip(clients.iter_mut()).take(ROOMS / 2) {
        let events = client.recv_events(1).await;
        seen.entry(room.clone()).or_default().extend(payload_numbers(&events, room));
        client.ack_confirmed(&ids(&events), "first").await;
    }
    let mut before = BTreeMap::new();
    for room in rooms.iter().take(ROOMS / 2) {
        let row = stored_offset(&gw.base, &format!("chat@{room}"), &format!("c-{room}"), 0).await.expect("acked");
        before.insert(room.clone(), row["committed"].as_u64().unwrap());
    }
    gw.kill9();
    drop(clients);

    let gw = Process::start(&data, &env);
    for room in &rooms {
        publish_room(&gw.base, room, PER_ROOM / 2, PER_ROOM).await;
    }
    for room in &rooms {
        let client_id = format!("c-{room}");
        let mut client = TestClient::connect(gw.addr, &client_id).await;
        client.subscribe(&format!("chat@{room}"), json!({})).await;
        let committed = before.get(room).copied().unwrap_or(0);
        let events = client.recv_events((PER_ROOM - committed) as usize).await;
        let numbers = payload_numbers(&events, room);
        assert_eq!(numbers, (committed..PER_ROOM).collect::<Vec<_>>(), "{room} resumes at its committed offset {committed}, in order");
        seen.entry(room.clone()).or_default().extend(numbers);
        client.ack_confirmed(&ids(&events), "rest").await;
        client.expect_silence(Duration::from_millis(50)).await;
        let row = stored_offset(&gw.base, &format!("chat@{room}"), &client_id, 0).await.unwrap();
        assert_eq!(row["committed"].as_u64().unwrap(), PER_ROOM, "{room}");
        client.close().await;
    }
    for room in &rooms {
        assert_eq!(seen[room], (0..PER_ROOM).collect::<BTreeSet<_>>(), "{room} got every event of its own");
    }
}

/// The browser console lists a lite parent's lite topics with their bounds (tests/browser/lite.mjs
/// in headless Chromium), and says so when the name is no lite parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_a_parents_lite_topics_in_a_real_browser() {
    let lite = LiteGateway::start().await;
    let gw = &lite.gateway;
    publish_room(&gw.base, "room-a", 0, 3).await;
    publish_room(&gw.base, "room-b", 0, 1).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/lite.mjs");
    let base = gw.base.clone();
    let output = tokio::task::spawn_blocking(move || std::process::Command::new("node").args([script, &base, "chat", "orders"]).output().expect("node runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "browser test failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let rows: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("row: ")).collect();
    assert_eq!(rows, vec!["chat@room-a 0 0 3", "chat@room-b 0 0 1"], "{stdout}");
    let error = stdout.lines().find_map(|l| l.strip_prefix("error: ")).expect("an error line");
    assert!(error.contains("404 unknown_topic"), "{error}");
}

/// Issue 39, item 11: a lite topic has a partition per master of its parent, and a parent that
/// gains a master gains a partition in each of its lite topics; but partition counts were
/// watched for listed topics only, and no listing names a lite topic. A session reading
/// `chat@room` never fed the new partition: the event published there never came. Now the watch
/// reads the lite topics sessions read whenever their parent grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lite_topic_reads_the_partition_its_parent_gains_with_a_new_master() {
    let broker = TestRocketMq::start_cluster(2, "");
    let client = ackgate::backend::rocketmq::Broker::new(broker.namesrv(), Duration::from_secs(5));
    let masters = client.brokers().await.unwrap();
    client.create_topic(&masters[0].1, "chat", 2, true).await.unwrap();
    let (_dir, data) = temp_dir();
    let namesrv = broker.namesrv();
    let mut env = lite_env(&namesrv);
    env.push(("ACKGATE_ROCKETMQ__ROUTE_REFRESH_MS", "200"));
    let gw = Process::start(&data, &env);
    wait_for("the parent routed on broker-a", async || client.route("chat").await.unwrap().is_some()).await;
    let first = publish(&gw.base, "chat@room", json!({"payload": {"room": "room", "n": 0}})).await;
    assert_eq!(first["offsets"][0]["partition"], 0, "{first}");
    let mut reader = TestClient::connect(gw.addr, "reader").await;
    let subscribed = reader.subscribe("chat@room", json!({"from": "earliest"})).await;
    assert_eq!(subscribed["partitions"].as_array().map(Vec::len), Some(1), "one master, one partition: {subscribed}");
    assert_eq!(payload_numbers(&reader.recv_events(1).await, "room"), [0]);

    client.create_topic(&masters[1].1, "chat", 2, true).await.unwrap();
    let partitions = format!("{}/topics/chat@room/events", gw.base);
    wait_for("chat@room has a partition on broker-b", async || {
        http().post(&partitions).json(&json!({"partition": 1, "payload": {"room": "room", "n": 1}})).send().await.unwrap().status() == 200
    })
    .await;
    let second = reader.recv_events(1).await;
    assert_eq!(second[0]["partition"], 1, "{}", second[0]);
    assert_eq!(payload_numbers(&second, "room"), [1]);
    gw.terminate();
}
