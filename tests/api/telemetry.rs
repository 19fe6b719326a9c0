//! OpenTelemetry traces (issue 45, item 3): the gateway binary exports over OTLP/HTTP to a
//! receiver of the test's own, and the spans of a publish, its append, the delivery and the ack
//! arrive in one trace with the right parents and attributes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, String>,
    /// The `service.name` of its resource.
    service: String,
}

/// An OTLP/HTTP trace receiver: decodes each POSTed `ExportTraceServiceRequest` and keeps the
/// spans and the paths posted to.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (spans, paths) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (kept, posted) = (spans.clone(), paths.clone());
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let (kept, posted) = (kept.clone(), posted.clone());
                tokio::spawn(async move {
                    let Some((path, body)) = read_request(&mut tcp).await else { return };
                    posted.lock().unwrap().push(path);
                    let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP protobuf export");
                    kept.lock().unwrap().extend(received_spans(request));
                    let _ = tcp.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n").await;
                });
            }
        });
        Self { url, spans, paths }
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of `trace_id` once `n` of them arrived.
    async fn trace(&self, trace_id: &str, n: usize) -> Vec<Received> {
        let mut of_trace = Vec::new();
        wait_for(&format!("{n} spans of trace {trace_id}"), async || {
            of_trace = self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect();
            of_trace.len() >= n
        })
        .await;
        of_trace
    }
}

/// The path and body of one HTTP request (the body by its Content-Length).
async fn read_request(tcp: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = tcp.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
        let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&bytes[..end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.trim().parse().unwrap()))
            .unwrap_or(0);
        if bytes.len() >= end + 4 + length {
            let path = head.split_whitespace().nth(1)?.to_string();
            return Some((path, bytes[end + 4..end + 4 + length].to_vec()));
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn received_spans(request: ExportTraceServiceRequest) -> Vec<Received> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|a| a.key == "service.name")
            .and_then(|a| a.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                AnyValue::StringValue(s) => s.clone(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .filter_map(|a| {
                        let value = match a.value.as_ref()?.value.as_ref()? {
                            AnyValue::StringValue(s) => s.clone(),
                            AnyValue::IntValue(i) => i.to_string(),
                            other => format!("{other:?}"),
                        };
                        Some((a.key.clone(), value))
                    })
                    .collect();
                out.push(Received {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes,
                    service: service.clone(),
                });
            }
        }
    }
    out
}

fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name} span among {spans:#?}"))
}

