//! `/admin/offsets`: stored ack offsets, per-client lag, reset and delete (offline clients only).

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::{AppState, JsonBody};
use crate::core::backend::PartitionBounds;
use crate::core::names::{ClientId, GroupName, OffsetKey, TopicName, TopicPartition};
use crate::core::offsets::{OffsetFilter, OffsetRecord};

fn parse_names(topic: &str, client_id: &str) -> Result<(TopicName, ClientId), ApiError> {
    let topic = TopicName::parse(topic).map_err(|e| ApiError::invalid_name(e.0))?;
    let client_id = ClientId::parse(client_id).map_err(|e| ApiError::invalid_name(e.0))?;
    Ok((topic, client_id))
}

fn row(key: &OffsetKey, record: &OffsetRecord) -> Value {
    json!({
        "key": key.to_string(),
        "topic": key.topic.as_str(),
        "client_id": key.client_id.as_str(),
        "partition": key.partition,
        "committed": record.committed,
        "last_acked": record.last_acked,
        "updated_at": record.updated_at,
        "epoch": record.epoch,
    })
}

/// Offsets per page of `GET /admin/offsets` unless `limit` says otherwise, and the most one page
/// holds.
pub const DEFAULT_PAGE: usize = 1000;
pub const MAX_PAGE: usize = 10_000;

/// `GET /admin/offsets?topic=&client_id=&group=&partition=&limit=&after=`
#[utoipa::path(
    get,
    path = "/admin/offsets",
    operation_id = "list_offsets",
    tag = "offsets",
    summary = "Stored ack offsets, filtered by key-prefix scans, one page at a time",
    params(
        ("scope" = Option<String>, Query, description = "local: this instance, rows with their instance; cluster: every cluster.peers instance too, plus unreachable and next_by_instance; absent: this instance, as before", pattern = r"^(local|cluster)$"),
        ("topic" = Option<String>, Query, description = "exact topic (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("client_id" = Option<String>, Query, description = "exact client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128),
        ("group" = Option<String>, Query, description = "a shared subscription's group: its floor's rows (instead of client_id's)", pattern = r"^[A-Za-z0-9._-]+$", min_length = 1, max_length = 249),
        ("partition" = Option<u64>, Query, description = "exact partition", minimum = 0, maximum = 4294967295.0),
        ("limit" = Option<u32>, Query, description = "offsets per page, 1 to 10000 (default 1000)", minimum = 1, maximum = 10000),
        ("after" = Option<String>, Query, description = "the `next` of the previous page (`topic#client_id#partition`)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?#[A-Za-z0-9._:@-]{1,128}#[0-9]{1,9}$"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::OffsetList, links(
            ("GetClientOffsets" = (operation_id = "get_client_offsets", parameters(("topic" = "$response.body#/offsets/0/topic"), ("client_id" = "$response.body#/offsets/0/client_id")))),
            ("ResetOffset" = (operation_id = "reset_offset", parameters(("topic" = "$response.body#/offsets/0/topic"), ("client_id" = "$response.body#/offsets/0/client_id"), ("partition" = "$response.body#/offsets/0/partition")))),
            ("DeleteClientOffsets" = (operation_id = "delete_client_offsets", parameters(("topic" = "$response.body#/offsets/0/topic"), ("client_id" = "$response.body#/offsets/0/client_id")))),
        )),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "topic" | "client_id" | "group" | "partition" | "limit" | "after")) {
        return Err(ApiError::bad_request(format!("unknown parameter {unknown:?}; use topic, client_id, group, partition, limit or after")));
    }
    // A group's floor is stored under its identity (`ClientId::of_group`), which no client id
    // can name: a peer whose hub would start the group reads it so (`cluster`).
    let client_id = match (query.get("client_id"), query.get("group")) {
        (Some(_), Some(_)) => return Err(ApiError::bad_request("give client_id or group, not both")),
        (Some(client_id), None) => Some(ClientId::parse(client_id).map_err(|e| ApiError::invalid_name(e.0))?),
        (None, Some(group)) => Some(ClientId::of_group(&GroupName::parse(group).map_err(|e| ApiError::invalid_name(e.0))?)),
        (None, None) => None,
    };
    let limit = super::page_limit(&query, DEFAULT_PAGE, MAX_PAGE)?;
    let after = query
        .get("after")
        .map(|text| {
            OffsetKey::parse(text)
                .ok_or_else(|| ApiError::bad_request(format!("after must be the `next` of a previous page (topic#client_id#partition), got {text:?}")))
        })
        .transpose()?;
    let filter = OffsetFilter {
        topic: query.get("topic").map(|t| TopicName::parse(t)).transpose().map_err(|e| ApiError::invalid_name(e.0))?,
        client_id,
        partition: query
            .get("partition")
            .map(|p| p.parse::<u32>())
            .transpose()
            .map_err(|_| ApiError::bad_request("partition must be a non-negative integer"))?,
    };
    // Plain acks' writes wait for the writer's linger: written first, so a listing right after
    // an ack shows it.
    read_after_held_writes(&app.dispatcher).await;
    // One page, on the blocking pool: an unfiltered listing walks the whole store.
    let store = app.dispatcher.store.clone();
    let page = tokio::task::spawn_blocking(move || store.scan_page(&filter, after.as_ref(), limit))
        .await
        .map_err(|e| crate::core::offsets::StoreError::Io(e.to_string()))??;
    // Each row with its partition's log end and lag (one read of the log per partition of the
    // page): an offline client's lag is seen here, not only a live one's. Not the listing's
    // cache (`listed_bounds`): a bound read here would make `GET /topics` a second stale.
    let mut bounds: HashMap<TopicPartition, Option<PartitionBounds>> = HashMap::new();
    let mut rows = Vec::with_capacity(page.len());
    for (key, record) in &page {
        let tp = TopicPartition::new(key.topic.clone(), key.partition);
        if !bounds.contains_key(&tp) {
            let read = app.dispatcher.backend.log_bounds(&tp).await.ok();
            bounds.insert(tp.clone(), read);
        }
        let mut row = row(key, record);
        let known = bounds[&tp];
        row["log_end"] = json!(known.map(|b| b.log_end));
        row["lag"] = json!(known.map(|b| b.lag(Some(record.committed))));
        rows.push(row);
    }
    let mut body = json!({ "offsets": rows });
    if page.len() == limit {
        body["next"] = json!(page[limit - 1].0.to_string());
    }
    Ok(Json(body))
}

