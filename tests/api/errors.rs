//! Every error code and close code this gateway produces, provoked with bad input.

use std::time::Duration;

use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

async fn expect_error(client: &mut TestClient, frame: &str, code: &str) -> Value {
    client.send_text(frame).await;
    let answer = client.recv().await;
    assert_eq!((answer["type"].as_str(), answer["code"].as_str()), (Some("error"), Some(code)), "{frame} -> {answer}");
    answer
}

#[tokio::test]
async fn bad_frames_get_error_codes_and_the_session_stays_open() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_subscriptions_per_session = 1;
    config.limits.max_clients_per_topic = 1;
    // A subscribe creates a missing topic where a publish would (issue 61 item 1): not here.
    config.embedded.auto_create_topics = ackgate::config::AutoCreateTopics::Never;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    publish_numbered(&gw.base, "u", 1, 0, 0).await;
    let mut c = TestClient::connect(gw.addr(), "bad").await;
    expect_error(&mut c, "not json", "bad_frame").await;
    let e = expect_error(&mut c, r#"{"op":"teleport","req":"r9"}"#, "bad_frame").await;
    assert_eq!(e["req"], "r9", "req is echoed on errors");
    expect_error(&mut c, r#"{"topic":"t"}"#, "bad_frame").await;
    expect_error(&mut c, r#"{"op":"subscribe"}"#, "bad_frame").await;
    expect_error(&mut c, r#"{"op":"ack"}"#, "bad_frame").await;
    expect_error(&mut c, r#"{"op":"subscribe","topic":5}"#, "bad_frame").await;
    expect_error(&mut c, r#"{"op":"subscribe","topic":"a#b"}"#, "invalid_name").await;
    let long = format!(r#"{{"op":"subscribe","topic":"{}","req":7}}"#, "x".repeat(250));
    assert_eq!(expect_error(&mut c, &long, "invalid_name").await["req"], 7);
    expect_error(&mut c, r#"{"op":"subscribe","topic":"nope"}"#, "unknown_topic").await;
    expect_error(&mut c, r#"{"op":"unsubscribe","topic":"t"}"#, "not_subscribed").await;
    expect_error(&mut c, r#"{"op":"ack","delivery_id":"1.0.0.0"}"#, "unknown_delivery").await;
    expect_error(&mut c, r#"{"op":"ack","delivery_id":"garbage"}"#, "unknown_delivery").await;
    expect_error(&mut c, r#"{"op":"nack","delivery_id":"1.0.0.0"}"#, "unknown_delivery").await;
    expect_error(&mut c, r#"{"op":"extend","delivery_id":"x"}"#, "unknown_delivery").await;
    expect_error(&mut c, r#"{"op":"term","delivery_id":"x"}"#, "unknown_delivery").await;
    c.subscribe("t", json!({})).await;
    let event = c.recv_type("event").await;
    expect_error(&mut c, r#"{"op":"subscribe","topic":"u"}"#, "limit_exceeded").await;
    // A second client on the same topic is over limits.max_clients_per_topic = 1.
    let mut other = TestClient::connect(gw.addr(), "other").await;
    let e = expect_error(&mut other, r#"{"op":"subscribe","topic":"t"}"#, "limit_exceeded").await;
    assert!(e["message"].as_str().unwrap().contains("max_clients_per_topic"));
    other.subscribe("u", json!({})).await;
    // A forged id for a delivered but unacknowledged event is unknown; the real one works.
    let real = event["delivery_id"].as_str().unwrap();
    let forged = format!("ffff{}", &real[real.find('.').unwrap()..]);
    expect_error(&mut c, &json!({"op": "ack", "delivery_id": forged}).to_string(), "unknown_delivery").await;
    assert_eq!(c.ack_confirmed(&[real], "ok").await["type"], "ack_ok");
    c.send(json!({"op": "ping", "req": "p"})).await;
    assert_eq!(c.recv().await, json!({"type": "pong", "req": "p"}));
    gw.stop().await;
}

#[tokio::test]
async fn handshake_refuses_missing_or_invalid_client_ids() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    for query in ["", "?client_id=", "?client_id=a%23b", &format!("?client_id={}", "c".repeat(129))] {
        let url = format!("ws://{}/ws{query}", gw.addr());
        match tokio_tungstenite::connect_async(url).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 400, "{query}");
                let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
                assert_eq!(body["error"]["code"], "invalid_name", "{query}");
            }
            other => panic!("{query}: expected HTTP 400, got {other:?}"),
        }
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_frame_over_the_limit_closes_with_1009() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_frame_bytes = 1024;
    let gw = InProcess::start(config).await;
    let mut c = TestClient::connect(gw.addr(), "big").await;
    c.send(json!({"op": "ping", "req": "x".repeat(2000)})).await;
    assert_eq!(c.close_code().await, 1009);
    gw.stop().await;
}

/// A frame far over the limit (2, 4 and 16 MiB against the 1 MiB default), 20 times each: the
/// client always finishes sending and reads close 1009; the gateway never resets the connection
/// under it by closing while the frame is still arriving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_always_gets_its_1009_never_a_reset() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    for mib in [2usize, 4, 16] {
        let big = format!("{{\"op\":\"ping\",\"req\":\"{}\"}}", "x".repeat(mib << 20));
        for round in 0..20 {
            let url = format!("ws://{}/ws?client_id=big-{mib}-{round}", gw.addr());
            let (mut ws, _) = tokio_tungstenite::connect_async(url).await.expect("websocket connects");
            let welcome = ws.next().await.expect("welcome").expect("welcome frame");
            assert!(welcome.to_text().unwrap().contains("welcome"));
            let sent = ws.send(Message::text(big.clone())).await;
            assert!(sent.is_ok(), "{mib} MiB round {round}: the gateway reset the connection while the frame was arriving: {sent:?}");
            let mut code = None;
            while let Some(next) = tokio::time::timeout(WAIT, ws.next()).await.expect("the gateway answers in time") {
                match next {
                    Ok(Message::Close(frame)) => {
                        code = frame.map(|f| u16::from(f.code));
                        break;
                    }
                    Ok(_) => continue,
                    Err(e) => panic!("{mib} MiB round {round}: the connection failed before the close frame ({e}); send: {sent:?}"),
                }
            }
            assert_eq!(code, Some(1009), "{mib} MiB round {round}: close code (send: {sent:?})");
        }
    }
    gw.stop().await;
}

#[tokio::test]
async fn binary_frames_are_bad_frames() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws?client_id=b", gw.addr())).await.unwrap();
    ws.send(Message::Binary(vec![1, 2, 3].into())).await.unwrap();
    use futures_util::StreamExt;
    let mut codes = Vec::new();
    for _ in 0..2 {
        if let Some(Ok(Message::Text(t))) = ws.next().await {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            codes.push(v["type"].as_str().unwrap().to_string() + ":" + v["code"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(codes, vec!["welcome:".to_string(), "error:bad_frame".to_string()]);
    gw.stop().await;
}

#[tokio::test]
async fn operator_disconnect_slow_client_and_shutdown_close_codes() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight = 1;
    config.delivery.slow_client_timeout_ms = 600;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    // 4002: an operator disconnects the session.
    let mut c = TestClient::connect(gw.addr(), "op").await;
    let session_id = c.welcome["session_id"].as_str().unwrap().to_string();
    let response = http().delete(format!("{}/admin/sessions/{session_id}", gw.base)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(c.close_code().await, 4002);
    // The close frame goes out before the session has drained its writes and unregistered: the
    // session is gone (404) soon after, not necessarily by the time the client reads the close.
    let started = std::time::Instant::now();
    loop {
        let response = http().delete(format!("{}/admin/sessions/{session_id}", gw.base)).send().await.unwrap();
        if response.status() == 404 {
            break;
        }
        assert_eq!(response.status(), 200, "an ending session is still disconnectable");
        assert!(started.elapsed() < WAIT, "the disconnected session never went away");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // 4003: the window stays full longer than allowed.
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe("t", json!({})).await;
    slow.recv_type("event").await;
    assert_eq!(slow.close_code().await, 4003);
    // 1001: the gateway shuts down.
    let mut last = TestClient::connect(gw.addr(), "last").await;
    let stop = tokio::spawn(gw.stop());
    assert_eq!(last.close_code().await, 1001);
    stop.await.unwrap();
}

#[tokio::test]
async fn rest_errors_are_4xx_with_the_error_body() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_batch_events = 2;
    config.limits.max_body_bytes = 4096;
    let gw = InProcess::start(config).await;
    let base = gw.base.clone();
    let client = http();
    let check = |status: u16, code: &'static str| {
        move |(s, body): (u16, Value)| {
            assert_eq!((s, body["error"]["code"].as_str()), (status, Some(code)), "{body}");
            assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    };
    async fn send(r: reqwest::RequestBuilder) -> (u16, Value) {
        let response = r.send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }
    let url = format!("{base}/topics/t/events");
    check(400, "bad_request")(send(client.post(&url).body("{not json")).await);
    check(400, "bad_request")(send(client.post(&url).json(&json!({"key": "no payload"}))).await);
    check(413, "limit_exceeded")(send(client.post(&url).json(&json!({"events": [{"payload": 1}, {"payload": 2}, {"payload": 3}]}))).await);
    check(413, "limit_exceeded")(send(client.post(&url).json(&json!({"payload": "x".repeat(5000)}))).await);
    check(400, "invalid_name")(send(client.post(format!("{base}/topics/a%23b/events")).json(&json!({"payload": 1}))).await);
    send(client.post(&url).json(&json!({"payload": 1}))).await;
    check(404, "not_found")(send(client.post(&url).json(&json!({"partition": 99, "payload": 1}))).await);
    check(409, "conflict")(send(client.post(format!("{base}/topics")).json(&json!({"name": "t", "partitions": 9}))).await);
    check(400, "bad_request")(send(client.post(format!("{base}/topics")).json(&json!({"name": "z", "partitions": 0}))).await);
    check(404, "not_found")(send(client.get(format!("{base}/no/such/route"))).await);
    check(405, "bad_request")(send(client.put(format!("{base}/topics"))).await);
    check(400, "bad_request")(send(client.post(format!("{base}/topics")).body("name=x")).await);
    check(400, "bad_request")(send(client.get(format!("{base}/admin/offsets?partition=x"))).await);
    check(400, "invalid_name")(send(client.get(format!("{base}/admin/offsets?topic=a%23b"))).await);
    check(404, "unknown_topic")(send(client.get(format!("{base}/admin/offsets/nope/c"))).await);
    check(404, "not_found")(send(client.get(format!("{base}/admin/sessions/nope"))).await);
    // 409 while the client is live or the topic is subscribed.
    let mut live = TestClient::connect(gw.addr(), "live").await;
    live.subscribe("t", json!({})).await;
    check(409, "conflict")(send(client.put(format!("{base}/admin/offsets/t/live/0")).json(&json!({"offset": 0}))).await);
    check(409, "conflict")(send(client.delete(format!("{base}/admin/offsets/t/live"))).await);
    check(409, "conflict")(send(client.delete(format!("{base}/topics/t"))).await);
    check(400, "bad_request")(send(client.put(format!("{base}/admin/offsets/t/other/0")).json(&json!({"offset": -1}))).await);
    // axum's own rejections get the error body too: bad UTF-8 in a path, a plain GET on /ws,
    // a JSON body over limits.max_body_bytes.
    check(400, "bad_request")(send(client.get(format!("{base}/admin/offsets/%FF%FE/c"))).await);
    let (status, body) = send(client.get(format!("{base}/ws?client_id=plain"))).await;
    assert!((400..500).contains(&status), "{status} {body}");
    assert_eq!(body["error"]["code"], "bad_request", "{body}");
    check(413, "limit_exceeded")(send(client.post(format!("{base}/topics")).body(format!(r#"{{"name":"{}","partitions":1}}"#, "x".repeat(5000)))).await);
    live.close().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw.stop().await;
}

#[tokio::test]
async fn admin_token_guards_admin_routes_and_publishing() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.admin_token = "s3cret".into();
    let gw = InProcess::start(config).await;
    let url = format!("{}/admin/sessions", gw.base);
    assert_eq!(http().get(&url).send().await.unwrap().status(), 401);
    assert_eq!(http().get(&url).bearer_auth("wrong").send().await.unwrap().status(), 403);
    assert_eq!(http().get(&url).bearer_auth("s3cret").send().await.unwrap().status(), 200);
    let publish = format!("{}/topics/t/events", gw.base);
    let denied = http().post(&publish).json(&json!({"payload": 1})).send().await.unwrap();
    assert_eq!(denied.status(), 401);
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    assert_eq!(http().post(&publish).bearer_auth("s3cret").json(&json!({"payload": 1})).send().await.unwrap().status(), 200);
    // Creating and deleting topics are guarded like publishing; listing them is not.
    let topics = format!("{}/topics", gw.base);
    assert_eq!(http().post(&topics).json(&json!({"name": "u", "partitions": 1})).send().await.unwrap().status(), 401);
    assert_eq!(http().delete(format!("{topics}/t")).bearer_auth("wrong").send().await.unwrap().status(), 403);
    assert_eq!(http().get(&topics).send().await.unwrap().status(), 200);
    assert_eq!(http().get(format!("{}/healthz", gw.base)).send().await.unwrap().status(), 200);
    gw.stop().await;
}
