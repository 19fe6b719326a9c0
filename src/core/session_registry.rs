//! What the dispatcher knows of the sessions of this instance: one entry per live session, the
//! client each belongs to (one current session per client_id; a newer one takes over), the
//! session tasks still running per client, and the ack state kept for offline clients.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use super::client_state::ClientState;
use super::names::{ClientId, TopicName};
use super::session_control::ControlInbox;
use super::window::Window;

/// Counters of one session, readable without asking its task.
#[derive(Debug, Default)]
pub struct SessionStats {
    pub in_flight: AtomicUsize,
    pub delivered: AtomicU64,
    pub acked: AtomicU64,
    pub redelivered: AtomicU64,
    /// Epoch ms of the last ack, 0 before the first.
    pub last_ack_at: AtomicU64,
    /// The in-flight window was full and nothing was acknowledged since the last slow check.
    pub stalled: AtomicBool,
}

/// How a session's client is connected: the same session over either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    WebSocket,
    /// Server-Sent Events down, frames POSTed up (`http::sse`).
    Sse,
    /// No connection: the hub of a shared subscription (`core::group`), whose "client" is the
    /// group, its frames exchanged with the group's members in the instance.
    Group,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::WebSocket, Transport::Sse, Transport::Group];

    /// The name in `/admin/sessions` and in metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::WebSocket => "websocket",
            Transport::Sse => "sse",
            Transport::Group => "group",
        }
    }
}

/// What the registry knows of one live session.
pub struct SessionInfo {
    pub session_id: String,
    pub client_id: ClientId,
    pub remote_addr: Option<SocketAddr>,
    pub transport: Transport,
    /// Registration order on this instance (the newer of two sessions has the larger number).
    pub number: u64,
    /// Epoch ms.
    pub connected_at: u64,
    pub stats: SessionStats,
    pub subscriptions: Mutex<Vec<TopicName>>,
    /// The shared subscriptions it is a member of: `(topic, group)` (not in `subscriptions`:
    /// the client's own offsets on those topics are not what it reads).
    pub groups: Mutex<Vec<(TopicName, super::names::GroupName)>>,
    /// Its in-flight window, shared with its feeders: the admin view reads whether it is full
    /// as it is now (a feeder may start waiting for room without the session doing anything).
    pub window: Arc<Window>,
}

pub(super) struct SessionEntry {
    pub(super) info: Arc<SessionInfo>,
    pub(super) control: Arc<ControlInbox>,
}

/// What a new session gets from `Dispatcher::register`.
pub struct Registration {
    pub info: Arc<SessionInfo>,
    pub control: Arc<ControlInbox>,
    pub client: Arc<Mutex<ClientState>>,
}

#[derive(Default)]
pub(super) struct Registry {
    pub(super) sessions: HashMap<String, SessionEntry>,
    pub(super) by_client: HashMap<ClientId, String>,
    pub(super) clients: HashMap<ClientId, Arc<Mutex<ClientState>>>,
    /// Live sessions subscribed to each topic.
    pub(super) subscribers: HashMap<TopicName, usize>,
    /// Topics being deleted: nobody may subscribe to them meanwhile.
    pub(super) deleting: HashSet<TopicName>,
    /// Offline clients whose ack state is kept (they left with unacknowledged deliveries, whose
    /// attempt counts continue if they come back), oldest first; at most
    /// `limits.max_offline_clients`.
    pub(super) offline: BTreeMap<u64, ClientId>,
    pub(super) offline_since: HashMap<ClientId, u64>,
    pub(super) next_offline: u64,
    /// Session tasks still running per client, from `register` to the very end of the task: a
    /// session taken over keeps running until it has closed, and its client counts as live (no
    /// reset, delete or sweep) until none runs (docs/protocol.md, "session").
    pub(super) running: HashMap<ClientId, usize>,
    /// All running session tasks: what `limits.max_sessions` bounds.
    pub(super) running_total: usize,
    /// Of them, groups' hubs (`limits.max_groups`).
    pub(super) hubs: usize,
    /// Clients whose stored offsets an operator is changing (`change_offline_client`): none of
    /// their sessions may start meanwhile.
    pub(super) changing: HashSet<ClientId>,
    /// Partition counts as `core::partition_watch` last read them (`partitions_grown`): a
    /// subscription planned from an older count catches up with it.
    pub(super) grown: HashMap<TopicName, u32>,
}

impl Registry {
    /// Forgets the kept state of offline clients beyond `limit`, oldest first.
    pub(super) fn keep_offline_within(&mut self, limit: usize) {
        while self.offline.len() > limit {
            let Some((_, client)) = self.offline.pop_first() else { return };
            self.offline_since.remove(&client);
            self.clients.remove(&client);
        }
    }
}
