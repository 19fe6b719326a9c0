//! Backend conformance: one set of test bodies, run against every backend from its own module
//! (`embedded`, `kafka`). A body sees the gateway only through HTTP and WebSockets; the harness
//! says how to start a gateway on its backend and how to cut the head of a log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ackgate::config::Config;
use ackgate::core::clock::ManualClock;
use serde_json::{json, Value};

use crate::kafka_broker::TestBroker;
use crate::rocketmq_broker::TestRocketMq;
use crate::support::*;

mod embedded;
mod kafka;
mod rocketmq;
mod rocketmq_lite;

/// The parent of the lite topics of `Harness::rocketmq_lite`.
const LITE_PARENT: &str = "lp";

/// The backend under test.
pub enum Backend {
    Embedded,
    /// Behind a lock: `cut_log` restarts the broker.
    Kafka(std::sync::Mutex<TestBroker>),
    /// rocketmq-rust's name server and broker, in `pop` or `pull` mode.
    RocketMq(TestRocketMq, &'static str),
}

pub struct Harness {
    pub backend: Backend,
    /// RocketMQ lite topics: every topic a body names is a lite topic of `LITE_PARENT` (with one
    /// partition per master broker).
    lite: Option<u32>,
    _dir: tempfile::TempDir,
    pub data: PathBuf,
    /// The embedded log's clock: `cut_log` moves it past the log retention.
    clock: Arc<ManualClock>,
}

impl Harness {
    pub fn embedded() -> Self {
        Self::new(Backend::Embedded)
    }

    pub fn kafka() -> Self {
        Self::new(Backend::Kafka(std::sync::Mutex::new(TestBroker::start())))
    }

    /// RocketMQ in `mode` on a cluster of `masters` masters. With several, a topic whose
    /// partitions divide evenly among them is created at the broker on every master (a queue set
    /// on each, as `mqadmin updateTopic -c cluster` does); any other through `POST /topics`
    /// (the first master only).
    pub fn rocketmq(mode: &'static str, masters: usize) -> Self {
        Self::new(Backend::RocketMq(TestRocketMq::start_cluster(masters, ""), mode))
    }

    /// RocketMQ (pop) where each topic a body names is a lite topic of `LITE_PARENT`, on a
    /// cluster of `partitions` masters (a lite topic has one partition per master).
    pub fn rocketmq_lite(partitions: u32) -> Self {
        let mut harness = Self::new(Backend::RocketMq(TestRocketMq::start_cluster(partitions as usize, ""), "pop"));
        harness.lite = Some(partitions);
        harness
    }

    /// The topic a body calls `name`: itself, or the lite topic `LITE_PARENT@name`.
    pub fn topic(&self, name: &str) -> String {
        match self.lite {
            Some(_) => format!("{LITE_PARENT}@{name}"),
            None => name.to_string(),
        }
    }

    /// Creates the topic a body calls `name`; for a lite topic its parent (a lite topic needs
    /// no creation), and the body must ask for as many partitions as the cluster has masters.
    /// ackgate creates a topic on the first master only, so a topic spread over several masters
    /// (a lite parent, or a topic of a multi-master cluster) is created on every master at the
    /// broker, as another tool would.
    pub async fn create_topic(&self, base: &str, name: &str, partitions: u32) {
        let Backend::RocketMq(broker, _) = &self.backend else { return create_topic(base, name, partitions).await };
        let masters = broker.brokers().await;
        let count = masters.len() as u32;
        let (topic, queues, lite) = match self.lite {
            Some(_) => {
                assert_eq!(partitions, count, "a lite topic has one partition per master: run this body on {partitions} brokers");
                (LITE_PARENT, 1, true)
            }
            None if count > 1 && partitions % count == 0 => (name, partitions / count, false),
            None => return create_topic(base, name, partitions).await,
        };
        // Routed on every master before the gateway first looks (it keeps a route it found).
        let admin = ackgate::backend::rocketmq::Broker::new(broker.namesrv(), Duration::from_secs(5));
        admin.create_topic_on_every_master(topic, queues, lite).await.expect("created on every master");
    }

    fn new(backend: Backend) -> Self {
        let (dir, data) = temp_dir();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        Self { backend, lite: None, _dir: dir, data, clock: Arc::new(ManualClock::new(now)) }
    }

