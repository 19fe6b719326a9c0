//! Shapes of every REST body and WebSocket frame, for the OpenAPI document (`openapi.rs`). The
//! handlers build the same JSON; `tests/api/openapi.rs` checks real answers against these.

#![allow(dead_code)] // read by utoipa's derive only

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::ToSchema;

/// `{"error": {"code", "message"}}`: every REST error.
#[derive(serde::Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(serde::Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCodeName,
    /// For humans; may change between versions.
    pub message: String,
}

/// Stable error codes (REST bodies and WebSocket `error` frames).
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCodeName {
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

/// One event to publish: a JSON `payload`, or bytes in `payload_base64` (one of the two).
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum PublishEvent {
    Json(PublishJsonEvent),
    Bytes(PublishBytesEvent),
}

/// An event whose payload is JSON.
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishJsonEvent {
    /// At most `limits.max_key_bytes` (4096) bytes of UTF-8 (this document's bound, 1024
    /// characters, is always within it).
    #[schema(max_length = 1024)]
    pub key: Option<String>,
    /// Explicit partition; otherwise by key hash, or spread without a key.
    pub partition: Option<u32>,
    /// Header names at most `limits.max_header_name_bytes` (256) bytes each.
    pub headers: Option<BTreeMap<String, String>>,
    /// Any JSON value (`null` included), stored as sent.
    pub payload: Value,
}

/// An event whose payload is bytes (base64).
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishBytesEvent {
    /// At most `limits.max_key_bytes` (4096) bytes of UTF-8 (this document's bound, 1024
    /// characters, is always within it).
    #[schema(max_length = 1024)]
    pub key: Option<String>,
    /// Explicit partition; otherwise by key hash, or spread without a key.
    pub partition: Option<u32>,
    /// Header names at most `limits.max_header_name_bytes` (256) bytes each.
    pub headers: Option<BTreeMap<String, String>>,
    /// Standard base64 with padding.
    #[schema(pattern = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")]
    pub payload_base64: String,
}

/// A batch: 1 to `limits.max_batch_events` events (413 past it); atomic on the embedded log.
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishBatch {
    #[schema(min_items = 1)]
    pub events: Vec<PublishEvent>,
}

/// A single event or a batch.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum PublishRequest {
    One(PublishEvent),
    Batch(PublishBatch),
}

#[derive(serde::Serialize, ToSchema)]
pub struct PublishedOffset {
    pub partition: u32,
    pub offset: u64,
}

