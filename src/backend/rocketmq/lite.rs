//! RocketMQ 5.x lite topics (`rocketmq.lite_parents`): a parent topic holds any number of small
//! topics (one per chat room, user, device), each stored by the broker as a light message queue
//! (`%LMQ%$parent$lite`, queue 0, offsets from 0). ackgate addresses one as `parent@lite`.
//!
//! - Partitions: one per master broker of the parent, in the parent's layout order (`layout.rs`);
//!   with one broker, a lite topic has one partition. Its pull key is `parent#lite@queue`.
//! - Publish: SEND to the parent with the `__LITE_TOPIC` property; the broker dispatches it to the
//!   lite queue. The send answers only the parent's queue offset, so the stored message is read
//!   back (VIEW_MESSAGE_BY_ID) for its lite queue offset.
//! - Reading: a lite queue cannot be PULLed; POP_LITE is the only read, and it moves the
//!   consumer group's offset of each lite queue at pop time (rocketmq-rust 1.0 has no revive and
//!   no ACK for lite pops). So ackgate's own pull cursor is the position that counts, as in PULL
//!   mode: one client id per instance subscribes (LITE_SUBSCRIPTION_CTL) to every lite topic read
//!   here, a poller per parent and broker POPs for all of them at once, and each message goes to
//!   its lite topic's buffer only if it is the next offset expected; anything else (a restart, a
//!   rewind, a pop racing a reset) sets the group's offset back to the cursor (an add with an
//!   offset) and asks the broker to dispatch again. Those resyncs go out batched, one request for
//!   up to `RESYNC_BATCH` lite topics (`send_owed`). A pop whose answer is lost may have moved
//!   some lite topics' offsets, which ones is not known: each lite topic of the poller compares
//!   its expected offset with the log end at its next poll and resyncs only if a message was
//!   there to pop. A lite topic nobody reads here costs nothing: no subscription, no buffer, no
//!   task (the poller of a parent ends with its last reader).
//! - Catch-up reads by offset (a subscriber below the shared reader) use a second group and
//!   client: set its offset, dispatch, pop, one lite topic at a time per parent.
//! - The deferred broker ACK has nothing to do: the pop already committed. What replaces the
//!   broker's redelivery is ackgate's cursor and the clients' committed offsets: lite topics are
//!   not aligned at boot (there may be 100,000), so a client below a reader's checkpointed
//!   cursor reads by catch-up.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::broker::LiteAction;
use super::layout::PartitionQueue;
use super::message::{encode_properties, StoredMessage, KEYS, UNIQ_KEY};
use super::RocketMqLog;
use crate::core::backend::{BackendError, Event, NewEvent, PartitionBounds};
use crate::core::names::{TopicName, TopicPartition};

/// The message property naming a message's lite topic.
pub const LITE_TOPIC: &str = "__LITE_TOPIC";
const MULTI_DISPATCH: &str = "INNER_MULTI_DISPATCH";
const MULTI_QUEUE_OFFSET: &str = "INNER_MULTI_QUEUE_OFFSET";
/// File in `data_dir` holding this instance's lite client id (groups and subscriptions at the
/// broker are per instance: two instances reading one lite topic must not move each other's
/// offsets).
const CLIENT_ID_FILE: &str = "rocketmq-lite-client";
/// How long one POP_LITE of a poller waits at the broker for a message.
const POLL_WAIT: Duration = Duration::from_secs(1);
/// Popped events (and their payload bytes) held per lite topic until its reader takes them; past
/// either they are dropped and read again (the group's offset is set back).
const BUFFERED_MAX: usize = 1024;
const BUFFERED_MAX_BYTES: usize = 4 << 20;
/// A lite topic whose reader has not polled for this long is dropped here (its reader is gone).
const IDLE_QUEUE: Duration = Duration::from_secs(30);
/// Resyncs from one offset in a row, with the lite queue holding messages past it, after which
/// the message there is taken as one that cannot be read (an undecodable stand-in is delivered).
const STUCK_RESYNCS: u32 = 5;
/// Attempts to read a published message back for its lite offset.
const VIEW_ATTEMPTS: u32 = 3;
/// Lite topics whose group offsets one request sets at most.
const RESYNC_BATCH: usize = 1000;

/// Lite-topic state of one backend.
pub struct LiteState {
    parents: HashSet<String>,
    /// This instance's lite client id, kept in `data_dir`.
    client_id: String,
    /// Lite topics read here: their buffers and where the group's offset stands.
    queues: Mutex<HashMap<TopicPartition, LiteQueue>>,
    /// Running pollers, by (parent, broker name).
    pollers: Mutex<HashSet<(String, String)>>,
    /// Groups known to exist, by (broker address, group).
    groups: Mutex<HashSet<(String, String)>>,
    /// Catch-up reads of one parent run one at a time (one catch-up client per parent).
    catch_up: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What the read client owes the broker, by (parent, broker address): group offsets to set
    /// again and a dispatch trigger, sent by one task per key (`send_owed`).
    owed: Mutex<HashMap<(String, String), Owed>>,
}

/// One lite topic's group offset to set: to `from`, for its resync number `seq`.
struct OwedResync {
    tp: TopicPartition,
    from: u64,
    seq: u64,
}

/// Requests owed to one broker for one parent's read client.
#[derive(Default)]
struct Owed {
    /// Lite topics whose group offset is to be set, and where (in the order asked).
    resyncs: Vec<OwedResync>,
    /// A dispatch trigger is owed.
    trigger: bool,
}

