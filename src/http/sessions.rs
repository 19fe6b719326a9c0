//! `/admin/sessions`: live sessions (filtered, in pages), one session with its in-flight
//! deliveries, disconnect.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

use super::error::ApiError;
use super::AppState;
use crate::core::names::{ClientId, TopicName};
use crate::core::session_control::SessionControl;
use crate::core::session_registry::SessionInfo;

/// How long the detail route waits for a session to list its deliveries.
const DESCRIBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

fn session_json(info: &SessionInfo) -> Value {
    let stats = &info.stats;
    let last_ack = stats.last_ack_at.load(Ordering::Relaxed);
    let subscriptions: Vec<String> = info.subscriptions.lock().unwrap().iter().map(|t| t.to_string()).collect();
    let groups: Vec<Value> = info.groups.lock().unwrap().iter().map(|(t, g)| json!({"topic": t.as_str(), "group": g.as_str()})).collect();
    json!({
        "session_id": info.session_id,
        "client_id": info.client_id.as_str(),
        "remote_addr": info.remote_addr.map(|a| a.to_string()),
        "connected_at": info.connected_at,
        "subscriptions": subscriptions,
        "groups": groups,
        "in_flight": stats.in_flight.load(Ordering::Relaxed),
        "delivered": stats.delivered.load(Ordering::Relaxed),
        "acked": stats.acked.load(Ordering::Relaxed),
        "redelivered": stats.redelivered.load(Ordering::Relaxed),
        "last_ack_at": (last_ack > 0).then_some(last_ack),
        "window_full": info.window.is_full(),
        "transport": info.transport.as_str(),
    })
}

#[utoipa::path(
    get,
    path = "/admin/sessions",
    operation_id = "list_sessions",
    tag = "sessions",
    summary = "Live sessions and their counters, filtered, one page at a time (by session id)",
    params(
        ("scope" = Option<String>, Query, description = "local: this instance, rows with their instance; cluster: every cluster.peers instance too, plus unreachable and next_by_instance; absent: this instance, as before", pattern = r"^(local|cluster)$"),
        ("client_id" = Option<String>, Query, description = "exact client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128),
        ("topic" = Option<String>, Query, description = "sessions subscribed to this exact topic", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("transport" = Option<String>, Query, description = "websocket, sse, or group (a shared subscription's hub)", pattern = r"^(websocket|sse|group)$"),
        ("limit" = Option<u32>, Query, description = "sessions per page, 1 to 10000 (default 1000)", minimum = 1, maximum = 10000),
        ("after" = Option<String>, Query, description = "the `next` of the previous page (a session id)", min_length = 1, max_length = 128),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::SessionList, links(
            ("GetSession" = (operation_id = "get_session", parameters(("session_id" = "$response.body#/sessions/0/session_id")))),
            ("DisconnectSession" = (operation_id = "disconnect_session", parameters(("session_id" = "$response.body#/sessions/0/session_id")))),
        )),
        (status = 400, description = "bad_request: an unknown parameter, a bad limit or transport, or scope neither local nor cluster; invalid_name: a bad client_id or topic", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "client_id" | "topic" | "transport" | "limit" | "after")) {
        return Err(ApiError::bad_request(format!("unknown parameter {unknown:?}; use client_id, topic, transport, limit or after")));
    }
    let limit = super::page_limit(&query, DEFAULT_PAGE, MAX_PAGE)?;
    let client_id = query.get("client_id").map(|c| ClientId::parse(c)).transpose().map_err(|e| ApiError::invalid_name(e.0))?;
    let topic = query.get("topic").map(|t| TopicName::parse(t)).transpose().map_err(|e| ApiError::invalid_name(e.0))?;
    let transport = query.get("transport").map(String::as_str);
    if let Some(unknown) = transport.filter(|t| !matches!(*t, "websocket" | "sse" | "group")) {
        return Err(ApiError::bad_request(format!("transport must be websocket, sse or group, got {unknown:?}")));
    }
    let after = query.get("after").map(String::as_str);
    if let Some(after) = after.filter(|a| a.is_empty() || a.len() > 128) {
        return Err(ApiError::bad_request(format!("after must be the `next` of a previous page (a session id of 1 to 128 characters), got {after:?}")));
    }
    let mut sessions: Vec<_> = app
        .dispatcher
        .sessions()
        .into_iter()
        .filter(|s| client_id.as_ref().is_none_or(|c| *c == s.client_id))
        .filter(|s| transport.is_none_or(|t| t == s.transport.as_str()))
        .filter(|s| topic.as_ref().is_none_or(|t| s.subscriptions.lock().unwrap_or_else(|e| e.into_inner()).contains(t)))
        .filter(|s| after.is_none_or(|after| s.session_id.as_str() > after))
        .collect();
    // In session id order, so `after` pages through them.
    sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    let more = sessions.len() > limit;
    sessions.truncate(limit);
    let mut body = json!({ "sessions": sessions.iter().map(|s| session_json(s)).collect::<Vec<_>>() });
    if more {
        body["next"] = json!(sessions.last().map(|s| s.session_id.clone()));
    }
    Ok(Json(body))
}

/// Sessions per page of `GET /admin/sessions` unless `limit` says otherwise, and the most one
/// page holds.
const DEFAULT_PAGE: usize = 1000;
const MAX_PAGE: usize = 10_000;

fn missing(session_id: &str) -> ApiError {
    ApiError::not_found(format!("no live session {session_id}"))
}

#[utoipa::path(
    get,
    path = "/admin/sessions/{session_id}",
    operation_id = "get_session",
    tag = "sessions",
    summary = "One session with its in-flight deliveries",
    params(("session_id" = String, Path, description = "session id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::SessionDetail),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "not_found", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the session did not answer in time", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn detail(State(app): State<AppState>, Path(session_id): Path<String>) -> Result<Json<Value>, ApiError> {
    let info = app.dispatcher.session(&session_id).ok_or_else(|| missing(&session_id))?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    if !app.dispatcher.control(&session_id, SessionControl::Describe(reply)) {
        return Err(missing(&session_id));
    }
    // A session blocked on a client that stopped reading must not hang the operator's request.
    let deliveries = match tokio::time::timeout(DESCRIBE_TIMEOUT, answer).await {
        Ok(Ok(deliveries)) => deliveries,
        // Dropped unanswered: the session ended, or it has too many requests waiting already.
        Ok(Err(_)) if app.dispatcher.session(&session_id).is_none() => return Err(missing(&session_id)),
        Ok(Err(_)) => return Err(busy(&session_id)),
        Err(_) => return Err(busy(&session_id)),
    };
    let mut body = session_json(&info);
    body["deliveries"] = json!(deliveries);
    Ok(Json(body))
}

/// 503 for a session that cannot answer now (blocked on a slow client or a slow store).
fn busy(session_id: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        crate::core::protocol::ErrorCode::Unavailable,
        format!("session {session_id} did not answer within {DESCRIBE_TIMEOUT:?} (blocked on a slow client or store?)"),
    )
}

#[utoipa::path(
    delete,
    path = "/admin/sessions/{session_id}",
    operation_id = "disconnect_session",
    tag = "sessions",
    summary = "Disconnect a session (close code 4002)",
    params(("session_id" = String, Path, description = "session id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::Disconnected),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "not_found", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn disconnect(State(app): State<AppState>, Path(session_id): Path<String>) -> Result<Json<Value>, ApiError> {
    if !app.dispatcher.control(&session_id, SessionControl::Disconnect) {
        return Err(missing(&session_id));
    }
    tracing::info!(%session_id, "session disconnected by an operator");
    Ok(Json(json!({ "disconnected": session_id })))
}
