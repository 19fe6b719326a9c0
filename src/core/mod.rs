//! The domain core: no HTTP, no RocksDB, no Kafka client. Everything here is driven through
//! plain Rust types and the `LogBackend` / `OffsetStore` traits.

pub mod access;
pub mod ack_floor;
pub mod ack_tracker;
pub mod alignment;
pub mod backend;
pub mod client_state;
pub mod clock;
pub mod dead_letters;
pub mod delivery_settings;
pub mod dispatcher;
pub mod drain;
pub mod feeder;
pub mod frame_errors;
pub mod idempotency;
pub mod in_flight;
pub mod log_end;
pub mod metrics;
pub mod names;
pub mod offset_retention;
pub mod offset_writer;
pub mod offsets;
pub mod partition_watch;
pub mod protocol;
pub mod reader;
pub mod redelivery;
pub mod redrive;
pub mod rendezvous;
pub mod session;
pub mod session_control;
pub mod session_registry;
pub mod subscription_plan;
pub mod waiting;
pub mod window;

/// Maps and sets on the per-event path (in-flight deliveries, ack trackers, a session's
/// subscriptions): foldhash instead of SipHash, which was ~3% of a busy session's CPU. Still
/// randomly seeded per map, and their keys are offsets and names this instance already checked.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
