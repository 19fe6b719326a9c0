//! WebSocket frames of docs/protocol.md, sans IO: parsing client frames and writing gateway frames.
//!
//! Parsing never panics; every failure is a `FrameError` that the session answers with an `error`
//! frame. Event frames are written by hand so the stored JSON payload is copied into the frame as
//! is, without parsing it again.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::backend::Event;
use super::client_state::DeliveryRef;
use super::offsets::OffsetEpoch;

/// Stable error codes of docs/protocol.md (WebSocket `error` frames and REST error bodies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadFrame,
    InvalidName,
    UnknownTopic,
    NotSubscribed,
    UnknownDelivery,
    LimitExceeded,
    Unauthorized,
    Forbidden,
    Unavailable,
    Internal,
    BadRequest,
    NotFound,
    Conflict,
}

impl ErrorCode {
    /// Every code, in docs/protocol.md's order (the OpenAPI document lists the same; a test checks).
    pub const ALL: [ErrorCode; 13] = [
        Self::BadFrame,
        Self::InvalidName,
        Self::UnknownTopic,
        Self::NotSubscribed,
        Self::UnknownDelivery,
        Self::LimitExceeded,
        Self::Unauthorized,
        Self::Forbidden,
        Self::Unavailable,
        Self::Internal,
        Self::BadRequest,
        Self::NotFound,
        Self::Conflict,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadFrame => "bad_frame",
            Self::InvalidName => "invalid_name",
            Self::UnknownTopic => "unknown_topic",
            Self::NotSubscribed => "not_subscribed",
            Self::UnknownDelivery => "unknown_delivery",
            Self::LimitExceeded => "limit_exceeded",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::BadRequest => "bad_request",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
        }
    }
}

/// WebSocket close codes of docs/protocol.md.
pub mod close_code {
    pub const GOING_AWAY: u16 = 1001;
    /// The client broke RFC 6455's framing (`http::ws_codec`).
    pub const PROTOCOL_ERROR: u16 = 1002;
    /// A text message or close reason that is not UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    pub const POLICY: u16 = 1008;
    pub const TOO_BIG: u16 = 1009;
    pub const TAKEN_OVER: u16 = 4001;
    pub const OPERATOR: u16 = 4002;
    pub const SLOW_CLIENT: u16 = 4003;
    /// The instance is draining (after a `reconnect` frame): not final.
    pub const DRAINING: u16 = 1012;
    /// The instance serves `limits.max_sessions` (after an `error` `limit_exceeded`): "try again
    /// later" in RFC 6455's words.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The session's token expired and no `refresh` replaced it: not final (get a new token and
    /// reconnect).
    pub const TOKEN_EXPIRED: u16 = 4004;

    /// Every code (docs/protocol.md lists the same; a test checks).
    pub const ALL: [u16; 11] =
        [GOING_AWAY, PROTOCOL_ERROR, INVALID_DATA, POLICY, TOO_BIG, DRAINING, TRY_AGAIN_LATER, TAKEN_OVER, OPERATOR, SLOW_CLIENT, TOKEN_EXPIRED];
}

/// A failure tied to one client frame: the code, a message for humans, and the frame's `req`.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameError {
    pub code: ErrorCode,
    pub message: String,
    pub req: Option<Value>,
}

impl FrameError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), req: None }
    }

    pub fn with_req(mut self, req: Option<Value>) -> Self {
        self.req = req;
        self
    }

    /// `unavailable` for a failure of `what` ("the log backend", "the offset store"): the caller
    /// gets a short message and an incident id, the log gets the detail (broker addresses, file
    /// paths) under the same id, so an operator can find one from the other.
    pub fn unavailable(what: &str, detail: impl std::fmt::Display) -> Self {
        let incident = incident_id();
        tracing::warn!(%incident, error = %detail, "{what} is unavailable");
        Self::new(ErrorCode::Unavailable, format!("{what} is unavailable; retry later (incident {incident})"))
    }
}

/// A short id naming one error answer in the log: unique per process (a counter), and unlikely
/// to repeat across restarts (mixed with the start time).
fn incident_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static STARTED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let started = *STARTED.get_or_init(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:012x}", (started.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n) & 0xffff_ffff_ffff)
}

/// Where a subscription starts when the client names no resume token for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(from = "StartFromWire")]
pub enum StartFrom {
    #[default]
    Committed,
    Earliest,
    Latest,
    /// `{"time": epoch_ms}`: per partition the first offset whose timestamp is at or after it.
    Time(u64),
    /// `{"last": n}`: per partition the last `n` offsets before the log end (at most
    /// `limits.max_rewind_events`).
    Last(u64),
}

impl StartFrom {
    /// As a `subscribe` frame writes it.
    pub fn to_json(self) -> Value {
        match self {
            Self::Committed => Value::from("committed"),
            Self::Earliest => Value::from("earliest"),
            Self::Latest => Value::from("latest"),
            Self::Time(time) => serde_json::json!({ "time": time }),
            Self::Last(last) => serde_json::json!({ "last": last }),
        }
    }
}

