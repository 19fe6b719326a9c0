//! Settings changed without a restart (SIGHUP, `POST /admin/reload`): the config file is read
//! again as at start (the file, then the `ACKGATE_*` environment), and what may change while the
//! gateway runs is applied to what comes next; a change of anything else refuses the whole
//! reload, naming the keys, and the running settings stay as they were.
//!
//! What a reload changes, and where it takes effect:
//! - the delivery settings (`delivery.ack_timeout_ms`, `max_attempts`, `redelivery_backoff_ms`,
//!   `topics`, `max_in_flight`, `max_in_flight_bytes`, `group_max_in_flight`, `group_max_nack_delay_ms`, `reset_policy`,
//!   `progress_interval_ms`) and
//!   the session limits (`limits.max_sessions`, `max_groups`, `max_subscriptions_per_session`,
//!   `max_subscribes_per_sec`, `max_rewind_events`, `max_clients_per_topic`): the next session,
//!   subscribe or delivery uses them; a live session keeps the window it opened with and a
//!   subscription the redelivery policy it started with;
//! - `server.allowed_origins` and `server.allowed_hosts`: the next request;
//! - `server.log_level`: the next log line;
//! - `auth.jwt_secret`, from one secret to another (not from or to empty, which turns HS256
//!   tokens on or off): every token checked from then on (a handshake, a `refresh` frame, an
//!   SSE session's frame POST); a WebSocket session keeps the credentials it has until they
//!   expire.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use serde_json::Value;

use crate::config::Config;
use crate::core::delivery_settings::DeliverySettings;
use crate::core::dispatcher::Dispatcher;
use crate::core::live::Live;
use crate::core::redelivery::{RedeliveryPolicies, RedeliveryPolicy};
use crate::http::auth::TokenKeys;
use crate::http::exposure::Exposure;
use crate::http::reload::{ConfigReload, ReloadRefused};

/// The keys a reload may change (a key, or a table whose every key may change).
pub const LIVE_KEYS: &[&str] = &[
    "delivery.ack_timeout_ms",
    "delivery.max_attempts",
    "delivery.redelivery_backoff_ms",
    "delivery.topics",
    "delivery.max_in_flight",
    "delivery.max_in_flight_bytes",
    "delivery.group_max_in_flight",
    "delivery.group_max_nack_delay_ms",
    "delivery.reset_policy",
    "delivery.progress_interval_ms",
    "limits.max_sessions",
    "limits.max_groups",
    "limits.max_subscriptions_per_session",
    "limits.max_subscribes_per_sec",
    "limits.max_rewind_events",
    "limits.max_clients_per_topic",
    "server.allowed_origins",
    "server.allowed_hosts",
    "server.log_level",
    "auth.jwt_secret",
];

/// Sets the log filter (`server.log_level`); `Err` says why the text is no filter.
pub type SetLogFilter = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Where the configuration came from, to read it again.
pub struct ConfigFile {
    pub path: PathBuf,
    /// A missing file is an error (a path named on the command line), else all defaults.
    pub required: bool,
    /// `None`: the log filter is not ours to change (RUST_LOG is set, or no logs were set up).
    pub set_log_filter: Option<SetLogFilter>,
}

impl ConfigFile {
    /// A reload refused for what the file says: the next start reads the same file, so it is
    /// said now, not at that restart.
    fn refused(&self, why: String) -> ReloadRefused {
        ReloadRefused::Unreadable(format!(
            "{why} (a restart with this file would stop with the same error; `ackgate --config {} check` checks a file without starting)",
            self.path.display()
        ))
    }
}

pub struct Reloader {
    file: OnceLock<ConfigFile>,
    /// The settings in force: the start's, then each applied reload's. Locked for the whole of a
    /// reload, so two at once apply one after the other.
    current: Mutex<Config>,
    /// Weak: the shutdown closes the stores when the last strong reference goes.
    dispatcher: Weak<Dispatcher>,
    exposure: Arc<Live<Exposure>>,
    token_keys: Arc<TokenKeys>,
}

impl Reloader {
    pub fn new(config: Config, dispatcher: &Arc<Dispatcher>, exposure: Arc<Live<Exposure>>, token_keys: Arc<TokenKeys>) -> Self {
        Self { file: OnceLock::new(), current: Mutex::new(config), dispatcher: Arc::downgrade(dispatcher), exposure, token_keys }
    }

    /// Reloads read `file` from now on (set once: the binary's `--config`).
    pub fn read_from(&self, file: ConfigFile) {
        let _ = self.file.set(file);
    }
}

impl ConfigReload for Reloader {
    fn reload(&self) -> Result<Vec<String>, ReloadRefused> {
        let file = self.file.get().ok_or_else(|| ReloadRefused::Unreadable("this gateway was not started from a config file".into()))?;
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        // A file refused here would stop the next start too: said now, not at that restart.
        let new = Config::load(&file.path, file.required, std::env::vars()).map_err(|e| file.refused(format!("{e:#}")))?;
        let changed = changed_keys(&current, &new);
        let mut refused: Vec<String> = changed.iter().filter(|key| !is_live(key)).cloned().collect();
        // Whether tokens are required at all was decided at start (routes, warnings, the
        // checks of `auth.jwks_url` beside it): only a restart turns HS256 tokens on or off.
        if current.auth.jwt_secret.is_empty() != new.auth.jwt_secret.is_empty() {
            refused.push("auth.jwt_secret (set or emptied: turning HS256 tokens on or off)".into());
        }
        if !refused.is_empty() {
            return Err(ReloadRefused::NotLive(refused));
        }
        let dispatcher = self.dispatcher.upgrade().ok_or_else(|| ReloadRefused::Unavailable("the gateway is shutting down".into()))?;
        // The log filter first: the one step that can still fail, before anything is replaced.
        if changed.iter().any(|key| key == "server.log_level") {
            match &file.set_log_filter {
                Some(set) => set(&new.server.log_level).map_err(|e| file.refused(format!("server.log_level: {e}")))?,
                None => {
                    return Err(ReloadRefused::Unreadable(
                        "server.log_level changed, but RUST_LOG is set and wins over it: unset RUST_LOG to set the level from the file; nothing was applied"
                            .into(),
                    ))
                }
            }
        }
        dispatcher.replace_settings(delivery_settings(&new));
        if current.auth.jwt_secret != new.auth.jwt_secret {
            self.token_keys.replace_secret(&new.auth.jwt_secret);
        }
        self.exposure.replace(Exposure::from_config(&new));
        *current = new;
        Ok(changed)
    }
}

