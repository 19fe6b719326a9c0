//! What only the Kafka backend must prove, against a real Kafka-protocol broker (tansu): no
//! consumer group is ever used, a broker outage loses nothing and keeps sessions open, and a
//! SIGKILL mid-stream loses nothing. The shared behaviour is in `conformance::kafka`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ackgate::backend::kafka::UNUSED_GROUP_ID;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};

use crate::kafka_broker::TestBroker;
use crate::support::*;

fn kafka_config(data: &std::path::Path, broker: &TestBroker) -> ackgate::config::Config {
    let mut config = test_config(data);
    config.storage.backend = ackgate::config::BackendKind::Kafka;
    config.kafka.bootstrap_servers = broker.bootstrap();
    config
}

fn consumer_in_group(broker: &TestBroker, group: &str) -> BaseConsumer {
    ClientConfig::new().set("bootstrap.servers", broker.bootstrap()).set("group.id", group).set("enable.auto.commit", "false").create().unwrap()
}

/// The committed offsets the broker holds for `group` on `topic`'s partitions.
fn committed_for_group(broker: &TestBroker, group: &str, topic: &str, partitions: u32) -> Vec<Offset> {
    let consumer = consumer_in_group(broker, group);
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p as i32);
    }
    let committed = consumer.committed_offsets(list, Duration::from_secs(10)).expect("OffsetFetch answers");
    committed.elements().iter().map(|e| e.offset()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dummy_group_id_never_commits_anything_to_the_broker() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "nogroup", 2, 0, 20).await;
    publish(&gw.base, "nogroup", json!({"partition": 1, "payload": {"n": 20}})).await;
    let client = consume_and_ack(gw.addr(), "acker", "nogroup", 21).await;
    client.close().await;
    assert_eq!(stored_offset(&gw.base, "nogroup", "acker", 0).await.unwrap()["committed"], 20, "acks are stored by ackgate");
    gw.stop().await;

    // The query can see a commit: a control group that does commit shows its offset...
    let control = consumer_in_group(&broker, "control-group");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset("nogroup", 0, Offset::Offset(7)).unwrap();
    control.commit(&list, rdkafka::consumer::CommitMode::Sync).expect("control commit");
    assert_eq!(committed_for_group(&broker, "control-group", "nogroup", 1), vec![Offset::Offset(7)]);
    // ...and ackgate's dummy group has nothing on any partition.
    assert_eq!(committed_for_group(&broker, UNUSED_GROUP_ID, "nogroup", 2), vec![Offset::Invalid, Offset::Invalid]);
}

async fn ready(base: &str) -> bool {
    http().get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
}

