//! Every counter and histogram ackgate exports, registered once as handles so the hot path only
//! bumps an atomic. Names and help texts live here and nowhere else. Gauges that describe state
//! (sessions, in-flight, pull lag) are computed when `/metrics` is scraped (`http::metrics`).
//!
//! `metrics` is a facade like `tracing`: without an installed recorder every handle is a no-op.

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Histogram, Unit};

/// Client frame kinds counted by `ackgate_ws_frames_total{direction="in"}`.
pub const FRAMES_IN: [&str; 10] = ["subscribe", "unsubscribe", "ack", "nack", "extend", "term", "ping", "refresh", "publish", "invalid"];
/// Gateway frame kinds counted by `ackgate_ws_frames_total{direction="out"}`.
pub const FRAMES_OUT: [&str; 13] =
    ["welcome", "subscribed", "unsubscribed", "event", "ack_ok", "pong", "error", "gap", "reconnect", "refresh_needed", "refreshed", "published", "progress"];
/// Index of "event" in `FRAMES_OUT` (counted per batch of deliveries, not looked up per frame).
const EVENT_FRAME: usize = 3;

/// Why sessions end, counted by `ackgate_sessions_ended_total{reason}` (`SessionEnd::label`).
pub const SESSION_ENDS: [&str; 11] = [
    "client_left",
    "dead_peer",
    "write_failed",
    "slow_client",
    "shutdown",
    "reconnect",
    "taken_over",
    "operator",
    "frame_too_large",
    "protocol_error",
    "token_expired",
];

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client closed the connection, or its stream ended.
    ClientLeft,
    /// Nothing heard from the peer within `server.ws_pong_timeout_ms` (no close frame sent).
    DeadPeer,
    /// A socket write failed.
    WriteFailed,
    /// Closed by the gateway with this close code (docs/protocol.md); a socket that took no
    /// writes for `delivery.slow_client_timeout_ms` counts as 4003 (slow client).
    Closed(u16),
}

impl SessionEnd {
    /// One of `SESSION_ENDS`: a close code by its meaning (4003 is `slow_client`).
    pub fn label(self) -> &'static str {
        use crate::core::protocol::close_code;
        match self {
            SessionEnd::ClientLeft => "client_left",
            SessionEnd::DeadPeer => "dead_peer",
            SessionEnd::WriteFailed => "write_failed",
            SessionEnd::Closed(close_code::SLOW_CLIENT) => "slow_client",
            // 1012: a drain, and also a truncated log or a stopped shared subscription.
            SessionEnd::Closed(close_code::DRAINING) => "reconnect",
            SessionEnd::Closed(close_code::TAKEN_OVER) => "taken_over",
            SessionEnd::Closed(close_code::OPERATOR) => "operator",
            SessionEnd::Closed(close_code::TOO_BIG) => "frame_too_large",
            SessionEnd::Closed(close_code::PROTOCOL_ERROR | close_code::INVALID_DATA) => "protocol_error",
            SessionEnd::Closed(close_code::TOKEN_EXPIRED) => "token_expired",
            // 1001, and any code a session loop does not send (1008 and 1013 refuse a session
            // before it starts).
            SessionEnd::Closed(_) => "shutdown",
        }
    }
}

/// Why an event was pushed again.
#[derive(Debug, Clone, Copy)]
pub enum RedeliveryReason {
    /// No ack within `ack_timeout_ms`.
    Timeout,
    /// The client sent `nack`.
    Nack,
    /// The session that had it ended (or unsubscribed) before acking.
    Disconnect,
}

pub struct Metrics {
    pub deliveries: Counter,
    redeliveries: [Counter; 3],
    pub acks: Counter,
    pub dead_letters: Counter,
    /// Seconds from a delivery to its ack.
    pub ack_latency: Histogram,
    /// Seconds from an event's timestamp (its publish, on the embedded log) to its first
    /// delivery.
    pub publish_to_delivery: Histogram,
    pub pull_events: Counter,
    /// Publishes answered from an `Idempotency-Key` without writing.
    pub publish_replays: Counter,
    frames_in: [Counter; FRAMES_IN.len()],
    frames_out: [Counter; FRAMES_OUT.len()],
    sessions_ended: [Counter; SESSION_ENDS.len()],
}

