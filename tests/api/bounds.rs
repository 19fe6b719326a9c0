//! Memory stays bounded by what is in use: clients that come and go leave no partition readers
//! behind and at most `limits.max_offline_clients` ack states, and a session's window is bounded
//! in payload bytes as well as in events.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_come_and_go_and_leave_bounded_state() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_offline_clients = 100;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "shared", 2, 0, 1).await;
    let d = gw.handle.dispatcher.clone();
    for i in 0..1000 {
        // Each client leaves with its event unacknowledged: its ack state is worth keeping.
        let mut client = TestClient::connect(gw.addr(), &format!("visitor-{i}")).await;
        client.subscribe("shared", json!({})).await;
        client.recv_type("event").await;
        client.close().await;
    }
    for _ in 0..200 {
        if d.sessions().is_empty() && d.readers.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(d.sessions().len(), 0);
    assert_eq!(d.readers.len(), 0, "no subscriber left: no partition reader either");
    assert!(d.client_states() <= 100, "{} ack states kept for offline clients", d.client_states());
    assert!(d.client_states() >= 90, "the most recent offline clients are kept: {}", d.client_states());

    // The newest offline client kept its attempt count; the oldest was forgotten.
    let mut newest = TestClient::connect(gw.addr(), "visitor-999").await;
    newest.subscribe("shared", json!({})).await;
    assert_eq!(newest.recv_type("event").await["attempt"], 2);
    let mut oldest = TestClient::connect(gw.addr(), "visitor-0").await;
    oldest.subscribe("shared", json!({})).await;
    assert_eq!(oldest.recv_type("event").await["attempt"], 1);
    assert_eq!(d.readers.len(), 2, "readers come back with subscribers");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_is_bounded_in_bytes() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight_bytes = 1000;
    let gw = InProcess::start(config).await;
    let big = "x".repeat(398); // a 400-byte JSON string payload
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "big", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let events: Vec<_> = (0..5).map(|_| json!({"payload": big})).collect();
    publish(&gw.base, "big", json!({ "events": events })).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("big", json!({})).await;
    let first = client.recv_events(2).await;
    client.expect_silence(Duration::from_millis(300)).await;
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    assert_eq!(sessions["sessions"][0]["window_full"], true, "{sessions}");
    client.send(json!({"op": "ack", "delivery_id": id(&first[0])})).await;
    assert_eq!(client.recv_type("event").await["offset"], 2, "an ack makes room for one more");
    client.expect_silence(Duration::from_millis(300)).await;
    gw.stop().await;
}

/// Issue 40, item 3: the byte window counted payload bytes only, so events with a 1-byte payload
/// and a large header (or key) passed it: all 5 of these arrived at once in a 1000-byte window.
/// Now an event weighs its payload, key and headers, and two fill the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_window_counts_keys_and_headers_too() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight_bytes = 1000;
    let gw = InProcess::start(config).await;
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "stuffed", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let header = "h".repeat(390);
    let key = "k".repeat(390);
    let events: Vec<_> =
        (0..5).map(|n| if n % 2 == 0 { json!({"payload": 1, "headers": {"big": header}}) } else { json!({"payload": 1, "key": key}) }).collect();
    publish(&gw.base, "stuffed", json!({ "events": events })).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("stuffed", json!({})).await;
    let first = client.recv_events(2).await;
    client.expect_silence(Duration::from_millis(300)).await;
    client.send(json!({"op": "ack", "delivery_id": id(&first[0])})).await;
    assert_eq!(client.recv_type("event").await["offset"], 2, "an ack makes room for one more");
    client.expect_silence(Duration::from_millis(300)).await;
    gw.stop().await;
}