/// `from` as written: a name, `{"time": epoch_ms}` or `{"last": n}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum StartFromWire {
    Named(NamedStart),
    Time { time: u64 },
    Last { last: u64 },
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum NamedStart {
    Committed,
    Earliest,
    Latest,
}

impl From<StartFromWire> for StartFrom {
    fn from(wire: StartFromWire) -> Self {
        match wire {
            StartFromWire::Named(NamedStart::Committed) => Self::Committed,
            StartFromWire::Named(NamedStart::Earliest) => Self::Earliest,
            StartFromWire::Named(NamedStart::Latest) => Self::Latest,
            StartFromWire::Time { time } => Self::Time(time),
            StartFromWire::Last { last } => Self::Last(last),
        }
    }
}

/// Longest redelivery delay a `nack` may ask for: one day.
pub const MAX_NACK_DELAY_MS: u64 = 86_400_000;
/// Longest `term` reason kept with a dead letter (docs/protocol.md: at most 1 KiB).
const MAX_TERM_REASON_BYTES: usize = 1024;

/// One partition of a resume token: the next offset the client holds, and the offset epoch it
/// last saw for the partition (`subscribed`'s `epoch`; 0, the oldest, when it sent none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeOffset {
    pub offset: u64,
    pub epoch: OffsetEpoch,
}

/// How a shared subscription's events are shared among its members (`order` of `subscribe`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareOrder {
    /// Every event to any member with room.
    #[default]
    None,
    /// Events of one key are never in flight at two members at once, and reach members in
    /// offset order.
    Key,
}

impl ShareOrder {
    /// As `subscribe` names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Key => "key",
        }
    }
}

/// `resume` of a `subscribe`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Resume {
    #[default]
    None,
    /// A resume token string as the gateway issued it, not verified yet (`core::resume_token`).
    Token(String),
    /// The older map form `{"<partition>": offset}` with `epochs`: a client's claim, applied to
    /// its own subscription only, and only within the stored record's epoch.
    Claimed(BTreeMap<u32, ResumeOffset>),
}

/// `group` and `order` of a `subscribe`: the session joins shared subscription `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupJoin {
    pub name: String,
    pub order: ShareOrder,
}

/// A frame sent by the client.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientFrame {
    Subscribe {
        topic: String,
        from: StartFrom,
        resume: Resume,
        /// `group` (with its `order`): join that shared subscription instead (core::group).
        group: Option<GroupJoin>,
        req: Option<Value>,
    },
    Unsubscribe {
        topic: String,
        req: Option<Value>,
    },
    Ack {
        delivery_ids: Vec<String>,
        req: Option<Value>,
    },
    /// `delay_ms` absent: the topic's backoff for the attempt.
    Nack {
        delivery_id: String,
        delay_ms: Option<u64>,
        req: Option<Value>,
    },
    Extend {
        delivery_id: String,
        req: Option<Value>,
    },
    Term {
        delivery_id: String,
        reason: Option<String>,
        req: Option<Value>,
    },
    Ping {
        req: Option<Value>,
    },
    /// Replaces the session's JWT (same `sub`).
    Refresh {
        token: String,
        req: Option<Value>,
    },
    /// Publishes `events` (the REST body's `events`, as JSON text) to `topic`.
    Publish {
        topic: String,
        events: String,
        idempotency_key: Option<String>,
        req: Option<Value>,
    },
}

impl ClientFrame {
    /// The frame's `op`, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Subscribe { .. } => "subscribe",
            Self::Unsubscribe { .. } => "unsubscribe",
            Self::Ack { .. } => "ack",
            Self::Nack { .. } => "nack",
            Self::Extend { .. } => "extend",
            Self::Term { .. } => "term",
            Self::Ping { .. } => "ping",
            Self::Refresh { .. } => "refresh",
            Self::Publish { .. } => "publish",
        }
    }
}

/// `resume` as sent: a token string or the older map.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawResume {
    Token(String),
    Map(BTreeMap<String, u64>),
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum RawFrame {
    Subscribe {
        topic: String,
        #[serde(default)]
        from: StartFrom,
        #[serde(default)]
        resume: Option<RawResume>,
        #[serde(default)]
        epochs: Option<BTreeMap<String, u64>>,
        #[serde(default)]
        group: Option<String>,
        #[serde(default)]
        order: Option<ShareOrder>,
        #[serde(default)]
        req: Option<Value>,
    },
    Unsubscribe {
        topic: String,
        #[serde(default)]
        req: Option<Value>,
    },
    Ack {
        #[serde(default)]
        delivery_id: Option<String>,
        #[serde(default)]
        delivery_ids: Option<Vec<String>>,
        #[serde(default)]
        req: Option<Value>,
    },
    Nack {
        delivery_id: String,
        #[serde(default)]
        delay_ms: Option<u64>,
        #[serde(default)]
        req: Option<Value>,
    },
    Extend {
        delivery_id: String,
        #[serde(default)]
        req: Option<Value>,
    },
    Term {
        delivery_id: String,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        req: Option<Value>,
    },
    Ping {
        #[serde(default)]
        req: Option<Value>,
    },
    Refresh {
        token: String,
        #[serde(default)]
        req: Option<Value>,
    },
    /// Parsed on its own (`PublishFrame`): an internally tagged enum cannot keep `events` as raw
    /// text. Here only so that the op is known and a bad one gets the parser's message.
    #[allow(dead_code)]
    Publish {
        topic: String,
        events: Value,
        #[serde(default)]
        idempotency_key: Option<String>,
        #[serde(default)]
        req: Option<Value>,
    },
}