pub const SESSIONS: &str = "ackgate_sessions";
pub const DELIVERIES: &str = "ackgate_deliveries_total";
pub const REDELIVERIES: &str = "ackgate_redeliveries_total";
pub const ACKS: &str = "ackgate_acks_total";
pub const DEAD_LETTERS: &str = "ackgate_dead_letters_total";
pub const OFFSET_WRITES: &str = "ackgate_offset_writes_total";
pub const BROKER_ACKS: &str = "ackgate_broker_acks_total";
pub const PULL_EVENTS: &str = "ackgate_pull_events_total";
pub const WS_FRAMES: &str = "ackgate_ws_frames_total";
pub const IN_FLIGHT: &str = "ackgate_in_flight";
pub const PULL_LAG: &str = "ackgate_pull_lag";
pub const COMMITTED_LAG: &str = "ackgate_committed_lag";
pub const CLIENT_COMMITTED_LAG: &str = "ackgate_client_committed_lag";
pub const COMMITTED_LAG_MAX: &str = "ackgate_committed_lag_max";
pub const OLDEST_SESSION_AGE: &str = "ackgate_oldest_session_age_seconds";
pub const DEAD_LETTER_BACKLOG: &str = "ackgate_dead_letter_backlog";
pub const GROUP_MEMBERS: &str = "ackgate_group_members";
pub const GROUP_WAITING: &str = "ackgate_group_waiting";
pub const READY: &str = "ackgate_ready";
pub const BACKEND_UP: &str = "ackgate_backend_up";
pub const STALLED_SESSIONS: &str = "ackgate_stalled_sessions";
pub const SESSIONS_ENDED: &str = "ackgate_sessions_ended_total";
pub const BUILD_INFO: &str = "ackgate_build_info";
pub const PUBLISH_TO_DELIVERY: &str = "ackgate_publish_to_delivery_seconds";
pub const DATA_DIR_FREE: &str = "ackgate_data_dir_free_bytes";
pub const DATA_DIR_SIZE: &str = "ackgate_data_dir_size_bytes";
pub const CONFIG_RELOADS: &str = "ackgate_config_reloads_total";
pub const PEERS: &str = "ackgate_peers";
pub const TLS_CERT_EXPIRY: &str = "ackgate_tls_cert_expiry_timestamp_seconds";
pub const FSYNC: &str = "ackgate_fsync_seconds";

/// The process's own figures, under the names Prometheus' client libraries give them (read from
/// /proc at scrape).
pub const PROCESS_CPU: &str = "process_cpu_seconds_total";
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";
pub const PROCESS_OPEN_FDS: &str = "process_open_fds";
pub const PROCESS_MAX_FDS: &str = "process_max_fds";
pub const PROCESS_START: &str = "process_start_time_seconds";
pub const PROCESS: [&str; 5] = [PROCESS_CPU, PROCESS_RSS, PROCESS_OPEN_FDS, PROCESS_MAX_FDS, PROCESS_START];
pub const HTTP_REQUESTS: &str = "ackgate_http_requests_total";
pub const HTTP_DURATION: &str = "ackgate_http_request_duration_seconds";
pub const ACK_LATENCY: &str = "ackgate_ack_latency_seconds";
pub const OFFSETS_ABOVE_LOG_END: &str = "ackgate_offsets_above_log_end_total";
pub const CONNECTIONS: &str = "ackgate_connections";
pub const CONNECTIONS_REFUSED: &str = "ackgate_connections_refused_total";
pub const KAFKA_HEADERS_DROPPED: &str = "ackgate_kafka_headers_dropped_total";
pub const UNDECODABLE_RECORDS: &str = "ackgate_undecodable_records_total";
pub const TRANSIENT_LOG_ENDS: &str = "ackgate_transient_log_ends_total";
pub const LOG_TRUNCATIONS: &str = "ackgate_log_truncations_total";
pub const READER_RESTARTS: &str = "ackgate_reader_restarts_total";
pub const PUBLISH_REPLAYS: &str = "ackgate_publish_replays_total";
pub const GAPS: &str = "ackgate_gaps_total";
pub const GAP_EVENTS: &str = "ackgate_gap_events_total";
pub const DEAD_LETTERS_REDRIVEN: &str = "ackgate_dead_letters_redriven_total";
pub const ROCKETMQ_POPPED: &str = "ackgate_rocketmq_popped_total";
pub const ROCKETMQ_UNMAPPED_REVIVED: &str = "ackgate_rocketmq_unmapped_revived_total";
pub const ROCKETMQ_PENDING_HANDLES: &str = "ackgate_rocketmq_pending_handles";
pub const ROCKETMQ_BROKER_ACKS: &str = "ackgate_rocketmq_broker_acks_total";
pub const ROCKETMQ_INVISIBLE_EXTENSIONS: &str = "ackgate_rocketmq_invisible_extensions_total";
pub const ROCKETMQ_OFFSET_MOVES: &str = "ackgate_rocketmq_offset_moves_total";
pub const ROCKETMQ_LONG_POLLS_UNANSWERED: &str = "ackgate_rocketmq_long_polls_unanswered_total";
pub const ROCKETMQ_ROUTES_REFUSED: &str = "ackgate_rocketmq_routes_refused_total";
pub const ROCKETMQ_LITE_POPPED: &str = "ackgate_rocketmq_lite_popped_total";
pub const ROCKETMQ_LITE_RESYNCS: &str = "ackgate_rocketmq_lite_resyncs_total";

