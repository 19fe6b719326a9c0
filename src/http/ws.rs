//! `GET /ws?client_id=ID`: the handshake and its checks, then the upgraded socket
//! (`ws_connection`) handed to the transport-free session task in `core::session`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::SinkExt;
use hyper_util::rt::TokioIo;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::activity::Activity;
use super::auth::{log_refused_credentials, session_access, session_token};
use super::error::ApiError;
use super::lingering::PeerAddr;
use super::ws_connection::WebSocketConnection;
use super::AppState;
use crate::core::protocol::{close_code, ErrorCode, ServerFrame};
use crate::core::session::{run_session, Outbound, WriteProgress};
use crate::core::session_registry::Transport;

#[utoipa::path(
    get,
    path = "/ws",
    operation_id = "open_websocket",
    tag = "websocket",
    summary = "Open a WebSocket session (frames: ClientFrame in, ServerFrame out)",
    params(("client_id" = String, Query, description = "client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128), ("token" = Option<String>, Query, description = "JWT when auth.jwt_secret or auth.jwks_url is set (or Authorization: Bearer)")),
    responses(
        (status = 101, description = "Switching protocols. Then text frames: the client sends ClientFrame objects, the gateway sends ServerFrame objects (see components)."),
        (status = 400, description = "invalid_name: client_id missing or invalid", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "forbidden: the Origin, Host or Fetch Metadata is refused (server.allowed_origins, server.allowed_hosts). Refused credentials (a token missing or invalid, or for another client) are not refused here: the upgrade goes through, then an error frame (unauthorized or forbidden) and close 1008", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn upgrade(
    State(app): State<AppState>,
    ConnectInfo(PeerAddr(remote)): ConnectInfo<PeerAddr>,
    activity: Option<Extension<Arc<Activity>>>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    request: Request,
) -> Response {
    let handshake = match Handshake::of(request) {
        Ok(handshake) => handshake,
        Err(refused) => return *refused,
    };
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return ApiError::bad_request(e.body_text()).into_response(),
    };
    let client_id = match super::required_client_id(&query) {
        Ok(client_id) => client_id,
        Err(e) => return e.into_response(),
    };
    let token = query.get("token").map(String::as_str);
    app.token_keys.prepare(session_token(token, &headers)).await;
    let max_frame = app.config.limits.max_frame_bytes;
    let read_size = app.config.limits.ws_read_buffer_bytes;
    // Refused credentials are said inside the socket: a browser cannot read the status of a
    // refused handshake, and a page would see a bad token as an outage and retry it forever.
    // The session never starts (PROTOCOL.md: an `error` frame, then 1008, a final close).
    let access = match session_access(&app.config.auth, &app.token_keys, token, &headers, &client_id) {
        Ok(access) => access,
        Err(e) => {
            log_refused_credentials(&client_id, remote, &e);
            return handshake.accept(app.dispatcher.tasks.token(), move |socket| async move {
                refuse(WebSocketConnection::new(socket, max_frame, read_size), e.code, e.message, close_code::POLICY).await
            });
        }
    };
    if app.dispatcher.draining.is_cancelled() {
        return draining(&app.config);
    }
    let remote = Some(remote);
    handshake.accept(app.dispatcher.tasks.token(), move |socket| async move {
        let socket = WebSocketConnection::new(socket, max_frame, read_size);
        match app.dispatcher.register(client_id, remote, Transport::WebSocket) {
            // A task of its own, counted by the shutdown drain until the session ends: the
            // upgrade task (the future around this one) then ends at once instead of living
            // as long as the session (README "Where the memory goes").
            Ok(registration) => {
                let tasks = app.dispatcher.tasks.clone();
                let progress = activity.map(|Extension(a)| a as Arc<dyn WriteProgress>);
                tasks.spawn(run_session(app.dispatcher.clone(), registration, access, socket, progress));
            }
            Err(e) => refuse(socket, e.code, e.message, close_code::TRY_AGAIN_LATER).await,
        }
    })
}

/// The socket a WebSocket runs on once upgraded.
type UpgradedSocket = TokioIo<hyper::upgrade::Upgraded>;

/// A request to upgrade to a WebSocket (RFC 6455 section 4.2.1), checked.
struct Handshake {
    accept_key: String,
    on_upgrade: hyper::upgrade::OnUpgrade,
}

impl Handshake {
    fn of(mut request: Request) -> Result<Self, Box<Response>> {
        if request.method() != Method::GET {
            return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, ErrorCode::BadRequest, "a WebSocket handshake is a GET").into_response().into());
        }
        let headers = request.headers();
        let has_token = |name: header::HeaderName, token: &str| {
            headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        if request.version() < Version::HTTP_11 || !has_token(header::CONNECTION, "upgrade") || !has_token(header::UPGRADE, "websocket") {
            return Err(ApiError::bad_request("not a WebSocket handshake: HTTP/1.1 with Connection: upgrade and Upgrade: websocket").into_response().into());
        }
        if headers.get(header::SEC_WEBSOCKET_VERSION).is_none_or(|v| v.as_bytes() != b"13") {
            // RFC 6455 section 4.4: the versions this server speaks, in the refusal.
            let mut response = ApiError::bad_request("Sec-WebSocket-Version must be 13").into_response();
            response.headers_mut().insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
            return Err(Box::new(response));
        }
        let mut keys = headers.get_all(header::SEC_WEBSOCKET_KEY).iter();
        let key = match (keys.next(), keys.next()) {
            (Some(key), None) if is_handshake_key(key.as_bytes()) => key.as_bytes(),
            _ => return Err(ApiError::bad_request("Sec-WebSocket-Key must be one base64 value of 16 bytes").into_response().into()),
        };
        let accept_key = accept_key(key);
        let Some(on_upgrade) = request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(ApiError::bad_request("this connection cannot be upgraded").into_response().into());
        };
        Ok(Self { accept_key, on_upgrade })
    }

    /// The 101 answer; `serve` gets the socket once hyper has written it, in a task that holds
    /// `running` (a token of the gateway's tasks: its shutdown waits for the upgrade and for what
    /// `serve` does with the socket, a refusal or handing it to a session task of its own).
    fn accept<F, Fut>(self, running: TaskTrackerToken, serve: F) -> Response
    where
        F: FnOnce(UpgradedSocket) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let Handshake { accept_key, on_upgrade } = self;
        tokio::spawn(async move {
            let _running = running;
            match on_upgrade.await {
                Ok(upgraded) => serve(TokioIo::new(upgraded)).await,
                Err(e) => tracing::debug!(error = %e, "WebSocket upgrade failed"),
            }
        });
        let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(value) = HeaderValue::from_str(&accept_key) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, value);
        }
        response
    }
}

