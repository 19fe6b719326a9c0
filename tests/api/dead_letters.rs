//! `GET /admin/dead-letters`: pages (`limit`, `after`, `next`), the client-only filter (answered
//! from the client-ordered index), the `term` reason bound, and dead-letter retention.

use std::sync::Arc;

use ackgate::core::clock::{Clock, ManualClock, SystemClock};
use serde_json::{json, Value};

use crate::support::*;

/// Connects `client`, subscribes to `topic` and terms its first `n` events.
async fn term_events(addr: std::net::SocketAddr, client: &str, topic: &str, n: usize) {
    let mut ws = TestClient::connect(addr, client).await;
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
        rows.extend(
            list.iter().map(|d| (d["client_id"].as_str().unwrap().to_string(), d["topic"].as_str().unwrap().to_string(), d["offset"].as_u64().unwrap())),
        );
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
    assert_eq!(
        of_y,
        vec![("y".into(), "a".into(), 0), ("y".into(), "a".into(), 1), ("y".into(), "a".into(), 2), ("y".into(), "b".into(), 0), ("y".into(), "b".into(), 1)]
    );
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
    let mut ws = TestClient::connect(gw.addr(), "c").await;
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

/// `POST /admin/dead-letters/redrive` for `client` on `topic` with `extra` fields.
async fn redrive(base: &str, topic: &str, client: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"topic": topic, "client_id": client});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    post_json(&format!("{base}/admin/dead-letters/redrive"), body).await
}

/// `(offset, attempts, reason)` of every dead letter of `client` on `topic`.
async fn dead_letters_of(base: &str, topic: &str, client: &str) -> Vec<(u64, u64, String)> {
    let (status, page) = get_json(&format!("{base}/admin/dead-letters?topic={topic}&client_id={client}")).await;
    assert_eq!(status, 200, "{page}");
    page["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["offset"].as_u64().unwrap(), d["attempts"].as_u64().unwrap(), d["reason"].as_str().unwrap().to_string()))
        .collect()
}

/// Issue 25, redrive: dead letters sent again reach the live client as `redrive: true` events
/// from attempt 1, outside its committed floor; an ack removes the dead letter, giving up again
/// keeps it with its attempts added up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redriven_dead_letters_reach_the_live_client_and_an_ack_removes_them() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_attempts = 2;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 5).await;
    let mut ws = TestClient::connect(gw.addr(), "c").await;
    ws.subscribe("t", json!({})).await;
    let events = ws.recv_events(5).await;
    ws.ack_confirmed(&[id(&events[0]), id(&events[1])], "a").await;
    for event in &events[2..] {
        ws.send(json!({"op": "term", "delivery_id": id(event), "reason": "bad"})).await;
    }
    ws.send(json!({"op": "ping", "req": "p"})).await;
    ws.recv_type("pong").await;
    assert_eq!(dead_letters_of(&gw.base, "t", "c").await.len(), 3);
    // Terms count as acknowledged; like plain acks they are written in the background (the pong
    // does not wait for the offset writer: CI saw 3 here once).
    wait_for("the terms to move the committed offset to 5", async || stored_offset(&gw.base, "t", "c", 0).await.is_some_and(|row| row["committed"] == 5)).await;

    let (status, answer) = redrive(&gw.base, "t", "c", json!({})).await;
    assert_eq!((status, &answer), (200, &json!({"redriven": 3})));
    let again = ws.recv_events(3).await;
    let offsets: Vec<u64> = again.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![2, 3, 4]);
    for event in &again {
        assert_eq!((event["redrive"].as_bool(), event["attempt"].as_u64()), (Some(true), Some(1)), "{event}");
        assert_eq!(event["payload"], events[event["offset"].as_u64().unwrap() as usize]["payload"], "the same event");
    }
    assert!(events.iter().all(|e| e.get("redrive").is_none()), "first deliveries carry no redrive field");

    // Acked: the dead letters go; the committed offset does not move.
    let ok = ws.ack_confirmed(&[id(&again[0]), id(&again[1])], "r").await;
    assert_eq!(ok["type"], "ack_ok", "{ok}");
    let ok = ws.ack_confirmed(&[id(&again[0])], "twice").await;
    assert_eq!(ok["type"], "ack_ok", "acking an acknowledged redrive again is a no-op success: {ok}");
    assert_eq!(dead_letters_of(&gw.base, "t", "c").await, vec![(4, 1, "bad".to_string())]);
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 5);

    // Given up on again (max_attempts 2, by nack): kept, its attempts are 1 + 2.
    ws.send(json!({"op": "nack", "delivery_id": id(&again[2])})).await;
    let second = ws.recv_type("event").await;
    assert_eq!((second["offset"].as_u64(), second["attempt"].as_u64(), second["redrive"].as_bool()), (Some(4), Some(2), Some(true)), "{second}");
    ws.send(json!({"op": "nack", "delivery_id": id(&second)})).await;
    ws.send(json!({"op": "ping", "req": "p2"})).await;
    ws.recv_type("pong").await;
    let mut kept = Vec::new();
    for _ in 0..100 {
        kept = dead_letters_of(&gw.base, "t", "c").await;
        if kept.first().is_some_and(|d| d.2 == "max_attempts") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(kept, vec![(4, 3, "max_attempts".to_string())]);
    // No longer marked: a new subscription of the client does not get it again unasked.
    ws.close().await;
    let mut ws = TestClient::connect(gw.addr(), "c").await;
    ws.subscribe("t", json!({})).await;
    ws.expect_silence(std::time::Duration::from_millis(500)).await;
    gw.stop().await;
}