/// Receives events and acks each, recording payload numbers, until `seen` holds `until` numbers.
async fn consume_into(client: &mut TestClient, seen: &mut BTreeSet<u64>, until: usize) {
    while seen.len() < until {
        let event: Value = client.recv_type("event").await;
        seen.insert(event["payload"]["n"].as_u64().unwrap());
        client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_second_broker_outage_keeps_sessions_open_and_loses_nothing() {
    let mut broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "outage", 1, 0, 20).await;
    let mut client = TestClient::connect(gw.addr(), "survivor").await;
    client.subscribe("outage", json!({})).await;
    let mut seen = BTreeSet::new();
    consume_into(&mut client, &mut seen, 10).await;
    assert!(ready(&gw.base).await);

    broker.stop();
    let outage = Instant::now();
    wait_for("readyz reports the outage", async || !ready(&gw.base).await).await;
    let refused = http().post(format!("{}/topics/outage/events", gw.base)).json(&json!({"payload": {"n": 999}})).send().await.unwrap();
    assert_eq!(refused.status(), 503);
    let body = refused.json::<Value>().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    assert!(body["error"]["message"].as_str().unwrap().contains("(incident "), "{body}");
    // The session stays open and answers while the broker is away; what was pulled before the
    // outage keeps flowing.
    consume_into(&mut client, &mut seen, 20).await;
    client.send(json!({"op": "ping", "req": "alive"})).await;
    assert_eq!(client.recv_type("pong").await["req"], "alive");
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed())).await;
    client.send(json!({"op": "ping", "req": "still"})).await;
    assert_eq!(client.recv_type("pong").await["req"], "still");

    broker.resume();
    wait_for("readyz recovers", async || ready(&gw.base).await).await;
    let events: Vec<Value> = (20..40).map(|n| json!({"payload": {"n": n}})).collect();
    publish(&gw.base, "outage", json!({ "events": events })).await;
    consume_into(&mut client, &mut seen, 40).await;
    assert_eq!(seen, (0..40).collect::<BTreeSet<u64>>(), "every event published before, during and after arrives once");
    client.send(json!({"op": "ping", "req": "flush"})).await;
    client.recv_type("pong").await;
    wait_for("acks are committed to the log end", async || stored_offset(&gw.base, "outage", "survivor", 0).await.is_some_and(|r| r["committed"] == 40)).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_on_kafka_loses_nothing_and_never_moves_offsets_back() {
    let broker = TestBroker::start();
    let bootstrap = broker.bootstrap();
    crate::crash::sigkill_mid_stream(&[("ACKGATE_STORAGE__BACKEND", "kafka"), ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", &bootstrap)]).await;
}

/// Issue 21: what `ack_ok` confirmed survives SIGKILL on Kafka too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_ack_survives_sigkill_on_kafka() {
    let broker = TestBroker::start();
    let bootstrap = broker.bootstrap();
    crate::crash::confirmed_ack_survives_sigkill(&[("ACKGATE_STORAGE__BACKEND", "kafka"), ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", &bootstrap)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_configured_topics_are_served_and_unknown_topics_are_not_created() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    // Create both topics through a gateway that serves everything...
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    for name in ["served", "hidden"] {
        let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": name, "partitions": 1})).send().await.unwrap();
        assert_eq!(created.status(), 200);
    }
    // Kafka topics are created by operators, never by a publish (unlike the embedded log).
    let unknown = http().post(format!("{}/topics/nosuch/events", gw.base)).json(&json!({"payload": 1})).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    assert_eq!(unknown.json::<Value>().await.unwrap()["error"]["code"], "unknown_topic");
    gw.stop().await;

    // ...then one limited to kafka.topics = ["served"].
    let mut config = kafka_config(&data, &broker);
    config.kafka.topics = vec!["served".into()];
    let gw = InProcess::start(config).await;
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let names: Vec<&str> = topics["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["served"]);
    let mut client = TestClient::connect(gw.addr(), "limited").await;
    client.subscribe("served", json!({})).await;
    client.send(json!({"op": "subscribe", "topic": "hidden", "req": "h"})).await;
    assert_eq!(client.recv_type("error").await["code"], "unknown_topic");
    let refused = http().post(format!("{}/topics/hidden/events", gw.base)).json(&json!({"payload": 1})).send().await.unwrap();
    assert_eq!(refused.status(), 404);
    let create = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "other", "partitions": 1})).send().await.unwrap();
    assert_eq!(create.status(), 400, "a topic outside kafka.topics cannot be created here");
    gw.stop().await;
}

/// Issue 20: a record whose header key is not UTF-8 panicked the partition reader inside rdkafka
/// (`Headers::get` unwraps the key), so the subscribed client received none of the records
/// around it, at every restart. Failed before the fix: no event arrived. Now the bad key is
/// dropped (and counted), a value that is not UTF-8 goes in `headers_base64`, and the partition
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_record_headers_never_stop_a_partition() {
    use rdkafka::message::{BorrowedHeaders, Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "odd-headers", 1, 0, 0).await;
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", broker.bootstrap()).create().unwrap();
    let send = |headers: OwnedHeaders, n: u32| {
        let producer = producer.clone();
        async move {
            let payload = json!({"n": n}).to_string();
            let record = FutureRecord::<str, str>::to("odd-headers").partition(0).payload(&payload).headers(headers);
            producer.send(record, Duration::from_secs(10)).await.expect("produced");
        }
    };
    send(OwnedHeaders::new().insert(Header { key: "trace", value: Some("t1") }), 0).await;
    // rdkafka's Rust API only takes &str keys: add the bad one through librdkafka itself.
    let bad = OwnedHeaders::new().insert(Header { key: "good", value: Some("g") });
    let bad_key = [0xffu8, 0xfe, b'b', b'a', b'd'];
    // SAFETY: a `&BorrowedHeaders` is librdkafka's header list pointer (rdkafka casts it so); the
    // list is owned by `bad`, alive here, and librdkafka copies the name and value.
    let added = unsafe {
        let native = bad.as_borrowed() as *const BorrowedHeaders as *mut rdkafka::bindings::rd_kafka_headers_t;
        rdkafka::bindings::rd_kafka_header_add(native, bad_key.as_ptr().cast(), bad_key.len() as isize, b"v".as_ptr().cast(), 1)
    };
    assert_eq!(added, rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    send(bad, 1).await;
    send(OwnedHeaders::new().insert(Header { key: "blob", value: Some(&[0xffu8, 0x00][..]) }), 2).await;
    send(OwnedHeaders::new().insert(Header::<&str> { key: "nothing", value: None }), 3).await;

    let mut client = TestClient::connect(gw.addr(), "reader").await;
    client.subscribe("odd-headers", json!({"from": "earliest"})).await;
    let events = client.recv_events(4).await;
    let offsets: Vec<u64> = events.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3], "every record, the odd ones included");
    assert_eq!(events[0]["headers"], json!({"trace": "t1"}));
    assert_eq!(events[1]["headers"], json!({"good": "g"}), "the key that is not UTF-8 is dropped");
    assert_eq!(events[2]["headers_base64"], json!({"blob": "/wA="}));
    assert_eq!(events[3]["headers"], json!({"nothing": ""}));
    client.ack_confirmed(&ids(&events), "all").await;
    let metrics = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("ackgate_kafka_headers_dropped_total") && !l.ends_with(" 0")), "{metrics}");
    gw.stop().await;
}