/// `GET /admin/offsets/{topic}/{client_id}`: every partition of the topic with the lag to log end.
#[utoipa::path(
    get,
    path = "/admin/offsets/{topic}/{client_id}",
    operation_id = "get_client_offsets",
    tag = "offsets",
    summary = "One client's offsets on a topic, with log end and lag",
    params(("topic" = String, Path, description = "topic name (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499), ("client_id" = String, Path, description = "client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128)),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::ClientOffsets),
        (status = 400, description = "invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn client_view(State(app): State<AppState>, Path((topic, client_id)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    let (topic, client_id) = parse_names(&topic, &client_id)?;
    let partitions = partitions_with_lag(&app, &topic, &client_id).await?;
    Ok(Json(json!({"topic": topic.as_str(), "client_id": client_id.as_str(), "partitions": partitions})))
}

/// Every partition of `topic` with the stored offsets of `client_id` (a client's, or a group's
/// identity) and the lag to the log end.
pub(super) async fn partitions_with_lag(app: &AppState, topic: &TopicName, client_id: &ClientId) -> Result<Vec<Value>, ApiError> {
    let d = &app.dispatcher;
    let count = d.backend.partitions(topic).await?.ok_or_else(|| ApiError::from(crate::core::backend::BackendError::UnknownTopic(topic.to_string())))?;
    let filter = OffsetFilter { topic: Some(topic.clone()), client_id: Some(client_id.clone()), partition: None };
    read_after_held_writes(d).await;
    let stored: HashMap<u32, OffsetRecord> = d.store.scan(&filter)?.into_iter().map(|(k, r)| (k.partition, r)).collect();
    let mut partitions = Vec::with_capacity(count as usize);
    for partition in 0..count {
        let bounds = d.backend.log_bounds(&TopicPartition::new(topic.clone(), partition)).await?;
        let record = stored.get(&partition);
        let committed = record.map(|r| r.committed);
        partitions.push(json!({
            "partition": partition,
            "committed": committed,
            "last_acked": record.and_then(|r| r.last_acked),
            "log_end": bounds.log_end,
            // Without a stored offset the lag is what the reset policy would deliver.
            "lag": bounds.lag(committed),
        }));
    }
    Ok(partitions)
}

