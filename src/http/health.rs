//! `GET /healthz` (the process answers) and `GET /readyz` (offset store open, backend reachable,
//! not shutting down: what peers probe before they send clients here).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::core::names::{ClientId, OffsetKey, TopicName};

/// Also names the instance.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    summary = "Liveness",
    responses(
        (status = 200, body = crate::http::schemas::Health),
    )
)]
pub async fn healthz(State(app): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({"status": "ok", "instance": app.dispatcher.instance}))
}

/// What `/readyz` answers, and `ackgate_ready` and `ackgate_backend_up` report.
pub struct Readiness {
    /// The store answers a read and takes writes, the backend is ready, and the instance is
    /// neither stopping nor draining.
    pub ready: bool,
    pub store_ok: bool,
    pub backend_ok: bool,
    pub shutting_down: bool,
}

pub async fn readiness(app: &AppState) -> Readiness {
    let d = &app.dispatcher;
    // Reading any key proves the store answers.
    let probe = OffsetKey::new(TopicName::parse("readyz").unwrap(), ClientId::parse("readyz").unwrap(), 0);
    let store_ok = d.store.read(&probe).is_ok() && d.store.write_failure().is_none();
    let backend_ok = d.backend.is_ready().await;
    let shutting_down = d.shutdown.is_cancelled() || d.draining.is_cancelled();
    Readiness { ready: store_ok && backend_ok && !shutting_down, store_ok, backend_ok, shutting_down }
}

#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    summary = "Readiness: offset store open, backend reachable",
    responses(
        (status = 200, body = crate::http::schemas::Readiness),
        (status = 503, description = "not ready", body = crate::http::schemas::Readiness),
    )
)]
pub async fn readyz(State(app): State<AppState>) -> Response {
    let d = &app.dispatcher;
    let Readiness { ready, store_ok, backend_ok, shutting_down } = readiness(&app).await;
    let body = json!({
        "ready": ready,
        // Peers read it when they probe (`cluster`).
        "instance": d.instance,
        "offset_store": if store_ok { "ok" } else { "failing" },
        "backend": if backend_ok { "ok" } else { "unreachable" },
        "shutting_down": shutting_down,
        // Served by a ready backend but unavailable themselves (a RocketMQ route that would
        // renumber them): their problem, not the instance's.
        "topics_unavailable": d.backend.unavailable_topics(),
    });
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}