    pub fn config(&self) -> Config {
        let mut config = test_config(&self.data);
        if let Backend::Kafka(broker) = &self.backend {
            config.storage.backend = ackgate::config::BackendKind::Kafka;
            config.kafka.bootstrap_servers = broker.lock().unwrap().bootstrap();
        } else if let Backend::RocketMq(broker, mode) = &self.backend {
            config.storage.backend = ackgate::config::BackendKind::RocketMq;
            config.rocketmq.namesrv_addr = broker.namesrv();
            config.rocketmq.mode = if *mode == "pull" { ackgate::config::RocketMqMode::Pull } else { ackgate::config::RocketMqMode::Pop };
            if self.lite.is_some() {
                config.rocketmq.lite_parents = vec![LITE_PARENT.to_string()];
            }
        } else {
            // Log retention runs often, so `cut_log` below only has to wait for it; an hour of
            // log retention is far below the offsets' (a week), so moving the clock past the
            // first never expires a client's offsets.
            config.embedded.retention_check_interval_ms = 100;
            config.embedded.retention_secs = 3600;
        }
        config
    }

    pub async fn start(&self) -> InProcess {
        InProcess::start_with_clock(self.config(), self.clock.clone()).await
    }

    /// Creates a topic whose log retention `cut_log` can apply: through `POST /topics` on the
    /// embedded log; on Kafka with `cleanup.policy=delete` and `retention.ms=1000`.
    pub async fn create_topic_with_retention(&self, base: &str, name: &str, partitions: u32) {
        let Backend::Kafka(broker) = &self.backend else {
            return create_topic(base, name, partitions).await;
        };
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let bootstrap = broker.lock().unwrap().bootstrap();
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
        let topic = NewTopic::new(name, partitions as i32, TopicReplication::Fixed(1)).set("cleanup.policy", "delete").set("retention.ms", "1000");
        let created = admin.create_topics([&topic], &AdminOptions::new()).await.unwrap();
        assert!(created[0].is_ok(), "create {name}: {created:?}");
    }

