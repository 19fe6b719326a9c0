//! The RocketMQ backend: partition = queue id, offset = queue offset. Two modes:
//!
//! - `pull` (RocketMQ 4.x): PULL_MESSAGE from ackgate's own cursor (the checkpoint file), with
//!   the commit-offset flag off: the broker never holds an offset for the consumer group.
//!   `ack_pulled_message` has nothing to do (the core counts it).
//! - `pop` (RocketMQ 5.x): the partition reader POPs; each popped message keeps its receipt
//!   handle (`pop.rs`), acknowledged at the broker only after its clients' acks are durable
//!   (`settle.rs`); a revived copy is mapped back to its original (`revived.rs`).
//!   Reads by offset (catch-up, and the stretch between the cursor and the group's pop position
//!   after a restart or a rewind) use PULL, which needs no handle.
//!
//! A topic may have queues on several master brokers: partition = (broker name, queue id), in
//! the order `layout.rs` keeps stable. Lite topics (`parent@lite`, 5.x) are `lite.rs`. This is
//! the only module that speaks RocketMQ.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub mod broker;
mod layout;
mod lite;
pub mod message;
mod pop;
pub mod remoting;
mod revived;
mod settle;

use super::checkpoint::{PullCursors, CHECKPOINT_FILE};
use crate::core::backend::{AckFloor, BackendError, Event, LogBackend, NewEvent, PartitionBounds, ReadFrom};
use crate::core::clock::{Clock, SystemClock};
use crate::core::names::{TopicName, TopicPartition};
pub use broker::{Broker, Pulled, RoutedBroker};
use layout::{Fit, Layouts, PartitionQueue, Route, LAYOUT_FILE};
use message::{encode_properties, is_property_safe, is_system_property, Decoded, Undecodable, KEYS, POP_CK, UNIQ_KEY};
use pop::{Ledger, Positions};

/// Producer group named in sends (RocketMQ requires one; it holds no state for ackgate).
const PRODUCER_GROUP: &str = "ackgate-producer";
/// Attempts of a topic creation the broker does not answer in time.
const CREATE_ATTEMPTS: u32 = 3;
/// How often a request naming a partition a topic's cached route lacks asks for the route again.
const ROUTE_RECHECK_GAP: Duration = Duration::from_secs(1);
/// Original positions remembered for revived messages.
const POSITIONS_REMEMBERED: usize = 1_000_000;

pub use crate::config::RocketMqMode;

/// Settings of the RocketMQ backend (from the `[rocketmq]` config section).
#[derive(Debug, Clone)]
pub struct RocketMqSettings {
    pub mode: RocketMqMode,
    pub namesrv_addr: String,
    /// Topics served; empty serves every topic the name server knows (system topics excepted).
    pub topics: Vec<String>,
    /// Needed by the protocol for POP and PULL; never used to commit an offset.
    pub consumer_group: String,
    pub invisible_time: Duration,
    pub request_timeout: Duration,
    pub publish_timeout: Duration,
    /// POP: receipt handles kept at most; past it, reads go by PULL (`poll_pop`).
    pub max_pending_acks: usize,
    /// Parents whose lite topics are served as `parent@lite` (`lite.rs`).
    pub lite_parents: Vec<String>,
}

pub struct RocketMqLog {
    settings: RocketMqSettings,
    broker: Broker,
    served: Option<std::collections::HashSet<String>>,
    /// Each topic's partitions as last routed (the hot path reads here; `partitions` refreshes).
    routes: Mutex<HashMap<TopicName, Route>>,
    layouts: Layouts,
    /// Topics whose route would renumber partitions (refused), with why: their partitions are
    /// unavailable meanwhile, and `/readyz` names them; other topics are served.
    misrouted: Mutex<HashMap<TopicName, String>>,
    /// When each topic's route was last asked for again because a request named a partition it
    /// lacks (`route_with`): at most once per `ROUTE_RECHECK_GAP` per topic.
    rechecked: Mutex<HashMap<TopicName, std::time::Instant>>,
    /// Every master address last routed, by broker name: where a partition's requests and a
    /// receipt handle's ACK go (a master away keeps its last address: requests fail meanwhile).
    broker_addrs: Mutex<HashMap<String, String>>,
    cursors: PullCursors,
    /// Polls of one partition at its cursor run one at a time.
    cursor_locks: Mutex<HashMap<TopicPartition, Arc<tokio::sync::Mutex<()>>>>,
    /// Per partition, the offset below which the group has popped everything (as far as this
    /// instance knows): a cursor below it reads by PULL.
    popped_to: Mutex<HashMap<TopicPartition, u64>>,
    ledger: Ledger,
    positions: Positions,
    /// `UNIQ_KEY`s of revived messages whose original the broker's index did not find: not
    /// looked up again (`find_original`).
    revived_misses: Mutex<HashSet<String>>,
    ack_floor: OnceLock<Arc<dyn AckFloor>>,
    /// Woken by `ack_pulled_message`, so broker ACKs follow client acks closely.
    acked: tokio::sync::Notify,
    /// Held by a settle round: the last round at shutdown waits for the one in progress.
    settling: tokio::sync::Mutex<()>,
    reachable: AtomicBool,
    next_queue: AtomicU64,
    next_uniq: AtomicU64,
    uniq_prefix: String,
    lite: lite::LiteState,
    /// Itself, for tasks it starts later (lite pollers).
    me: OnceLock<std::sync::Weak<Self>>,
    stop: CancellationToken,
}

