//! Shared subscriptions (issue 44, docs/protocol.md "Shared subscriptions"): members of one
//! group share a topic's events, each event acked once, keys kept in order at one member at a
//! time, a dead member's events given to the others, the group's floor its own.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

const PARTITIONS: u32 = 4;
const KEYS: usize = 50;

/// What the members saw, checked as they go.
#[derive(Default)]
pub struct Seen {
    /// Per key: the member holding its unacked deliveries, and how many.
    holders: HashMap<String, (usize, usize)>,
    /// Per key: the last offset first delivered.
    last_first: HashMap<String, u64>,
    /// Per event: the members it was delivered to, with the attempt.
    deliveries: BTreeMap<(u64, u64), Vec<(usize, u64)>>,
    /// Events acked, per member.
    acked: Vec<usize>,
    violations: Vec<String>,
}

impl Seen {
    fn total_acked(&self) -> usize {
        self.acked.iter().sum()
    }
}

/// How a member behaves.
#[derive(Clone, Copy, PartialEq)]
pub enum Member {
    /// Acks what it gets, in batches.
    Acker,
    /// Takes `n` events, acks none of them, and drops its connection (no close frame).
    DiesAfter(usize),
}

pub fn keyed_events(from: usize, n: usize) -> Vec<Value> {
    (from..from + n).map(|i| json!({"key": format!("k{}", i % KEYS), "partition": ((i % KEYS) as u32) % PARTITIONS, "payload": {"i": i}})).collect()
}

async fn run_member(addr: SocketAddr, me: usize, topic: String, order: &'static str, behaviour: Member, total: usize, seen: Arc<Mutex<Seen>>) {
    let mut client = TestClient::connect(addr, &format!("member-{me}")).await;
    let subscribed = client.subscribe(&topic, json!({"group": "g", "order": order})).await;
    assert_eq!(subscribed["group"], "g", "{subscribed}");
    let mut unacked: Vec<(String, Option<String>)> = Vec::new();
    let mut taken = 0;
    loop {
        let frame = client.try_recv(Duration::from_millis(200)).await;
        if let Some(event) = frame.as_ref().filter(|f| f["type"] == "event") {
            let key = event["key"].as_str().map(str::to_string);
            let (partition, offset, attempt) = (event["partition"].as_u64().unwrap(), event["offset"].as_u64().unwrap(), event["attempt"].as_u64().unwrap());
            let mut s = seen.lock().unwrap();
            s.deliveries.entry((partition, offset)).or_default().push((me, attempt));
            if let Some(key) = key.as_ref().filter(|_| order == "key") {
                let holder = s.holders.entry(key.clone()).or_insert((me, 0));
                let clash = (holder.1 > 0 && holder.0 != me)
                    .then(|| format!("key {key} at member {me} (offset {offset}) while member {} holds {} of it", holder.0, holder.1));
                *holder = (me, holder.1 + 1);
                s.violations.extend(clash);
                if attempt == 1 {
                    if let Some(last) = s.last_first.insert(key.clone(), offset).filter(|last| *last >= offset) {
                        s.violations.push(format!("key {key}: first delivery of {offset} after {last}"));
                    }
                }
            }
            drop(s);
            unacked.push((id(event).to_string(), key));
            taken += 1;
            if let Member::DiesAfter(n) = behaviour {
                if taken >= n {
                    // Its keys are free once the gateway sees it gone, which is after this.
                    let mut s = seen.lock().unwrap();
                    for (_, key) in &unacked {
                        if let Some(holder) = key.as_ref().and_then(|k| s.holders.get_mut(k)) {
                            holder.1 -= 1;
                        }
                    }
                    return; // dropped: no close frame, no acks
                }
            }
            if unacked.len() < 16 || behaviour != Member::Acker {
                continue;
            }
        } else if frame.is_some() {
            continue;
        }
        if !unacked.is_empty() {
            // Released before the ack goes out: the next holder can only hear of the key after.
            let ids: Vec<String> = {
                let mut s = seen.lock().unwrap();
                for (_, key) in &unacked {
                    if let Some(holder) = key.as_ref().and_then(|k| s.holders.get_mut(k)) {
                        holder.1 -= 1;
                    }
                }
                s.acked[me] += unacked.len();
                unacked.drain(..).map(|(id, _)| id).collect()
            };
            client.send(json!({"op": "ack", "delivery_ids": ids})).await;
        }
        if frame.is_none() && seen.lock().unwrap().total_acked() >= total {
            client.close().await;
            return;
        }
    }
}