/// Issue 20: memory per slow reader was bounded in events, not bytes. A feeder held a whole fetch
/// (256 events) outside the in-flight window, and a client starting from `earliest` got private
/// copies of them: 12 sessions that never read pinned about 160 MiB each with a 2 MiB window.
/// Now a feeder reads only what its window has room for, and the reader's ring is bounded in
/// bytes too. Failed before the fix: the gateway grew by about 50 MiB per session here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_that_never_read_pin_about_their_window_in_bytes() {
    const SESSIONS: usize = 10;
    const EVENT_BYTES: usize = 256 << 10;
    let (_dir, data) = temp_dir();
    let gw = Process::start(
        &data,
        &[
            ("ACKGATE_DELIVERY__MAX_IN_FLIGHT_BYTES", "1048576"),
            ("ACKGATE_DELIVERY__READER_BUFFER_EVENTS", "50"),
            ("ACKGATE_DELIVERY__READER_BUFFER_BYTES", "4194304"),
        ],
    );
    // 200 events of 256 KiB (50 MiB) on one partition.
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "big", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let text = "x".repeat(EVENT_BYTES);
    for _ in 0..10 {
        let events: Vec<_> = (0..20).map(|_| json!({"payload": text})).collect();
        publish(&gw.base, "big", json!({ "events": events })).await;
    }
    let before = gw.rss_kib();
    let stalled = sessions_that_never_read(&gw, "big", SESSIONS).await;
    let grown_mib = gw.rss_kib().saturating_sub(before) / 1024;
    // Per session: its window (1 MiB of events), their frames, the socket writer's buffer; the
    // ring: 4 MiB. Before the fix a feeder alone held 200 x 256 KiB = 50 MiB per session.
    assert!(grown_mib < 150, "the gateway grew by {grown_mib} MiB for {SESSIONS} sessions that never read");
    drop(stalled);
}

/// `sessions` clients that subscribe to `topic` from its start and never read, once every one's
/// window is full and nothing more moves.
async fn sessions_that_never_read(gw: &Process, topic: &str, sessions: usize) -> Vec<TestClient> {
    let mut stalled = Vec::new();
    for i in 0..sessions {
        let mut client = TestClient::connect(gw.addr, &format!("never-reads-{i}")).await;
        client.subscribe(topic, json!({"from": "earliest"})).await;
        stalled.push(client); // held, never read again
    }
    let mut last = serde_json::Value::Null;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_, listed) = get_json(&format!("{}/admin/sessions", gw.base)).await;
        let rows = listed["sessions"].as_array().unwrap().clone();
        let delivered: Vec<_> = rows.iter().map(|s| s["delivered"].clone()).collect();
        if rows.len() == sessions && rows.iter().all(|s| s["window_full"] == true) && serde_json::Value::from(delivered.clone()) == last {
            break;
        }
        last = serde_json::Value::from(delivered);
    }
    stalled
}

/// Issue 40, item 3: a session's window is its bound in bytes whatever it subscribes to. Each
/// feeder read as much as the window had free and only then took room for what it read, so a
/// session on many partitions that never reads held far more: here each of 64 feeders read what
/// was free of a 1 MiB window of header-stuffed events (256 KiB of headers, a 1-byte payload)
/// below the reader's ring, at least one event, and waited with it. Now a feeder reserves the
/// room before it reads, takes only what the reservation holds, and reads an event that did not
/// fit again once there is room for it. Failed before the fix: the gateway grew by 171 MiB (41 after).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_many_partitions_that_never_reads_holds_one_window() {
    const SESSIONS: usize = 8;
    const PARTITIONS: usize = 64;
    let (_dir, data) = temp_dir();
    let gw = Process::start(
        &data,
        &[
            ("ACKGATE_DELIVERY__MAX_IN_FLIGHT_BYTES", "1048576"),
            ("ACKGATE_DELIVERY__READER_BUFFER_EVENTS", "1"),
            ("ACKGATE_DELIVERY__READER_BUFFER_BYTES", "1"),
        ],
    );
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "wide", "partitions": PARTITIONS})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    // Five events of 256 KiB of headers on every partition, 60 MiB in all.
    let stuffed = "h".repeat(256 << 10);
    for partition in 0..PARTITIONS {
        let events: Vec<_> = (0..5).map(|_| json!({"partition": partition, "headers": {"stuffed": stuffed}, "payload": 1})).collect();
        publish(&gw.base, "wide", json!({ "events": events })).await;
    }
    let before = gw.rss_kib();
    let stalled = sessions_that_never_read(&gw, "wide", SESSIONS).await;
    let grown_mib = gw.rss_kib().saturating_sub(before) / 1024;
    // Per session: its window (1 MiB), its frames and the socket's buffers. Before the fix each
    // of its 64 feeders held an event or more besides.
    assert!(grown_mib < 100, "the gateway grew by {grown_mib} MiB for {SESSIONS} sessions on {PARTITIONS} partitions that never read");
    drop(stalled);
}