/// Issue 21, item 4: `DELETE /topics/{topic}` deleted every client's offsets before it asked the
/// backend to delete the log; when the backend refused (a broker away, a cluster with
/// delete.topic.enable=false), the topic stayed and its offsets were gone. Failed before the fix:
/// the stored offset was missing after the refused delete. Now the log goes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_topic_delete_keeps_every_offset() {
    let mut broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "kept", 1, 0, 5).await;
    consume_and_ack(gw.addr(), "holder", "kept", 5).await.close().await;
    wait_for("the session ended", async || get_json(&format!("{}/admin/sessions", gw.base)).await.1["sessions"] == json!([])).await;
    assert_eq!(stored_offset(&gw.base, "kept", "holder", 0).await.unwrap()["committed"], 5);

    broker.stop();
    wait_for("readyz reports the outage", async || !ready(&gw.base).await).await;
    let refused = http().delete(format!("{}/topics/kept", gw.base)).send().await.unwrap();
    assert_eq!(refused.status(), 503, "the backend could not delete the log");
    assert_eq!(stored_offset(&gw.base, "kept", "holder", 0).await.map(|r| r["committed"].clone()), Some(json!(5)), "the offsets stay with the topic");

    broker.resume();
    wait_for("readyz recovers", async || ready(&gw.base).await).await;
    assert_eq!(stored_offset(&gw.base, "kept", "holder", 0).await.unwrap()["committed"], 5);
    let deleted = http().delete(format!("{}/topics/kept", gw.base)).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(stored_offset(&gw.base, "kept", "holder", 0).await, None, "a delete that went through takes the offsets with it");
    gw.stop().await;
}

