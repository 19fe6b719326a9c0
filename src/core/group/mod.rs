//! Shared subscriptions (`subscribe` with `group`): the sessions of any clients subscribed to one
//! topic with one group are its members, and each event goes to one of them.
//!
//! A group on this instance is two tasks. Its hub is an ordinary session (`run_session`, transport
//! `Group`) whose client is the group's identity (`ClientId::of_group`): it subscribes to the
//! topic and keeps the group's ack trackers, committed offsets, redeliveries, dead letters and
//! broker ACKs by the very code a client's session uses, so a group's progress follows every rule
//! a client's does. Its "socket" is the group's distributor (`hub::distribute`): it shares the
//! hub's event frames among the members (`sharing`) and hands the members' acks, nacks, extends
//! and terms back to the hub as frames, whose answers go back to the member that sent them.
//!
//! A group lives on one instance of a cluster (`GroupHome`): a member that subscribes elsewhere is
//! sent there. When its last member leaves, the hub ends as a client's session does (its
//! deliveries released, its acks durable), and the next member starts it again from the group's
//! stored floor.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;

use super::client_state::DeliveryRef;
use super::names::{ClientId, GroupName, TopicName};
use super::protocol::{ErrorCode, FrameError, ResumeOffset, ShareOrder, StartFrom};
use super::session_control::ControlInbox;
use super::transport::{Inbound, Outbound};
use super::window::Window;

mod hub;
pub mod sharing;

pub use sharing::Settled;

/// Where a group lives in a cluster: `None` for this instance, else `(instance, ws_url)` of the
/// one its members must use (rendezvous hashing on the group name, as `/session/recommend`).
#[async_trait::async_trait]
pub trait GroupHome: Send + Sync {
    fn elsewhere(&self, group: &GroupName) -> Option<(String, String)>;

    /// The peers whose hub of the group still runs (or is stopping): a new home waits for them
    /// before its own hub starts, so that a move never runs the group on two instances at once.
    /// A peer that does not answer is not listed: a partition or a pause longer than
    /// `cluster.group_move_after_ms` can still run it on both sides (docs/protocol.md).
    async fn live_at_peers(&self, topic: &TopicName, group: &GroupName) -> Vec<String>;
}

/// Starts a group's hub: a session of the group's identity (`ClientId::of_group`) whose
/// transport is the channels answered. The session layer implements it, so that this module
/// needs none of its code.
pub trait HubStarter: Send + Sync {
    fn start(&self, group: &GroupName) -> Result<HubEnds, FrameError>;

    /// Where the group lives, in a cluster: its hub checks it while it runs.
    fn home(&self) -> Option<Arc<dyn GroupHome>>;
}

/// The distributor's ends of a hub session: its inbound frames, its outbound frames, its window.
pub struct HubEnds {
    pub inbound: mpsc::UnboundedSender<Inbound>,
    pub outbound: mpsc::UnboundedReceiver<Outbound>,
    pub window: Arc<Window>,
    /// The most the hub may have in flight across its members (`delivery.group_max_in_flight`).
    pub cap: usize,
}

/// A member session as its group sees it.
#[derive(Clone)]
pub struct MemberLink {
    /// The session's number (`SessionInfo::number`).
    pub member: u64,
    pub session_id: String,
    pub client_id: ClientId,
    pub control: Arc<ControlInbox>,
    /// Its window: at most this many of the group's events in flight at it, and at most this
    /// many bytes of them (`Event::size_bytes`; one larger event still goes when it holds none).
    pub capacity: usize,
    pub capacity_bytes: u64,
}

/// A member's word to its group.
pub(crate) enum Command {
    /// `resume`: the group's floor as the member was last told it (its `ack_ok`s), a token
    /// that carries the group's progress from an instance that died to the next.
    Join {
        link: MemberLink,
        from: StartFrom,
        resume: BTreeMap<u32, ResumeOffset>,
        reply: oneshot::Sender<Result<Value, FrameError>>,
    },
    Leave {
        member: u64,
    },
    /// A client frame for the hub (ack, nack, extend, term of group deliveries), with what it
    /// settles at the member.
    Forward {
        member: u64,
        settles: Vec<(DeliveryRef, Settled)>,
        frame: String,
    },
    Describe(oneshot::Sender<GroupView>),
}

/// A live group, for `/admin/groups`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupView {
    pub topic: String,
    pub group: String,
    pub order: &'static str,
    pub members: Vec<MemberView>,
    /// Events the hub handed out that wait for a member with room.
    pub waiting: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct MemberView {
    pub session_id: String,
    pub client_id: String,
    pub in_flight: usize,
    pub keys: usize,
}

/// A member's handle on its group.
#[derive(Clone)]
pub struct GroupHandle {
    commands: mpsc::UnboundedSender<Command>,
    order: ShareOrder,
    generation: u64,
}

