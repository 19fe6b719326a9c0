//! `GET /admin/dead-letters?topic=&client_id=&limit=&after=`: one page of dead letters, and
//! `POST /admin/dead-letters/redrive`: deliver some again, and `POST /admin/dead-letters/delete`:
//! remove some for good.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::{AppState, JsonBody};
use crate::core::dead_letters::{DeadLetterId, DeadLetterQuery};
use crate::core::names::{ClientId, GroupName, TopicName};

/// Dead letters per page unless `limit` says otherwise, and the most one page holds.
pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1000;

#[utoipa::path(
    get,
    path = "/admin/dead-letters",
    operation_id = "list_dead_letters",
    tag = "dead letters",
    summary = "Dead letters (max_attempts or term), one page at a time",
    params(
        ("scope" = Option<String>, Query, description = "local: this instance, rows with their instance; cluster: every cluster.peers instance too, plus unreachable and next_by_instance; absent: this instance, as before", pattern = r"^(local|cluster)$"),
        ("topic" = Option<String>, Query, description = "exact topic (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("client_id" = Option<String>, Query, description = "exact client id, or a shared subscription's identity `$NAME`", pattern = r"^([A-Za-z0-9._:@-]{1,128}|\$[A-Za-z0-9._-]{1,249})$", min_length = 1, max_length = 250),
        ("limit" = Option<u32>, Query, description = "dead letters per page, 1 to 1000 (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "the `next` of the previous page (`topic#client_id#partition#offset`)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?#([A-Za-z0-9._:@-]{1,128}|\$[A-Za-z0-9._-]{1,249})#[0-9]{1,9}#[0-9]{1,19}$"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::DeadLetterList),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let query = page_query(query)?;
    let page = app.dispatcher.store.dead_letters(&query)?;
    let rows: Vec<Value> = page
        .dead_letters
        .into_iter()
        .map(|d| {
            json!({
                "topic": d.topic.as_str(),
                "client_id": d.client_id.as_str(),
                "partition": d.partition,
                "offset": d.offset,
                "attempts": d.attempts,
                "reason": d.reason,
                "at": d.at,
            })
        })
        .collect();
    let mut body = json!({ "dead_letters": rows });
    if let Some(next) = page.next {
        body["next"] = json!(next.to_string());
    }
    Ok(Json(body))
}

/// The filters and page of a dead-letter style listing (`/admin/dead-letters`, `/admin/gaps`):
/// `topic`, `client_id`, `limit`, `after`; anything else is refused.
pub fn page_query(query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<DeadLetterQuery, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "topic" | "client_id" | "limit" | "after")) {
        return Err(ApiError::bad_request(format!("unknown parameter {unknown:?}; use topic, client_id, limit or after")));
    }
    let limit = super::page_limit(&query, DEFAULT_PAGE, MAX_PAGE)?;
    let after = query
        .get("after")
        .map(|text| {
            DeadLetterId::parse(text)
                .ok_or_else(|| ApiError::bad_request(format!("after must be the `next` of a previous page (topic#client_id#partition#offset), got {text:?}")))
        })
        .transpose()?;
    Ok(DeadLetterQuery {
        topic: query.get("topic").map(|t| TopicName::parse(t)).transpose().map_err(|e| ApiError::invalid_name(e.0))?,
        // A group's are listed as `$NAME`.
        client_id: query.get("client_id").map(|c| ClientId::parse_stored(c)).transpose().map_err(|e| ApiError::invalid_name(e.0))?,
        partition: None,
        offset: None,
        after,
        limit,
    })
}

/// `{"topic", "client_id" | "group", "partition"?, "offset"?, "after"?, "limit"?}`: one page of a
/// client's or a group's dead letters on a topic (one dead letter with `partition` and `offset`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveBody {
    topic: String,
    /// A client id, or a group's identity `$NAME`.
    client_id: Option<String>,
    group: Option<String>,
    #[serde(default, deserialize_with = "crate::core::whole_number::optional_whole")]
    partition: Option<u32>,
    #[serde(default, deserialize_with = "crate::core::whole_number::optional_whole")]
    offset: Option<u64>,
    after: Option<String>,
    #[serde(default, deserialize_with = "crate::core::whole_number::optional_whole")]
    limit: Option<usize>,
}

/// `POST /admin/dead-letters/redrive`: marks one page of a client's dead letters on a topic to be
/// delivered again (`core::redrive`), now if the client has a session here, else at its next
/// subscribe.
#[utoipa::path(
    post,
    path = "/admin/dead-letters/redrive",
    operation_id = "redrive_dead_letters",
    tag = "dead letters",
    summary = "Deliver a client's dead letters again (redrive: true, outside its committed floor); an ack removes each",
    params(("scope" = Option<String>, Query, description = "cluster: each cluster.peers instance redrives the dead letters it recorded too (their answers in peers, the silent ones in unreachable); local or absent: here only", pattern = r"^(local|cluster)$")),
    request_body = crate::http::schemas::RedriveRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::Redriven),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 413, description = "limit_exceeded: body over limits.max_body_bytes", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn redrive(State(app): State<AppState>, JsonBody(body): JsonBody<RedriveBody>) -> Result<Json<Value>, ApiError> {
    let query = selection(&body)?;
    let (topic, client_id) = (query.topic.clone().expect("selected"), query.client_id.clone().expect("selected"));
    let (redriven, next) = on_selected_page(&app, query, |store, ids| store.mark_redrive(ids)).await?;
    crate::core::metrics::dead_letters_redriven().increment(redriven as u64);
    let live = redriven > 0 && app.dispatcher.redrive(&client_id, &topic);
    tracing::info!(%topic, %client_id, partition = body.partition, offset = body.offset, redriven, live, "dead letters redriven by an operator");
    let mut answer = json!({ "redriven": redriven });
    if let Some(next) = next {
        answer["next"] = json!(next.to_string());
    }
    Ok(Json(answer))
}