/// The largest `time` taken (epoch ms): what Kafka's ListOffsets and RocketMQ carry (an i64).
const MAX_TIME_MS: u64 = i64::MAX as u64;

/// `{"offset"}` or `{"time": epoch_ms}`, exactly one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetBody {
    #[serde(default, deserialize_with = "crate::core::whole_number::optional_whole")]
    offset: Option<u64>,
    #[serde(default, deserialize_with = "crate::core::whole_number::optional_whole")]
    time: Option<u64>,
}

/// `PUT /admin/offsets/{topic}/{client_id}/{partition}` with `{"offset"}` or `{"time"}` (the
/// partition's first offset at or after that epoch ms): reset, backwards allowed.
#[utoipa::path(
    put,
    path = "/admin/offsets/{topic}/{client_id}/{partition}",
    operation_id = "reset_offset",
    tag = "offsets",
    summary = "Reset an offline client's offset (backwards allowed, at most the log end)",
    params(("scope" = Option<String>, Query, description = "cluster: made at every cluster.peers instance too (their answers in peers, the silent ones in unreachable); local or absent: here only", pattern = r"^(local|cluster)$"), ("topic" = String, Path, description = "topic name (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499), ("client_id" = String, Path, description = "client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128), ("partition" = u64, Path, description = "partition", minimum = 0, maximum = 4294967295.0)),
    request_body = crate::http::schemas::ResetOffset,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "the new row", body = crate::http::schemas::OffsetRow),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic, or not_found: a partition the topic does not have", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: the client has a live session", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
        (status = 413, description = "limit_exceeded: body over limits.max_body_bytes", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn reset(
    State(app): State<AppState>,
    Path((topic, client_id, partition)): Path<(String, String, String)>,
    JsonBody(body): JsonBody<ResetBody>,
) -> Result<Json<Value>, ApiError> {
    let (topic, client_id) = parse_names(&topic, &client_id)?;
    reset_offset(&app, topic, client_id, &partition, body).await
}

/// Resets the offset of `client_id` (a client's, or a group's identity) while it has no live
/// session (a group: no hub on this instance).
pub(super) async fn reset_offset(app: &AppState, topic: TopicName, client_id: ClientId, partition: &str, body: ResetBody) -> Result<Json<Value>, ApiError> {
    let partition: u32 = partition.parse().map_err(|_| ApiError::bad_request("partition must be a non-negative integer"))?;
    let d = &app.dispatcher;
    let count = d.backend.partitions(&topic).await?.ok_or_else(|| ApiError::from(crate::core::backend::BackendError::UnknownTopic(topic.to_string())))?;
    if partition >= count {
        return Err(ApiError::not_found(format!("partition {partition} does not exist; {topic} has {count}")));
    }
    let tp = TopicPartition::new(topic.clone(), partition);
    let log_end = d.backend.log_bounds(&tp).await?.log_end;
    let offset = match (body.offset, body.time) {
        (Some(offset), None) => offset,
        (None, Some(time_ms)) if time_ms > MAX_TIME_MS => {
            return Err(ApiError::bad_request(format!("time must be at most {MAX_TIME_MS} (epoch ms), got {time_ms}")))
        }
        (None, Some(time_ms)) => d.backend.offset_for_time(&tp, time_ms).await?,
        _ => return Err(ApiError::bad_request("give either \"offset\" or \"time\" (epoch ms)")),
    };
    if offset > log_end {
        return Err(ApiError::bad_request(format!(
            "offset {offset} is above the log end of {topic} partition {partition} ({log_end}); reset to at most {log_end}"
        )));
    }
    let key = OffsetKey::new(topic.clone(), client_id.clone(), partition);
    let (store, reset_key, now_ms) = (d.store.clone(), key.clone(), d.clock.now_ms());
    // In the partition's current log epoch: a reset made after a lost tail is made in the new log.
    let min_epoch = d.store.log_epoch(&tp)?.first_offset_epoch();
    let record =
        d.change_offline_client(&client_id, &topic, move || store.reset(&reset_key, offset, min_epoch, now_ms)).await.ok_or_else(|| live(&client_id))??;
    tracing::info!(%key, offset, by_time = body.time, "offset reset by an operator");
    Ok(Json(row(&key, &record)))
}

fn live(client_id: &ClientId) -> ApiError {
    match client_id.group() {
        Some(group) => {
            ApiError::conflict(format!("group {group} has members on this instance (disconnect them first), or another change of its offsets is running"))
        }
        None => ApiError::conflict(format!("client {client_id} has a live session (disconnect it first), or another change of its offsets is running")),
    }
}

/// `DELETE /admin/offsets/{topic}/{client_id}`: forget the client's offsets on the topic.
#[utoipa::path(
    delete,
    path = "/admin/offsets/{topic}/{client_id}",
    operation_id = "delete_client_offsets",
    tag = "offsets",
    summary = "Forget an offline client's offsets on a topic",
    params(("scope" = Option<String>, Query, description = "cluster: made at every cluster.peers instance too (their answers in peers, the silent ones in unreachable); local or absent: here only", pattern = r"^(local|cluster)$"), ("topic" = String, Path, description = "topic name (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499), ("client_id" = String, Path, description = "client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128)),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::Deleted),
        (status = 400, description = "invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: the client has a live session", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn delete(State(app): State<AppState>, Path((topic, client_id)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    let (topic, client_id) = parse_names(&topic, &client_id)?;
    delete_offsets(&app, topic, client_id).await
}

/// Forgets the offsets of `client_id` (a client's, or a group's identity) on `topic` while it has
/// no live session.
pub(super) async fn delete_offsets(app: &AppState, topic: TopicName, client_id: ClientId) -> Result<Json<Value>, ApiError> {
    let d = &app.dispatcher;
    let filter = OffsetFilter { topic: Some(topic.clone()), client_id: Some(client_id.clone()), partition: None };
    let store = d.store.clone();
    let remove = move || -> Result<usize, crate::core::offsets::StoreError> {
        let keys: Vec<OffsetKey> = store.scan(&filter)?.into_iter().map(|(k, _)| k).collect();
        store.remove_fenced(&keys)
    };
    let deleted = d.change_offline_client(&client_id, &topic, remove).await.ok_or_else(|| live(&client_id))??;
    tracing::info!(%topic, %client_id, deleted, "offsets deleted by an operator");
    Ok(Json(json!({ "deleted": deleted })))
}

/// Waits until the offset writes made so far are in the store (plain acks wait for the writer's
/// linger, `offsets.plain_ack_linger_ms`), so an admin read shows every ack made before it. A
/// writer that stopped (shutdown) holds nothing more: the read goes ahead.
async fn read_after_held_writes(d: &crate::core::dispatcher::Dispatcher) {
    if let Err(e) = d.writer.barrier().await {
        tracing::debug!(error = %e, "offset read without a barrier");
    }
}