/// Every metric name ackgate exports (docs/operations.md lists the same; a test checks that, and
/// that a scrape shows no other).
pub const ALL: [&str; 55] = [
    SESSIONS,
    SESSIONS_ENDED,
    STALLED_SESSIONS,
    BACKEND_UP,
    IN_FLIGHT,
    PULL_LAG,
    COMMITTED_LAG,
    CLIENT_COMMITTED_LAG,
    COMMITTED_LAG_MAX,
    OLDEST_SESSION_AGE,
    DEAD_LETTER_BACKLOG,
    GROUP_MEMBERS,
    GROUP_WAITING,
    READY,
    BUILD_INFO,
    PUBLISH_TO_DELIVERY,
    DATA_DIR_FREE,
    DATA_DIR_SIZE,
    CONFIG_RELOADS,
    PEERS,
    TLS_CERT_EXPIRY,
    FSYNC,
    DELIVERIES,
    REDELIVERIES,
    ACKS,
    DEAD_LETTERS,
    ACK_LATENCY,
    OFFSET_WRITES,
    BROKER_ACKS,
    PULL_EVENTS,
    OFFSETS_ABOVE_LOG_END,
    TRANSIENT_LOG_ENDS,
    LOG_TRUNCATIONS,
    READER_RESTARTS,
    CONNECTIONS,
    CONNECTIONS_REFUSED,
    UNDECODABLE_RECORDS,
    KAFKA_HEADERS_DROPPED,
    GAPS,
    GAP_EVENTS,
    DEAD_LETTERS_REDRIVEN,
    PUBLISH_REPLAYS,
    WS_FRAMES,
    HTTP_REQUESTS,
    HTTP_DURATION,
    ROCKETMQ_POPPED,
    ROCKETMQ_UNMAPPED_REVIVED,
    ROCKETMQ_PENDING_HANDLES,
    ROCKETMQ_BROKER_ACKS,
    ROCKETMQ_INVISIBLE_EXTENSIONS,
    ROCKETMQ_OFFSET_MOVES,
    ROCKETMQ_LONG_POLLS_UNANSWERED,
    ROCKETMQ_ROUTES_REFUSED,
    ROCKETMQ_LITE_POPPED,
    ROCKETMQ_LITE_RESYNCS,
];

/// `ackgate_rocketmq_popped_total`: messages popped from the broker (POP mode).
pub fn rocketmq_popped() -> Counter {
    metrics::counter!(ROCKETMQ_POPPED)
}