/// A `publish` frame, read with its `events` as raw JSON text (payloads are written as sent,
/// never through a number's float).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishFrame {
    #[allow(dead_code)]
    op: PublishOp,
    topic: String,
    events: Box<RawValue>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    req: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PublishOp {
    Publish,
}

/// Parses one text frame. On failure the error still carries the frame's `req` when it has one.
pub fn parse_client_frame(text: &str) -> Result<ClientFrame, FrameError> {
    if let Some(frame) = parse_plain_ack(text) {
        return Ok(frame);
    }
    // Only a text naming the op is tried as one (other frames skip the attempt).
    if let Some(Ok(publish)) = text.contains("\"publish\"").then(|| serde_json::from_str::<PublishFrame>(text)) {
        return Ok(ClientFrame::Publish {
            topic: publish.topic,
            events: publish.events.get().to_string(),
            idempotency_key: publish.idempotency_key,
            req: publish.req,
        });
    }
    let raw: RawFrame = serde_json::from_str(text).map_err(|e| {
        let req = serde_json::from_str::<Value>(text).ok().and_then(|v| v.get("req").cloned());
        let message = if e.is_syntax() || e.is_eof() {
            format!("frame is not JSON: {e}")
        } else if e.to_string().contains("missing field `op`") {
            "frame has no \"op\" field".to_string()
        } else if e.to_string().contains("unknown variant") {
            format!("unknown op: {e}")
        } else {
            format!("bad frame: {e}")
        };
        FrameError::new(ErrorCode::BadFrame, message).with_req(req.filter(is_valid_req))
    })?;
    let frame = match raw {
        RawFrame::Subscribe { topic, from, resume, epochs, group, order, req } => {
            let group = match (group, order) {
                (Some(name), order) => Some(GroupJoin { name, order: order.unwrap_or_default() }),
                (None, None) => None,
                (None, Some(_)) => return Err(FrameError::new(ErrorCode::BadFrame, "order is a field of a shared subscription: it needs group").with_req(req)),
            };
            let partition_of = |field: &str, partition: &str| {
                partition
                    .parse::<u32>()
                    .map_err(|_| FrameError::new(ErrorCode::BadFrame, format!("{field} key {partition:?} is not a partition number")).with_req(req.clone()))
            };
            let mut epoch_of = BTreeMap::new();
            for (partition, epoch) in epochs.unwrap_or_default() {
                epoch_of.insert(partition_of("epochs", &partition)?, epoch);
            }
            let parsed = match resume {
                None => Resume::None,
                Some(RawResume::Token(token)) => Resume::Token(token),
                Some(RawResume::Map(map)) => {
                    let mut parsed = BTreeMap::new();
                    for (partition, offset) in map {
                        let p = partition_of("resume", &partition)?;
                        parsed.insert(p, ResumeOffset { offset, epoch: epoch_of.get(&p).copied().unwrap_or(0) });
                    }
                    Resume::Claimed(parsed)
                }
            };
            if let StartFrom::Time(time) = from {
                if time > i64::MAX as u64 {
                    return Err(FrameError::new(ErrorCode::BadFrame, format!("from.time must be at most {} (epoch ms)", i64::MAX)).with_req(req));
                }
            }
            ClientFrame::Subscribe { topic, from, resume: parsed, group, req }
        }
        RawFrame::Unsubscribe { topic, req } => ClientFrame::Unsubscribe { topic, req },
        RawFrame::Ack { delivery_id, delivery_ids, req } => {
            let mut ids = delivery_ids.unwrap_or_default();
            ids.extend(delivery_id);
            if ids.is_empty() {
                return Err(FrameError::new(ErrorCode::BadFrame, "ack needs delivery_id or delivery_ids").with_req(req));
            }
            ClientFrame::Ack { delivery_ids: ids, req }
        }
        RawFrame::Nack { delivery_id, delay_ms, req } => {
            if delay_ms.is_some_and(|d| d > MAX_NACK_DELAY_MS) {
                return Err(FrameError::new(ErrorCode::BadFrame, format!("delay_ms must be at most {MAX_NACK_DELAY_MS} (one day)")).with_req(req));
            }
            ClientFrame::Nack { delivery_id, delay_ms, req }
        }
        RawFrame::Extend { delivery_id, req } => ClientFrame::Extend { delivery_id, req },
        RawFrame::Term { delivery_id, reason, req } => {
            if reason.as_ref().is_some_and(|r| r.len() > MAX_TERM_REASON_BYTES) {
                return Err(FrameError::new(ErrorCode::BadFrame, format!("reason must be at most {MAX_TERM_REASON_BYTES} bytes")).with_req(req));
            }
            ClientFrame::Term { delivery_id, reason, req }
        }
        RawFrame::Ping { req } => ClientFrame::Ping { req },
        RawFrame::Refresh { token, req } => ClientFrame::Refresh { token, req },
        // A well-formed one was read above as `PublishFrame`; this one is not (an unknown field).
        RawFrame::Publish { req, .. } => {
            return Err(FrameError::new(ErrorCode::BadFrame, "publish takes topic, events, idempotency_key and req only").with_req(req.filter(is_valid_req)))
        }
    };
    match frame.req() {
        Some(req) if !is_valid_req(req) => Err(FrameError::new(ErrorCode::BadFrame, "req must be a string or a number")),
        _ => Ok(frame),
    }
}