/// Issue 21, item 8, on Kafka: partitions added to a topic at the broker reach its live
/// subscriptions at the next metadata refresh (`kafka.metadata_refresh_ms`), from their log
/// start, and a client that subscribed before they were added is not skipped past them by
/// `reset_policy = latest` when it comes back. The broker grows the topic as CreatePartitions
/// would (`TestBroker::add_partitions`). Fails with the Kafka partition watch off, as before the
/// fix: the gateway never learns of partition 3 (a publish to it stays 404, the live session
/// gets nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_at_the_broker_reach_live_subscriptions() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let mut config = kafka_config(&data, &broker);
    config.kafka.metadata_refresh_ms = 200;
    config.delivery.reset_policy = ackgate::config::ResetPolicy::Latest;
    let gw = InProcess::start(config).await;
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "grows", "partitions": 2})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let mut live = TestClient::connect(gw.addr(), "live").await;
    assert_eq!(live.subscribe("grows", json!({})).await["partitions"].as_array().unwrap().len(), 2);
    let mut away = TestClient::connect(gw.addr(), "away").await;
    away.subscribe("grows", json!({})).await;
    away.close().await;

    broker.add_partitions("grows", 4);
    let url = format!("{}/topics/grows/events", gw.base);
    let body = json!({"events": [{"partition": 3, "payload": "on the new partition"}]});
    // Accepted once the gateway's partition count (and its producer's metadata) show partition 3.
    wait_for("a publish to partition 3 is accepted", async || http().post(&url).json(&body).send().await.unwrap().status() == 200).await;
    let event = live.recv_type("event").await;
    assert_eq!((event["partition"].as_u64(), event["offset"].as_u64()), (Some(3), Some(0)), "{event}");
    live.ack_confirmed(&[id(&event)], "a").await;

    let mut back = TestClient::connect(gw.addr(), "away").await;
    let sub = back.subscribe("grows", json!({})).await;
    assert_eq!(sub["partitions"][3]["from"], 0, "not skipped to the log end: {sub}");
    assert_eq!(back.recv_type("event").await["partition"], 3);
    gw.stop().await;
}

/// Twelve events on partition 0 of `topic`, payloads `{"n": 100}` to `{"n": 111}`: what the log
/// writes at the offsets its lost tail freed.
async fn publish_twelve_after_a_cut(base: &str, topic: &str) {
    let events: Vec<Value> = (100..112).map(|n| json!({"partition": 0, "payload": {"n": n}})).collect();
    let published = http().post(format!("{base}/topics/{topic}/events")).json(&json!({"events": events})).send().await.unwrap();
    assert_eq!(published.status(), 200);
}

/// Issue 22 item 4, on Kafka: the log at the broker loses its tail under a live session (a
/// failover to a replica behind, a topic recreated outside ackgate; here tansu's store is cut
/// back from 10 events to 4). The session is closed with `reconnect` and 1012, the client's
/// committed offset is lowered to the new end, and the events written next at the reused
/// offsets reach it when it resubscribes. Before, the reader waited at the old cursor (tansu
/// answers a fetch above its end empty; Kafka answers OFFSET_OUT_OF_RANGE and librdkafka
/// restarted at the log start, whose events the poll skipped as below the cursor): nothing
/// written below offset 10 reached anyone, and the session stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_back_under_a_live_session_is_read_again_from_its_new_end() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "cut", 1, 0, 10).await;
    let mut client = consume_and_ack(gw.addr(), "c", "cut", 10).await;
    assert_eq!(stored_offset(&gw.base, "cut", "c", 0).await.unwrap()["committed"], 10);

    let truncations = metric(&gw.base, "ackgate_log_truncations_total").await;
    broker.truncate("cut", 0, 4);
    let reconnect = client.recv_type("reconnect").await;
    assert_eq!(reconnect["after_ms"], 0, "{reconnect}");
    assert_eq!(client.close_code().await, 1012);
    wait_for("the committed offset lowered to the new end", async || stored_offset(&gw.base, "cut", "c", 0).await.is_some_and(|row| row["committed"] == 4))
        .await;
    // Grown, not equal to 1: the metric is the process's, and other tests here cut logs too.
    assert!(metric(&gw.base, "ackgate_log_truncations_total").await > truncations);

    publish_twelve_after_a_cut(&gw.base, "cut").await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    let subscribed = client.subscribe("cut", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 4, "{subscribed}");
    let events = client.recv_events(12).await;
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
    assert_eq!(got, (0..12).map(|i| (4 + i, 100 + i)).collect::<Vec<_>>());
    let ack = client.ack_confirmed(&ids(&events), "new").await;
    assert_eq!(ack["committed"], json!({"cut": {"0": 16}}));
    gw.stop().await;
}