/// Members of group `g` on `topic` share `total` keyed events published after they joined;
/// answers what they saw once every event was acked.
pub async fn share(addr: SocketAddr, base: &str, topic: &str, order: &'static str, members: &[Member], total: usize) -> Seen {
    let (status, body) = post_json(&format!("{base}/topics"), json!({"name": topic, "partitions": PARTITIONS})).await;
    assert!(status == 200 || status == 409, "{status} {body}");
    let seen = Arc::new(Mutex::new(Seen { acked: vec![0; members.len()], ..Default::default() }));
    let mut tasks = Vec::new();
    for (me, behaviour) in members.iter().enumerate() {
        tasks.push(tokio::spawn(run_member(addr, me, topic.to_string(), order, *behaviour, total, seen.clone())));
    }
    wait_for("every member joined", async || {
        let (_, body) = get_json(&format!("{base}/admin/groups?topic={topic}")).await;
        body["groups"][0]["members"].as_array().is_some_and(|m| m.len() == members.len())
    })
    .await;
    for from in (0..total).step_by(500) {
        let (status, body) = post_json(&format!("{base}/topics/{topic}/events"), json!({"events": keyed_events(from, 500.min(total - from))})).await;
        assert_eq!(status, 200, "{body}");
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task).await.expect("members finish").unwrap();
    }
    Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap()
}

/// The group's stored floor per partition equals the log end (every event acked, durable).
pub async fn floor_reaches_log_end(base: &str, topic: &str) {
    wait_for("the group's floor reaches the log end", async || {
        let (status, body) = get_json(&format!("{base}/admin/groups/{topic}/g")).await;
        assert_eq!(status, 200, "{body}");
        body["partitions"].as_array().unwrap().iter().all(|p| p["committed"] == p["log_end"] && p["lag"] == 0)
    })
    .await;
}

