//! Topics: publish (`POST /topics/{topic}/events`), list, create and delete.

use std::collections::{BTreeMap, HashMap};

use axum::body::{to_bytes, Body};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::error::ApiError;
use super::{AppState, JsonBody};
use crate::core::backend::NewEvent;
use crate::core::idempotency::{IdempotencyKey, IdempotentPublishError, PublishOutcome};
use crate::core::names::{TopicName, TopicPartition};
use crate::core::offsets::{StoreError, TopicRemoval};
use crate::core::protocol::ErrorCode;
use crate::core::published_event::{to_new_event, EventBounds, PublishedEvent};
use crate::core::topic_removal;
use crate::core::trace::{PublishTrace, TraceParent, TRACEPARENT};

/// Lite topics per page of `GET /topics?parent=` unless `limit` says otherwise, and the most.
const LITE_PAGE: usize = 100;
const LITE_PAGE_MAX: usize = 1000;

fn parse_topic(topic: &str) -> Result<TopicName, ApiError> {
    TopicName::parse(topic).map_err(|e| ApiError::invalid_name(e.0))
}

fn too_large(message: String) -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::LimitExceeded, message)
}

#[utoipa::path(
    post,
    path = "/topics/{topic}/events",
    operation_id = "publish_events",
    tag = "topics",
    summary = "Publish one event or a batch",
    params(
        ("topic" = String, Path, description = "topic name (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("traceparent" = Option<String>, Header, description = "W3C Trace Context: with telemetry.otlp_endpoint set, a sampled one is continued by the publish's spans, and each event without a traceparent header gets the publish span's; a malformed one is ignored (the first event's traceparent, else a new trace)"),
        ("Idempotency-Key" = Option<String>, Header, description = "makes a retry within publish.idempotency_window_secs answer the first request's offsets without writing again", pattern = r"^[!-~]{1,128}$", min_length = 1, max_length = 128),
    ),
    request_body = crate::http::schemas::PublishRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "offsets written, in the order sent", body = crate::http::schemas::PublishAnswer),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic (Kafka, RocketMQ; the embedded log creates it unless embedded.auto_create_topics says otherwise), or not_found: a partition the topic does not have", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: the Idempotency-Key was used with another body within the window, or a request with it is still running", body = crate::http::schemas::ErrorBody),
        (status = 413, description = "limit_exceeded: too many events or too large a body", body = crate::http::schemas::ErrorBody),
        (status = 429, description = "limit_exceeded: publish.idempotency_max_keys keys are remembered, or creating the topic would pass limits.max_topics", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: backend down", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn publish(
    State(app): State<AppState>,
    Path(topic): Path<String>,
    publisher: Option<axum::Extension<super::auth::PublisherSub>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let topic = parse_topic(&topic)?;
    let key = match headers.get(IDEMPOTENCY_KEY) {
        Some(raw) => Some(IdempotencyKey::parse(raw.as_bytes()).map_err(ApiError::bad_request)?.scoped(publisher.as_ref().map(|p| p.0 .0.as_str()))),
        None => None,
    };
    let limits = &app.config.limits;
    let bytes = to_bytes(body, limits.max_body_bytes)
        .await
        .map_err(|_| too_large(format!("request body is over {} bytes (limits.max_body_bytes)", limits.max_body_bytes)))?;
    let bounds =
        EventBounds { max_batch_events: limits.max_batch_events, max_key_bytes: limits.max_key_bytes, max_header_name_bytes: limits.max_header_name_bytes };
    let mut events = parse_publish_body(&bytes, &bounds)?;
    // The request's `traceparent` (or its first event's) is the trace this publish continues.
    let mut trace = app.dispatcher.tracer.get().and_then(|t| {
        let parent = headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()).and_then(TraceParent::parse);
        PublishTrace::start(t, parent.or_else(|| events.first().and_then(|e| TraceParent::of_headers(&e.headers))))
    });
    if let Some(trace) = trace.as_mut() {
        // The idempotency digest is of the request's bytes: marking the events changes nothing.
        trace.mark(&mut events);
        tracing::Span::current().record("trace_id", tracing::field::display(trace.traceparent().trace_id_hex()));
    }
    let written = write_events(&app, &topic, key, &bytes, events, publisher.as_ref().map(|p| p.0 .0.as_str()), trace.as_mut()).await;
    if let Some(trace) = trace {
        trace.finish(topic.as_str(), written.as_ref().ok().map(|(offsets, replayed)| (offsets.as_slice(), *replayed)));
    }
    let (offsets, replayed) = written?;
    let offsets: Vec<Value> = offsets.into_iter().map(|(partition, offset)| json!({"partition": partition, "offset": offset})).collect();
    let mut response = Json(json!({ "offsets": offsets })).into_response();
    if replayed {
        // Not in the contract's body (a retry must read exactly like the first answer): a hint
        // for whoever debugs a publisher.
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// The events written, or for an idempotency key's retry the first write's offsets (`true`).
async fn write_events(
    app: &AppState,
    topic: &TopicName,
    key: Option<IdempotencyKey>,
    bytes: &[u8],
    events: Vec<NewEvent>,
    publisher: Option<&str>,
    trace: Option<&mut PublishTrace>,
) -> Result<(Vec<(u32, u64)>, bool), ApiError> {
    let backend = app.dispatcher.backend.as_ref();
    let may_create = !must_exist_before_publish(&app.config, publisher.is_some());
    if !may_create && backend.partitions(topic).await?.is_none() {
        let message = format!("topic {topic} does not exist (embedded.auto_create_topics: create it with POST /topics and the admin token)");
        return Err(ApiError::new(StatusCode::NOT_FOUND, ErrorCode::UnknownTopic, message));
    }
    if let Some(trace) = trace {
        trace.appending();
    }
    Ok(match key {
        None if may_create => (backend.publish(topic, events).await?, false),
        // Checked again by the log itself: a DELETE between the check above and the write must
        // not let this publisher create the topic anew.
        None => (backend.publish_existing(topic, events).await?, false),
        Some(key) => match app.publisher.publish(app.dispatcher.backend.clone(), topic, publisher, key, bytes, events, may_create).await {
            Ok(PublishOutcome::Written(offsets)) => (offsets, false),
            Ok(PublishOutcome::Replayed(offsets)) => {
                app.dispatcher.metrics.publish_replays.increment(1);
                (offsets, true)
            }
            Err(IdempotentPublishError::Conflict(m)) => return Err(ApiError::conflict(m)),
            Err(IdempotentPublishError::TooManyKeys(m)) => return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::LimitExceeded, m)),
            Err(IdempotentPublishError::Backend(e)) => return Err(e.into()),
            Err(IdempotentPublishError::Store(e)) => return Err(e.into()),
        },
    })
}

