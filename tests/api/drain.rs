//! Draining an instance (issue 25, docs/protocol.md `POST /admin/drain`): not ready, no new sessions,
//! and the sessions closed one by one over `server.drain_ms`, each with `reconnect` then 1012.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_closes_sessions_spread_over_its_window_and_refuses_new_ones() {
    const CLIENTS: usize = 30;
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.drain_ms = 3000;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let mut closing = Vec::new();
    for i in 0..CLIENTS {
        let mut client = TestClient::connect(gw.addr(), &format!("c{i}")).await;
        client.subscribe("t", json!({})).await;
        let event = client.recv_type("event").await;
        client.ack_confirmed(&[id(&event)], "a").await;
        closing.push(tokio::spawn(async move {
            let reconnect = client.recv_type("reconnect").await;
            let code = client.close_code().await;
            (reconnect["after_ms"].as_u64(), code, Instant::now())
        }));
    }
    assert_eq!(get_json(&format!("{}/readyz", gw.base)).await.0, 200);
    let started = Instant::now();
    let (status, answer) = post_json(&format!("{}/admin/drain", gw.base), json!({})).await;
    assert_eq!((status, &answer["sessions"], &answer["already_draining"]), (200, &json!(CLIENTS), &json!(false)), "{answer}");
    // Not ready, and no new session: 503 with Retry-After (the window, in seconds).
    let (status, ready) = get_json(&format!("{}/readyz", gw.base)).await;
    assert_eq!(status, 503, "{ready}");
    let refused = http()
        .get(format!("{}/ws?client_id=late", gw.base))
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "3");
    let (_, again) = post_json(&format!("{}/admin/drain", gw.base), json!({})).await;
    assert_eq!(again["already_draining"], true);

    let mut closed_at = Vec::new();
    for task in closing {
        let (after_ms, code, at) = task.await.unwrap();
        assert_eq!(code, 1012);
        assert!(after_ms.is_some_and(|ms| ms <= 1000), "{after_ms:?}");
        closed_at.push(at.duration_since(started));
    }
    closed_at.sort();
    // Spread over the window (the last at 29/30 of 3 s), not all at once; a slow machine can only
    // spread them more. Never all in the first second.
    let (first, last) = (closed_at[0], closed_at[CLIENTS - 1]);
    assert!(last - first >= Duration::from_millis(2000), "closes from {first:?} to {last:?}");
    assert!(closed_at.iter().filter(|t| **t < Duration::from_secs(1)).count() < CLIENTS / 2, "{closed_at:?}");
    // Nothing was lost: every client's ack is stored.
    for i in 0..CLIENTS {
        assert_eq!(stored_offset(&gw.base, "t", &format!("c{i}"), 0).await.unwrap()["committed"], 1);
    }
    gw.stop().await;
}
