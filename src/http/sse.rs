//! Server-Sent Events: `GET /sse?client_id=ID&topics=T1,T2` streams a session's frames as
//! `text/event-stream`, and `POST /sse/{session_id}/frames` takes its client frames (a JSON
//! array) and answers with the frames the session sent for them. The session is the same task a
//! WebSocket gets (`core::session`); this file adapts the two HTTP halves to it.
//!
//! Every `event` message carries an `id:` that is the session's resume token when it was written
//! (`core::resume_token`): one token, issued to the client (or to its group, `group=`), naming
//! the durable committed offsets of every topic of the stream. A browser's EventSource sends it
//! back as `Last-Event-ID` when it reconnects, on any instance. The older form, base64url of
//! `{"<topic>": {"<partition>": offset or [offset, epoch]}}`, is still read (a client's claim:
//! applied as the WebSocket's map form is); a token that is neither, or is refused, never fails
//! the stream: `event: subscribed` says `"resume": "refused"` and why.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::auth::{log_refused_credentials, session_access, session_token};
use super::error::ApiError;
use super::lingering::PeerAddr;
use super::AppState;
use crate::core::dispatcher::Dispatcher;
use crate::core::names::{ClientId, GroupName, OffsetKey, TopicName};
use crate::core::protocol::{close_code, ErrorCode, ResumeOffset, ServerFrame};
use crate::core::resume_token::Holder;
use crate::core::session::{run_session, Inbound, Outbound};
use crate::core::session_registry::{SessionInfo, Transport};
use crate::core::transport::Duplex;

/// POSTed batches a session may have queued (each waits for its answer); one more is refused
/// with 429 at once instead of holding a connection until the session gets to it.
const INBOUND_QUEUED: usize = 16;
/// Frames the session may queue ahead of the stream: beyond them its writes wait, and a client
/// that stops reading meets the slow-client limit, as on a WebSocket.
const OUTBOUND_QUEUED: usize = 256;
/// Frames written in one chunk of the stream at most.
const FRAMES_PER_CHUNK: usize = 256;
/// How old the resume token in an event's id may be: reading it per chunk cost more than the
/// delivery itself (a store read per partition), and an older token only means the events since
/// come again after a reconnect, never a loss.
const TOKEN_REFRESH: Duration = Duration::from_millis(100);

/// The SSE sessions of this instance, by session id: where a POST finds its session.
#[derive(Default)]
pub struct SseSessions {
    sessions: Mutex<HashMap<String, SseSession>>,
}

#[derive(Clone)]
struct SseSession {
    client_id: ClientId,
    frames: mpsc::Sender<Inbound>,
}

impl SseSessions {
    fn get(&self, session_id: &str) -> Option<SseSession> {
        self.sessions.lock().unwrap().get(session_id).cloned()
    }
}

/// A session's entry in `SseSessions`, removed when its task ends, however it ends (a panic
/// included: a stale entry would take POSTs that no session answers).
struct Listed {
    sessions: Arc<SseSessions>,
    session_id: String,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.sessions.sessions.lock().unwrap().remove(&self.session_id);
    }
}

