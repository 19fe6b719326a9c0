//! The dispatcher: shared state behind every session of this instance.
//!
//! It owns the session registry (one live session per client_id; a new one takes over), the
//! per-client ack state shared by a client's sessions, the partition readers, the offset writer,
//! and the rules that pick where a subscription starts. Sessions themselves run in
//! `core::session`, one task each.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::LogBackend;
use super::clock::Clock;
use super::dead_letters::Gap;
use super::delivery_settings::DeliverySettings;
use super::metrics::Metrics;
use super::names::{ClientId, OffsetKey, TopicName};
use super::offset_writer::OffsetWriter;
use super::offsets::{OffsetStore, StoreError};
use super::protocol::ResumeOffset;
use super::protocol::{ErrorCode, FrameError};
use super::reader::Readers;
use super::resume_token::{Holder, Refusal, ResumeToken, TokenKey, TopicFloors};
use super::session_control::{ControlInbox, SessionControl};
use super::session_registry::{Registration, Registry, SessionEntry, SessionInfo, SessionStats, Transport};
use super::window::Window;

/// A topic claimed for deletion (`Dispatcher::claim_topic_for_deletion`); dropping it lets
/// sessions subscribe to the name again.
pub struct TopicDeletion<'a> {
    d: &'a Dispatcher,
    topic: TopicName,
}

impl TopicDeletion<'_> {
    /// The topic is gone from the log and the store: forget every client's state and the
    /// readers of it.
    pub fn forget(&self) {
        self.d.forget_topic(&self.topic);
    }
}

impl Drop for TopicDeletion<'_> {
    fn drop(&mut self) {
        self.d.registry().deleting.remove(&self.topic);
    }
}

/// A client marked as being changed by an operator (`Dispatcher::change_offline_client`).
struct ClientChange<'a> {
    d: &'a Dispatcher,
    client_id: ClientId,
}

impl Drop for ClientChange<'_> {
    fn drop(&mut self) {
        self.d.registry().changing.remove(&self.client_id);
    }
}

pub struct Dispatcher {
    /// Replaced by a reload (`replace_settings`); read through `settings()`.
    settings: super::live::Live<DeliverySettings>,
    pub instance: String,
    pub backend: Arc<dyn LogBackend>,
    pub store: Arc<dyn OffsetStore>,
    pub writer: OffsetWriter,
    pub readers: Readers,
    pub clock: Arc<dyn Clock>,
    /// Cancelled when the gateway shuts down: sessions close with 1001.
    pub shutdown: CancellationToken,
    /// Cancelled when the instance starts draining (`start_drain`): no new sessions, not ready.
    pub draining: CancellationToken,
    pub(crate) drain_started: std::sync::atomic::AtomicBool,
    /// Bounds reads shared by the subscribe plans that ask at the same time.
    pub plan_bounds: super::bounds_reads::BoundsReads,
    /// The clients' floors, set when the backend acknowledges at its broker (RocketMQ POP):
    /// an ending session reports itself there.
    pub ack_floor: std::sync::OnceLock<Arc<super::ack_floor::LiveClientsAckFloor>>,
    /// Checks the tokens sessions present in `refresh` frames (set when JWTs are configured).
    pub token_check: std::sync::OnceLock<Arc<dyn super::access::TokenCheck>>,
    /// Publishes of `publish` frames with an `idempotency_key` (the REST route's, shared).
    pub publisher: std::sync::OnceLock<Arc<super::idempotency::IdempotentPublisher>>,
    /// Every task of this gateway (sessions, feeders, readers, background loops): shutdown waits
    /// for all of them, so the stores are closed when `Gateway::run` returns.
    pub tasks: TaskTracker,
    pub metrics: Metrics,
    /// The shared subscriptions live on this instance.
    pub groups: Arc<super::group::Groups>,
    /// Where a group lives in the cluster (set when the gateway has peers).
    pub group_home: std::sync::OnceLock<Arc<dyn super::group::GroupHome>>,
    /// A client's records at the other instances (set when the gateway has peers): what a
    /// subscribe without a resume token starts from when this instance has none.
    pub peer_offsets: std::sync::OnceLock<Arc<dyn super::peer_offsets::PeerOffsets>>,
    /// Where the spans of traced events go (set when `telemetry.otlp_endpoint` is).
    pub tracer: std::sync::OnceLock<Arc<dyn super::trace::Tracer>>,
    /// The key resume tokens are MAC'd with (`cluster.token_key`, or the data dir's): set at
    /// start; a dispatcher without one (unit tests) makes a random one at first use.
    pub token_key: std::sync::OnceLock<TokenKey>,
    registry: Mutex<Registry>,
    next_seq: AtomicU64,
    next_session: AtomicU64,
}