/// Issue 25, redrive: a client without a session gets its redriven dead letters at its next
/// subscribe, also after a restart; `limit` and `next` page the request; the partition filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_for_an_offline_client_comes_at_its_next_subscribe_after_a_restart() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 2, 0, 3).await;
    publish_numbered(&gw.base, "t", 2, 1, 3).await;
    term_events(gw.addr(), "c", "t", 6).await;
    term_events(gw.addr(), "other", "t", 6).await;

    let (status, first) = redrive(&gw.base, "t", "c", json!({"partition": 0, "limit": 2})).await;
    assert_eq!((status, first["redriven"].as_u64()), (200, Some(2)), "{first}");
    let next = first["next"].as_str().expect("more match").to_string();
    assert_eq!(next, "t#c#0#1");
    let (_, rest) = redrive(&gw.base, "t", "c", json!({"partition": 0, "after": next})).await;
    assert_eq!(rest, json!({"redriven": 1}), "the last page has no next");
    gw.stop().await;

    let gw = InProcess::start(test_config(&data)).await;
    let mut ws = TestClient::connect(gw.addr(), "c").await;
    ws.subscribe("t", json!({})).await;
    let mut again = ws.recv_events(3).await;
    again.sort_by_key(|e| e["offset"].as_u64());
    let got: Vec<(u64, u64, bool)> = again.iter().map(|e| (e["partition"].as_u64().unwrap(), e["offset"].as_u64().unwrap(), e["redrive"] == true)).collect();
    assert_eq!(got, vec![(0, 0, true), (0, 1, true), (0, 2, true)], "partition 0 only");
    ws.ack_confirmed(&ids(&again), "r").await;
    let left: Vec<(u64, u64, String)> = dead_letters_of(&gw.base, "t", "c").await;
    assert_eq!(left.len(), 3, "partition 1's stay: {left:?}");
    assert_eq!(dead_letters_of(&gw.base, "t", "other").await.len(), 6, "another client's are untouched");
    ws.expect_silence(std::time::Duration::from_millis(300)).await;
    gw.stop().await;
}

