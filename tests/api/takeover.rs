//! Takeover across instances, end to end: three real gateways on one Kafka-protocol broker
//! (tansu), clients spread by `/session/recommend`, a publisher running, one gateway killed with
//! SIGKILL mid-stream. Its clients follow the rules of docs/protocol.md (and of `clients/js/ackgate.js`
//! and `examples/ws_client.rs`): reconnect after a non-final close with backoff, ask
//! `/session/recommend` of an instance they know, resubscribe with a resume token built from the
//! `committed` offsets their `ack_ok` frames confirmed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::kafka_broker::TestBroker;
use crate::support::*;

const TOPIC: &str = "takeover";
const PARTITIONS: u32 = 4;
const CLIENTS: usize = 30;
const EVENTS: u64 = 3_000;

/// What one following client saw.
#[derive(Default, Debug)]
struct Seen {
    /// Every (partition, offset) received.
    received: BTreeSet<(u32, u64)>,
    /// The instance of each session, in order.
    instances: Vec<String>,
    /// Events pushed below the token the client had just presented: must stay empty.
    below_token: Vec<(u32, u64, u64)>,
    /// When its first session after the kill received its welcome.
    back_at: Option<Instant>,
    /// Its resume token at the end: the durable committed offsets its ack_ok frames confirmed.
    token: BTreeMap<u32, u64>,
}

/// A client following the rules, until it has received `until` events (the log's size, set once
/// the publisher is done).
async fn follow(client_id: String, mut known: Vec<String>, seen: Arc<Mutex<Seen>>, killed_at: Arc<Mutex<Option<Instant>>>, until: Arc<AtomicUsize>) {
    let mut committed: BTreeMap<u32, u64> = BTreeMap::new();
    // The last resume token the gateway issued (`subscribed`, `ack_ok`): what a reconnect sends.
    let mut issued: Option<String> = None;
    let mut attempt = 0u32;
    while seen.lock().unwrap().received.len() < until.load(Ordering::SeqCst) {
        let Some(ws_url) = recommended(&mut known, &client_id).await else {
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt.min(20)))).await;
            continue;
        };
        let Ok((mut ws, _)) = tokio_tungstenite::connect_async(format!("{ws_url}?client_id={client_id}")).await else {
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt.min(20)))).await;
            continue;
        };
        let token = committed.clone();
        let mut subscribe = json!({"op": "subscribe", "topic": TOPIC, "req": "sub"});
        if let Some(issued) = &issued {
            subscribe["resume"] = json!(issued);
        }
        if ws.send(Message::text(subscribe.to_string())).await.is_err() {
            continue;
        }
        // Silence means 30 s without a frame of the protocol: the gateway's keepalive pings
        // (every server.ws_ping_interval_ms) do not count.
        let mut quiet_until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let message = match tokio::time::timeout_at(quiet_until, ws.next()).await {
                Ok(Some(Ok(message))) => message,
                _ => break,
            };
            let text = match message {
                Message::Text(text) => {
                    quiet_until = tokio::time::Instant::now() + Duration::from_secs(30);
                    text
                }
                Message::Close(frame) => {
                    let code = frame.map_or(1005, |f| u16::from(f.code));
                    assert!(code != 4001 && code != 1008, "{client_id}: unexpected final close {code}");
                    break;
                }
                _ => continue,
            };
            let frame: Value = serde_json::from_str(text.as_str()).unwrap();
            match frame["type"].as_str() {
                Some("welcome") => {
                    let killed = killed_at.lock().unwrap().is_some();
                    let mut s = seen.lock().unwrap();
                    s.instances.push(frame["instance"].as_str().unwrap().to_string());
                    if killed && s.back_at.is_none() && s.instances.len() > 1 {
                        s.back_at = Some(Instant::now());
                    }
                    drop(s);
                    attempt = 0;
                }
                Some("subscribed") => {
                    assert_ne!(frame["resume"], "refused", "{client_id}: its token was refused: {frame}");
                    if let Some(t) = frame["token"].as_str() {
                        issued = Some(t.to_string());
                    }
                    for p in frame["partitions"].as_array().unwrap() {
                        let (partition, from) = (p["partition"].as_u64().unwrap() as u32, p["from"].as_u64().unwrap());
                        let start = committed.entry(partition).or_default();
                        *start = (*start).max(from);
                    }
                }
                Some("ack_ok") => {
                    if let Some(t) = frame["tokens"][TOPIC].as_str() {
                        issued = Some(t.to_string());
                    }
                    for (partition, offset) in frame["committed"][TOPIC].as_object().into_iter().flatten() {
                        let at = committed.entry(partition.parse().unwrap()).or_default();
                        *at = (*at).max(offset.as_u64().unwrap());
                    }
                    seen.lock().unwrap().token = committed.clone();
                }
                Some("event") => {
                    let (partition, offset) = (frame["partition"].as_u64().unwrap() as u32, frame["offset"].as_u64().unwrap());
                    {
                        let mut s = seen.lock().unwrap();
                        if let Some(&presented) = token.get(&partition) {
                            if offset < presented {
                                s.below_token.push((partition, offset, presented));
                            }
                        }
                        s.received.insert((partition, offset));
                    }
                    let ack = json!({"op": "ack", "delivery_id": frame["delivery_id"], "req": offset});
                    if ws.send(Message::text(ack.to_string())).await.is_err() {
                        break;
                    }
                    let done = seen.lock().unwrap().received.len() >= until.load(Ordering::SeqCst);
                    if done {
                        // Drain the last ack_ok frames so the committed offsets are durable.
                        let _ = tokio::time::timeout(Duration::from_millis(300), async { while ws.next().await.is_some() {} }).await;
                        return;
                    }
                }
                _ => {}
            }
        }
        attempt += 1;
        // Exponential backoff with jitter, as the real clients do (bounded for the test).
        let pause = 100u64 * (1 << attempt.min(4)) / 2 + (client_id.len() as u64 * 37 + u64::from(attempt) * 11) % 100;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Asks each known instance in turn; learns the instance named.
