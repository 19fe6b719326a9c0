//! A shared subscription across a cluster (issue 44, "Across instances"): three instances on one
//! Kafka-protocol broker, the group's instance SIGKILLed mid-stream; its members follow
//! `reconnect` and `/session/recommend?group=` to the next instance, which resumes from the
//! group's stored floor: nothing lost, and the floor the members were told never moves back.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::kafka_broker::TestBroker;
use crate::support::*;

const TOPIC: &str = "shared";
const PARTITIONS: u32 = 4;
const EVENTS: usize = 3_000;
const MEMBERS: usize = 3;

#[derive(Default)]
struct Seen {
    acked: BTreeSet<(u64, u64)>,
    /// A floor reported to a member below the token it rejoined with.
    moved_back: Vec<String>,
    /// The instances members were served by, in order.
    homes: Vec<String>,
}

/// The `ws_url` of the group's instance, asked of the known instances in turn.
async fn group_home(known: &[String]) -> Option<String> {
    for base in known {
        let Ok(answer) = http().get(format!("{base}/session/recommend?group=g")).timeout(Duration::from_secs(2)).send().await else { continue };
        if let Ok(answer) = answer.json::<Value>().await {
            return answer["ws_url"].as_str().map(str::to_string);
        }
    }
    None
}

/// Connects `client_id` where a `reconnect` sent it (`next`), else to the group's home: the URL
/// and the client, or `None` (after a short pause) when neither answers.
async fn connect_member(next: &mut Option<String>, known: &[String], client_id: &str) -> Option<(String, TestClient)> {
    let connected = match next.take().or(group_home(known).await) {
        Some(ws_url) => TestClient::try_connect_url(&format!("{ws_url}?client_id={client_id}")).await.map(|client| (ws_url, client)),
        None => None,
    };
    if connected.is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    connected
}