/// A client's `Sec-WebSocket-Key`: base64 of 16 bytes (RFC 6455 section 4.1).
fn is_handshake_key(key: &[u8]) -> bool {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(key).is_ok_and(|bytes| bytes.len() == 16)
}

/// `Sec-WebSocket-Accept`: base64 of the SHA-1 of the client's key and RFC 6455's GUID.
fn accept_key(key: &[u8]) -> String {
    use base64::Engine;
    let mut context = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    context.update(key);
    context.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(context.finish())
}

/// An `error` frame that says why, then the close: 1013 "try again later" for a full instance,
/// 1008 for credentials refused (final: the client must not reconnect by itself).
async fn refuse(mut socket: WebSocketConnection<UpgradedSocket>, code: ErrorCode, message: String, close: u16) {
    let frame = ServerFrame::Error { code, message, req: None }.to_json();
    let reason = match (close, code) {
        (close_code::POLICY, _) => code.as_str(),
        (_, ErrorCode::LimitExceeded) => "session limit reached",
        _ => "try again later",
    };
    let _ = socket.feed(Outbound::Text(frame)).await;
    let _ = socket.send(Outbound::Close(close, reason.to_string())).await;
}

/// The answer to a new session while the instance drains: 503 `unavailable`, with `Retry-After`
/// (the drain window in seconds: by then this instance is gone or back).
pub fn draining(config: &crate::config::Config) -> Response {
    let retry_after = config.server.drain_ms.div_ceil(1000).max(1).to_string();
    let mut response = ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        crate::core::protocol::ErrorCode::Unavailable,
        "this instance is draining; connect to another (GET /session/recommend)",
    )
    .into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&retry_after) {
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_accept_key_is_rfc_6455s_example() {
        assert_eq!(super::accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(super::is_handshake_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        for key in [&b""[..], b"short", b"dGhlIHNhbXBsZSBub25jZQ", b"dGhlIHNhbXBsZSBub25jZSE=", b"not base64!!not base64!!"] {
            assert!(!super::is_handshake_key(key), "{key:?}");
        }
    }
}
