//! `GET /admin/dead-letters`: pages (`limit`, `after`, `next`), the client-only filter (answered
//! from the client-ordered index), the `term` reason bound, and dead-letter retention.

use std::sync::Arc;

use ackgate::core::offsets::{Clock, ManualClock, SystemClock};
use serde_json::{json, Value};

use crate::support::*;

/// Connects `client`, subscribes to `topic` and terms its first `n` events.
async fn term_events(addr: std::net::SocketAddr, client: &str, topic: &str, n: usize) {
    let mut ws = WsClient::connect(addr, client).await;
    ws.subscribe(topic, json!({})).await;
    for event in ws.recv_events(n).await {
        ws.send(json!({"op": "term", "delivery_id": id(&event), "reason": format!("bad {}", event["offset"])})).await;
    }
    // A ping answered after the terms: they have been handled.
    ws.send(json!({"op": "ping", "req": "p"})).await;
    ws.recv_type("pong").await;
    ws.close().await;
}

/// Every page of a query, following `next`; returns `(client, topic, offset)` in page order.
async fn all_pages(base: &str, filter: &str, limit: usize) -> Vec<(String, String, u64)> {
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let mut url = format!("{base}/admin/dead-letters?limit={limit}{filter}");
        if let Some(a) = &after {
            url.push_str(&format!("&after={}", a.replace('#', "%23")));
        }
        let (status, page) = get_json(&url).await;
        assert_eq!(status, 200, "{page}");
        let list = page["dead_letters"].as_array().unwrap();
        assert!(list.len() <= limit);
        rows.extend(list.iter().map(|d| (d["client_id"].as_str().unwrap().to_string(), d["topic"].as_str().unwrap().to_string(), d["offset"].as_u64().unwrap())));
        match page.get("next") {
            Some(Value::String(next)) => {
                assert_eq!(list.len(), limit, "a page with a next is full");
                after = Some(next.clone());
            }
            None => return rows,
            other => panic!("next is {other:?}"),
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_come_in_pages_and_filter_by_client_from_the_index() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "a", 1, 0, 3).await;
    publish_numbered(&gw.base, "b", 1, 0, 2).await;
    for client in ["x", "y"] {
        term_events(gw.addr(), client, "a", 3).await;
        term_events(gw.addr(), client, "b", 2).await;
    }
    let everything = all_pages(&gw.base, "", 3).await;
    assert_eq!(everything.len(), 10);
    let mut sorted = everything.clone();
    sorted.sort_by(|l, r| (&l.1, &l.0, l.2).cmp(&(&r.1, &r.0, r.2)));
    assert_eq!(everything, sorted, "ordered by topic, client, offset; no row twice");
    assert_eq!(all_pages(&gw.base, "", 10).await, everything, "one page of 10 is the same list");
    assert_eq!(all_pages(&gw.base, "", 1000).await, everything);

    let of_y = all_pages(&gw.base, "&client_id=y", 2).await;
    assert_eq!(of_y, vec![("y".into(), "a".into(), 0), ("y".into(), "a".into(), 1), ("y".into(), "a".into(), 2), ("y".into(), "b".into(), 0), ("y".into(), "b".into(), 1)]);
    assert_eq!(all_pages(&gw.base, "&client_id=x&topic=b", 1).await, vec![("x".into(), "b".into(), 0), ("x".into(), "b".into(), 1)]);
    let (_, first) = get_json(&format!("{}/admin/dead-letters?topic=a&client_id=x", gw.base)).await;
    assert_eq!(first["dead_letters"][2]["reason"], "bad 2");
    assert!(first.get("next").is_none(), "the last page has no next: {first}");

    for bad in ["limit=0", "limit=1001", "limit=-1", "limit=x", "after=nope", "after=a%23x%230", "after=a%23x%230%23-1", "page=2"] {
        let (status, body) = get_json(&format!("{}/admin/dead-letters?{bad}", gw.base)).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{bad}: {body}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_reason_over_one_kib_is_refused_and_nothing_is_dead_lettered() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let mut ws = WsClient::connect(gw.addr(), "c").await;
    ws.subscribe("t", json!({})).await;
    let event = ws.recv_type("event").await;
    ws.send(json!({"op": "term", "delivery_id": id(&event), "reason": "r".repeat(1025), "req": "t1"})).await;
    let answer = ws.recv().await;
    assert_eq!((answer["code"].as_str(), answer["req"].as_str()), (Some("bad_frame"), Some("t1")), "{answer}");
    let (_, dead) = get_json(&format!("{}/admin/dead-letters", gw.base)).await;
    assert_eq!(dead["dead_letters"], json!([]));
    ws.send(json!({"op": "term", "delivery_id": id(&event), "reason": "r".repeat(1024)})).await;
    ws.send(json!({"op": "ping", "req": "p"})).await;
    ws.recv_type("pong").await;
    let (_, dead) = get_json(&format!("{}/admin/dead-letters", gw.base)).await;
    assert_eq!(dead["dead_letters"][0]["reason"].as_str().map(str::len), Some(1024));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_expire_after_their_retention() {
    let (_dir, data) = temp_dir();
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let mut config = test_config(&data);
    config.dead_letters.retention_secs = 3600;
    let gw = InProcess::start_with_clock(config, clock.clone()).await;
    publish_numbered(&gw.base, "t", 1, 0, 2).await;
    term_events(gw.addr(), "old", "t", 2).await;
    clock.advance(1800 * 1000);
    term_events(gw.addr(), "new", "t", 2).await;
    assert_eq!(gw.handle.sweep_dead_letters_now().unwrap(), 0, "nothing is an hour old yet");
    clock.advance(1800 * 1000 + 1);
    assert_eq!(gw.handle.sweep_dead_letters_now().unwrap(), 2);
    let left = all_pages(&gw.base, "", 100).await;
    assert_eq!(left, vec![("new".into(), "t".into(), 0), ("new".into(), "t".into(), 1)]);
    assert_eq!(all_pages(&gw.base, "&client_id=old", 100).await, vec![], "the client index forgot them too");
    gw.stop().await;
}
