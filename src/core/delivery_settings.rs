//! The delivery knobs a dispatcher runs with (from the `[delivery]`, `[limits]` and `[server]`
//! config sections, converted once at start).

use std::time::Duration;

use super::redelivery::RedeliveryPolicies;

/// Where a client with no stored offset starts (`delivery.reset_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetPolicy {
    Earliest,
    Latest,
}

/// Delivery knobs (the `[delivery]` and `[limits]` config sections).
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// Ack timeout, backoff and attempts, per topic.
    pub redelivery: RedeliveryPolicies,
    pub max_in_flight: usize,
    /// Payload bytes of a session's unacknowledged deliveries.
    pub max_in_flight_bytes: u32,
    /// Unacknowledged deliveries of one shared subscription across its members (its hub's window).
    pub group_max_in_flight: usize,
    /// The longest a group member's nack may pause its event.
    pub group_max_nack_delay: Duration,
    pub reset_policy: ResetPolicy,
    /// A session whose window stays full this long is closed with 4003; zero disables.
    pub slow_client_timeout: Duration,
    pub max_subscriptions_per_session: usize,
    /// Subscribes one session may make in a second.
    pub max_subscribes_per_sec: usize,
    /// The most a `from: {"last": n}` may ask for per partition.
    pub max_rewind_events: u64,
    /// What one publish may carry (`limits.max_batch_events`, `max_key_bytes`, `max_header_name_bytes`).
    pub event_bounds: crate::core::published_event::EventBounds,
    /// Whether a `publish` frame may create a missing topic (the embedded log's
    /// `embedded.auto_create_topics`): for a session without a JWT, and for one with.
    pub publish_creates_topics: (bool, bool),
    /// On the embedded log, the partitions of a topic a subscribe creates (`embedded.default_partitions`):
    /// a session that may create a topic by publishing to it creates it by subscribing to it as
    /// well. `None`: a subscribe never creates one (Kafka, RocketMQ).
    pub subscribe_creates_partitions: Option<u32>,
    pub max_sessions: usize,
    /// Groups (hubs) live on this instance.
    pub max_groups: usize,
    /// Live sessions subscribed to one topic on this instance.
    pub max_clients_per_topic: usize,
    /// Offline clients whose ack state (attempt counts of unacknowledged events) is kept.
    pub max_offline_clients: usize,
    /// Events each partition reader keeps for its subscribers.
    pub reader_buffer_events: usize,
    /// Payload bytes each partition reader keeps at most.
    pub reader_buffer_bytes: usize,
    /// Events read from the log at once.
    pub fetch_batch: usize,
    /// How often a session pings its peer; zero disables pings and the dead-peer check.
    pub ping_interval: Duration,
    /// A session that heard nothing from its peer this long ends as a dead peer.
    pub pong_timeout: Duration,
    /// How long a drained session waits for its client's acks before it closes (`core::drain`).
    pub drain_settle: Duration,
    /// How long before its token expires a session sends `refresh_needed`.
    pub refresh_before: Duration,
    /// At most how often a session is sent `progress` with fresh resume tokens (zero: never).
    pub progress_interval: Duration,
    /// A resume token older than this is refused as `expired` (`offsets.retention_secs`; 0: never).
    pub resume_token_max_age_ms: u64,
}