/// `ackgate_rocketmq_unmapped_revived_total`: revived messages whose original is neither known
/// here nor found at the broker by its `UNIQ_KEY`, left to the broker.
pub fn rocketmq_unmapped_revived() -> Counter {
    metrics::counter!(ROCKETMQ_UNMAPPED_REVIVED)
}

/// `ackgate_rocketmq_pending_handles`: popped messages whose broker ACK is still to be sent.
pub fn rocketmq_pending_handles() -> metrics::Gauge {
    metrics::gauge!(ROCKETMQ_PENDING_HANDLES)
}

/// `ackgate_rocketmq_broker_acks_total{result=acked|retried|failed}`: ACK requests to the broker
/// (POP mode), apart from `ackgate_broker_acks_total`, which counts the deferred ACKs handed to
/// the backend once per event.
pub fn rocketmq_broker_acks(result: &'static str) -> Counter {
    metrics::counter!(ROCKETMQ_BROKER_ACKS, "result" => result)
}

/// `ackgate_rocketmq_invisible_extensions_total{result=ok|failed}`: invisible-time extensions of
/// popped messages still unacknowledged.
pub fn rocketmq_invisible_extensions(result: &'static str) -> Counter {
    metrics::counter!(ROCKETMQ_INVISIBLE_EXTENSIONS, "result" => result)
}

/// `ackgate_rocketmq_offset_moves_total{followed=true|false}`: PULL answers OFFSET_MOVED forward;
/// followed only past offsets the log dropped, not after a reset of the group's offset.
pub fn rocketmq_offset_moves(followed: bool) -> Counter {
    metrics::counter!(ROCKETMQ_OFFSET_MOVES, "followed" => if followed { "true" } else { "false" })
}

/// `ackgate_rocketmq_long_polls_unanswered_total`: long polls (POP, PULL) the broker left
/// unanswered for the whole timeout (that queue is then read without the broker's long poll for
/// a minute).
pub fn rocketmq_long_polls_unanswered() -> Counter {
    metrics::counter!(ROCKETMQ_LONG_POLLS_UNANSWERED)
}

/// `ackgate_rocketmq_routes_refused_total`: RocketMQ routes refused because they would renumber
/// a topic's partitions (counted per refresh while it lasts).
pub fn rocketmq_routes_refused() -> Counter {
    metrics::counter!(ROCKETMQ_ROUTES_REFUSED)
}

/// `ackgate_rocketmq_lite_popped_total{parent}`: lite-topic messages popped, per parent (never
/// per lite topic: there may be 100,000 of them).
pub fn rocketmq_lite_popped(parent: &str) -> Counter {
    metrics::counter!(ROCKETMQ_LITE_POPPED, "parent" => parent.to_string())
}

/// `ackgate_rocketmq_lite_resyncs_total{parent}`: times the group's offset of a lite topic was set
/// to ackgate's pull cursor (a reader starting, a rewind, a pop that raced one).
pub fn rocketmq_lite_resyncs(parent: &str) -> Counter {
    metrics::counter!(ROCKETMQ_LITE_RESYNCS, "parent" => parent.to_string())
}

/// `ackgate_dead_letters_redriven_total`: dead letters an operator marked for redrive (each
/// request counts the ones it matched).
pub fn dead_letters_redriven() -> Counter {
    metrics::counter!(DEAD_LETTERS_REDRIVEN)
}

/// `ackgate_gaps_total{topic}` and `ackgate_gap_events_total{topic}`: gaps reported to clients
/// (a start below the log start at subscribe, or a catch-up read that fell behind retention),
/// and the events in them. Labelled by topic, so handles are made per report (gaps are rare).
pub fn gap_reported(topic: &str, events: u64) {
    // A lite topic (`parent@lite`) counts under its parent: one series per room would not scale.
    let topic = topic.split('@').next().unwrap_or(topic).to_string();
    metrics::counter!(GAPS, "topic" => topic.clone()).increment(1);
    metrics::counter!(GAP_EVENTS, "topic" => topic).increment(events);
}

