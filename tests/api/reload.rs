//! Settings changed without a restart (issue 45, item 6; PROTOCOL.md `POST /admin/reload`):
//! SIGHUP and `POST /admin/reload` read the config file again, apply what may change live to
//! what comes next, and refuse a change of anything else with 400 naming the keys, keeping the
//! settings in force.

use std::path::Path;

use serde_json::{json, Value};

use crate::support::*;

/// The config file `Process::start` wrote, with `server` and the other tables' `extra` lines.
fn write_config(path: &Path, data_dir: &Path, server: &str, extra: &str) {
    let text = format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:0\"\n{server}\n{extra}\n", data_dir.display().to_string());
    std::fs::write(path, text).unwrap();
}

async fn publish_from(base: &str, origin: &str) -> u16 {
    let response = http().post(format!("{base}/topics/t/events")).header("origin", origin).json(&json!({"payload": 1})).send().await.unwrap();
    response.status().as_u16()
}

async fn reload(base: &str) -> (u16, Value) {
    post_json(&format!("{base}/admin/reload"), json!({})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_admin_reload_apply_live_settings_and_refuse_the_rest() {
    let (_dir, data) = temp_dir();
    // The log filter comes from the file (RUST_LOG empty): info, so requests are not logged.
    let gw = Process::start(&data, &[("RUST_LOG", "")]);
    let config = data.with_extension("toml");
    let before = TestClient::connect(gw.addr, "before").await;
    assert_eq!((before.welcome["ack_timeout_ms"].as_u64(), before.welcome["max_in_flight"].as_u64()), (Some(30_000), Some(1000)), "{}", before.welcome);
    assert_eq!(publish_from(&gw.base, "https://app.example").await, 403, "an origin not allowed yet");
    assert_eq!(get_json(&format!("{}/healthz", gw.base)).await.0, 200);
    assert!(!gw.logs.lock().unwrap().iter().any(|l| l.contains("path=\"/healthz\"")), "info does not log requests");

    // Live keys changed, then SIGHUP.
    let live_server = "log_level = \"info,ackgate::http=debug\"\nallowed_origins = [\"https://app.example\"]";
    let live_rest = "[delivery]\nack_timeout_ms = 1234\nmax_in_flight = 7\n[limits]\nmax_subscriptions_per_session = 1";
    write_config(&config, &data, live_server, live_rest);
    gw.signal("HUP");
    let line = gw.wait_for_log("config reloaded").await;
    for key in ["delivery.ack_timeout_ms", "delivery.max_in_flight", "limits.max_subscriptions_per_session", "server.allowed_origins", "server.log_level"] {
        assert!(line.contains(key), "{key} named in {line}");
    }
    let mut after = TestClient::connect(gw.addr, "after").await;
    assert_eq!((after.welcome["ack_timeout_ms"].as_u64(), after.welcome["max_in_flight"].as_u64()), (Some(1234), Some(7)), "{}", after.welcome);
    assert_eq!(publish_from(&gw.base, "https://app.example").await, 200, "the origin allowed now");
    after.subscribe("t", json!({})).await;
    after.send(json!({"op": "subscribe", "topic": "u", "req": "second"})).await;
    let refused = after.recv_type("error").await;
    assert_eq!(refused["code"], "limit_exceeded", "{refused}");
    assert_eq!(get_json(&format!("{}/healthz", gw.base)).await.0, 200);
    gw.wait_for_log("path=\"/healthz\"").await;

    // A key that changes only with a restart: 400 naming it, and nothing applied, not even the
    // live key beside it.
    write_config(&config, &data, &format!("{live_server}\ndrain_ms = 1"), &live_rest.replace("1234", "999"));
    let (status, answer) = reload(&gw.base).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("server.drain_ms") && !message.contains("ack_timeout_ms"), "{message}");
    gw.wait_for_log("config reload refused").await;
    let still = TestClient::connect(gw.addr, "still").await;
    assert_eq!(still.welcome["ack_timeout_ms"].as_u64(), Some(1234), "the settings in force stay: {}", still.welcome);

    // A file that does not parse, or a value that is no log filter: 400, nothing applied.
    std::fs::write(&config, "[delivery\nack_timeout_ms = 5").unwrap();
    let (status, answer) = reload(&gw.base).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("a restart with this file would stop"), "said before the restart: {answer}");
    write_config(&config, &data, "log_level = \"info,ackgate=notalevel\"", live_rest);
    let (status, answer) = reload(&gw.base).await;
    assert!(status == 400 && answer["error"]["message"].as_str().unwrap_or_default().contains("log_level"), "{answer}");
    assert_eq!(TestClient::connect(gw.addr, "still2").await.welcome["ack_timeout_ms"].as_u64(), Some(1234));

    // The file as it was applied: nothing changes. The session opened first is still served.
    write_config(&config, &data, live_server, live_rest);
    let (status, answer) = reload(&gw.base).await;
    assert_eq!((status, &answer["changed"]), (200, &json!([])), "{answer}");
    let mut before = before;
    before.send(json!({"op": "ping", "req": "p"})).await;
    assert_eq!(before.recv_type("pong").await["req"], "p");
    // Each reload counted by its result (issue 62 item 2: `AckgateReloadFailed`): the SIGHUP and
    // the last POST went through, three were refused.
    let metrics = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ackgate_config_reloads_total{result=\"ok\"} 2\n"), "{metrics}");
    assert!(metrics.contains("ackgate_config_reloads_total{result=\"refused\"} 3\n"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_a_config_file_refuses_a_reload() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let (status, answer) = reload(&gw.base).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("not started from a config file"), "{answer}");
}