impl Dispatcher {
    /// The delivery settings now: a session takes them where it uses them, a reload changes
    /// what the next one takes (new sessions' windows, new subscriptions' redelivery policy).
    pub fn settings(&self) -> Arc<DeliverySettings> {
        self.settings.get()
    }

    pub fn replace_settings(&self, settings: DeliverySettings) {
        self.settings.replace(settings);
    }

    pub fn new(
        settings: DeliverySettings,
        instance: String,
        backend: Arc<dyn LogBackend>,
        store: Arc<dyn OffsetStore>,
        writer: OffsetWriter,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> Self {
        let tasks = TaskTracker::new();
        let metrics = Metrics::register();
        let readers = Readers::new(
            backend.clone(),
            store.clone(),
            settings.reader_buffer_events,
            settings.reader_buffer_bytes,
            settings.fetch_batch,
            shutdown.clone(),
            tasks.clone(),
            metrics.pull_events.clone(),
        );
        Self {
            settings: super::live::Live::new(settings),
            instance,
            backend,
            store,
            writer,
            readers,
            clock,
            shutdown,
            draining: CancellationToken::new(),
            drain_started: Default::default(),
            plan_bounds: Default::default(),
            ack_floor: Default::default(),
            token_check: Default::default(),
            publisher: Default::default(),
            groups: Arc::new(super::group::Groups::new(tasks.clone())),
            group_home: Default::default(),
            peer_offsets: Default::default(),
            tracer: Default::default(),
            token_key: Default::default(),
            tasks,
            metrics,
            registry: Mutex::new(Registry::default()),
            next_seq: AtomicU64::new(1),
            next_session: AtomicU64::new(1),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `n` consecutive delivery sequence numbers never used before on this instance; returns the
    /// first.
    pub fn next_seqs(&self, n: u64) -> u64 {
        self.next_seq.fetch_add(n, Ordering::Relaxed)
    }

    /// Registers a new session of `client_id`. A live session of the same client is told to close
    /// with 4001; the new one shares its ack state, so in-flight events go to the new session.
    pub fn register(&self, client_id: ClientId, remote_addr: Option<SocketAddr>, transport: Transport) -> Result<Registration, FrameError> {
        if self.draining.is_cancelled() {
            return Err(FrameError::new(ErrorCode::Unavailable, "this instance is draining; connect to another (GET /session/recommend)"));
        }
        let mut registry = self.registry();
        if registry.changing.contains(&client_id) {
            return Err(FrameError::new(ErrorCode::Unavailable, "an operator is changing this client's offsets; retry in a moment"));
        }
        // A group's hubs (one per topic it is joined on, all of the identity `$NAME`) never take
        // each other over: each is its topic's.
        let hub = transport == Transport::Group;
        let replaces = if hub { None } else { registry.by_client.get(&client_id).cloned() };
        // A takeover may go past the limit only while the client runs just the session it
        // replaces: reconnect churn with sessions that do not finish closing cannot pile up.
        let running_here = registry.running.get(&client_id).copied().unwrap_or(0);
        // A group's hub is bounded by its members, which are counted.
        if hub && registry.hubs >= self.settings().max_groups {
            return Err(FrameError::new(
                ErrorCode::LimitExceeded,
                format!("this instance serves its maximum of {} shared subscriptions (limits.max_groups)", self.settings().max_groups),
            ));
        }
        if !hub && registry.running_total >= self.settings().max_sessions && !(replaces.is_some() && running_here <= 1) {
            return Err(FrameError::new(
                ErrorCode::LimitExceeded,
                format!("this instance serves its maximum of {} sessions (limits.max_sessions)", self.settings().max_sessions),
            ));
        }
        if let Some(old) = replaces.and_then(|id| registry.sessions.remove(&id)) {
            old.control.send(SessionControl::TakenOver);
            tracing::info!(client_id = %client_id, old_session = %old.info.session_id, "session taken over");
        }
        *registry.running.entry(client_id.clone()).or_insert(0) += 1;
        registry.running_total += 1;
        registry.hubs += usize::from(hub);
        let n = self.next_session.fetch_add(1, Ordering::Relaxed);
        let session_id = super::session_id::new_session_id(n);
        let info = Arc::new(SessionInfo {
            session_id: session_id.clone(),
            client_id: client_id.clone(),
            remote_addr,
            transport,
            number: n,
            connected_at: self.clock.now_ms(),
            stats: SessionStats::default(),
            subscriptions: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
            window: Arc::new(match transport {
                Transport::Group => Window::new(self.settings().group_max_in_flight, self.settings().max_in_flight_bytes),
                _ => Window::new(self.settings().max_in_flight, self.settings().max_in_flight_bytes),
            }),
        });
        let control = Arc::new(ControlInbox::new());
        registry.sessions.insert(session_id.clone(), SessionEntry { info: info.clone(), control: control.clone() });
        if !hub {
            registry.by_client.insert(client_id.clone(), session_id);
        }
        if let Some(since) = registry.offline_since.remove(&client_id) {
            registry.offline.remove(&since);
        }
        let client = registry.clients.entry(client_id).or_default().clone();
        Ok(Registration { info, control, client })
    }

    /// Removes a session that ended. The client's ack state is dropped when nothing is pending.
    pub fn unregister(&self, info: &SessionInfo) {
        let mut registry = self.registry();
        registry.sessions.remove(&info.session_id);
        if registry.by_client.get(&info.client_id) == Some(&info.session_id) {
            registry.by_client.remove(&info.client_id);
        }
        registry.running_total = registry.running_total.saturating_sub(1);
        if info.transport == Transport::Group {
            registry.hubs = registry.hubs.saturating_sub(1);
        }
        let last = match registry.running.get_mut(&info.client_id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                registry.running.remove(&info.client_id);
                true
            }
        };
        // Offline only once the last of its sessions has finished (a newer session may end
        // before the one it took over).
        if last {
            let idle = registry.clients.get(&info.client_id).is_none_or(|c| c.lock().unwrap().is_idle());
            if idle {
                registry.clients.remove(&info.client_id);
            } else {
                let since = registry.next_offline;
                registry.next_offline += 1;
                registry.offline.insert(since, info.client_id.clone());
                registry.offline_since.insert(info.client_id.clone(), since);
                registry.keep_offline_within(self.settings().max_offline_clients);
            }
        }
    }

    /// Clients whose ack state this instance holds (live, or offline with deliveries pending).
    pub fn client_states(&self) -> usize {
        self.registry().clients.len()
    }

    /// True while any session of the client still runs (a taken-over one included).
    pub fn is_live(&self, client_id: &ClientId) -> bool {
        self.registry().running.contains_key(client_id)
    }

    /// Every client with a live session on this instance.
    pub fn live_clients(&self) -> Vec<ClientId> {
        self.registry().running.keys().cloned().collect()
    }

    pub fn sessions(&self) -> Vec<Arc<SessionInfo>> {
        let mut sessions: Vec<_> = self.registry().sessions.values().map(|e| e.info.clone()).collect();
        sessions.sort_by(|a, b| a.connected_at.cmp(&b.connected_at).then(a.session_id.cmp(&b.session_id)));
        sessions
    }

    pub fn session(&self, session_id: &str) -> Option<Arc<SessionInfo>> {
        self.registry().sessions.get(session_id).map(|e| e.info.clone())
    }

    /// Rings every live session's doorbell: at shutdown, so each looks at `shutdown` (sessions
    /// poll no shared token on their hot path).
    pub fn ring_every_session(&self) {
        for entry in self.registry().sessions.values() {
            entry.control.ring();
        }
    }

    /// Sends a control message; false when no such session is live.
    pub fn control(&self, session_id: &str, message: SessionControl) -> bool {
        self.registry().sessions.get(session_id).is_some_and(|e| e.control.send(message))
    }

    /// Tells the client's current session that dead letters of `topic` were marked for redrive
    /// (it scans for them if it subscribes to `topic`); false when the client has no session
    /// here (it gets them at its next subscribe).
    pub fn redrive(&self, client_id: &ClientId, topic: &TopicName) -> bool {
        let registry = self.registry();
        if client_id.group().is_some() {
            // A group's hubs are not listed by client (one per topic it is joined on): each one
            // of the identity is asked, and the one subscribed to `topic` scans.
            let mut sent = false;
            for hub in registry.sessions.values().filter(|e| e.info.client_id == *client_id) {
                sent |= hub.control.send(SessionControl::Redrive { topic: topic.clone() });
            }
            return sent;
        }
        let current = registry.by_client.get(client_id).and_then(|id| registry.sessions.get(id));
        current.is_some_and(|e| e.control.send(SessionControl::Redrive { topic: topic.clone() }))
    }

    /// Counts a new subscriber of `topic`, within `limits.max_clients_per_topic`.
    pub fn add_subscriber(&self, topic: &TopicName) -> Result<(), FrameError> {
        let limit = self.settings().max_clients_per_topic;
        let mut registry = self.registry();
        if registry.deleting.contains(topic) {
            return Err(FrameError::new(ErrorCode::UnknownTopic, format!("topic {topic} is being deleted")));
        }
        let count = registry.subscribers.get(topic).copied().unwrap_or(0);
        if count >= limit {
            return Err(FrameError::new(
                ErrorCode::LimitExceeded,
                format!("{topic} already has {limit} subscribed sessions on this instance (limits.max_clients_per_topic)"),
            ));
        }
        registry.subscribers.insert(topic.clone(), count + 1);
        Ok(())
    }

    pub fn remove_subscriber(&self, topic: &TopicName) {
        let mut registry = self.registry();
        if let Some(count) = registry.subscribers.get_mut(topic) {
            *count -= 1;
            if *count == 0 {
                registry.subscribers.remove(topic);
            }
        }
    }

    /// Runs `change` (an operator's reset or delete of `client_id`'s stored offsets on `topic`)
    /// only while the client has no session here, then forgets what this instance remembers of
    /// its progress on the topic. The client is marked as being changed meanwhile, so no session
    /// of it can start in between (`register` answers `unavailable`), and the store write runs
    /// on the blocking pool, not under the registry's lock (with `storage.durability = "power"` it
    /// fsyncs, and every session start and end waits on that lock). An ended session's writes
    /// are durable before it unregisters. `None` while the client is live or another change of
    /// it runs.
    pub async fn change_offline_client<T: Send + 'static>(
        self: &Arc<Self>,
        client_id: &ClientId,
        topic: &TopicName,
        change: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Option<Result<T, StoreError>> {
        {
            let mut registry = self.registry();
            if registry.running.contains_key(client_id) || !registry.changing.insert(client_id.clone()) {
                return None;
            }
        }
        // A task of its own: a caller that stops waiting (an HTTP client gone) must not unmark
        // the client while the write still runs.
        let (d, client_id, topic) = (self.clone(), client_id.clone(), topic.clone());
        let task = tokio::spawn(async move {
            let _changing = ClientChange { d: &d, client_id: client_id.clone() };
            let result = tokio::task::spawn_blocking(change).await.unwrap_or_else(|e| Err(StoreError::Io(format!("offset change failed: {e}"))));
            if let Some(client) = d.registry().clients.get(&client_id) {
                client.lock().unwrap().forget_topic(&topic);
            }
            result
        });
        Some(task.await.unwrap_or_else(|e| Err(StoreError::Io(format!("offset change failed: {e}")))))
    }

    /// `topic` has `partitions` now (first seen, or more than before): every session subscribed
    /// to it with fewer feeds the new partitions too, from their log start (a partition added
    /// after a client subscribed is never skipped by `latest`).
    pub fn partitions_grown(&self, topic: &TopicName, partitions: u32) {
        let mut registry = self.registry();
        registry.grown.insert(topic.clone(), partitions);
        for entry in registry.sessions.values() {
            if entry.info.subscriptions.lock().unwrap().contains(topic) {
                entry.control.send(SessionControl::PartitionsAdded { topic: topic.clone(), partitions });
            }
        }
    }

    /// The lite topics (`parent@lite`) of `parent` that live sessions subscribe to.
    pub fn subscribed_lite_topics_of(&self, parent: &TopicName) -> Vec<TopicName> {
        self.registry().subscribers.keys().filter(|t| t.lite().is_some_and(|(p, _)| p == parent.as_str())).cloned().collect()
    }

    /// The partition count of `topic` as the watch last read it.
    pub fn grown_partitions(&self, topic: &TopicName) -> Option<u32> {
        self.registry().grown.get(topic).copied()
    }

    /// Claims `topic` for deletion: `None` while a session subscribes to it; otherwise no session
    /// can subscribe to it until the returned guard is dropped.
    pub fn claim_topic_for_deletion(&self, topic: &TopicName) -> Option<TopicDeletion<'_>> {
        let mut registry = self.registry();
        if registry.subscribers.contains_key(topic) || !registry.deleting.insert(topic.clone()) {
            return None;
        }
        Some(TopicDeletion { d: self, topic: topic.clone() })
    }

    /// Forgets every client's state and the readers of a deleted topic.
    fn forget_topic(&self, topic: &TopicName) {
        let mut registry = self.registry();
        registry.grown.remove(topic);
        for client in registry.clients.values() {
            client.lock().unwrap().forget_topic(topic);
        }
        drop(registry);
        self.readers.remove_topic(topic);
    }

    /// Reports a gap of `client_id` (docs/protocol.md `gap`): logged, counted, and kept for
    /// `GET /admin/gaps` (written on the blocking pool, in the background: the session does not
    /// wait for it, and a failed write is logged).
    pub fn report_gap(&self, client_id: &ClientId, topic: &TopicName, partition: u32, (from, to): (u64, u64)) {
        tracing::warn!(%client_id, %topic, partition, from, to, "gap: retention removed events before the client read them");
        super::metrics::gap_reported(topic.as_str(), to.saturating_sub(from));
        let gap = Gap { topic: topic.clone(), client_id: client_id.clone(), partition, from, to, at: self.clock.now_ms() };
        let store = self.store.clone();
        self.tasks.spawn(async move {
            match tokio::task::spawn_blocking(move || store.record_gap(&gap)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "recording a gap failed"),
                Err(e) => tracing::error!(error = %e, "recording a gap failed"),
            }
        });
    }