/// Issue 39, item 7: a busy partition's lost tail was skipped. Apache Kafka refuses a fetch above
/// the log end with OFFSET_OUT_OF_RANGE (tansu answers it empty: a proxy that answers as Kafka
/// does stands between them here). librdkafka then restarted at the log start by itself
/// (`auto.offset.reset=earliest`), the poll skipped what lay below the cursor, and once the log
/// had grown back past the cursor (10) within the re-read, the loss counted as transient: the
/// six new events written at 4 to 9 reached nobody, and the live session was never told. Now
/// the pull consumer's reset is "error", and the refusal is a certain loss at the end it named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_partition_that_lost_its_tail_is_read_again_from_the_end_the_broker_named() {
    let (broker, proxy) = TestBroker::start_behind_proxy();
    let (_dir, data) = temp_dir();
    let mut config = kafka_config(&data, &broker);
    config.kafka.bootstrap_servers = format!("127.0.0.1:{}", proxy.port);
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "busy", 1, 0, 10).await;
    let mut client = consume_and_ack(gw.addr(), "c", "busy", 10).await;
    assert_eq!(proxy.refused(), 0, "nothing out of range before the cut");

    broker.truncate("busy", 0, 4);
    // The log grows back past the old cursor as soon as the broker refused one fetch there,
    // before the gateway's second look a second later.
    wait_for("a fetch above the new end refused", async || proxy.refused() > 0).await;
    publish_twelve_after_a_cut(&gw.base, "busy").await;
    let reconnect = client.recv_type("reconnect").await;
    assert_eq!(reconnect["after_ms"], 0, "{reconnect}");
    assert_eq!(client.close_code().await, 1012);

    let mut client = TestClient::connect(gw.addr(), "c").await;
    let subscribed = client.subscribe("busy", json!({"resume": {"0": 10}})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 4, "lowered to the end the refusal named: {subscribed}");
    let events = client.recv_events(12).await;
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
    assert_eq!(got, (0..12).map(|i| (4 + i, 100 + i)).collect::<Vec<_>>(), "every new event from 4 on");
    gw.stop().await;
}