async fn recommended(known: &mut Vec<String>, client_id: &str) -> Option<String> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    for base in known.clone() {
        let Ok(answer) = http.get(format!("{base}/session/recommend?client_id={client_id}")).send().await else { continue };
        let Ok(answer) = answer.json::<Value>().await else { continue };
        if let Some(url) = answer["http_url"].as_str() {
            if !known.iter().any(|k| k == url) {
                known.push(url.to_string());
            }
        }
        return answer["ws_url"].as_str().map(str::to_string);
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_loses_no_event_its_clients_follow_recommend_to_the_survivors() {
    let broker = TestBroker::start();
    let cluster = KafkaCluster::new(broker.bootstrap(), 3);
    let (ports, urls) = (&cluster.ports, &cluster.urls);
    let mut gateways: Vec<Option<Process>> = (0..3).map(|i| Some(cluster.start(i))).collect();
    let first = gateways[0].as_ref().unwrap().base.clone();
    let created = http().post(format!("{first}/topics")).json(&json!({"name": TOPIC, "partitions": PARTITIONS})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    // Every instance sees every peer healthy before clients are spread.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let killed_at = Arc::new(Mutex::new(None));
    let until = Arc::new(AtomicUsize::new(usize::MAX));
    let seen: Vec<Arc<Mutex<Seen>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let mut followers = Vec::new();
    for (i, s) in seen.iter().enumerate() {
        // Built with the list of instances, as a client is given its cluster (rotated, so the first
        // question goes to different instances).
        let known: Vec<String> = (0..3).map(|k| urls[(i + k) % 3].clone()).collect();
        followers.push(tokio::spawn(follow(format!("follower-{i}"), known, s.clone(), killed_at.clone(), until.clone())));
    }
    // Publish through the instances in turn while the clients consume.
    let publish_to = urls.clone();
    let publisher = tokio::spawn(async move {
        for chunk in 0..(EVENTS / 100) {
            let events: Vec<Value> = (0..100).map(|j| json!({"key": format!("k{}", chunk * 100 + j), "payload": {"n": chunk * 100 + j}})).collect();
            // A publish to the instance being killed may fail: the next instance is asked.
            for attempt in 0..6 {
                let base = &publish_to[(chunk as usize + attempt) % 3];
                let sent = http().post(format!("{base}/topics/{TOPIC}/events")).json(&json!({ "events": events })).send().await;
                if sent.is_ok_and(|r| r.status() == 200) {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });

    // Kill the instance most clients are on, once they are mid-stream.
    let started = Instant::now();
    while seen.iter().map(|s| s.lock().unwrap().received.len()).sum::<usize>() < CLIENTS * 300 {
        assert!(started.elapsed() < Duration::from_secs(60), "clients did not start receiving");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut by_instance: BTreeMap<String, usize> = BTreeMap::new();
    for s in &seen {
        if let Some(instance) = s.lock().unwrap().instances.last() {
            *by_instance.entry(instance.clone()).or_default() += 1;
        }
    }
    assert!(by_instance.len() >= 2, "recommend spread the clients over the instances: {by_instance:?}");
    let (victim_name, victims) = by_instance.iter().max_by_key(|(_, n)| **n).map(|(k, n)| (k.clone(), *n)).unwrap();
    let victim = ports.iter().position(|p| victim_name.ends_with(&format!(":{p}"))).expect("instance ids end with their port");
    *killed_at.lock().unwrap() = Some(Instant::now());
    gateways[victim].take().unwrap().kill9();
    let kill = Instant::now();
    publisher.await.unwrap();
    // A publish retried after the victim died may have been written twice: the log is the truth.
    let survivor = &urls[(victim + 1) % 3];
    let (status, topics) = get_json(&format!("{survivor}/topics")).await;
    assert_eq!(status, 200);
    let topic = topics["topics"].as_array().unwrap().iter().find(|t| t["name"] == TOPIC).unwrap();
    let log: BTreeSet<(u32, u64)> = topic["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let partition = p["partition"].as_u64().unwrap() as u32;
            (p["log_start"].as_u64().unwrap()..p["log_end"].as_u64().unwrap()).map(move |o| (partition, o))
        })
        .collect();
    assert!(log.len() as u64 >= EVENTS, "every event was published: {} in the log", log.len());
    until.store(log.len(), Ordering::SeqCst);

    for (i, follower) in followers.into_iter().enumerate() {
        tokio::time::timeout(Duration::from_secs(120), follower)
            .await
            .unwrap_or_else(|_| panic!("follower-{i} did not receive everything: {:?}", seen[i].lock().unwrap().received.len()))
            .unwrap();
    }
    let mut moved = 0;
    let mut takeover = Vec::new();
    for (i, s) in seen.iter().enumerate() {
        let s = s.lock().unwrap();
        assert_eq!(s.received, log, "follower-{i} received every event of the log");
        assert!(s.below_token.is_empty(), "follower-{i} got events below the token it presented: {:?}", s.below_token);
        let on_victim = s.instances.contains(&victim_name);
        if on_victim && s.instances.last() != Some(&victim_name) {
            moved += 1;
            if let Some(back) = s.back_at {
                takeover.push(back.saturating_duration_since(kill));
            }
        }
        assert_ne!(s.instances.last(), Some(&victim_name), "follower-{i} is not left on the dead instance");
    }
    assert!(moved >= victims, "every client of the killed instance ({victims}) moved to a survivor ({moved} did)");
    takeover.sort();
    eprintln!("takeover: {moved} clients moved; kill to welcome on a survivor: min {:?}, max {:?}", takeover.first(), takeover.last());

    // The killed instance comes back with the offsets it had stored when it died. A client that
    // moved away and later lands on it again resumes from its token, not from that stale offset.
    let restarted = cluster.start(victim);
    let (mover, token) = seen
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.lock().unwrap()))
        .find(|(_, s)| s.instances.first() == Some(&victim_name))
        .map(|(i, s)| (format!("follower-{i}"), s.token.clone()))
        .expect("a client started on the killed instance");
    let mut stale: BTreeMap<u32, u64> = BTreeMap::new();
    for p in 0..PARTITIONS {
        let committed = stored_offset(&restarted.base, TOPIC, &mover, p).await;
        stale.insert(p, committed.and_then(|r| r["committed"].as_u64()).unwrap_or(0));
    }
    assert!(token.iter().any(|(p, t)| *t > stale[p]), "the killed instance's stored offsets are stale: {stale:?} vs token {token:?}");
    let mut back = TestClient::connect(restarted.addr, &mover).await;
    let resume: serde_json::Map<String, Value> = token.iter().map(|(p, o)| (p.to_string(), json!(o))).collect();
    let subscribed = back.subscribe(TOPIC, json!({ "resume": resume })).await;
    for p in subscribed["partitions"].as_array().unwrap() {
        let partition = p["partition"].as_u64().unwrap() as u32;
        assert_eq!(p["from"].as_u64(), token.get(&partition).copied(), "partition {partition} starts at the token, not at the stale {}", stale[&partition]);
    }
    // Only what the token does not cover comes (acks whose ack_ok the client had not seen yet):
    // each at or above the token, never the stale stretch below it.
    let expected: usize = log.iter().filter(|(p, o)| *o >= token.get(p).copied().unwrap_or(0)).count();
    let replayed = back.recv_events(expected).await;
    for event in &replayed {
        let (partition, offset) = (event["partition"].as_u64().unwrap() as u32, event["offset"].as_u64().unwrap());
        assert!(offset >= token[&partition], "{mover} got offset {offset} of partition {partition}, below its token {}", token[&partition]);
    }
    back.expect_silence(Duration::from_millis(500)).await;
    back.close().await;
}

/// The browser console connected to instance A keeps receiving after A is killed: headless
/// Chromium runs `tests/browser/takeover.mjs`, which connects on A (with B named as another
/// instance) and subscribes with auto-ack; A is then killed and an event is published through B;
/// the page reconnects by itself and receives and acks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_follows_a_takeover_in_a_real_browser() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let broker = TestBroker::start();
    let bootstrap = broker.bootstrap();
    let ports = [free_port(), free_port()];
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let peers = serde_json::to_string(&urls).unwrap();
    let env = [
        ("ACKGATE_STORAGE__BACKEND", "kafka"),
        ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("ACKGATE_CLUSTER__PEERS", peers.as_str()),
        ("ACKGATE_CLUSTER__TOKEN_KEY", CLUSTER_TOKEN_KEY),
        ("ACKGATE_CLUSTER__PROBE_INTERVAL_MS", "200"),
    ];
    let (_a_dir, a_data) = temp_dir();
    let (_b_dir, b_data) = temp_dir();
    let a = Process::start_at(&a_data, &format!("127.0.0.1:{}", ports[0]), &env);
    let b = Process::start_at(&b_data, &format!("127.0.0.1:{}", ports[1]), &env);
    let created = http().post(format!("{}/topics", a.base)).json(&json!({"name": "web", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);

    let screenshot = std::env::temp_dir().join(format!("ackgate-takeover-{}.png", std::process::id()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/takeover.mjs");
    let mut node =
        Command::new("node").arg(script).arg(&urls[0]).arg(&urls[1]).arg(&screenshot).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("node runs");
    let stdout = node.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut seen = Vec::new();
    loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.recv()).await.expect("the page subscribes in time");
        let Some(line) = line else {
            let output = node.wait_with_output().unwrap();
            panic!("the browser script ended early: {seen:?}\n{}", String::from_utf8_lossy(&output.stderr));
        };
        seen.push(line.clone());
        if line == "subscribed" {
            break;
        }
    }
    a.kill9();
    let published = http().post(format!("{}/topics/web/events", urls[1])).json(&json!({"payload": {"msg": "after the kill"}})).send().await.unwrap();
    assert_eq!(published.status(), 200);
    let output = tokio::task::spawn_blocking(move || node.wait_with_output().unwrap()).await.unwrap();
    while let Ok(line) = lines.try_recv() {
        seen.push(line);
    }
    assert!(output.status.success(), "browser takeover failed: {seen:?}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(seen.iter().any(|l| l.starts_with("received after the kill")), "{seen:?}");
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "takeover screenshot: {}", screenshot.display());
    // B stored the console client's ack of the event it received there.
    let row = stored_offset(&b.base, "web", "browser-takeover", 0).await.expect("the console's client has an offset on B");
    assert_eq!(row["committed"], 1);
}

/// A client that comes without a resume token to an instance that has no record of it (rendezvous
/// hashing moved it after instances were added or removed) starts from its records at the peers
/// (issue 45, item 5): not from the log start (`earliest`: everything again), not from the end
/// (`latest`: a silent skip). A peer that does not answer leaves the start to the reset policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_token_starts_on_a_new_instance_from_its_records_at_the_peers() {
    let broker = TestBroker::start();
    let cluster = KafkaCluster::new(broker.bootstrap(), 2);
    let first = cluster.start(0);
    // The instance it moves to skips to the end for a client it knows nothing of.
    let second = cluster.start_with(1, &[("ACKGATE_DELIVERY__RESET_POLICY", "latest")]);
    let created = http().post(format!("{}/topics", first.base)).json(&json!({"name": "moved", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let publish = |base: String, n: u64| async move {
        let events: Vec<Value> = (0..n).map(|i| json!({"payload": {"n": i}})).collect();
        let sent = http().post(format!("{base}/topics/moved/events")).json(&json!({ "events": events })).send().await.unwrap();
        assert_eq!(sent.status(), 200);
    };
    publish(first.base.clone(), 5).await;
    // Two clients read and ack everything on the first instance, then leave.
    for client_id in ["c", "e"] {
        let mut client = TestClient::connect(first.addr, client_id).await;
        client.subscribe("moved", json!({})).await;
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(client.recv_type("event").await);
        }
        let acked = client.ack_confirmed(&ids.iter().map(id).collect::<Vec<_>>(), "all").await;
        assert_eq!(acked["committed"], json!({"moved": {"0": 5}}), "{acked}");
    }
    publish(first.base.clone(), 3).await;

    // `c` comes to the second instance without its token: it starts where it acked.
    let mut moved = TestClient::connect(second.addr, "c").await;
    let subscribed = moved.subscribe("moved", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 5, "from its records at the peer, not the end (8) nor the start: {subscribed}");
    assert_eq!(moved.recv_type("event").await["offset"], 5);
    second.wait_for_log("starting from the client's records at the peers").await;
    // A client no instance knows starts at the policy.
    let mut new = TestClient::connect(second.addr, "d").await;
    assert_eq!(new.subscribe("moved", json!({})).await["partitions"][0]["from"], 8);

    // The peer that holds `e`'s records is gone: the start is the policy's, and the log says why.
    first.kill9();
    let mut orphan = TestClient::connect(second.addr, "e").await;
    assert_eq!(orphan.subscribe("moved", json!({})).await["partitions"][0]["from"], 8, "no peer answered: reset_policy");
    second.wait_for_log("a peer did not answer for a client's records").await;
}

/// The instance `/session/recommend` at `base` sends `client_id` to: its `http_url`.
async fn recommended_url(base: &str, client_id: &str) -> String {
    let (status, body) = get_json(&format!("{base}/session/recommend?client_id={client_id}")).await;
    assert_eq!(status, 200, "{body}");
    body["http_url"].as_str().unwrap().to_string()
}

/// Issue 45's shape for scaling out: three instances on Kafka, then a fourth. Every client reads
/// and acks on the instance `/session/recommend` names, and comes back without its resume token
/// (a reloaded page) to the instance it names now. Those rendezvous hashing sends to the fourth
/// start where they acked: not from the log start (`earliest`, the default policy: a replay),
/// not from the end (a skip of what they never got).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_tokens_that_scaling_out_moves_to_a_fourth_instance_start_where_they_acked() {
    const CLIENTS: usize = 32;
    let broker = TestBroker::start();
    let cluster = KafkaCluster::new(broker.bootstrap(), 4);
    let mut instances: Vec<Process> = (0..3).map(|i| cluster.start(i)).collect();
    let created = http().post(format!("{}/topics", instances[0].base)).json(&json!({"name": "scaled", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let publish = |base: String, n: u64| async move {
        let events: Vec<Value> = (0..n).map(|i| json!({"payload": {"n": i}})).collect();
        let sent = http().post(format!("{base}/topics/scaled/events")).json(&json!({ "events": events })).send().await.unwrap();
        assert_eq!(sent.status(), 200);
    };
    publish(instances[0].base.clone(), 4).await;
    let mut homes = BTreeSet::new();
    for c in 0..CLIENTS {
        let client_id = format!("s-{c}");
        let url = recommended_url(&instances[0].base, &client_id).await;
        assert_ne!(url, cluster.urls[3], "the fourth is not running yet");
        homes.insert(url.clone());
        let mut client = TestClient::connect(url.trim_start_matches("http://").parse().unwrap(), &client_id).await;
        client.subscribe("scaled", json!({})).await;
        let events = client.recv_events(4).await;
        let acked = client.ack_confirmed(&ids(&events), "all").await;
        assert_eq!(acked["committed"], json!({"scaled": {"0": 4}}), "{acked}");
        client.close().await;
    }
    assert_eq!(homes.len(), 3, "the clients were spread over the three: {homes:?}");
    publish(instances[0].base.clone(), 3).await;

    instances.push(cluster.start(3));
    let mut moved = Vec::new();
    wait_for("the three see the fourth ready and send clients to it", async || {
        moved.clear();
        for c in 0..CLIENTS {
            let client_id = format!("s-{c}");
            if recommended_url(&instances[0].base, &client_id).await == cluster.urls[3] {
                moved.push(client_id);
            }
        }
        !moved.is_empty()
    })
    .await;
    for client_id in &moved {
        let mut client = TestClient::connect(instances[3].addr, client_id).await;
        let subscribed = client.subscribe("scaled", json!({})).await;
        assert_eq!(subscribed["partitions"][0]["from"], 4, "{client_id} starts where it acked, not at 0 nor at 7: {subscribed}");
        assert_eq!(client.recv_type("event").await["offset"], 4, "{client_id}");
        client.close().await;
    }
    instances[3].wait_for_log("starting from the client's records at the peers").await;
}
