//! The OpenAPI document: served at `/openapi.json`, printed by `ackgate openapi`, identical to
//! `openapi/openapi.json` in the repository, and it describes every route the router serves.

use serde_json::Value;

use crate::support::*;

const REGENERATE: &str = "regenerate it with: scripts/run openapi > openapi/openapi.json";

/// With `auth.admin_token` set the gateway serves the repository's document; without it, the same
/// document without security requirements (docs/protocol.md, `/openapi.json`: it follows the
/// configuration).
#[tokio::test]
async fn the_served_document_follows_the_configuration_and_equals_the_repository_copy() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.admin_token = "admin".into();
    let gw = InProcess::start(config).await;
    let served = http().get(format!("{}/openapi.json", gw.base)).send().await.unwrap().text().await.unwrap();
    let stored = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json")).unwrap_or_default();
    assert!(served == stored, "openapi/openapi.json is not what the gateway serves; {REGENERATE}");
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("openapi").output().unwrap();
    assert!(printed.status.success());
    assert_eq!(String::from_utf8(printed.stdout).unwrap(), served, "`ackgate openapi` prints the served document");
    gw.stop().await;

    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let open: Value = http().get(format!("{}/openapi.json", gw.base)).send().await.unwrap().json().await.unwrap();
    let mut expected: Value = serde_json::from_str(&stored).unwrap();
    for item in expected["paths"].as_object_mut().unwrap().values_mut() {
        for op in item.as_object_mut().unwrap().values_mut() {
            op.as_object_mut().unwrap().remove("security");
        }
    }
    expected["components"].as_object_mut().unwrap().remove("securitySchemes");
    assert_eq!(open, expected, "without auth.admin_token: the same document, no security requirements");
    gw.stop().await;
}

#[test]
fn every_protocol_route_is_documented_with_its_bodies_and_errors() {
    let doc: Value = serde_json::from_str(&ackgate::http::openapi::document()).unwrap();
    let routes = [
        ("post", "/topics/{topic}/events"),
        ("get", "/topics"),
        ("post", "/topics"),
        ("delete", "/topics/{topic}"),
        ("get", "/admin/offsets"),
        ("get", "/admin/offsets/{topic}/{client_id}"),
        ("put", "/admin/offsets/{topic}/{client_id}/{partition}"),
        ("delete", "/admin/offsets/{topic}/{client_id}"),
        ("get", "/admin/sessions"),
        ("get", "/admin/sessions/{session_id}"),
        ("delete", "/admin/sessions/{session_id}"),
        ("get", "/admin/dead-letters"),
        ("get", "/session/recommend"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("get", "/"),
        ("get", "/ws"),
    ];
    for (method, path) in routes {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is documented");
        assert!(op["responses"].as_object().is_some_and(|r| r.keys().any(|k| k == "200" || k == "101")), "{method} {path} has a success answer");
    }
    let schemas = &doc["components"]["schemas"];
    for name in ["ErrorBody", "ClientFrame", "ServerFrame", "PublishRequest", "OffsetRow", "SessionDetail", "TopicList"] {
        assert!(schemas[name].is_object(), "schema {name} present");
    }
    // The documented error codes are exactly the ones the gateway can send.
    let codes: Vec<&str> = ackgate::core::protocol::ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(schemas["ErrorCodeName"]["enum"], serde_json::json!(codes));
    // Errors reference the error body; admin routes declare the bearer token.
    let reset = &doc["paths"]["/admin/offsets/{topic}/{client_id}/{partition}"]["put"];
    assert_eq!(reset["responses"]["409"]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody");
    assert!(reset["security"].to_string().contains("admin_token"));
    // Operation ids are unique, and every link names one of them with parameters it has
    // (schemathesis follows the links in its stateful phase).
    let mut ids = std::collections::BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has an operationId"));
            assert!(ids.insert(id.to_string(), op.clone()).is_none(), "operationId {id} is used twice");
        }
    }
    let mut links = 0;
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for response in op["responses"].as_object().unwrap().values() {
                for (name, link) in response["links"].as_object().into_iter().flatten() {
                    let target = &ids[link["operationId"].as_str().unwrap_or_else(|| panic!("link {name} names an operationId: {link}"))];
                    for parameter in link["parameters"].as_object().unwrap().keys() {
                        assert!(
                            target["parameters"].as_array().unwrap().iter().any(|p| p["name"] == parameter.as_str()),
                            "link {name}: target has no parameter {parameter}"
                        );
                    }
                    links += 1;
                }
            }
        }
    }
    assert!(links >= 6, "the stateful links are documented ({links})");
    // Every client op and server frame type of docs/protocol.md is described.
    let frames = serde_json::to_string(&schemas["ClientFrame"]).unwrap() + &serde_json::to_string(&schemas["ServerFrame"]).unwrap();
    for name in
        ["subscribe", "unsubscribe", "ack", "nack", "extend", "term", "ping", "welcome", "subscribed", "unsubscribed", "event", "ack_ok", "pong", "error"]
    {
        assert!(frames.contains(&format!("\"{name}\"")), "frame {name} described");
    }
}