/// The `traceparent` header of an event frame, if any.
fn traceparent_of(event: &Value) -> Option<String> {
    event["headers"]["traceparent"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_publish_its_append_delivery_and_ack_arrive_as_one_trace_over_otlp() {
    let receiver = Receiver::start().await;
    let (_dir, data) = temp_dir();
    let gateway = Process::start(
        &data,
        &[
            // No path: the gateway posts to /v1/traces.
            ("ACKGATE_TELEMETRY__OTLP_ENDPOINT", receiver.url.as_str()),
            ("ACKGATE_TELEMETRY__SAMPLE_RATIO", "1.0"),
            ("RUST_LOG", "info,ackgate::http::request_log=debug"),
        ],
    );
    let (status, _) = post_json(&format!("{}/topics", gateway.base), json!({"name": "traced", "partitions": 1})).await;
    assert_eq!(status, 200);
    let mut client = TestClient::connect(gateway.addr, "tracer-1").await;
    client.subscribe("traced", json!({})).await;

    // A caller's trace that is not sampled: nothing recorded, nothing written into the event.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let answer = http()
        .post(format!("{}/topics/traced/events", gateway.base))
        .header("traceparent", unsampled)
        .json(&json!({"payload": {"n": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let first = client.recv_type("event").await;
    assert_eq!(traceparent_of(&first), None, "an unsampled trace leaves the event as published: {first}");
    client.send(json!({"op": "ack", "delivery_id": id(&first)})).await;

    // The caller's sampled trace: the publish continues it.
    let (trace_id, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let answer = http()
        .post(format!("{}/topics/traced/events", gateway.base))
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({"payload": {"n": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let offset = answer.json::<Value>().await.unwrap()["offsets"][0]["offset"].as_u64().unwrap();
    let event = client.recv_type("event").await;
    let carried = traceparent_of(&event).expect("the event carries the trace");
    let parts: Vec<&str> = carried.split('-').collect();
    assert_eq!((parts[0], parts[1], parts[3]), ("00", trace_id, "01"), "{carried}");
    assert_ne!(parts[2], caller_span, "the event hangs under the publish span, not the caller's");
    client.send(json!({"op": "ack", "delivery_id": id(&event)})).await;

    let spans = receiver.trace(trace_id, 4).await;
    let publish = named(&spans, "ackgate publish");
    let append = named(&spans, "ackgate append");
    let deliver = named(&spans, "ackgate deliver");
    let ack = named(&spans, "ackgate ack");
    assert_eq!((publish.parent_span_id.as_str(), publish.span_id.as_str(), publish.kind), (caller_span, parts[2], SpanKind::Server as i32));
    assert_eq!(publish.attributes["messaging.destination.name"], "traced");
    assert_eq!(publish.attributes["ackgate.offset"], offset.to_string());
    assert_eq!(publish.service, "ackgate");
    assert_eq!((append.parent_span_id.as_str(), append.kind), (publish.span_id.as_str(), SpanKind::Client as i32));
    assert_eq!(deliver.parent_span_id, publish.span_id, "the delivery continues the event's traceparent");
    assert_eq!(deliver.kind, SpanKind::Producer as i32);
    assert_eq!(deliver.attributes["ackgate.client_id"], "tracer-1");
    assert_eq!(deliver.attributes["ackgate.offset"], offset.to_string());
    assert_eq!(deliver.attributes["ackgate.attempt"], "1");
    assert_eq!(deliver.attributes["messaging.message.id"], id(&event));
    assert_eq!((ack.parent_span_id.as_str(), ack.attributes["ackgate.ack"].as_str(), ack.kind), (deliver.span_id.as_str(), "plain", SpanKind::Consumer as i32));
    assert!(receiver.paths.lock().unwrap().iter().all(|p| p == "/v1/traces"), "posted to {:?}", receiver.paths.lock().unwrap());
    assert!(receiver.spans().iter().all(|s| s.trace_id == trace_id), "only the sampled trace was recorded: {:#?}", receiver.spans());
    // The publish's log line carries the trace id.
    gateway.wait_for_log(&format!("trace_id={trace_id}")).await;

    // A publish frame with no trace starts one here (sample_ratio 1.0), and a confirmed ack says so.
    client.send(json!({"op": "publish", "topic": "traced", "events": [{"payload": {"n": 2}}], "req": "p"})).await;
    let event = client.recv_type("event").await;
    let carried = traceparent_of(&event).expect("a new trace is written into the event");
    let new_trace = carried.split('-').nth(1).unwrap().to_string();
    assert_ne!(new_trace, trace_id);
    let answer = client.ack_confirmed(&[id(&event)], "a").await;
    assert_eq!(answer["type"], "ack_ok", "{answer}");
    let spans = receiver.trace(&new_trace, 4).await;
    assert_eq!(named(&spans, "ackgate publish").parent_span_id, "", "a trace started here has a root publish span");
    assert_eq!(named(&spans, "ackgate ack").attributes["ackgate.ack"], "confirmed");

    // An idempotency key's retry lands in another new trace, and still matches the first
    // attempt: its digest is of the events as sent, not as the trace marked them.
    let frame = |req: &str| json!({"op": "publish", "topic": "traced", "events": [{"payload": {"n": 3}}], "idempotency_key": "k-1", "req": req});
    for (req, replayed) in [("i1", Value::Null), ("i2", json!(true))] {
        client.send(frame(req)).await;
        let answer = loop {
            let frame = client.recv().await;
            if frame["req"] == req {
                break frame;
            }
        };
        assert_eq!((&answer["type"], &answer["replayed"]), (&json!("published"), &replayed), "{answer}");
    }
    client.close().await;
    gateway.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_costs_no_publish_or_delivery() {
    // A port nothing listens on: every export fails, and the gateway goes on and says so.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/traces", silent.local_addr().unwrap());
    drop(silent);
    let (_dir, data) = temp_dir();
    let gateway = Process::start(&data, &[("ACKGATE_TELEMETRY__OTLP_ENDPOINT", url.as_str()), ("ACKGATE_TELEMETRY__SAMPLE_RATIO", "1")]);
    let (status, _) = post_json(&format!("{}/topics", gateway.base), json!({"name": "traced", "partitions": 1})).await;
    assert_eq!(status, 200);
    let mut client = TestClient::connect(gateway.addr, "tracer-2").await;
    client.subscribe("traced", json!({})).await;
    publish(&gateway.base, "traced", json!({"events": [{"payload": 1}, {"payload": 2}]})).await;
    let events = client.recv_events(2).await;
    assert!(events.iter().all(|e| traceparent_of(e).is_some()));
    client.send(json!({"op": "ack", "delivery_ids": ids(&events)})).await;
    gateway.wait_for_log("exporting spans failed").await;
    let answer = client.ack_confirmed(&[id(&events[1])], "again").await;
    assert_eq!(answer["type"], "ack_ok", "{answer}");
    assert_eq!(stored_offset(&gateway.base, "traced", "tracer-2", 0).await.unwrap()["committed"], json!(2));
    client.close().await;
    gateway.signal("TERM");
    let status = gateway.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "the gateway stops though its last spans cannot be exported: {status:?}");
}