/// Issue 62, item 6 (docs said "redrive or delete", and nothing deleted): `POST
/// /admin/dead-letters/delete` removes one dead letter, a partition's, or a page, on the real
/// binary; the backlog gauge (which the alert reads) follows; a redrive with `offset` sends that
/// one only; a redriven copy deleted while in flight is acked for nothing and never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_deleted_one_by_partition_or_by_page() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "t", 2, 0, 3).await;
    publish_numbered(&gw.base, "t", 2, 1, 3).await;
    term_events(gw.addr, "c", "t", 6).await;
    term_events(gw.addr, "other", "t", 6).await;
    let delete_url = format!("{}/admin/dead-letters/delete", gw.base);
    let delete = |body: Value| post_json(&delete_url, body);
    let backlog = async || metric(&gw.base, "ackgate_dead_letter_backlog{topic=\"t\"}").await;
    assert_eq!(backlog().await, 12.0);

    let (status, answer) = delete(json!({"topic": "t", "client_id": "c", "partition": 0, "offset": 1})).await;
    assert_eq!((status, answer), (200, json!({"deleted": 1})));
    let left: Vec<u64> = dead_letters_of(&gw.base, "t", "c").await.iter().map(|d| d.0).collect();
    assert_eq!(left, vec![0, 2, 0, 1, 2], "partition 0 offset 1 went, partition 1's stay");
    let (status, answer) = delete(json!({"topic": "t", "client_id": "c", "partition": 0, "offset": 1})).await;
    assert_eq!((status, answer), (200, json!({"deleted": 0})), "deleting it again deletes nothing");
    assert_eq!(backlog().await, 11.0);

    // A redrive of one dead letter: only it comes; deleted while in flight, its ack settles
    // nothing and it is not delivered again.
    let mut ws = TestClient::connect(gw.addr, "c").await;
    ws.subscribe("t", json!({})).await;
    let (status, answer) = redrive(&gw.base, "t", "c", json!({"partition": 1, "offset": 2})).await;
    assert_eq!((status, answer), (200, json!({"redriven": 1})));
    let again = ws.recv_type("event").await;
    assert_eq!((again["partition"].as_u64(), again["offset"].as_u64(), again["redrive"].as_bool()), (Some(1), Some(2), Some(true)), "{again}");
    ws.expect_silence(std::time::Duration::from_millis(300)).await;
    let (status, answer) = delete(json!({"topic": "t", "client_id": "c", "partition": 1})).await;
    assert_eq!((status, answer), (200, json!({"deleted": 3})));
    let ok = ws.ack_confirmed(&[id(&again)], "late").await;
    assert_eq!(ok["type"], "ack_ok", "{ok}");
    ws.close().await;

    // Pages: the rest of c's, one at a time; the other client's are untouched.
    let (status, first) = delete(json!({"topic": "t", "client_id": "c", "limit": 1})).await;
    assert_eq!((status, first["deleted"].as_u64()), (200, Some(1)), "{first}");
    let next = first["next"].as_str().expect("more match").to_string();
    let (_, rest) = delete(json!({"topic": "t", "client_id": "c", "after": next})).await;
    assert_eq!(rest, json!({"deleted": 1}));
    assert!(dead_letters_of(&gw.base, "t", "c").await.is_empty());
    assert_eq!(dead_letters_of(&gw.base, "t", "other").await.len(), 6);
    assert_eq!(backlog().await, 6.0);
    // Nothing of c's comes back at its next subscribe.
    let mut ws = TestClient::connect(gw.addr, "c").await;
    ws.subscribe("t", json!({})).await;
    ws.expect_silence(std::time::Duration::from_millis(300)).await;
    ws.close().await;
    gw.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_redrive_and_delete_requests_are_refused_with_the_error_codes() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    for route in ["redrive", "delete"] {
        let url = format!("{}/admin/dead-letters/{route}", gw.base);
        bad_requests_are_refused(&url, route).await;
    }
    gw.stop().await;
}

async fn bad_requests_are_refused(url: &str, route: &str) {
    let url = url.to_string();
    let cases = [
        (json!({"client_id": "c"}), 400, "bad_request"),
        (json!({"topic": "t"}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "page": 1}), 400, "bad_request"),
        (json!({"topic": "a b", "client_id": "c"}), 400, "invalid_name"),
        (json!({"topic": "t", "client_id": "c#d"}), 400, "invalid_name"),
        (json!({"topic": "t", "client_id": "c", "limit": 0}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "limit": 1001}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "limit": -1}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": -1}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": 4294967296u64}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "after": "nope"}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": 0, "offset": 9223372036854775808u64}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": 0, "offset": 18446744073709551615u64}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": 0, "offset": -1}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": 0, "offset": 1.5}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "partition": 0, "offset": "1"}), 400, "bad_request"),
        (json!({"topic": "t", "client_id": "c", "group": "g"}), 400, "bad_request"),
        (json!({"topic": "t", "group": "a b"}), 400, "invalid_name"),
        (json!({"topic": "t", "client_id": "$a b"}), 400, "invalid_name"),
    ];
    for (body, status, code) in cases {
        let (got, answer) = post_json(&url, body.clone()).await;
        assert_eq!((got, answer["error"]["code"].as_str()), (status, Some(code)), "{route} {body}: {answer}");
    }
    let (status, answer) = post_json(&url, json!({"topic": "t", "client_id": "c", "partition": 18446744073709551615u64})).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("bad_request")), "{answer}");
    let counted = if route == "redrive" { "redriven" } else { "deleted" };
    let (status, answer) = post_json(&url, json!({"topic": "t", "client_id": "nobody"})).await;
    assert_eq!((status, answer), (200, json!({ counted: 0 })), "nothing matched is not an error");
    let (status, answer) = post_json(&url, json!({"topic": "t", "client_id": "c", "after": "t#other#0#1"})).await;
    assert_eq!((status, answer), (200, json!({ counted: 0 })), "another client's name is only a position");
    let (status, answer) = post_json(&url, json!({"topic": "t", "client_id": "c", "partition": 0, "offset": 9223372036854775807u64})).await;
    assert_eq!((status, answer), (200, json!({ counted: 0 })), "the largest offset is a valid name of nothing");
}

