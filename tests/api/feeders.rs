//! Feeders against a model (issue 57): random interleavings of appends, acks (window room),
//! unsubscribe and resubscribe from anywhere in the log, run on a real embedded log and a real
//! partition reader with a small ring, a small window (events and bytes) and small batches, so
//! that feeders park at the head, are pushed to, fall behind the ring, read by offset, and are
//! closed while parked, in every order. The model is what a session sees: for the subscription
//! that is current, first deliveries in offset order from its start with nothing skipped, the
//! window never exceeded, and every offset from the start to the log's end delivered once the
//! publishing stops.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ackgate::core::backend::{LogBackend, NewEvent};
use ackgate::core::feeder::{start_feed, Fed, FedBatch, FeedPlan, FeedTarget, PartitionFeed};
use ackgate::core::names::{TopicName, TopicPartition};
use ackgate::core::reader::Readers;
use ackgate::core::window::{Window, WindowPermit};
use proptest::prelude::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const WINDOW_EVENTS: usize = 4;
const WINDOW_BYTES: u32 = 48;

#[derive(Debug, Clone)]
enum Op {
    /// Events with these payload sizes.
    Publish(Vec<usize>),
    /// Acks the oldest `n` deliveries held.
    Ack(usize),
    /// Ends the subscription and starts a new one at this share of the log's end (0: its start).
    Resubscribe(u8),
    /// Lets the feeders run a moment.
    Yield,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::vec(1usize..30, 1..6).prop_map(Op::Publish),
        3 => (0usize..5).prop_map(Op::Ack),
        1 => (0u8..=4).prop_map(Op::Resubscribe),
        1 => Just(Op::Yield),
    ]
}

/// What the session holds: the current subscription and its deliveries.
struct Model {
    subscription: u64,
    start: u64,
    /// The next offset the current subscription must deliver first.
    expected: u64,
    held: VecDeque<(u64, WindowPermit)>,
    feed: Option<PartitionFeed>,
    cancel: CancellationToken,
}

impl Model {
    /// Takes one batch: events of an ended subscription are dropped (the session's rule);
    /// those of the current one must come in order from where it stands, nothing skipped.
    fn take(&mut self, fed: Fed) -> Result<(), String> {
        if fed.subscription != self.subscription {
            return Ok(());
        }
        if fed.gap.is_some() || fed.truncated.is_some() {
            return Err(format!("a gap or truncation on a log that has neither: {:?} {:?}", fed.gap, fed.truncated));
        }
        for (event, permit) in fed.events {
            if event.offset != self.expected {
                return Err(format!(
                    "subscription {} from {}: offset {} delivered where {} was next",
                    self.subscription, self.start, event.offset, self.expected
                ));
            }
            self.expected += 1;
            self.held.push_back((event.offset, permit));
        }
        let bytes: u64 = self.held.iter().map(|(_, p)| p.cost()).sum();
        if self.held.len() > WINDOW_EVENTS {
            return Err(format!("{} deliveries held in a window of {WINDOW_EVENTS}", self.held.len()));
        }
        // One event larger than the room goes alone; otherwise the bytes stay within the window.
        if self.held.len() > 1 && bytes > u64::from(WINDOW_BYTES) {
            return Err(format!("{bytes} bytes held in a window of {WINDOW_BYTES}"));
        }
        Ok(())
    }
}

async fn run_case(ops: Vec<Op>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let log = crate::support::plain_embedded_log(dir.path());
    let topic = TopicName::parse("t").unwrap();
    let publish = async |sizes: &[usize]| {
        let events =
            sizes.iter().map(|n| NewEvent { key: None, partition: Some(0), headers: vec![], payload: vec![b'x'; *n], payload_is_json: false }).collect();
        log.publish(&topic, events).await.unwrap();
    };
    publish(&[1]).await;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    // A ring of 6 events and 3 per pull: a feeder that waits a little falls behind it.
    let readers = Readers::new(
        log.clone(),
        Arc::new(ackgate::store::memory::MemoryOffsetStore::new()),
        6,
        64 << 20,
        3,
        shutdown.clone(),
        tasks.clone(),
        metrics::Counter::noop(),
    );
    let tp = TopicPartition::new(topic.clone(), 0);
    let window = Arc::new(Window::new(WINDOW_EVENTS, WINDOW_BYTES));
    let (tx, mut rx) = mpsc::channel::<FedBatch>(4);
    let feed = |subscription: u64, from: u64, cancel: &CancellationToken| {
        let plan =
            FeedPlan { reader: readers.get(&tp, 0), partition: 0, from, batch: 3, subscription, topic: topic.clone(), truncations: readers.truncations() };
        start_feed(plan, FeedTarget { window: window.clone(), tx: tx.clone(), cancel: cancel.clone(), tasks: tasks.clone() })
    };
    let cancel = CancellationToken::new();
    let mut model = Model { subscription: 1, start: 0, expected: 0, held: VecDeque::new(), feed: Some(feed(1, 0, &cancel)), cancel };
    let mut log_end = 1u64;
    for op in ops {
        match op {
            Op::Publish(sizes) => {
                publish(&sizes).await;
                log_end += sizes.len() as u64;
            }
            Op::Ack(n) => {
                for _ in 0..n {
                    model.held.pop_front();
                }
            }
            Op::Resubscribe(share) => {
                // As a session does: the old subscription cancelled, its deliveries released,
                // the new one's feeders started before the old one's hold on the reader goes.
                model.cancel.cancel();
                model.held.clear();
                let from = log_end * u64::from(share) / 4;
                let cancel = CancellationToken::new();
                let subscription = model.subscription + 1;
                let new_feed = feed(subscription, from, &cancel);
                drop(model.feed.replace(new_feed));
                (model.subscription, model.start, model.expected, model.cancel) = (subscription, from, from, cancel);
            }
            Op::Yield => tokio::time::sleep(Duration::from_millis(2)).await,
        }
        while let Ok(fed) = rx.try_recv() {
            model.take(*fed)?;
        }
    }
    // Publishing stops: acking as it comes, the current subscription reaches the log's end.
    let settle = async {
        while model.expected < log_end {
            model.held.clear();
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some(fed)) => model.take(*fed)?,
                _ => return Err(format!("subscription from {} stopped at {} of {log_end}", model.start, model.expected)),
            }
        }
        Ok(())
    };
    let settled = settle.await;
    model.cancel.cancel();
    drop(model.feed.take());
    shutdown.cancel();
    settled?;
    // Nothing more than the log's end, and every feeder task gone with its subscription.
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(10), tasks.wait()).await.is_err() {
        return Err("a feeder task outlived its subscription".into());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn feeders_deliver_in_order_within_the_window_and_skip_nothing(ops in prop::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let outcome = runtime.block_on(run_case(ops));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}