#[utoipa::path(
    get,
    path = "/sse",
    operation_id = "open_sse",
    tag = "websocket",
    summary = "Open a session over Server-Sent Events (text/event-stream; client frames by POST to its ack_url)",
    params(
        ("client_id" = String, Query, description = "client id", pattern = r"^[A-Za-z0-9._:@-]+$", min_length = 1, max_length = 128),
        ("topics" = Option<String>, Query, description = "topics to subscribe to at once, comma-separated"),
        ("group" = Option<String>, Query, description = "join this shared subscription of each of the topics (event ids are then the group's floor)", pattern = r"^[A-Za-z0-9._-]{1,249}$"),
        ("order" = Option<String>, Query, description = "with group: none (default) or key"),
        ("from" = Option<String>, Query, description = "committed (default), earliest or latest: where a partition without a stored offset or token starts; only for topics the resume token does not name"),
        ("resume" = Option<String>, Query, description = "a resume token (an event's id); the Last-Event-ID header wins"),
        ("token" = Option<String>, Query, description = "JWT when auth.jwt_secret or auth.jwks_url is set (or Authorization: Bearer)"),
        ("Last-Event-ID" = Option<String>, Header, description = "the resume token EventSource sends when it reconnects"),
    ),
    responses(
        (status = 200, description = "text/event-stream: welcome (with ack_url), subscribed per topic, then event, gap, reconnect, error and close messages; event messages carry the resume token as id. Refused credentials (a token missing or invalid: unauthorized; for another client: forbidden) are a stream too: an error message with the code, then close with 1008 (final), and no session", content_type = "text/event-stream"),
        (status = 400, description = "invalid_name, bad_request (a from that is none of its names; a resume token that does not verify is no error: subscribed says it was refused)", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "forbidden: the Origin, Host or Fetch Metadata is refused (server.allowed_origins, server.allowed_hosts)", body = crate::http::schemas::ErrorBody),
        (status = 429, description = "limit_exceeded: limits.max_sessions", body = crate::http::schemas::ErrorBody),
        (status = 503, description = "unavailable: the instance is draining (Retry-After) or the client's offsets are being changed", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn open(
    State(app): State<AppState>,
    ConnectInfo(PeerAddr(remote)): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    // A token whose key rotated in since the last fetch of the key set: fetched before the check.
    let token = query.as_ref().ok().and_then(|Query(q)| q.get("token").cloned());
    app.token_keys.prepare(session_token(token.as_deref(), &headers)).await;
    match start(app, remote, &headers, query) {
        Ok(response) => response,
        Err(refused) => *refused,
    }
}

fn start(
    app: AppState,
    remote: std::net::SocketAddr,
    headers: &HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, Box<Response>> {
    let Query(query) = query.map_err(|e| Box::new(ApiError::bad_request(e.body_text()).into_response()))?;
    let client_id = super::required_client_id(&query).map_err(|e| Box::new(e.into_response()))?;
    let access = session_access(&app.config.auth, &app.token_keys, query.get("token").map(String::as_str), headers, &client_id).map_err(|e| {
        log_refused_credentials(&client_id, remote, &e);
        Box::new(credentials_refused(&e))
    })?;
    let subscribes = initial_subscribes(&app.dispatcher, &query, headers).map_err(|e| Box::new(e.into_response()))?;
    // With `group=`, the stream's topics are that shared subscription's, and its events' ids are
    // the group's floor (what a member resumes the group with).
    let token_identity = match query.get("group").filter(|g| !g.is_empty()) {
        Some(group) => ClientId::of_group(&GroupName::parse(group).map_err(|e| Box::new(ApiError::invalid_name(e.0).into_response()))?),
        None => client_id.clone(),
    };
    if app.dispatcher.draining.is_cancelled() {
        return Err(Box::new(super::ws::draining(&app.config)));
    }
    let registration = app.dispatcher.register(client_id.clone(), Some(remote), Transport::Sse).map_err(|e| Box::new(ApiError::from(e).into_response()))?;
    let info = registration.info.clone();
    let session_id = info.session_id.clone();

    // Room for every initial subscribe (the session refuses those past its limit, each with an
    // error frame) besides the POSTed batches.
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUED + subscribes.len());
    for frame in subscribes {
        let _ = inbound_tx.try_send(Inbound::Text(frame));
    }
    let (outbound_tx, outbound_rx) = mpsc::channel(OUTBOUND_QUEUED);
    // Cancelled when the response body is dropped (the client went away): the session's
    // inbound ends with it, so the session ends at once instead of at its next write.
    let stream_gone = CancellationToken::new();
    let inbound = futures_util::stream::unfold(inbound_rx, |mut rx| async move { rx.recv().await.map(|frame| (frame, rx)) })
        .take_until(stream_gone.clone().cancelled_owned());
    let outbound = futures_util::sink::unfold(outbound_tx, |tx, frame: Outbound| async move { tx.send(frame).await.map(|()| tx) });

    app.sse.sessions.lock().unwrap().insert(session_id.clone(), SseSession { client_id, frames: inbound_tx.clone() });
    let listed = Listed { sessions: app.sse.clone(), session_id };
    let dispatcher = app.dispatcher.clone();
    app.dispatcher.tasks.spawn(async move {
        let _listed = listed;
        run_session(dispatcher, registration, access, Duplex { inbound: Box::pin(inbound), outbound: Box::pin(outbound) }, None).await;
    });

    let writer = StreamWriter {
        d: app.dispatcher.clone(),
        info,
        frames: outbound_rx,
        alive: inbound_tx,
        token_identity,
        token: None,
        keepalive: tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_millis(app.config.server.sse_keepalive_ms),
            Duration::from_millis(app.config.server.sse_keepalive_ms),
        ),
        ended: false,
        _gone: stream_gone.drop_guard(),
    };
    let body = futures_util::stream::unfold(writer, |mut writer| async move { writer.next_chunk().await.map(|chunk| (Ok::<_, Infallible>(chunk), writer)) });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx buffers responses unless told otherwise; a buffered stream delivers nothing live.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The `subscribe` frames for `topics=`, with `from` and the resume token (`Last-Event-ID`, else
/// `resume=`). `from` applies only to a topic the token does not name: EventSource reconnects
/// with its first URL, and `from=latest` on a topic the client already holds would skip what it
/// received but had not acknowledged. A token that does not verify goes to every topic, which
/// the session refuses (and says so) before it starts from the stored offsets.
fn initial_subscribes(d: &Dispatcher, query: &HashMap<String, String>, headers: &HeaderMap) -> Result<Vec<String>, ApiError> {
    let from = query.get("from").map(String::as_str).filter(|f| !f.is_empty()).unwrap_or("committed");
    if !matches!(from, "committed" | "earliest" | "latest") {
        return Err(ApiError::bad_request(format!("from must be committed, earliest or latest, got {from:?}")));
    }
    // A header that is not text is a token that does not verify.
    let header_token = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("?"));
    let text = header_token.filter(|t| !t.is_empty()).or(query.get("resume").map(String::as_str).filter(|t| !t.is_empty()));
    let token = text.map(|text| match decode_older_token(text) {
        Some(older) => SseResume::Older(older),
        // Which topics it names, when it verifies; the session checks the rest.
        None => SseResume::Issued(text.to_string(), d.token_key().open(text).ok().map(|t| t.topics.into_iter().map(|t| t.topic).collect())),
    });
    let group = query.get("group").filter(|g| !g.is_empty());
    let order = query.get("order").filter(|o| !o.is_empty());
    if order.is_some() && group.is_none() {
        return Err(ApiError::bad_request("order is a field of a shared subscription: it needs group"));
    }
    let mut frames = Vec::new();
    let mut named = std::collections::HashSet::new();
    // Each topic once: a URL naming one over and over would re-plan it as many times.
    for topic in query.get("topics").map(String::as_str).unwrap_or("").split(',').filter(|t| !t.is_empty() && named.insert(*t)) {
        let topic = TopicName::parse(topic).map_err(|e| ApiError::invalid_name(e.0))?;
        let mut frame = match &token {
            Some(SseResume::Older(older)) if older.contains_key(topic.as_str()) => {
                let resume = &older[topic.as_str()];
                let offsets: BTreeMap<String, u64> = resume.iter().map(|(p, r)| (p.to_string(), r.offset)).collect();
                let epochs: BTreeMap<String, u64> = resume.iter().map(|(p, r)| (p.to_string(), r.epoch)).collect();
                json!({"op": "subscribe", "topic": topic.as_str(), "from": "committed", "resume": offsets, "epochs": epochs})
            }
            Some(SseResume::Issued(text, named)) if named.as_ref().is_none_or(|n| n.iter().any(|t| t == topic.as_str())) => {
                json!({"op": "subscribe", "topic": topic.as_str(), "from": "committed", "resume": text})
            }
            _ => json!({"op": "subscribe", "topic": topic.as_str(), "from": from}),
        };
        if let Some(group) = group {
            frame["group"] = json!(group);
        }
        if let Some(order) = order {
            frame["order"] = json!(order);
        }
        frames.push(frame.to_string());
    }
    Ok(frames)
}

/// The resume token an SSE reconnect brought.
enum SseResume {
    /// The older form (`decode_older_token`).
    Older(BTreeMap<String, BTreeMap<u32, ResumeOffset>>),
    /// An issued token (or anything else, refused by the session), with the topics it names when
    /// it verifies.
    Issued(String, Option<Vec<String>>),
}

/// One partition of an older resume token: the offset, or `[offset, epoch]`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum TokenOffset {
    Offset(u64),
    WithEpoch(u64, u64),
}

/// An older resume token: base64url (no padding) of `{"<topic>": {"<partition>": offset or
/// [offset, epoch]}}`, an offset without an epoch of the oldest, 0. `None`: not one.
pub fn decode_older_token(text: &str) -> Option<BTreeMap<String, BTreeMap<u32, ResumeOffset>>> {
    if crate::core::resume_token::TokenKey::looks_like_token(text) {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')).ok()?;
    let parsed: BTreeMap<String, BTreeMap<String, TokenOffset>> = serde_json::from_slice(&bytes).ok()?;
    let mut token = BTreeMap::new();
    for (topic, partitions) in parsed {
        TopicName::parse(&topic).ok()?;
        let mut offsets = BTreeMap::new();
        for (partition, offset) in partitions {
            let resume = match offset {
                TokenOffset::Offset(offset) => ResumeOffset { offset, epoch: 0 },
                TokenOffset::WithEpoch(offset, epoch) => ResumeOffset { offset, epoch },
            };
            offsets.insert(partition.parse::<u32>().ok()?, resume);
        }
        token.insert(topic, offsets);
    }
    Some(token)
}

/// Turns a session's outbound frames into the event stream.
struct StreamWriter {
    d: Arc<Dispatcher>,
    info: Arc<SessionInfo>,
    frames: mpsc::Receiver<Outbound>,
    /// The session's inbound, for the sign of life a keepalive probe gets back: the stream
    /// itself is how an SSE peer is known to be there (a write to a gone peer drops the body).
    alive: mpsc::Sender<Inbound>,
    keepalive: tokio::time::Interval,
    /// Whose offsets the resume token holds: the client's, or its group's (`group=`).
    token_identity: ClientId,
    /// The last resume token, when it was read and for which subscriptions.
    token: Option<CachedToken>,
    ended: bool,
    _gone: tokio_util::sync::DropGuard,
}

impl StreamWriter {
    /// The next piece of the stream: the frames queued now (one resume token for all of them),
    /// or a keepalive comment; `None` once the session has closed.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        let first = tokio::select! {
            frame = self.frames.recv() => frame,
            _ = self.keepalive.tick() => return Some(Bytes::from_static(b": ka\n\n")),
        };
        let Some(first) = first else {
            self.ended = true;
            return None;
        };
        let mut frames = vec![first];
        while frames.len() < FRAMES_PER_CHUNK {
            match self.frames.try_recv() {
                Ok(frame) => frames.push(frame),
                Err(_) => break,
            }
        }
        // One resume token for the chunk's events.
        let token = match frames.iter().any(|f| matches!(f, Outbound::Text(json) if frame_type(json) == "event")) {
            true => Some(self.resume_token().await),
            false => None,
        };
        let mut chunk = String::new();
        for frame in frames {
            match frame {
                Outbound::Text(json) => {
                    let kind = frame_type(&json);
                    chunk.push_str("event: ");
                    chunk.push_str(kind);
                    chunk.push('\n');
                    if let Some(token) = token.as_deref().filter(|_| kind == "event") {
                        chunk.push_str("id: ");
                        chunk.push_str(token);
                        chunk.push('\n');
                    }
                    if kind == "reconnect" {
                        // A plain EventSource waits `retry` before it reconnects: the pause the
                        // draining instance asks for.
                        if let Some(after_ms) = serde_json::from_str::<serde_json::Value>(&json).ok().and_then(|v| v["after_ms"].as_u64()) {
                            chunk.push_str(&format!("retry: {after_ms}\n"));
                        }
                    }
                    if kind == "welcome" {
                        // The browser's usual pause, again: a `retry:` of an earlier stream (a
                        // drain's short one, a final close's day) would stick otherwise.
                        chunk.push_str(&format!("retry: {DEFAULT_RETRY_MS}\n"));
                    }
                    let data = if kind == "welcome" {
                        // The welcome object plus where to POST client frames.
                        format!("{},\"ack_url\":\"/sse/{}/frames\"}}", json.strip_suffix('}').unwrap_or(&json), self.info.session_id)
                    } else {
                        json
                    };
                    push_data(&mut chunk, &data);
                }
                // Only a group's hub sends these; no SSE session is one.
                Outbound::Shared(_) | Outbound::SharedGone(..) => {}
                Outbound::Ping => {
                    let _ = self.alive.try_send(Inbound::Alive);
                    chunk.push_str(": ka\n\n");
                }
                Outbound::Close(code, reason) => {
                    if is_final(code) {
                        // A plain EventSource reconnects after every end of stream; after a final
                        // close (taken over, credentials refused) it must not come back on its
                        // own, and the longest pause is the closest SSE has to "never".
                        chunk.push_str(&format!("retry: {FINAL_CLOSE_RETRY_MS}\n"));
                    }
                    chunk.push_str(&format!("event: close\ndata: {}\n\n", json!({"code": code, "reason": reason})));
                    self.ended = true;
                    break;
                }
            }
        }
        Some(Bytes::from(chunk))
    }

    /// The resume token: the client's committed offsets of its subscribed topics as the store
    /// held them at most `TOKEN_REFRESH` ago, read again at once when the subscriptions changed
    /// (a token without a new topic would send a reconnect to `from` for it).
    async fn resume_token(&mut self) -> String {
        let now = tokio::time::Instant::now();
        // Compared under the lock, copied only when the token is read again (once per chunk of
        // events, so no copy of the list on the common path).
        let topics = match self.token_identity.group() {
            // A member's stream (`group=`): the group's topics, its floor.
            Some(group) => {
                let groups = self.info.groups.lock().unwrap();
                let current: Vec<TopicName> = groups.iter().filter(|(_, g)| g.as_str() == group).map(|(t, _)| t.clone()).collect();
                if let Some(cached) = self.token.as_ref().filter(|c| now.duration_since(c.read_at) < TOKEN_REFRESH && c.topics == current) {
                    return cached.token.clone();
                }
                current
            }
            None => {
                let current = self.info.subscriptions.lock().unwrap();
                if let Some(cached) = self.token.as_ref().filter(|c| now.duration_since(c.read_at) < TOKEN_REFRESH && c.topics == *current) {
                    return cached.token.clone();
                }
                current.clone()
            }
        };
        let token = self.read_resume_token(&topics).await;
        self.token = Some(CachedToken { read_at: now, topics, token: token.clone() });
        token
    }

    /// One point read per partition (a prefix scan would walk every version an acking client
    /// left in the store's memtable), issued as one token. Every subscribed topic is named, even
    /// when a read fails: a partition left out resumes at the stored committed offset, while a
    /// topic left out would resume at `from` (`latest` skipping what the client holds).
    async fn read_resume_token(&self, topics: &[TopicName]) -> String {
        let mut token = Vec::with_capacity(topics.len());
        for topic in topics {
            let mut offsets = BTreeMap::new();
            let partitions = match self.d.backend.partitions(topic).await {
                Ok(n) => n.unwrap_or(0),
                Err(e) => {
                    tracing::warn!(session_id = %self.info.session_id, %topic, error = %e, "resume token: the topic's partitions could not be read; it is named without offsets");
                    0
                }
            };
            for partition in 0..partitions {
                match self.d.store.read(&OffsetKey::new(topic.clone(), self.token_identity.clone(), partition)) {
                    Ok(Some(record)) => {
                        offsets.insert(partition, ResumeOffset { offset: record.committed, epoch: record.epoch });
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(session_id = %self.info.session_id, %topic, partition, error = %e, "resume token: the offset store could not be read; the partition is left out")
                    }
                }
            }
            token.push((topic.clone(), self.d.incarnation_id(topic), offsets));
        }
        self.d.issue_resume_token(Holder::of(&self.token_identity), token)
    }
}

