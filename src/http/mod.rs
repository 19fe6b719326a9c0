//! The HTTP edge: one `router(state)` shared by the binary and the tests. Each REST resource has
//! its own file; errors map to status and code in `error`; the WebSocket lives in `ws` (its
//! handshake), `ws_connection` and `ws_codec` (its frames), Server-Sent
//! Events in `sse`; every
//! accepted connection drains before it closes (`lingering`).

pub(crate) mod activity;
pub(crate) mod auth;
pub(crate) mod certificate_expiry;
pub(crate) mod cluster_scope;
pub(crate) mod connection_counts;
pub(crate) mod connections;
pub(crate) mod console;
pub(crate) mod dead_letters;
pub(crate) mod drain;
pub(crate) mod error;
pub(crate) mod exposure;
pub(crate) mod fetch;
pub(crate) mod forwarded;
pub(crate) mod gaps;
pub(crate) mod groups;
pub(crate) mod health;
pub(crate) mod lingering;
pub(crate) mod metrics;
pub(crate) mod offsets;
pub mod openapi;
pub(crate) mod recommend;
pub mod reload;
pub(crate) mod request_log;
pub(crate) mod schemas;
pub(crate) mod sessions;
pub(crate) mod sse;
pub(crate) mod tls;
pub(crate) mod topics;
pub(crate) mod ws;
pub(crate) mod ws_codec;
pub(crate) mod ws_connection;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post, put};
use axum::Router;

use crate::cluster::Cluster;
use crate::config::Config;
use crate::core::dispatcher::Dispatcher;
use crate::core::protocol::ErrorCode;
use error::ApiError;

#[derive(Clone)]
pub struct AppState {
    pub dispatcher: Arc<Dispatcher>,
    pub config: Arc<Config>,
    pub cluster: Arc<Cluster>,
    /// Open connections, counted by the accept loop (`connections`).
    pub connections: Arc<connections::ConnectionCounts>,
    /// The Origin and Host checks, prepared from the configuration (a reload replaces them).
    pub exposure: Arc<crate::core::live::Live<exposure::Exposure>>,
    /// Publishes with an `Idempotency-Key`.
    pub publisher: Arc<crate::core::idempotency::IdempotentPublisher>,
    /// Server-Sent Events sessions, where their POSTed frames go.
    pub sse: Arc<sse::SseSessions>,
    /// The bounds `GET /topics` lists, at most a second old (anyone may ask for them).
    pub listed_bounds: Arc<crate::core::bounds_cache::BoundsCache>,
    /// The keys JWTs are checked with (`auth.jwt_secret`, `auth.jwks_url`).
    pub token_keys: Arc<auth::TokenKeys>,
    /// Reads the config file again (`POST /admin/reload`, SIGHUP).
    pub reload: Arc<dyn reload::ConfigReload>,
    /// The certificate in use, with `server.tls_cert` (its expiry is a metric).
    pub tls: Option<Arc<tls::Tls>>,
}

pub fn router(state: AppState) -> Router {
    let admin = middleware::from_fn_with_state(state.clone(), auth::require_admin_token);
    let publish = middleware::from_fn_with_state(state.clone(), auth::require_publish_right);
    // The list routes answer for the whole cluster with `?scope=cluster`.
    let scoped = middleware::from_fn_with_state(state.clone(), cluster_scope::scope);
    // A client's records changed on every instance with `?scope=cluster`.
    let changed = middleware::from_fn_with_state(state.clone(), cluster_scope::scope_change);
    let guarded = Router::new()
        .route("/admin/offsets", get(offsets::list).layer(scoped.clone()))
        .route("/admin/offsets/{topic}/{client_id}", get(offsets::client_view).merge(axum::routing::delete(offsets::delete).layer(changed.clone())))
        .route("/admin/offsets/{topic}/{client_id}/{partition}", put(offsets::reset).layer(changed.clone()))
        .route("/admin/sessions", get(sessions::list).layer(scoped.clone()))
        .route("/admin/sessions/{session_id}", get(sessions::detail).delete(sessions::disconnect))
        .route("/admin/dead-letters", get(dead_letters::list).layer(scoped.clone()))
        .route("/admin/dead-letters/redrive", post(dead_letters::redrive).layer(changed.clone()))
        .route("/admin/dead-letters/delete", post(dead_letters::delete).layer(changed))
        .route("/admin/gaps", get(gaps::list).layer(scoped.clone()))
        .route("/admin/groups", get(groups::list).layer(scoped))
        .route("/admin/groups/{topic}/{group}", get(groups::view).delete(groups::delete))
        .route("/admin/groups/{topic}/{group}/{partition}", put(groups::reset))
        .route("/admin/drain", post(drain::drain))
        .route("/admin/reload", post(reload::reload))
        .route_layer(admin.clone());
    Router::new()
        .route("/ws", get(ws::upgrade))
        .route("/sse", get(sse::open))
        .route("/sse/{session_id}/frames", post(sse::frames))
        // The admin token, or a JWT whose `publish` claim allows the topic.
        .route("/topics/{topic}/events", post(topics::publish).layer(publish))
        // Creating and deleting topics change what every client sees: admin, like publishing.
        .route("/topics", get(topics::list).merge(post(topics::create).layer(admin.clone())))
        .route("/topics/{topic}", axum::routing::delete(topics::delete).layer(admin))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::scrape))
        .route("/", get(console::index))
        .route("/openapi.json", get(openapi::document_route))
        .route("/static/{file}", get(console::static_file))
        .route("/session/recommend", get(recommend::recommend))
        .merge(guarded)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(error::json_error_bodies))
        // Before auth and before any body is read: a hostile page gets nothing but a 403.
        .layer(middleware::from_fn_with_state(state.clone(), exposure::guard))
        // Bodies read by extractors (JSON bodies) are bounded like publish bodies.
        .layer(axum::extract::DefaultBodyLimit::max(state.config.limits.max_body_bytes))
        .layer(middleware::from_fn(metrics::count_requests))
        .layer(middleware::from_fn(request_log::log_request))
        .with_state(state)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("no route {} {}", request.method(), request.uri().path()))
}

async fn method_not_allowed(request: Request) -> ApiError {
    let message = format!("{} is not allowed on {}", request.method(), request.uri().path());
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, ErrorCode::BadRequest, message)
}

/// A small JSON request body, whatever its Content-Type (so plain `curl -d` works).
pub struct JsonBody<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::Bytes::from_request(request, state).await.map_err(|e| {
            let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE { ErrorCode::LimitExceeded } else { ErrorCode::BadRequest };
            ApiError::new(e.status(), code, e.body_text())
        })?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| ApiError::bad_request(format!("body is not of this route's shape: {e}")))
    }
}

/// The `client_id` a session route (`/ws`, `/sse`, `/session/recommend`) requires in its query.
pub fn required_client_id(query: &std::collections::HashMap<String, String>) -> Result<crate::core::names::ClientId, ApiError> {
    match query.get("client_id").map(|c| crate::core::names::ClientId::parse(c)) {
        Some(Ok(client_id)) => Ok(client_id),
        Some(Err(e)) => Err(ApiError::invalid_name(e.0)),
        None => Err(ApiError::invalid_name("the client_id query parameter is required")),
    }
}

/// The `limit` of a paged listing (`GET /admin/offsets`, `GET /admin/dead-letters`): `default`
/// when absent, else a whole number from 1 to `max`.
pub fn page_limit(query: &std::collections::HashMap<String, String>, default: usize, max: usize) -> Result<usize, ApiError> {
    match query.get("limit") {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be an integer from 1 to {max}, got {text:?}"))),
    }
}
