//! `POST /admin/drain`: start draining this instance without exiting (what SIGTERM does before
//! it exits): not ready, no new sessions (503 with `Retry-After`), and its sessions closed over
//! `server.drain_ms`, each with a `reconnect` frame and 1012 (`core::drain`).

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;

#[utoipa::path(
    post,
    path = "/admin/drain",
    operation_id = "drain",
    tag = "sessions",
    summary = "Drain this instance: not ready, no new sessions, sessions closed with reconnect and 1012 over server.drain_ms",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "draining (already_draining: an earlier drain runs; this call changed nothing)", body = crate::http::schemas::Draining),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn drain(State(app): State<AppState>) -> Json<Value> {
    let sessions = app.dispatcher.sessions().len();
    let drain_ms = app.config.server.drain_ms;
    let started = crate::core::drain::start_drain(&app.dispatcher, Duration::from_millis(drain_ms));
    if started {
        tracing::info!(sessions, drain_ms, "drain started by an operator");
    }
    Json(json!({"draining": true, "already_draining": !started, "sessions": sessions, "drain_ms": drain_ms}))
}
