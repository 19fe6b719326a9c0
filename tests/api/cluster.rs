//! `GET /session/recommend`: instances agree on where each client goes, spread clients over the
//! healthy ones, and stop sending clients to an instance that is gone.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// Instance `gw-{i}` of a cluster of `urls`, on `port`, probing its peers every 100 ms.
fn peer_config(data: &std::path::Path, i: usize, port: u16, urls: &[String]) -> ackgate::config::Config {
    let mut config = test_config(data);
    config.server.listen = format!("127.0.0.1:{port}");
    config.server.instance_id = format!("gw-{i}");
    config.cluster.peers = urls.to_vec();
    config.cluster.token_key = CLUSTER_TOKEN_KEY.into();
    config.cluster.probe_interval_ms = 100;
    config
}

/// Two instances of a cluster of three URLs (the third never runs), each configured by `adjust`.
async fn two_of_three(adjust: impl Fn(&mut ackgate::config::Config)) -> (Vec<String>, Vec<InProcess>, Vec<tempfile::TempDir>) {
    let ports = [free_port(), free_port(), free_port()];
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut gateways = Vec::new();
    let mut dirs = Vec::new();
    for (i, port) in ports[..2].iter().enumerate() {
        let (dir, data) = temp_dir();
        let mut config = peer_config(&data, i, *port, &urls);
        adjust(&mut config);
        gateways.push(InProcess::start(config).await);
        dirs.push(dir);
    }
    (urls, gateways, dirs)
}