/// `ackgate_transient_log_ends_total`: log ends read below a committed offset that were back above
/// it when read again (`core::log_end`): the offsets stayed. A free function, like
/// `offsets_above_log_end`.
pub fn transient_log_ends() -> Counter {
    metrics::counter!(TRANSIENT_LOG_ENDS)
}

/// `ackgate_log_truncations_total`: partitions whose log lost its tail, found at start (boot
/// alignment) or, on two reads a second apart,
/// to end below the pull cursor while readers ran (`PartitionReader::truncate`).
pub fn log_truncations() -> Counter {
    metrics::counter!(LOG_TRUNCATIONS)
}

/// `ackgate_reader_restarts_total`: partition readers that panicked and were started again.
pub fn reader_restarts() -> Counter {
    metrics::counter!(READER_RESTARTS)
}

/// `ackgate_undecodable_records_total`: records read from the log that could not be decoded
/// (each read counts; every subscriber dead-letters them with reason `undecodable`).
pub fn undecodable_records() -> Counter {
    metrics::counter!(UNDECODABLE_RECORDS)
}

/// `ackgate_config_reloads_total{result}`: config reloads (SIGHUP, `POST /admin/reload`), by
/// result: `ok` or `refused` (the settings in force stayed).
/// Runs `sync` (an fsync of `store`: "offsets" or "log") and records how long it took in
/// `ackgate_fsync_seconds`. Looked up per call, not kept: stores open before the recorder is
/// installed, and an fsync costs far more than the lookup.
pub fn timed_fsync<T>(store: &'static str, sync: impl FnOnce() -> T) -> T {
    let started = std::time::Instant::now();
    let done = sync();
    metrics::histogram!(FSYNC, "store" => store).record(started.elapsed().as_secs_f64());
    done
}

/// `ackgate_tls_cert_expiry_timestamp_seconds`: the certificate in use expires at `at` (epoch s).
pub fn tls_cert_expires_at(at: u64) {
    metrics::gauge!(TLS_CERT_EXPIRY).set(at as f64);
}

pub fn config_reloads(ok: bool) -> Counter {
    metrics::counter!(CONFIG_RELOADS, "result" => if ok { "ok" } else { "refused" })
}

/// The `reason`s of `ackgate_connections_refused_total`, each exported at 0 from the start.
pub const CONNECTION_REFUSALS: [&str; 2] = ["capacity", "per_ip"];

/// `ackgate_connections_refused_total{reason}`: connections refused at accept, before any request
/// was read (`capacity`: `limits.max_connections`; `per_ip`: `limits.max_connections_per_ip`).
pub fn connections_refused(reason: &'static str) -> Counter {
    metrics::counter!(CONNECTIONS_REFUSED, "reason" => reason)
}

/// `ackgate_kafka_headers_dropped_total`: Kafka record headers whose key is not UTF-8 (the event
/// goes out without them).
pub fn kafka_headers_dropped() -> Counter {
    metrics::counter!(KAFKA_HEADERS_DROPPED)
}

/// `ackgate_offsets_above_log_end_total`: committed offsets found above their partition's log end
/// and lowered to it. A free function: boot alignment counts before `Metrics::register` runs.
pub fn offsets_above_log_end() -> Counter {
    metrics::counter!(OFFSETS_ABOVE_LOG_END)
}

