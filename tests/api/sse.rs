//! Server-Sent Events (issue 24): the same sessions over `GET /sse` and `POST
//! /sse/{id}/frames`. The delivery body runs on both transports; the rest checks what only SSE
//! has: resume tokens as event ids, `Last-Event-ID`, and the POST's limits and credentials.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::kafka_broker::TestBroker;
use crate::support::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    WebSocket,
    Sse,
}

async fn connect(transport: Transport, addr: SocketAddr, client_id: &str) -> TestClient {
    match transport {
        Transport::WebSocket => TestClient::connect(addr, client_id).await,
        Transport::Sse => TestClient::connect_sse(addr, client_id, "", &[]).await,
    }
}

fn other(transport: Transport) -> Transport {
    if transport == Transport::Sse {
        Transport::WebSocket
    } else {
        Transport::Sse
    }
}

/// Subscribe, deliver, ack, nack, redelivery after a timeout, a dead letter, release on close,
/// and takeover (4001) by a session of the other transport and back.
async fn delivery_body(transport: Transport) {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.embedded.default_partitions = 1;
    config.delivery.ack_timeout_ms = 400;
    config.delivery.max_attempts = 3;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "d", 1, 0, 3).await;

    let mut client = connect(transport, gw.addr(), "c1").await;
    let subscribed = client.subscribe("d", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 0);
    let events = client.recv_events(3).await;
    assert_eq!(events.iter().map(|e| e["offset"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
    let ok = client.ack_confirmed(&[id(&events[0])], "a0").await;
    assert_eq!(ok["committed"], json!({"d": {"0": 1}}));

    // A nack redelivers at once, with the next attempt.
    client.send(json!({"op": "nack", "delivery_id": id(&events[1])})).await;
    let again = client.recv_type("event").await;
    assert_eq!((again["offset"].as_u64(), again["attempt"].as_u64()), (Some(1), Some(2)));
    client.send(json!({"op": "ack", "delivery_ids": [id(&again)]})).await;

    // Offset 2 is never acked: redelivered after each timeout, then a dead letter.
    for attempt in 2..=3 {
        let redelivered = client.recv_type("event").await;
        assert_eq!((redelivered["offset"].as_u64(), redelivered["attempt"].as_u64()), (Some(2), Some(attempt)));
    }
    wait_for("offset 2 becomes a dead letter", async || {
        let (_, dead) = get_json(&format!("{}/admin/dead-letters?topic=d&client_id=c1", gw.base)).await;
        dead["dead_letters"].as_array().is_some_and(|d| d.len() == 1 && d[0]["offset"] == 2)
    })
    .await;
    wait_for("the dead letter counts as acknowledged", async || stored_offset(&gw.base, "d", "c1", 0).await.is_some_and(|r| r["committed"] == 3)).await;

    // Released on close: a new session of the client gets the unacked event again.
    publish_numbered(&gw.base, "d", 1, 0, 1).await;
    let pending = client.recv_type("event").await;
    assert_eq!((pending["offset"].as_u64(), pending["attempt"].as_u64()), (Some(3), Some(1)));
    client.close().await;
    let mut client = connect(transport, gw.addr(), "c1").await;
    client.subscribe("d", json!({})).await;
    let released = client.recv_type("event").await;
    assert_eq!((released["offset"].as_u64(), released["attempt"].as_u64()), (Some(3), Some(2)));

    // Takeover by a session of the other transport, then back.
    let mut taker = connect(other(transport), gw.addr(), "c1").await;
    assert_eq!(client.close_code().await, 4001, "{transport:?} taken over by {:?}", other(transport));
    if transport == Transport::Sse {
        // A plain EventSource reconnects after any end of stream: after a final close it is told
        // to wait a day, or two tabs of one client would take the session from each other forever.
        assert_eq!(client.sse().retry, Some(86_400_000));
    }
    taker.subscribe("d", json!({})).await;
    let moved = taker.recv_type("event").await;
    assert_eq!(moved["offset"], 3, "the taken-over session's delivery moves to its successor");
    taker.ack_confirmed(&[id(&moved)], "moved").await;
    let mut back = connect(transport, gw.addr(), "c1").await;
    assert_eq!(taker.close_code().await, 4001, "{:?} taken over by {transport:?}", other(transport));
    back.subscribe("d", json!({})).await;
    publish_numbered(&gw.base, "d", 1, 0, 1).await;
    let last = back.recv_type("event").await;
    assert_eq!((last["offset"].as_u64(), last["attempt"].as_u64()), (Some(4), Some(1)));
    back.ack_confirmed(&[id(&last)], "last").await;
    assert_eq!(stored_offset(&gw.base, "d", "c1", 0).await.unwrap()["committed"], 5);
    back.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_over_websocket() {
    delivery_body(Transport::WebSocket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_over_sse() {
    delivery_body(Transport::Sse).await;
}

/// An event id's floors (every epoch 0 here), opened with `key`.
fn decode_token(key: &ackgate::core::resume_token::TokenKey, token: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    open_token(key, token).into_iter().map(|(t, floors)| (t, floors.into_iter().map(|(p, o)| (p, o.as_u64().expect("epoch 0"))).collect())).collect()
}

fn encode_token(token: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// Every event's id is a token naming the durable committed offsets; a reconnect with it as
/// `Last-Event-ID` starts each partition at the larger of it and the stored offset; a bad one is
/// refused (never 400: EventSource would retry the same one forever) and the stored offset applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_are_resume_tokens_and_last_event_id_resumes() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.embedded.default_partitions = 1;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "r", 1, 0, 4).await;

    let mut client = TestClient::connect_sse(gw.addr(), "resumer", "topics=r", &[]).await;
    let subscribed = client.recv().await;
    assert_eq!((subscribed["type"].as_str(), subscribed["topic"].as_str()), (Some("subscribed"), Some("r")));
    let events = client.recv_events(4).await;
    client.ack_confirmed(&[id(&events[0]), id(&events[1])], "two").await;
    // An id's token is read at most every 100 ms (TOKEN_REFRESH in http/sse.rs): past that, the
    // next event's id has the ack.
    tokio::time::sleep(Duration::from_millis(150)).await;
    publish_numbered(&gw.base, "r", 1, 0, 1).await;
    client.recv_type("event").await;
    let token = client.sse().last_event_id.clone().expect("event messages carry an id");
    assert_eq!(decode_token(&data_dir_token_key(&data), &token), BTreeMap::from([("r".to_string(), BTreeMap::from([("0".to_string(), 2)]))]));
    client.close().await;

    // What EventSource does when the stream breaks: the same URL with Last-Event-ID.
    let mut client = TestClient::connect_sse(gw.addr(), "resumer", "topics=r", &[("last-event-id", &token)]).await;
    client.recv_type("subscribed").await;
    let offsets: Vec<u64> = client.recv_events(3).await.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![2, 3, 4]);
    client.close().await;
    // A token ahead of the stored offset wins (it is the client's own progress); `resume=` works too.
    let ahead = encode_token(&json!({"r": {"0": 4}}));
    let mut client = TestClient::connect_sse(gw.addr(), "resumer", &format!("topics=r&resume={ahead}"), &[]).await;
    assert_eq!(client.recv_type("subscribed").await["partitions"][0]["from"], 4);
    assert_eq!(client.recv_type("event").await["offset"], 4);
    client.close().await;

    // (The token ahead above moved the stored offset to 4.)
    for (query, header) in
        [("topics=r", "not base64!"), ("topics=r", "bnVsbA"), ("topics=r&resume=eyJyIjp7IngiOjF9fQ", ""), ("topics=r", "r1.AAAAAAAAAAAAAAAAAAAAAAAAAAAA")]
    {
        let headers: Vec<(&str, &str)> = if header.is_empty() { vec![] } else { vec![("last-event-id", header)] };
        let mut client = TestClient::try_connect_sse(gw.addr(), "resumer", query, &headers).await.unwrap_or_else(|e| panic!("{query} / {header}: {e:?}"));
        let subscribed = client.recv_type("subscribed").await;
        assert_eq!(
            (subscribed["partitions"][0]["from"].as_u64(), subscribed["resume"].as_str(), subscribed["resume_reason"].as_str()),
            (Some(4), Some("refused"), Some("invalid")),
            "{query} / {header}: {subscribed}"
        );
        client.close().await;
    }
    let Err((status, body)) = TestClient::try_connect_sse(gw.addr(), "resumer", "topics=r&from=middle", &[]).await else { panic!("from=middle was accepted") };
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{body}");
    // Issue 40, item 12 (schemathesis found it): an empty `resume=` or an empty Last-Event-ID is
    // no token at all (400 before), and the stored offset applies.
    for (query, header) in [("topics=r&resume=", None), ("topics=r", Some("")), ("topics=r&resume=", Some(""))] {
        let headers: Vec<(&str, &str)> = header.map(|h| ("last-event-id", h)).into_iter().collect();
        let mut client = TestClient::try_connect_sse(gw.addr(), "resumer", query, &headers).await.unwrap_or_else(|e| panic!("{query} / {header:?}: {e:?}"));
        assert_eq!(client.recv_type("subscribed").await["partitions"][0]["from"], 4, "{query} / {header:?}");
        client.close().await;
    }
    let Err((status, body)) = TestClient::try_connect_sse(gw.addr(), "resumer", "topics=bad%20name", &[]).await else { panic!("a bad topic was accepted") };
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_name")));
    gw.stop().await;
}

/// The POST of frames: its shape, its limits, and whose session it may reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_posts_are_checked() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_batch_events = 2;
    config.limits.max_frame_bytes = 200;
    config.limits.max_frames_body_bytes = 1000;
    config.auth.jwt_secret = "s".repeat(32);
    let gw = InProcess::start(config).await;
    let token = |sub: &str| {
        let key = jsonwebtoken::EncodingKey::from_secret("s".repeat(32).as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &json!({"sub": sub}), &key).unwrap()
    };
    let mine = token("alice");
    let mut client = TestClient::connect_sse(gw.addr(), "alice", &format!("token={mine}"), &[]).await;
    let url = format!("{}{}", gw.base, client.welcome["ack_url"].as_str().unwrap());
    let post = async |body: &str, bearer: Option<&str>| {
        let mut request = http().post(&url).body(body.to_string());
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap())
    };
    let ping = r#"{"op":"ping","req":1}"#;
    let (status, answer) = post(&format!("[{ping}]"), Some(&mine)).await;
    assert_eq!((status, answer), (200, json!([{"type": "pong", "req": 1}])));
    let checks = [
        (format!("[{ping}]"), None, 401, "unauthorized"),
        (format!("[{ping}]"), Some(token("mallory")), 403, "forbidden"),
        (ping.to_string(), Some(mine.clone()), 400, "bad_request"),
        ("[1]".to_string(), Some(mine.clone()), 400, "bad_request"),
        ("not json".to_string(), Some(mine.clone()), 400, "bad_request"),
        (format!("[{ping},{ping},{ping}]"), Some(mine.clone()), 413, "limit_exceeded"),
        (format!(r#"[{{"op":"ping","req":"{}"}}]"#, "x".repeat(300)), Some(mine.clone()), 413, "limit_exceeded"),
        // Issue 40, item 2: a body over limits.max_frames_body_bytes, however few its frames.
        (format!("[{ping}{}]", " ".repeat(1000)), Some(mine.clone()), 413, "limit_exceeded"),
    ];
    for (body, bearer, status, code) in checks {
        let (got, answer) = post(&body, bearer.as_deref()).await;
        assert_eq!((got, answer["error"]["code"].as_str()), (status, Some(code)), "{body:.60}: {answer}");
    }
    // A frame the session refuses is answered in the array, as the WebSocket would.
    let (status, answer) = post(r#"[{"op":"ack","delivery_ids":["9.9.9.9"],"req":"x"},{"op":"nope"}]"#, Some(&mine)).await;
    assert_eq!(status, 200);
    assert_eq!(answer.as_array().unwrap().iter().map(|f| f["code"].as_str().unwrap()).collect::<Vec<_>>(), vec!["unknown_delivery", "bad_frame"]);
    // Another instance's (or an ended) session: 404, so the client reconnects the stream.
    let (status, answer) =
        http().post(format!("{}/sse/s0-0/frames", gw.base)).bearer_auth(&mine).body("[]").send().await.map(|r| (r.status().as_u16(), r)).unwrap();
    assert_eq!((status, answer.json::<Value>().await.unwrap()["error"]["code"].clone()), (404, json!("not_found")));
    client.expect_silence(Duration::from_millis(200)).await;
    client.close().await;
    wait_for("the ended session's POSTs are 404", async || post("[]", Some(&mine)).await.0 == 404).await;
    gw.stop().await;
}

/// The admin view, the metric and the operator's disconnect (4002) see SSE sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_and_disconnect_sse_sessions() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_SERVER__SSE_KEEPALIVE_MS", "100")]);
    let mut client = TestClient::connect_sse(gw.addr, "watched", "", &[]).await;
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    assert_eq!(sessions["sessions"][0]["transport"], "sse");
    assert_eq!(metric(&gw.base, "ackgate_sessions{transport=\"sse\"}").await, 1.0);
    assert_eq!(metric(&gw.base, "ackgate_sessions{transport=\"websocket\"}").await, 0.0);
    // Keepalive comments are not frames.
    client.expect_silence(Duration::from_millis(400)).await;
    let session_id = client.welcome["session_id"].as_str().unwrap().to_string();
    let deleted = http().delete(format!("{}/admin/sessions/{session_id}", gw.base)).send().await.unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    assert_eq!(client.close_code().await, 4002);
    assert_eq!(client.sse().retry, Some(3_000), "4002 is not a final close: the welcome's pause, the browser's usual one");
    wait_for("the session is gone", async || metric(&gw.base, "ackgate_sessions{transport=\"sse\"}").await == 0.0).await;
}

/// An SSE client through a SIGKILL: it reconnects with `Last-Event-ID` (the id of the last event
/// it read) to `next` (the restarted gateway, or another instance on the same log). Nothing is
/// lost, and nothing below the token is delivered again.
async fn sigkill_then_resume(env: &[(&str, &str)], to_another_instance: bool) {
    const EVENTS: u64 = 300;
    let (_dir, data) = temp_dir();
    let (_dir_b, data_b) = temp_dir();
    let gw = Process::start(&data, env);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "k", "partitions": 2})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let publish_range = async |base: &str, range: std::ops::Range<u64>| {
        let events: Vec<Value> = range.map(|n| json!({"key": format!("k{n}"), "payload": {"n": n}})).collect();
        publish(base, "k", json!({ "events": events })).await;
    };

    // Published in rounds while the client reads and acks, so that later event lines carry the
    // acks of earlier rounds in their ids (an id is the committed offsets when it was written).
    let mut seen = BTreeSet::new();
    let mut client = TestClient::connect_sse(gw.addr, "survivor", "topics=k", &[]).await;
    for round in 0..4 {
        publish_range(&gw.base, round * 30..(round + 1) * 30).await;
        while seen.len() < (round as usize + 1) * 30 {
            let event = client.recv_type("event").await;
            seen.insert(event["payload"]["n"].as_u64().unwrap());
            client.send(json!({"op": "ack", "delivery_ids": [id(&event)]})).await;
        }
    }
    publish_range(&gw.base, 120..EVENTS).await;
    for _ in 0..10 {
        let event = client.recv_type("event").await;
        seen.insert(event["payload"]["n"].as_u64().unwrap());
    }
    let token = client.sse().last_event_id.clone().unwrap();
    gw.kill9();
    let key = if to_another_instance { cluster_token_key() } else { data_dir_token_key(&data) };
    let floor: BTreeMap<u32, u64> = decode_token(&key, &token)["k"].iter().map(|(p, o)| (p.parse().unwrap(), *o)).collect();
    assert!(floor.values().sum::<u64>() > 0, "acks were durable before the kill: {floor:?}");

    let next = if to_another_instance { Process::start(&data_b, env) } else { Process::start(&data, env) };
    let mut client = TestClient::connect_sse(next.addr, "survivor", "topics=k", &[("last-event-id", &token)]).await;
    while seen.len() < EVENTS as usize {
        let event = client.recv_type("event").await;
        let (partition, offset) = (event["partition"].as_u64().unwrap() as u32, event["offset"].as_u64().unwrap());
        assert!(offset >= floor[&partition], "{partition}#{offset} is below the token {floor:?}");
        seen.insert(event["payload"]["n"].as_u64().unwrap());
        client.send(json!({"op": "ack", "delivery_ids": [id(&event)]})).await;
    }
    assert_eq!(seen, (0..EVENTS).collect::<BTreeSet<_>>());
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_client_resumes_after_sigkill_on_the_restarted_gateway() {
    sigkill_then_resume(&[], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_client_resumes_after_sigkill_on_another_instance_on_kafka() {
    let broker = TestBroker::start();
    let bootstrap = broker.bootstrap();
    // The two instances share a resume token key, as a cluster's do.
    sigkill_then_resume(
        &[("ACKGATE_STORAGE__BACKEND", "kafka"), ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", &bootstrap), ("ACKGATE_CLUSTER__TOKEN_KEY", CLUSTER_TOKEN_KEY)],
        true,
    )
    .await;
}

/// A page of another site cannot open a stream as any client (the exposure rule of `/ws`), nor
/// POST frames; a tool without an Origin (curl) can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_page_cannot_open_a_stream() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let Err((status, body)) = TestClient::try_connect_sse(gw.addr(), "victim", "topics=t", &[("origin", "https://evil.example")]).await else {
        panic!("a foreign origin opened a stream");
    };
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    let mut client = TestClient::connect_sse(gw.addr(), "victim", "", &[]).await;
    let url = format!("{}{}", gw.base, client.welcome["ack_url"].as_str().unwrap());
    let posted = http().post(&url).header("origin", "https://evil.example").body(r#"[{"op":"ping"}]"#).send().await.unwrap();
    assert_eq!(posted.status(), 403);
    client.send(json!({"op": "ping", "req": 1})).await;
    assert_eq!(client.recv().await["type"], "pong");
    client.close().await;
    gw.stop().await;
}

/// A page of an allowed origin (another site of the operator's) reads the stream and POSTs frames
/// cross-origin: CORS names the origin, and the preflight of the POST is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_origin_gets_cors_on_the_sse_routes() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.allowed_origins = vec!["https://app.example".into()];
    let gw = InProcess::start(config).await;
    let origin = [("origin", "https://app.example")];
    let client = TestClient::connect_sse(gw.addr(), "cors", "", &origin).await;
    let url = format!("{}{}", gw.base, client.welcome["ack_url"].as_str().unwrap());
    let preflight = http()
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 204);
    assert_eq!(preflight.headers()["access-control-allow-origin"], "https://app.example");
    assert!(preflight.headers()["access-control-allow-headers"].to_str().unwrap().contains("authorization"));
    let posted = http().post(&url).header("origin", "https://app.example").body(r#"[{"op":"ping","req":1}]"#).send().await.unwrap();
    assert_eq!(posted.headers()["access-control-allow-origin"], "https://app.example");
    assert_eq!(posted.json::<Value>().await.unwrap(), json!([{"type": "pong", "req": 1}]));
    let refused = http().request(reqwest::Method::OPTIONS, &url).header("origin", "https://evil.example").send().await.unwrap();
    assert_eq!(refused.status(), 403);
    client.close().await;
    gw.stop().await;
}

/// A stream is an answer still being written: `server.idle_timeout_ms` (meant for keep-alive
/// connections between requests) must not cut it. It did: every SSE session ended after a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outlives_the_idle_timeout() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.idle_timeout_ms = 300;
    config.server.sse_keepalive_ms = 100;
    config.embedded.default_partitions = 1;
    let gw = InProcess::start(config).await;
    publish(&gw.base, "p", json!({"payload": {"first": 1}})).await;
    let mut client = TestClient::connect_sse(gw.addr(), "patient", "topics=p", &[]).await;
    assert_eq!(client.recv_type("event").await["offset"], 0);
    client.expect_silence(Duration::from_millis(1200)).await;
    // Pretty-printed JSON with line breaks, stored as sent, still arrives as one message.
    let published = http().post(format!("{}/topics/p/events", gw.base)).body("{\"payload\": {\n  \"a\": 1\n}}").send().await.unwrap();
    assert_eq!(published.status(), 200);
    let event = client.recv_type("event").await;
    assert_eq!(event["payload"]["a"], 1);
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    assert_eq!(sessions["sessions"][0]["session_id"], client.welcome["session_id"], "the same session throughout");
    client.close().await;
    gw.stop().await;
}

/// EventSource reconnects with the URL it was opened with: `from=latest` and a token that names
/// the topic but lacks a partition (a token written before that partition was stored, or by an
/// older gateway) must resume that partition at the client's committed offset. It went to the
/// log end, past an event the client had received and never acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_with_from_latest_skips_nothing_the_client_holds() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    // A backlog that `latest` skips, as asked.
    publish_numbered(&gw.base, "l", 2, 0, 2).await;
    publish_numbered(&gw.base, "l", 2, 1, 2).await;
    let mut client = TestClient::connect_sse(gw.addr(), "late", "topics=l&from=latest", &[]).await;
    let subscribed = client.recv_type("subscribed").await;
    assert_eq!(subscribed["partitions"], json!([{"partition": 0, "from": 2, "epoch": 0}, {"partition": 1, "from": 2, "epoch": 0}]), "{subscribed}");
    publish_numbered(&gw.base, "l", 2, 0, 1).await;
    publish_numbered(&gw.base, "l", 2, 1, 1).await;
    let events = client.recv_events(2).await;
    let on = |p: u64| events.iter().find(|e| e["partition"] == p).unwrap().clone();
    client.ack_confirmed(&[id(&on(0))], "p0").await;
    client.close().await;

    let token = encode_token(&json!({"l": {"0": 3}}));
    let mut client = TestClient::connect_sse(gw.addr(), "late", "topics=l&from=latest", &[("last-event-id", &token)]).await;
    let subscribed = client.recv_type("subscribed").await;
    assert_eq!(subscribed["partitions"][1]["from"], 2, "partition 1 resumes at its committed offset: {subscribed}");
    let again = client.recv_type("event").await;
    assert_eq!((again["partition"].as_u64(), again["offset"].as_u64()), (Some(1), Some(2)));
    client.close().await;
    gw.stop().await;
}

/// An event's id names a topic subscribed by POST a moment earlier: the cached token (read at
/// most every 100 ms) is read again when the subscriptions change, or a reconnect within that
/// moment would not know the topic's progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_id_names_a_topic_subscribed_a_moment_ago() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "first", 1, 0, 1).await;
    publish_numbered(&gw.base, "second", 1, 0, 0).await;
    let mut client = TestClient::connect_sse(gw.addr(), "grower", "topics=first", &[]).await;
    client.recv_type("event").await;
    let key = data_dir_token_key(&data);
    assert_eq!(decode_token(&key, client.sse().last_event_id.as_ref().unwrap()).keys().collect::<Vec<_>>(), vec!["first"]);
    client.subscribe("second", json!({})).await;
    publish_numbered(&gw.base, "second", 1, 0, 1).await;
    client.recv_type("event").await;
    let token = decode_token(&key, client.sse().last_event_id.as_ref().unwrap());
    assert_eq!(token.get("second"), Some(&BTreeMap::from([("0".to_string(), 0)])), "{token:?}");
    client.close().await;
    gw.stop().await;
}

/// A draining instance's `reconnect` pause becomes the stream's `retry:`, so a plain
/// EventSource comes back after it (to another instance, through the load balancer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_sets_the_event_source_retry_to_the_pause() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.drain_ms = 500;
    let gw = InProcess::start(config).await;
    let mut client = TestClient::connect_sse(gw.addr(), "drained", "", &[]).await;
    let (status, _) = post_json(&format!("{}/admin/drain", gw.base), json!({})).await;
    assert_eq!(status, 200);
    let reconnect = client.recv_type("reconnect").await;
    assert_eq!(client.close_code().await, 1012);
    assert_eq!(client.sse().retry, reconnect["after_ms"].as_u64(), "{reconnect}");
}

