//! `GET /admin/sessions` filtered and in pages (issue 62 item 5: it ignored `?client_id=`, so an
//! operator looking for one client among thousands read them all), on the real binary.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::support::*;

/// The session ids and client ids of one answer, and its `next`.
fn listed(answer: &Value) -> (Vec<String>, BTreeSet<String>, Option<String>) {
    let sessions = answer["sessions"].as_array().unwrap_or_else(|| panic!("{answer}"));
    let ids = sessions.iter().map(|s| s["session_id"].as_str().unwrap().to_string()).collect();
    let clients = sessions.iter().map(|s| s["client_id"].as_str().unwrap().to_string()).collect();
    (ids, clients, answer["next"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_filtered_by_client_topic_and_transport_and_paged() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish(&gw.base, "orders", json!({"payload": 1})).await;
    publish(&gw.base, "audit", json!({"payload": 1})).await;
    let mut clients = Vec::new();
    for (client_id, topic) in [("alice", "orders"), ("bob", "orders"), ("carol", "audit"), ("dave", "audit"), ("erin", "orders")] {
        let mut client = TestClient::connect(gw.addr, client_id).await;
        client.subscribe(topic, json!({})).await;
        clients.push(client);
    }
    let mut sse = TestClient::connect_sse(gw.addr, "frank", "topics=audit", &[]).await;
    sse.recv_type("subscribed").await;
    let list = async |query: &str| get_json(&format!("{}/admin/sessions?{query}", gw.base)).await;

    let (status, answer) = list("client_id=bob").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(listed(&answer).1, BTreeSet::from(["bob".to_string()]));
    let (_, answer) = list("topic=audit").await;
    assert_eq!(listed(&answer).1, BTreeSet::from(["carol".to_string(), "dave".to_string(), "frank".to_string()]));
    let (_, answer) = list("topic=audit&transport=sse").await;
    assert_eq!(listed(&answer).1, BTreeSet::from(["frank".to_string()]));
    let (_, answer) = list("client_id=nobody").await;
    assert_eq!(answer, json!({"sessions": []}));

    // Pages of two, in session id order, each session once.
    let (mut seen, mut after) = (Vec::new(), None::<String>);
    for _ in 0..10 {
        let query = match &after {
            Some(after) => format!("limit=2&after={after}"),
            None => "limit=2".to_string(),
        };
        let (ids, _, next) = listed(&list(&query).await.1);
        assert!(ids.len() <= 2);
        seen.extend(ids);
        after = next;
        if after.is_none() {
            break;
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!((seen.len(), &seen), (6, &sorted), "six sessions, in order, none twice");

    for (query, code) in [
        ("client=alice", "bad_request"),
        ("client_id=a%23b", "invalid_name"),
        ("topic=a%20b", "invalid_name"),
        ("transport=carrier-pigeon", "bad_request"),
        ("limit=0", "bad_request"),
        ("limit=10001", "bad_request"),
        ("limit=-1", "bad_request"),
        ("limit=18446744073709551616", "bad_request"),
        ("after=", "bad_request"),
    ] {
        let (status, answer) = list(query).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (400, Some(code)), "{query}: {answer}");
    }
    drop(sse);
    drop(clients);
    gw.kill9();
}