/// Review of the redrive: an ack with a sequence number not issued yet is `unknown_delivery`,
/// and the id a taken-over session gave the redriven event still settles it in the new session
/// (the dead letter goes; acking the new id as well is a no-op; it never comes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_is_acknowledged_by_its_own_ids_also_across_a_takeover() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    term_events(gw.addr(), "c", "t", 1).await;
    let mut first = TestClient::connect(gw.addr(), "c").await;
    first.subscribe("t", json!({})).await;
    assert_eq!(redrive(&gw.base, "t", "c", json!({})).await.1, json!({"redriven": 1}));
    let old = first.recv_type("event").await;
    assert_eq!(old["redrive"], true);
    let forged = format!("ffffffffffff.{}", id(&old).split_once('.').unwrap().1);
    first.send(json!({"op": "ack", "delivery_id": forged, "req": "f"})).await;
    let answer = first.recv_type("error").await;
    assert_eq!((answer["code"].as_str(), answer["req"].as_str()), (Some("unknown_delivery"), Some("f")), "{answer}");
    assert_eq!(dead_letters_of(&gw.base, "t", "c").await.len(), 1, "a forged id settles nothing");

    let mut second = TestClient::connect(gw.addr(), "c").await;
    assert_eq!(first.close_code().await, 4001);
    second.subscribe("t", json!({})).await;
    let new = second.recv_type("event").await;
    assert_eq!((new["offset"].as_u64(), new["redrive"].as_bool()), (Some(0), Some(true)), "still marked: the new session redrives it");
    let ok = second.ack_confirmed(&[id(&old)], "old").await;
    assert_eq!(ok["type"], "ack_ok", "the taken-over session's id counts: {ok}");
    assert_eq!(dead_letters_of(&gw.base, "t", "c").await, vec![], "acknowledged: the dead letter is gone");
    let ok = second.ack_confirmed(&[id(&new)], "new").await;
    assert_eq!(ok["type"], "ack_ok", "{ok}");
    assert_eq!(dead_letters_of(&gw.base, "t", "c").await, vec![], "and never comes back");
    gw.stop().await;
}

/// Issue 59, item 5: a shared subscription's dead letters (stored under `$NAME`) are listed,
/// redriven and deleted by `group` or by `client_id: "$NAME"`; a redrive reaches the group's
/// members through its hub as `redrive: true` events, and an ack removes each. Before, the routes
/// refused `$` (invalid_name) and took no group. The real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_dead_letters_are_redriven_to_its_members() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "work", 1, 0, 3).await;
    let mut member = TestClient::connect(gw.addr, "member").await;
    member.subscribe("work", json!({"group": "g"})).await;
    for event in member.recv_events(3).await {
        member.send(json!({"op": "term", "delivery_id": id(&event), "reason": "poison"})).await;
    }
    let offsets = async || dead_letters_of(&gw.base, "work", "$g").await.iter().map(|d| d.0).collect::<Vec<_>>();
    wait_for("three dead letters listed as $g", async || offsets().await == [0, 1, 2]).await;
    let url = format!("{}/admin/dead-letters/redrive", gw.base);
    let (status, answer) = post_json(&url, json!({"topic": "work", "group": "g", "partition": 0, "offset": 1})).await;
    assert_eq!((status, answer), (200, json!({"redriven": 1})));
    let again = member.recv_type("event").await;
    assert_eq!((again["offset"].as_u64(), again["redrive"].as_bool()), (Some(1), Some(true)), "{again}");
    let ok = member.ack_confirmed(&[id(&again)], "r").await;
    assert_eq!(ok["type"], "ack_ok", "{ok}");
    let (status, answer) = post_json(&url, json!({"topic": "work", "client_id": "$g", "partition": 0, "offset": 2})).await;
    assert_eq!((status, answer), (200, json!({"redriven": 1})));
    assert_eq!(member.recv_type("event").await["offset"], 2);
    let (status, answer) =
        post_json(&format!("{}/admin/dead-letters/delete", gw.base), json!({"topic": "work", "group": "g", "partition": 0, "offset": 0})).await;
    assert_eq!((status, answer), (200, json!({"deleted": 1})));
    wait_for("the acked redrive and the deleted one gone", async || offsets().await == [2]).await;
    member.close().await;
    gw.kill9();
}