/// Topics RocketMQ creates for itself (retry, DLQ, revive, timer, scheduling, tracing, replies,
/// benchmarks): never served.
fn is_system_topic(name: &str) -> bool {
    const EXACT: &[&str] = &["TBW102", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "BenchmarkTest", "SCHEDULE_TOPIC_XXXX", "TRANS_CHECK_MAX_TIME_TOPIC"];
    name.starts_with('%') || name.starts_with("rmq_sys_") || name.starts_with("RMQ_SYS_") || name.ends_with("_REPLY_TOPIC") || EXACT.contains(&name)
}

impl RocketMqLog {
    /// Connects to the name server (fails when it cannot be reached within the request timeout)
    /// and loads the pull checkpoint from `data_dir`.
    pub async fn open(data_dir: &Path, settings: RocketMqSettings) -> Result<Arc<Self>, BackendError> {
        let cursors = PullCursors::load(data_dir.join(CHECKPOINT_FILE)).map_err(|e| BackendError::Io(e.to_string()))?;
        let layouts = Layouts::load(data_dir.join(LAYOUT_FILE)).map_err(|e| BackendError::Io(e.to_string()))?;
        let broker = Broker::new(settings.namesrv_addr.clone(), settings.request_timeout);
        let brokers = broker.brokers().await?;
        if brokers.is_empty() {
            return Err(BackendError::Unavailable(format!("the RocketMQ name server at {} knows no broker", settings.namesrv_addr)));
        }
        for (_, addr) in &brokers {
            broker.ensure_group(addr, &settings.consumer_group).await?;
        }
        // Lite parents are served whatever rocketmq.topics says.
        let served = (!settings.topics.is_empty()).then(|| settings.topics.iter().chain(&settings.lite_parents).cloned().collect());
        let uniq_prefix = format!("ackgate-{:x}-{:x}", std::process::id(), SystemClock.now_ms());
        let lite =
            lite::LiteState::load(data_dir, &settings.lite_parents, &uniq_prefix).map_err(|e| BackendError::Io(format!("the lite client id file: {e}")))?;
        let log = Arc::new(Self {
            broker,
            served,
            routes: Mutex::new(HashMap::new()),
            layouts,
            misrouted: Mutex::new(Default::default()),
            rechecked: Mutex::new(Default::default()),
            broker_addrs: Mutex::new(brokers.iter().cloned().collect()),
            cursors,
            cursor_locks: Mutex::new(HashMap::new()),
            popped_to: Mutex::new(HashMap::new()),
            ledger: Ledger::default(),
            positions: Positions::new(POSITIONS_REMEMBERED),
            revived_misses: Mutex::new(HashSet::new()),
            ack_floor: OnceLock::new(),
            acked: tokio::sync::Notify::new(),
            settling: tokio::sync::Mutex::new(()),
            reachable: AtomicBool::new(true),
            next_queue: AtomicU64::new(0),
            next_uniq: AtomicU64::new(0),
            uniq_prefix,
            lite,
            me: OnceLock::new(),
            stop: CancellationToken::new(),
            settings,
        });
        let _ = log.me.set(Arc::downgrade(&log));
        spawn_reachability_monitor(Arc::downgrade(&log));
        if log.settings.mode == RocketMqMode::Pop {
            settle::spawn_broker_acks(Arc::downgrade(&log));
        }
        Ok(log)
    }

    fn is_served(&self, topic: &str) -> bool {
        !is_system_topic(topic) && self.served.as_ref().is_none_or(|s| s.contains(topic))
    }

    async fn route(&self, topic: &TopicName) -> Result<Option<Route>, BackendError> {
        if let Some(route) = self.routes.lock().unwrap().get(topic) {
            return Ok(Some(route.clone()));
        }
        if !self.is_served(topic.as_str()) {
            return Ok(None);
        }
        self.refresh_route(topic).await
    }

    /// Asks the name server for `topic`'s route and fits it to the stored layout. A route that
    /// would renumber partitions is refused: the stored layout stays (with the addresses last
    /// known for brokers the route no longer names), the refusal is logged and counted, and the
    /// topic's partitions are unavailable until a route fits again (issue 39, item 11: one topic
    /// no longer makes the whole instance, or a whole cluster of instances, not ready).
    async fn refresh_route(&self, topic: &TopicName) -> Result<Option<Route>, BackendError> {
        let Some(brokers) = self.broker.route(topic.as_str()).await? else {
            // Unknown to the name server (deleted outside ackgate, or a name server that has just
            // restarted): no cached route and no refusal stay behind. The stored numbering does,
            // until ackgate deletes or creates the topic: a name server restart must not renumber.
            self.routes.lock().unwrap().remove(topic);
            self.misrouted.lock().unwrap().remove(topic);
            return Ok(None);
        };
        // Only masters the route names now: a partition of one away answers unavailable at once,
        // and a publish or delete touching it is refused before anything is sent.
        let addrs: HashMap<String, String> = brokers.iter().filter_map(|b| Some((b.name.clone(), b.addr.clone()?))).collect();
        self.broker_addrs.lock().unwrap().extend(addrs.clone());
        let stored = self.layouts.get(topic);
        let routed: Vec<(String, u32)> = brokers.iter().map(|b| (b.name.clone(), b.queues)).collect();
        let route = match layout::fit(stored.as_ref(), &routed) {
            Fit::Fits(layout) if layout.is_empty() => return Ok(None),
            Fit::Fits(layout) => {
                if stored.as_ref() != Some(&layout) {
                    self.layouts.set(topic, layout.clone()).map_err(|e| BackendError::Io(format!("storing the partition layout: {e}")))?;
                    if let Some(stored) = &stored {
                        tracing::info!(%topic, before = ?stored, now = ?layout, "RocketMQ topic has new queues; partitions added after the existing ones");
                    }
                }
                if self.misrouted.lock().unwrap().remove(topic).is_some() {
                    tracing::info!(%topic, "RocketMQ route fits the topic's partitions again");
                }
                Route::new(layout, &addrs)
            }
            Fit::Renumbers(why) => {
                crate::core::metrics::rocketmq_routes_refused().increment(1);
                if self.misrouted.lock().unwrap().insert(topic.clone(), why.clone()).is_none() {
                    tracing::error!(%topic, %why, stored = stored.as_ref().map(tracing::field::debug), routed = ?routed, "RocketMQ route refused: it would renumber the topic's partitions; its partitions are unavailable until the route fits (other topics are served)");
                }
                Route::new(stored.unwrap_or_default(), &addrs)
            }
        };
        self.routes.lock().unwrap().insert(topic.clone(), route.clone());
        Ok(Some(route))
    }