/// Whether a publish must find its topic there already, on the embedded log, which creates a
/// missing one otherwise (`embedded.auto_create_topics`): creating topics is the admin token's
/// right, so by default a JWT `publish` claim does not (issue 40, item 4). Kafka and RocketMQ
/// never create one on publish.
pub(crate) fn must_exist_before_publish(config: &crate::config::Config, by_jwt: bool) -> bool {
    use crate::config::{AutoCreateTopics, BackendKind};
    config.storage.backend == BackendKind::Embedded
        && match config.embedded.auto_create_topics {
            AutoCreateTopics::Always => false,
            AutoCreateTopics::Auto => by_jwt,
            AutoCreateTopics::Never => true,
        }
}

/// The request header that makes a publish idempotent.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

fn parse_publish_body(bytes: &[u8], bounds: &EventBounds) -> Result<Vec<NewEvent>, ApiError> {
    let max_events = bounds.max_batch_events;
    // The top level is read as raw fields first, so `{"events": [...]}` and a single event can
    // be told apart without parsing payloads.
    let top: BTreeMap<String, &RawValue> = serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("body is not a JSON object: {e}")))?;
    let raw_events: Vec<PublishedEvent> = match top.get("events") {
        Some(_) if top.len() > 1 => return Err(ApiError::bad_request("a batch body holds only \"events\"")),
        Some(events) => serde_json::from_str(events.get()).map_err(|e| ApiError::bad_request(format!("\"events\" is not a list of events: {e}")))?,
        None => vec![serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("body is not an event: {e}")))?],
    };
    if raw_events.is_empty() {
        return Err(ApiError::bad_request("\"events\" is empty"));
    }
    if raw_events.len() > max_events {
        return Err(too_large(format!("{} events in one request; at most {max_events} (limits.max_batch_events)", raw_events.len())));
    }
    raw_events.into_iter().enumerate().map(|(i, e)| to_new_event(e, bounds).map_err(|m| ApiError::bad_request(format!("event {i}: {m}")))).collect()
}