/// Issue 39's SIGKILL loop with lost log tails and resume tokens in use, on Kafka: every round
/// the client receives everything and confirms half of it here; its token reaches past the last
/// event it got, as a token confirmed by another instance of a cluster does. The process is
/// killed once its pull checkpoint holds the cursor past that event; the log loses its last 3 to
/// 6 events while the gateway is down, and six new events are written at the reused offsets, so
/// the log has grown back past the token. Every round the client, presenting its stale token,
/// starts at or below the cut, never above it, and receives exactly what the log holds from
/// there: the new events, none skipped. Failed before the boot alignment read the checkpointed
/// cursor as evidence: no offset stored here reached past the cut, so nothing stepped the log
/// epoch, and round 1 started at the token (20), past the new events at 17 to 19.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_lost_tails_and_tokens_skips_no_new_event() {
    const ROUNDS: u64 = 5;
    let broker = TestBroker::start();
    let bootstrap = broker.bootstrap();
    let env =
        [("ACKGATE_STORAGE__BACKEND", "kafka"), ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", bootstrap.as_str()), ("ACKGATE_OFFSETS__CHECKPOINT_INTERVAL_MS", "100")];
    let (_dir, data) = temp_dir();
    let mut gw = Process::start(&data, &env);
    publish_numbered(&gw.base, "sk", 1, 0, 20).await;
    // What the log holds: the payload number at each offset.
    let mut log: Vec<u64> = (0..20).collect();
    let (mut token, mut token_epoch) = (0u64, 0u64);
    // Where the next round may start: not below what the confirmed acks made durable (or the
    // cut, if lower), never above the cut (a token fenced by the loss may count up to it).
    let (mut lowest_start, mut highest_start) = (0u64, 0u64);
    for round in 0..ROUNDS {
        let mut client = TestClient::connect(gw.addr, "holder").await;
        let subscribed = client.subscribe("sk", json!({"resume": {"0": token}, "epochs": {"0": token_epoch}})).await;
        let start = subscribed["partitions"][0]["from"].as_u64().unwrap();
        let cut = log.len() as u64;
        assert!(
            (lowest_start..=highest_start).contains(&start),
            "round {round}: started at {start}, not within {lowest_start}..={highest_start}: {subscribed}"
        );
        token_epoch = subscribed["partitions"][0]["epoch"].as_u64().unwrap();
        let events = client.recv_events((cut - start) as usize).await;
        let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
        let held: Vec<(u64, u64)> = (start..cut).map(|o| (o, log[o as usize])).collect();
        assert_eq!(got, held, "round {round}: exactly what the log holds from the start on");
        let half = events.len() / 2;
        let confirmed = client.ack_confirmed(&ids(&events[..half]), "c").await;
        let committed = confirmed["committed"]["sk"]["0"].as_u64().unwrap();
        assert_eq!(committed, start + half as u64, "round {round}");
        token = cut;
        let checkpoint = data.join("pull-offsets.properties");
        let line = format!("sk#0={cut}\n");
        wait_for("the pull checkpoint past the last event", async || std::fs::read_to_string(&checkpoint).is_ok_and(|t| t.contains(&line))).await;
        gw.kill9();

        let lost = 3 + round % 4;
        let new_end = cut - lost;
        broker.truncate("sk", 0, new_end);
        log.truncate(new_end as usize);
        gw = Process::start(&data, &env);
        let fresh: Vec<Value> = (0..6).map(|i| json!({"partition": 0, "payload": {"n": 1000 * (round + 1) + i}})).collect();
        publish(&gw.base, "sk", json!({ "events": fresh })).await;
        log.extend((0..6).map(|i| 1000 * (round + 1) + i));
        assert!(log.len() as u64 >= token, "round {round}: the log grew back past the token");
        lowest_start = committed.min(new_end);
        highest_start = new_end;
    }
    let status = gw.terminate();
    assert!(status.success(), "{status:?}");
}

