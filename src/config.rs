//! Configuration: `config.toml` plus `ACKGATE_<SECTION>__<KEY>` environment overrides.
//!
//! Every field has a default equal to the one in the repository's `config.toml`; unknown keys are
//! an error that names the key. `Config::validate` checks values after loading.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub embedded: EmbeddedConfig,
    pub kafka: KafkaConfig,
    pub rocketmq: RocketMqConfig,
    pub offsets: OffsetsConfig,
    pub dead_letters: DeadLettersConfig,
    pub publish: PublishConfig,
    pub delivery: DeliveryConfig,
    pub limits: LimitsConfig,
    pub auth: AuthConfig,
    pub cluster: ClusterConfig,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// HTTP and WebSocket address. Port 0 picks a free port (tests).
    pub listen: String,
    /// Name in `welcome` and `/session/recommend`; empty means host name + port.
    pub instance_id: String,
    /// How other instances and clients reach this one; empty means `http://<listen>`.
    pub public_url: String,
    /// How long shutdown waits for sessions to close and writes to drain.
    pub shutdown_grace_ms: u64,
    /// Draining (SIGTERM, `POST /admin/drain`) closes the sessions over this window, each with a
    /// `reconnect` frame and 1012; 0 = SIGTERM closes them all at once with 1001.
    pub drain_ms: u64,
    /// `text` or `json` log lines.
    pub log_format: String,
    /// PEM certificate chain; with `tls_key`, the listener speaks only TLS (https, wss).
    pub tls_cert: String,
    /// PEM private key of `tls_cert`. Both files are read again on SIGHUP.
    pub tls_key: String,
    /// A TLS handshake not finished after this closes the connection.
    pub tls_handshake_timeout_ms: u64,
    /// Origins (`scheme://host[:port]`) whose pages may open sessions and call POST, PUT and
    /// DELETE routes, besides the gateway's own, its `public_url` and the `cluster.peers`
    /// instances; `"*"` allows any.
    pub allowed_origins: Vec<String>,
    /// Host names (or `host:port`) requests may be addressed to. On a loopback listener
    /// `localhost`, `127.0.0.1`, `[::1]` and the `public_url` host are always allowed and any other
    /// host is refused (DNS rebinding); elsewhere the check applies only when this is set.
    pub allowed_hosts: Vec<String>,
    /// A connection that has not sent a whole request head this long after it was accepted (or,
    /// between requests, after the head's first byte) is closed.
    pub header_read_timeout_ms: u64,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout_ms: u64,
    /// The gateway pings each WebSocket this often; 0 = never.
    pub ws_ping_interval_ms: u64,
    /// A WebSocket from which nothing (a pong or a frame) arrived for this long is a dead peer:
    /// its session ends and its deliveries are released.
    pub ws_pong_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            instance_id: String::new(),
            public_url: String::new(),
            shutdown_grace_ms: 10_000,
            drain_ms: 10_000,
            log_format: "text".into(),
            tls_cert: String::new(),
            tls_key: String::new(),
            tls_handshake_timeout_ms: 10_000,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            ws_ping_interval_ms: 25_000,
            ws_pong_timeout_ms: 60_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// `embedded` (the default), `kafka` or `rocketmq`.
    pub backend: String,
    /// RocksDB databases (`log`, `offsets`) and the pull checkpoint file live here.
    pub data_dir: PathBuf,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self { backend: "embedded".into(), data_dir: PathBuf::from("data") }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// Partitions of a topic created by its first publish.
    pub default_partitions: u32,
    /// Events older than this are deleted; 0 keeps them forever.
    pub retention_secs: u64,
    /// A partition larger than this (encoded bytes) loses its oldest events; 0 = no limit.
    pub retention_bytes_per_partition: u64,
    /// How often retention runs.
    pub retention_check_interval_ms: u64,
    /// fsync the log's WAL on every publish (power-loss durability, slower).
    pub sync_writes: bool,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self { default_partitions: 4, retention_secs: 604_800, retention_bytes_per_partition: 1 << 30, retention_check_interval_ms: 60_000, sync_writes: false }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Kafka brokers, `host:port,host:port`; used when `storage.backend = "kafka"`.
    pub bootstrap_servers: String,
    /// Topics served; empty serves every topic of the cluster except internal `__*` ones.
    pub topics: Vec<String>,
    /// Replication factor of topics created through `POST /topics`.
    pub replication_factor: i32,
    /// Bound of metadata, watermark and admin requests; also how long start waits for a broker.
    pub request_timeout_ms: u64,
    /// A publish the brokers have not confirmed within this fails with `unavailable`.
    pub publish_timeout_ms: u64,
    /// How often partition counts are read from the cluster: partitions added to a topic reach
    /// its live subscriptions (from their log start) within this.
    pub metadata_refresh_ms: u64,
    /// librdkafka properties passed to every client, e.g. `"security.protocol" = "SASL_SSL"`.
    /// `group.id`, `enable.auto.commit` and the producer's `acks`/`enable.idempotence` are set by
    /// ackgate and cannot be overridden.
    pub properties: std::collections::BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: String::new(),
            topics: Vec::new(),
            replication_factor: 1,
            request_timeout_ms: 5000,
            publish_timeout_ms: 10_000,
            metadata_refresh_ms: 30_000,
            properties: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RocketMqConfig {
    /// `pop` (RocketMQ 5.x POP with the deferred broker ACK) or `pull` (4.x PULL, self-managed cursor).
    pub mode: String,
    /// Name server, `host:port`; used when `storage.backend = "rocketmq"`.
    pub namesrv_addr: String,
    /// Topics served; empty serves every topic the name server knows (system topics excepted).
    pub topics: Vec<String>,
    /// Consumer group named in POP and PULL requests (the protocol requires one). ackgate never
    /// commits an offset with it; give each ackgate deployment its own.
    pub consumer_group: String,
    /// POP: how long the broker keeps a popped message invisible before reviving it; ackgate
    /// extends it while a live client still owes the ack.
    pub invisible_time_ms: u64,
    /// Bound of every request to the name server and broker (long polls add their wait).
    pub request_timeout_ms: u64,
    /// A publish the broker has not confirmed within this fails with `unavailable`.
    pub publish_timeout_ms: u64,
}

