//! ackgate: reliable, acknowledged push delivery from a durable log to WebSocket clients.
//!
//! # Layout
//!
//! - `config`: `config.toml` + `ACKGATE_SECTION__KEY` overrides (`config::environment`),
//!   validated at start; `config::template` prints `config.toml` and its docs from the doc comments;
//!   `config::origin`: origins and hosts as the config names them and browsers send them.
//! - `data_format`: the data_dir's format version (`<data_dir>/FORMAT`), checked at start.
//! - `resume_token_key`: a single instance's resume token key (`<data_dir>/resume_token.key`).
//! - `core`: the domain, free of HTTP, RocksDB and Kafka types:
//!   - `names`: validated topic / client names and the collision-free offset key;
//!   - `protocol`: WebSocket frames (parse / write), error and close codes; `event_frame`: an
//!     event's frame written once and shared by the sessions it goes to;
//!   - `offsets`: the `OffsetStore` trait (CAS-max) and its records; `dead_letters`: dead letters
//!     and gaps as the store keeps them; `offset_retention`: expiry and the sweep; `clock`;
//!   - `backend`: the `LogBackend` trait (pull layer) and events;
//!   - `ack_tracker`, `client_state`: per-client contiguous floors and delivery ids;
//!   - `reader`: one shared partition reader per `topic#partition`, which pushes new events
//!     to the feeders parked at its end (`HeadSubscriber`; a parked feeder has no task);
//!   - `offset_writer`: batched durable offset writes, then the deferred broker ACK; plain acks
//!     held per key for `offsets.plain_ack_linger_ms`;
//!   - `ack_floor`: per partition, how far its live clients have durably acked (when a
//!     backend may acknowledge an event at its broker);
//!   - `dispatcher`: the shared state of every session: takeover, gaps reported, draining;
//!     `session_registry`: what it knows of each session and client; `delivery_settings`: its
//!     knobs; `frame_errors`: backend and store failures as error frames;
//!   - `subscription_plan`: where each partition of a subscription starts (stored offset,
//!     token, `from`, time), its gaps and trackers;
//!   - `redelivery`: ack timeout, backoff and attempts per topic; `drain`: closing an
//!     instance's sessions spread over the drain window; `idempotency`: `Idempotency-Key`
//!     publishes (`remembered_publish`: what the store keeps of one);
//!   - `partition_watch`, `log_end`: partitions added later, log ends read twice before use;
//!   - `feeder`, `window`, `in_flight`: per-partition feeders, a session's in-flight window
//!     (events and bytes) and its deliveries' ack deadlines;
//!   - `session`: a session's logic as plain methods that queue frames (`session::subscriptions`:
//!     subscribe and the deliveries fed to it; `session::acks`: acks, redelivery, dead letters;
//!     `session::task`: the task that drives one, with one housekeeping timer armed only when
//!     something falls due); `session_control`: messages to a session from outside it, and its
//!     inbox and doorbell;
//!   - `alignment`: boot alignment of pull cursors to committed offsets;
//!   - `access`: what a session's credentials allow; `metrics`: every exported counter;
//!   - `resume_token`: the resume tokens the gateway issues (MAC'd facts, never a client's claim);
//!   - `rendezvous`: which instance a client should use; `waiting`: a cancel-safe count of
//!     waiters (readers, window); `FastMap`/`FastSet`: foldhash maps for the per-event path.
//! - `store`: `OffsetStore` implementations (`memory`, `rocks`); `group_commit`: one fsync
//!   shared by concurrent writers (`storage.durability = "power"`).
//! - `backend`: `LogBackend` implementations (`embedded`, `kafka`, `rocketmq`) and the pull
//!   checkpoint file.
//! - `cluster`: the peers and their health, for `/session/recommend`.
//! - `http`: the axum router, one file per REST resource, the WebSocket adapter, auth, metrics,
//!   OpenAPI, the browser console; the connection layer under it: `connections` (accept loop and
//!   timers), `connection_counts` (caps in all and per IP), `activity` (what a connection's
//!   watchdog reads), `lingering` (closing without a reset), `tls`. No module imports itself
//!   through others (tests/api/structure.rs).
//! - `gateway`: wiring: `Gateway::build(config)` then `run(shutdown)`.

pub mod backend;
pub(crate) mod cluster;
pub mod config;
pub mod core;
pub(crate) mod data_format;
pub mod durable_files;
pub mod gateway;
pub mod http;
pub mod reload;
pub mod resume_token_key;
pub mod store;
pub(crate) mod telemetry;

pub use gateway::Gateway;