    /// The route of a topic whose partitions are served now: unknown topics and topics whose
    /// route would renumber them (`misrouted`) are errors.
    async fn served_route(&self, topic: &TopicName) -> Result<Route, BackendError> {
        let route = self.route(topic).await?.ok_or_else(|| BackendError::UnknownTopic(topic.to_string()))?;
        if let Some(why) = self.misrouted.lock().unwrap().get(topic) {
            return Err(BackendError::Unavailable(format!(
                "topic {topic}'s route at the name server would renumber its partitions ({why}); they are unavailable until it fits"
            )));
        }
        Ok(route)
    }

    /// The served route of a topic, asked for again when it lacks `partition`: a route fetched
    /// while a topic's masters were still registering it names fewer partitions than the topic
    /// has (CI saw a publish to partition 1 answered 404 right after the topic was created on two
    /// masters), and the periodic refresh (`rocketmq.route_refresh_ms`) may be long. At most once
    /// per `ROUTE_RECHECK_GAP` per topic: requests naming a partition that does not exist must not
    /// each cost a name server request.
    async fn route_with(&self, topic: &TopicName, partition: u32) -> Result<Route, BackendError> {
        let route = self.served_route(topic).await?;
        if partition < route.partitions() {
            return Ok(route);
        }
        let now = std::time::Instant::now();
        {
            let mut rechecked = self.rechecked.lock().unwrap();
            if rechecked.get(topic).is_some_and(|at| now.duration_since(*at) < ROUTE_RECHECK_GAP) {
                return Ok(route);
            }
            rechecked.insert(topic.clone(), now);
        }
        self.refresh_route(topic).await?;
        self.served_route(topic).await
    }

    /// The broker queue of a partition.
    async fn queue_of(&self, tp: &TopicPartition) -> Result<PartitionQueue, BackendError> {
        let route = self.route_with(&tp.topic, tp.partition).await?;
        match route.queue(tp.partition) {
            Some(Ok(queue)) => Ok(queue),
            Some(Err(broker)) => {
                Err(BackendError::Unavailable(format!("partition {} of {} is on broker {broker}, whose master address is not known", tp.partition, tp.topic)))
            }
            None => Err(BackendError::UnknownPartition(format!("partition {} does not exist: topic {} has {}", tp.partition, tp.topic, route.partitions()))),
        }
    }

    fn cursor_lock(&self, tp: &TopicPartition) -> Arc<tokio::sync::Mutex<()>> {
        self.cursor_locks.lock().unwrap().entry(tp.clone()).or_default().clone()
    }