#[utoipa::path(
    get,
    path = "/topics",
    operation_id = "list_topics",
    tag = "topics",
    summary = "List topics with per-partition bounds and pull offsets",
    params(
        ("parent" = Option<String>, Query, description = "RocketMQ: list the lite topics (`parent@lite`) of this parent instead, paged by `limit` and `after`", pattern = r"^[A-Za-z0-9._-]{1,249}$"),
        ("limit" = Option<u32>, Query, description = "topics per page, 1 to 1000 (default 100 once `limit` or `after` is given; without either, every topic)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "the `next` of the previous page (a topic name)"),
    ),
    responses(
        (status = 200, body = crate::http::schemas::TopicList),
        (status = 400, description = "bad_request: an unknown parameter or a bad limit", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic: no lite parent of that name (not RocketMQ, not in rocketmq.lite_parents, or the parent does not exist)", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "parent" | "limit" | "after")) {
        return Err(ApiError::bad_request(format!("unknown parameter {unknown:?}; use parent, limit or after")));
    }
    let backend = &app.dispatcher.backend;
    let after = query.get("after");
    let (listed, next) = match query.get("parent") {
        None if !query.contains_key("limit") && after.is_none() => (backend.topics().await?, None),
        None => {
            let limit = super::page_limit(&query, LITE_PAGE, LITE_PAGE_MAX)?;
            page_by_name(backend.topics().await?, |(t, _)| t, after, limit)
        }
        Some(parent) => {
            let parent = TopicName::parse(parent)
                .ok()
                .filter(|p| p.lite().is_none())
                .ok_or_else(|| ApiError::invalid_name(format!("parent {parent:?} is not a topic name")))?;
            let limit = super::page_limit(&query, LITE_PAGE, LITE_PAGE_MAX)?;
            let (page, next) = page_by_name(backend.lite_topics(&parent).await?, |t| t, after, limit);
            let mut listed = Vec::with_capacity(page.len());
            for topic in page {
                let count = backend.partitions(&topic).await?.unwrap_or(0);
                listed.push((topic, count));
            }
            (listed, next)
        }
    };
    let mut topics = Vec::new();
    for (topic, count) in listed {
        let mut partitions = Vec::with_capacity(count as usize);
        for partition in 0..count {
            let tp = TopicPartition::new(topic.clone(), partition);
            let bounds = app.listed_bounds.bounds(backend.as_ref(), &tp).await?;
            partitions.push(json!({
                "partition": partition,
                "log_start": bounds.log_start,
                "log_end": bounds.log_end,
                "pull_offset": backend.pull_offset(&tp),
            }));
        }
        topics.push(json!({"name": topic.as_str(), "partitions": partitions}));
    }
    let mut body = json!({ "topics": topics });
    if let Some(next) = next {
        body["next"] = json!(next);
    }
    Ok(Json(body))
}

/// One page of `items` by name: those named after `after`, at most `limit`, and the `after` of
/// the next page when there is one.
fn page_by_name<T>(mut items: Vec<T>, name: impl Fn(&T) -> &TopicName, after: Option<&String>, limit: usize) -> (Vec<T>, Option<String>) {
    items.sort_by(|a, b| name(a).cmp(name(b)));
    let mut page: Vec<T> = items.into_iter().filter(|t| after.is_none_or(|a| name(t).as_str() > a.as_str())).take(limit + 1).collect();
    let next = (page.len() > limit).then(|| {
        page.truncate(limit);
        name(&page[limit - 1]).to_string()
    });
    (page, next)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    name: String,
    #[serde(deserialize_with = "crate::core::whole_number::whole")]
    partitions: u32,
}

#[utoipa::path(
    post,
    path = "/topics",
    operation_id = "create_topic",
    tag = "topics",
    summary = "Create a topic",
    request_body = crate::http::schemas::CreateTopic,
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::TopicCreated, links(
            ("DeleteTopic" = (operation_id = "delete_topic", parameters(("topic" = "$response.body#/name")))),
        )),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: exists with another partition count", body = crate::http::schemas::ErrorBody),
        (status = 413, description = "limit_exceeded: body over limits.max_body_bytes", body = crate::http::schemas::ErrorBody),
        (status = 429, description = "limit_exceeded: the embedded log holds limits.max_topics topics", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, JsonBody(body): JsonBody<CreateTopic>) -> Result<Json<Value>, ApiError> {
    let topic = parse_topic(&body.name)?;
    let created = app.dispatcher.backend.create_topic(&topic, body.partitions).await?;
    Ok(Json(json!({"name": topic.as_str(), "partitions": body.partitions, "created": created})))
}