/// Issue 39, items 2 and 3: an in-memory ack tracker outlived a lost log tail. The client had
/// acked 6 to 9 but not 5 (its committed offset stays 5; its tracker, kept while it is away
/// because 5 is unacknowledged, holds 6 to 9 as acked), and while it was away the log lost
/// everything from 5 on, found by another client's session. Its offset needed no lowering (5 is
/// the new end), so nothing changed epoch: when it came back its tracker was kept, and the new
/// events written at 6 to 9 counted as acked and never reached it. Now the instance that finds a
/// lost tail records the partition's next log epoch in the store, and a tracker of an older one
/// is dropped: every new event from 5 on comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_made_in_a_lost_log_tail_do_not_count_for_the_events_written_there_next() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "lost", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("lost", json!({})).await;
    let events = client.recv_events(10).await;
    let all_but_five: Vec<&str> = events.iter().filter(|e| e["offset"] != 5).map(id).collect();
    assert_eq!(client.ack_confirmed(&all_but_five, "a").await["committed"], json!({"lost": {"0": 5}}));
    client.close().await;
    let mut watcher = consume_and_ack(gw.addr(), "w", "lost", 10).await;

    broker.truncate("lost", 0, 5);
    watcher.recv_type("reconnect").await;
    assert_eq!(watcher.close_code().await, 1012);

    publish_twelve_after_a_cut(&gw.base, "lost").await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    let subscribed = client.subscribe("lost", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 5, "{subscribed}");
    let events = client.recv_events(12).await;
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
    assert_eq!(got, (0..12).map(|i| (5 + i, 100 + i)).collect::<Vec<_>>(), "every new event from 5 on");
    assert_eq!(client.ack_confirmed(&ids(&events), "b").await["committed"], json!({"lost": {"0": 17}}));
    gw.stop().await;
}

/// Issue 39, item 3: a lost tail was remembered nowhere durable. A client acked all ten events and
/// left; the log lost everything from 4 on, found by another client's session; then the log grew
/// back past 10 before the client came back. Its offset (10) was no longer above the log end, so
/// it started at 10 and the six new events written at 4 to 9 were skipped, with no gap. Now the
/// loss is recorded as the partition's next log epoch, with where the log ended (4), and the
/// client's offset of the older log epoch is lowered there at its subscribe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_tail_found_while_a_client_was_away_lowers_it_after_the_log_grew_back() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "regrown", 1, 0, 10).await;
    consume_and_ack(gw.addr(), "away", "regrown", 10).await.close().await;
    let mut watcher = consume_and_ack(gw.addr(), "w", "regrown", 10).await;

    broker.truncate("regrown", 0, 4);
    watcher.recv_type("reconnect").await;
    assert_eq!(watcher.close_code().await, 1012);
    publish_twelve_after_a_cut(&gw.base, "regrown").await;

    let mut client = TestClient::connect(gw.addr(), "away").await;
    let subscribed = client.subscribe("regrown", json!({"resume": {"0": 10}})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 4, "lowered to where the log ended, token fenced: {subscribed}");
    let events = client.recv_events(12).await;
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
    assert_eq!(got, (0..12).map(|i| (4 + i, 100 + i)).collect::<Vec<_>>());
    gw.stop().await;
}

/// Receives `n` events one at a time, acking each as it comes (plain acks): with a small
/// window, the next events come only as these are acked.
async fn recv_acking(client: &mut TestClient, n: usize) -> Vec<Value> {
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        let event = client.recv_type("event").await;
        client.send(json!({"op": "ack", "delivery_ids": [id(&event)]})).await;
        events.push(event);
    }
    events
}

