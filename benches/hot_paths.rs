//! Criterion benchmarks of the hot pure parts: client frame parsing, event frame writing, the
//! ack tracker, and the offset store's write path (memory and RocksDB).
//!
//! `cargo bench --bench hot_paths` measures; `cargo test --benches` (what scripts/test runs)
//! executes each benchmark once as a check that it still works.

use std::sync::Arc;

use ackgate::core::ack_tracker::AckTracker;
use ackgate::core::backend::Event;
use ackgate::core::client_state::DeliveryRef;
use ackgate::core::names::{ClientId, OffsetKey, TopicName};
use ackgate::core::offsets::{OffsetStore, OffsetWrite};
use ackgate::core::protocol::{parse_client_frame, write_event_frame};
use ackgate::store::memory::MemoryOffsetStore;
use ackgate::store::rocks::RocksOffsetStore;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frames");
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse ack", |b| b.iter(|| parse_client_frame(black_box(r#"{"op":"ack","delivery_id":"1a2b.3.0.4f21"}"#)).unwrap()));
    let batch = format!(r#"{{"op":"ack","delivery_ids":[{}],"req":7}}"#, (0..100).map(|i| format!("\"1a{i:x}.3.0.{i:x}\"")).collect::<Vec<_>>().join(","));
    group.bench_function("parse ack of 100 ids", |b| b.iter(|| parse_client_frame(black_box(&batch)).unwrap()));
    group.bench_function("parse subscribe", |b| {
        b.iter(|| parse_client_frame(black_box(r#"{"op":"subscribe","topic":"orders","from":"earliest","req":"s1"}"#)).unwrap())
    });
    let event = Event {
        partition: 3,
        offset: 123_456,
        timestamp: 1_764_000_000_000,
        key: Some("order-42".into()),
        headers: vec![("source".into(), "bench".into())],
        headers_base64: Vec::new(),
        payload: format!(r#"{{"p":"{}"}}"#, "x".repeat(92)).into_bytes(),
        payload_is_json: true,
        undecodable: false,
        frame: Default::default(),
    };
    let mut out = String::with_capacity(512);
    group.bench_function("write event frame (100-byte JSON payload)", |b| {
        b.iter(|| {
            out.clear();
            write_event_frame(&mut out, black_box(DeliveryRef { seq: 0x1a2b, slot: 3, partition: 3, offset: 0x1e240 }), "orders", 1, black_box(&event));
            out.len()
        })
    });
    group.finish();
}

fn ack_tracker(c: &mut Criterion) {
    let mut group = c.benchmark_group("ack tracker");
    group.throughput(Throughput::Elements(1000));
    group.bench_function("deliver + ack 1000 in order", |b| {
        b.iter_batched(
            || AckTracker::new(0, None),
            |mut t| {
                for o in 0..1000 {
                    t.on_delivery(o, o + 1);
                    t.ack(o, o + 1);
                }
                t.floor()
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("deliver 1000, ack in reverse", |b| {
        b.iter_batched(
            || {
                let mut t = AckTracker::new(0, None);
                for o in 0..1000 {
                    t.on_delivery(o, o + 1);
                }
                t
            },
            |mut t| {
                for o in (0..1000).rev() {
                    t.ack(o, o + 1);
                }
                t.floor()
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn writes(batch: usize, round: u64) -> Vec<OffsetWrite> {
    let topic = TopicName::parse("orders").unwrap();
    (0..batch)
        .map(|i| OffsetWrite {
            key: OffsetKey::new(topic.clone(), ClientId::parse(&format!("client-{i}")).unwrap(), (i % 4) as u32),
            committed: round + 1,
            last_acked: Some(round),
            updated_at: 1_764_000_000_000 + round,
            generation: 0,
            epoch: 0,
        })
        .collect()
}

fn offset_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("offset store write_offsets (CAS-max), 100 keys per batch");
    group.throughput(Throughput::Elements(100));
    let memory: Arc<dyn OffsetStore> = Arc::new(MemoryOffsetStore::new());
    let dir = tempfile::tempdir().unwrap();
    let rocks: Arc<dyn OffsetStore> = Arc::new(RocksOffsetStore::open(dir.path(), false).unwrap());
    for (name, store) in [("memory", memory), ("rocksdb", rocks)] {
        let mut round = 0;
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    round += 1;
                    writes(100, round)
                },
                |batch| store.write_offsets(&batch).unwrap().len(),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, frames, ack_tracker, offset_store);
criterion_main!(benches);