/// Issue 25: remembered idempotency keys are bounded by `publish.idempotency_max_keys`: a new key
/// beyond it is 429 `limit_exceeded` (written nowhere), a retry of a remembered key still
/// answers, and once the window has passed the expired keys make room without waiting for the
/// sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_bounded_and_expired_ones_make_room() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.publish.idempotency_max_keys = 2;
    config.publish.idempotency_window_secs = 60;
    let clock = std::sync::Arc::new(ackgate::core::clock::ManualClock::new(1_000_000));
    let gw = InProcess::start_with_clock(config, clock.clone()).await;
    let send = async |key: &str, n: u64| {
        let response = http()
            .post(format!("{}/topics/keys/events", gw.base))
            .header("Idempotency-Key", key)
            .json(&json!({"partition": 0, "payload": {"n": n}}))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json::<serde_json::Value>().await.unwrap())
    };
    assert_eq!(send("a", 1).await.0, 200);
    assert_eq!(send("b", 2).await.0, 200);
    let (status, refused) = send("c", 3).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (429, Some("limit_exceeded")), "{refused}");
    assert_eq!(send("a", 1).await.0, 200, "a remembered key still answers at the limit");
    let written: u64 = get_json(&format!("{}/topics", gw.base)).await.1["topics"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["log_end"].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(written, 2, "only a and b were written");
    clock.advance(61_000);
    assert_eq!(send("c", 3).await.0, 200, "expired keys made room");
    gw.stop().await;
}

/// A session over `limits.max_sessions` gets an `error` `limit_exceeded`, then close 1013 (try
/// again later: not final), as docs/protocol.md says; one more is admitted once a place is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_the_limit_gets_limit_exceeded_then_close_1013() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_sessions = 1;
    let gw = InProcess::start(config).await;
    let first = TestClient::connect(gw.addr(), "first").await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws?client_id=second", gw.addr())).await.expect("the upgrade is answered");
    let error = match tokio::time::timeout(WAIT, ws.next()).await.expect("answered") {
        Some(Ok(Message::Text(text))) => serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        other => panic!("expected an error frame, got {other:?}"),
    };
    assert_eq!((error["type"].as_str(), error["code"].as_str()), (Some("error"), Some("limit_exceeded")), "{error}");
    let close = loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("closed in time") {
            Some(Ok(Message::Close(Some(frame)))) => break u16::from(frame.code),
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(close, ackgate::core::protocol::close_code::TRY_AGAIN_LATER);
    assert_eq!(close, 1013);
    first.close().await;
    let mut admitted = None;
    for _ in 0..100 {
        admitted = TestClient::try_connect(gw.addr(), "second").await;
        if admitted.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(admitted.is_some(), "a freed place admits the next session");
    gw.stop().await;
}

/// Issue 59, item 4: keys and header names are bounded at publish (`limits.max_key_bytes`,
/// `limits.max_header_name_bytes`), over REST (400) and in a `publish` frame (`bad_frame`), with
/// the limit named; nothing of a refused batch is written. Before, any size went in, and a
/// key-ordered group kept each idle key as a full string (now an 8-byte hash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_header_names_are_bounded_at_publish() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_LIMITS__MAX_KEY_BYTES", "16"), ("ACKGATE_LIMITS__MAX_HEADER_NAME_BYTES", "8")]);
    let post = |body: serde_json::Value| http().post(format!("{}/topics/bounded/events", gw.base)).json(&body).send();
    let ok = post(json!({"key": "k".repeat(16), "headers": {"h".repeat(8): "any length of value"}, "payload": 1})).await.unwrap();
    assert_eq!(ok.status(), 200);
    let refused = post(json!({"events": [{"payload": 2}, {"key": "k".repeat(17), "payload": 3}]})).await.unwrap();
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_request", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limits.max_key_bytes"), "{body}");
    let refused = post(json!({"headers": {"h".repeat(9): "x"}, "payload": 4})).await.unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("limits.max_header_name_bytes"));
    let mut client = TestClient::connect(gw.addr, "publisher").await;
    client.send(json!({"op": "publish", "topic": "bounded", "events": [{"key": "é".repeat(9), "payload": 5}], "req": "p"})).await;
    let error = client.recv_type("error").await;
    assert_eq!((error["code"].as_str(), error["req"].as_str()), (Some("bad_frame"), Some("p")), "{error}");
    assert!(error["message"].as_str().unwrap().contains("key is 18 bytes; at most 16"), "{error}");
    client.close().await;
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let log_end: u64 = topics["topics"][0]["partitions"].as_array().unwrap().iter().map(|p| p["log_end"].as_u64().unwrap()).sum();
    assert_eq!(log_end, 1, "only the event within the bounds was written: {topics}");
    gw.kill9();
}
