//! `GET /session/recommend?client_id=` (or `?group=`): the live instance this client (or this
//! shared subscription's members) should use.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::forwarded::Forwarded;
use super::AppState;

#[utoipa::path(
    get,
    path = "/session/recommend",
    operation_id = "recommend_instance",
    tag = "cluster",
    summary = "The live instance this client should use (rendezvous hashing)",
    params(
        ("client_id" = Option<String>, Query, description = "client id; one of client_id and group is required (400 without either)", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128),
        ("group" = Option<String>, Query, description = "a shared subscription's group: the instance it lives on (instead of client_id's)", pattern = r"^[A-Za-z0-9._-]+$", min_length = 1, max_length = 249),
    ),
    responses(
        (status = 200, body = crate::http::schemas::Recommendation),
        (status = 400, description = "invalid_name, or bad_request: neither client_id nor group", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn recommend(
    State(app): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    forwarded: Option<Extension<Forwarded>>,
) -> Result<impl IntoResponse, ApiError> {
    // A group lives where rendezvous hashing on its name points, as a client does on its id,
    // but a peer that missed probes keeps its groups a while (`Cluster::group_home`).
    let available = !app.dispatcher.draining.is_cancelled();
    let mut chosen = match query.get("group") {
        Some(group) => app.cluster.group_home(crate::core::names::GroupName::parse(group).map_err(|e| ApiError::invalid_name(e.0))?.as_str(), available),
        None => app.cluster.recommend(super::required_client_id(&query)?.as_str(), available),
    };
    if chosen.instance == app.dispatcher.instance && app.config.server.public_url.is_empty() {
        // No public_url: this instance's default URL is its listen address (0.0.0.0 on a server,
        // or a proxy's upstream): the URL this very request came in by is one the client can reach.
        let scheme = forwarded.as_ref().and_then(|f| f.scheme).unwrap_or(if app.config.server.tls_cert.is_empty() { "http" } else { "https" });
        let host = forwarded.as_ref().and_then(|f| f.host.clone()).or_else(|| headers.get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string));
        if let Some(origin) = host.and_then(|h| crate::config::origin::parse_origin(&format!("{scheme}://{h}"))) {
            chosen.http_url = origin.to_string();
        }
    }
    // Readable from any origin: a browser page served by one instance asks the others when its
    // own is gone (the answer is the same public information to everyone).
    // Built from the request (its Host, a proxy's headers): never reused from a cache.
    let anyone = [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"), (header::CACHE_CONTROL, "no-store")];
    Ok((anyone, Json(json!({"instance": chosen.instance, "ws_url": chosen.ws_url(), "http_url": chosen.http_url}))))
}
