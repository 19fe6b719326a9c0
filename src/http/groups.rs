//! `/admin/groups`: shared subscriptions (`subscribe` with `group`): the live ones with their
//! members, and a group's stored floor per partition, reset and delete as for a client's offsets.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::offsets::{delete_offsets, partitions_with_lag, reset_offset, ResetBody};
use super::{AppState, JsonBody};
use crate::core::names::{ClientId, GroupName, TopicName};

fn parse_names(topic: &str, group: &str) -> Result<(TopicName, GroupName), ApiError> {
    let topic = TopicName::parse(topic).map_err(|e| ApiError::invalid_name(e.0))?;
    let group = GroupName::parse(group).map_err(|e| ApiError::invalid_name(e.0))?;
    Ok((topic, group))
}

/// `GET /admin/groups?topic=&group=`
#[utoipa::path(
    get,
    path = "/admin/groups",
    operation_id = "list_groups",
    tag = "groups",
    summary = "The shared subscriptions live on this instance, with their members",
    params(
        ("scope" = Option<String>, Query, description = "local: this instance, rows with their instance; cluster: every cluster.peers instance too, plus unreachable and next_by_instance; absent: this instance, as before", pattern = r"^(local|cluster)$"),
        ("topic" = Option<String>, Query, description = "exact topic", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("group" = Option<String>, Query, description = "exact group", pattern = r"^[A-Za-z0-9._-]{1,249}$", min_length = 1, max_length = 249),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::GroupList),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "topic" | "group")) {
        return Err(ApiError::bad_request(format!("unknown parameter {unknown:?}; use topic or group")));
    }
    let topic = query.get("topic").map(|t| TopicName::parse(t)).transpose().map_err(|e| ApiError::invalid_name(e.0))?;
    let group = query.get("group").map(|g| GroupName::parse(g)).transpose().map_err(|e| ApiError::invalid_name(e.0))?;
    let views = app.dispatcher.groups.describe(topic.as_ref(), group.as_ref()).await;
    let instance = &app.dispatcher.instance;
    let groups: Vec<Value> = views
        .into_iter()
        .map(|v| {
            let in_flight: usize = v.members.iter().map(|m| m.in_flight).sum();
            json!({"topic": v.topic, "group": v.group, "order": v.order, "instance": instance, "members": v.members, "in_flight": in_flight, "waiting": v.waiting})
        })
        .collect();
    Ok(Json(json!({ "groups": groups })))
}

/// `GET /admin/groups/{topic}/{group}`: the group's floor per partition, its lag, and its
/// members when it is live here.
#[utoipa::path(
    get,
    path = "/admin/groups/{topic}/{group}",
    operation_id = "get_group",
    tag = "groups",
    summary = "One group: its stored floor and lag per partition, and its members when live here",
    params(
        ("topic" = String, Path, description = "topic name", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("group" = String, Path, description = "group", pattern = r"^[A-Za-z0-9._-]{1,249}$", min_length = 1, max_length = 249),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::GroupDetail),
        (status = 400, description = "invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic, or not_found: the group has no floor stored here and no members here", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn view(State(app): State<AppState>, Path((topic, group)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    let (topic, group) = parse_names(&topic, &group)?;
    let partitions = partitions_with_lag(&app, &topic, &ClientId::of_group(&group)).await?;
    let live = app.dispatcher.groups.describe(Some(&topic), Some(&group)).await.pop();
    let (order, members, waiting) = match live {
        Some(v) => (Some(v.order), v.members, v.waiting),
        None => (None, Vec::new(), 0),
    };
    if order.is_none() && partitions.iter().all(|p| p["committed"].is_null()) {
        return Err(ApiError::not_found(format!("group {group} of topic {topic} has no floor stored here and no members here")));
    }
    Ok(Json(json!({
        "topic": topic.as_str(),
        "group": group.as_str(),
        "live": order.is_some(),
        "order": order,
        "members": members,
        "waiting": waiting,
        "partitions": partitions,
    })))
}

/// `PUT /admin/groups/{topic}/{group}/{partition}` with `{"offset"}` or `{"time"}`.
#[utoipa::path(
    put,
    path = "/admin/groups/{topic}/{group}/{partition}",
    operation_id = "reset_group_offset",
    tag = "groups",
    summary = "Reset a group's floor on a partition while it has no members here (backwards allowed, at most the log end)",
    params(
        ("topic" = String, Path, description = "topic name", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("group" = String, Path, description = "group", pattern = r"^[A-Za-z0-9._-]{1,249}$", min_length = 1, max_length = 249),
        ("partition" = u64, Path, description = "partition", minimum = 0, maximum = 4294967295.0),
    ),
    request_body = crate::http::schemas::ResetOffset,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "the new row (its client_id is the group's identity, `$` and the group)", body = crate::http::schemas::OffsetRow),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "unknown_topic, or not_found: a partition the topic does not have", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: the group has members on this instance", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn reset(
    State(app): State<AppState>,
    Path((topic, group, partition)): Path<(String, String, String)>,
    JsonBody(body): JsonBody<ResetBody>,
) -> Result<Json<Value>, ApiError> {
    let (topic, group) = parse_names(&topic, &group)?;
    reset_offset(&app, topic, ClientId::of_group(&group), &partition, body).await
}

/// `DELETE /admin/groups/{topic}/{group}`: forget the group's floors on the topic.
#[utoipa::path(
    delete,
    path = "/admin/groups/{topic}/{group}",
    operation_id = "delete_group",
    tag = "groups",
    summary = "Forget a group's stored floors on a topic while it has no members here",
    params(
        ("topic" = String, Path, description = "topic name", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("group" = String, Path, description = "group", pattern = r"^[A-Za-z0-9._-]{1,249}$", min_length = 1, max_length = 249),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::Deleted),
        (status = 400, description = "invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 409, description = "conflict: the group has members on this instance", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the offset store failed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn delete(State(app): State<AppState>, Path((topic, group)): Path<(String, String)>) -> Result<Json<Value>, ApiError> {
    let (topic, group) = parse_names(&topic, &group)?;
    delete_offsets(&app, topic, ClientId::of_group(&group)).await
}
