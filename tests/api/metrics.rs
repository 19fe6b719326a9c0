//! `GET /metrics` after a real exchange: every counter moved exactly as the exchange says. Runs
//! the real binary, so no other test's traffic shares its process-wide counters.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// `name{labels}` -> value, from the Prometheus text format.
async fn scrape(base: &str) -> BTreeMap<String, f64> {
    let response = http().get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).filter_map(|l| l.rsplit_once(' ').map(|(k, v)| (k.to_string(), v.parse().unwrap()))).collect()
}

fn value(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("{key} missing from /metrics: {:#?}", m.keys().collect::<Vec<_>>()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_a_real_exchange() {
    let (_dir, data) = temp_dir();
    // Long enough that nothing times out by accident on a loaded machine, short enough to wait
    // for the one timeout the exchange needs.
    let gw = Process::start(&data, &[("ACKGATE_DELIVERY__ACK_TIMEOUT_MS", "1000")]);
    publish_numbered(&gw.base, "m", 1, 0, 3).await;
    let before = scrape(&gw.base).await;
    assert_eq!(value(&before, "ackgate_sessions{transport=\"websocket\"}"), 0.0);

    let mut client = TestClient::connect(gw.addr, "m1").await;
    client.subscribe("m", json!({})).await;
    let first = client.recv_events(3).await;
    client.ack_confirmed(&[id(&first[0])], "a0").await;
    client.send(json!({"op": "nack", "delivery_id": id(&first[1])})).await;
    let nacked = client.recv_type("event").await; // offset 1 again at once
    assert_eq!(nacked["offset"], 1);
    // Acked at once: acked only after offset 2's timeout, it could time out as well on a loaded
    // machine (its own 1 s deadline runs a moment behind offset 2's): one delivery too many.
    client.ack_confirmed(&[id(&nacked)], "a1").await;
    let timed_out = client.recv_type("event").await; // offset 2 after the 1 s ack timeout
    assert_eq!((timed_out["offset"].as_u64(), timed_out["attempt"].as_u64()), (Some(2), Some(2)));
    client.send(json!({"op": "term", "delivery_id": id(&timed_out), "reason": "poison"})).await;
    client.send_text("not json").await;
    assert_eq!(client.recv_type("error").await["code"], "bad_frame");

    // One more event, left unacknowledged when the session ends: the next session gets it again.
    publish(&gw.base, "m", json!({"partition": 0, "payload": {"n": 3}})).await;
    assert_eq!(client.recv_type("event").await["offset"], 3);
    client.close().await;
    let mut again = TestClient::connect(gw.addr, "m1").await;
    again.subscribe("m", json!({})).await;
    let redelivered = again.recv_type("event").await;
    assert_eq!((redelivered["offset"].as_u64(), redelivered["attempt"].as_u64()), (Some(3), Some(2)));
    again.ack_confirmed(&[id(&redelivered)], "a3").await;

    let m = scrape(&gw.base).await;
    assert_eq!(value(&m, "ackgate_sessions{transport=\"websocket\"}"), 1.0);
    assert_eq!(value(&m, "ackgate_in_flight"), 0.0);
    // The first session ended: closed by its client, or taken over by the second if that came
    // first. No other reason, and every reason is exported from the start.
    let ended = |reason: &str| value(&m, &format!("ackgate_sessions_ended_total{{reason=\"{reason}\"}}"));
    assert_eq!(ended("client_left") + ended("taken_over"), 1.0);
    assert_eq!(ackgate::core::metrics::SESSION_ENDS.iter().map(|r| ended(r)).sum::<f64>(), 1.0);
    assert_eq!(value(&m, "ackgate_stalled_sessions"), 0.0);
    assert_eq!(value(&m, "ackgate_backend_up"), 1.0);
    // 3 first deliveries + nack + timeout + offset 3 twice.
    assert_eq!(value(&m, "ackgate_deliveries_total"), 7.0);
    assert_eq!(value(&m, r#"ackgate_redeliveries_total{reason="nack"}"#), 1.0);
    assert_eq!(value(&m, r#"ackgate_redeliveries_total{reason="timeout"}"#), 1.0);
    assert_eq!(value(&m, r#"ackgate_redeliveries_total{reason="disconnect"}"#), 1.0);
    assert_eq!(value(&m, "ackgate_acks_total"), 3.0);
    assert_eq!(value(&m, "ackgate_ack_latency_seconds_count"), 3.0);
    assert!(value(&m, "ackgate_ack_latency_seconds_sum") > 0.0);
    assert_eq!(value(&m, "ackgate_dead_letters_total"), 1.0);
    assert_eq!(value(&m, r#"ackgate_dead_letter_backlog{topic="m"}"#), 1.0, "the termed event waits for an operator");
    assert_eq!(value(&m, "ackgate_pull_events_total"), 4.0);
    assert_eq!(value(&m, r#"ackgate_pull_lag{topic="m",partition="0"}"#), 0.0);
    // The floor moved to 1, 2, 3 (term) and 4; each write advanced it, none was stale.
    assert!(value(&m, r#"ackgate_offset_writes_total{result="advanced"}"#) >= 3.0);
    assert_eq!(value(&m, r#"ackgate_offset_writes_total{result="failed"}"#), 0.0);
    assert_eq!(value(&m, r#"ackgate_broker_acks_total{result="ok"}"#), 4.0);
    assert_eq!(value(&m, r#"ackgate_ws_frames_total{direction="in",kind="subscribe"}"#), 2.0);
    assert_eq!(value(&m, r#"ackgate_ws_frames_total{direction="in",kind="nack"}"#), 1.0);
    assert_eq!(value(&m, r#"ackgate_ws_frames_total{direction="in",kind="invalid"}"#), 1.0);
    assert_eq!(value(&m, r#"ackgate_ws_frames_total{direction="out",kind="event"}"#), 7.0);
    assert_eq!(value(&m, r#"ackgate_ws_frames_total{direction="out",kind="welcome"}"#), 2.0);
    assert_eq!(value(&m, r#"ackgate_ws_frames_total{direction="out",kind="ack_ok"}"#), 3.0);
    assert_eq!(value(&m, r#"ackgate_http_requests_total{route="/topics/{topic}/events",status="200"}"#), 2.0);
    assert_eq!(value(&m, r#"ackgate_http_requests_total{route="/topics",status="200"}"#), 1.0);
    assert!(value(&m, r#"ackgate_http_request_duration_seconds_count{route="/topics/{topic}/events"}"#) >= 2.0);

    // Nothing is exported that core/metrics.rs does not name (and docs/operations.md list).
    for key in m.keys() {
        let family = key.split('{').next().unwrap();
        let family =
            ["_bucket", "_count", "_sum"].iter().find_map(|s| family.strip_suffix(s).filter(|f| ackgate::core::metrics::ALL.contains(f))).unwrap_or(family);
        let named = ackgate::core::metrics::ALL.contains(&family) || ackgate::core::metrics::PROCESS.contains(&family);
        assert!(named, "{key} is not in core::metrics::ALL or PROCESS");
    }
    // And the reverse: every metric core/metrics.rs names is exported, except the other backends'
    // and those created by the first event they count (none of which this exchange makes).
    use ackgate::core::metrics::*;
    let first_counted_event = [
        // Only for clients that lag: nobody does at the end of this exchange (its own test below).
        CLIENT_COMMITTED_LAG,
        KAFKA_HEADERS_DROPPED,
        // Labelled by topic: a series per topic that had a gap.
        GAPS,
        GAP_EVENTS,
        // Only with TLS (tests/api/tls.rs reads it).
        TLS_CERT_EXPIRY,
    ];
    for family in ALL.iter().filter(|f| !f.starts_with("ackgate_rocketmq_") && !first_counted_event.contains(f)) {
        assert!(
            m.keys().any(|k| k.split('{').next().unwrap().trim_end_matches("_count").trim_end_matches("_sum").trim_end_matches("_bucket") == *family),
            "{family} is not exported"
        );
    }
    // The process's own figures (issue 45, item 2), the build, and the first deliveries' time
    // since publish.
    assert!(value(&m, "process_resident_memory_bytes") > 1e6);
    assert!(value(&m, "process_open_fds") >= 3.0 && value(&m, "process_open_fds") <= value(&m, "process_max_fds"));
    assert!(value(&m, "process_start_time_seconds") > 1.7e9);
    assert!(value(&m, "process_cpu_seconds_total") > 0.0);
    assert_eq!(value(&m, &format!("ackgate_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"))), 1.0);
    assert!(value(&m, "ackgate_publish_to_delivery_seconds_count") >= 3.0);

    // Every response carries a request id; a caller's own id is echoed.
    let response = http().get(format!("{}/healthz", gw.base)).header("x-request-id", "trace-42").send().await.unwrap();
    assert_eq!(response.headers()["x-request-id"], "trace-42");
    let response = http().get(format!("{}/topics", gw.base)).send().await.unwrap();
    assert!(!response.headers()["x-request-id"].is_empty());
    // An operator's change is logged at info, with the request id.
    let response =
        http().put(format!("{}/admin/offsets/m/audited/0", gw.base)).header("x-request-id", "trace-43").json(&json!({"offset": 0})).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let line = gw.wait_for_log("trace-43").await;
    assert!(line.contains("request_id"), "HTTP log lines carry the request id: {line}");

    // A deleted topic's pull lag series leaves the output (gauges not set for 5 s are dropped).
    again.close().await;
    let mut deleted = false;
    for _ in 0..100 {
        if http().delete(format!("{}/topics/m", gw.base)).send().await.unwrap().status() == 200 {
            deleted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(deleted, "the topic is deleted once its session has ended");
    let mut gone = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !scrape(&gw.base).await.keys().any(|k| k.starts_with("ackgate_pull_lag{topic=\"m\"")) {
            gone = true;
            break;
        }
    }
    assert!(gone, "the pull lag of a deleted topic stays in /metrics");
    assert!(scrape(&gw.base).await.contains_key("ackgate_sessions{transport=\"sse\"}"), "gauges set at every scrape stay");
}

/// Issue 45 item 2: the clients with the most committed lag get a series of their own (at most
/// ten, so the label set stays bounded), a client that caught up leaves it, and the oldest
/// session's age is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_lagging_clients_and_the_oldest_session_age_are_exported() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "lag", 1, 0, 5).await;
    let mut clients = Vec::new();
    // Twelve clients: client k acknowledges k of the five events (k = 0..=4), the rest none.
    for k in 0..12u64 {
        let mut client = TestClient::connect(gw.addr, &format!("c{k:02}")).await;
        client.subscribe("lag", json!({})).await;
        let events = client.recv_events(5).await;
        let acked = k.min(5) as usize;
        if k < 5 && acked > 0 {
            client.ack_confirmed(&ids(&events[..acked]), "a").await;
        }
        if k == 5 {
            client.ack_confirmed(&ids(&events), "all").await;
        }
        clients.push(client);
    }
    let m = scrape(&gw.base).await;
    let lagging: BTreeMap<&String, f64> = m.iter().filter(|(k, _)| k.starts_with("ackgate_client_committed_lag{")).map(|(k, v)| (k, *v)).collect();
    assert_eq!(lagging.len(), 10, "ten series at most: {lagging:#?}");
    assert_eq!(value(&m, r#"ackgate_client_committed_lag{topic="lag",client_id="c00"}"#), 5.0);
    assert_eq!(value(&m, r#"ackgate_client_committed_lag{topic="lag",client_id="c03"}"#), 2.0);
    assert!(!m.contains_key(r#"ackgate_client_committed_lag{topic="lag",client_id="c05"}"#), "a client that acked everything has no lag series");
    // The topic's sum over all twelve: 5 + 4 + 3 + 2 + 1 + 0 + 6 x 5.
    assert_eq!(value(&m, r#"ackgate_committed_lag{topic="lag"}"#), 45.0);
    assert!(value(&m, "ackgate_oldest_session_age_seconds") >= 0.0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(value(&scrape(&gw.base).await, "ackgate_oldest_session_age_seconds") >= 1.0, "the oldest session is over a second old");
    gw.kill9();
}

/// Issue 62 item 3 (lag counted live sessions only, and `/admin/offsets` listed none): a client
/// that acked 2 of 5 events and left keeps its lag, growing with each publish, in the offsets
/// list (with the log end) and in the metrics (`ackgate_client_committed_lag` names it,
/// `ackgate_committed_lag_max` is the topic's worst); an operator's reset to the end clears it.
/// On the real binary. Failed on the old code: no lag in the rows, no series for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_clients_lag_is_listed_and_exported() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "orders", 1, 0, 5).await;
    for (client_id, acked) in [("away", 2), ("caught-up", 5)] {
        let mut client = TestClient::connect(gw.addr, client_id).await;
        client.subscribe("orders", json!({})).await;
        let events = client.recv_events(5).await;
        client.ack_confirmed(&ids(&events[..acked]), "a").await;
        client.close().await;
    }
    publish_numbered(&gw.base, "orders", 1, 0, 3).await;
    let rows = |page: serde_json::Value| -> BTreeMap<String, (u64, u64, u64)> {
        page["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (r["client_id"].as_str().unwrap().to_string(), (r["committed"].as_u64().unwrap(), r["log_end"].as_u64().unwrap(), r["lag"].as_u64().unwrap()))
            })
            .collect()
    };
    let listed = rows(get_json(&format!("{}/admin/offsets?topic=orders", gw.base)).await.1);
    assert_eq!(listed["away"], (2, 8, 6), "committed, log end, lag: {listed:?}");
    assert_eq!(listed["caught-up"], (5, 8, 3));
    let m = scrape(&gw.base).await;
    assert_eq!(value(&m, r#"ackgate_client_committed_lag{topic="orders",client_id="away"}"#), 6.0);
    assert_eq!(value(&m, r#"ackgate_client_committed_lag{topic="orders",client_id="caught-up"}"#), 3.0);
    assert_eq!(value(&m, r#"ackgate_committed_lag_max{topic="orders"}"#), 6.0);
    for client_id in ["away", "caught-up"] {
        // 409 while its session is still ending.
        wait_for("the reset of an offline client", async || put_offset(&gw.base, "orders", client_id, 0, json!(8)).await == 200).await;
    }
    let m = scrape(&gw.base).await;
    assert_eq!(value(&m, r#"ackgate_committed_lag_max{topic="orders"}"#), 0.0);
    assert_eq!(value(&m, r#"ackgate_client_committed_lag{topic="orders",client_id="away"}"#), 0.0, "caught up: 0 at once (then the series goes)");
    gw.kill9();
}

/// Issue 62 item 2: the figures the new alerts need, on the real binary: the data dir's file
/// system (free at most its size, both above 0) and the peers by state (one that answers
/// nothing is unready after a probe; none is ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dirs_free_bytes_and_the_peers_states_are_exported() {
    let (_dir, data) = temp_dir();
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let peers = serde_json::to_string(&[format!("http://{nobody}")]).unwrap();
    let gw = Process::start(
        &data,
        &[("ACKGATE_CLUSTER__PEERS", peers.as_str()), ("ACKGATE_CLUSTER__TOKEN_KEY", CLUSTER_TOKEN_KEY), ("ACKGATE_CLUSTER__PROBE_INTERVAL_MS", "200")],
    );
    let m = scrape(&gw.base).await;
    let (free, size) = (value(&m, "ackgate_data_dir_free_bytes"), value(&m, "ackgate_data_dir_size_bytes"));
    assert!(free > 0.0 && free <= size, "free {free} of {size}");
    wait_for("the peer counted unready", async || value(&scrape(&gw.base).await, r#"ackgate_peers{state="unready"}"#) == 1.0).await;
    assert_eq!(value(&scrape(&gw.base).await, r#"ackgate_peers{state="ready"}"#), 0.0);
    // Each fsync is timed, by store: a publish waits for the log's, a confirmed ack for the
    // offsets' (power-loss durability is the default). No TLS: no certificate expiry.
    publish(&gw.base, "synced", json!({"payload": 1})).await;
    let mut client = TestClient::connect(gw.addr, "synced").await;
    client.subscribe("synced", json!({})).await;
    let events = client.recv_events(1).await;
    client.ack_confirmed(&ids(&events), "a").await;
    let m = scrape(&gw.base).await;
    assert!(value(&m, r#"ackgate_fsync_seconds_count{store="log"}"#) >= 1.0);
    assert!(value(&m, r#"ackgate_fsync_seconds_count{store="offsets"}"#) >= 1.0);
    assert!(value(&m, r#"ackgate_fsync_seconds_bucket{store="log",le="+Inf"}"#) >= 1.0);
    assert!(!m.keys().any(|k| k.starts_with("ackgate_tls_cert_expiry")), "{:?}", m.keys());
    client.close().await;
    gw.kill9();
}

/// Issue 62 item 4: a client that acks one event every half second behind a full window is slow, not
/// stuck: `ackgate_stalled_sessions` never counts it (it counted at about half of the 500 ms
/// checks, and the alert fired on such a client). When it stops acking, it is counted as stuck
/// after a quarter of the slow-client timeout, well before its 4003.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_acker_is_never_counted_stuck_and_a_stuck_one_is_before_its_close() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_DELIVERY__MAX_IN_FLIGHT", "2"), ("ACKGATE_DELIVERY__SLOW_CLIENT_TIMEOUT_MS", "8000")]);
    publish_numbered(&gw.base, "slow", 1, 0, 40).await;
    let mut client = TestClient::connect(gw.addr, "slow-acker").await;
    client.subscribe("slow", json!({})).await;
    let mut pending = VecDeque::from(client.recv_events(2).await);
    // 40 events: two held, one more per ack below.
    let mut scrapes = 0;
    for _ in 0..12 {
        // A full window for about half a second, then one ack: progress well within the 2 s
        // after which a session counts as stuck, even on a slow machine.
        for _ in 0..5 {
            let m = scrape(&gw.base).await;
            assert_eq!(value(&m, "ackgate_stalled_sessions"), 0.0, "a client acking every half second is counted stuck");
            scrapes += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let event = pending.pop_front().expect("a delivery held");
        client.send(json!({"op": "ack", "delivery_id": id(&event)})).await;
        pending.extend(client.recv_events(1).await);
    }
    assert!(scrapes >= 60);
    // Now it acks nothing: stuck after 2 s (8 s / 4), closed at 8 s.
    let mut seen = false;
    for _ in 0..60 {
        let m = scrape(&gw.base).await;
        if value(&m, "ackgate_stalled_sessions") == 1.0 {
            seen = true;
            break;
        }
        assert_eq!(value(&m, r#"ackgate_sessions_ended_total{reason="slow_client"}"#), 0.0, "closed before it was counted stuck");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "a client that stopped acking is never counted stuck");
    assert_eq!(client.close_code().await, 4003);
    gw.kill9();
}

/// Issue 45 item 1's "sessions closed as slow" and "windows full": a client that stops acking
/// with a full window is counted in `ackgate_stalled_sessions` while it lasts, and its 4003 in
/// `ackgate_sessions_ended_total{reason="slow_client"}`; a client that acks is never stalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_window_and_its_slow_client_close_are_exported() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_DELIVERY__MAX_IN_FLIGHT", "2"), ("ACKGATE_DELIVERY__SLOW_CLIENT_TIMEOUT_MS", "3000")]);
    publish_numbered(&gw.base, "stall", 1, 0, 2).await;
    // Its window was full until it acked: not stalled from its next check on (every 500 ms).
    let acking = consume_and_ack(gw.addr, "acking", "stall", 2).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(value(&scrape(&gw.base).await, "ackgate_stalled_sessions"), 0.0, "a client that acked is stalled");
    let mut stalled = TestClient::connect(gw.addr, "stalled").await;
    stalled.subscribe("stall", json!({})).await;
    stalled.recv_events(2).await;
    let mut seen = false;
    for _ in 0..40 {
        let m = scrape(&gw.base).await;
        if value(&m, "ackgate_stalled_sessions") == 1.0 {
            seen = true;
            break;
        }
        assert_eq!(value(&m, r#"ackgate_sessions_ended_total{reason="slow_client"}"#), 0.0, "closed before it was seen stalled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "a full window with no ack is not counted as stalled");
    assert_eq!(stalled.close_code().await, 4003);
    let mut counted = false;
    for _ in 0..100 {
        let m = scrape(&gw.base).await;
        if value(&m, r#"ackgate_sessions_ended_total{reason="slow_client"}"#) == 1.0 {
            assert_eq!(value(&m, "ackgate_stalled_sessions"), 0.0, "an ended session is not stalled");
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counted, "the 4003 close is not counted");
    drop(acking);
    gw.kill9();
}
