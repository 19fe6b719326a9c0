//! Resume tokens the gateway issues (issue 55, docs/protocol.md "Resume tokens"): an old,
//! borrowed or made-up token never skips an event. Each test is one of the black-box
//! tries against the real binary; each failed on main before tokens were issued (the note says
//! how: the subscribe started at the token's offset).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

/// Acks `n` events of partition 0 (confirmed) and returns the `ack_ok` (its `tokens`).
async fn ack_all(client: &mut TestClient, n: usize, req: &str) -> Value {
    let events = client.recv_events(n).await;
    client.ack_confirmed(&ids(&events), req).await
}

/// `DELETE /admin/offsets/{topic}/{client}`, retried while the client still counts as live.
async fn delete_offsets(base: &str, topic: &str, client: &str) {
    for _ in 0..200 {
        match http().delete(format!("{base}/admin/offsets/{topic}/{client}")).send().await.unwrap().status().as_u16() {
            409 => tokio::time::sleep(Duration::from_millis(50)).await,
            200 => return,
            other => panic!("delete answered {other}"),
        }
    }
    panic!("the client stayed live");
}

fn from(subscribed: &Value) -> u64 {
    subscribed["partitions"][0]["from"].as_u64().unwrap_or_else(|| panic!("no from: {subscribed}"))
}

fn refused(subscribed: &Value) -> (&str, &str) {
    (subscribed["resume"].as_str().unwrap_or("-"), subscribed["resume_reason"].as_str().unwrap_or("-"))
}

/// `PUT /admin/offsets/{topic}/{client}/0`, retried while the client still counts as live.
async fn reset_to(base: &str, topic: &str, client: &str, offset: u64) {
    for _ in 0..200 {
        match put_offset(base, topic, client, 0, json!(offset)).await {
            409 => tokio::time::sleep(Duration::from_millis(50)).await,
            200 => return,
            other => panic!("reset answered {other}"),
        }
    }
    panic!("the client stayed live");
}

/// Item 1: a client confirmed acks up to 20 on partition 0; the topic was deleted, created again
/// and 12 new events published. Before: its token (or map) started it at 12, and every new event
/// was skipped without a gap. Now the token names the old incarnation and is refused; the map
/// names an epoch below the new topic's floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_deleted_topic_never_skips_the_recreated_topics_events() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "orders", 1, 0, 20).await;
    let mut client = TestClient::connect(gw.addr, "alice").await;
    let subscribed = client.subscribe("orders", json!({})).await;
    assert!(subscribed["token"].as_str().is_some_and(|t| t.starts_with("r1.")), "subscribed carries a token: {subscribed}");
    let acked = ack_all(&mut client, 20, "a").await;
    assert_eq!(acked["committed"], json!({"orders": {"0": 20}}), "{acked}");
    let token = acked["tokens"]["orders"].as_str().expect("ack_ok carries the topic's token").to_string();
    client.close().await;
    // The SSE id the same client held.
    let mut sse = TestClient::connect_sse(gw.addr, "alice", "topics=orders", &[]).await;
    sse.recv_type("subscribed").await;
    publish(&gw.base, "orders", json!({"partition": 0, "payload": "twentieth"})).await;
    sse.recv_type("event").await;
    let last_event_id = sse.sse().last_event_id.clone().expect("events carry an id");
    sse.close().await;

    wait_for("the topic is deleted", async || http().delete(format!("{}/topics/orders", gw.base)).send().await.unwrap().status() == 200).await;
    publish_numbered(&gw.base, "orders", 1, 0, 12).await;

    let mut client = TestClient::connect(gw.addr, "alice").await;
    let subscribed = client.subscribe("orders", json!({"resume": token})).await;
    assert_eq!(refused(&subscribed), ("refused", "other_incarnation"), "{subscribed}");
    assert_eq!(from(&subscribed), 0, "every new event is delivered: {subscribed}");
    assert_eq!(client.recv_type("event").await["offset"], 0);
    client.close().await;
    assert_eq!(stored_offset(&gw.base, "orders", "alice", 0).await.unwrap()["committed"], 0, "no skip was stored");
    // The older map form, with the epoch the old topic named.
    let mut client = TestClient::connect(gw.addr, "alice").await;
    let subscribed = client.subscribe("orders", json!({"resume": {"0": 20}, "epochs": {"0": 0}})).await;
    assert_eq!(from(&subscribed), 0, "{subscribed}");
    client.close().await;
    // And the browser's Last-Event-ID.
    let mut sse = TestClient::connect_sse(gw.addr, "alice", "topics=orders", &[("last-event-id", &last_event_id)]).await;
    let subscribed = sse.recv_type("subscribed").await;
    assert_eq!((from(&subscribed), refused(&subscribed)), (0, ("refused", "other_incarnation")), "{subscribed}");
    sse.close().await;
    gw.terminate();
}

