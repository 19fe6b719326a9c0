//! The domain core: no HTTP, no RocksDB, no Kafka client. Everything here is driven through
//! plain Rust types and the `LogBackend` / `OffsetStore` traits.

pub(crate) mod access;
pub(crate) mod ack_floor;
pub mod ack_tracker;
pub(crate) mod alignment;
pub mod backend;
pub(crate) mod bounds_cache;
pub(crate) mod bounds_reads;
pub mod client_state;
pub mod clock;
pub mod dead_letters;
pub(crate) mod delivery_settings;
pub(crate) mod dispatcher;
pub(crate) mod drain;
pub mod event_frame;
pub mod feeder;
pub(crate) mod frame_errors;
pub(crate) mod group;
pub mod idempotency;
pub(crate) mod in_flight;
pub(crate) mod live;
pub(crate) mod log_end;
pub(crate) mod log_throttle;
pub mod metrics;
pub mod names;
pub(crate) mod offset_retention;
pub(crate) mod offset_writer;
pub mod offsets;
pub(crate) mod partition_watch;
pub(crate) mod peer_offsets;
pub mod protocol;
pub(crate) mod published_event;
pub mod reader;
pub(crate) mod redelivery;
pub(crate) mod redrive;
pub mod remembered_publish;
pub(crate) mod rendezvous;
pub mod resume_token;
pub(crate) mod session;
pub(crate) mod session_control;
pub(crate) mod session_id;
pub(crate) mod session_registry;
pub(crate) mod subscription_plan;
pub(crate) mod topic_removal;
pub mod trace;
pub(crate) mod transport;
pub(crate) mod waiting;
pub(crate) mod whole_number;
pub mod window;

/// Maps and sets on the per-event path (in-flight deliveries, ack trackers, a session's
/// subscriptions): foldhash instead of SipHash, which was ~3% of a busy session's CPU. Still
/// randomly seeded per map, and their keys are offsets and names this instance already checked.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