struct LiteQueue {
    broker_name: String,
    /// Popped events not taken yet, contiguous, and their payload bytes.
    buffered: VecDeque<Event>,
    buffered_bytes: usize,
    /// When its reader last polled (a queue left behind by a reader that is gone is dropped).
    polled_at: std::time::Instant,
    /// The offset of the last resync and how many ran from it in a row.
    resynced: (u64, u32),
    /// The offset the next popped message must have (the group's offset as ackgate set it);
    /// `None`: set it again before reading on.
    expected: Option<u64>,
    /// A pop whose answer was lost (or a popped message naming no lite topic) may have moved the
    /// group's offset past `expected`: the next poll compares `expected` with the log end.
    suspect: bool,
    /// The broker served past `expected` (below its log start, or past a gap): the next resync
    /// reads the bounds first.
    check_bounds: bool,
    /// When the group's offset was last set as `expected` says (`None` while a resync is owed):
    /// a message past `expected` from a pop that started before is from the old offset, not a gap.
    resync_landed: Option<std::time::Instant>,
    /// `(cursor, log_start)` of the last resync that found the cursor below the log start: the
    /// events buffered from the log start are served to that cursor (the reader reports the gap).
    clamped: Option<(u64, u64)>,
    /// The number of its latest resync: the answer to an older one says nothing of it.
    resync_seq: u64,
    arrived: Arc<tokio::sync::Notify>,
}

impl LiteState {
    pub fn load(data_dir: &Path, parents: &[String], fresh_id: &str) -> std::io::Result<Self> {
        let path = data_dir.join(CLIENT_ID_FILE);
        let client_id = match std::fs::read_to_string(&path) {
            Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
            Ok(_) => write_client_id(&path, fresh_id)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_client_id(&path, fresh_id)?,
            Err(e) => return Err(e),
        };
        Ok(Self {
            parents: parents.iter().cloned().collect(),
            client_id,
            queues: Mutex::new(HashMap::new()),
            pollers: Mutex::new(HashSet::new()),
            groups: Mutex::new(HashSet::new()),
            catch_up: Mutex::new(HashMap::new()),
            owed: Mutex::new(HashMap::new()),
        })
    }

    pub fn is_parent(&self, topic: &str) -> bool {
        self.parents.contains(topic)
    }
}

fn write_client_id(path: &Path, id: &str) -> std::io::Result<String> {
    crate::durable_files::write_atomically(path, id.as_bytes())?;
    Ok(id.to_string())
}

/// RocketMQ group names take `[A-Za-z0-9_%|-]`: a topic's `.` is written `%2E` (no two parents
/// share a group).
/// What a lite group (and its client) is for: each keeps its own offsets at the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The pollers that feed the shared readers.
    Read,
    /// Catch-up reads by offset.
    CatchUp,
    /// Listing a parent's lite topics (a wildcard group).
    Index,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::CatchUp => "catchup",
            Role::Index => "index",
        }
    }
}

fn group_part(name: &str) -> String {
    name.replace('.', "%2E")
}

/// The lite queue's offset of a popped or viewed message, from the properties the store added.
fn lite_offset(m: &StoredMessage, lmq: &str) -> Option<u64> {
    let at = m.property(MULTI_DISPATCH)?.split(',').position(|q| q == lmq)?;
    m.property(MULTI_QUEUE_OFFSET)?.split(',').nth(at)?.parse().ok()
}

fn lmq_name(parent: &str, lite: &str) -> String {
    format!("%LMQ%${parent}${lite}")
}