/// Item 2: an epoch is never the client's to name. After an operator reset to 5, `resume {"0": 20}`
/// with `epochs {"0": 2^62}` started at 20 before, and the next reset stored the client's offset
/// in a log epoch the partition never had. A forged token, a changed one and another client's are
/// refused too, each saying why, and the subscribe goes on from the stored offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_epochs_and_tokens_are_refused_and_start_from_the_stored_offset() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "orders", 1, 0, 30).await;
    let mut client = TestClient::connect(gw.addr, "alice").await;
    client.subscribe("orders", json!({})).await;
    let token = ack_all(&mut client, 20, "a").await["tokens"]["orders"].as_str().unwrap().to_string();
    client.close().await;
    let mut bob = TestClient::connect(gw.addr, "bob").await;
    bob.subscribe("orders", json!({})).await;
    let bobs = ack_all(&mut bob, 25, "b").await["tokens"]["orders"].as_str().unwrap().to_string();
    bob.close().await;
    reset_to(&gw.base, "orders", "alice", 5).await;

    let mut changed = token.clone().into_bytes();
    let at = changed.len() - 5;
    changed[at] = if changed[at] == b'A' { b'B' } else { b'A' };
    let changed = String::from_utf8(changed).unwrap();
    let tries = [
        (json!({"resume": {"0": 20}, "epochs": {"0": 1u64 << 62}}), "invalid"),
        (json!({"resume": "r1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}), "invalid"),
        (json!({"resume": changed}), "invalid"),
        (json!({"resume": "not a token"}), "invalid"),
        (json!({"resume": bobs}), "other_client"),
    ];
    for (resume, reason) in tries {
        let mut client = TestClient::connect(gw.addr, "alice").await;
        let subscribed = client.subscribe("orders", resume.clone()).await;
        assert_eq!((from(&subscribed), refused(&subscribed)), (5, ("refused", reason)), "{resume}: {subscribed}");
        client.close().await;
    }
    // The token from before the reset verifies, and is fenced by it: applied up to what the reset set.
    let mut client = TestClient::connect(gw.addr, "alice").await;
    let subscribed = client.subscribe("orders", json!({"resume": token})).await;
    assert_eq!((from(&subscribed), refused(&subscribed)), (5, ("applied", "-")), "{subscribed}");
    client.close().await;
    // No record was moved into an epoch the gateway never issued: the next reset fences as before.
    let row = stored_offset(&gw.base, "orders", "alice", 0).await.unwrap();
    assert!(row["epoch"].as_u64().unwrap() < 1 << 32, "the record stays in log epoch 0: {row}");
    gw.terminate();
}

/// Item 3: a group's floor moves only through its members' acks and tokens issued to the group.
/// Before: a second member joining with `resume {"0": 25}` moved the floor from 2 to 25 (events
/// 2-24 never processed). Now a map, a client's own token and another group's token are refused,
/// and the group's own token is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_member_never_moves_its_groups_floor_with_a_claim_or_a_token_of_another() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "jobs", 1, 0, 30).await;
    // The client's own subscription, acked to 20: its token is not the group's.
    let mut own = TestClient::connect(gw.addr, "carol").await;
    own.subscribe("jobs", json!({})).await;
    let own_token = ack_all(&mut own, 20, "o").await["tokens"]["jobs"].as_str().unwrap().to_string();
    own.close().await;
    // Another group's token, at 25.
    let mut other = TestClient::connect(gw.addr, "dave").await;
    other.subscribe("jobs", json!({"group": "others"})).await;
    let other_token = ack_all(&mut other, 25, "x").await["tokens"]["jobs"].as_str().unwrap().to_string();
    other.close().await;

    let mut first = TestClient::connect(gw.addr, "m1").await;
    first.subscribe("jobs", json!({"group": "workers"})).await;
    let acked = ack_all(&mut first, 2, "w").await;
    let group_token = acked["tokens"]["jobs"].as_str().expect("a member's ack_ok carries the group's token").to_string();
    let (_, row) = get_json(&format!("{}/admin/groups/jobs/workers", gw.base)).await;
    assert_eq!(row["partitions"][0]["committed"], 2, "{row}");
    for (resume, reason) in [(json!({"0": 25}), "other_group"), (json!(own_token), "other_group"), (json!(other_token), "other_group")] {
        let mut second = TestClient::connect(gw.addr, "m2").await;
        let subscribed = second.subscribe("jobs", json!({"group": "workers", "resume": resume})).await;
        assert_eq!(refused(&subscribed), ("refused", reason), "{subscribed}");
        second.close().await;
    }
    // Nothing moved the floor: the group's stored floor is still 2, and what m1 holds stays its own.
    let (_, row) = get_json(&format!("{}/admin/groups/jobs/workers", gw.base)).await;
    assert_eq!(row["partitions"][0]["committed"], 2, "{row}");
    first.close().await;
    // The group's own token is applied (it names 2, the floor): every event from 2 comes again.
    let mut again = TestClient::connect(gw.addr, "m3").await;
    let subscribed = again.subscribe("jobs", json!({"group": "workers", "resume": group_token})).await;
    assert_eq!(refused(&subscribed), ("applied", "-"), "{subscribed}");
    let mut offsets: Vec<u64> = again.recv_events(28).await.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    offsets.sort();
    assert_eq!(offsets, (2..30).collect::<Vec<_>>(), "the group goes on from its floor");
    again.close().await;
    gw.terminate();
}

/// Item 4: deleting a client's offsets after a reset revived the pre-reset token (it started at 20
/// after a reset to 5). Now the deletion leaves a fence that outlives the record: the old token and
/// the old map count for nothing, and the client starts from the reset policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_clients_offsets_after_a_reset_leaves_a_fence_old_tokens_meet() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "orders", 1, 0, 30).await;
    let mut client = TestClient::connect(gw.addr, "alice").await;
    client.subscribe("orders", json!({})).await;
    let token = ack_all(&mut client, 20, "a").await["tokens"]["orders"].as_str().unwrap().to_string();
    client.close().await;
    reset_to(&gw.base, "orders", "alice", 5).await;
    delete_offsets(&gw.base, "orders", "alice").await;
    assert!(stored_offset(&gw.base, "orders", "alice", 0).await.is_none(), "the record is gone");
    for resume in [json!(token), json!({"0": 20})] {
        let mut client = TestClient::connect(gw.addr, "alice").await;
        let subscribed = client.subscribe("orders", json!({ "resume": resume })).await;
        assert_eq!(from(&subscribed), 0, "{resume}: {subscribed}");
        client.close().await;
        // The subscribe stored a row (at 0); deleted again for the next try.
        delete_offsets(&gw.base, "orders", "alice").await;
    }
    gw.terminate();
}