fn check_each_event_acked_once(seen: &Seen, total: usize) {
    assert!(seen.violations.is_empty(), "{:?}", &seen.violations[..seen.violations.len().min(10)]);
    assert_eq!(seen.deliveries.len(), total, "every event reached a member");
    let twice: Vec<_> = seen.deliveries.iter().filter(|(_, d)| d.len() != 1).take(5).collect();
    assert!(twice.is_empty(), "each event was delivered once: {twice:?}");
    assert_eq!(seen.total_acked(), total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_share_ten_thousand_keyed_events_each_acked_once_keys_in_order() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let seen = share(gw.addr(), &gw.base, "work", "key", &[Member::Acker; 5], 10_000).await;
    check_each_event_acked_once(&seen, 10_000);
    for (member, acked) in seen.acked.iter().enumerate() {
        assert!(*acked > 0, "member {member} got a share: {:?}", seen.acked);
    }
    floor_reaches_log_end(&gw.base, "work").await;
    // The group's floor is its own: no client of the members has an offset on the topic.
    let (_, offsets) = get_json(&format!("{}/admin/offsets?topic=work", gw.base)).await;
    let clients: Vec<&str> = offsets["offsets"].as_array().unwrap().iter().map(|r| r["client_id"].as_str().unwrap()).collect();
    assert!(clients.iter().all(|c| *c == "$g"), "{clients:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_key_order_members_share_freely_and_each_event_is_acked_once() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let seen = share(gw.addr(), &gw.base, "free", "none", &[Member::Acker; 3], 3_000).await;
    check_each_event_acked_once(&seen, 3_000);
    assert!(seen.acked.iter().all(|a| *a > 0), "{:?}", seen.acked);
    floor_reaches_log_end(&gw.base, "free").await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_dies_holding_events_hands_them_to_the_others() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    // Its end releases them at once; the timeout only bounds a member that hangs instead.
    config.delivery.ack_timeout_ms = 5_000;
    let gw = InProcess::start(config).await;
    let members = [Member::Acker, Member::Acker, Member::Acker, Member::Acker, Member::DiesAfter(40)];
    let seen = share(gw.addr(), &gw.base, "dies", "key", &members, 4_000).await;
    assert!(seen.violations.is_empty(), "{:?}", &seen.violations[..seen.violations.len().min(10)]);
    assert_eq!(seen.deliveries.len(), 4_000, "every event reached a member");
    let died_with: Vec<(u64, u64)> = seen.deliveries.iter().filter(|(_, d)| d.iter().any(|(m, _)| *m == 4)).map(|(e, _)| *e).collect();
    assert_eq!(died_with.len(), 40, "the dying member took 40");
    for event in &died_with {
        let deliveries = &seen.deliveries[event];
        assert!(deliveries.iter().any(|(m, attempt)| *m != 4 && *attempt == 2), "{event:?} reached another member again: {deliveries:?}");
    }
    assert_eq!(seen.acked[4], 0);
    assert_eq!(seen.total_acked(), 4_000);
    floor_reaches_log_end(&gw.base, "dies").await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_names_and_orders_are_checked_and_the_group_is_listed_and_reset_when_idle() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish(&gw.base, "jobs", json!({"partition": 0, "payload": 1})).await;
    let mut a = TestClient::connect(gw.addr(), "a").await;
    for (extra, code) in [
        (json!({"group": "no#pe"}), "invalid_name"),
        (json!({"group": ""}), "invalid_name"),
        (json!({"group": "g", "order": "fifo"}), "bad_frame"),
        (json!({"order": "key"}), "bad_frame"),
        (json!({"group": 7}), "bad_frame"),
    ] {
        let mut frame = json!({"op": "subscribe", "topic": "jobs", "req": 1});
        frame.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        a.send(frame).await;
        let error = a.recv_type("error").await;
        assert_eq!((error["code"].as_str(), &error["req"]), (Some(code), &json!(1)), "{extra}: {error}");
    }
    let subscribed = a.subscribe("jobs", json!({"group": "g"})).await;
    assert_eq!(subscribed["group"], "g");
    assert_eq!(subscribed["req"], "sub");
    // One group, one order: a member asking for another is refused.
    let mut b = TestClient::connect(gw.addr(), "b").await;
    b.send(json!({"op": "subscribe", "topic": "jobs", "group": "g", "order": "key", "req": 2})).await;
    assert_eq!(b.recv_type("error").await["code"], "bad_frame");
    let event = a.recv_type("event").await;
    // An ack with req is confirmed with the group's floor.
    let ok = a.ack_confirmed(&[id(&event)], "r1").await;
    assert_eq!(ok["type"], "ack_ok", "{ok}");
    assert_eq!(ok["committed"]["jobs"]["0"], 1, "{ok}");
    let (_, listed) = get_json(&format!("{}/admin/groups", gw.base)).await;
    assert_eq!(listed["groups"][0]["group"], "g", "{listed}");
    assert_eq!(listed["groups"][0]["members"][0]["client_id"], "a", "{listed}");
    // While it has members, its floor is not an operator's to move.
    let url = format!("{}/admin/groups/jobs/g/0", gw.base);
    let status = http().put(&url).json(&json!({"offset": 0})).send().await.unwrap().status().as_u16();
    assert_eq!(status, 409);
    a.send(json!({"op": "unsubscribe", "topic": "jobs", "req": 3})).await;
    assert_eq!(a.recv_type("unsubscribed").await["req"], 3);
    wait_for("the group stops with its last member", async || {
        let (_, listed) = get_json(&format!("{}/admin/groups", gw.base)).await;
        listed["groups"].as_array().unwrap().is_empty()
    })
    .await;
    let mut status = 0;
    wait_for("the idle group's floor can be reset", async || {
        status = http().put(&url).json(&json!({"offset": 0})).send().await.unwrap().status().as_u16();
        status == 200
    })
    .await;
    // Rewound by the operator: the next member gets the event again.
    let mut c = TestClient::connect(gw.addr(), "c").await;
    let subscribed = c.subscribe("jobs", json!({"group": "g"})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 0, "{subscribed}");
    let again = c.recv_type("event").await;
    assert_eq!((again["partition"].as_u64(), again["offset"].as_u64()), (Some(0), Some(0)));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_subscribes_on_another_instance_is_sent_to_the_groups_instance() {
    let ports = [free_port(), free_port()];
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut gateways = Vec::new();
    let mut dirs = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let (dir, data) = temp_dir();
        let mut config = test_config(&data);
        config.server.listen = format!("127.0.0.1:{port}");
        config.server.instance_id = format!("gw-{i}");
        config.cluster.peers = urls.clone();
        config.cluster.token_key = CLUSTER_TOKEN_KEY.into();
        config.cluster.probe_interval_ms = 100;
        gateways.push(InProcess::start(config).await);
        dirs.push(dir);
    }
    let mut home = Value::Null;
    wait_for("both instances name the same home for the group", async || {
        let (_, a) = get_json(&format!("{}/session/recommend?group=workers", gateways[0].base)).await;
        let (_, b) = get_json(&format!("{}/session/recommend?group=workers", gateways[1].base)).await;
        home = a.clone();
        a == b
            && a["instance"].is_string()
            && {
                let (_, other) = get_json(&format!("{}/session/recommend?client_id=x", gateways[0].base)).await;
                other["instance"].is_string()
            }
            && {
                // Both peers healthy in both views: each names each at least once among a few groups.
                let mut named = std::collections::BTreeSet::new();
                for g in 0..20 {
                    let (_, r) = get_json(&format!("{}/session/recommend?group=g{g}", gateways[0].base)).await;
                    named.insert(r["instance"].as_str().unwrap().to_string());
                }
                named.len() == 2
            }
    })
    .await;
    let (status, bad) = get_json(&format!("{}/session/recommend?group=no%23pe", gateways[0].base)).await;
    assert_eq!((status, bad["error"]["code"].as_str()), (400, Some("invalid_name")));
    let away = if home["instance"] == "gw-0" { 1 } else { 0 };
    publish(&gateways[1 - away].base, "t", json!({"payload": 1})).await;
    let mut member = TestClient::connect(gateways[away].addr(), "m").await;
    member.send(json!({"op": "subscribe", "topic": "t", "group": "workers", "req": 1})).await;
    let reconnect = member.recv_type("reconnect").await;
    assert_eq!(reconnect["instance"], home["instance"], "{reconnect}");
    assert_eq!(reconnect["ws_url"], home["ws_url"], "{reconnect}");
    assert_eq!(member.close_code().await, 1012);
    // At home it joins.
    let mut member = TestClient::connect(gateways[1 - away].addr(), "m").await;
    assert_eq!(member.subscribe("t", json!({"group": "workers"})).await["group"], "workers");
    member.close().await;
    for gw in gateways {
        gw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_five_members_share_keyed_events_each_acked_once_keys_in_order() {
    let broker = crate::kafka_broker::TestBroker::start();
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.storage.backend = ackgate::config::BackendKind::Kafka;
    config.kafka.bootstrap_servers = broker.bootstrap();
    let gw = InProcess::start(config).await;
    let seen = share(gw.addr(), &gw.base, "kwork", "key", &[Member::Acker; 5], 10_000).await;
    check_each_event_acked_once(&seen, 10_000);
    assert!(seen.acked.iter().all(|a| *a > 0), "{:?}", seen.acked);
    floor_reaches_log_end(&gw.base, "kwork").await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_closes_releases_its_events_to_the_others_at_once() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await; // ack timeout 30 s: the release is not it
    let (status, _) = post_json(&format!("{}/topics", gw.base), json!({"name": "leave", "partitions": 1})).await;
    assert_eq!(status, 200);
    let mut one = TestClient::connect(gw.addr(), "one").await;
    let mut two = TestClient::connect(gw.addr(), "two").await;
    one.subscribe("leave", json!({"group": "g", "order": "key"})).await;
    two.subscribe("leave", json!({"group": "g", "order": "key"})).await;
    let events: Vec<Value> = (0..10).map(|i| json!({"partition": 0, "key": format!("k{}", i % 4), "payload": i})).collect();
    post_json(&format!("{}/topics/leave/events", gw.base), json!({ "events": events })).await;
    let mut got_one = Vec::new();
    while let Some(event) = one.try_recv(Duration::from_millis(300)).await.filter(|f| f["type"] == "event") {
        got_one.push(event["offset"].as_u64().unwrap());
    }
    assert!(!got_one.is_empty(), "member one got a share");
    one.close().await;
    let mut got_two = BTreeMap::new();
    while got_two.len() < 10 {
        let event = two.recv_type("event").await;
        got_two.insert(event["offset"].as_u64().unwrap(), event["attempt"].as_u64().unwrap());
    }
    for offset in got_one {
        assert_eq!(got_two[&offset], 2, "{offset} came again, released by the member's end");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_as_a_member_closes_reach_the_others_at_once() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let (status, _) = post_json(&format!("{}/topics", gw.base), json!({"name": "closing", "partitions": 1})).await;
    assert_eq!(status, 200);
    let mut one = TestClient::connect(gw.addr(), "one").await;
    let mut two = TestClient::connect(gw.addr(), "two").await;
    one.subscribe("closing", json!({"group": "g", "order": "key"})).await;
    two.subscribe("closing", json!({"group": "g", "order": "key"})).await;
    for round in 0..20 {
        let events: Vec<Value> = (0..4).map(|i| json!({"partition": 0, "key": format!("k{i}"), "payload": i})).collect();
        post_json(&format!("{}/topics/closing/events", gw.base), json!({ "events": events })).await;
        let mut got = 0;
        while got < 4 {
            let (mut a, mut b) = (one.try_recv(Duration::from_millis(50)).await, two.try_recv(Duration::from_millis(50)).await);
            for (client, frame) in [(&mut one, a.take()), (&mut two, b.take())] {
                if let Some(event) = frame.filter(|f| f["type"] == "event") {
                    got += 1;
                    client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
                }
            }
        }
        assert_eq!(got, 4, "round {round}");
    }
    one.close().await;
    let events: Vec<Value> = (0..4).map(|i| json!({"partition": 0, "key": format!("k{i}"), "payload": i})).collect();
    post_json(&format!("{}/topics/closing/events", gw.base), json!({ "events": events })).await;
    let mut offsets = Vec::new();
    while offsets.len() < 4 {
        offsets.push(two.recv_type("event").await["offset"].as_u64().unwrap());
    }
    offsets.sort();
    assert_eq!(offsets, vec![80, 81, 82, 83]);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_member_joins_with_group_in_its_url_and_its_event_ids_carry_the_groups_floor() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let (status, _) = post_json(&format!("{}/topics", gw.base), json!({"name": "ssegroup", "partitions": 1})).await;
    assert_eq!(status, 200);
    let status = http().get(format!("{}/sse?client_id=s&topics=ssegroup&order=key", gw.base)).send().await.unwrap().status().as_u16();
    assert_eq!(status, 400, "order without group");
    let mut sse = TestClient::connect_sse(gw.addr(), "s", "topics=ssegroup&group=g&order=key", &[]).await;
    let subscribed = sse.recv_type("subscribed").await;
    assert_eq!(subscribed["group"], "g", "{subscribed}");
    let mut ws = TestClient::connect(gw.addr(), "w").await;
    ws.subscribe("ssegroup", json!({"group": "g", "order": "key"})).await;
    let events: Vec<Value> = (0..20).map(|i| json!({"partition": 0, "key": format!("k{}", i % 2), "payload": i})).collect();
    post_json(&format!("{}/topics/ssegroup/events", gw.base), json!({ "events": events })).await;
    let (mut over_sse, mut over_ws) = (0, 0);
    while over_sse + over_ws < 20 {
        if let Some(event) = sse.try_recv(Duration::from_millis(50)).await.filter(|f| f["type"] == "event") {
            sse.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
            over_sse += 1;
        }
        if let Some(event) = ws.try_recv(Duration::from_millis(50)).await.filter(|f| f["type"] == "event") {
            ws.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
            over_ws += 1;
        }
    }
    assert!(over_sse > 0 && over_ws > 0, "both members got a share: {over_sse} {over_ws}");
    floor_reaches_log_end(&gw.base, "ssegroup").await;
    // The next event's id is the group's floor, not the SSE client's own (it has none).
    post_json(
        &format!("{}/topics/ssegroup/events", gw.base),
        json!({"events": [{"partition": 0, "key": "k0", "payload": 20}, {"partition": 0, "key": "k1", "payload": 21}]}),
    )
    .await;
    wait_for("an event id naming the group's floor", async || {
        let _ = sse.try_recv(Duration::from_millis(100)).await;
        let Some(token) = sse.sse().last_event_id.clone() else { return false };
        open_token(&data_dir_token_key(&data), &token)["ssegroup"]["0"] == 20
    })
    .await;
    gw.stop().await;
}

/// On RocketMQ POP the group is a client like any other: its hub's acks fire the deferred broker
/// ACKs as the group's floor passes the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rocketmq_pop_members_share_keyed_events_each_acked_once_keys_in_order() {
    let broker = crate::rocketmq_broker::TestRocketMq::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(rocketmq_config(&data, &broker, ackgate::config::RocketMqMode::Pop)).await;
    let seen = share(gw.addr(), &gw.base, "rwork", "key", &[Member::Acker; 3], 2_000).await;
    check_each_event_acked_once(&seen, 2_000);
    assert!(seen.acked.iter().all(|a| *a > 0), "{:?}", seen.acked);
    floor_reaches_log_end(&gw.base, "rwork").await;
    gw.stop().await;
}

/// A member that takes its share and acks none of it is closed with 4003 as any slow client is,
/// and its events go to the other member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_acking_is_closed_as_a_slow_client_and_its_share_moves_on() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    // The worker's share (2 of 10) never fills its window while it waits for the other's end.
    config.delivery.max_in_flight = 8;
    config.delivery.slow_client_timeout_ms = 1_000;
    let gw = InProcess::start(config).await;
    let (status, _) = post_json(&format!("{}/topics", gw.base), json!({"name": "slow", "partitions": 1})).await;
    assert_eq!(status, 200);
    let mut stuck = TestClient::connect(gw.addr(), "stuck").await;
    stuck.subscribe("slow", json!({"group": "g"})).await;
    let events: Vec<Value> = (0..10).map(|i| json!({"partition": 0, "payload": i})).collect();
    post_json(&format!("{}/topics/slow/events", gw.base), json!({ "events": events })).await;
    assert_eq!(stuck.recv_events(8).await.len(), 8, "its window's worth");
    let mut worker = TestClient::connect(gw.addr(), "worker").await;
    worker.subscribe("slow", json!({"group": "g"})).await;
    assert_eq!(stuck.close_code().await, 4003);
    let mut got = std::collections::BTreeSet::new();
    while got.len() < 10 {
        let event = worker.recv_type("event").await;
        got.insert(event["offset"].as_u64().unwrap());
        worker.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    floor_reaches_log_end(&gw.base, "slow").await;
    gw.stop().await;
}

/// Review of issue 44, finding 1: one group name on two topics is two groups; their hubs (one
/// identity, `$NAME`) must not take each other over, or each would restart the other forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_name_on_two_topics_is_two_groups_that_leave_each_other_alone() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    for topic in ["left", "right"] {
        let (status, _) = post_json(&format!("{}/topics", gw.base), json!({"name": topic, "partitions": 1})).await;
        assert_eq!(status, 200);
    }
    let mut a = TestClient::connect(gw.addr(), "a").await;
    let mut b = TestClient::connect(gw.addr(), "b").await;
    a.subscribe("left", json!({"group": "same"})).await;
    b.subscribe("right", json!({"group": "same"})).await;
    for round in 0..3 {
        for topic in ["left", "right"] {
            post_json(&format!("{}/topics/{topic}/events", gw.base), json!({"partition": 0, "payload": round})).await;
        }
        for (client, topic) in [(&mut a, "left"), (&mut b, "right")] {
            let event = client.recv_type("event").await;
            assert_eq!((event["topic"].as_str(), event["offset"].as_u64(), event["attempt"].as_u64()), (Some(topic), Some(round), Some(1)));
            client.ack_confirmed(&[id(&event)], "ok").await;
        }
    }
    let (_, listed) = get_json(&format!("{}/admin/groups?group=same", gw.base)).await;
    assert_eq!(listed["groups"].as_array().unwrap().len(), 2, "{listed}");
    gw.stop().await;
}

/// Review of issue 44, finding 5: an event the group's hub makes a dead letter itself (its
/// member never acked it, `max_attempts` ran out) no longer takes room at that member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_group_gives_up_on_frees_its_members_room() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight = 1;
    config.delivery.ack_timeout_ms = 300;
    config.delivery.max_attempts = 1;
    let gw = InProcess::start(config).await;
    let (status, _) = post_json(&format!("{}/topics", gw.base), json!({"name": "poison", "partitions": 1})).await;
    assert_eq!(status, 200);
    let mut member = TestClient::connect(gw.addr(), "m").await;
    member.subscribe("poison", json!({"group": "g"})).await;
    post_json(&format!("{}/topics/poison/events", gw.base), json!({"events": [{"partition": 0, "payload": 0}, {"partition": 0, "payload": 1}]})).await;
    let first = member.recv_type("event").await;
    assert_eq!(first["offset"], 0);
    // Not acked: a dead letter after its one attempt; the member's one slot is free again.
    let second = member.recv_type("event").await;
    assert_eq!(second["offset"], 1, "{second}");
    let (_, dead) = get_json(&format!("{}/admin/dead-letters?topic=poison", gw.base)).await;
    assert_eq!(dead["dead_letters"][0]["client_id"], "$g", "{dead}");
    gw.stop().await;
}

fn rocketmq_config(data: &std::path::Path, broker: &crate::rocketmq_broker::TestRocketMq, mode: ackgate::config::RocketMqMode) -> ackgate::config::Config {
    let mut config = test_config(data);
    config.storage.backend = ackgate::config::BackendKind::RocketMq;
    config.rocketmq.namesrv_addr = broker.namesrv();
    config.rocketmq.mode = mode;
    config.rocketmq.consumer_group = "ackgate-groups".into();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rocketmq_pull_members_share_keyed_events_each_acked_once_keys_in_order() {
    let broker = crate::rocketmq_broker::TestRocketMq::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(rocketmq_config(&data, &broker, ackgate::config::RocketMqMode::Pull)).await;
    let seen = share(gw.addr(), &gw.base, "rpull", "key", &[Member::Acker; 3], 2_000).await;
    check_each_event_acked_once(&seen, 2_000);
    floor_reaches_log_end(&gw.base, "rpull").await;
    gw.stop().await;
}

/// A group on a RocketMQ lite topic (`parent@lite`): its floor is stored under the lite topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_rocketmq_lite_topic_members_share_its_events() {
    let broker = crate::rocketmq_broker::TestRocketMq::start();
    let (_dir, data) = temp_dir();
    let mut config = rocketmq_config(&data, &broker, ackgate::config::RocketMqMode::Pop);
    config.rocketmq.lite_parents = vec!["rooms".into()];
    let gw = InProcess::start(config).await;
    let (status, body) = post_json(&format!("{}/topics", gw.base), json!({"name": "rooms", "partitions": 1})).await;
    assert_eq!(status, 200, "{body}");
    let mut members = Vec::new();
    for m in 0..2 {
        let mut member = TestClient::connect(gw.addr(), &format!("lite-{m}")).await;
        assert_eq!(member.subscribe("rooms@r1", json!({"group": "g"})).await["group"], "g");
        members.push(member);
    }
    let events: Vec<Value> = (0..200).map(|n| json!({"payload": {"n": n}})).collect();
    let (status, body) = post_json(&format!("{}/topics/rooms@r1/events", gw.base), json!({ "events": events })).await;
    assert_eq!(status, 200, "{body}");
    let mut got: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    let mut shares = [0usize; 2];
    while got.len() < 200 {
        for (m, member) in members.iter_mut().enumerate() {
            if let Some(event) = member.try_recv(Duration::from_millis(20)).await.filter(|f| f["type"] == "event") {
                *got.entry((event["partition"].as_u64().unwrap(), event["offset"].as_u64().unwrap())).or_default() += 1;
                shares[m] += 1;
                member.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
            }
        }
    }
    assert!(got.values().all(|n| *n == 1), "each event once");
    assert!(shares.iter().all(|s| *s > 0), "{shares:?}");
    floor_reaches_log_end(&gw.base, "rooms@r1").await;
    gw.stop().await;
}

/// Issue 59, item 1 (tried on the old binary: the group delivered nothing more for a day): a
/// member that nacks every event it gets with a one-day `delay_ms` filled the hub's window with
/// paused events, so with a window of 4 nobody got anything, also after that member left. Now a
/// paused event holds a slot of the member that paused it and the hub's window grows by it (the
/// member stalls only itself), and a group's pause is cut to `delivery.group_max_nack_delay_ms`.
/// The real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_pauses_its_events_stalls_itself_not_its_group() {
    let (_dir, data) = temp_dir();
    // A cap long enough that the paused events do not come back before the other member took the
    // new ones, on a loaded machine too.
    let gw = Process::start(&data, &[("ACKGATE_DELIVERY__MAX_IN_FLIGHT", "4"), ("ACKGATE_DELIVERY__GROUP_MAX_NACK_DELAY_MS", "12000")]);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "paused", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let publish_n = |from: u64, n: u64| {
        let events: Vec<Value> = (from..from + n).map(|i| json!({"payload": {"n": i}})).collect();
        publish(&gw.base, "paused", json!({"events": events}))
    };
    let mut pauser = TestClient::connect(gw.addr, "pauser").await;
    pauser.subscribe("paused", json!({"group": "g"})).await;
    publish_n(0, 4).await;
    for event in pauser.recv_events(4).await {
        pauser.send(json!({"op": "nack", "delivery_id": event["delivery_id"], "delay_ms": 86_400_000})).await;
    }
    publish_n(4, 4).await;
    // The pauser holds its four slots with the paused events: the new ones wait for a member.
    assert!(pauser.try_recv(Duration::from_millis(500)).await.is_none(), "a member full of paused events got more");
    let mut worker = TestClient::connect(gw.addr, "worker").await;
    worker.subscribe("paused", json!({"group": "g"})).await;
    let events = worker.recv_events(4).await;
    let got: Vec<u64> = events.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(got, [4, 5, 6, 7], "the other member gets the new events while the first ones are paused");
    pauser.close().await;
    publish_n(8, 4).await;
    worker.ack_confirmed(&ids(&events), "a").await;
    // After the pauser left: the next events come, and the paused ones come back after the
    // group's cap (12 s), not a day.
    let mut offsets = Vec::new();
    while offsets.len() < 8 {
        let frame = worker.try_recv(Duration::from_secs(30)).await.unwrap_or_else(|| panic!("only {offsets:?} came"));
        if frame["type"] != "event" {
            continue;
        }
        let event = frame;
        offsets.push(event["offset"].as_u64().unwrap());
        worker.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    offsets.sort_unstable();
    assert_eq!(offsets, [0, 1, 2, 3, 8, 9, 10, 11]);
    gw.kill9();
}

/// Issue 59, item 2 in part: a group's hub (with a window of up to `delivery.group_max_in_flight`
/// events) counted against nothing, so clients could start hubs without bound. Now
/// `limits.max_groups` bounds the groups live on an instance: a subscribe that would start one
/// more is refused with `limit_exceeded`, and a group that ended makes room. The real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_on_an_instance_are_bounded() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_LIMITS__MAX_GROUPS", "2")]);
    publish_numbered(&gw.base, "capped", 1, 0, 1).await;
    let mut first = TestClient::connect(gw.addr, "first").await;
    first.subscribe("capped", json!({"group": "a"})).await;
    let mut second = TestClient::connect(gw.addr, "second").await;
    second.subscribe("capped", json!({"group": "b"})).await;
    let mut third = TestClient::connect(gw.addr, "third").await;
    third.send(json!({"op": "subscribe", "topic": "capped", "group": "c", "req": "c"})).await;
    let refused = third.recv_type("error").await;
    assert_eq!((refused["code"].as_str(), refused["req"].as_str()), (Some("limit_exceeded"), Some("c")), "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("limits.max_groups"), "{refused}");
    // Joining a group that runs starts no hub.
    third.subscribe("capped", json!({"group": "a"})).await;
    // The last member of b leaves: its hub ends, and c may start.
    second.close().await;
    let base = gw.base.clone();
    wait_for("group b to end", async || get_json(&format!("{base}/admin/groups")).await.1["groups"].as_array().is_some_and(|g| g.len() == 1)).await;
    let mut fourth = TestClient::connect(gw.addr, "fourth").await;
    fourth.subscribe("capped", json!({"group": "c"})).await;
    first.close().await;
    third.close().await;
    fourth.close().await;
    gw.kill9();
}

/// Issue 59, item 2: group deliveries count in a member's byte window
/// (`delivery.max_in_flight_bytes`) as its own deliveries do, and the hub's byte window is its
/// members' together (plus its own). Before, members held them against their event count only,
/// and the hub's byte window was one session's: the whole group had 1,000 bytes in flight, so the
/// second member got nothing while the first held three events (failed here on the old code). With
/// the hub's window grown but members' bytes not counted, the first would get ten. The real
/// binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_deliveries_count_in_a_members_byte_window() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_DELIVERY__MAX_IN_FLIGHT_BYTES", "1000")]);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "heavy", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let mut first = TestClient::connect(gw.addr, "first").await;
    first.subscribe("heavy", json!({"group": "g"})).await;
    // Each payload weighs 292 bytes (a JSON string of 290 characters): three fit in 1,000.
    let events: Vec<Value> = (0..12).map(|i| json!({"payload": format!("{i:0>290}")})).collect();
    publish(&gw.base, "heavy", json!({ "events": events })).await;
    let held = first.recv_events(3).await;
    assert!(first.try_recv(Duration::from_millis(500)).await.is_none(), "a member got more group events than its byte window holds");
    let mut second = TestClient::connect(gw.addr, "second").await;
    second.subscribe("heavy", json!({"group": "g"})).await;
    let others = second.recv_events(3).await;
    assert!(second.try_recv(Duration::from_millis(500)).await.is_none(), "the second member got more than its byte window holds");
    let offsets = |events: &[Value]| events.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!((offsets(&held), offsets(&others)), (vec![0, 1, 2], vec![3, 4, 5]));
    // Acked, the room comes back: the next three (they may come before the `ack_ok`).
    first.send(json!({"op": "ack", "delivery_ids": ids(&held)})).await;
    assert_eq!(offsets(&first.recv_events(3).await), [6, 7, 8]);
    first.close().await;
    second.close().await;
    gw.kill9();
}