/// Issue 45 item 6's "JWT keys": a reload that changes `auth.jwt_secret` checks the next
/// handshake with the new secret (a token of the old one is refused), and a session opened with
/// the old one keeps going until its token expires. Turning HS256 tokens on or off (to or from
/// an empty secret) needs a restart: refused, the secret in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_rotates_the_jwt_secret_for_the_next_handshakes() {
    const FIRST: &str = "the-first-secret-of-at-least-32-bytes";
    const SECOND: &str = "the-second-secret-of-at-least-32-bytes";
    let token = |secret: &str, sub: &str| {
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &json!({"sub": sub}), &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes())).unwrap()
    };
    let (_dir, data) = temp_dir();
    let gw = Process::start_with_file(&data, &format!("[auth]\njwt_secret = {FIRST:?}"), &[]);
    let config = data.with_extension("toml");
    let ws = |client: &str, token: &str| format!("{}/ws?client_id={client}&token={token}", gw.base);
    let mut old = TestClient::connect_url(&format!("ws://{}/ws?client_id=old&token={}", gw.addr, token(FIRST, "old"))).await;
    assert_eq!(crate::auth::refused(ws("a", &token(SECOND, "a")), None).await, (1008, "unauthorized".into()), "not the second secret yet");

    write_config(&config, &data, "", &format!("[auth]\njwt_secret = {SECOND:?}"));
    let (status, answer) = reload(&gw.base).await;
    assert_eq!((status, &answer["changed"]), (200, &json!(["auth.jwt_secret"])), "{answer}");
    assert_eq!(crate::auth::refused(ws("a", &token(FIRST, "a")), None).await, (1008, "unauthorized".into()), "the first secret is refused now");
    let new = TestClient::connect_url(&format!("ws://{}/ws?client_id=new&token={}", gw.addr, token(SECOND, "new"))).await;
    assert_eq!(new.welcome["client_id"], "new");
    old.send(json!({"op": "ping", "req": "p"})).await;
    assert_eq!(old.recv_type("pong").await["req"], "p", "a session of the old secret goes on");

    // Emptied: HS256 tokens would be off, which only a restart does.
    write_config(&config, &data, "", "[auth]\njwt_secret = \"\"");
    let (status, answer) = reload(&gw.base).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("auth.jwt_secret"), "{answer}");
    assert_eq!(crate::auth::refused(format!("{}/ws?client_id=a", gw.base), None).await, (1008, "unauthorized".into()), "tokens are still required");
    TestClient::connect_url(&format!("ws://{}/ws?client_id=again&token={}", gw.addr, token(SECOND, "again"))).await;
    gw.kill9();
}