    /// Reads by offset with PULL (no handle, no cursor): up to `max` events from `offset` on.
    /// `at_cursor`: `offset` is the pull cursor, so a queue that ends below it is a truncation
    /// for the partition's reader to handle (`BackendError::Truncated`), not a read to retry.
    async fn read_at(&self, tp: &TopicPartition, offset: u64, max: usize, wait: Duration, at_cursor: bool) -> Result<Vec<Event>, BackendError> {
        let q = self.queue_of(tp).await?;
        let mut offset = offset;
        let mut said_not_found = false;
        // An offset below the log start (or past a hole) is moved by the broker's answers: a hole
        // within the log only when said twice (`not_found_step`), then read at once.
        for attempt in 0..3 {
            match self.broker.pull(&q.broker_addr, &self.settings.consumer_group, tp.topic.as_str(), q.queue_id, offset, max, wait).await? {
                Pulled::Found { messages, .. } => return Ok(self.to_events(tp, q.queue_id, messages, offset, max)),
                Pulled::OffsetMoved { next } if next > offset => {
                    // Two causes: the log dropped `offset` (below the queue's min offset), or an
                    // operator reset the group's offset at the broker, which answers the group's
                    // next PULL with the reset target once (server-side reset, on by default).
                    // Following the second would skip events no client has received.
                    let log_start = self.broker.queue_offset(&q.broker_addr, tp.topic.as_str(), q.queue_id, false).await?;
                    let followed = offset < log_start;
                    crate::core::metrics::rocketmq_offset_moves(followed).increment(1);
                    if followed {
                        // To the log start, not to `next`: the broker's one answer after a reset
                        // may reach a read below the log start too.
                        offset = log_start;
                    } else {
                        tracing::warn!(%tp, offset, moved_to = next, log_start, "the broker moved a PULL forward within the log (a reset of the consumer group's offset at the broker?); reading on from the offset ackgate holds");
                        if attempt >= 1 {
                            // A broker that keeps answering so must not turn the reader into a
                            // busy loop.
                            tokio::time::sleep(wait.clamp(Duration::from_millis(100), Duration::from_secs(1))).await;
                        }
                    }
                }
                Pulled::NotFound { next } if next > offset => {
                    // A hole the broker skips (a consume-queue file missing, a message being
                    // removed): below the log start it is retention, followed to the start as
                    // any read below it. Within the log it skips offsets the log says it holds,
                    // so it is asked once more after a pause (a consume queue that lags a
                    // write answers so for a moment) and followed, counted, only if the broker
                    // says it again (issue 39, item 11).
                    let log_start = self.broker.queue_offset(&q.broker_addr, tp.topic.as_str(), q.queue_id, false).await?;
                    let step = not_found_step(offset, next, log_start, said_not_found);
                    said_not_found = true;
                    match step {
                        NotFoundStep::Follow(to) => {
                            crate::core::metrics::rocketmq_offset_moves(true).increment(1);
                            if offset >= log_start {
                                tracing::warn!(%tp, offset, next, log_start, "the broker reports no message from this offset to the next within the log, twice: reading on from the next (a hole in the consume queue)");
                            }
                            offset = to;
                        }
                        NotFoundStep::AskAgain => tokio::time::sleep(wait.clamp(Duration::from_millis(100), Duration::from_secs(1))).await,
                    }
                }
                Pulled::OffsetMoved { next } if next < offset && at_cursor => return Err(BackendError::Truncated { log_end: next, certain: false }),
                Pulled::OffsetMoved { next } if next < offset => {
                    // The queue ends below `offset` (recreated outside ackgate, a failover to a
                    // replica behind, a truncated consume queue): the broker answers at once, so
                    // pause rather than ask again in a tight loop.
                    tracing::warn!(%tp, offset, queue_end = next, "RocketMQ queue ends below the offset read; waiting for it to grow");
                    tokio::time::sleep(wait.clamp(Duration::from_millis(100), Duration::from_secs(1))).await;
                    return Ok(Vec::new());
                }
                Pulled::NotFound { .. } | Pulled::OffsetMoved { .. } => return Ok(Vec::new()),
            }
        }
        Ok(Vec::new())
    }

    /// Events of `tp` at or after `from`, learning each one's `UNIQ_KEY` position. A message that
    /// does not decode becomes an undecodable stand-in at the offset after the previous event
    /// (every subscriber dead-letters it and goes on); nothing after it is trusted.
    fn to_events(&self, tp: &TopicPartition, queue_id: u32, messages: Vec<Decoded>, from: u64, max: usize) -> Vec<Event> {
        let mut events: Vec<Event> = Vec::new();
        for decoded in messages {
            if events.len() >= max {
                break;
            }
            let expected = events.last().map_or(from, |e| e.offset + 1);
            match decoded {
                Ok(m) if m.queue_id == queue_id && m.queue_offset >= from => {
                    if let Some(uniq) = m.property(UNIQ_KEY) {
                        self.positions.learn(uniq, tp, m.queue_offset);
                    }
                    events.push(Event { partition: tp.partition, ..m.into_event() });
                }
                Ok(_) => {}
                Err(bad) => {
                    // Queue offsets are consecutive: it stands at `expected`, whatever its broken
                    // header says (a size field gone wrong before it would make that any bytes).
                    // Nothing after it in this answer is trusted; the next read starts after it.
                    undecodable(tp, expected, &bad);
                    events.push(Event::undecodable(tp.partition, expected));
                    break;
                }
            }
        }
        events
    }