/// Confirmed acks are not the only way a floor moves: acks without `req` get their tokens in a
/// `progress` frame, at most every `delivery.progress_interval_ms`, and a reconnect with that
/// token resumes exactly there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_acks_get_their_tokens_in_progress_frames() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_DELIVERY__PROGRESS_INTERVAL_MS", "200")]);
    publish_numbered(&gw.base, "feed", 1, 0, 10).await;
    let mut client = TestClient::connect(gw.addr, "erin").await;
    client.subscribe("feed", json!({})).await;
    let events = client.recv_events(10).await;
    client.send(json!({"op": "ack", "delivery_ids": ids(&events[..7])})).await;
    let progress = client.recv_type("progress").await;
    let token = progress["tokens"]["feed"].as_str().expect("progress names the topic's token").to_string();
    client.close().await;
    let mut client = TestClient::connect(gw.addr, "erin").await;
    let subscribed = client.subscribe("feed", json!({"resume": token})).await;
    assert_eq!((from(&subscribed), refused(&subscribed)), (7, ("applied", "-")), "{subscribed}");
    client.close().await;
    // A member's plain acks move its group's floor: the group's token comes to its members.
    let mut member = TestClient::connect(gw.addr, "worker").await;
    member.subscribe("feed", json!({"group": "crew"})).await;
    let events = member.recv_events(10).await;
    member.send(json!({"op": "ack", "delivery_ids": ids(&events[..4])})).await;
    let progress = member.recv_type("progress").await;
    let group_token = progress["tokens"]["feed"].as_str().expect("progress names the group's token").to_string();
    member.close().await;
    let mut again = TestClient::connect(gw.addr, "worker-2").await;
    let subscribed = again.subscribe("feed", json!({"group": "crew", "resume": group_token})).await;
    assert_eq!(refused(&subscribed), ("applied", "-"), "the group's own token: {subscribed}");
    assert_eq!(again.recv_type("event").await["offset"], 4, "the group goes on from the floor its token names");
    again.close().await;
    gw.terminate();
}