/// The offsets written, in the order sent.
#[derive(serde::Serialize, ToSchema)]
pub struct PublishAnswer {
    pub offsets: Vec<PublishedOffset>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct PartitionInfo {
    pub partition: u32,
    /// First stored offset.
    pub log_start: u64,
    /// Next offset to be written.
    pub log_end: u64,
    /// How far this instance has pulled; null when never pulled.
    pub pull_offset: Option<u64>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct TopicInfo {
    pub name: String,
    pub partitions: Vec<PartitionInfo>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct TopicList {
    pub topics: Vec<TopicInfo>,
    /// With `parent`: the `after` of the next page (absent on the last).
    pub next: Option<String>,
}

#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    #[schema(pattern = r"^[A-Za-z0-9._-]+$", min_length = 1, max_length = 249)]
    pub name: String,
    /// 1 to 10,000 (the embedded log's bound; Kafka and RocketMQ apply their own).
    #[schema(minimum = 1, maximum = 10000)]
    pub partitions: u32,
}

#[derive(serde::Serialize, ToSchema)]
pub struct TopicCreated {
    pub name: String,
    pub partitions: u32,
    /// False when it already existed with this partition count.
    pub created: bool,
}

#[derive(serde::Serialize, ToSchema)]
pub struct TopicDeleted {
    pub deleted: String,
    pub offsets_deleted: u64,
    pub dead_letters_deleted: u64,
}

/// One stored ack offset.
#[derive(serde::Serialize, ToSchema)]
pub struct OffsetRow {
    /// Display form `topic#client_id#partition`.
    pub key: String,
    pub topic: String,
    pub client_id: String,
    pub partition: u32,
    /// Next offset not yet acknowledged (every offset below it is acknowledged).
    pub committed: u64,
    /// Highest acknowledged offset; null when none.
    pub last_acked: Option<u64>,
    /// Epoch ms of the last write.
    pub updated_at: u64,
    /// The record's offset epoch (docs/semantics.md, "Offset epochs"): a peer of the cluster
    /// starts a client without a resume token from it as from a token's.
    pub epoch: u64,
    /// The partition's log end; null when the log did not answer.
    pub log_end: Option<u64>,
    /// Events the client has still to acknowledge: `log_end - committed` (from `log_start` when
    /// retention removed what it had not read), live or offline; null with `log_end`.
    pub lag: Option<u64>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct OffsetList {
    pub offsets: Vec<OffsetRow>,
    /// Present when the page is full (more may follow): pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct ClientPartition {
    pub partition: u32,
    /// Null when the client has no stored offset on this partition.
    pub committed: Option<u64>,
    pub last_acked: Option<u64>,
    pub log_end: u64,
    /// `log_end - committed` (from `log_start` when nothing is stored).
    pub lag: u64,
}

#[derive(serde::Serialize, ToSchema)]
pub struct ClientOffsets {
    pub topic: String,
    pub client_id: String,
    pub partitions: Vec<ClientPartition>,
}

/// `{"offset"}` or `{"time"}`, exactly one.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum ResetOffset {
    /// The new committed offset: at most the partition's `log_end` (400 above it).
    #[schema(title = "by offset")]
    Offset { offset: u64 },
    /// Epoch ms: the new committed offset is the partition's first offset stamped at or after it
    /// (the log end when every event is older).
    #[schema(title = "by time")]
    Time { time: u64 },
}

#[derive(serde::Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: u64,
}

/// A member of a shared subscription.
#[derive(serde::Serialize, ToSchema)]
pub struct GroupMember {
    pub session_id: String,
    pub client_id: String,
    /// The group's deliveries it holds unacknowledged.
    pub in_flight: u64,
    /// Keys whose events it holds (`order: key`).
    pub keys: u64,
}

/// A shared subscription live on this instance.
#[derive(serde::Serialize, ToSchema)]
pub struct GroupRow {
    pub topic: String,
    pub group: String,
    /// `none` or `key`.
    pub order: String,
    pub instance: String,
    pub members: Vec<GroupMember>,
    /// Its members' deliveries in flight together.
    pub in_flight: u64,
    /// Events handed out by the group that wait for a member with room.
    pub waiting: u64,
}

#[derive(serde::Serialize, ToSchema)]
pub struct GroupList {
    pub groups: Vec<GroupRow>,
}

/// One group: its stored floor per partition (`committed`, `lag` as for a client) and, when it
/// is live on this instance, its members.
#[derive(serde::Serialize, ToSchema)]
pub struct GroupDetail {
    pub topic: String,
    pub group: String,
    pub live: bool,
    pub order: Option<String>,
    pub members: Vec<GroupMember>,
    pub waiting: u64,
    pub partitions: Vec<ClientPartition>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Session {
    pub session_id: String,
    pub client_id: String,
    pub remote_addr: Option<String>,
    /// Epoch ms.
    pub connected_at: u64,
    pub subscriptions: Vec<String>,
    /// The shared subscriptions it is a member of (their deliveries are not in `in_flight`:
    /// `/admin/groups` counts them per member).
    pub groups: Vec<SessionGroup>,
    pub in_flight: u64,
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    /// Epoch ms; null before the first ack.
    pub last_ack_at: Option<u64>,
    /// The in-flight window is full: nothing more is pushed until acks arrive.
    pub window_full: bool,
    /// `websocket`, `sse`, or `group`: a shared subscription's hub (its client_id is `$` and the
    /// group's name).
    #[schema(pattern = "^(websocket|sse|group)$")]
    pub transport: String,
}

#[derive(serde::Serialize, ToSchema)]
pub struct SessionGroup {
    pub topic: String,
    pub group: String,
}

#[derive(serde::Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
    /// Present when more sessions match: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct InFlightDelivery {
    pub delivery_id: String,
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub attempt: u32,
    /// Epoch ms of its next timer: the ack timeout, or the end of a pause (a `nack`'s, or the
    /// backoff after a timeout).
    pub deadline: u64,
    /// Epoch ms when it is delivered again without an ack: the deadline, plus the backoff of its
    /// attempt when the deadline is an ack timeout.
    pub next_attempt_at: u64,
}

/// A session plus its in-flight deliveries.
#[derive(serde::Serialize, ToSchema)]
pub struct SessionDetail {
    #[schema(inline)]
    #[serde(flatten)]
    pub session: Session,
    pub deliveries: Vec<InFlightDelivery>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Disconnected {
    pub disconnected: String,
}

#[derive(serde::Serialize, ToSchema)]
pub struct DeadLetter {
    pub topic: String,
    pub client_id: String,
    pub partition: u32,
    pub offset: u64,
    /// Deliveries made.
    pub attempts: u32,
    /// `max_attempts` or the reason given with `term`.
    pub reason: String,
    /// Epoch ms.
    pub at: u64,
}

#[derive(serde::Serialize, ToSchema)]
pub struct DeadLetterList {
    pub dead_letters: Vec<DeadLetter>,
    /// Present when more follow: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Which dead letters to deliver again (or delete): one page of a client's or a shared
/// subscription's dead letters on a topic, of one partition, or one dead letter. `client_id` or
/// `group`, exactly one.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum RedriveRequest {
    Client(RedriveClientRequest),
    Group(RedriveGroupRequest),
}

/// A client's dead letters (or a group's, as `$NAME`).
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveClientRequest {
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499)]
    pub topic: String,
    /// The client whose dead letters these are, or a shared subscription's identity `$NAME`.
    #[schema(pattern = r"^([A-Za-z0-9._:@-]{1,128}|\$[A-Za-z0-9._-]{1,249})$", min_length = 1, max_length = 250)]
    pub client_id: String,
    /// Only this partition.
    #[schema(minimum = 0, maximum = 4294967295u64)]
    pub partition: Option<u32>,
    /// Only dead letters at this offset (with `partition`: one dead letter).
    #[schema(minimum = 0)]
    pub offset: Option<u64>,
    /// The `next` of a previous answer (`topic#client_id#partition#offset`).
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?#([A-Za-z0-9._:@-]{1,128}|\$[A-Za-z0-9._-]{1,249})#[0-9]{1,9}#[0-9]{1,19}$")]
    pub after: Option<String>,
    /// Dead letters in this page, 1 to 1000 (default 100).
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// A shared subscription's dead letters.
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveGroupRequest {
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?$", min_length = 1, max_length = 499)]
    pub topic: String,
    /// The shared subscription whose dead letters these are (its name, as `subscribe`'s `group`).
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,249}$", min_length = 1, max_length = 249)]
    pub group: String,
    /// Only this partition.
    #[schema(minimum = 0, maximum = 4294967295u64)]
    pub partition: Option<u32>,
    /// Only dead letters at this offset (with `partition`: one dead letter).
    #[schema(minimum = 0)]
    pub offset: Option<u64>,
    /// The `next` of a previous answer (`topic#client_id#partition#offset`).
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,249}(@[A-Za-z0-9._-]{1,249})?#([A-Za-z0-9._:@-]{1,128}|\$[A-Za-z0-9._-]{1,249})#[0-9]{1,9}#[0-9]{1,19}$")]
    pub after: Option<String>,
    /// Dead letters in this page, 1 to 1000 (default 100).
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct DeadLettersDeleted {
    /// Dead letters removed (with their redrive marks).
    pub deleted: u64,
    /// Present when more dead letters match: pass it as `after` to delete the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// With `?scope=cluster`: each peer's `url`, `status` and `answer` (its own `deleted` and
    /// `next`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<Value>>,
    /// With `?scope=cluster`: the peers that did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<Vec<String>>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Redriven {
    /// Dead letters marked: each is delivered again to the client (now if it has a session on
    /// this instance, else at its next subscribe) until acknowledged or given up on again.
    pub redriven: u64,
    /// Present when more dead letters match: pass it as `after` to redrive the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// With `?scope=cluster`: each peer's `url`, `status` and `answer` (its own `redriven` and
    /// `next`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<Value>>,
    /// With `?scope=cluster`: the peers that did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<Vec<String>>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Gap {
    pub topic: String,
    pub client_id: String,
    pub partition: u32,
    /// First offset the client never received.
    pub from: u64,
    /// The log start it was moved to: offsets `from`..`to`-1 were gone.
    pub to: u64,
    /// Epoch ms.
    pub at: u64,
}