fn is_valid_req(req: &Value) -> bool {
    req.is_string() || req.is_number()
}

impl ClientFrame {
    pub fn req(&self) -> Option<&Value> {
        match self {
            Self::Subscribe { req, .. }
            | Self::Unsubscribe { req, .. }
            | Self::Ack { req, .. }
            | Self::Nack { req, .. }
            | Self::Extend { req, .. }
            | Self::Term { req, .. }
            | Self::Ping { req }
            | Self::Refresh { req, .. }
            | Self::Publish { req, .. } => req.as_ref(),
        }
    }
}

/// `{"partition", "from", "epoch", "gap"?}` in a `subscribed` frame.
#[derive(Debug, Clone, Serialize)]
pub struct SubscribedPartition {
    pub partition: u32,
    pub from: u64,
    /// The partition's offset epoch for this client: what a resume token must name to be
    /// trusted above the stored offset.
    pub epoch: OffsetEpoch,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap: Option<GapRange>,
}

/// One event of a `published` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PublishedOffset {
    pub partition: u32,
    pub offset: u64,
}

/// Offsets `from`..`to`-1 that retention removed before the client read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GapRange {
    pub from: u64,
    pub to: u64,
}

/// Gateway frames other than `event` (which `write_event_frame` writes by hand).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    Welcome {
        session_id: String,
        client_id: String,
        instance: String,
        ack_timeout_ms: u64,
        max_in_flight: usize,
    },
    Subscribed {
        topic: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<Value>,
        /// The shared subscription joined, for a member's `subscribed`.
        #[serde(skip_serializing_if = "Option::is_none")]
        group: Option<String>,
        partitions: Vec<SubscribedPartition>,
        /// The resume token as of this start (`core::resume_token`).
        token: String,
        /// `"applied"` or `"refused"`, when the subscribe carried a resume token or map.
        #[serde(skip_serializing_if = "Option::is_none")]
        resume: Option<&'static str>,
        /// Why a resume was refused (`Refusal::as_str`).
        #[serde(skip_serializing_if = "Option::is_none")]
        resume_reason: Option<&'static str>,
    },
    Unsubscribed {
        topic: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<Value>,
    },
    AckOk {
        req: Value,
        committed: BTreeMap<String, BTreeMap<String, u64>>,
        /// A fresh resume token per topic the ack touched.
        tokens: BTreeMap<String, String>,
    },
    /// Fresh resume tokens of topics whose floors moved since the last token the session was
    /// sent (at most every `delivery.progress_interval_ms`).
    Progress {
        tokens: BTreeMap<String, String>,
    },
    /// A catch-up read found `from`..`to`-1 removed by retention; delivery goes on at `to`.
    Gap {
        topic: String,
        partition: u32,
        from: u64,
        to: u64,
    },
    /// The instance is draining: the session closes next with 1012; come back after `after_ms`.
    Reconnect {
        after_ms: u64,
        /// Where to reconnect, when this instance knows (a shared subscription that lives on
        /// another instance); else ask `/session/recommend`.
        #[serde(skip_serializing_if = "Option::is_none")]
        instance: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ws_url: Option<String>,
    },
    Pong {
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<Value>,
    },
    /// The session's JWT expires at `expires_at` (epoch ms), within `auth.refresh_before_secs`.
    RefreshNeeded {
        expires_at: u64,
    },
    /// A `publish` frame's events were written: `(partition, offset)` each, in the order sent.
    Published {
        req: Option<Value>,
        offsets: Vec<PublishedOffset>,
        #[serde(skip_serializing_if = "Option::is_none")]
        replayed: Option<bool>,
    },
    /// A `refresh` was taken: the session goes on until `expires_at` (epoch ms; absent: never).
    Refreshed {
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<Value>,
        expires_at: Option<u64>,
    },
    Error {
        code: ErrorCode,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<Value>,
    },
}

impl ServerFrame {
    /// The frame's `type`, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Welcome { .. } => "welcome",
            Self::Subscribed { .. } => "subscribed",
            Self::Unsubscribed { .. } => "unsubscribed",
            Self::AckOk { .. } => "ack_ok",
            Self::Progress { .. } => "progress",
            Self::Gap { .. } => "gap",
            Self::Reconnect { .. } => "reconnect",
            Self::Pong { .. } => "pong",
            Self::Published { .. } => "published",
            Self::RefreshNeeded { .. } => "refresh_needed",
            Self::Refreshed { .. } => "refreshed",
            Self::Error { .. } => "error",
        }
    }

    pub fn to_json(&self) -> String {
        // Serializing these plain structs cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl From<FrameError> for ServerFrame {
    fn from(e: FrameError) -> Self {
        Self::Error { code: e.code, message: e.message, req: e.req }
    }
}