impl GroupHandle {
    /// This run of the group: the messages of another run are not for its members.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn leave(&self, member: u64) {
        let _ = self.commands.send(Command::Leave { member });
    }

    pub fn forward(&self, member: u64, settles: Vec<(DeliveryRef, Settled)>, frame: String) {
        let _ = self.commands.send(Command::Forward { member, settles, frame });
    }
}

/// The groups live on this instance.
pub struct Groups {
    live: Mutex<HashMap<(TopicName, GroupName), GroupHandle>>,
    next_generation: std::sync::atomic::AtomicU64,
    /// The gateway's tasks: shutdown waits for the distributors too.
    tasks: TaskTracker,
}

impl Groups {
    pub fn new(tasks: TaskTracker) -> Self {
        Self { live: Mutex::default(), next_generation: Default::default(), tasks }
    }

    /// Makes `link` a member of `group` on `topic`, starting the group's hub when it has none
    /// here; answers the hub's `subscribed` frame (the group's start points).
    pub async fn join(
        self: &Arc<Self>,
        starter: &dyn HubStarter,
        topic: &TopicName,
        group: &GroupName,
        order: ShareOrder,
        from: StartFrom,
        resume: &BTreeMap<u32, ResumeOffset>,
        link: MemberLink,
    ) -> Result<(GroupHandle, Value), FrameError> {
        // A hub that ends while a member joins answers nothing: the member tries the next one.
        for _ in 0..3 {
            let handle = self.live_or_start(starter, topic, group, order)?;
            if handle.order != order {
                return Err(FrameError::new(
                    ErrorCode::BadFrame,
                    format!("group {group} of topic {topic} shares with order {:?}: join it with the same order", handle.order),
                ));
            }
            let (reply, answer) = oneshot::channel();
            if handle.commands.send(Command::Join { link: link.clone(), from, resume: resume.clone(), reply }).is_err() {
                self.forget(topic, group, handle.generation);
                continue;
            }
            match answer.await {
                Ok(answered) => return answered.map(|subscribed| (handle, subscribed)),
                Err(_) => self.forget(topic, group, handle.generation),
            }
        }
        Err(FrameError::new(ErrorCode::Unavailable, format!("group {group} of topic {topic} kept stopping; subscribe again")))
    }

    fn live_or_start(self: &Arc<Self>, starter: &dyn HubStarter, topic: &TopicName, group: &GroupName, order: ShareOrder) -> Result<GroupHandle, FrameError> {
        let mut live = self.live.lock().unwrap();
        if let Some(handle) = live.get(&(topic.clone(), group.clone())).filter(|h| !h.commands.is_closed()) {
            return Ok(handle.clone());
        }
        let ends = starter.start(group)?;
        let (commands, command_rx) = mpsc::unbounded_channel();
        let generation = self.next_generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = GroupHandle { commands, order, generation };
        live.insert((topic.clone(), group.clone()), handle.clone());
        tracing::info!(%topic, %group, ?order, "shared subscription started on this instance");
        self.tasks.spawn(hub::distribute(self.clone(), topic.clone(), group.clone(), generation, order, ends, command_rx, starter.home()));
        Ok(handle)
    }

    /// A hub of the group runs (or stops) on this instance.
    pub fn is_live(&self, topic: &TopicName, group: &GroupName) -> bool {
        self.live.lock().unwrap().contains_key(&(topic.clone(), group.clone()))
    }

    /// Forgets a group's hub (it is ending) unless a newer one took its place.
    pub(crate) fn forget(&self, topic: &TopicName, group: &GroupName, generation: u64) {
        let mut live = self.live.lock().unwrap();
        let key = (topic.clone(), group.clone());
        if live.get(&key).is_some_and(|h| h.generation == generation) {
            live.remove(&key);
        }
    }

    /// The live groups, as their distributors describe them (a group that does not answer in
    /// time is left out).
    pub async fn describe(&self, topic: Option<&TopicName>, group: Option<&GroupName>) -> Vec<GroupView> {
        let handles: Vec<GroupHandle> = self
            .live
            .lock()
            .unwrap()
            .iter()
            .filter(|((t, g), _)| topic.is_none_or(|want| want == t) && group.is_none_or(|want| want == g))
            .map(|(_, h)| h.clone())
            .collect();
        let mut views = Vec::new();
        for handle in handles {
            let (reply, answer) = oneshot::channel();
            if handle.commands.send(Command::Describe(reply)).is_ok() {
                if let Ok(Ok(view)) = tokio::time::timeout(std::time::Duration::from_secs(2), answer).await {
                    views.push(view);
                }
            }
        }
        views.sort_by(|a, b| (&a.topic, &a.group).cmp(&(&b.topic, &b.group)));
        views
    }
}