/// The dead letters a redrive or delete body names: one page of a client's dead letters on a
/// topic, of one partition, at one offset (one dead letter with a partition).
fn selection(body: &RedriveBody) -> Result<DeadLetterQuery, ApiError> {
    let topic = TopicName::parse(&body.topic).map_err(|e| ApiError::invalid_name(e.0))?;
    // A group's dead letters are its identity's (`$NAME`, issue 59 item 5).
    let client_id = match (&body.client_id, &body.group) {
        (Some(client_id), None) => ClientId::parse_stored(client_id),
        (None, Some(group)) => GroupName::parse(group).map(|group| ClientId::of_group(&group)),
        _ => return Err(ApiError::bad_request("give client_id, or group for a shared subscription's dead letters (or client_id \"$NAME\"), not both")),
    }
    .map_err(|e| ApiError::invalid_name(e.0))?;
    let limit = body.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be an integer from 1 to {MAX_PAGE}, got {limit}")));
    }
    // Offsets are int64 in the API's schema (Kafka's and RocketMQ's offsets are signed 64-bit).
    if body.offset.is_some_and(|offset| offset > i64::MAX as u64) {
        return Err(ApiError::bad_request(format!("offset must be an integer from 0 to {}", i64::MAX)));
    }
    // Any dead letter's name is a position in the store's order: one of another topic or client
    // only starts the page before or after this client's dead letters.
    let after = body
        .after
        .as_deref()
        .map(|text| {
            DeadLetterId::parse(text)
                .ok_or_else(|| ApiError::bad_request(format!("after must be the `next` of a previous answer (topic#client_id#partition#offset), got {text:?}")))
        })
        .transpose()?;
    Ok(DeadLetterQuery { topic: Some(topic), client_id: Some(client_id), partition: body.partition, offset: body.offset, after, limit })
}

/// Reads the page `query` selects and applies `change` to its dead letters, on the blocking pool
/// (RocksDB): how many it changed, and the `after` of the next page when more match.
async fn on_selected_page(
    app: &AppState,
    query: DeadLetterQuery,
    change: fn(&dyn crate::core::offsets::OffsetStore, &[DeadLetterId]) -> Result<usize, crate::core::offsets::StoreError>,
) -> Result<(usize, Option<DeadLetterId>), ApiError> {
    let store = app.dispatcher.store.clone();
    tokio::task::spawn_blocking(move || -> Result<_, crate::core::offsets::StoreError> {
        let page = store.dead_letters(&query)?;
        let ids: Vec<DeadLetterId> = page.dead_letters.iter().map(|d| d.id()).collect();
        Ok((change(store.as_ref(), &ids)?, page.next))
    })
    .await
    .map_err(|e| ApiError::from(crate::core::offsets::StoreError::Io(e.to_string())))?
    .map_err(ApiError::from)
}

/// `POST /admin/dead-letters/delete`: removes one page of a client's dead letters on a topic for
/// good (with their redrive marks: a redriven copy in flight is then acknowledged for nothing).
#[utoipa::path(
    post,
    path = "/admin/dead-letters/delete",
    operation_id = "delete_dead_letters",
    tag = "dead letters",
    summary = "Remove a client's dead letters for good (one page, one partition, or one dead letter)",
    params(("scope" = Option<String>, Query, description = "cluster: each cluster.peers instance deletes the dead letters it recorded too (their answers in peers, the silent ones in unreachable); local or absent: here only", pattern = r"^(local|cluster)$")),
    request_body = crate::http::schemas::RedriveRequest,
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::DeadLettersDeleted),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 413, description = "limit_exceeded: body over limits.max_body_bytes", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn delete(State(app): State<AppState>, JsonBody(body): JsonBody<RedriveBody>) -> Result<Json<Value>, ApiError> {
    let query = selection(&body)?;
    let (topic, client_id) = (query.topic.clone().expect("selected"), query.client_id.clone().expect("selected"));
    let (deleted, next) = on_selected_page(&app, query, |store, ids| store.remove_dead_letter_ids(ids)).await?;
    tracing::info!(%topic, %client_id, partition = body.partition, offset = body.offset, deleted, "dead letters deleted by an operator");
    let mut answer = json!({ "deleted": deleted });
    if let Some(next) = next {
        answer["next"] = json!(next.to_string());
    }
    Ok(Json(answer))
}