impl Metrics {
    /// Registers every handle with the installed recorder (or no-op handles without one).
    pub fn register() -> Self {
        describe_gauge!(SESSIONS, "Live sessions on this instance, by transport (websocket, sse, group: a shared subscription's hub)");
        describe_gauge!(IN_FLIGHT, "Unacknowledged deliveries across sessions");
        describe_gauge!(PULL_LAG, "Events in the log not yet pulled, per topic and partition");
        describe_gauge!(
            COMMITTED_LAG,
            "Events the clients with a live session on this instance have not acknowledged (log end minus stored committed offset), summed per topic"
        );
        describe_gauge!(
            CLIENT_COMMITTED_LAG,
            "Events a client has not acknowledged on a topic (log end minus stored committed offset, summed over partitions), for the 10 clients with the most, live or offline"
        );
        describe_gauge!(
            COMMITTED_LAG_MAX,
            "The largest lag of one client on the topic, live or offline (stored offsets, at most 100000 records read per scrape); ackgate_client_committed_lag names the worst clients"
        );
        describe_gauge!(DEAD_LETTER_BACKLOG, "Dead letters stored per topic (counted at scrape, at most 100000 in all)");
        describe_gauge!(GROUP_MEMBERS, "Members of the shared subscriptions live on this instance");
        describe_gauge!(GROUP_WAITING, "Events shared subscriptions handed out that wait for a member with room");
        describe_gauge!(READY, "1 when /readyz answers ready (store and backend answer, not draining), else 0");
        describe_gauge!(BACKEND_UP, "1 when the backend answers its readiness probe (the broker, or the embedded log), else 0");
        describe_gauge!(
            STALLED_SESSIONS,
            "Sessions stuck: their in-flight window is full and they acknowledged nothing for a quarter of delivery.slow_client_timeout_ms (at most 60 s); closed with 4003 once that lasts delivery.slow_client_timeout_ms (unless it is 0)"
        );
        describe_counter!(
            SESSIONS_ENDED,
            "Sessions ended, by reason: client_left, dead_peer, write_failed, slow_client (4003), shutdown (1001), reconnect (1012: a drain, a truncated log, a stopped shared subscription), taken_over (4001), operator (4002), frame_too_large (1009), protocol_error (1002, 1007), token_expired (4004)"
        );
        describe_gauge!(BUILD_INFO, "Always 1; the label version names this build");
        describe_gauge!(DATA_DIR_FREE, "Bytes free to this process on the file system of storage.data_dir (RocksDB, the embedded log), read at scrape");
        describe_gauge!(DATA_DIR_SIZE, "Size in bytes of the file system of storage.data_dir, read at scrape");
        describe_gauge!(
            TLS_CERT_EXPIRY,
            "When the certificate of server.tls_cert in use expires (its notAfter, seconds since the epoch; a SIGHUP that loads another changes it); absent without TLS"
        );
        describe_counter!(
            CONFIG_RELOADS,
            "Config reloads (SIGHUP, POST /admin/reload), by result: ok, refused (the settings in force stayed; the log says why)"
        );
        describe_gauge!(PEERS, "Peers of cluster.peers, by state: ready (their /readyz answered at the last probe) or unready");
        describe_histogram!(PUBLISH_TO_DELIVERY, Unit::Seconds, "Time from an event's timestamp (its publish, on the embedded log) to its first delivery");
        // PROCESS_CPU is written by the scrape itself (a counter of fractional seconds).
        describe_gauge!(OLDEST_SESSION_AGE, Unit::Seconds, "How long the oldest live session on this instance has been connected (0 without sessions)");
        describe_gauge!(PROCESS_RSS, Unit::Bytes, "Resident memory of the process");
        describe_gauge!(PROCESS_OPEN_FDS, "Open file descriptors of the process");
        describe_gauge!(PROCESS_MAX_FDS, "The process's limit of open file descriptors");
        describe_gauge!(PROCESS_START, Unit::Seconds, "Start time of the process, seconds since the Unix epoch");
        describe_counter!(DELIVERIES, "Events pushed to sessions (first deliveries and redeliveries)");
        describe_counter!(REDELIVERIES, "Events pushed again, by reason: timeout, nack, disconnect");
        describe_counter!(ACKS, "Deliveries acknowledged by clients");
        describe_counter!(DEAD_LETTERS, "Events given up on (max_attempts or term)");
        describe_histogram!(ACK_LATENCY, Unit::Seconds, "Time from a delivery to its ack");
        describe_histogram!(
            FSYNC,
            Unit::Seconds,
            "Time of each fsync that makes writes durable (storage.durability = \"power\"), by store: offsets (RocksDB: acks, dead letters), log (the embedded log: publishes); one fsync serves every write made meanwhile"
        );
        describe_counter!(
            OFFSET_WRITES,
            "Committed-offset writes, by result: advanced, stale (CAS-max kept a larger value), obsolete (for a topic deleted since), failed (batches)"
        );
        describe_counter!(BROKER_ACKS, "Deferred broker ACKs (ack_pulled_message) handed to the backend after durable offset writes, by result: ok, skipped");
        describe_counter!(PULL_EVENTS, "Events pulled from the log by partition readers");
        describe_counter!(OFFSETS_ABOVE_LOG_END, "Committed offsets found above the log end on two reads a second apart (a log that lost its tail, a topic recreated outside ackgate) and lowered to it");
        describe_counter!(
            TRANSIENT_LOG_ENDS,
            "Partitions whose log end was read below a committed offset and back above it a second later (a broker's transient answer): nothing lowered"
        );
        describe_counter!(
            LOG_TRUNCATIONS,
            "Partitions whose log lost its tail: found below the pull cursor on two reads a second apart while readers ran (a topic recreated outside ackgate, a failover to a replica behind: the sessions above the new end were closed to resubscribe), or at start below what this instance pulled or its clients acknowledged (a power loss, an unclean election): the partition's next log epoch starts at the end"
        );
        describe_counter!(READER_RESTARTS, "Partition readers that panicked and were started again a second later (each is logged as an error)");
        describe_gauge!(CONNECTIONS, "Open client connections (HTTP and WebSocket), counted until their socket closes");
        describe_counter!(
            CONNECTIONS_REFUSED,
            "Connections refused at accept, by reason: capacity (limits.max_connections), per_ip (limits.max_connections_per_ip)"
        );
        describe_counter!(UNDECODABLE_RECORDS, "Records read from the log that could not be decoded (dead-lettered as undecodable for every subscriber)");
        describe_counter!(KAFKA_HEADERS_DROPPED, "Kafka record headers dropped because their key is not UTF-8");
        describe_counter!(GAPS, "Gaps reported to clients (events retention removed before the client read them), per topic");
        describe_counter!(GAP_EVENTS, "Events in the gaps reported to clients, per topic");
        describe_counter!(DEAD_LETTERS_REDRIVEN, "Dead letters an operator marked to be delivered again (POST /admin/dead-letters/redrive)");
        describe_counter!(ROCKETMQ_POPPED, "Messages popped from the RocketMQ broker (POP mode)");
        describe_counter!(
            ROCKETMQ_UNMAPPED_REVIVED,
            "Revived RocketMQ messages whose original is neither known here nor found at the broker by its UNIQ_KEY, left to the broker"
        );
        describe_gauge!(ROCKETMQ_PENDING_HANDLES, "Popped RocketMQ messages whose broker ACK is still to be sent");
        describe_counter!(ROCKETMQ_BROKER_ACKS, "ACK requests to the RocketMQ broker (POP mode), by result: acked, retried, failed");
        describe_counter!(ROCKETMQ_INVISIBLE_EXTENSIONS, "Invisible-time extensions of popped RocketMQ messages, by result: ok, failed");
        describe_counter!(
            ROCKETMQ_OFFSET_MOVES,
            "RocketMQ PULL answers OFFSET_MOVED forward, by whether the cursor followed (only past offsets below the queue's min offset)"
        );
        describe_counter!(
            ROCKETMQ_LONG_POLLS_UNANSWERED,
            "RocketMQ long polls (POP, PULL) the broker left unanswered for the whole timeout (the queue is then read without the broker's long poll for a minute)"
        );
        describe_counter!(
            ROCKETMQ_ROUTES_REFUSED,
            "RocketMQ routes refused because they would renumber a topic's partitions (per route refresh while it lasts)"
        );
        describe_counter!(ROCKETMQ_LITE_POPPED, "RocketMQ lite-topic messages popped, per parent topic");
        describe_counter!(ROCKETMQ_LITE_RESYNCS, "Times a lite topic's group offset at the broker was set to ackgate's pull cursor, per parent topic");
        describe_counter!(PUBLISH_REPLAYS, "Publishes with an Idempotency-Key answered with the first request's offsets, nothing written");
        describe_counter!(WS_FRAMES, "WebSocket frames, by direction (in, out) and kind");
        describe_counter!(HTTP_REQUESTS, "HTTP requests, by route and status");
        describe_histogram!(HTTP_DURATION, Unit::Seconds, "HTTP request duration, by route");
        // Exported at 0 from the start: an alert's `increase()` sees a counter's first event only
        // when its series had a sample before it (a series that appears at 1 reads as no
        // increase, and `AckgateLogTruncated` never paged; deploy/prometheus/alerts_test.yml).
        for counter in [log_truncations(), reader_restarts(), offsets_above_log_end(), transient_log_ends(), undecodable_records(), dead_letters_redriven()] {
            counter.increment(0);
        }
        for reason in CONNECTION_REFUSALS {
            connections_refused(reason).increment(0);
        }
        for ok in [true, false] {
            config_reloads(ok).increment(0);
        }
        let redelivery = |reason: &'static str| metrics::counter!(REDELIVERIES, "reason" => reason);
        Self {
            deliveries: metrics::counter!(DELIVERIES),
            redeliveries: [redelivery("timeout"), redelivery("nack"), redelivery("disconnect")],
            acks: metrics::counter!(ACKS),
            dead_letters: metrics::counter!(DEAD_LETTERS),
            ack_latency: metrics::histogram!(ACK_LATENCY),
            publish_to_delivery: metrics::histogram!(PUBLISH_TO_DELIVERY),
            pull_events: metrics::counter!(PULL_EVENTS),
            publish_replays: metrics::counter!(PUBLISH_REPLAYS),
            frames_in: FRAMES_IN.map(|kind| metrics::counter!(WS_FRAMES, "direction" => "in", "kind" => kind)),
            frames_out: FRAMES_OUT.map(|kind| metrics::counter!(WS_FRAMES, "direction" => "out", "kind" => kind)),
            sessions_ended: SESSION_ENDS.map(|reason| metrics::counter!(SESSIONS_ENDED, "reason" => reason)),
        }
    }