async fn recommendations(base: &str, clients: usize) -> BTreeMap<String, String> {
    let mut chosen = BTreeMap::new();
    for c in 0..clients {
        let (status, body) = get_json(&format!("{base}/session/recommend?client_id=client-{c}")).await;
        assert_eq!(status, 200, "{body}");
        let instance = body["instance"].as_str().unwrap().to_string();
        let http_url = body["http_url"].as_str().unwrap();
        assert_eq!(body["ws_url"], format!("{}/ws", http_url.replace("http://", "ws://")));
        chosen.insert(format!("client-{c}"), instance);
    }
    chosen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_agree_spread_clients_and_skip_a_dead_peer() {
    let (_urls, mut gateways, _dirs) = two_of_three(|_| {}).await;
    let mut agreed = None;
    for _ in 0..100 {
        let a = recommendations(&gateways[0].base, 40).await;
        let b = recommendations(&gateways[1].base, 40).await;
        if a == b && a.values().any(|i| i == "gw-0") && a.values().any(|i| i == "gw-1") {
            agreed = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let agreed = agreed.expect("both instances give the same answers, spread over both");
    assert!(agreed.values().all(|i| i == "gw-0" || i == "gw-1"), "the dead peer is never recommended: {agreed:?}");

    let (status, body): (u16, Value) = get_json(&format!("{}/session/recommend?client_id=bad%20id", gateways[0].base)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_name")));

    // gw-1 stops: gw-0 soon sends everyone to itself, and only gw-1's clients moved.
    let second = gateways.pop().unwrap();
    second.stop().await;
    let mut alone = None;
    for _ in 0..100 {
        let now = recommendations(&gateways[0].base, 40).await;
        if now.values().all(|i| i == "gw-0") {
            alone = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(alone.is_some(), "a stopped peer is no longer recommended");
    gateways.pop().unwrap().stop().await;
}

/// Issue 21, item 10: peers probed `/healthz`, which answers 200 while an instance's offset store
/// fails (or while it shuts down), so clients were still sent to it. Peers probe `/readyz` now.
/// Failed before the fix: gw-0 kept recommending the not-ready gw-1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_not_ready_gets_no_clients() {
    use ackgate::core::clock::SystemClock;
    use std::sync::Arc;

    let ports = [free_port(), free_port()];
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let mut gateways = Vec::new();
    let mut dirs = Vec::new();
    let mut stores = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let (dir, data) = temp_dir();
        let config = peer_config(&data, i, *port, &urls);
        let store = crate::controlled_store::ControlledStore::open(&data);
        let gateway = ackgate::Gateway::build_with_store(config, Arc::new(SystemClock), Some(store.clone())).await.unwrap();
        gateways.push(InProcess::from_gateway(gateway));
        dirs.push(dir);
        stores.push(store);
    }
    let mut spread = false;
    for _ in 0..100 {
        let chosen = recommendations(&gateways[0].base, 40).await;
        if chosen.values().any(|i| i == "gw-1") {
            spread = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(spread, "gw-1 gets clients while it is ready");
    // gw-1's store stops answering: alive (/healthz 200) but not ready.
    stores[1].fail_reads(true);
    let (live, _) = get_json(&format!("{}/healthz", gateways[1].base)).await;
    let (ready, _) = get_json(&format!("{}/readyz", gateways[1].base)).await;
    assert_eq!((live, ready), (200, 503));
    let mut moved = false;
    for _ in 0..100 {
        if recommendations(&gateways[0].base, 40).await.values().all(|i| i == "gw-0") {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "a peer that is not ready is never recommended");
    stores[1].fail_reads(false);
    for gateway in gateways {
        gateway.stop().await;
    }
}

/// `?scope=cluster` on the admin list routes (issue 45, item 5): one question answers for every
/// instance, rows named by instance, the peers asked with the admin token; a peer that is gone is
/// named in `unreachable`, and a bad scope is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_lists_answer_for_the_whole_cluster_with_scope_cluster() {
    const TOKEN: &str = "admin-secret";
    let (urls, mut gateways, _dirs) = two_of_three(|config| config.auth.admin_token = TOKEN.into()).await;
    let admin_get = |url: String| async move {
        let response = http().get(url).bearer_auth(TOKEN).send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
    };
    // A client on each instance, each with an offset stored there.
    let mut clients = Vec::new();
    for (i, gw) in gateways.iter().enumerate() {
        let publish = http()
            .post(format!("{}/topics/t/events", gw.base))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({"partition": 0, "payload": i}))
            .send()
            .await
            .unwrap();
        assert_eq!(publish.status(), 200);
        let mut client = TestClient::connect(gw.addr(), &format!("c{i}")).await;
        client.subscribe("t", serde_json::json!({})).await;
        let event = client.recv_type("event").await;
        client.ack_confirmed(&[id(&event)], "a").await;
        clients.push(client);
    }
    let (status, local) = admin_get(format!("{}/admin/sessions", gateways[0].base)).await;
    assert_eq!((status, local["sessions"].as_array().map(Vec::len)), (200, Some(1)), "without scope: this instance only: {local}");
    let (status, all) = admin_get(format!("{}/admin/sessions?scope=cluster", gateways[0].base)).await;
    assert_eq!(status, 200, "{all}");
    let mut seen: Vec<(String, String)> = all["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["client_id"].as_str().unwrap().to_string(), s["instance"].as_str().unwrap().to_string()))
        .collect();
    seen.sort();
    assert_eq!(seen, [("c0".to_string(), "gw-0".to_string()), ("c1".to_string(), "gw-1".to_string())], "{all}");
    assert_eq!(all["unreachable"], serde_json::json!([urls[2]]), "the peer that never ran: {all}");
    // Filters and pages go to every instance: each instance's page, its `next` by instance.
    let (status, offsets) = admin_get(format!("{}/admin/offsets?topic=t&scope=cluster&limit=1", gateways[1].base)).await;
    assert_eq!(status, 200, "{offsets}");
    let rows = offsets["offsets"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "one row of each instance: {offsets}");
    assert!(rows.iter().any(|r| r["client_id"] == "c0" && r["instance"] == "gw-0" && r["committed"] == 1), "{offsets}");
    assert!(offsets.get("next").is_none(), "{offsets}");
    // A client's records changed on every instance: a reset of a client no instance serves
    // lands on both; one live on the peer is refused there (409), named in `peers`.
    let admin_send = |method: reqwest::Method, url: String, body: Value| async move {
        let response = http().request(method, url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
    };
    let reset = format!("{}/admin/offsets/t/ghost/0?scope=cluster", gateways[0].base);
    let (status, answer) = admin_send(reqwest::Method::PUT, reset, serde_json::json!({"offset": 1})).await;
    assert_eq!((status, &answer["committed"], &answer["peers"][0]["status"]), (200, &serde_json::json!(1), &serde_json::json!(200)), "{answer}");
    assert_eq!(answer["unreachable"], serde_json::json!([urls[2]]), "{answer}");
    let (_, ghosts) = admin_get(format!("{}/admin/offsets?client_id=ghost&scope=cluster", gateways[1].base)).await;
    let mut holders: Vec<&str> = ghosts["offsets"].as_array().unwrap().iter().filter_map(|r| r["instance"].as_str()).collect();
    holders.sort();
    assert_eq!(holders, ["gw-0", "gw-1"], "{ghosts}");
    let live_there = format!("{}/admin/offsets/t/c1/0?scope=cluster", gateways[0].base);
    let (status, answer) = admin_send(reqwest::Method::PUT, live_there, serde_json::json!({"offset": 0})).await;
    assert_eq!((status, &answer["peers"][0]["status"]), (200, &serde_json::json!(409)), "c1 is live on gw-1: {answer}");
    let forget = format!("{}/admin/offsets/t/ghost?scope=cluster", gateways[1].base);
    let (status, answer) = admin_send(reqwest::Method::DELETE, forget, Value::Null).await;
    assert_eq!((status, &answer["peers"][0]["status"]), (200, &serde_json::json!(200)), "{answer}");
    let (_, ghosts) = admin_get(format!("{}/admin/offsets?client_id=ghost&scope=cluster", gateways[0].base)).await;
    assert_eq!(ghosts["offsets"], serde_json::json!([]), "{ghosts}");

    // A redrive reaches the instance that recorded the dead letters: c1 gives up on an event on
    // gw-1, and the operator asks gw-0, which holds none of them.
    let publish = http()
        .post(format!("{}/topics/t/events", gateways[1].base))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"partition": 0, "payload": "bad"}))
        .send()
        .await
        .unwrap();
    assert_eq!(publish.status(), 200);
    let event = clients[1].recv_type("event").await;
    clients[1].send(serde_json::json!({"op": "term", "delivery_id": id(&event), "reason": "bad"})).await;
    wait_for("c1's dead letter on gw-1", async || {
        let (_, letters) = admin_get(format!("{}/admin/dead-letters?client_id=c1", gateways[1].base)).await;
        letters["dead_letters"].as_array().is_some_and(|l| l.len() == 1)
    })
    .await;
    let redrive = format!("{}/admin/dead-letters/redrive?scope=cluster", gateways[0].base);
    let (status, answer) = admin_send(reqwest::Method::POST, redrive, serde_json::json!({"topic": "t", "client_id": "c1"})).await;
    assert_eq!((status, &answer["redriven"]), (200, &serde_json::json!(0)), "gw-0 recorded none: {answer}");
    assert_eq!((&answer["peers"][0]["status"], &answer["peers"][0]["answer"]["redriven"]), (&serde_json::json!(200), &serde_json::json!(1)), "{answer}");
    let again = clients[1].recv_type("event").await;
    assert_eq!((&again["redrive"], &again["offset"]), (&serde_json::json!(true), &event["offset"]), "{again}");

    // A bad scope, and the admin token still required.
    let (status, body) = admin_get(format!("{}/admin/gaps?scope=everywhere", gateways[0].base)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{body}");
    let anonymous = http().get(format!("{}/admin/sessions?scope=cluster", gateways[0].base)).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    // A peer that stops: named in `unreachable`, its rows gone.
    let stopped = gateways.pop().unwrap();
    drop(clients);
    stopped.stop().await;
    let (status, all) = admin_get(format!("{}/admin/sessions?scope=cluster", gateways[0].base)).await;
    assert_eq!(status, 200, "{all}");
    let unreachable: Vec<&str> = all["unreachable"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(unreachable.contains(&urls[1].as_str()) && unreachable.contains(&urls[2].as_str()), "{all}");
}