    /// A poll at the pull cursor in pop mode: POP, keep every handle, and return the events
    /// contiguous from the cursor. Events between the cursor and the group's pop position
    /// (popped before a restart or a rewind, or popped ahead of the cursor) are read by PULL: they
    /// need no new handle, and the broker revives the ones never acknowledged.
    async fn poll_pop(&self, tp: &TopicPartition, cursor: u64, max: usize, wait: Duration) -> Result<Vec<Event>, BackendError> {
        let popped_to = self.popped_to.lock().unwrap().get(tp).copied().unwrap_or(0);
        if cursor < popped_to {
            let mut events = self.read_at(tp, cursor, max, Duration::ZERO, true).await?;
            events.retain(|e| e.offset < popped_to);
            if !events.is_empty() {
                return Ok(events);
            }
        }
        // Receipt handles are kept until the clients are done: past the bound, read by PULL (no
        // handle). The group's pop position stays behind; what is read meanwhile is popped later
        // and acknowledged at once, since its clients are past it by then.
        let room = self.settings.max_pending_acks.saturating_sub(self.ledger.len());
        if room == 0 {
            return self.read_at(tp, cursor, max, wait, true).await;
        }
        let q = self.queue_of(tp).await?;
        let (header, messages) = self
            .broker
            .pop(&q.broker_addr, &self.settings.consumer_group, tp.topic.as_str(), q.queue_id, max.min(room), self.settings.invisible_time, wait)
            .await?;
        let popped_any = !messages.is_empty();
        let mut fresh = Vec::new();
        // Popped but not decodable: no receipt handle can be built for it. It is skipped here and
        // read by PULL (below, as the hole it leaves) as an undecodable stand-in that every
        // subscriber dead-letters; the broker revives the unacknowledged pop until its retries
        // end in the group's DLQ.
        let mut undecodable_to = 0;
        for message in messages {
            let message = match message {
                Ok(message) => message,
                Err(bad) => {
                    if bad.queue_id == Some(q.queue_id) {
                        undecodable_to = undecodable_to.max(bad.queue_offset.map_or(0, |o| o + 1));
                    }
                    undecodable(tp, bad.queue_offset.unwrap_or(cursor), &bad);
                    continue;
                }
            };
            let Some((original_tp, original_offset, handle)) = self.handle_of(&q, tp, &header, &message).await else {
                continue;
            };
            crate::core::metrics::rocketmq_popped().increment(1);
            self.ledger.record(&original_tp, original_offset, handle);
            let revived = message.property(POP_CK).is_some() || message.topic.starts_with('%');
            if !revived && original_tp == *tp {
                fresh.push(message);
            }
        }
        fresh.sort_by_key(|m| m.queue_offset);
        let pop_position = match fresh.last() {
            Some(last) => (last.queue_offset + 1).max(undecodable_to),
            None if undecodable_to > 0 => undecodable_to,
            // Nothing new: everything below the log end was popped already.
            None => match self.broker.queue_offset(&q.broker_addr, tp.topic.as_str(), q.queue_id, true).await? {
                log_end if log_end < cursor => return Err(BackendError::Truncated { log_end, certain: false }),
                log_end => log_end,
            },
        };
        self.popped_to.lock().unwrap().insert(tp.clone(), pop_position.max(popped_to));
        if fresh.first().is_some_and(|m| m.queue_offset == cursor) {
            let mut events = self.to_events(tp, q.queue_id, fresh.into_iter().map(Ok).collect(), cursor, max);
            // Only the run contiguous from the cursor; anything after a hole is read by PULL.
            let contiguous = events.iter().enumerate().take_while(|(i, e)| e.offset == cursor + *i as u64).count();
            events.truncate(contiguous);
            return Ok(events);
        }
        if pop_position > cursor {
            let mut events = self.read_at(tp, cursor, max, Duration::ZERO, true).await?;
            events.retain(|e| e.offset < pop_position);
            return Ok(events);
        }
        if popped_any {
            // The pop position is catching up below the cursor (reads went by PULL while the
            // handles were at their bound): the events at the cursor are read by PULL meanwhile.
            return self.read_at(tp, cursor, max, Duration::ZERO, true).await;
        }
        Ok(Vec::new())
    }

    /// The partition of an event: the one it names, its key's, or the next in turn.
    fn partition_for(&self, event: &NewEvent, partitions: u32) -> u32 {
        match (event.partition, &event.key) {
            (Some(p), _) => p,
            (None, Some(key)) => super::key_partition(key, partitions),
            (None, None) => (self.next_queue.fetch_add(1, Ordering::Relaxed) % u64::from(partitions.max(1))) as u32,
        }
    }

    fn new_uniq_key(&self) -> String {
        format!("{}-{:x}", self.uniq_prefix, self.next_uniq.fetch_add(1, Ordering::Relaxed))
    }
}

impl Drop for RocketMqLog {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// How long a master has to answer the reachability probe.
const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Probes in a row a master must miss to count as silent: a broker busy for a few seconds (a
/// burst of thousands of subscribes) must not make the instance refuse publishes.
const BROKER_SILENT_AFTER: u32 = 3;

/// Every second, asks the name server for its masters and each master for a log end:
/// readiness, and a fast `unavailable`. RocketMQ counts as reachable while the name server
/// answers and at least one of its masters does. A name server alone is not enough: an instance
/// cut off from every broker (a network partition, brokers stopped but not yet expired from the
/// name server, ~2 minutes) could serve nothing. One master silent is logged but keeps readiness,
/// as a master away does: the other masters' partitions are served here, and every instance
/// would be unready alike.
fn spawn_reachability_monitor(log: std::sync::Weak<RocketMqLog>) {
    tokio::spawn(async move {
        // Probes missed in a row, by master name.
        let mut missed: HashMap<String, u32> = HashMap::new();
        loop {
            let Some(this) = log.upgrade() else { return };
            let stop = this.stop.clone();
            let now = match this.broker.brokers().await {
                Ok(brokers) if !brokers.is_empty() => {
                    let probes = brokers.iter().map(|(name, addr)| this.broker.answers(name, addr, BROKER_PROBE_TIMEOUT));
                    let answered = futures_util::future::join_all(probes).await;
                    let mut any_answers = false;
                    for ((name, addr), answered) in brokers.iter().zip(answered) {
                        if answered {
                            any_answers = true;
                            if missed.remove(name).is_some_and(|n| n >= BROKER_SILENT_AFTER) {
                                tracing::info!(broker = %name, %addr, "RocketMQ master answers again");
                            }
                            continue;
                        }
                        let misses = missed.entry(name.clone()).or_default();
                        *misses += 1;
                        if *misses == BROKER_SILENT_AFTER {
                            tracing::warn!(broker = %name, %addr, missed = BROKER_SILENT_AFTER, "RocketMQ master does not answer its probes; requests for its partitions time out");
                        }
                        any_answers |= *misses < BROKER_SILENT_AFTER;
                    }
                    // Masters the name server no longer lists are forgotten.
                    missed.retain(|name, _| brokers.iter().any(|(n, _)| n == name));
                    any_answers
                }
                _ => false,
            };
            if this.reachable.swap(now, Ordering::SeqCst) != now {
                if now {
                    tracing::info!("RocketMQ reachable again");
                } else {
                    tracing::warn!("RocketMQ unreachable (no name server or no master answers): publishes answer unavailable, readiness is false");
                }
            }
            drop(this);
            tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(Duration::from_secs(1)) => {} }
        }
    });
}

#[async_trait]
impl LogBackend for RocketMqLog {
    async fn topics(&self) -> Result<Vec<(TopicName, u32)>, BackendError> {
        let reserved = self.broker.cluster_and_broker_names().await?;
        let mut topics = Vec::new();
        let mut listed = std::collections::HashSet::new();
        for name in self.broker.topic_names().await? {
            if !self.is_served(&name) || reserved.contains(&name) {
                continue;
            }
            let Ok(topic) = TopicName::parse(&name) else { continue };
            listed.insert(topic.clone());
            // One topic's failure (a layout that cannot be stored) must not hide the others.
            match self.refresh_route(&topic).await {
                Ok(Some(route)) => topics.push((topic, route.partitions())),
                Ok(None) => {}
                Err(e) => tracing::warn!(%topic, error = %e, "reading a RocketMQ topic's route failed"),
            }
        }
        // Topics the name server no longer lists (deleted outside ackgate): no cached route and
        // no refusal (readiness) stay behind.
        self.routes.lock().unwrap().retain(|t, _| listed.contains(t));
        self.misrouted.lock().unwrap().retain(|t, _| listed.contains(t));
        self.rechecked.lock().unwrap().retain(|t, _| listed.contains(t));
        topics.sort();
        Ok(topics)
    }