/// The most frequent frame by far, `{"op":"ack","delivery_id":"<id>"}` exactly as clients
/// usually send it, read without serde's tagged-enum buffering. Anything else (other field order,
/// whitespace, escapes, `req`) returns `None` and takes the general path, which accepts the same
/// frames and more.
fn parse_plain_ack(text: &str) -> Option<ClientFrame> {
    plain_ack_id(text).map(|id| ClientFrame::Ack { delivery_ids: vec![id.to_string()], req: None })
}

/// The delivery id of the exact frame `{"op":"ack","delivery_id":"ID"}` (what clients send most),
/// read in place; `None` for any other frame, which then takes the general parser.
pub fn plain_ack_id(text: &str) -> Option<&str> {
    let id = text.strip_prefix(r#"{"op":"ack","delivery_id":""#)?.strip_suffix(r#""}"#)?;
    if id.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    Some(id)
}

/// Appends the decimal digits of `n`.
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
}

/// Writes one `event` frame. The payload is copied verbatim when the event says it is JSON.
/// In three parts: the delivery id and the attempt are a session's, the rest is the event's
/// (`core::event_frame` writes that rest once and shares it).
pub fn write_event_frame(out: &mut String, delivery: DeliveryRef, topic: &str, attempt: u32, event: &Event) {
    out.push_str(EVENT_FRAME_START);
    delivery.write_id(out);
    write_event_frame_middle(out, topic, event);
    push_u64(out, attempt as u64);
    write_event_frame_tail(out, event);
}

/// `write_event_frame` for one delivery of an event that may go to many sessions: the event's
/// part of the frame is written once (the second delivery) and copied for every other
/// (`core::event_frame`); the delivery id and attempt are this delivery's.
pub fn write_shared_event_frame(out: &mut String, delivery: DeliveryRef, topic: &str, attempt: u32, event: &Event) {
    let shared = event.frame.shared(|| {
        let (mut middle, mut tail) = (String::new(), String::with_capacity(96 + event.payload.len()));
        write_event_frame_middle(&mut middle, topic, event);
        write_event_frame_tail(&mut tail, event);
        super::event_frame::SharedParts { topic: topic.into(), middle: middle.into(), tail: tail.into() }
    });
    let Some(parts) = shared.filter(|parts| &*parts.topic == topic) else {
        out.reserve(160 + event.payload.len());
        write_event_frame(out, delivery, topic, attempt, event);
        return;
    };
    out.reserve(EVENT_FRAME_START.len() + 40 + parts.middle.len() + parts.tail.len());
    out.push_str(EVENT_FRAME_START);
    delivery.write_id(out);
    out.push_str(&parts.middle);
    push_u64(out, attempt as u64);
    out.push_str(&parts.tail);
}

/// An `event` frame up to its delivery id's value.
pub const EVENT_FRAME_START: &str = "{\"type\":\"event\",\"delivery_id\":\"";

/// An `event` frame from the end of its delivery id to its attempt's value.
pub fn write_event_frame_middle(out: &mut String, topic: &str, event: &Event) {
    out.push('"');
    out.push_str(",\"topic\":");
    push_json_str(out, topic);
    // Digits by hand: `write!` goes through the formatter, the larger part of this function.
    out.push_str(",\"partition\":");
    push_u64(out, event.partition as u64);
    out.push_str(",\"offset\":");
    push_u64(out, event.offset);
    out.push_str(",\"attempt\":");
}

/// An `event` frame after its attempt's value: timestamp, key, headers, payload, the end.
pub fn write_event_frame_tail(out: &mut String, event: &Event) {
    out.push_str(",\"timestamp\":");
    push_u64(out, event.timestamp);
    out.push_str(",\"key\":");
    match &event.key {
        Some(key) => push_json_str(out, key),
        None => out.push_str("null"),
    }
    out.push_str(",\"headers\":{");
    for (i, (name, value)) in event.headers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_str(out, name);
        out.push(':');
        push_json_str(out, value);
    }
    out.push('}');
    if !event.headers_base64.is_empty() {
        out.push_str(",\"headers_base64\":{");
        for (i, (name, value)) in event.headers_base64.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(out, name);
            out.push_str(":\"");
            base64::engine::general_purpose::STANDARD.encode_string(value, out);
            out.push('"');
        }
        out.push('}');
    }
    match event.json_payload() {
        Some(json) => {
            out.push_str(",\"payload\":");
            out.push_str(json);
        }
        None => {
            out.push_str(",\"payload_base64\":\"");
            base64::engine::general_purpose::STANDARD.encode_string(&event.payload, out);
            out.push('"');
        }
    }
    out.push('}');
}

fn push_json_str(out: &mut String, s: &str) {
    // Delivery ids, topic names and most keys need no escaping: copied as they are, without the
    // temporary string of the general case (three of them per event frame otherwise).
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    // serde_json's escaping (it escapes exactly those bytes).
    let quoted = serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    out.push_str(&quoted);
}