    /// Removes every event of `topic#partition` published so far (`before` is its log end), the
    /// way each backend's log retention does, and returns once `GET /topics` shows the new log
    /// start. Embedded: the log's clock moves past its retention. Kafka (tansu): tansu deletes
    /// by `retention.ms` only in its maintenance pass, which runs when the broker starts (and
    /// every 10 minutes), and its SQLite engine does not implement DeleteRecords; so the records
    /// are left to age past 1 s and the broker is restarted. tansu also reports a high watermark
    /// of 0 for a partition whose records were all deleted, so one fresh event is published
    /// first and survives the cut (callers read the bounds instead of assuming the log is empty).
    pub async fn cut_log(&self, base: &str, topic: &str, partition: u32, before: u64) {
        match &self.backend {
            Backend::Embedded => self.clock.advance(self.config().embedded.retention_secs * 1000 + 1000),
            Backend::RocketMq(..) => {
                panic!("rocketmq-rust deletes commit log files only after hours (fileReservedTime); the retention body does not run on it")
            }
            Backend::Kafka(broker) => {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                publish(base, topic, json!({"partition": partition, "payload": {"kept": true}})).await;
                let mut broker = broker.lock().unwrap();
                broker.stop();
                broker.resume();
            }
        }
        for _ in 0..300 {
            if let Some((start, _, _)) = try_bounds(base, topic, partition).await {
                if start >= before {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("log start of {topic}#{partition} did not reach {before}: {:?}", try_bounds(base, topic, partition).await);
    }
}

/// Like `bounds`, but `None` while the backend answers an error (a broker restarting).
pub async fn try_bounds(base: &str, topic: &str, partition: u32) -> Option<(u64, u64, Option<u64>)> {
    let (status, _) = get_json(&topics_url(base, topic)).await;
    if status != 200 {
        return None;
    }
    Some(bounds(base, topic, partition).await)
}

/// Where `GET /topics` lists `topic`: a lite topic among its parent's.
fn topics_url(base: &str, topic: &str) -> String {
    match topic.split_once('@') {
        Some((parent, _)) => format!("{base}/topics?parent={parent}&limit=1000"),
        None => format!("{base}/topics"),
    }
}

/// `(log_start, log_end, pull_offset)` of one partition from `GET /topics` (for a lite topic
/// `GET /topics?parent=`).
pub async fn bounds(base: &str, topic: &str, partition: u32) -> (u64, u64, Option<u64>) {
    let (status, body) = get_json(&topics_url(base, topic)).await;
    assert_eq!(status, 200, "GET /topics: {body}");
    let topic = body["topics"].as_array().unwrap().iter().find(|t| t["name"] == topic).unwrap_or_else(|| panic!("{topic} listed in {body}"));
    let p = &topic["partitions"][partition as usize];
    (p["log_start"].as_u64().unwrap(), p["log_end"].as_u64().unwrap(), p["pull_offset"].as_u64())
}

/// The log end once it reaches `expected` (at most `WAIT`): RocketMQ's broker indexes a stored
/// message into its consume queue a few milliseconds after the send returns, and the log end is
/// that queue's. Anything other than `expected` after the wait fails the test.
async fn log_end_reaches(base: &str, topic: &str, partition: u32, expected: u64) -> u64 {
    let started = std::time::Instant::now();
    loop {
        let end = bounds(base, topic, partition).await.1;
        if end == expected || started.elapsed() > WAIT {
            return end;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn create_topic(base: &str, name: &str, partitions: u32) {
    let created = http().post(format!("{base}/topics")).json(&json!({"name": name, "partitions": partitions})).send().await.unwrap();
    assert_eq!(created.status(), 200, "create {name}: {:?}", created.text().await);
}

/// Publishes `{"n": first..first+count}` to one partition; answers the offsets written.
async fn publish_to(base: &str, topic: &str, partition: u32, first: u64, count: u64) -> Vec<u64> {
    let events: Vec<Value> = (first..first + count).map(|n| json!({"partition": partition, "payload": {"n": n}})).collect();
    let answer = publish(base, topic, json!({ "events": events })).await;
    answer["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            assert_eq!(o["partition"], partition);
            o["offset"].as_u64().unwrap()
        })
        .collect()
}

fn numbers(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["payload"]["n"].as_u64().unwrap()).collect()
}

async fn committed(base: &str, topic: &str, client: &str, partition: u32) -> Option<u64> {
    stored_offset(base, topic, client, partition).await.map(|row| row["committed"].as_u64().unwrap())
}

// ---- bodies -------------------------------------------------------------------------------

/// Issue 25, replay by time: `subscribe` with `"from": {"time": ms}` starts each partition at its
/// first offset stamped at or after it (so only the second batch here), and the admin reset takes
/// `{"time"}` as well as `{"offset"}`. Time on the embedded log is its clock, moved between the
/// batches; on the brokers the wall clock, waited on.
pub async fn a_subscribe_by_time_starts_at_the_first_event_at_or_after_it(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("timed");
    h.create_topic(&gw.base, "timed", 2).await;
    for partition in 0..2 {
        publish_to(&gw.base, &t, partition, 0, 3).await;
    }
    let between = match &h.backend {
        Backend::Embedded => {
            h.clock.advance(10_000);
            ackgate::core::clock::Clock::now_ms(h.clock.as_ref())
        }
        _ => {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
            tokio::time::sleep(Duration::from_millis(1100)).await;
            now
        }
    };
    for partition in 0..2 {
        publish_to(&gw.base, &t, partition, 10, 2).await;
        assert_eq!(log_end_reaches(&gw.base, &t, partition, 5).await, 5);
    }
    let mut client = TestClient::connect(gw.addr(), "by-time").await;
    let subscribed = client.subscribe(&t, json!({"from": {"time": between}})).await;
    assert_eq!(subscribed["partitions"], json!([{"partition": 0, "from": 3, "epoch": 0}, {"partition": 1, "from": 3, "epoch": 0}]), "{subscribed}");
    let mut got = numbers(&client.recv_events(4).await);
    got.sort();
    assert_eq!(got, vec![10, 10, 11, 11]);
    client.close().await;
    let mut early = TestClient::connect(gw.addr(), "from-zero").await;
    let subscribed = early.subscribe(&t, json!({"from": {"time": 0}})).await;
    assert_eq!(subscribed["partitions"][1]["from"], 0, "{subscribed}");
    early.close().await;
    // A time after every stamp starts at the end, not the start (tansu 0.6 answers such a
    // ListOffsets with offset 0: found by the fault suite's replays by time).
    let later = match &h.backend {
        Backend::Embedded => ackgate::core::clock::Clock::now_ms(h.clock.as_ref()) + 60_000,
        _ => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64 + 60_000,
    };
    let mut late = TestClient::connect(gw.addr(), "from-later").await;
    let subscribed = late.subscribe(&t, json!({"from": {"time": later}})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 5, "{subscribed}");
    assert_eq!(subscribed["partitions"][1]["from"], 5, "{subscribed}");
    late.close().await;
    // The admin reset by time, for a client that has read everything.
    consume_and_ack(gw.addr(), "rewound", &t, 10).await.close().await;
    let url = format!("{}/admin/offsets/{t}/rewound/1", gw.base);
    let mut status = 409;
    for _ in 0..100 {
        let response = http().put(&url).json(&json!({"time": between})).send().await.unwrap();
        status = response.status().as_u16();
        if status != 409 {
            assert_eq!(response.json::<Value>().await.unwrap()["committed"], 3);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200);
    let both = http().put(&url).json(&json!({"time": between, "offset": 1})).send().await.unwrap();
    assert_eq!(both.status(), 400);
    gw.stop().await;
}

/// POSTs `body` to `topic` with an `Idempotency-Key`; answers the status, the replay header and
/// the body.
async fn publish_with_key(base: &str, topic: &str, key: &str, body: &Value) -> (u16, bool, Value) {
    let response = http().post(format!("{base}/topics/{topic}/events")).header("Idempotency-Key", key).json(body).send().await.unwrap();
    let (status, replayed) = (response.status().as_u16(), response.headers().contains_key("idempotent-replayed"));
    (status, replayed, response.json().await.unwrap())
}

/// Issue 25, idempotent publish: a retry with the same `Idempotency-Key` and body answers the
/// first offsets without writing, also after a restart; another body under the key is 409; the
/// key is per topic; after `publish.idempotency_window_secs` it is forgotten; a malformed key is
/// 400.
pub async fn an_idempotent_publish_writes_once(h: &Harness) {
    let gw = h.start().await;
    let once = h.topic("once");
    let twice = h.topic("twice");
    h.create_topic(&gw.base, "once", 1).await;
    h.create_topic(&gw.base, "twice", 1).await;
    let first = json!({"events": [{"partition": 0, "payload": {"n": 0}}, {"partition": 0, "payload": {"n": 1}}]});
    let (status, replayed, answer) = publish_with_key(&gw.base, &once, "order-42", &first).await;
    assert_eq!((status, replayed), (200, false), "{answer}");
    assert_eq!(answer["offsets"], json!([{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1}]));
    let (status, replayed, again) = publish_with_key(&gw.base, &once, "order-42", &first).await;
    assert_eq!((status, replayed, &again), (200, true, &answer), "a retry answers the first offsets");
    let (status, _, other) = publish_with_key(&gw.base, &once, "order-42", &json!({"partition": 0, "payload": {"n": 9}})).await;
    assert_eq!((status, other["error"]["code"].as_str()), (409, Some("conflict")), "{other}");
    // The key is per topic.
    let (status, replayed, elsewhere) = publish_with_key(&gw.base, &twice, "order-42", &first).await;
    assert_eq!((status, replayed), (200, false), "{elsewhere}");
    // Nothing was written by the retry or the refused body: the next event lands at 2.
    assert_eq!(publish_to(&gw.base, &once, 0, 2, 1).await, vec![2]);
    for bad in [b"has space".to_vec(), vec![b'k'; 129], "caf\u{e9}".as_bytes().to_vec()] {
        let key = reqwest::header::HeaderValue::from_bytes(&bad).unwrap();
        let response = http().post(format!("{}/topics/{once}/events", gw.base)).header("Idempotency-Key", key).json(&first).send().await.unwrap();
        assert_eq!(response.status(), 400, "key {:?}", String::from_utf8_lossy(&bad));
    }
    gw.stop().await;

    // Remembered in the offset store: a retry after a restart still writes nothing.
    let gw = h.start().await;
    let (status, replayed, again) = publish_with_key(&gw.base, &once, "order-42", &first).await;
    assert_eq!((status, replayed, &again), (200, true, &answer));
    // Past the window the key is forgotten: the same request writes again.
    h.clock.advance(h.config().publish.idempotency_window_secs * 1000 + 1000);
    let (status, replayed, later) = publish_with_key(&gw.base, &once, "order-42", &first).await;
    assert_eq!((status, replayed), (200, false), "{later}");
    assert_eq!(later["offsets"], json!([{"partition": 0, "offset": 3}, {"partition": 0, "offset": 4}]));
    gw.stop().await;
}

/// Publishing answers the real partition and offset of each event, in order; `GET /topics`
/// shows the log end; events keep key, headers and JSON or binary payloads.
pub async fn publish_answers_offsets_and_events_keep_their_fields(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("orders");
    h.create_topic(&gw.base, "orders", 2).await;
    assert_eq!(publish_to(&gw.base, &t, 1, 0, 3).await, vec![0, 1, 2]);
    let single = publish(&gw.base, &t, json!({"partition": 1, "key": "k-1", "headers": {"h": "v"}, "payload": {"n": 3}})).await;
    assert_eq!(single["offsets"], json!([{"partition": 1, "offset": 3}]));
    publish(&gw.base, &t, json!({"partition": 1, "payload_base64": "AAEC"})).await;
    assert_eq!(log_end_reaches(&gw.base, &t, 1, 5).await, 5);
    assert_eq!(bounds(&gw.base, &t, 0).await.1, 0);

    let mut client = TestClient::connect(gw.addr(), "fields").await;
    let subscribed = client.subscribe(&t, json!({})).await;
    assert_eq!(subscribed["partitions"], json!([{"partition": 0, "from": 0, "epoch": 0}, {"partition": 1, "from": 0, "epoch": 0}]));
    let events = client.recv_events(5).await;
    assert_eq!(events.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    assert_eq!(events[3]["key"], "k-1");
    assert_eq!(events[3]["headers"], json!({"h": "v"}));
    assert_eq!(events[3]["payload"], json!({"n": 3}));
    assert_eq!(events[4]["payload_base64"], "AAEC");
    assert!(events[4].get("payload").is_none());
    gw.stop().await;
}

/// Every event of every partition reaches the subscriber; acks move the committed offsets to the
/// log end, durably (the `ack_ok` answer and the admin route agree).
pub async fn subscribe_receives_everything_and_acks_commit(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("feed");
    h.create_topic(&gw.base, "feed", 2).await;
    publish_to(&gw.base, &t, 0, 0, 10).await;
    publish_to(&gw.base, &t, 1, 10, 10).await;
    let mut client = TestClient::connect(gw.addr(), "reader").await;
    client.subscribe(&t, json!({})).await;
    let events = client.recv_events(20).await;
    let mut seen = numbers(&events);
    seen.sort();
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    let ok = client.ack_confirmed(&ids(&events), "all").await;
    assert_eq!(ok["committed"], json!({ t.as_str(): {"0": 10, "1": 10} }));
    assert_eq!(committed(&gw.base, &t, "reader", 0).await, Some(10));
    assert_eq!(committed(&gw.base, &t, "reader", 1).await, Some(10));
    // Published after the subscription: delivered live.
    publish_to(&gw.base, &t, 1, 20, 1).await;
    let live = client.recv_events(1).await;
    assert_eq!(numbers(&live), vec![20]);
    gw.stop().await;
}

/// After a restart a client resumes at its committed offset: what it acked never comes back,
/// what it did not ack comes again.
pub async fn restart_resumes_at_the_committed_offset(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("jobs");
    h.create_topic(&gw.base, "jobs", 1).await;
    publish_to(&gw.base, &t, 0, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "worker").await;
    client.subscribe(&t, json!({})).await;
    let events = client.recv_events(10).await;
    client.ack_confirmed(&ids(&events[..6]), "six").await;
    client.close().await;
    gw.stop().await;

    let gw = h.start().await;
    let mut client = TestClient::connect(gw.addr(), "worker").await;
    let subscribed = client.subscribe(&t, json!({})).await;
    assert_eq!(subscribed["partitions"], json!([{"partition": 0, "from": 6, "epoch": 0}]));
    let events = client.recv_events(4).await;
    assert_eq!(numbers(&events), vec![6, 7, 8, 9]);
    client.ack_confirmed(&ids(&events), "rest").await;
    client.expect_silence(Duration::from_millis(300)).await;
    assert_eq!(committed(&gw.base, &t, "worker", 0).await, Some(10));
    gw.stop().await;
}

/// An admin reset moves an offline client back; it replays from there (a catch-up read that
/// leaves the other clients' stream alone).
pub async fn an_admin_rewind_replays_from_the_new_offset(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("audit");
    h.create_topic(&gw.base, "audit", 1).await;
    publish_to(&gw.base, &t, 0, 0, 8).await;
    for name in ["rewound", "steady"] {
        consume_and_ack(gw.addr(), name, &t, 8).await.close().await;
    }
    let mut reset = None;
    for _ in 0..100 {
        // 409 until the closed session is gone.
        let r = http().put(format!("{}/admin/offsets/{t}/rewound/0", gw.base)).json(&json!({"offset": 2})).send().await.unwrap();
        if r.status() == 200 {
            reset = Some(r.json::<Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reset.expect("reset accepted once offline")["committed"], 2);
    let mut steady = TestClient::connect(gw.addr(), "steady").await;
    steady.subscribe(&t, json!({})).await;
    let mut rewound = TestClient::connect(gw.addr(), "rewound").await;
    let subscribed = rewound.subscribe(&t, json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 2);
    let replayed = rewound.recv_events(6).await;
    assert_eq!(numbers(&replayed), vec![2, 3, 4, 5, 6, 7]);
    rewound.ack_confirmed(&ids(&replayed), "replayed").await;
    steady.expect_silence(Duration::from_millis(300)).await;
    publish_to(&gw.base, &t, 0, 8, 1).await;
    assert_eq!(numbers(&steady.recv_events(1).await), vec![8]);
    assert_eq!(numbers(&rewound.recv_events(1).await), vec![8]);
    gw.stop().await;
}

/// At start the pull cursor of a partition is aligned to the smallest committed offset of the
/// clients known for it, and the slowest client gets what it had not acknowledged.
pub async fn boot_alignment_starts_pulling_at_the_slowest_committed_offset(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("ledger");
    h.create_topic(&gw.base, "ledger", 1).await;
    publish_to(&gw.base, &t, 0, 0, 12).await;
    consume_and_ack(gw.addr(), "fast", &t, 12).await.close().await;
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe(&t, json!({})).await;
    let events = slow.recv_events(12).await;
    slow.ack_confirmed(&ids(&events[..5]), "five").await;
    slow.close().await;
    assert_eq!(bounds(&gw.base, &t, 0).await.2, Some(12), "everything was pulled before the restart");
    gw.stop().await;

    let gw = h.start().await;
    if h.lite.is_none() {
        // Lite topics are not aligned at start (a parent may have 100,000): a client below the
        // shared reader's checkpointed cursor reads by catch-up, which the deliveries below check.
        assert_eq!(bounds(&gw.base, &t, 0).await.2, Some(5), "pull cursor aligned to the slowest client");
    }
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe(&t, json!({})).await;
    assert_eq!(numbers(&slow.recv_events(7).await), (5..12).collect::<Vec<_>>());
    let mut fast = TestClient::connect(gw.addr(), "fast").await;
    let subscribed = fast.subscribe(&t, json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 12);
    fast.expect_silence(Duration::from_millis(300)).await;
    gw.stop().await;
}

/// A resume token above the stored offset wins; one below it does not replay.
pub async fn a_resume_token_starts_at_the_larger_of_token_and_stored_offset(h: &Harness) {
    let gw = h.start().await;
    let t = h.topic("ticks");
    h.create_topic(&gw.base, "ticks", 2).await;
    publish_to(&gw.base, &t, 0, 0, 10).await;
    publish_to(&gw.base, &t, 1, 100, 10).await;
    let mut client = TestClient::connect(gw.addr(), "mobile").await;
    client.subscribe(&t, json!({})).await;
    let events = client.recv_events(20).await;
    let on_p1: Vec<&Value> = events.iter().filter(|e| e["partition"] == 1).collect();
    client.ack_confirmed(&on_p1[..4].iter().map(|e| id(e)).collect::<Vec<_>>(), "p1").await;
    client.close().await;

    let mut client = TestClient::connect(gw.addr(), "mobile").await;
    let subscribed = client.subscribe(&t, json!({"resume": {"0": 7, "1": 2}})).await;
    assert_eq!(subscribed["partitions"], json!([{"partition": 0, "from": 7, "epoch": 0}, {"partition": 1, "from": 4, "epoch": 0}]));
    let mut got = numbers(&client.recv_events(3 + 6).await);
    got.sort();
    assert_eq!(got, vec![7, 8, 9, 104, 105, 106, 107, 108, 109]);
    gw.stop().await;
}

/// Events removed by the log's retention are skipped: a client whose committed offset fell below
/// the log start resumes at the log start, a new client starts there, offsets keep counting.
pub async fn log_retention_moves_clients_below_the_log_start_up_to_it(h: &Harness) {
    let gw = h.start().await;
    h.create_topic_with_retention(&gw.base, "metrics", 1).await;
    publish_to(&gw.base, "metrics", 0, 0, 10).await;
    let mut early = TestClient::connect(gw.addr(), "early").await;
    early.subscribe("metrics", json!({})).await;
    let events = early.recv_events(10).await;
    early.ack_confirmed(&ids(&events[..3]), "three").await;
    early.close().await;
    // A client that acked one event: the token it was issued names 1.
    let mut holder = TestClient::connect(gw.addr(), "token").await;
    holder.subscribe("metrics", json!({})).await;
    let first = holder.recv_events(1).await;
    let token = holder.ack_confirmed(&ids(&first), "one").await["tokens"]["metrics"].clone();
    holder.close().await;

    h.cut_log(&gw.base, "metrics", 0, 10).await;
    let (start, end, _) = bounds(&gw.base, "metrics", 0).await;
    assert_eq!(start, 10, "the log start moved to the cut");
    assert_eq!(publish_to(&gw.base, "metrics", 0, 10, 2).await, vec![end, end + 1], "offsets keep counting");
    let expected: Vec<u64> = (start..end + 2).collect();
    // Issue 25: a start the client held (its stored offset, a token) below the log start is a
    // gap, said in `subscribed`; a start by the reset policy is none.
    for (name, extra, gap) in [
        ("early", json!({}), Some(json!({"from": 3, "to": start}))),
        ("late", json!({}), None),
        ("token", json!({ "resume": token }), Some(json!({"from": 1, "to": start}))),
    ] {
        let mut client = TestClient::connect(gw.addr(), name).await;
        let subscribed = client.subscribe("metrics", extra).await;
        assert_eq!(subscribed["partitions"][0]["from"], start, "{name} starts at the log start");
        assert_eq!(subscribed["partitions"][0].get("gap"), gap.as_ref(), "{name}: {subscribed}");
        let events = client.recv_events(expected.len()).await;
        assert_eq!(events.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), expected, "{name}");
        client.close().await;
    }
    // The admin view lists both (written in the background: looked for until there).
    let mut listed = json!(null);
    for _ in 0..100 {
        listed = get_json(&format!("{}/admin/gaps?topic=metrics", gw.base)).await.1;
        if listed["gaps"].as_array().is_some_and(|g| g.len() == 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rows: Vec<(&str, u64, u64)> =
        listed["gaps"].as_array().unwrap().iter().map(|g| (g["client_id"].as_str().unwrap(), g["from"].as_u64().unwrap(), g["to"].as_u64().unwrap())).collect();
    assert_eq!(rows, vec![("early", 3, start), ("token", 1, start)], "{listed}");
    let (status, early) = get_json(&format!("{}/admin/gaps?client_id=early&limit=1", gw.base)).await;
    assert_eq!((status, early["gaps"].as_array().unwrap().len()), (200, 1), "{early}");
    assert!(early.get("next").is_none(), "one gap of early: {early}");
    gw.stop().await;
}

/// One `#[tokio::test]` per body, for the harness built by `$harness`.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        use $crate::conformance as body;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn publish_answers_offsets_and_events_keep_their_fields() {
            body::publish_answers_offsets_and_events_keep_their_fields(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn subscribe_receives_everything_and_acks_commit() {
            body::subscribe_receives_everything_and_acks_commit(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn restart_resumes_at_the_committed_offset() {
            body::restart_resumes_at_the_committed_offset(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_admin_rewind_replays_from_the_new_offset() {
            body::an_admin_rewind_replays_from_the_new_offset(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn boot_alignment_starts_pulling_at_the_slowest_committed_offset() {
            body::boot_alignment_starts_pulling_at_the_slowest_committed_offset(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_resume_token_starts_at_the_larger_of_token_and_stored_offset() {
            body::a_resume_token_starts_at_the_larger_of_token_and_stored_offset(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn log_retention_moves_clients_below_the_log_start_up_to_it() {
            body::log_retention_moves_clients_below_the_log_start_up_to_it(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_idempotent_publish_writes_once() {
            body::an_idempotent_publish_writes_once(&$harness).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_subscribe_by_time_starts_at_the_first_event_at_or_after_it() {
            body::a_subscribe_by_time_starts_at_the_first_event_at_or_after_it(&$harness).await
        }
    };
}
