//! `GET /admin/gaps?topic=&client_id=&limit=&after=`: the gaps reported to clients (events that
//! retention removed before the client read them), one page at a time, like dead letters.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::dead_letters::page_query;
use super::error::ApiError;
use super::AppState;

#[utoipa::path(
    get,
    path = "/admin/gaps",
    operation_id = "list_gaps",
    tag = "dead letters",
    summary = "Gaps reported to clients (events removed by retention before they were read), one page at a time",
    params(
        ("scope" = Option<String>, Query, description = "local: this instance, rows with their instance; cluster: every cluster.peers instance too, plus unreachable and next_by_instance; absent: this instance, as before", pattern = r"^(local|cluster)$"),
        ("topic" = Option<String>, Query, description = "exact topic (`parent@lite` for a RocketMQ lite topic)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499),
        ("client_id" = Option<String>, Query, description = "exact client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128),
        ("limit" = Option<u32>, Query, description = "gaps per page, 1 to 1000 (default 100)", minimum = 1, maximum = 1000),
        ("after" = Option<String>, Query, description = "the `next` of the previous page (`topic#client_id#partition#from`)", pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?#[A-Za-z0-9._:@-]{1,128}#[0-9]{1,9}#[0-9]{1,19}$"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 200, body = crate::http::schemas::GapList),
        (status = 400, description = "bad_request / invalid_name", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "no admin token (when auth.admin_token is set)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "wrong admin token", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let query = page_query(query)?;
    let store = app.dispatcher.store.clone();
    // A client filter without a topic reads every gap: off the async workers.
    let page = tokio::task::spawn_blocking(move || store.gaps(&query))
        .await
        .map_err(|e| ApiError::from(crate::core::offsets::StoreError::Io(format!("listing gaps failed: {e}"))))??;
    let rows: Vec<Value> = page
        .gaps
        .into_iter()
        .map(|g| json!({"topic": g.topic.as_str(), "client_id": g.client_id.as_str(), "partition": g.partition, "from": g.from, "to": g.to, "at": g.at}))
        .collect();
    let mut body = json!({ "gaps": rows });
    if let Some(next) = page.next {
        body["next"] = json!(next.to_string());
    }
    Ok(Json(body))
}