#[utoipa::path(
    delete,
    path = "/topics/{topic}",
    operation_id = "delete_topic",
    tag = "topics",
    summary = "Delete a topic and every client's offsets on it",
    params(("topic" = String, Path, description = "topic name (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499)),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::TopicDeleted),
        (status = 400, description = "invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: a session subscribes to it", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn delete(State(app): State<AppState>, Path(topic): Path<String>) -> Result<Json<Value>, ApiError> {
    let topic = parse_topic(&topic)?;
    let d = &app.dispatcher;
    // Nobody may subscribe until the deletion is over (the claim is released when it drops).
    let deletion = d
        .claim_topic_for_deletion(&topic)
        .ok_or_else(|| ApiError::conflict(format!("a live session subscribes to {topic} (or it is being deleted); unsubscribe it first")))?;
    let missing = || ApiError::new(StatusCode::NOT_FOUND, ErrorCode::UnknownTopic, format!("topic {topic} does not exist"));
    // A deletion whose removal was cut short (a store error) after its log was deleted: the
    // retry finishes it first, whatever the log holds under the name now.
    let pending = d.store.pending_topic_removals().into_iter().find_map(|(t, step)| (t == topic).then_some(step));
    let exists = d.backend.partitions(&topic).await?.is_some();
    match (pending, exists) {
        (Some(TopicRemoval::LogDeleted), _) | (Some(TopicRemoval::Begun), false) => {
            deletion.forget();
            let finished = finish_removal(d, &topic).await?;
            if !exists {
                return Ok(finished);
            }
        }
        (None, false) => return Err(missing()),
        _ => {}
    }
    // Marked first: a removal cut short after the log is gone is finished by a retry or at start
    // (`core::topic_removal`). The log goes next (issue 21): should the backend refuse (a Kafka
    // cluster with delete.topic.enable=false, a broker away), the topic stays and so must every
    // client's offsets; deleting them first made `latest` skip the unacknowledged backlog.
    let store = d.store.clone();
    let marking = topic.clone();
    tokio::task::spawn_blocking(move || store.begin_topic_removal(&marking)).await.map_err(|e| StoreError::Io(format!("marking the removal: {e}")))??;
    let deleted = d.backend.delete_topic(&topic).await;
    if !matches!(deleted, Ok(true)) {
        // An error may come after the log deleted the topic (a timeout): ask the log again.
        match d.backend.partitions(&topic).await {
            Ok(None) => {
                tracing::warn!(%topic, answer = %match &deleted { Ok(_) => "no topic".to_string(), Err(e) => e.to_string() }, "the log answered the deletion with an error but no longer has the topic: finishing its removal")
            }
            Ok(Some(_)) => {
                if let Err(e) = d.store.cancel_topic_removal(&topic) {
                    tracing::warn!(%topic, error = %e, "the log kept the topic, but its pending removal could not be cleared (the next start clears it)");
                }
                return Err(deleted.err().map_or_else(missing, ApiError::from));
            }
            Err(e) => {
                // Nobody knows whether the topic is gone: the removal stays pending (subscribes
                // refused) until a retried DELETE or a start finds out.
                tracing::warn!(%topic, error = %e, "the log could not say whether the topic was deleted; its removal stays pending, DELETE it again");
                return Err(deleted.err().map_or_else(|| ApiError::from(e), ApiError::from));
            }
        }
    }
    deletion.forget();
    let store = d.store.clone();
    let marking = topic.clone();
    tokio::task::spawn_blocking(move || store.topic_log_deleted(&marking)).await.map_err(|e| StoreError::Io(format!("marking the removal: {e}")))??;
    finish_removal(d, &topic).await
}

/// Removes what the store holds of a deleted topic (`core::topic_removal`) and answers the
/// deletion. A prefix scan and a delete per key: on the blocking pool, never on a worker that
/// inline acks wait for.
async fn finish_removal(d: &crate::core::dispatcher::Dispatcher, topic: &TopicName) -> Result<Json<Value>, ApiError> {
    let store = d.store.clone();
    let removing = topic.clone();
    let removed = tokio::task::spawn_blocking(move || topic_removal::finish_removal(store.as_ref(), &removing))
        .await
        .map_err(|e| StoreError::Io(format!("removing offsets: {e}")))?
        .inspect_err(|e| tracing::warn!(%topic, error = %e, "the topic's log is deleted but its offsets could not all be removed; DELETE it again (or restart) to finish"))?;
    tracing::info!(%topic, offsets_deleted = removed.offsets, dead_letters_deleted = removed.dead_letters, "topic deleted with its offsets and dead letters");
    Ok(Json(json!({"deleted": topic.as_str(), "offsets_deleted": removed.offsets, "dead_letters_deleted": removed.dead_letters})))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::published_event::LENIENT_BASE64;
    use base64::Engine as _;

    fn bounds(max_batch_events: usize) -> EventBounds {
        EventBounds { max_batch_events, max_key_bytes: 8, max_header_name_bytes: 4 }
    }

    proptest::proptest! {
        /// Any body gives events or a 4xx, never a panic.
        #[test]
        fn publish_parsing_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..200), key in "[a-z_]{1,10}", value in "(1|null|\"x\"|\\[\\]|\\{\\}|\\[\\{\\}\\])") {
            for bytes in [body, format!(r#"{{"{key}":{value}}}"#).into_bytes(), format!(r#"{{"events":[{{"{key}":{value}}}]}}"#).into_bytes()] {
                if let Err(e) = parse_publish_body(&bytes, &bounds(10)) {
                    proptest::prop_assert!(e.status.is_client_error());
                }
            }
        }
    }

    #[test]
    fn publish_bodies() {
        let one = parse_publish_body(br#"{"key":"k","payload":{"a": [1, 2]}}"#, &bounds(10)).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].key.as_deref(), one[0].payload.as_slice(), one[0].payload_is_json), (Some("k"), br#"{"a": [1, 2]}"#.as_slice(), true));
        let batch = parse_publish_body(br#"{"events":[{"payload":1},{"payload_base64":"/wA=","partition":2}]}"#, &bounds(10)).unwrap();
        assert_eq!((batch.len(), batch[1].partition, batch[1].payload_is_json), (2, Some(2), false));
        let code = |body: &[u8], max| parse_publish_body(body, &bounds(max)).err().map(|e| (e.status.as_u16(), e.code));
        assert_eq!(code(b"{", 10), Some((400, ErrorCode::BadRequest)));
        assert_eq!(code(br#"{"key":"k"}"#, 10), Some((400, ErrorCode::BadRequest)));
        assert_eq!(code(br#"{"events":[]}"#, 10), Some((400, ErrorCode::BadRequest)));
        assert_eq!(code(br#"{"events":[{"payload":1},{"payload":2}]}"#, 1), Some((413, ErrorCode::LimitExceeded)));
        assert_eq!(code(br#"{"payload":1,"surprise":2}"#, 10), Some((400, ErrorCode::BadRequest)));
        assert_eq!(code(br#"{"payload":1,"partition":-1}"#, 10), Some((400, ErrorCode::BadRequest)));
        // What schemathesis sends from the document: integral floats are integers, and base64
        // with stray low bits in its last character decodes (the bits carry nothing).
        let generated = parse_publish_body(br#"{"events":[{"payload":1,"partition":3.0},{"payload_base64":"SvNBpBGZN2=="}]}"#, &bounds(10)).unwrap();
        assert_eq!(generated[0].partition, Some(3));
        assert_eq!(generated[1].payload, LENIENT_BASE64.decode("SvNBpBGZNw==").unwrap());
        assert_eq!(code(br#"{"payload":1,"partition":3.5}"#, 10), Some((400, ErrorCode::BadRequest)));
        assert_eq!(code(br#"{"payload_base64":"SvNBpBGZN"}"#, 10), Some((400, ErrorCode::BadRequest)));
        // `null` is a JSON payload like any other; an absent payload is not.
        let null = parse_publish_body(br#"{"payload":null}"#, &bounds(10)).unwrap();
        assert_eq!((null[0].payload.as_slice(), null[0].payload_is_json), (b"null".as_slice(), true));
        assert_eq!(code(br#"{"payload":null,"payload_base64":"AA=="}"#, 10), Some((400, ErrorCode::BadRequest)));
        // Keys and header names within their bounds (8 and 4 bytes here), counted in bytes.
        assert!(parse_publish_body(br#"{"key":"12345678","headers":{"abcd":"a long value is fine"},"payload":1}"#, &bounds(10)).is_ok());
        let over = |body: &[u8]| parse_publish_body(body, &bounds(10)).err().map(|e| (e.status.as_u16(), e.message));
        let (status, message) = over(br#"{"key":"123456789","payload":1}"#).unwrap();
        assert_eq!((status, message.as_str()), (400, "event 0: key is 9 bytes; at most 8 (limits.max_key_bytes)"));
        let (status, message) = over("{\"events\":[{\"payload\":1},{\"key\":\"é1234567\",\"payload\":1}]}".as_bytes()).unwrap();
        assert_eq!((status, message.as_str()), (400, "event 1: key is 9 bytes; at most 8 (limits.max_key_bytes)"));
        let (status, message) = over(br#"{"headers":{"abcde":"x"},"payload":1}"#).unwrap();
        assert_eq!((status, message.as_str()), (400, "event 0: a header name is 5 bytes; at most 4 (limits.max_header_name_bytes)"));
    }
}