    /// True while the session numbered `session` is the client's current one (not taken over).
    pub(super) fn is_current(&self, client_id: &ClientId, session: u64) -> bool {
        let registry = self.registry();
        if registry.by_client.get(client_id).and_then(|id| registry.sessions.get(id)).is_some_and(|e| e.info.number == session) {
            return true;
        }
        // A group's hubs are never taken over: each is current while it runs.
        client_id.group().is_some() && registry.sessions.values().any(|e| e.info.number == session && e.info.transport == Transport::Group)
    }
}

impl super::ack_floor::LiveReaders for Dispatcher {
    fn live_sessions(&self) -> Vec<Arc<SessionInfo>> {
        self.sessions()
    }

    fn committed(&self, key: &OffsetKey) -> u64 {
        self.store.read(key).ok().flatten().map_or(0, |r| r.committed)
    }
}

/// Resume tokens (`core::resume_token`): issued and checked with the dispatcher's key.
impl Dispatcher {
    pub fn token_key(&self) -> &TokenKey {
        self.token_key.get_or_init(TokenKey::random)
    }

    /// The floors of `topic` that token `text` gives `holder`, or why it gives none.
    pub fn open_resume_token(&self, text: &str, holder: &Holder, topic: &TopicName) -> Result<BTreeMap<u32, ResumeOffset>, Refusal> {
        let token = self.token_key().open(text)?;
        // A store that cannot say which topic this is cannot vouch for the token either.
        let incarnation = self.store.topic_incarnation(topic).map_err(|_| Refusal::Invalid)?;
        token.check(holder, topic.as_str(), incarnation.id, self.clock.now_ms(), self.settings().resume_token_max_age_ms)
    }

    /// The incarnation id of `topic` as tokens bind it. One the store cannot read binds a token
    /// to none (it is refused as `other_incarnation` later): never to a wrong one.
    pub fn incarnation_id(&self, topic: &TopicName) -> u64 {
        self.store.topic_incarnation(topic).map_or(u64::MAX, |i| i.id)
    }

    /// A token for `holder` naming each topic's incarnation and floors (`offset`: the next offset
    /// after the contiguous acknowledged floor, durable; `epoch`: the offset epoch it is in).
    pub fn issue_resume_token(&self, holder: Holder, topics: impl IntoIterator<Item = (TopicName, u64, BTreeMap<u32, ResumeOffset>)>) -> String {
        let topics = topics.into_iter().map(|(topic, incarnation, partitions)| TopicFloors { topic: topic.to_string(), incarnation, partitions }).collect();
        self.token_key().issue(&ResumeToken { holder, issued_at_ms: self.clock.now_ms(), topics })
    }
}