#[derive(serde::Serialize, ToSchema)]
pub struct GapList {
    pub gaps: Vec<Gap>,
    /// Present when more follow: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Reloaded {
    /// The keys whose values changed, as dotted paths (`delivery.ack_timeout_ms`).
    pub changed: Vec<String>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Draining {
    pub draining: bool,
    /// True when a drain was already running (this call changed nothing).
    pub already_draining: bool,
    /// Sessions on this instance when the call was made.
    pub sessions: u64,
    /// The window their closes are spread over (`server.drain_ms`).
    pub drain_ms: u64,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Recommendation {
    pub instance: String,
    /// Full URL of `/ws`, without query.
    pub ws_url: String,
    pub http_url: String,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    pub instance: String,
}

#[derive(serde::Serialize, ToSchema)]
pub struct Readiness {
    pub ready: bool,
    /// This instance's id (peers read it when they probe).
    pub instance: String,
    /// `ok` or `failing`.
    pub offset_store: String,
    /// `ok` or `unreachable`.
    pub backend: String,
    pub shutting_down: bool,
    /// Topics whose partitions are unavailable while the instance is ready (a RocketMQ route that
    /// would renumber them).
    pub topics_unavailable: Vec<String>,
}

// ---- WebSocket frames (text frames, one JSON object each) ----------------------------------

/// `req`: any string or number, echoed verbatim.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum Req {
    Text(String),
    Number(f64),
}

/// How a shared subscription's events are shared among its members.
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShareOrderSchema {
    None,
    Key,
}

/// A frame sent by the client, tagged by `op`.
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[serde(tag = "op")]
pub enum ClientFrame {
    /// Start receiving every partition of `topic`.
    Subscribe {
        topic: String,
        /// `committed` (default), `earliest`, `latest`, `{"time": epoch_ms}` (per partition the
        /// first offset whose timestamp is at or after it) or `{"last": n}` (per partition the last
        /// `n` events, at most `limits.max_rewind_events`); never below the stored offset.
        from: Option<StartFromSchema>,
        /// A resume token as the gateway issued it (`subscribed`'s `token`, `ack_ok`'s and
        /// `progress`'s `tokens`): per partition the larger of its floor and the stored committed
        /// offset within the current epoch; a token that is refused is never an error
        /// (`subscribed` says why). Or the older map `{"<partition>": next_offset}` (a client's
        /// own subscription only, within the stored offset's epoch).
        resume: Option<ResumeSchema>,
        /// With the older map form: the offset epoch of each partition as the last `subscribed`
        /// named it; a partition without one is of epoch 0, the oldest.
        epochs: Option<BTreeMap<String, u64>>,
        /// Join shared subscription `group` of the topic (topic name rule): each event goes to
        /// one member; the group's progress is its own (`from`, `resume` apply to no member).
        group: Option<String>,
        /// With `group`: `none` (default) shares freely, `key` keeps each key at one member at a
        /// time, in offset order.
        order: Option<ShareOrderSchema>,
        req: Option<Req>,
    },
    /// Stop; in-flight deliveries of the topic are released for redelivery.
    Unsubscribe { topic: String, req: Option<Req> },
    /// Acknowledge one (`delivery_id`) or many (`delivery_ids`); with `req`, `ack_ok` follows once durable.
    Ack { delivery_id: Option<String>, delivery_ids: Option<Vec<String>>, req: Option<Req> },
    /// Redeliver after `delay_ms` (default 0).
    Nack { delivery_id: String, delay_ms: Option<u64>, req: Option<Req> },
    /// Restart the delivery's ack deadline.
    Extend { delivery_id: String, req: Option<Req> },
    /// Give up: recorded as a dead letter, counts as acknowledged.
    Term { delivery_id: String, reason: Option<String>, req: Option<Req> },
    /// Answered by `pong`.
    Ping { req: Option<Req> },
    /// Replace the session's JWT with `token` (same `sub`, checked as at the handshake); answered
    /// `refreshed`, or an `error` (`unauthorized`, or `forbidden` when its `topics` claim drops a
    /// topic the session reads) that changes nothing.
    Refresh { token: String, req: Option<Req> },
    /// Publish `events` (as the REST body's `events`) to `topic`; answered `published`.
    Publish { topic: String, events: Vec<Value>, idempotency_key: Option<String>, req: Option<Req> },
}

/// `resume` of a `subscribe`: a token string, or the older map.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum ResumeSchema {
    /// An opaque token the gateway issued (URL-safe, `r1.` then base64url).
    Token(String),
    /// `{"<partition>": next_offset}`.
    Map(BTreeMap<String, u64>),
}