#[cfg(test)]
mod tests {
    /// docs/protocol.md names every op, gateway frame type, error code and close code of this
    /// module, and no other (issue 23).
    #[test]
    fn docs_protocol_names_every_frame_code_and_close_code_and_no_other() {
        let doc = include_str!("../../docs/protocol.md");
        let section = |heading: &str| -> Vec<String> {
            let start = doc.find(heading).unwrap_or_else(|| panic!("docs/protocol.md has no {heading:?}")) + heading.len();
            let body = &doc[start..];
            let end = body.find("\n#").unwrap_or(body.len());
            body[..end].lines().map(str::to_string).collect()
        };
        // The first backticked word of each table row or list item.
        let first_names = |lines: &[String]| -> std::collections::BTreeSet<String> {
            lines.iter().filter(|l| l.starts_with("| `") || l.starts_with("- `")).filter_map(|l| l.split('`').nth(1).map(str::to_string)).collect()
        };
        let ops = first_names(&section("### Frames a client sends"));
        let expected_ops: std::collections::BTreeSet<String> =
            crate::core::metrics::FRAMES_IN.iter().filter(|k| **k != "invalid").map(|k| k.to_string()).collect();
        assert_eq!(ops, expected_ops);
        for op in &ops {
            let parsed = parse_client_frame(&format!("{{\"op\":\"{op}\"}}"));
            assert!(!parsed.is_err_and(|e| e.message.contains("unknown op")), "{op} is an op the parser knows");
        }
        let types = first_names(&section("### Frames the gateway sends"));
        let expected_types: std::collections::BTreeSet<String> = crate::core::metrics::FRAMES_OUT.iter().map(|k| k.to_string()).collect();
        assert_eq!(types, expected_types);
        let codes = first_names(&section("### Error codes"));
        let expected_codes: std::collections::BTreeSet<String> = ErrorCode::ALL.iter().map(|c| c.as_str().to_string()).collect();
        assert_eq!(codes, expected_codes);
        let closes: std::collections::BTreeSet<u16> =
            section("### Close codes").iter().filter_map(|l| l.strip_prefix("| ")?.split(' ').next()?.parse().ok()).collect();
        assert_eq!(closes, close_code::ALL.into_iter().collect());
    }

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn err(text: &str) -> FrameError {
        parse_client_frame(text).unwrap_err()
    }

