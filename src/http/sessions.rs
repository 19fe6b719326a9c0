//! `/admin/sessions`: live sessions, one session with its in-flight deliveries, disconnect.

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

use super::error::ApiError;
use super::AppState;
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
    summary = "Live sessions and their counters",
    params(("scope" = Option<String>, Query, description = "local: this instance, rows with their instance; cluster: every cluster.peers instance too, plus unreachable and next_by_instance; absent: this instance, as before", pattern = r"^(local|cluster)$")),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::SessionList, links(
            ("GetSession" = (operation_id = "get_session", parameters(("session_id" = "$response.body#/sessions/0/session_id")))),
            ("DisconnectSession" = (operation_id = "disconnect_session", parameters(("session_id" = "$response.body#/sessions/0/session_id")))),
        )),
        (status = 400, description = "bad_request: scope is neither local nor cluster", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>) -> Json<Value> {
    let sessions: Vec<Value> = app.dispatcher.sessions().iter().map(|s| session_json(s)).collect();
    Json(json!({ "sessions": sessions }))
}

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