/// Review finding 1(a) of 2026-12-04: the second lost tail of a partition was recorded only when
/// the session that found it had planned in the current log epoch. "slow" planned in epoch 0 and
/// lived through the first cut (its reads stood below it); the first cut started epoch 1, in
/// which "away" acked up to 17 and left. When "slow" met the second cut, its session named epoch
/// 0 as the one it saw, the store was at 1, and no epoch was started: "away" came back at 17 of
/// a log that ended at 8 and grew back past 17, and the new events at 8 to 16 were skipped with
/// no gap. Now the partition's reader starts the next log epoch once for each loss it finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lost_tail_found_by_a_session_from_before_the_first_starts_another_log_epoch() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let mut config = kafka_config(&data, &broker);
    config.delivery.max_in_flight = 3;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "twice", 1, 0, 10).await;
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe("twice", json!({})).await;
    let held = slow.recv_events(3).await;
    let mut watcher = TestClient::connect(gw.addr(), "w").await;
    watcher.subscribe("twice", json!({})).await;
    recv_acking(&mut watcher, 10).await;

    broker.truncate("twice", 0, 5);
    watcher.recv_type("reconnect").await;
    publish_twelve_after_a_cut(&gw.base, "twice").await;
    let mut away = TestClient::connect(gw.addr(), "away").await;
    assert_eq!(away.subscribe("twice", json!({})).await["partitions"][0]["from"], 0);
    recv_acking(&mut away, 17).await;
    wait_for("away's offset stored at 17", async || stored_offset(&gw.base, "twice", "away", 0).await.is_some_and(|row| row["committed"] == 17)).await;
    away.close().await;
    slow.ack_confirmed(&ids(&held), "held").await;
    let read = recv_acking(&mut slow, 6).await;
    assert_eq!(read.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), (3..9).collect::<Vec<_>>(), "slow read on through the first cut");
    let in_flight = slow.recv_events(3).await;

    let truncations = metric(&gw.base, "ackgate_log_truncations_total").await;
    broker.truncate("twice", 0, 8);
    wait_for("the reader found the second cut", async || metric(&gw.base, "ackgate_log_truncations_total").await > truncations).await;
    slow.send(json!({"op": "ack", "delivery_ids": ids(&in_flight)})).await;
    slow.recv_type("reconnect").await;
    assert_eq!(slow.close_code().await, 1012);
    publish_twelve_after_a_cut(&gw.base, "twice").await;

    let mut away = TestClient::connect(gw.addr(), "away").await;
    let subscribed = away.subscribe("twice", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 8, "lowered to where the log ended the second time: {subscribed}");
    let events = recv_acking(&mut away, 12).await;
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
    assert_eq!(got, (0..12).map(|i| (8 + i, 100 + i)).collect::<Vec<_>>());
    gw.stop().await;
}

/// Issue 39, item 6: a dead letter of a log that lost its tail since pointed at an offset where
/// the new log holds another event, and a redrive delivered that other event to its client as
/// the dead letter. Now a dead letter carries the partition's log epoch it was read in: one of an
/// older epoch stays listed, with a reason that says why, and is never redriven.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_from_before_a_lost_tail_is_never_redriven_into_the_new_log() {
    let broker = TestBroker::start();
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(kafka_config(&data, &broker)).await;
    publish_numbered(&gw.base, "poisoned", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("poisoned", json!({})).await;
    let events = client.recv_events(10).await;
    client.send(json!({"op": "term", "delivery_id": id(&events[7]), "reason": "bad"})).await;
    let others: Vec<&str> = events.iter().filter(|e| e["offset"] != 7).map(id).collect();
    client.ack_confirmed(&others, "a").await;
    client.close().await;
    let listed = format!("{}/admin/dead-letters?topic=poisoned&client_id=c", gw.base);
    wait_for("the dead letter is listed", async || get_json(&listed).await.1["dead_letters"].as_array().map(Vec::len) == Some(1)).await;
    let mut watcher = consume_and_ack(gw.addr(), "w", "poisoned", 10).await;

    broker.truncate("poisoned", 0, 5);
    watcher.recv_type("reconnect").await;
    publish_twelve_after_a_cut(&gw.base, "poisoned").await;

    let (status, answer) = post_json(&format!("{}/admin/dead-letters/redrive", gw.base), json!({"topic": "poisoned", "client_id": "c"})).await;
    assert_eq!(status, 200, "{answer}");
    let mut client = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(client.subscribe("poisoned", json!({})).await["partitions"][0]["from"], 5);
    let events = client.recv_events(12).await;
    assert!(events.iter().all(|e| e.get("redrive").is_none()), "no redrive: {events:?}");
    client.expect_silence(Duration::from_millis(1500)).await;
    let (_, dead) = get_json(&listed).await;
    assert_eq!(dead["dead_letters"].as_array().map(Vec::len), Some(1), "kept for the operator: {dead}");
    assert!(dead["dead_letters"][0]["reason"].as_str().unwrap().contains("lost its tail"), "{dead}");
    gw.stop().await;
}
