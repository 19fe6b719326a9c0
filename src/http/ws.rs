//! `GET /ws?client_id=ID`: the handshake checks, then adapts the axum WebSocket to the
//! transport-free session task in `core::session`.

use std::collections::HashMap;
use std::future::ready;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};

use super::activity::Activity;
use super::auth::{log_refused_credentials, session_access, session_token};
use super::error::ApiError;
use super::lingering::PeerAddr;
use super::AppState;
use crate::core::access::Access;
use crate::core::protocol::{close_code, ErrorCode, ServerFrame};
use crate::core::session::{run_session, Inbound, Outbound, WriteProgress};
use crate::core::session_registry::{Registration, Transport};

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
    ws: WebSocketUpgrade,
) -> Response {
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
    // Refused credentials are said inside the socket: a browser cannot read the status of a
    // refused handshake, and a page would see a bad token as an outage and retry it forever.
    // The session never starts (PROTOCOL.md: an `error` frame, then 1008, a final close).
    let access = match session_access(&app.config.auth, &app.token_keys, token, &headers, &client_id) {
        Ok(access) => access,
        Err(e) => {
            log_refused_credentials(&client_id, remote, &e);
            let tasks = app.dispatcher.tasks.clone();
            return ws.on_upgrade(move |socket| async move {
                let _running = tasks.token();
                refuse(socket, e.code, e.message, close_code::POLICY).await
            });
        }
    };
    if app.dispatcher.draining.is_cancelled() {
        return draining(&app.config);
    }
    let remote = Some(remote);
    let max_frame = app.config.limits.max_frame_bytes;
    ws.max_message_size(max_frame).max_frame_size(max_frame).read_buffer_size(app.config.limits.ws_read_buffer_bytes).on_upgrade(move |socket| async move {
        match app.dispatcher.register(client_id, remote, Transport::WebSocket) {
            // A task of its own, counted by the shutdown drain until the session ends: the
            // upgrade task (axum's future around this one) then ends at once instead of living
            // as long as the session (README "Where the memory goes").
            Ok(registration) => {
                let tasks = app.dispatcher.tasks.clone();
                let progress = activity.map(|Extension(a)| a as Arc<dyn WriteProgress>);
                tasks.spawn(serve_socket(app, registration, access, socket, progress));
            }
            Err(e) => {
                let _running = app.dispatcher.tasks.token();
                refuse(socket, e.code, e.message, close_code::TRY_AGAIN_LATER).await
            }
        }
    })
}

/// An `error` frame that says why, then the close: 1013 "try again later" for a full instance,
/// 1008 for credentials refused (final: the client must not reconnect by itself).
async fn refuse(mut socket: WebSocket, code: ErrorCode, message: String, close: u16) {
    let frame = ServerFrame::Error { code, message, req: None }.to_json();
    let _ = socket.send(Message::Text(frame.into())).await;
    let reason = match (close, code) {
        (close_code::POLICY, _) => code.as_str(),
        (_, ErrorCode::LimitExceeded) => "session limit reached",
        _ => "try again later",
    };
    let _ = socket.send(Message::Close(Some(CloseFrame { code: close, reason: reason.into() }))).await;
}

enum Received {
    Frame(Inbound),
    End,
}

fn receive(message: Result<Message, axum::Error>) -> Received {
    match message {
        Ok(Message::Text(text)) => Received::Frame(Inbound::Text(text.as_str().to_owned())),
        Ok(Message::Binary(_)) => Received::Frame(Inbound::Binary),
        // tungstenite answers pings itself; both are signs of life for the dead-peer check.
        Ok(Message::Ping(_) | Message::Pong(_)) => Received::Frame(Inbound::Alive),
        Ok(Message::Close(_)) => Received::End,
        Err(e) if is_too_large(&e) => Received::Frame(Inbound::TooLarge),
        Err(_) => Received::End,
    }
}

/// Feeds a real WebSocket to a session. Not an `async fn`: the session's task is then
/// `run_session`'s future alone; an async wrapper would keep its own arguments (the whole
/// `AppState`, the socket's moved-out place) beside it for the session's whole life.
fn serve_socket(
    app: AppState,
    registration: Registration,
    access: Access,
    socket: WebSocket,
    progress: Option<Arc<dyn WriteProgress>>,
) -> impl std::future::Future<Output = ()> + Send {
    let (sink, stream) = socket.split();
    let inbound = stream.map(receive).take_while(|r| ready(!matches!(r, Received::End))).filter_map(|r| {
        ready(match r {
            Received::Frame(frame) => Some(frame),
            Received::End => None,
        })
    });
    let outbound = sink.with(|frame: Outbound| {
        ready(Ok::<_, axum::Error>(match frame {
            Outbound::Text(text) => Message::Text(text.into()),
            Outbound::Shared(event) => Message::Text(event.text.into()),
            Outbound::Close(code, reason) => Message::Close(Some(CloseFrame { code, reason: reason.into() })),
            // Only a group's hub sends `SharedGone`, and no socket carries a hub.
            Outbound::Ping | Outbound::SharedGone(..) => Message::Ping(Default::default()),
        }))
    });
    run_session(app.dispatcher.clone(), registration, access, Box::pin(inbound), Box::pin(outbound), progress)
}

/// tungstenite reports a frame over the limit as a capacity error ("Space limit exceeded").
fn is_too_large(e: &axum::Error) -> bool {
    let text = e.to_string();
    text.contains("Space limit exceeded") || text.contains("too long") || text.contains("too big")
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
