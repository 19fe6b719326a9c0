//! `GET /admin/dead-letters?topic=&client_id=`

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::core::names::{ClientId, TopicName};

#[utoipa::path(
    get,
    path = "/admin/dead-letters",
    tag = "dead letters",
    summary = "Dead letters (max_attempts or term)",
    params(("topic" = Option<String>, Query, description = "exact topic"), ("client_id" = Option<String>, Query, description = "exact client id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::DeadLetterList),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "topic" | "client_id")) {
        return Err(ApiError::bad_request(format!("unknown filter {unknown:?}; use topic or client_id")));
    }
    let topic = query.get("topic").map(|t| TopicName::parse(t)).transpose().map_err(|e| ApiError::invalid_name(e.0))?;
    let client = query.get("client_id").map(|c| ClientId::parse(c)).transpose().map_err(|e| ApiError::invalid_name(e.0))?;
    let rows: Vec<Value> = app
        .dispatcher
        .store
        .dead_letters(topic.as_ref(), client.as_ref())?
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
    Ok(Json(json!({ "dead_letters": rows })))
}