    /// Counts `n` events pushed to a session: deliveries and their `event` frames.
    pub fn delivered(&self, n: u64) {
        self.deliveries.increment(n);
        self.frames_out[EVENT_FRAME].increment(n);
    }

    pub fn redelivered(&self, reason: RedeliveryReason) {
        self.redeliveries[reason as usize].increment(1);
    }

    pub fn session_ended(&self, how: SessionEnd) {
        let label = how.label();
        if let Some(i) = SESSION_ENDS.iter().position(|r| *r == label) {
            self.sessions_ended[i].increment(1);
        }
    }

    /// Counts a client frame of `kind` (one of `FRAMES_IN`; anything else counts as invalid).
    pub fn frame_in(&self, kind: &str) {
        let i = FRAMES_IN.iter().position(|k| *k == kind).unwrap_or(FRAMES_IN.len() - 1);
        self.frames_in[i].increment(1);
    }

    /// Counts a gateway frame of `kind` (one of `FRAMES_OUT`).
    pub fn frame_out(&self, kind: &str) {
        if let Some(i) = FRAMES_OUT.iter().position(|k| *k == kind) {
            self.frames_out[i].increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_frame_index_names_the_event_kind() {
        assert_eq!(FRAMES_OUT[EVENT_FRAME], "event");
    }

    #[test]
    fn every_close_code_a_session_sends_has_its_own_end_reason() {
        use crate::core::protocol::close_code::*;
        for code in [GOING_AWAY, DRAINING, TAKEN_OVER, OPERATOR, SLOW_CLIENT, TOO_BIG, TOKEN_EXPIRED] {
            assert!(SESSION_ENDS.contains(&SessionEnd::Closed(code).label()), "{code}");
        }
        let labels: std::collections::BTreeSet<&str> =
            [GOING_AWAY, DRAINING, TAKEN_OVER, OPERATOR, SLOW_CLIENT, TOO_BIG, TOKEN_EXPIRED].map(|c| SessionEnd::Closed(c).label()).into_iter().collect();
        assert_eq!(labels.len(), 7, "two codes share a reason: {labels:?}");
        for end in [SessionEnd::ClientLeft, SessionEnd::DeadPeer, SessionEnd::WriteFailed] {
            assert!(SESSION_ENDS.contains(&end.label()));
        }
    }
}