impl Default for RocketMqConfig {
    fn default() -> Self {
        Self {
            mode: "pop".into(),
            namesrv_addr: String::new(),
            topics: Vec::new(),
            consumer_group: "ackgate".into(),
            invisible_time_ms: 30_000,
            request_timeout_ms: 5000,
            publish_timeout_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OffsetsConfig {
    /// `rocksdb` (durable, the default) or `memory` (lost at restart).
    pub store: String,
    /// Pull-offset checkpoint period.
    pub checkpoint_interval_ms: u64,
    /// Offsets of clients absent longer than this expire (from the stored `updated_at`); 0 means
    /// never (as `embedded.retention_secs = 0` keeps events forever).
    pub retention_secs: u64,
    /// How often expired offsets are swept.
    pub sweep_interval_ms: u64,
    /// fsync every offset batch (power-loss durability, slower). Off: WAL without fsync, which
    /// survives a process crash.
    pub sync_writes: bool,
}

impl Default for OffsetsConfig {
    fn default() -> Self {
        Self { store: "rocksdb".into(), checkpoint_interval_ms: 5_000, retention_secs: 604_800, sweep_interval_ms: 60_000, sync_writes: false }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// An unacknowledged delivery is redelivered after this.
    pub ack_timeout_ms: u64,
    /// Unacknowledged deliveries per session.
    pub max_in_flight: usize,
    /// Payload bytes of a session's unacknowledged deliveries (a larger event still goes, alone).
    pub max_in_flight_bytes: u32,
    /// Deliveries of one event to one client before it becomes a dead letter.
    pub max_attempts: u32,
    /// Where a client without a stored offset starts: `earliest` or `latest`.
    pub reset_policy: String,
    /// A session whose in-flight window stays full with no ack or term arriving for this long is
    /// closed with 4003, and one whose socket takes no writes this long is dropped; 0 = never.
    pub slow_client_timeout_ms: u64,
    /// Events each partition reader keeps in memory for its subscribers.
    pub reader_buffer_events: usize,
    /// Payload bytes each partition reader keeps in memory at most (the newest event always).
    pub reader_buffer_bytes: usize,
    /// Events read from the log in one go.
    pub fetch_batch: usize,
    /// The pause before attempt n+1 after attempt n timed out or was nacked without `delay_ms`:
    /// the n-th value, the last repeating; empty = at once.
    pub redelivery_backoff_ms: Vec<u64>,
    /// Per-topic rules, by pattern (an exact name, or a prefix ending in `*`; the exact name,
    /// else the longest prefix, wins): `[delivery.topics."orders.*"]`.
    pub topics: BTreeMap<String, TopicDeliveryConfig>,
}

/// `[delivery.topics."<pattern>"]`: what a topic does differently from `[delivery]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicDeliveryConfig {
    pub ack_timeout_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub redelivery_backoff_ms: Option<Vec<u64>>,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            ack_timeout_ms: 30_000,
            max_in_flight: 1000,
            max_in_flight_bytes: 64 << 20,
            max_attempts: 16,
            reset_policy: "earliest".into(),
            slow_client_timeout_ms: 300_000,
            reader_buffer_events: 10_000,
            reader_buffer_bytes: 64 << 20,
            fetch_batch: 256,
            redelivery_backoff_ms: Vec::new(),
            topics: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Larger WebSocket frames close the socket with 1009.
    pub max_frame_bytes: usize,
    /// Read buffer of each WebSocket connection, allocated for its whole life: the main cost of an
    /// idle session. Frames larger than it still arrive (in several reads).
    pub ws_read_buffer_bytes: usize,
    /// Events in one publish request.
    pub max_batch_events: usize,
    /// Size of one REST request body.
    pub max_body_bytes: usize,
    /// Live sessions on this instance.
    pub max_sessions: usize,
    /// Topics one session may subscribe to.
    pub max_subscriptions_per_session: usize,
    /// Live sessions subscribed to one topic on this instance.
    pub max_clients_per_topic: usize,
    /// Offline clients whose ack state is kept in memory (they left with unacknowledged
    /// deliveries; attempt counts continue when they come back). Beyond it the oldest is
    /// forgotten and its attempt counts restart at 1.
    pub max_offline_clients: usize,
    /// After a connection is done (a close frame sent, an error answered), ackgate keeps reading
    /// and discarding what the client still sends for up to this long, so the client reads the
    /// answer instead of a TCP reset.
    pub close_drain_ms: u64,
    /// ...and at most this many bytes.
    pub close_drain_bytes: usize,
    /// Open connections (HTTP and WebSocket), lowered at start to what the open-files limit
    /// allows; beyond it a new connection gets 503 `unavailable` before anything is read.
    pub max_connections: usize,
    /// Open connections from one IP address; 0 = no limit. Beyond it 429 `limit_exceeded`.
    pub max_connections_per_ip: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1_048_576,
            ws_read_buffer_bytes: 1024,
            max_batch_events: 10_000,
            max_body_bytes: 16_777_216,
            max_sessions: 100_000,
            max_subscriptions_per_session: 100,
            max_clients_per_topic: 100_000,
            max_offline_clients: 10_000,
            close_drain_ms: 1000,
            close_drain_bytes: 67_108_864,
            max_connections: 100_000,
            max_connections_per_ip: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLettersConfig {
    /// Dead letters older than this are removed (checked every `offsets.sweep_interval_ms`);
    /// 0 keeps them forever.
    pub retention_secs: u64,
}

impl Default for DeadLettersConfig {
    fn default() -> Self {
        Self { retention_secs: 604_800 }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// How long a publish's `Idempotency-Key` answers a retry with the first offsets instead of
    /// writing again (at most 7 days).
    pub idempotency_window_secs: u64,
    /// Keys remembered at most (across topics); a publish with a new key beyond it gets 429.
    pub idempotency_max_keys: usize,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self { idempotency_window_secs: 300, idempotency_max_keys: 1_000_000 }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Bearer token for `/admin/*`, publishing, and creating or deleting topics; empty = no auth.
    pub admin_token: String,
    /// HS256 secret for `/ws` tokens (`sub` = client_id, optional `exp` and `topics`); empty = no auth.
    /// At least 32 bytes.
    pub jwt_secret: String,
    /// A `server.listen` off loopback refuses to start while `admin_token` or `jwt_secret` is
    /// empty, unless this is true (then it starts with a warning).
    pub allow_anonymous: bool,
    /// When set, a token's `aud` must contain it.
    pub jwt_audience: String,
    /// When set, a token's `iss` must equal it.
    pub jwt_issuer: String,
    /// When set (seconds), a token needs an `exp` at most this far ahead; 0 = off.
    pub jwt_max_lifetime_secs: u64,
}

/// The smallest `auth.jwt_secret`: an HS256 key shorter than the hash is guessable offline from
/// any one token.
pub const MIN_JWT_SECRET_BYTES: usize = 32;

impl ServerConfig {
    /// True when `listen` is a loopback address (only this machine can connect).
    pub fn listens_on_loopback(&self) -> bool {
        self.listen.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `public_url`s of the other instances.
    pub peers: Vec<String>,
    /// How often each peer's `/readyz` is probed (also the probe's timeout).
    pub probe_interval_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self { peers: Vec::new(), probe_interval_ms: 2000 }
    }
}

/// Prefix of environment overrides: `ACKGATE_DELIVERY__ACK_TIMEOUT_MS=500`.
pub const ENV_PREFIX: &str = "ACKGATE_";

/// Pauses in one backoff list at most.
pub const MAX_BACKOFF_STEPS: usize = 64;

impl Config {
    /// `delivery.redelivery_backoff_ms` and `[delivery.topics."<pattern>"]`.
    fn validate_redelivery(&self, problems: &mut Vec<String>, max_period_ms: u64) {
        let mut backoffs = vec![("delivery.redelivery_backoff_ms".to_string(), &self.delivery.redelivery_backoff_ms)];
        for (pattern, rules) in &self.delivery.topics {
            let key = format!("delivery.topics.{pattern:?}");
            let name = pattern.strip_suffix('*').unwrap_or(pattern);
            if !(name.is_empty() && pattern == "*") && crate::core::names::TopicName::parse(name).is_err() {
                problems.push(format!("{key}: a pattern is a topic name, or a prefix of one ending in *"));
            }
            if let Some(ms) = rules.ack_timeout_ms.filter(|ms| *ms == 0 || *ms > max_period_ms) {
                problems.push(format!("{key}.ack_timeout_ms must be between 1 and {max_period_ms}, got {ms}"));
            }
            if rules.max_attempts == Some(0) {
                problems.push(format!("{key}.max_attempts must be greater than 0"));
            }
            if let Some(backoff) = &rules.redelivery_backoff_ms {
                backoffs.push((format!("{key}.redelivery_backoff_ms"), backoff));
            }
        }
        for (key, backoff) in backoffs {
            if backoff.len() > MAX_BACKOFF_STEPS {
                problems.push(format!("{key} holds at most {MAX_BACKOFF_STEPS} pauses, got {}", backoff.len()));
            }
            if let Some(ms) = backoff.iter().find(|ms| **ms > max_period_ms) {
                problems.push(format!("{key}: a pause is at most {max_period_ms} ms, got {ms}"));
            }
        }
    }

    /// Loads `path` (a missing file is allowed only when `required` is false), applies the
    /// environment overrides in `env`, and validates the result.
    pub fn load(path: &Path, required: bool, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<Self> {
        let mut table = match std::fs::read_to_string(path) {
            Ok(text) => text.parse::<toml::Table>().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => toml::Table::new(),
            Err(e) => anyhow::bail!("cannot read config {}: {e}", path.display()),
        };
        apply_env(&mut table, env)?;
        // Re-parsed from text so that a type error shows the offending `key = value` line.
        let merged = toml::to_string(&table)?;
        let config: Config = toml::from_str(&merged).map_err(|e| anyhow::anyhow!("config (file merged with ACKGATE_* overrides): {e}"))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let mut problems = Vec::new();
        if self.server.listen.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!("server.listen {:?} is not an ip:port address", self.server.listen));
        }
        if !matches!(self.server.log_format.as_str(), "text" | "json") {
            problems.push(format!("server.log_format must be \"text\" or \"json\", got {:?}", self.server.log_format));
        }
        if self.server.tls_cert.is_empty() != self.server.tls_key.is_empty() {
            problems.push("server.tls_cert and server.tls_key are set together (both PEM paths) or not at all".into());
        }
        if !self.server.listens_on_loopback() && (self.auth.admin_token.is_empty() || self.auth.jwt_secret.is_empty()) && !self.auth.allow_anonymous {
            problems.push(format!(
                "server.listen {:?} is not a loopback address, and auth.admin_token or auth.jwt_secret is empty: anyone who can reach it could \
                 read, publish, reset offsets and act as any client. Set both keys, or set auth.allow_anonymous = true to serve without them \
                 (README, \"Before you expose it\")",
                self.server.listen
            ));
        }
        if !self.auth.jwt_secret.is_empty() && self.auth.jwt_secret.len() < MIN_JWT_SECRET_BYTES {
            problems.push(format!("auth.jwt_secret must be at least {MIN_JWT_SECRET_BYTES} bytes (it has {})", self.auth.jwt_secret.len()));
        }
        for origin in &self.server.allowed_origins {
            if origin != "*" && crate::http::exposure::parse_origin(origin).is_none() {
                problems.push(format!("server.allowed_origins: {origin:?} is not \"*\" or scheme://host[:port]"));
            }
        }
        if self.server.tls_handshake_timeout_ms == 0 {
            problems.push("server.tls_handshake_timeout_ms must be at least 1".into());
        }
        match self.storage.backend.as_str() {
            "embedded" => {}
            "kafka" => {
                if self.kafka.bootstrap_servers.trim().is_empty() {
                    problems.push("kafka.bootstrap_servers must be set when storage.backend = \"kafka\"".into());
                }
                for name in &self.kafka.topics {
                    if crate::core::names::TopicName::parse(name).is_err() {
                        problems.push(format!("kafka.topics: {name:?} is not a valid topic name"));
                    }
                }
                for key in ["group.id", "enable.auto.commit", "enable.auto.offset.store", "acks", "enable.idempotence", "bootstrap.servers"] {
                    if self.kafka.properties.contains_key(key) {
                        problems.push(format!("kafka.properties.{key:?} is set by ackgate and cannot be overridden"));
                    }
                }
                if self.kafka.replication_factor < 1 {
                    problems.push("kafka.replication_factor must be at least 1".into());
                }
            }
            "rocketmq" => {
                let r = &self.rocketmq;
                if r.namesrv_addr.trim().is_empty() {
                    problems.push("rocketmq.namesrv_addr must be set when storage.backend = \"rocketmq\"".into());
                }
                if !matches!(r.mode.as_str(), "pop" | "pull") {
                    problems.push(format!("rocketmq.mode must be \"pop\" or \"pull\", got {:?}", r.mode));
                }
                if r.consumer_group.trim().is_empty() || r.consumer_group.len() > 255 {
                    problems.push("rocketmq.consumer_group must be 1 to 255 characters".into());
                }
                for name in &r.topics {
                    if crate::core::names::TopicName::parse(name).is_err() {
                        problems.push(format!("rocketmq.topics: {name:?} is not a valid topic name"));
                    }
                }
                if r.invisible_time_ms < 1000 {
                    problems.push(format!("rocketmq.invisible_time_ms must be at least 1000, got {}", r.invisible_time_ms));
                }
            }
            other => problems.push(format!("storage.backend must be \"embedded\", \"kafka\" or \"rocketmq\", got {other:?}")),
        }
        if !matches!(self.offsets.store.as_str(), "rocksdb" | "memory") {
            problems.push(format!("offsets.store must be \"rocksdb\" or \"memory\", got {:?}", self.offsets.store));
        }
        if !matches!(self.delivery.reset_policy.as_str(), "earliest" | "latest") {
            problems.push(format!("delivery.reset_policy must be \"earliest\" or \"latest\", got {:?}", self.delivery.reset_policy));
        }
        let positive = [
            ("embedded.default_partitions", self.embedded.default_partitions as u64),
            ("embedded.retention_check_interval_ms", self.embedded.retention_check_interval_ms),
            ("kafka.request_timeout_ms", self.kafka.request_timeout_ms),
            ("cluster.probe_interval_ms", self.cluster.probe_interval_ms),
            ("kafka.publish_timeout_ms", self.kafka.publish_timeout_ms),
            ("kafka.metadata_refresh_ms", self.kafka.metadata_refresh_ms),
            ("rocketmq.request_timeout_ms", self.rocketmq.request_timeout_ms),
            ("rocketmq.publish_timeout_ms", self.rocketmq.publish_timeout_ms),
            ("offsets.checkpoint_interval_ms", self.offsets.checkpoint_interval_ms),
            ("offsets.sweep_interval_ms", self.offsets.sweep_interval_ms),
            ("delivery.ack_timeout_ms", self.delivery.ack_timeout_ms),
            ("delivery.max_in_flight", self.delivery.max_in_flight as u64),
            ("delivery.max_in_flight_bytes", self.delivery.max_in_flight_bytes as u64),
            ("delivery.max_attempts", self.delivery.max_attempts as u64),
            ("delivery.reader_buffer_events", self.delivery.reader_buffer_events as u64),
            ("delivery.reader_buffer_bytes", self.delivery.reader_buffer_bytes as u64),
            ("delivery.fetch_batch", self.delivery.fetch_batch as u64),
            ("limits.max_frame_bytes", self.limits.max_frame_bytes as u64),
            ("limits.ws_read_buffer_bytes", self.limits.ws_read_buffer_bytes as u64),
            ("limits.max_batch_events", self.limits.max_batch_events as u64),
            ("limits.max_body_bytes", self.limits.max_body_bytes as u64),
            ("limits.max_sessions", self.limits.max_sessions as u64),
            ("limits.max_subscriptions_per_session", self.limits.max_subscriptions_per_session as u64),
            ("limits.max_clients_per_topic", self.limits.max_clients_per_topic as u64),
            ("limits.max_connections", self.limits.max_connections as u64),
            ("server.header_read_timeout_ms", self.server.header_read_timeout_ms),
            ("server.idle_timeout_ms", self.server.idle_timeout_ms),
            ("server.ws_pong_timeout_ms", self.server.ws_pong_timeout_ms),
            ("publish.idempotency_window_secs", self.publish.idempotency_window_secs),
            ("publish.idempotency_max_keys", self.publish.idempotency_max_keys as u64),
        ];
        for (key, value) in positive {
            if value == 0 {
                problems.push(format!("{key} must be greater than 0"));
            }
        }
        // Periods are added to clock readings; far beyond any sane value they would overflow.
        const MAX_PERIOD_MS: u64 = 31 * 86_400_000;
        let periods = [
            ("server.shutdown_grace_ms", self.server.shutdown_grace_ms),
            ("server.drain_ms", self.server.drain_ms),
            ("embedded.retention_check_interval_ms", self.embedded.retention_check_interval_ms),
            ("kafka.request_timeout_ms", self.kafka.request_timeout_ms),
            ("kafka.publish_timeout_ms", self.kafka.publish_timeout_ms),
            ("kafka.metadata_refresh_ms", self.kafka.metadata_refresh_ms),
            ("rocketmq.request_timeout_ms", self.rocketmq.request_timeout_ms),
            ("rocketmq.publish_timeout_ms", self.rocketmq.publish_timeout_ms),
            ("offsets.checkpoint_interval_ms", self.offsets.checkpoint_interval_ms),
            ("offsets.sweep_interval_ms", self.offsets.sweep_interval_ms),
            ("delivery.ack_timeout_ms", self.delivery.ack_timeout_ms),
            ("delivery.slow_client_timeout_ms", self.delivery.slow_client_timeout_ms),
            ("limits.close_drain_ms", self.limits.close_drain_ms),
            ("server.header_read_timeout_ms", self.server.header_read_timeout_ms),
            ("server.idle_timeout_ms", self.server.idle_timeout_ms),
            ("server.ws_ping_interval_ms", self.server.ws_ping_interval_ms),
            ("server.ws_pong_timeout_ms", self.server.ws_pong_timeout_ms),
            ("auth.jwt_max_lifetime_secs (as ms)", self.auth.jwt_max_lifetime_secs.saturating_mul(1000)),
        ];
        self.validate_redelivery(&mut problems, MAX_PERIOD_MS);
        if self.publish.idempotency_window_secs > 7 * 86_400 {
            problems.push(format!("publish.idempotency_window_secs must be at most 604800 (7 days), got {}", self.publish.idempotency_window_secs));
        }
        for (key, value) in periods {
            if value > MAX_PERIOD_MS {
                problems.push(format!("{key} must be at most {MAX_PERIOD_MS} (31 days), got {value}"));
            }
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            problems.push("storage.data_dir must not be empty".into());
        }
        // Retentions are multiplied into milliseconds and added to clock readings.
        const MAX_RETENTION_SECS: u64 = 100 * 365 * 86_400;
        let retentions = [
            ("offsets.retention_secs", self.offsets.retention_secs),
            ("embedded.retention_secs", self.embedded.retention_secs),
            ("dead_letters.retention_secs", self.dead_letters.retention_secs),
        ];
        for (key, value) in retentions {
            if value > MAX_RETENTION_SECS {
                problems.push(format!("{key} must be at most {MAX_RETENTION_SECS} (100 years; 0 = never expire), got {value}"));
            }
        }
        if self.embedded.default_partitions > 10_000 {
            problems.push("embedded.default_partitions must be at most 10000".into());
        }
        if self.server.ws_ping_interval_ms != 0 && self.server.ws_ping_interval_ms >= self.server.ws_pong_timeout_ms {
            problems.push("server.ws_ping_interval_ms must be below server.ws_pong_timeout_ms (a healthy peer answers each ping)".into());
        }
        if self.delivery.max_in_flight > 1_000_000 {
            problems.push("delivery.max_in_flight must be at most 1000000".into());
        }

        if problems.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("invalid configuration:\n  {}", problems.join("\n  "))
        }
    }
}

/// Applies `ACKGATE_<SECTION>__<KEY>=value` overrides. A value is read as a TOML value when it
/// parses as one (`500`, `true`, `["a"]`), otherwise as a string.
fn apply_env(table: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<()> {
    // The defaults say which keys hold text: their values are taken as written, never parsed as
    // TOML (`ACKGATE_AUTH__ADMIN_TOKEN=12345` is the token "12345", not a number).
    let defaults = toml::Table::try_from(Config::default())?;
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else { continue };
        let Some((section, key)) = rest.split_once("__") else {
            // Other ACKGATE_* variables (the scripts' own) are not config; a section and one of its
            // keys joined by a single underscore is a config key mistyped, and was ignored silently.
            let lower = rest.to_ascii_lowercase();
            let mistyped = defaults.iter().find_map(|(section, keys)| {
                let key = lower.strip_prefix(section.as_str())?.strip_prefix('_')?;
                keys.get(key).map(|_| (section, key))
            });
            if let Some((section, key)) = mistyped {
                anyhow::bail!(
                    "{name}: a config key is ACKGATE_<SECTION>__<KEY>, with two underscores: did you mean {ENV_PREFIX}{}__{}?",
                    section.to_ascii_uppercase(),
                    key.to_ascii_uppercase()
                );
            }
            continue;
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let text_key = defaults.get(&section).and_then(|s| s.get(&key)).is_some_and(toml::Value::is_str);
        let value = if text_key {
            toml::Value::String(raw.clone())
        } else {
            format!("v = {raw}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or_else(|| toml::Value::String(raw.clone()))
        };
        let section_table = table.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(section_table) = section_table.as_table_mut() else {
            anyhow::bail!("{name}: config key {section} is not a section");
        };
        section_table.insert(key, value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> anyhow::Result<Config> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path, true, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn repository_config_equals_the_defaults() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
        let from_file = load(&text, &[]).unwrap();
        let defaults = Config::default();
        assert_eq!(toml::to_string(&from_file).unwrap(), toml::to_string(&defaults).unwrap());
    }

    #[test]
    fn env_overrides_keys() {
        let c = load("", &[("ACKGATE_DELIVERY__ACK_TIMEOUT_MS", "500"), ("ACKGATE_SERVER__LISTEN", "127.0.0.1:0"), ("ACKGATE_TARGET", "x")]).unwrap();
        assert_eq!(c.delivery.ack_timeout_ms, 500);
        assert_eq!(c.server.listen, "127.0.0.1:0");
        let c = load("", &[("ACKGATE_CLUSTER__PEERS", r#"["http://a:1"]"#)]).unwrap();
        assert_eq!(c.cluster.peers, vec!["http://a:1".to_string()]);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = load("[delivery]\nack_timeout = 5\n", &[]).unwrap_err().to_string();
        assert!(e.contains("ack_timeout"), "{e}");
        let e = load("", &[("ACKGATE_NOPE__X", "1")]).unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
        let e = load("[delivery]\nmax_in_flight = 0\nreset_policy = \"middle\"\n", &[]).unwrap_err().to_string();
        assert!(e.contains("delivery.max_in_flight") && e.contains("reset_policy"), "{e}");
        let e = load("", &[("ACKGATE_OFFSETS__CHECKPOINT_INTERVAL_MS", "99999999999999")]).unwrap_err().to_string();
        assert!(e.contains("offsets.checkpoint_interval_ms"), "{e}");
        let e = load("", &[("ACKGATE_DELIVERY__MAX_ATTEMPTS", "many")]).unwrap_err().to_string();
        assert!(e.contains("max_attempts"), "a type error shows the key: {e}");
    }

    /// Issue 23: a text key takes an environment value as written (a numeric admin token used
    /// to stop the start with a type error), and a section name followed by a single underscore is
    /// a mistyped key, refused with the right spelling instead of ignored.
    #[test]
    fn environment_values_of_text_keys_are_text_and_mistyped_names_are_named() {
        let c = load("", &[("ACKGATE_AUTH__ADMIN_TOKEN", "12345"), ("ACKGATE_SERVER__INSTANCE_ID", "true"), ("ACKGATE_DELIVERY__MAX_ATTEMPTS", "3")]).unwrap();
        assert_eq!((c.auth.admin_token.as_str(), c.server.instance_id.as_str(), c.delivery.max_attempts), ("12345", "true", 3));
        let e = load("", &[("ACKGATE_DELIVERY_ACK_TIMEOUT_MS", "500")]).unwrap_err().to_string();
        assert!(e.contains("did you mean ACKGATE_DELIVERY__ACK_TIMEOUT_MS"), "{e}");
        // The scripts' own variables are not config.
        assert!(load("", &[("ACKGATE_TANSU_ROOT", "/x"), ("ACKGATE_CRASH_ROUNDS", "3"), ("ACKGATE_ROCKETMQ_ROOT", "/y")]).is_ok());
    }

    #[test]
    fn redelivery_rules_are_checked() {
        let ok = load(
            "[delivery]\nredelivery_backoff_ms = [100, 1000]\n[delivery.topics.\"orders.*\"]\nmax_attempts = 3\n[delivery.topics.\"*\"]\nack_timeout_ms = 5\n",
            &[],
        )
        .unwrap();
        assert_eq!(ok.delivery.redelivery_backoff_ms, vec![100, 1000]);
        assert_eq!(ok.delivery.topics["orders.*"].max_attempts, Some(3));
        let e = load("[delivery.topics.\"bad name*\"]\nmax_attempts = 0\n", &[]).unwrap_err().to_string();
        assert!(e.contains("a pattern is a topic name") && e.contains("max_attempts must be greater than 0"), "{e}");
        let e = load("[delivery]\nredelivery_backoff_ms = [99999999999]\n", &[]).unwrap_err().to_string();
        assert!(e.contains("a pause is at most"), "{e}");
        let e = load(&format!("[delivery]\nredelivery_backoff_ms = [{}]\n", vec!["1"; 65].join(",")), &[]).unwrap_err().to_string();
        assert!(e.contains("at most 64 pauses"), "{e}");
        let e = load("[delivery.topics.\"x\"]\nretries = 1\n", &[]).unwrap_err().to_string();
        assert!(e.contains("retries"), "unknown keys are an error: {e}");
    }
}