fn is_live(key: &str) -> bool {
    LIVE_KEYS.iter().any(|live| key == *live || key.strip_prefix(live).is_some_and(|rest| rest.starts_with('.')))
}

/// The keys whose values differ (`delivery.topics.orders.max_attempts`, `server.listen`), as
/// dotted paths to the innermost value that differs; a list counts as one value.
pub fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    fn walk(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
        match (old, new) {
            (Value::Object(a), Value::Object(b)) => {
                let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for key in keys {
                    let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                    walk(&path, a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null), out);
                }
            }
            (a, b) if a != b => out.push(path.to_string()),
            _ => {}
        }
    }
    let as_value = |c: &Config| serde_json::to_value(c).unwrap_or(Value::Null);
    let mut out = Vec::new();
    walk("", &as_value(old), &as_value(new), &mut out);
    out
}

/// What the core's delivery path takes from the configuration.
pub fn delivery_settings(config: &Config) -> DeliverySettings {
    let d = &config.delivery;
    let millis = |list: &[u64]| list.iter().map(|ms| Duration::from_millis(*ms)).collect::<Vec<_>>();
    let default =
        RedeliveryPolicy { ack_timeout: Duration::from_millis(d.ack_timeout_ms), max_attempts: d.max_attempts, backoff: millis(&d.redelivery_backoff_ms) };
    let by_pattern = d
        .topics
        .iter()
        .map(|(pattern, rules)| {
            let policy = RedeliveryPolicy {
                ack_timeout: rules.ack_timeout_ms.map_or(default.ack_timeout, Duration::from_millis),
                max_attempts: rules.max_attempts.unwrap_or(default.max_attempts),
                backoff: rules.redelivery_backoff_ms.as_deref().map_or_else(|| default.backoff.clone(), millis),
            };
            (pattern.clone(), policy)
        })
        .collect();
    DeliverySettings {
        redelivery: RedeliveryPolicies::new(default, by_pattern),
        max_in_flight: d.max_in_flight,
        max_in_flight_bytes: d.max_in_flight_bytes,
        group_max_in_flight: d.group_max_in_flight,
        group_max_nack_delay: Duration::from_millis(d.group_max_nack_delay_ms),
        reset_policy: d.reset_policy,
        slow_client_timeout: Duration::from_millis(d.slow_client_timeout_ms),
        max_subscriptions_per_session: config.limits.max_subscriptions_per_session,
        max_subscribes_per_sec: config.limits.max_subscribes_per_sec,
        max_rewind_events: config.limits.max_rewind_events,
        event_bounds: crate::core::published_event::EventBounds {
            max_batch_events: config.limits.max_batch_events,
            max_key_bytes: config.limits.max_key_bytes,
            max_header_name_bytes: config.limits.max_header_name_bytes,
        },
        publish_creates_topics: (!crate::http::topics::must_exist_before_publish(config, false), !crate::http::topics::must_exist_before_publish(config, true)),
        subscribe_creates_partitions: (config.storage.backend == crate::config::BackendKind::Embedded).then_some(config.embedded.default_partitions),
        max_sessions: config.limits.max_sessions,
        max_groups: config.limits.max_groups,
        max_clients_per_topic: config.limits.max_clients_per_topic,
        max_offline_clients: config.limits.max_offline_clients,
        reader_buffer_events: d.reader_buffer_events,
        reader_buffer_bytes: d.reader_buffer_bytes,
        fetch_batch: d.fetch_batch,
        ping_interval: Duration::from_millis(config.server.ws_ping_interval_ms),
        pong_timeout: Duration::from_millis(config.server.ws_pong_timeout_ms),
        drain_settle: Duration::from_millis(config.server.drain_settle_ms),
        refresh_before: Duration::from_secs(config.auth.refresh_before_secs),
        progress_interval: Duration::from_millis(d.progress_interval_ms),
        resume_token_max_age_ms: config.offsets.retention_secs.saturating_mul(1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_changed_keys_are_named_to_the_innermost_value_and_only_listed_ones_are_live() {
        let old = Config::default();
        let mut new = old.clone();
        assert!(changed_keys(&old, &new).is_empty());
        new.delivery.ack_timeout_ms = 1234;
        new.server.listen = "0.0.0.0:9".into();
        new.server.allowed_origins = vec!["https://app.example".into()];
        new.delivery.topics.insert("orders.*".into(), Default::default());
        let changed = changed_keys(&old, &new);
        assert_eq!(changed, ["delivery.ack_timeout_ms", "delivery.topics.orders.*", "server.allowed_origins", "server.listen"]);
        let live: Vec<bool> = changed.iter().map(|k| is_live(k)).collect();
        assert_eq!(live, [true, true, true, false]);
        // A key that only starts like a live one is not live.
        assert!(!is_live("delivery.max_in_flight_extra"));
        assert!(!is_live("storage.data_dir"));
    }
}