/// `from` of a `subscribe`: a name or a time.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub enum StartFromSchema {
    /// `committed`, `earliest` or `latest`.
    Named(String),
    /// Epoch ms.
    Time { time: u64 },
    /// The last `last` events of each partition (at most `limits.max_rewind_events`).
    Last { last: u64 },
}

#[derive(serde::Serialize, ToSchema)]
pub struct SubscribedPartition {
    pub partition: u32,
    /// First offset that will be delivered.
    pub from: u64,
    /// The partition's offset epoch for this client: one more at every lowering of its committed
    /// offset (an admin reset, a lost log tail). Keep it with the resume token.
    pub epoch: u64,
    /// Present when the start wanted (stored offset or token) was below the log start: offsets
    /// `from`..`to`-1 are gone and will never be delivered.
    pub gap: Option<GapRange>,
}

#[derive(serde::Serialize, ToSchema)]
pub struct GapRange {
    pub from: u64,
    pub to: u64,
}

/// A frame sent by the gateway, tagged by `type`.
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[serde(tag = "type")]
pub enum ServerFrame {
    /// First frame of every session.
    Welcome {
        session_id: String,
        client_id: String,
        instance: String,
        ack_timeout_ms: u64,
        max_in_flight: u64,
    },
    Subscribed {
        topic: String,
        req: Option<Req>,
        /// The shared subscription joined (a member's `subscribed`).
        group: Option<String>,
        partitions: Vec<SubscribedPartition>,
        /// The resume token as of this start.
        token: String,
        /// `applied` or `refused`, when the subscribe carried a resume token.
        resume: Option<String>,
        /// Why it was refused: `invalid`, `other_client`, `other_group`, `other_incarnation` or `expired`.
        resume_reason: Option<String>,
    },
    Unsubscribed {
        topic: String,
        req: Option<Req>,
    },
    /// One delivery. `payload` when the value is JSON, else `payload_base64`.
    Event {
        delivery_id: String,
        topic: String,
        partition: u32,
        offset: u64,
        /// 1 on first delivery.
        attempt: u32,
        /// Epoch ms.
        timestamp: u64,
        key: Option<String>,
        headers: BTreeMap<String, String>,
        /// Headers whose value is not UTF-8, base64-encoded (absent when there are none).
        headers_base64: Option<BTreeMap<String, String>>,
        /// True for a dead letter an operator sent again (absent otherwise): its ack removes the
        /// dead letter and never moves a committed offset.
        redrive: Option<bool>,
        payload: Option<Value>,
        payload_base64: Option<String>,
    },
    /// Committed offsets `{"<topic>": {"<partition>": offset}}` of every partition the ack touched.
    AckOk {
        req: Req,
        committed: BTreeMap<String, BTreeMap<String, u64>>,
        /// A fresh resume token per topic the ack touched (`{"<topic>": token}`).
        tokens: BTreeMap<String, String>,
    },
    /// Fresh resume tokens of topics whose floors moved since the last token sent (acks without
    /// `req`), at most every `delivery.progress_interval_ms`.
    Progress {
        tokens: BTreeMap<String, String>,
    },
    Pong {
        req: Option<Req>,
    },
    /// A catch-up read found `from`..`to`-1 removed by retention; delivery goes on at `to`.
    Gap {
        topic: String,
        partition: u32,
        from: u64,
        to: u64,
    },
    /// The instance is draining: the session closes next with 1012; reconnect (through
    /// `/session/recommend`) after `after_ms`.
    Reconnect {
        after_ms: u64,
        /// Where to reconnect when the gateway knows (a shared subscription's instance).
        instance: Option<String>,
        ws_url: Option<String>,
    },
    /// A `publish` was written: the offsets in the order sent; `replayed` when an
    /// `idempotency_key` repeated an earlier publish.
    Published {
        req: Option<Req>,
        offsets: Vec<PublishedOffset>,
        replayed: Option<bool>,
    },
    /// The session's JWT expires at `expires_at` (epoch ms), within `auth.refresh_before_secs`:
    /// send `refresh` with a new one, or the session closes with 4004 then.
    RefreshNeeded {
        expires_at: u64,
    },
    /// A `refresh` was taken: the session goes on until `expires_at` (epoch ms; null: never).
    Refreshed {
        req: Option<Req>,
        expires_at: Option<u64>,
    },
    /// The connection stays open. Close codes: 1001 shutdown, 1012 draining, 1008 auth, 1009 frame too large,
    /// 4001 taken over, 4002 disconnected by an operator, 4003 slow client, 4004 token expired (not final).
    Error {
        code: ErrorCodeName,
        message: String,
        req: Option<Req>,
    },
}