async fn member(me: usize, known: Vec<String>, seen: Arc<Mutex<Seen>>) {
    let mut next: Option<String> = None;
    let started = Instant::now();
    // The group's floor as this member was told it, and the last group token the gateway issued
    // it (`subscribed`, `ack_ok`): what it resumes the group with.
    let mut token: BTreeMap<String, u64> = BTreeMap::new();
    let mut issued: Option<String> = None;
    while seen.lock().unwrap().acked.len() < EVENTS {
        assert!(started.elapsed() < Duration::from_secs(120), "member {me} gave up");
        let Some((ws_url, mut client)) = connect_member(&mut next, &known, &format!("member-{me}")).await else { continue };
        let mut subscribe = json!({"op": "subscribe", "topic": TOPIC, "group": "g", "order": "key", "req": "sub"});
        if let Some(issued) = &issued {
            subscribe["resume"] = json!(issued);
        }
        client.send(subscribe).await;
        let presented = token.clone();
        let mut req = 0u64;
        while let Some(frame) = client.try_recv(Duration::from_secs(2)).await {
            match frame["type"].as_str() {
                Some("subscribed") => {
                    assert_ne!(frame["resume"], "refused", "member {me}: its group token was refused: {frame}");
                    if let Some(t) = frame["token"].as_str() {
                        issued = Some(t.to_string());
                    }
                    seen.lock().unwrap().homes.push(ws_url.clone());
                }
                Some("reconnect") => {
                    // Sent to the group's instance, or told to come back after a drain.
                    next = frame["ws_url"].as_str().map(str::to_string);
                }
                Some("event") => {
                    // A member that works a little: the stream is still going when the kill comes.
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    req += 1;
                    seen.lock().unwrap().acked.insert((frame["partition"].as_u64().unwrap(), frame["offset"].as_u64().unwrap()));
                    if !client.try_send(json!({"op": "ack", "delivery_id": frame["delivery_id"], "req": req})).await {
                        break;
                    }
                }
                Some("ack_ok") => {
                    if let Some(t) = frame["tokens"][TOPIC].as_str() {
                        issued = Some(t.to_string());
                    }
                    let mut s = seen.lock().unwrap();
                    for (partition, floor) in frame["committed"][TOPIC].as_object().into_iter().flatten() {
                        let floor = floor.as_u64().unwrap();
                        if let Some(before) = presented.get(partition).filter(|before| floor < **before) {
                            s.moved_back.push(format!("member {me} partition {partition}: floor {floor} below its token {before}"));
                        }
                        let told = token.entry(partition.clone()).or_default();
                        *told = (*told).max(floor);
                    }
                }
                _ => {}
            }
            if seen.lock().unwrap().acked.len() >= EVENTS {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_instance_sigkilled_its_members_follow_to_the_next_and_nothing_is_lost() {
    let broker = TestBroker::start();
    let cluster = KafkaCluster::new(broker.bootstrap(), 3);
    let (ports, urls) = (&cluster.ports, &cluster.urls);
    let mut gateways: Vec<Option<Process>> = (0..3).map(|i| Some(cluster.start(i))).collect();
    let created = http().post(format!("{}/topics", urls[0])).json(&json!({"name": TOPIC, "partitions": PARTITIONS})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    // Every instance names the same home for the group before members come.
    wait_for("the instances agree on the group's home", async || {
        let mut homes = BTreeSet::new();
        for base in urls {
            let (_, answer) = get_json(&format!("{base}/session/recommend?group=g")).await;
            homes.insert(answer["ws_url"].as_str().unwrap_or_default().to_string());
        }
        let (_, peers_seen) = get_json(&format!("{}/session/recommend?group=g", urls[1])).await;
        homes.len() == 1 && peers_seen["instance"].is_string()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let members: Vec<_> = (0..MEMBERS)
        .map(|me| {
            // Each member starts out at another instance: those not the group's send it on.
            let known: Vec<String> = (0..3).map(|k| urls[(me + k) % 3].clone()).collect();
            tokio::spawn(member(me, known, seen.clone()))
        })
        .collect();
    for from in (0..EVENTS).step_by(300) {
        let events: Vec<Value> = (from..from + 300).map(|i| json!({"key": format!("k{}", i % 40), "payload": {"i": i}})).collect();
        let (status, body) = post_json(&format!("{}/topics/{TOPIC}/events", urls[0]), json!({ "events": events })).await;
        assert_eq!(status, 200, "{body}");
    }
    wait_for("members are mid-stream", async || seen.lock().unwrap().acked.len() >= 600).await;
    let (_, home) = get_json(&format!("{}/session/recommend?group=g", urls[0])).await;
    let victim = ports.iter().position(|p| home["http_url"].as_str().unwrap().ends_with(&format!(":{p}"))).unwrap();
    gateways[victim].take().unwrap().kill9();
    for task in members {
        tokio::time::timeout(Duration::from_secs(150), task).await.expect("members finish").unwrap();
    }
    let s = seen.lock().unwrap();
    assert_eq!(s.acked.len(), EVENTS, "every event reached a member and was acked");
    assert!(s.moved_back.is_empty(), "{:?}", s.moved_back);
    let homes: BTreeSet<&String> = s.homes.iter().collect();
    assert!(homes.len() >= 2, "members moved to the next instance: {homes:?}");
    assert!(!s.homes.last().unwrap().contains(&format!(":{}", ports[victim])), "{:?}", s.homes);
}

/// Per key, the member holding its events (received, not yet acked, on a connection still
/// open) and how many: a key held by two members at once breaks the group's per-key order.
#[derive(Default)]
struct Holding {
    by_key: HashMap<String, (usize, usize)>,
    overlaps: Vec<String>,
    acked: BTreeSet<(u64, u64)>,
    subscribed: usize,
}

impl Holding {
    fn take(&mut self, me: usize, key: &str, at: (u64, u64)) {
        let held = self.by_key.entry(key.to_string()).or_insert((me, 0));
        if held.0 != me && held.1 > 0 {
            self.overlaps.push(format!("{at:?} of key {key} at member {me} while member {} holds {} of that key", held.0, held.1));
            return;
        }
        *held = (me, held.1 + 1);
    }

    fn settle(&mut self, me: usize, key: &str) {
        if let Some(held) = self.by_key.get_mut(key).filter(|h| h.0 == me) {
            held.1 = held.1.saturating_sub(1);
        }
    }

    /// The member's connection ended: it works on none of what it held any more.
    fn drop_member(&mut self, me: usize) {
        self.by_key.retain(|_, (member, _)| *member != me);
    }
}

/// A member of group `g` (order by key) that presents no resume token: only the gateway knows
/// where the group stands. It works `work` on each event in turn and acks it; it follows
/// `reconnect`. It keeps reading its socket while it works, so it learns at once that its
/// connection ends (and drops what it holds), as a client with a reader of its own would.
async fn keyed_member(me: usize, known: Vec<String>, from: &'static str, work: Duration, total: usize, state: Arc<Mutex<Holding>>) {
    let started = Instant::now();
    let mut next: Option<String> = None;
    while state.lock().unwrap().acked.len() < total {
        assert!(started.elapsed() < Duration::from_secs(120), "member {me} gave up: {} of {total} acked", state.lock().unwrap().acked.len());
        let Some((_, mut client)) = connect_member(&mut next, &known, &format!("keyed-{me}")).await else { continue };
        client.send(json!({"op": "subscribe", "topic": TOPIC, "group": "g", "order": "key", "from": from})).await;
        // Events taken, worked on one after the other: when each is done, its key, offset and id.
        let mut working: VecDeque<(Instant, String, (u64, u64), Value)> = VecDeque::new();
        let mut req = 0u64;
        loop {
            while working.front().is_some_and(|(done, ..)| *done <= Instant::now()) {
                let (_, key, at, delivery_id) = working.pop_front().unwrap();
                // Settled here before the ack leaves: the group may hand the key on once the
                // ack reaches it.
                {
                    let mut s = state.lock().unwrap();
                    s.settle(me, &key);
                    s.acked.insert(at);
                }
                req += 1;
                let _ = client.try_send(json!({"op": "ack", "delivery_id": delivery_id, "req": req})).await;
            }
            if state.lock().unwrap().acked.len() >= total {
                break;
            }
            let wait = working.front().map_or(Duration::from_secs(3), |(done, ..)| done.saturating_duration_since(Instant::now()));
            let frame = match client.receive(wait.max(Duration::from_millis(1))).await {
                Received::Frame(frame) => frame,
                Received::Timeout if !working.is_empty() => continue,
                _ => break,
            };
            match frame["type"].as_str() {
                Some("subscribed") => state.lock().unwrap().subscribed += 1,
                Some("reconnect") => {
                    next = frame["ws_url"].as_str().map(str::to_string);
                    break;
                }
                Some("event") => {
                    let key = frame["key"].as_str().unwrap().to_string();
                    let at = (frame["partition"].as_u64().unwrap(), frame["offset"].as_u64().unwrap());
                    state.lock().unwrap().take(me, &key, at);
                    let start = working.back().map_or(Instant::now(), |(done, ..)| *done).max(Instant::now());
                    working.push_back((start + work, key, at, frame["delivery_id"].clone()));
                }
                _ => {}
            }
        }
        state.lock().unwrap().drop_member(me);
        drop(client);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three instances on one broker, every one naming the same home for group `g`: their URLs,
/// the processes, and the home's index.
async fn three_agreeing(cluster: &KafkaCluster) -> (Vec<Option<Process>>, usize) {
    let urls = &cluster.urls;
    let gateways: Vec<Option<Process>> = (0..3).map(|i| Some(cluster.start(i))).collect();
    let created = http().post(format!("{}/topics", urls[0])).json(&json!({"name": TOPIC, "partitions": PARTITIONS})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let mut home = String::new();
    wait_for("the instances agree on the group's home", async || {
        let mut homes = BTreeSet::new();
        for base in urls {
            let (_, answer) = get_json(&format!("{base}/session/recommend?group=g")).await;
            homes.insert(answer["http_url"].as_str().unwrap_or_default().to_string());
        }
        home = homes.first().cloned().unwrap_or_default();
        homes.len() == 1 && !home.is_empty()
    })
    .await;
    // Each has probed the others more than once.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let home = urls.iter().position(|u| *u == home).expect("the home is one of the instances");
    (gateways, home)
}

async fn publish_keyed(base: &str, count: usize) {
    for from in (0..count).step_by(250) {
        let events: Vec<Value> = (from..(from + 250).min(count)).map(|i| json!({"key": format!("k{}", i % 40), "payload": {"i": i}})).collect();
        let (status, body) = post_json(&format!("{base}/topics/{TOPIC}/events"), json!({ "events": events })).await;
        assert_eq!(status, 200, "{body}");
    }
}

/// Issue 59, item 3: the group's instance pauses (SIGSTOP) for longer than a few probes while
/// its members hold events, and a new member comes meanwhile. The others must not start the
/// group themselves: its hub still runs (paused), and its members still hold their keys. Before,
/// one missed probe moved the group's home: the new member's instance started a second hub from
/// its own floor (none: the whole log), and handed out keys the paused members held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_blip_of_the_groups_instance_starts_the_group_nowhere_else() {
    const TOTAL: usize = 2_000;
    let broker = TestBroker::start();
    let cluster = KafkaCluster::new(broker.bootstrap(), 3);
    let urls = cluster.urls.clone();
    let (gateways, home) = three_agreeing(&cluster).await;
    publish_keyed(&urls[0], TOTAL).await;
    let state = Arc::new(Mutex::new(Holding::default()));
    let work = Duration::from_millis(10);
    let mut members: Vec<_> = (0..3)
        .map(|me| {
            let known: Vec<String> = (0..3).map(|k| urls[(me + k) % 3].clone()).collect();
            tokio::spawn(keyed_member(me, known, "earliest", work, TOTAL, state.clone()))
        })
        .collect();
    wait_for("members are mid-stream", async || state.lock().unwrap().acked.len() >= 300).await;
    let paused = gateways[home].as_ref().unwrap();
    paused.signal("STOP");
    let other = (home + 1) % 3;
    // Several probe intervals (200 ms) pass: the others have seen it miss probes.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (_, during) = get_json(&format!("{}/session/recommend?group=g", urls[other])).await;
    let known: Vec<String> = (0..3).map(|k| urls[(other + k) % 3].clone()).collect();
    members.push(tokio::spawn(keyed_member(3, known, "earliest", work, TOTAL, state.clone())));
    tokio::time::sleep(Duration::from_millis(800)).await;
    paused.signal("CONT");
    for task in members {
        tokio::time::timeout(Duration::from_secs(150), task).await.expect("members finish").unwrap();
    }
    let s = state.lock().unwrap();
    assert!(s.overlaps.is_empty(), "a key at two members at once ({}): {:?}", s.overlaps.len(), &s.overlaps[..s.overlaps.len().min(5)]);
    assert_eq!(s.acked.len(), TOTAL, "every event reached a member and was acked");
    assert_eq!(during["http_url"], urls[home], "a paused instance keeps its groups for cluster.group_move_after_ms");
    drop(gateways);
}

/// Issue 59, item 3: the group's instance drains mid-stream; its members come without tokens
/// (`from: latest`, as a new deployment of them would). The group's hub there stops at once and
/// sends its members to the next instance, whose hub waits for it and starts from the floor it
/// left. Before, the next instance started the group from `latest`: every event the old one had
/// not handed out was lost, and both ran the group while the drain lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_instance_drains_goes_on_from_its_floor_at_the_next() {
    const TOTAL: usize = 2_000;
    let broker = TestBroker::start();
    let cluster = KafkaCluster::new(broker.bootstrap(), 3);
    let urls = cluster.urls.clone();
    let (gateways, home) = three_agreeing(&cluster).await;
    let state = Arc::new(Mutex::new(Holding::default()));
    let work = Duration::from_millis(10);
    let members: Vec<_> = (0..3)
        .map(|me| {
            let known: Vec<String> = (0..3).map(|k| urls[(me + k) % 3].clone()).collect();
            tokio::spawn(keyed_member(me, known, "latest", work, TOTAL, state.clone()))
        })
        .collect();
    wait_for("every member joined", async || state.lock().unwrap().subscribed >= 3).await;
    publish_keyed(&urls[0], TOTAL).await;
    wait_for("members are mid-stream", async || state.lock().unwrap().acked.len() >= 300).await;
    let (status, _) = post_json(&format!("{}/admin/drain", urls[home]), json!({})).await;
    assert_eq!(status, 200);
    for task in members {
        tokio::time::timeout(Duration::from_secs(150), task).await.expect("members finish").unwrap();
    }
    let s = state.lock().unwrap();
    assert!(s.overlaps.is_empty(), "a key at two members at once ({}): {:?}", s.overlaps.len(), &s.overlaps[..s.overlaps.len().min(5)]);
    assert_eq!(s.acked.len(), TOTAL, "every event published after the group began reached a member and was acked");
    drop(gateways);
}
