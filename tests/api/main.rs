//! Black-box tests: a real gateway on 127.0.0.1:0 with RocksDB in a temp dir, real WebSocket
//! and HTTP clients. One test binary; one module per concern.

mod auth;
mod bounds;
mod browser;
mod cluster;
mod conformance;
mod controlled_store;
mod crash;
mod dead_letters;
mod delivery;
mod docs;
mod drain;
mod epochs;
mod errors;
mod exposure;
mod js_client;
mod kafka;
mod kafka_broker;
mod kafka_proxy;
mod loadtest_smoke;
mod metrics;
mod offset_faults;
mod offset_store_props;
mod openapi;
mod power_loss;
mod process;
mod restart;
mod rocketmq;
mod rocketmq_broker;
mod rocketmq_lite;
mod schemathesis;
mod sse;
mod structure;
mod support;
mod takeover;
mod tls;