    async fn partitions(&self, topic: &TopicName) -> Result<Option<u32>, BackendError> {
        if topic.lite().is_some() {
            return self.lite_partitions(topic).await;
        }
        Ok(self.route(topic).await?.map(|r| r.partitions()))
    }

    async fn create_topic(&self, topic: &TopicName, partitions: u32) -> Result<bool, BackendError> {
        if topic.lite().is_some() {
            return Err(BackendError::InvalidInput(format!(
                "{topic} is a lite topic: it needs no creation (publish to it), only its parent does, as a topic listed in rocketmq.lite_parents"
            )));
        }
        if !self.is_served(topic.as_str()) {
            return Err(BackendError::InvalidInput(format!("topic {topic} is not in rocketmq.topics")));
        }
        if let Some(existing) = self.refresh_route(topic).await? {
            return if existing.partitions() == partitions {
                Ok(false)
            } else {
                Err(BackendError::Conflict(format!("topic {topic} exists with {} partitions", existing.partitions())))
            };
        }
        // A new topic of an old name: numbered afresh.
        self.layouts.remove(topic).map_err(|e| BackendError::Io(format!("storing the partition layout: {e}")))?;
        // On every master, as `mqadmin updateTopic -c` does, the partitions spread over them in
        // name order (the first ones take one more when they do not divide evenly): a topic's
        // partitions are its queues on every master, numbered master by master (`layout.rs`).
        let brokers = self.broker.brokers().await?;
        if brokers.is_empty() {
            return Err(BackendError::Unavailable("the name server knows no broker".into()));
        }
        let shares: Vec<(&str, &str, u32)> = brokers
            .iter()
            .zip(spread(partitions, brokers.len()))
            .filter(|(_, queues)| *queues > 0)
            .map(|((name, addr), queues)| (name.as_str(), addr.as_str(), queues))
            .collect();
        // Creating is idempotent at the broker (UPDATE_AND_CREATE_TOPIC), so a request the broker
        // did not answer in time is sent again: on a loaded machine rocketmq-rust took longer than
        // the request timeout now and then (CI saw `POST /topics` answer 503).
        let lite_parent = self.lite.is_parent(topic.as_str());
        for (name, addr, queues) in &shares {
            let mut attempt = 0;
            while let Err(e) = self.broker.create_topic(addr, topic.as_str(), *queues, lite_parent).await {
                attempt += 1;
                match e {
                    BackendError::Unavailable(_) if attempt < CREATE_ATTEMPTS => {
                        tracing::warn!(%topic, broker = name, attempt, error = %e, "creating a RocketMQ topic failed; trying again");
                    }
                    e => return Err(e),
                }
            }
        }
        // Each broker registers the topic with the name server as it creates it; the route may
        // still take a moment on a loaded machine. It is fitted only once it names every master
        // created on: a route naming a later master first would store a numbering the earlier
        // one then could not join without renumbering.
        let deadline = tokio::time::Instant::now() + self.settings.publish_timeout;
        loop {
            let routed = self.broker.route(topic.as_str()).await?.unwrap_or_default();
            let complete = shares.iter().all(|(name, _, queues)| routed.iter().any(|b| b.name == *name && b.queues == *queues));
            if complete && self.refresh_route(topic).await?.is_some() {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(%topic, "a created RocketMQ topic is not routed by the name server within rocketmq.publish_timeout_ms");
                return Err(BackendError::Unavailable(format!("topic {topic} was created but the name server does not route it yet")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn delete_topic(&self, topic: &TopicName) -> Result<bool, BackendError> {
        if topic.lite().is_some() {
            return Err(BackendError::InvalidInput(format!(
                "{topic} is a lite topic: the broker keeps it with its parent (delete the parent, or reset offsets)"
            )));
        }
        let Some(route) = self.refresh_route(topic).await? else {
            self.layouts.remove(topic).map_err(|e| BackendError::Io(format!("storing the partition layout: {e}")))?;
            return Ok(false);
        };
        // Every broker of its numbering, or none: a topic left on one master would come back.
        let mut addrs = Vec::new();
        for (broker, addr) in route.broker_addrs() {
            addrs.push(
                addr.ok_or_else(|| BackendError::Unavailable(format!("broker {broker} of topic {topic} is away; delete it when it is back")))?.to_string(),
            );
        }
        for addr in addrs {
            self.broker.delete_topic(&addr, topic.as_str()).await?;
        }
        self.routes.lock().unwrap().remove(topic);
        self.misrouted.lock().unwrap().remove(topic);
        self.rechecked.lock().unwrap().remove(topic);
        self.layouts.remove(topic).map_err(|e| BackendError::Io(format!("storing the partition layout: {e}")))?;
        self.cursors.remove_topic(topic);
        self.ledger.forget_topic(topic);
        self.popped_to.lock().unwrap().retain(|tp, _| tp.topic != *topic);
        Ok(true)
    }

    async fn publish(&self, topic: &TopicName, events: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
        if !self.reachable.load(Ordering::SeqCst) {
            return Err(BackendError::Unavailable(format!("RocketMQ at {} is unreachable", self.settings.namesrv_addr)));
        }
        check_properties(&events)?;
        if topic.lite().is_some() {
            return self.publish_lite(topic, events).await;
        }
        let highest = events.iter().filter_map(|e| e.partition).max().unwrap_or(0);
        let route = self.route_with(topic, highest).await?;
        for event in &events {
            if let Some(p) = event.partition.filter(|p| *p >= route.partitions()) {
                return Err(BackendError::UnknownPartition(format!("partition {p} does not exist: topic {topic} has {}", route.partitions())));
            }
        }
        // Each event's queue first; then every queue's events are sent one after another (so
        // offsets within a partition follow the order given) while queues are sent to at once.
        let partitions = route.partitions();
        let mut by_partition: HashMap<u32, Vec<(usize, NewEvent)>> = HashMap::new();
        for (i, event) in events.into_iter().enumerate() {
            let partition = self.partition_for(&event, partitions);
            by_partition.entry(partition).or_default().push((i, event));
        }
        let count = by_partition.values().map(Vec::len).sum();
        // Every queue's broker known before anything is sent: a publish fails whole or not at all
        // on that account (a retry must not duplicate what went to the other partitions).
        let mut sends = Vec::with_capacity(by_partition.len());
        for (partition, events) in by_partition {
            match route.queue(partition) {
                Some(Ok(q)) => sends.push((partition, q, events)),
                _ => return Err(BackendError::Unavailable(format!("partition {partition} of {topic} is on a broker whose master is away"))),
            }
        }
        let sends = sends.into_iter().map(|(partition, q, events)| async move {
            let mut written = Vec::with_capacity(events.len());
            for (i, event) in events {
                let uniq = self.new_uniq_key();
                let mut properties: Vec<(&str, &str)> = vec![(UNIQ_KEY, uniq.as_str()), ("WAIT", "true")];
                if let Some(key) = &event.key {
                    properties.push((KEYS, key.as_str()));
                }
                properties.extend(event.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                let properties = encode_properties(&properties);
                let offset = self
                    .broker
                    .send(&q.broker_addr, PRODUCER_GROUP, topic.as_str(), q.queue_id, properties, &event.payload, self.settings.publish_timeout)
                    .await?
                    .queue_offset;
                written.push((i, (partition, offset)));
            }
            Ok::<_, BackendError>(written)
        });
        let mut written = vec![(0, 0); count];
        for queue in futures_util::future::join_all(sends).await {
            for (i, at) in queue? {
                written[i] = at;
            }
        }
        Ok(written)
    }

    async fn log_bounds(&self, tp: &TopicPartition) -> Result<PartitionBounds, BackendError> {
        if tp.topic.lite().is_some() {
            return self.lite_bounds(tp).await;
        }
        let q = self.queue_of(tp).await?;
        let log_start = self.broker.queue_offset(&q.broker_addr, tp.topic.as_str(), q.queue_id, false).await?;
        let log_end = self.broker.queue_offset(&q.broker_addr, tp.topic.as_str(), q.queue_id, true).await?;
        Ok(PartitionBounds { log_start, log_end: log_end.max(log_start) })
    }

    async fn offset_for_time(&self, tp: &TopicPartition, time_ms: u64) -> Result<u64, BackendError> {
        if tp.topic.lite().is_some() {
            return self.lite_offset_for_time(tp, time_ms).await;
        }
        let q = self.queue_of(tp).await?;
        let bounds = self.log_bounds(tp).await?;
        let offset = self.broker.offset_for_time(&q.broker_addr, tp.topic.as_str(), q.queue_id, time_ms).await?;
        Ok(offset.clamp(bounds.log_start, bounds.log_end))
    }

    async fn poll(&self, tp: &TopicPartition, from: ReadFrom, max: usize, wait: Duration) -> Result<Vec<Event>, BackendError> {
        let lite = tp.topic.lite().is_some();
        match from {
            ReadFrom::Offset(offset) if lite => self.read_lite_at(tp, offset, max).await,
            ReadFrom::Offset(offset) => self.read_at(tp, offset, max, wait, false).await,
            ReadFrom::PullCursor => {
                let lock = self.cursor_lock(tp);
                let _in_order = lock.lock().await;
                let cursor = match self.cursors.get(tp) {
                    Some(cursor) => cursor,
                    None => self.log_bounds(tp).await?.log_start,
                };
                let events = match self.settings.mode {
                    _ if lite => self.poll_lite(tp, cursor, max, wait).await?,
                    // PULL from the cursor, long-polling up to `wait`.
                    RocketMqMode::Pull => self.read_at(tp, cursor, max, wait, true).await?,
                    RocketMqMode::Pop => self.poll_pop(tp, cursor, max, wait).await?,
                };
                let next = events.last().map_or(cursor, |e| e.offset + 1);
                self.cursors.set(tp, next.max(cursor));
                Ok(events)
            }
        }
    }

    async fn lite_topics(&self, parent: &TopicName) -> Result<Vec<TopicName>, BackendError> {
        self.lite_topics_of(parent).await
    }

    fn seek(&self, tp: &TopicPartition, offset: u64) {
        self.cursors.set(tp, offset);
    }

    fn stop_pulling(&self, tp: &TopicPartition) {
        if tp.topic.lite().is_some() {
            if let Some(this) = self.me.get().and_then(std::sync::Weak::upgrade) {
                this.stop_pulling_lite(tp);
            }
        }
    }

    fn pull_offset(&self, tp: &TopicPartition) -> Option<u64> {
        self.cursors.get(tp)
    }

    fn ack_pulled_message(&self, _tp: &TopicPartition, _offset: u64) {
        // Which handles this settles is decided by the clients' floors (`settle_handles`); the
        // core counts the call itself (`ackgate_broker_acks_total{result="ok"}`).
        if self.settings.mode == RocketMqMode::Pop {
            self.acked.notify_one();
        }
    }

    fn set_ack_floor(&self, floor: Arc<dyn AckFloor>) {
        let _ = self.ack_floor.set(floor);
    }

    fn acknowledges_at_broker(&self) -> bool {
        self.settings.mode == RocketMqMode::Pop
    }

    fn settle_soon(&self) {
        if self.settings.mode == RocketMqMode::Pop {
            self.acked.notify_one();
        }
    }

    async fn settle_before_exit(&self) {
        if self.settings.mode == RocketMqMode::Pop {
            self.settle_at_exit().await;
        }
    }

    fn checkpoint(&self) -> Result<(), BackendError> {
        self.cursors.save().map_err(|e| BackendError::Io(e.to_string()))
    }

    async fn is_ready(&self) -> bool {
        self.reachable.load(Ordering::SeqCst)
    }

    fn unavailable_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.misrouted.lock().unwrap().keys().map(|t| t.to_string()).collect();
        topics.sort();
        topics
    }
}

/// What a read does with a PULL answered "not found, next at `next`" above its `offset`.
#[derive(Debug, PartialEq, Eq)]
enum NotFoundStep {
    Follow(u64),
    AskAgain,
}

fn not_found_step(offset: u64, next: u64, log_start: u64, said_before: bool) -> NotFoundStep {
    if offset < log_start {
        NotFoundStep::Follow(log_start.min(next).max(offset))
    } else if !said_before {
        NotFoundStep::AskAgain
    } else {
        NotFoundStep::Follow(next)
    }
}

/// `partitions` spread over `masters` in order, the first ones one more when they do not divide
/// evenly; masters past the count get none.
fn spread(partitions: u32, masters: usize) -> Vec<u32> {
    let masters = masters.max(1) as u32;
    (0..masters).map(|i| partitions / masters + u32::from(i < partitions % masters)).collect()
}

/// Keys and headers must fit in RocketMQ properties, and no header may be one of RocketMQ's own.
fn check_properties(events: &[NewEvent]) -> Result<(), BackendError> {
    for event in events {
        let texts = event.key.iter().map(String::as_str).chain(event.headers.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]));
        if let Some(bad) = texts.into_iter().find(|t| !is_property_safe(t)) {
            return Err(BackendError::InvalidInput(format!("RocketMQ properties cannot hold the control characters \\u0001 or \\u0002: {bad:?}")));
        }
        if let Some((name, _)) = event.headers.iter().find(|(k, _)| is_system_property(k) || k.is_empty()) {
            return Err(BackendError::InvalidInput(format!("header {name:?} is reserved by RocketMQ")));
        }
    }
    Ok(())
}

/// Logs and counts a message that did not decode (issue 20: never a reader stopped by it).
fn undecodable(tp: &TopicPartition, offset: u64, bad: &Undecodable) {
    tracing::warn!(%tp, offset, error = %bad.error, "a RocketMQ message could not be decoded: dead-lettered as undecodable");
    crate::core::metrics::undecodable_records().increment(1);
}

#[cfg(test)]
mod tests {
    use super::{not_found_step, spread, NotFoundStep};

    #[test]
    fn a_forward_not_found_is_followed_to_the_log_start_or_only_when_said_twice() {
        // Below the log start: to the start, never past it (the broker's next may overshoot).
        assert_eq!(not_found_step(3, 50, 10, false), NotFoundStep::Follow(10));
        assert_eq!(not_found_step(3, 8, 10, false), NotFoundStep::Follow(8));
        // Within the log: asked again first, followed the second time.
        assert_eq!(not_found_step(12, 20, 10, false), NotFoundStep::AskAgain);
        assert_eq!(not_found_step(12, 20, 10, true), NotFoundStep::Follow(20));
        assert_eq!(not_found_step(0, u64::MAX, 0, false), NotFoundStep::AskAgain);
    }

    #[test]
    fn partitions_spread_over_masters_first_ones_first() {
        assert_eq!(spread(4, 2), [2, 2]);
        assert_eq!(spread(5, 2), [3, 2]);
        assert_eq!(spread(1, 3), [1, 0, 0]);
        assert_eq!(spread(7, 1), [7]);
        assert_eq!(spread(u32::MAX, 2), [u32::MAX / 2 + 1, u32::MAX / 2]);
        assert_eq!(spread(3, 0), [3], "no master known is refused before; never a division by zero");
    }
}
