//! A shared subscription across a cluster (issue 44, "Across instances"): three instances on one
//! Kafka-protocol broker, the group's instance SIGKILLed mid-stream; its members follow
//! `reconnect` and `/session/recommend?group=` to the next instance, which resumes from the
//! group's stored floor: nothing lost, and the floor the members were told never moves back.

use std::collections::{BTreeMap, BTreeSet};
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

async fn member(me: usize, known: Vec<String>, seen: Arc<Mutex<Seen>>) {
    let mut next: Option<String> = None;
    let started = Instant::now();
    // The group's floor as this member was told it, and the last group token the gateway issued
    // it (`subscribed`, `ack_ok`): what it resumes the group with.
    let mut token: BTreeMap<String, u64> = BTreeMap::new();
    let mut issued: Option<String> = None;
    while seen.lock().unwrap().acked.len() < EVENTS {
        assert!(started.elapsed() < Duration::from_secs(120), "member {me} gave up");
        let Some(ws_url) = next.take().or(group_home(&known).await) else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let Some(mut client) = TestClient::try_connect_url(&format!("{ws_url}?client_id=member-{me}")).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
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