/// Checks `value` against `schema` as far as shapes go: required properties present, properties
/// of the right JSON kind, recursing into objects and arrays (`$ref`, `allOf`, nullable types).
fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        return conforms(doc, &doc["components"]["schemas"][name], value, at);
    }
    if let Some(parts) = schema["allOf"].as_array() {
        // One object schema with every part's properties and required keys.
        let (mut properties, mut required) = (serde_json::Map::new(), Vec::new());
        for part in parts {
            let part = match part["$ref"].as_str() {
                Some(r) => &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")],
                None => part,
            };
            properties.extend(part["properties"].as_object().cloned().unwrap_or_default());
            required.extend(part["required"].as_array().cloned().unwrap_or_default());
        }
        let merged = serde_json::json!({"type": "object", "properties": properties, "required": required});
        return conforms(doc, &merged, value, at);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        return if options.iter().any(|o| conforms(doc, o, value, at).is_ok()) { Ok(()) } else { Err(format!("{at}: matches no oneOf option: {value}")) };
    }
    let kinds: Vec<&str> = match &schema["type"] {
        Value::String(k) => vec![k.as_str()],
        Value::Array(ks) => ks.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let integer_as_number = kind == "integer" && kinds.contains(&"number");
    if !kinds.contains(&kind) && !integer_as_number {
        return Err(format!("{at}: {kind} where the schema says {kinds:?}"));
    }
    if let Some(required) = schema["required"].as_array() {
        for key in required.iter().filter_map(Value::as_str) {
            if value.get(key).is_none() {
                return Err(format!("{at}: required {key:?} missing in {value}"));
            }
        }
    }
    if let (Some(properties), Some(object)) = (schema["properties"].as_object(), value.as_object()) {
        for (key, child) in object {
            match properties.get(key) {
                Some(s) => conforms(doc, s, child, &format!("{at}.{key}"))?,
                None => return Err(format!("{at}: {key:?} is not documented")),
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            conforms(doc, items, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_have_the_documented_shapes() {
    let doc: Value = serde_json::from_str(&ackgate::http::openapi::document()).unwrap();
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_attempts = 1;
    config.delivery.ack_timeout_ms = 100;
    let gw = InProcess::start(config).await;
    let created = http()
        .post(format!("{}/topics", gw.base))
        .json(&serde_json::json!({"name": "docs", "partitions": 2}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let published = publish(&gw.base, "docs", serde_json::json!({"events": [{"partition": 0, "payload": 1}, {"partition": 0, "payload": 2}]})).await;
    let mut client = TestClient::connect(gw.addr(), "doc-reader").await;
    client.subscribe("docs", serde_json::json!({})).await;
    let events = client.recv_events(2).await;
    client.ack_confirmed(&[id(&events[0])], "one").await; // the other times out into a dead letter
    let sessions = get_json(&format!("{}/admin/sessions", gw.base)).await.1;
    let session_id = sessions["sessions"][0]["session_id"].as_str().unwrap().to_string();
    let mut checks = vec![
        ("post", "/topics", created),
        ("post", "/topics/{topic}/events", published),
        ("get", "/admin/sessions", sessions),
        ("get", "/admin/sessions/{session_id}", get_json(&format!("{}/admin/sessions/{session_id}", gw.base)).await.1),
        ("get", "/topics", get_json(&format!("{}/topics", gw.base)).await.1),
        ("get", "/admin/offsets", get_json(&format!("{}/admin/offsets?topic=docs", gw.base)).await.1),
        ("get", "/admin/offsets/{topic}/{client_id}", get_json(&format!("{}/admin/offsets/docs/doc-reader", gw.base)).await.1),
        ("get", "/session/recommend", get_json(&format!("{}/session/recommend?client_id=x", gw.base)).await.1),
        ("get", "/healthz", get_json(&format!("{}/healthz", gw.base)).await.1),
        ("get", "/readyz", get_json(&format!("{}/readyz", gw.base)).await.1),
    ];
    let mut dead = Value::Null;
    for _ in 0..50 {
        dead = get_json(&format!("{}/admin/dead-letters?topic=docs", gw.base)).await.1;
        if dead["dead_letters"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    checks.push(("get", "/admin/dead-letters", dead));
    client.close().await;
    for (method, path, answer) in checks {
        let schema = &doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {path} documents a JSON 200 body");
        if let Err(e) = conforms(&doc, schema, &answer, &format!("{method} {path}")) {
            panic!("{e}");
        }
    }
    let not_found = get_json(&format!("{}/admin/sessions/nope", gw.base)).await.1;
    conforms(&doc, &serde_json::json!({"$ref": "#/components/schemas/ErrorBody"}), &not_found, "error body").unwrap();
    gw.stop().await;
}
