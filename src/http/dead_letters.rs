//! `GET /admin/dead-letters?topic=&client_id=&limit=&after=`: one page of dead letters.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::core::names::{ClientId, TopicName};
use crate::core::offsets::{DeadLetterId, DeadLetterQuery};

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
        ("topic" = Option<String>, Query, description = "exact topic", pattern = r"^[A-Za-z0-9._-]+$", min_length = 1, max_length = 249),
        ("client_id" = Option<String>, Query, description = "exact client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128),
        ("limit" = Option<u32>, Query, description = "dead letters per page, 1 to 1000 (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "the `next` of the previous page (`topic#client_id#partition#offset`)", pattern = r"^[A-Za-z0-9._-]{1,249}#[A-Za-z0-9._:@-]{1,128}#[0-9]{1,9}#[0-9]{1,19}$"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::DeadLetterList),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
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
        .map(|text| DeadLetterId::parse(text).ok_or_else(|| ApiError::bad_request(format!("after must be the `next` of a previous page (topic#client_id#partition#offset), got {text:?}"))))
        .transpose()?;
    Ok(DeadLetterQuery {
        topic: query.get("topic").map(|t| TopicName::parse(t)).transpose().map_err(|e| ApiError::invalid_name(e.0))?,
        client_id: query.get("client_id").map(|c| ClientId::parse(c)).transpose().map_err(|e| ApiError::invalid_name(e.0))?,
        after,
        limit,
    })
}