/// POSTs to a session that does not get to them (its stream is not read, so it waits on its
/// writes) are refused with 429 past a few, instead of each holding a connection open until the
/// session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_to_a_stuck_session_are_refused_past_a_few() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.embedded.default_partitions = 1;
    config.delivery.max_in_flight = 10_000;
    config.delivery.max_in_flight_bytes = 1 << 30;
    let gw = InProcess::start(config).await;
    // 60 MB of events: well past what the session's queue (256 frames), the chunk being written
    // (256 more) and the socket buffers hold.
    let big = "x".repeat(60_000);
    for _ in 0..10 {
        let events: Vec<Value> = (0..100).map(|_| json!({"payload": {"big": big}})).collect();
        publish(&gw.base, "stuck", json!({ "events": events })).await;
    }
    let client = TestClient::connect_sse(gw.addr(), "stuck", "topics=stuck", &[]).await;
    let url = format!("{}{}", gw.base, client.welcome["ack_url"].as_str().unwrap());
    // The client reads nothing more; POSTs go on until one is refused.
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut posts = Vec::new();
    let refusal = tokio::time::timeout(WAIT, async {
        loop {
            let (url, refused_tx) = (url.clone(), refused_tx.clone());
            posts.push(tokio::spawn(async move {
                let response = reqwest::Client::new().post(&url).body(r#"[{"op":"ping"}]"#).send().await.unwrap();
                if response.status() != 200 {
                    let _ = refused_tx.send((response.status().as_u16(), response.json::<Value>().await.unwrap()));
                }
            }));
            if let Ok(Some(refused)) = tokio::time::timeout(Duration::from_millis(50), refused_rx.recv()).await {
                return refused;
            }
        }
    })
    .await
    .expect("a POST was refused");
    assert_eq!((refusal.0, refusal.1["error"]["code"].as_str()), (429, Some("limit_exceeded")), "{}", refusal.1);
    assert!(posts.len() > 16, "the first 16 wait for the session: {}", posts.len());
    drop(client);
    gw.stop().await;
}