impl RocketMqLog {
    /// `(parent, lite)` of a lite topic of a served parent.
    pub(super) fn lite_of<'t>(&self, topic: &'t TopicName) -> Option<(&'t str, &'t str)> {
        topic.lite().filter(|(parent, _)| self.lite.is_parent(parent))
    }

    fn lite_group(&self, parent: &str, role: Role) -> String {
        format!("{}-lite-{}-{}-{}", self.settings.consumer_group, self.lite.client_id, role.name(), group_part(parent))
    }

    fn lite_client(&self, role: Role) -> String {
        match role {
            Role::Read => self.lite.client_id.clone(),
            _ => format!("{}-{}", self.lite.client_id, role.name()),
        }
    }

    /// The route of a lite topic's parent (`None`: the parent does not exist).
    async fn parent_route(&self, topic: &TopicName) -> Result<Option<super::layout::Route>, BackendError> {
        let (parent, _) = self.lite_of(topic).ok_or_else(|| BackendError::UnknownTopic(topic.to_string()))?;
        self.route(&TopicName::parse(parent).map_err(|e| BackendError::InvalidInput(e.0))?).await
    }

    /// Partitions of a lite topic: one per master broker of its parent.
    pub(super) async fn lite_partitions(&self, topic: &TopicName) -> Result<Option<u32>, BackendError> {
        if self.lite_of(topic).is_none() {
            return Ok(None);
        }
        Ok(self.parent_route(topic).await?.map(|r| r.layout.len() as u32).filter(|n| *n > 0))
    }

    /// The broker of a lite topic's partition, with a queue of the parent on it (where sends go).
    async fn lite_queue(&self, tp: &TopicPartition) -> Result<PartitionQueue, BackendError> {
        let route = self.parent_route(&tp.topic).await?.ok_or_else(|| BackendError::UnknownTopic(format!("{} (its parent does not exist)", tp.topic)))?;
        let Some((broker, _)) = route.layout.get(tp.partition as usize) else {
            return Err(BackendError::UnknownPartition(format!(
                "partition {} does not exist: lite topic {} has {}",
                tp.partition,
                tp.topic,
                route.layout.len()
            )));
        };
        let addr = route.addr_of(broker).ok_or_else(|| {
            BackendError::Unavailable(format!("partition {} of {} is on broker {broker}, whose master address is not known", tp.partition, tp.topic))
        })?;
        Ok(PartitionQueue { broker_name: broker.clone(), broker_addr: addr.to_string(), queue_id: 0 })
    }

    /// The group of `role` for `parent`, created at the broker once per start.
    async fn ensure_lite_group(&self, addr: &str, parent: &str, role: Role) -> Result<String, BackendError> {
        let group = self.lite_group(parent, role);
        let key = (addr.to_string(), group.clone());
        if !self.lite.groups.lock().unwrap().contains(&key) {
            self.broker.ensure_lite_group(addr, &group, parent, role == Role::Index).await?;
            self.lite.groups.lock().unwrap().insert(key);
        }
        Ok(group)
    }

    pub(super) async fn lite_bounds(&self, tp: &TopicPartition) -> Result<PartitionBounds, BackendError> {
        let q = self.lite_queue(tp).await?;
        let (parent, lite) = self.lite_of(&tp.topic).expect("checked by lite_queue");
        let lmq = lmq_name(parent, lite);
        let log_start = self.broker.queue_offset(&q.broker_addr, &lmq, 0, false).await?;
        let log_end = self.broker.queue_offset(&q.broker_addr, &lmq, 0, true).await?;
        Ok(PartitionBounds { log_start, log_end: log_end.max(log_start) })
    }

    pub(super) async fn lite_offset_for_time(&self, tp: &TopicPartition, time_ms: u64) -> Result<u64, BackendError> {
        let q = self.lite_queue(tp).await?;
        let (parent, lite) = self.lite_of(&tp.topic).expect("checked by lite_queue");
        let bounds = self.lite_bounds(tp).await?;
        let offset = self.broker.offset_for_time(&q.broker_addr, &lmq_name(parent, lite), 0, time_ms).await?;
        Ok(offset.clamp(bounds.log_start, bounds.log_end))
    }

    /// The lite topics of a served parent, on every broker of it, sorted.
    pub(super) async fn lite_topics_of(&self, parent: &TopicName) -> Result<Vec<TopicName>, BackendError> {
        if !self.lite.is_parent(parent.as_str()) {
            return Err(BackendError::UnknownTopic(format!("{parent} is no lite parent: it is not in rocketmq.lite_parents")));
        }
        let route = self.route(parent).await?.ok_or_else(|| BackendError::UnknownTopic(parent.to_string()))?;
        let client = self.lite_client(Role::Index);
        let mut names = std::collections::BTreeSet::new();
        for (broker, addr) in route.broker_addrs() {
            let addr = addr.ok_or_else(|| BackendError::Unavailable(format!("broker {broker} of {parent} is away")))?;
            let group = self.ensure_lite_group(addr, parent.as_str(), Role::Index).await?;
            for lite in self.broker.lite_topic_names(addr, &group, &client, parent.as_str()).await? {
                // A name outside ackgate's alphabet (sent by another producer) cannot be addressed.
                if let Ok(topic) = TopicName::parse(&format!("{parent}@{lite}")) {
                    names.insert(topic);
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Publishes to a lite topic: each event to its partition's broker, on the parent, with the
    /// lite property; answers the lite queue offsets.
    pub(super) async fn publish_lite(&self, topic: &TopicName, events: Vec<NewEvent>) -> Result<Vec<(u32, u64)>, BackendError> {
        let (parent, lite) = self.lite_of(topic).ok_or_else(|| BackendError::UnknownTopic(topic.to_string()))?;
        let partitions =
            self.lite_partitions(topic).await?.ok_or_else(|| BackendError::UnknownTopic(format!("{topic} (its parent {parent} does not exist)")))?;
        let mut queues = HashMap::new();
        for p in 0..partitions {
            queues.insert(p, self.lite_queue(&TopicPartition::new(topic.clone(), p)).await?);
        }
        if let Some(p) = events.iter().filter_map(|e| e.partition).find(|p| *p >= partitions) {
            return Err(BackendError::UnknownPartition(format!("partition {p} does not exist: lite topic {topic} has {partitions}")));
        }
        let lmq = lmq_name(parent, lite);
        let mut written = Vec::with_capacity(events.len());
        for event in events {
            let partition = self.partition_for(&event, partitions);
            let q = &queues[&partition];
            let uniq = self.new_uniq_key();
            let mut properties: Vec<(&str, &str)> = vec![(UNIQ_KEY, uniq.as_str()), ("WAIT", "true"), (LITE_TOPIC, lite)];
            if let Some(key) = &event.key {
                properties.push((KEYS, key.as_str()));
            }
            properties.extend(event.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let sent = self
                .broker
                .send(&q.broker_addr, super::PRODUCER_GROUP, parent, q.queue_id, encode_properties(&properties), &event.payload, self.settings.publish_timeout)
                .await?;
            // Stored: from here on an error must say so, and not as one worth retrying (a retry
            // would publish it twice).
            let stored_count = written.len() + 1;
            let stored = |why: String| {
                BackendError::Conflict(format!(
                    "{stored_count} event(s) were stored in {topic} but the lite offset of the last could not be read ({why}): do not retry them"
                ))
            };
            let commit_log_offset = sent.commit_log_offset().ok_or_else(|| stored(format!("message id {:?}", sent.msg_id)))?;
            let mut attempt = 0;
            let message = loop {
                attempt += 1;
                match self.broker.view_message(&q.broker_addr, commit_log_offset).await {
                    Ok(message) => break message,
                    Err(e) if attempt >= VIEW_ATTEMPTS => return Err(stored(e.to_string())),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            let offset = message.ok().as_ref().and_then(|m| lite_offset(m, &lmq)).ok_or_else(|| {
                stored("the broker did not dispatch it to a lite queue: are enableLmq and enableMultiDispatch on, and is the parent a lite topic?".into())
            })?;
            written.push((partition, offset));
        }
        Ok(written)
    }

    /// A poll at the pull cursor of a lite topic: the events the poller popped for it from the
    /// cursor on, waiting up to `wait` for some.
    pub(super) async fn poll_lite(&self, tp: &TopicPartition, cursor: u64, max: usize, wait: Duration) -> Result<Vec<Event>, BackendError> {
        let (parent, lite) = self.lite_of(&tp.topic).ok_or_else(|| BackendError::UnknownTopic(tp.topic.to_string()))?;
        let q = self.lite_queue(tp).await?;
        self.ensure_lite_group(&q.broker_addr, parent, Role::Read).await?;
        let (mut resync, suspect_at, arrived) = {
            let mut queues = self.lite.queues.lock().unwrap();
            let queue = queues.entry(tp.clone()).or_insert_with(|| LiteQueue {
                broker_name: q.broker_name.clone(),
                buffered: VecDeque::new(),
                buffered_bytes: 0,
                polled_at: std::time::Instant::now(),
                resynced: (u64::MAX, 0),
                expected: None,
                suspect: false,
                check_bounds: false,
                resync_landed: None,
                clamped: None,
                resync_seq: 0,
                arrived: Arc::new(tokio::sync::Notify::new()),
            });
            queue.polled_at = std::time::Instant::now();
            // Where the buffer must start: the cursor, or the log start a resync found above it.
            let start = match queue.clamped {
                Some((below, log_start)) if below == cursor => log_start,
                _ => cursor,
            };
            while queue.buffered.front().is_some_and(|e| e.offset < start) {
                let e = queue.buffered.pop_front().expect("checked");
                queue.buffered_bytes -= e.size_bytes();
            }
            if queue.buffered.front().is_some_and(|e| e.offset != start) {
                // The cursor was moved (a seek below what was popped): read again from it.
                queue.buffered.clear();
                queue.buffered_bytes = 0;
            }
            let next = start + queue.buffered.len() as u64;
            let mut resync = None;
            if queue.expected != Some(next) {
                // Set before asking: a pop still in flight from the old offset is told apart.
                queue.expected = Some(next);
                queue.suspect = false;
                queue.resync_landed = None;
                queue.resync_seq += 1;
                resync = Some((next, queue.resync_seq));
            }
            let suspect_at = (resync.is_none() && queue.suspect && queue.buffered.is_empty()).then_some(next);
            (resync, suspect_at, queue.arrived.clone())
        };
        if let Some(at) = suspect_at {
            // A lost pop moved the group's offset only if there was a message to pop.
            let log_end = self.broker.queue_offset(&q.broker_addr, &lmq_name(parent, lite), 0, true).await?;
            let mut queues = self.lite.queues.lock().unwrap();
            if let Some(queue) = queues.get_mut(tp).filter(|queue| queue.suspect && queue.expected == Some(at)) {
                queue.suspect = false;
                if log_end > at {
                    queue.resync_landed = None;
                    queue.resync_seq += 1;
                    resync = Some((at, queue.resync_seq));
                }
            }
        }
        // A poll dropped from here until the resync is owed (its reader replaced) must not leave
        // `expected` naming an offset nobody asked the broker for.
        let mut unowed = UnowedResync { state: &self.lite, tp, armed: resync.is_some() };
        if let Some((next, seq)) = resync {
            let from = match self.resync_from(tp, next).await {
                Ok(Resync::From(from)) => from,
                Ok(Resync::Stuck) => {
                    // The same offset resynced again and again with messages past it: the message
                    // there cannot be read (it does not decode). Every subscriber dead-letters it
                    // and goes on (issue 20: never a stopped reader).
                    tracing::warn!(%tp, offset = next, "a lite message could not be read after {STUCK_RESYNCS} tries: dead-lettered as undecodable");
                    crate::core::metrics::undecodable_records().increment(1);
                    return Ok(vec![Event::undecodable(tp.partition, next)]);
                }
                Err(e) => {
                    self.forget_expected(tp);
                    return Err(e);
                }
            };
            self.owe(parent, &q.broker_addr, Some(OwedResync { tp: tp.clone(), from, seq }));
            unowed.armed = false;
            crate::core::metrics::rocketmq_lite_resyncs(parent).increment(1);
            tracing::debug!(%tp, from, "lite topic: the group's offset is set to the pull cursor");
            self.spawn_lite_poller(parent, &q.broker_name, tp.partition);
        }
        let take = |queues: &mut HashMap<TopicPartition, LiteQueue>| -> Vec<Event> {
            let Some(queue) = queues.get_mut(tp) else { return Vec::new() };
            let n = queue.buffered.len().min(max);
            let taken: Vec<Event> = queue.buffered.drain(..n).collect();
            queue.buffered_bytes -= taken.iter().map(|e| e.size_bytes()).sum::<usize>();
            if !taken.is_empty() {
                queue.resynced = (u64::MAX, 0);
            }
            taken
        };
        let notified = arrived.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let events = take(&mut self.lite.queues.lock().unwrap());
        if !events.is_empty() || wait.is_zero() {
            return Ok(events);
        }
        let _ = tokio::time::timeout(wait, notified).await;
        Ok(take(&mut self.lite.queues.lock().unwrap()))
    }

    /// A catch-up read of a lite topic from `from`: the catch-up group's offset is set there, the
    /// broker dispatches, and one pop answers.
    pub(super) async fn read_lite_at(&self, tp: &TopicPartition, from: u64, max: usize) -> Result<Vec<Event>, BackendError> {
        let (parent, lite) = self.lite_of(&tp.topic).ok_or_else(|| BackendError::UnknownTopic(tp.topic.to_string()))?;
        let bounds = self.lite_bounds(tp).await?;
        if from >= bounds.log_end {
            return Ok(Vec::new());
        }
        let from = from.max(bounds.log_start);
        let q = self.lite_queue(tp).await?;
        let group = self.ensure_lite_group(&q.broker_addr, parent, Role::CatchUp).await?;
        let client = self.lite_client(Role::CatchUp);
        let lock = self.lite.catch_up.lock().unwrap().entry(parent.to_string()).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        // Replacing the whole subscription (one left behind by a cancelled catch-up goes too) and
        // setting the offset: rocketmq-rust sets none on a complete add, so a catch-up after an
        // earlier one popped from where that one ended (a rewound client got nothing).
        self.broker.lite_subscribe_only(&q.broker_addr, &client, &group, parent, lite, from).await?;
        let lmq = lmq_name(parent, lite);
        let read = async {
            self.broker.trigger_lite_dispatch(&q.broker_addr, &group, &client).await?;
            let deadline = tokio::time::Instant::now() + self.settings.request_timeout;
            loop {
                let messages =
                    self.broker.pop_lite(&q.broker_addr, &client, &group, parent, max, self.settings.invisible_time, Duration::from_millis(200)).await?;
                if messages.first().is_some_and(Result::is_err) {
                    // The first message from `from` does not decode: it stands at `from`.
                    return Ok(vec![Event::undecodable(tp.partition, from)]);
                }
                let mut events: Vec<Event> = messages
                    .into_iter()
                    .filter_map(Result::ok)
                    .filter_map(|m| Some((lite_offset(&m, &lmq)?, m)))
                    .filter(|(offset, _)| *offset >= from)
                    .map(|(offset, m)| Event { partition: tp.partition, offset, ..m.into_event() })
                    .collect();
                events.sort_by_key(|e| e.offset);
                let contiguous = events.iter().enumerate().take_while(|(i, e)| e.offset == from + *i as u64).count();
                events.truncate(contiguous.min(max));
                if !events.is_empty() || tokio::time::Instant::now() >= deadline {
                    return Ok::<_, BackendError>(events);
                }
                // An empty answer may come at once: not a tight loop.
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.broker.trigger_lite_dispatch(&q.broker_addr, &group, &client).await?;
            }
        };
        let events = read.await;
        if let Err(e) = self.broker.lite_subscription(&q.broker_addr, LiteAction::Remove, &client, &group, parent, &[lite], None).await {
            tracing::warn!(%tp, error = %e, "removing a catch-up lite subscription failed");
        }
        events
    }

    /// Nobody reads `tp` here any more: its buffer goes, and its subscription at the broker once
    /// no new reader has taken it up meanwhile.
    pub(super) fn stop_pulling_lite(self: &Arc<Self>, tp: &TopicPartition) {
        if self.lite.queues.lock().unwrap().remove(tp).is_none() {
            return;
        }
        let (this, tp) = (Arc::downgrade(self), tp.clone());
        tokio::spawn(async move {
            let Some(this) = this.upgrade() else { return };
            // In order with the next reader's polls: it resubscribes if it came first.
            let lock = this.cursor_lock(&tp);
            let _in_order = lock.lock().await;
            if this.lite.queues.lock().unwrap().contains_key(&tp) {
                return;
            }
            let Some((parent, lite)) = this.lite_of(&tp.topic) else { return };
            let removed = async {
                let q = this.lite_queue(&tp).await?;
                let group = this.ensure_lite_group(&q.broker_addr, parent, Role::Read).await?;
                this.broker.lite_subscription(&q.broker_addr, LiteAction::Remove, &this.lite_client(Role::Read), &group, parent, &[lite], None).await
            };
            if let Err(e) = removed.await {
                tracing::warn!(%tp, error = %e, "removing a lite subscription at the broker failed (its pops are dropped here)");
            }
        });
    }

    /// Starts the poller of `parent` on `broker` unless it runs.
    fn spawn_lite_poller(&self, parent: &str, broker: &str, partition: u32) {
        let key = (parent.to_string(), broker.to_string());
        if !self.lite.pollers.lock().unwrap().insert(key.clone()) {
            return;
        }
        let Some(this) = self.me.get().and_then(Weak::upgrade) else {
            self.lite.pollers.lock().unwrap().remove(&key);
            return;
        };
        tokio::spawn(run_lite_poller(Arc::downgrade(&this), key, partition));
    }

    /// Hands popped messages to their lite topics' buffers: each only if it is the offset
    /// expected next; a later one means the group's offset moved under ackgate (set it again).
    fn deliver_lite(&self, parent: &str, partition: u32, messages: Vec<super::message::Decoded>, pop_started: std::time::Instant) {
        let mut queues = self.lite.queues.lock().unwrap();
        let mut woken = Vec::new();
        for message in messages {
            let attributed = message.as_ref().ok().and_then(|m| {
                let lite = m.property(LITE_TOPIC)?;
                let topic = TopicName::parse(&format!("{parent}@{lite}")).ok()?;
                Some((TopicPartition::new(topic, partition), lite_offset(m, &lmq_name(parent, lite))?))
            });
            let Some((tp, offset)) = attributed else {
                // Popped (the group's offset moved past it) but not attributable to a lite topic:
                // every lite topic of this poller sets its offset again and re-reads.
                tracing::warn!(
                    parent,
                    "a popped lite message names no lite topic or offset (or does not decode); its parent's lite topics read again from their cursors"
                );
                suspect_all(&mut queues, parent, partition, false);
                continue;
            };
            let Some(queue) = queues.get_mut(&tp) else { continue };
            let Ok(m) = message else { continue };
            match queue.expected {
                Some(expected) if offset == expected && queue.buffered.len() < BUFFERED_MAX && queue.buffered_bytes < BUFFERED_MAX_BYTES => {
                    let event = Event { partition, offset, ..m.into_event() };
                    queue.buffered_bytes += event.size_bytes();
                    queue.buffered.push_back(event);
                    queue.expected = Some(offset + 1);
                    woken.push(queue.arrived.clone());
                }
                // Popped again after a reset: already buffered or taken.
                Some(expected) if offset < expected => {}
                // From a pop that started before the group's offset was set to `expected`: the
                // old offset, not a gap (counting it made a delayed resync look stuck).
                Some(expected) if offset > expected && queue.resync_landed.is_none_or(|landed| landed > pop_started) => {}
                // Past a gap (the bounds are read before reading again), or no room: set the
                // group's offset again at the next poll.
                expected => {
                    queue.check_bounds |= expected.is_some_and(|expected| offset > expected);
                    queue.expected = None;
                    woken.push(queue.arrived.clone());
                }
            }
        }
        drop(queues);
        for arrived in woken {
            arrived.notify_waiters();
        }
    }

    fn forget_expected(&self, tp: &TopicPartition) {
        if let Some(queue) = self.lite.queues.lock().unwrap().get_mut(tp) {
            queue.expected = None;
        }
    }

    /// Where a resync of `tp` at `next` sets the group's offset: `next`, or the log start if the
    /// broker served past the offset expected (it serves from the log start when asked below it);
    /// `Stuck` once resyncs at `next` ran `STUCK_RESYNCS` times in a row with messages past it.
    /// The bounds are read only when one of those may apply (two requests per lite topic).
    async fn resync_from(&self, tp: &TopicPartition, next: u64) -> Result<Resync, BackendError> {
        let (count, check_bounds) = {
            let queues = self.lite.queues.lock().unwrap();
            let Some(queue) = queues.get(tp) else { return Ok(Resync::From(next)) };
            let (at, count) = queue.resynced;
            (if at == next { count + 1 } else { 1 }, queue.check_bounds)
        };
        let mut from = next;
        if check_bounds || count > 1 {
            let bounds = self.lite_bounds(tp).await?;
            if count > STUCK_RESYNCS && bounds.log_start <= next && next < bounds.log_end {
                if let Some(queue) = self.lite.queues.lock().unwrap().get_mut(tp) {
                    queue.resynced = (u64::MAX, 0);
                    queue.expected = None;
                    queue.check_bounds = false;
                }
                return Ok(Resync::Stuck);
            }
            from = next.max(bounds.log_start);
        }
        if let Some(queue) = self.lite.queues.lock().unwrap().get_mut(tp) {
            queue.resynced = (next, count);
            queue.check_bounds = false;
            if from != next {
                queue.buffered.clear();
                queue.buffered_bytes = 0;
                queue.expected = Some(from);
                queue.clamped = Some((next, from));
            }
        }
        Ok(Resync::From(from))
    }

    /// Owes the broker a resync of a lite topic (if any) and a dispatch trigger after it, sent by
    /// the task of `(parent, addr)` (started unless it runs).
    fn owe(&self, parent: &str, addr: &str, resync: Option<OwedResync>) {
        let key = (parent.to_string(), addr.to_string());
        {
            let mut owed = self.lite.owed.lock().unwrap();
            let running = owed.contains_key(&key);
            let entry = owed.entry(key.clone()).or_default();
            entry.resyncs.extend(resync);
            entry.trigger = true;
            if running {
                return;
            }
        }
        match self.me.get().and_then(Weak::upgrade) {
            Some(this) => drop(tokio::spawn(send_owed(Arc::downgrade(&this), key))),
            None => drop(self.lite.owed.lock().unwrap().remove(&key)),
        }
    }

    /// Drops the lite topics of `parent` on `broker` whose reader stopped polling long ago (one
    /// that raced `stop_pulling`): their subscriptions go at the broker too.
    async fn drop_idle_lite_queues(&self, parent: &str, broker: &str, addr: &str, group: &str) {
        let idle: Vec<TopicPartition> = {
            let mut queues = self.lite.queues.lock().unwrap();
            let idle: Vec<TopicPartition> = queues
                .iter()
                .filter(|(tp, q)| q.broker_name == broker && q.polled_at.elapsed() > IDLE_QUEUE && tp.topic.lite().is_some_and(|(p, _)| p == parent))
                .map(|(tp, _)| tp.clone())
                .collect();
            for tp in &idle {
                queues.remove(tp);
            }
            idle
        };
        let lites: Vec<&str> = idle.iter().filter_map(|tp| tp.topic.lite().map(|(_, l)| l)).collect();
        if !lites.is_empty() {
            tracing::info!(parent, count = lites.len(), "lite topics nobody polled for 30 s dropped here");
            if let Err(e) = self.broker.lite_subscription(addr, LiteAction::Remove, &self.lite_client(Role::Read), group, parent, &lites, None).await {
                tracing::warn!(parent, error = %e, "removing idle lite subscriptions failed");
            }
        }
    }

    fn lite_broker_in_use(&self, parent: &str, broker: &str) -> bool {
        self.lite.queues.lock().unwrap().iter().any(|(tp, q)| q.broker_name == broker && tp.topic.lite().is_some_and(|(p, _)| p == parent))
    }
}

/// Every lite topic of `parent` on the poller's partition compares its expected offset with the
/// log end at its next poll (a pop moved the group's offsets of lite topics it cannot name).
fn suspect_all(queues: &mut HashMap<TopicPartition, LiteQueue>, parent: &str, partition: u32, recount: bool) {
    for (tp, queue) in queues.iter_mut() {
        if tp.partition == partition && tp.topic.lite().is_some_and(|(p, _)| p == parent) {
            queue.suspect = true;
            if recount {
                queue.resynced = (u64::MAX, 0);
            }
        }
    }
}

/// Forgets a lite topic's `expected` when dropped armed (`poll_lite`).
struct UnowedResync<'a> {
    state: &'a LiteState,
    tp: &'a TopicPartition,
    armed: bool,
}

impl Drop for UnowedResync<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(queue) = self.state.queues.lock().unwrap().get_mut(self.tp) {
                queue.expected = None;
            }
        }
    }
}

/// How a lite topic's group offset is set again (`resync_from`).
enum Resync {
    From(u64),
    /// The message at the offset cannot be read.
    Stuck,
}

/// Lite topics whose group offset is set to one offset.
type LitesAt<'a> = (u64, Vec<&'a str>);

/// The offset to set for each lite topic (the last one asked wins), and the same as one entry per
/// offset with its lite topics (sorted, for a request).
fn resync_entries(resyncs: &[OwedResync]) -> (HashMap<&TopicPartition, &OwedResync>, Vec<LitesAt<'_>>) {
    let last: HashMap<&TopicPartition, &OwedResync> = resyncs.iter().map(|r| (&r.tp, r)).collect();
    let mut by_offset: std::collections::BTreeMap<u64, Vec<&str>> = std::collections::BTreeMap::new();
    for (tp, resync) in &last {
        if let Some((_, lite)) = tp.topic.lite() {
            by_offset.entry(resync.from).or_default().push(lite);
        }
    }
    let mut at: Vec<(u64, Vec<&str>)> = by_offset.into_iter().collect();
    at.iter_mut().for_each(|(_, lites)| lites.sort_unstable());
    (last, at)
}

/// Sends what the read client owes the broker for one parent, until nothing is owed: the group
/// offsets to set, up to `RESYNC_BATCH` lite topics per request (one entry per offset), then a
/// dispatch trigger, so every resync is followed by a trigger that started after it. One request
/// per lite topic made 10,000 lite topics with traffic stall the broker (it copies the client's
/// whole subscription per request), and a pop answer lost there set all 10,000 again.
async fn send_owed(log: Weak<RocketMqLog>, key: (String, String)) {
    let (parent, addr) = (&key.0, &key.1);
    loop {
        let Some(this) = log.upgrade() else { return };
        let (group, client) = (this.lite_group(parent, Role::Read), this.lite_client(Role::Read));
        let resyncs: Vec<OwedResync> = {
            let mut owed = this.lite.owed.lock().unwrap();
            let Some(o) = owed.get_mut(&key) else { return };
            if (o.resyncs.is_empty() && !o.trigger) || this.stop.is_cancelled() {
                owed.remove(&key);
                return;
            }
            o.trigger = false;
            let n = o.resyncs.len().min(RESYNC_BATCH);
            let queues = this.lite.queues.lock().unwrap();
            // A lite topic nobody reads any more is not subscribed again.
            o.resyncs.drain(..n).filter(|r| queues.contains_key(&r.tp)).collect()
        };
        if !resyncs.is_empty() {
            let (last, at) = resync_entries(&resyncs);
            if let Err(e) = this.broker.lite_resubscribe(addr, &client, &group, parent, &at).await {
                tracing::warn!(parent = %parent, lite_topics = last.len(), error = %e, "setting lite group offsets failed; their readers ask again");
                let mut queues = this.lite.queues.lock().unwrap();
                for (tp, resync) in last {
                    if let Some(queue) = queues.get_mut(tp).filter(|queue| queue.resync_seq == resync.seq) {
                        // Not counted toward a stuck message: the broker did not answer.
                        queue.expected = None;
                        queue.resynced = (u64::MAX, 0);
                    }
                }
                continue;
            }
            let landed = std::time::Instant::now();
            let gone: Vec<&str> = {
                let mut queues = this.lite.queues.lock().unwrap();
                let mut gone = Vec::new();
                for (tp, resync) in &last {
                    match queues.get_mut(*tp) {
                        Some(queue) if queue.resync_seq == resync.seq => queue.resync_landed = Some(landed),
                        Some(_) => {}
                        None => gone.extend(tp.topic.lite().map(|(_, lite)| lite)),
                    }
                }
                gone
            };
            if !gone.is_empty() {
                // Its reader left while the request was on its way (and removed the subscription
                // before this add): remove it again.
                if let Err(e) = this.broker.lite_subscription(addr, LiteAction::Remove, &client, &group, parent, &gone, None).await {
                    tracing::warn!(parent = %parent, error = %e, "removing lite subscriptions of readers that left failed");
                }
            }
        }
        if let Err(e) = this.broker.trigger_lite_dispatch(addr, &group, &client).await {
            // The poller triggers again after its next empty pop.
            tracing::warn!(parent = %parent, error = %e, "asking the broker to dispatch lite topics failed");
        }
    }
}

/// POPs the lite topics of one parent on one broker that this instance reads, until none is read.
async fn run_lite_poller(log: Weak<RocketMqLog>, (parent, broker): (String, String), partition: u32) {
    tracing::debug!(parent, broker, "lite poller started");
    loop {
        let Some(this) = log.upgrade() else { return };
        if this.stop.is_cancelled() {
            return;
        }
        {
            // Checked and ended under the pollers lock: a reader registering now starts another.
            let mut pollers = this.lite.pollers.lock().unwrap();
            if !this.lite_broker_in_use(&parent, &broker) {
                pollers.remove(&(parent.clone(), broker.clone()));
                tracing::debug!(parent, broker, "lite poller ended: no lite topic of it is read here");
                return;
            }
        }
        let addr = this.broker_addrs.lock().unwrap().get(&broker).cloned();
        let polled = match &addr {
            Some(addr) => match this.ensure_lite_group(addr, &parent, Role::Read).await {
                Ok(group) => {
                    this.drop_idle_lite_queues(&parent, &broker, addr, &group).await;
                    let client = this.lite_client(Role::Read);
                    let started = std::time::Instant::now();
                    match this.broker.pop_lite(addr, &client, &group, &parent, 32, this.settings.invisible_time, POLL_WAIT).await {
                        Ok(messages) if messages.is_empty() => {
                            if started.elapsed() < POLL_WAIT / 4 {
                                // Answered at once (the broker's waiters full): not a tight loop.
                                tokio::time::sleep(POLL_WAIT / 4).await;
                            }
                            // The broker's own dispatch marks expire (30 s) and are capped per client:
                            // ask it to look again at every lite topic of ours with messages past
                            // the group's offset.
                            this.broker.trigger_lite_dispatch(addr, &group, &client).await
                        }
                        Ok(messages) => {
                            crate::core::metrics::rocketmq_lite_popped(&parent).increment(messages.len() as u64);
                            this.deliver_lite(&parent, partition, messages, started);
                            Ok(())
                        }
                        Err(e) => {
                            // The broker may have popped (and moved the group's offsets) before the
                            // answer was lost: every lite topic of this poller checks at its next poll.
                            // A broker too loaded to answer pops is no sign of a message that
                            // cannot be read: the stuck counts start again.
                            suspect_all(&mut this.lite.queues.lock().unwrap(), &parent, partition, true);
                            Err(e)
                        }
                    }
                }
                Err(e) => Err(e),
            },
            None => Err(BackendError::Unavailable(format!("broker {broker} has no known master address"))),
        };
        let stop = this.stop.clone();
        drop(this);
        if let Err(e) = polled {
            tracing::warn!(parent, broker, error = %e, "lite pop failed; retrying");
            tokio::select! { _ = stop.cancelled() => return, _ = tokio::time::sleep(Duration::from_millis(500)) => {} }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(name: &str) -> TopicPartition {
        TopicPartition::new(TopicName::parse(name).unwrap(), 0)
    }

    #[test]
    fn resyncs_become_one_entry_per_offset_and_the_last_offset_of_a_lite_topic_wins() {
        let owed = |name: &str, from: u64| OwedResync { tp: tp(name), from, seq: from };
        let resyncs = vec![owed("chat@b", 7), owed("chat@a", 0), owed("chat@c", 7), owed("chat@a", 3), owed("chat@d", 0)];
        let (last, at) = resync_entries(&resyncs);
        assert_eq!(last.len(), 4);
        assert_eq!((last[&tp("chat@a")].from, last[&tp("chat@a")].seq), (3, 3), "the later resync of a lite topic replaces the earlier");
        assert_eq!(at, vec![(0, vec!["d"]), (3, vec!["a"]), (7, vec!["b", "c"])]);
        // 10,000 lite topics read from one offset are one entry, not 10,000 requests.
        let many: Vec<OwedResync> = (0..10_000).map(|i| owed(&format!("chat@room-{i}"), 0)).collect();
        let (_, at) = resync_entries(&many);
        assert_eq!(at.len(), 1);
        assert_eq!(at[0].1.len(), 10_000);
    }
}