struct CachedToken {
    read_at: tokio::time::Instant,
    topics: Vec<TopicName>,
    token: String,
}

/// Credentials refused, said where a page can read it (an `EventSource` sees no status, and
/// would take a 401 for an outage and retry it): a stream with the `error` event and a final
/// `close` (1008, its reason the error code), and no session.
fn credentials_refused(e: &ApiError) -> Response {
    let error = ServerFrame::Error { code: e.code, message: e.message.clone(), req: None }.to_json();
    let close = json!({"code": close_code::POLICY, "reason": e.code.as_str()});
    let body = format!("retry: {FINAL_CLOSE_RETRY_MS}\nevent: error\ndata: {error}\n\nevent: close\ndata: {close}\n\n");
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The `retry:` sent before a final close (1008, 4001): a day.
const FINAL_CLOSE_RETRY_MS: u64 = 86_400_000;
/// The `retry:` of a welcome: what browsers wait by default.
const DEFAULT_RETRY_MS: u64 = 3_000;

/// Closes after which a client must not reconnect by itself (docs/protocol.md, close codes).
fn is_final(code: u16) -> bool {
    code == close_code::POLICY || code == close_code::TAKEN_OVER
}

/// `data:` lines for `text`: a payload stored as sent may hold line breaks (pretty-printed
/// JSON), and each needs its own `data:` line (the browser joins them with a newline again).
fn push_data(chunk: &mut String, text: &str) {
    for line in text.split(['\r', '\n']) {
        chunk.push_str("data: ");
        chunk.push_str(line);
        chunk.push('\n');
    }
    chunk.push('\n');
}

/// The `type` of a server frame: every frame the session writes starts with it.
fn frame_type(json: &str) -> &str {
    json.strip_prefix("{\"type\":\"").and_then(|rest| rest.split_once('"')).map_or("message", |(kind, _)| kind)
}

#[utoipa::path(
    post,
    path = "/sse/{session_id}/frames",
    operation_id = "post_sse_frames",
    tag = "websocket",
    summary = "Client frames of a Server-Sent Events session; answers the frames the session sent for them",
    params(("session_id" = String, Path, description = "the session's id (its welcome's ack_url)"), ("token" = Option<String>, Query, description = "JWT when auth.jwt_secret or auth.jwks_url is set (or Authorization: Bearer)")),
    request_body(content = Vec<Object>, description = "a JSON array of client frames (ack, nack, extend, term, subscribe, unsubscribe, ping)"),
    responses(
        (status = 200, description = "a JSON array of the server frames answering them, in order (ack_ok once durable, error, subscribed, ...)", body = Vec<Object>),
        (status = 400, description = "bad_request: the body is not a JSON array of objects", body = crate::http::schemas::ErrorBody),
        (status = 401, description = "unauthorized", body = crate::http::schemas::ErrorBody),
        (status = 403, description = "forbidden: the credentials are another client's", body = crate::http::schemas::ErrorBody),
        (status = 404, description = "not_found: no such session on this instance (it ended, or lives on another): reconnect the stream", body = crate::http::schemas::ErrorBody),
        (status = 413, description = "limit_exceeded: a body over limits.max_frames_body_bytes, more than limits.max_batch_events frames, or one over limits.max_frame_bytes", body = crate::http::schemas::ErrorBody),
        (status = 429, description = "limit_exceeded: 16 POSTs of this session are waiting for it already", body = crate::http::schemas::ErrorBody),
    )
)]
pub async fn frames(
    State(app): State<AppState>,
    Path(session_id): Path<String>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let gone = || ApiError::not_found(format!("no session {session_id:?} on this instance (it ended, or lives on another): reconnect the stream"));
    // The session and the credentials first: a body is read only for a session that is there
    // and the caller's own.
    let session = app.sse.get(&session_id).ok_or_else(gone)?;
    let token = query.get("token").map(String::as_str);
    app.token_keys.prepare(session_token(token, &headers)).await;
    session_access(&app.config.auth, &app.token_keys, token, &headers, &session.client_id)?;
    let limits = &app.config.limits;
    let too_large = |message: String| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::LimitExceeded, message);
    let mut body_bytes = Vec::new();
    let mut data = body.into_data_stream();
    while let Some(chunk) = data.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("the body could not be read: {e}")))?;
        if body_bytes.len() + chunk.len() > limits.max_frames_body_bytes {
            return Err(too_large(format!("the body is larger than {} bytes (limits.max_frames_body_bytes)", limits.max_frames_body_bytes)));
        }
        body_bytes.extend_from_slice(&chunk);
    }
    let frames: Vec<Box<serde_json::value::RawValue>> =
        serde_json::from_slice(&body_bytes).map_err(|e| ApiError::bad_request(format!("the body is a JSON array of client frames: {e}")))?;
    if frames.len() > limits.max_batch_events {
        return Err(too_large(format!("{} frames in one POST; at most {} (limits.max_batch_events)", frames.len(), limits.max_batch_events)));
    }
    let mut texts = Vec::with_capacity(frames.len());
    for (i, frame) in frames.into_iter().enumerate() {
        let text = frame.get();
        if text.len() > limits.max_frame_bytes {
            return Err(too_large(format!("frame {i} has {} bytes; at most {} (limits.max_frame_bytes)", text.len(), limits.max_frame_bytes)));
        }
        if !text.starts_with('{') {
            return Err(ApiError::bad_request(format!("frame {i} is not a JSON object")));
        }
        texts.push(text.to_string());
    }
    let (answer, answered) = oneshot::channel();
    session.frames.try_send(Inbound::Frames { texts, answer }).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::LimitExceeded,
            format!("{INBOUND_QUEUED} POSTs of this session are waiting for it already (is its stream being read?); send the next when one is answered"),
        ),
        mpsc::error::TrySendError::Closed(_) => gone(),
    })?;
    let answers = answered.await.map_err(|_| gone())?;
    let mut body = String::with_capacity(2 + answers.iter().map(|a| a.len() + 1).sum::<usize>());
    body.push('[');
    body.push_str(&answers.join(","));
    body.push(']');
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_resume_tokens_are_read_and_anything_else_is_not_one() {
        let at = |offset, epoch| ResumeOffset { offset, epoch };
        let older = |json: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        let decoded = decode_older_token(&older(&format!(r#"{{"orders":{{"0":7,"3":[{},2]}}}}"#, u64::MAX))).unwrap();
        assert_eq!(decoded["orders"], BTreeMap::from([(0, at(7, 0)), (3, at(u64::MAX, 2))]));
        assert!(decode_older_token("e30").unwrap().is_empty(), "{{}} names no topic");
        for bad in ["%%%", "bnVsbA", "eyJhIjp7IngiOjF9fQ", "eyJhIjp7IjAiOi0xfX0", "eyJiYWQgbmFtZSI6e319", "r1.e30"] {
            // %%% not base64; null; {"a":{"x":1}}; {"a":{"0":-1}}; {"bad name":{}}; an issued token's prefix
            assert!(decode_older_token(bad).is_none(), "{bad} was read as an older token");
        }
    }

    /// A pretty-printed payload keeps one SSE message: each line gets its own `data:`, and the
    /// lines joined with newlines are the JSON again (whitespace only changes).
    #[test]
    fn line_breaks_in_a_frame_stay_inside_its_message() {
        let mut chunk = String::new();
        push_data(&mut chunk, "{\"type\":\"event\",\"payload\":{\n\"a\":\r\n1\r}}");
        assert_eq!(chunk.matches("\n\n").count(), 1, "one message: {chunk:?}");
        assert!(chunk.ends_with("\n\n"));
        let data: Vec<&str> = chunk.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        let joined: serde_json::Value = serde_json::from_str(&data.join("\n")).unwrap();
        assert_eq!(joined["payload"]["a"], 1);
    }

    #[test]
    fn frame_types_come_from_the_frame() {
        assert_eq!(frame_type(r#"{"type":"event","delivery_id":"x"}"#), "event");
        assert_eq!(frame_type(r#"{"type":"ack_ok"}"#), "ack_ok");
        assert_eq!(frame_type("{}"), "message");
    }
}