    #[test]
    fn strings_in_frames_are_escaped_exactly_as_serde_json_does() {
        for text in ["", "orders", "1f.0.3.ff", "caf\u{e9} \u{2028}", "a\"b", "back\\slash", "tab\there", "nul\u{0}", "\u{1f}\u{7f}"] {
            let mut out = String::new();
            push_json_str(&mut out, text);
            assert_eq!(out, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn parses_every_op() {
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t","from":"latest","resume":{"2":7},"req":1}"#).unwrap();
        assert_eq!(
            f,
            ClientFrame::Subscribe {
                topic: "t".into(),
                from: StartFrom::Latest,
                resume: Resume::Claimed([(2, ResumeOffset { offset: 7, epoch: 0 })].into()),
                group: None,
                req: Some(json!(1))
            }
        );
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t","group":"workers","order":"key"}"#).unwrap();
        assert!(matches!(f, ClientFrame::Subscribe { group: Some(GroupJoin { ref name, order: ShareOrder::Key }), .. } if name == "workers"), "{f:?}");
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t","group":"workers"}"#).unwrap();
        assert!(matches!(f, ClientFrame::Subscribe { group: Some(GroupJoin { order: ShareOrder::None, .. }), .. }), "{f:?}");
        for bad in [r#""order":"key""#, r#""group":"g","order":"fifo""#, r#""group":7"#] {
            let e = parse_client_frame(&format!(r#"{{"op":"subscribe","topic":"t",{bad},"req":3}}"#)).unwrap_err();
            assert_eq!((e.code, e.req), (ErrorCode::BadFrame, Some(json!(3))), "{bad}");
        }
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t","resume":{"2":7,"3":9},"epochs":{"3":4,"5":1}}"#).unwrap();
        let ClientFrame::Subscribe { resume, .. } = f else { panic!() };
        assert_eq!(
            resume,
            Resume::Claimed([(2, ResumeOffset { offset: 7, epoch: 0 }), (3, ResumeOffset { offset: 9, epoch: 4 })].into()),
            "no epoch: the oldest"
        );
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t","resume":"r1.abc"}"#).unwrap();
        assert!(matches!(f, ClientFrame::Subscribe { resume: Resume::Token(ref t), .. } if t == "r1.abc"), "{f:?}");
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t"}"#).unwrap();
        assert!(matches!(f, ClientFrame::Subscribe { resume: Resume::None, .. }), "{f:?}");
        for bad in [r#"7"#, r#"[1]"#, r#"{"0":-1}"#, r#"{"0":18446744073709551616}"#] {
            let e = parse_client_frame(&format!(r#"{{"op":"subscribe","topic":"t","resume":{bad}}}"#)).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadFrame, "{bad}");
        }
        assert!(parse_client_frame(r#"{"op":"subscribe","topic":"t","epochs":{"x":1}}"#).unwrap_err().message.contains("epochs"));
        assert!(parse_client_frame(r#"{"op":"subscribe","topic":"t","epochs":{"1":-1}}"#).is_err());
        let f = parse_client_frame(r#"{"op":"subscribe","topic":"t","from":{"time":1700000000000}}"#).unwrap();
        assert!(matches!(f, ClientFrame::Subscribe { from: StartFrom::Time(1_700_000_000_000), .. }), "{f:?}");
        for bad in [r#""middle""#, r#"{"time":-1}"#, r#"{"time":"x"}"#, r#"{"at":5}"#, "5", r#"{"time":9223372036854775808}"#] {
            let e = parse_client_frame(&format!(r#"{{"op":"subscribe","topic":"t","from":{bad},"req":2}}"#)).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadFrame, "{bad}");
        }
        let f = parse_client_frame(r#"{"op":"ack","delivery_ids":["a","b"],"delivery_id":"c"}"#).unwrap();
        assert_eq!(f, ClientFrame::Ack { delivery_ids: vec!["a".into(), "b".into(), "c".into()], req: None });
        let f = parse_client_frame(r#"{"op":"nack","delivery_id":"a","delay_ms":5,"extra":true}"#).unwrap();
        assert_eq!(f, ClientFrame::Nack { delivery_id: "a".into(), delay_ms: Some(5), req: None });
        assert!(matches!(parse_client_frame(r#"{"op":"ping","req":"x"}"#), Ok(ClientFrame::Ping { .. })));
        assert!(matches!(parse_client_frame(r#"{"op":"term","delivery_id":"d"}"#), Ok(ClientFrame::Term { .. })));
        // A term reason is kept with the dead letter: at most 1 KiB.
        let term = |len: usize| parse_client_frame(&format!(r#"{{"op":"term","delivery_id":"d","reason":"{}","req":1}}"#, "r".repeat(len)));
        assert!(term(MAX_TERM_REASON_BYTES).is_ok());
        let too_long = term(MAX_TERM_REASON_BYTES + 1).unwrap_err();
        assert_eq!((too_long.code, too_long.req), (ErrorCode::BadFrame, Some(serde_json::json!(1))));
        assert!(matches!(parse_client_frame(r#"{"op":"extend","delivery_id":"d"}"#), Ok(ClientFrame::Extend { .. })));
        assert!(matches!(parse_client_frame(r#"{"op":"unsubscribe","topic":"t"}"#), Ok(ClientFrame::Unsubscribe { .. })));
    }

    #[test]
    fn integers_are_written_as_json_numbers() {
        for n in [0u64, 7, 10, 99, 100, 123_456, u32::MAX as u64, u64::MAX] {
            let mut out = String::from("x");
            push_u64(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }

    #[test]
    fn the_plain_ack_fast_path_agrees_with_the_general_parser() {
        let general = |text: &str| {
            let raw: RawFrame = serde_json::from_str(text).unwrap();
            match raw {
                RawFrame::Ack { delivery_id, delivery_ids, req } => (delivery_id, delivery_ids, req),
                _ => panic!("not an ack"),
            }
        };
        for id in ["1.0.0.0", "ff3a.2.7.1b", "", "x y"] {
            let text = format!(r#"{{"op":"ack","delivery_id":"{id}"}}"#);
            assert_eq!(parse_plain_ack(&text), Some(ClientFrame::Ack { delivery_ids: vec![id.to_string()], req: None }));
            assert_eq!(general(&text).0.as_deref(), Some(id));
            assert_eq!(parse_client_frame(&text).unwrap(), ClientFrame::Ack { delivery_ids: vec![id.to_string()], req: None });
        }
        // Escapes, other spacing, extra fields: the general path, same meaning.
        for text in [r#"{"op":"ack","delivery_id":"a\"b"}"#, r#"{ "op":"ack","delivery_id":"1.0.0.0"}"#, r#"{"op":"ack","delivery_id":"1.0.0.0","req":1}"#] {
            assert_eq!(parse_plain_ack(text), None, "{text}");
            assert!(matches!(parse_client_frame(text), Ok(ClientFrame::Ack { .. })), "{text}");
        }
        assert_eq!(parse_client_frame(r#"{"op":"ack","delivery_id":"a\"b"}"#).unwrap(), ClientFrame::Ack { delivery_ids: vec!["a\"b".into()], req: None });
    }

    #[test]
    fn bad_frames_are_errors_that_keep_req() {
        assert!(err("not json").message.contains("not JSON"));
        let e = err(r#"{"op":"fly","req":"r1"}"#);
        assert_eq!((e.code, e.req), (ErrorCode::BadFrame, Some(json!("r1"))));
        assert!(e.message.contains("unknown op"));
        assert!(err(r#"{"topic":"t"}"#).message.contains("op"));
        assert!(err(r#"{"op":"subscribe"}"#).message.contains("topic"));
        assert!(err(r#"{"op":"ack","req":2}"#).message.contains("delivery_id"));
        assert!(err(r#"{"op":"ack","delivery_id":5}"#).message.contains("bad frame"));
        assert!(err(r#"{"op":"ping","req":{"a":1}}"#).message.contains("req"));
        assert!(err(r#"{"op":"subscribe","topic":"t","resume":{"x":1}}"#).message.contains("partition"));
        assert!(err(r#"[1,2]"#).code == ErrorCode::BadFrame);
        assert!(err(r#"{"op":"nack","delivery_id":"a","delay_ms":18446744073709551615}"#).message.contains("delay_ms"));
        assert!(err(r#"{"op":"nack","delivery_id":"a","delay_ms":-1}"#).code == ErrorCode::BadFrame);
    }

    proptest::proptest! {
        /// Whatever a client sends, parsing answers Ok or a bad_frame error, never a panic.
        #[test]
        fn parsing_never_panics(text in ".{0,120}", op in "(subscribe|unsubscribe|ack|nack|extend|term|ping|x)", field in "[a-z_]{1,12}", value in "(null|true|-1|1e400|\"s\"|\\[\\]|\\{\\}|18446744073709551616)") {
            let _ = parse_client_frame(&text);
            let framed = format!(r#"{{"op":"{op}","{field}":{value},"req":{value}}}"#);
            if let Err(e) = parse_client_frame(&framed) {
                proptest::prop_assert_eq!(e.code, ErrorCode::BadFrame);
            }
        }
    }

    #[test]
    fn event_frames_embed_json_or_base64() {
        let mut event = Event {
            partition: 1,
            offset: 42,
            timestamp: 7,
            key: Some("k\"1".into()),
            headers: vec![("h".into(), "v".into())],
            headers_base64: vec![("bin".into(), vec![0xff, 0x00])],
            payload: br#"{"n":1}"#.to_vec(),
            payload_is_json: true,
            undecodable: false,
            frame: Default::default(),
        };
        let mut out = String::new();
        write_event_frame(&mut out, DeliveryRef { seq: 0x1f, slot: 0, partition: 1, offset: 42 }, "t", 2, &event);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["delivery_id"], "1f.0.1.2a");
        assert_eq!(v["payload"], json!({"n": 1}));
        assert_eq!((v["offset"].as_u64(), v["attempt"].as_u64(), v["key"].as_str()), (Some(42), Some(2), Some("k\"1")));
        assert_eq!(v["headers"], json!({"h": "v"}));
        assert_eq!(v["headers_base64"], json!({"bin": "/wA="}));
        event.headers_base64.clear();
        event.payload = vec![0xff, 0x00];
        event.payload_is_json = false;
        event.key = None;
        out.clear();
        write_event_frame(&mut out, DeliveryRef { seq: 2, slot: 0, partition: 1, offset: 42 }, "t", 1, &event);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!((v["payload_base64"].as_str(), v["key"].is_null()), (Some("/wA="), true));
        assert!(v.get("headers_base64").is_none(), "absent when every header is text: {out}");
    }

    // The shared event frame (`core::event_frame`).

    fn text() -> impl Strategy<Value = String> {
        // Plain text, quotes, backslashes, control characters and non-ASCII.
        proptest::string::string_regex("[a-z\"\\\\\\x00-\\x1fé€😀 ]{0,12}").unwrap()
    }

    prop_compose! {
        fn event()(
            partition in 0u32..8,
            offset in any::<u64>(),
            timestamp in any::<u64>(),
            key in proptest::option::of(text()),
            headers in proptest::collection::vec((text(), text()), 0..3),
            headers_base64 in proptest::collection::vec((text(), proptest::collection::vec(any::<u8>(), 0..6)), 0..2),
            json in any::<bool>(),
            raw in proptest::collection::vec(any::<u8>(), 0..24),
        ) -> Event {
            let payload = if json { serde_json::to_vec(&serde_json::json!({"t": timestamp, "s": String::from_utf8_lossy(&raw)})).unwrap() } else { raw };
            Event { partition, offset, timestamp, key, headers, headers_base64, payload, payload_is_json: json, undecodable: false, frame: Default::default() }
        }
    }

    proptest! {
        /// Every delivery of an event, through the shared parts, is the frame written in full:
        /// first and later deliveries, any attempt, redrive ids, any topic.
        #[test]
        fn shared_frames_are_the_frames_written_in_full(
            event in event(),
            deliveries in proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u32>()), 1..4),
            topic in "[A-Za-z0-9._-]{1,20}(@[a-z]{1,5})?",
        ) {
            // Any slot: a redrive's too (its high bit).
            for (seq, slot, attempt) in deliveries {
                let id = DeliveryRef { seq, slot, partition: event.partition, offset: event.offset };
                let (mut shared, mut full) = (String::new(), String::new());
                write_shared_event_frame(&mut shared, id, &topic, attempt, &event);
                write_event_frame(&mut full, id, &topic, attempt, &event);
                prop_assert_eq!(&shared, &full);
                serde_json::from_str::<serde_json::Value>(&shared).unwrap();
            }
            // Under another topic name: written in full, still equal.
            let id = DeliveryRef { seq: 1, slot: 0, partition: event.partition, offset: event.offset };
            let (mut shared, mut full) = (String::new(), String::new());
            write_shared_event_frame(&mut shared, id, "other", 1, &event);
            write_event_frame(&mut full, id, "other", 1, &event);
            prop_assert_eq!(shared, full);
        }
    }
}
