//! The clients' acknowledged floor per partition, for backends that acknowledge events at their
//! broker (RocketMQ POP): an event may be acknowledged there once every live client subscribed
//! to its topic on this instance has a durable committed offset past it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::backend::AckFloor;
use super::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use super::session_registry::SessionInfo;

/// What the floors are computed from: the live sessions (with the topics each reads) and the
/// committed offsets stored. The dispatcher is one.
pub trait LiveReaders: Send + Sync {
    fn live_sessions(&self) -> Vec<Arc<SessionInfo>>;
    /// The stored committed offset of `key` (0: none, or unreadable: nothing of it is known to
    /// be acknowledged).
    fn committed(&self, key: &OffsetKey) -> u64;
}

/// Floors computed from the live sessions and the offset store.
pub struct LiveClientsAckFloor {
    readers: Weak<dyn LiveReaders>,
    /// Clients whose session ended, by the topics it read, with when: still counted for
    /// `DEPARTED_COUNTED_FOR`, so that acks made durable as the session ended (the last acks of a
    /// client that leaves, every session's at a graceful shutdown) still settle what the broker
    /// holds. Left out, a partition whose last reader left had no floor, and its handles lapsed
    /// unacknowledged (the broker revives them). Its offsets no longer move, so counting it a
    /// little longer only holds acks above its floor back that long.
    departed: Mutex<HashMap<TopicName, HashMap<ClientId, Instant>>>,
}

/// How long a client that left still counts for the floors of the topics it read: several
/// settle rounds (one every 200 ms at least), so none misses it.
const DEPARTED_COUNTED_FOR: Duration = Duration::from_secs(2);

impl LiveClientsAckFloor {
    pub fn new(readers: Weak<dyn LiveReaders>) -> Self {
        Self { readers, departed: Mutex::new(HashMap::new()) }
    }

    /// A session of `client` that read `topics` has ended and its offset writes are durable.
    pub fn client_left(&self, client: &ClientId, topics: &[TopicName]) {
        let now = Instant::now();
        let mut departed = self.departed.lock().unwrap_or_else(|e| e.into_inner());
        for topic in topics {
            departed.entry(topic.clone()).or_default().insert(client.clone(), now);
        }
    }

    /// The clients that left lately, by topic, for the topics in `wanted` (and forgets the
    /// others that left long enough ago).
    fn departed_readers(&self, wanted: &HashSet<&TopicName>) -> HashMap<TopicName, HashSet<ClientId>> {
        let mut departed = self.departed.lock().unwrap_or_else(|e| e.into_inner());
        departed.retain(|_, clients| {
            clients.retain(|_, left| left.elapsed() < DEPARTED_COUNTED_FOR);
            !clients.is_empty()
        });
        departed.iter().filter(|(topic, _)| wanted.contains(topic)).map(|(topic, clients)| (topic.clone(), clients.keys().cloned().collect())).collect()
    }
}

impl AckFloor for LiveClientsAckFloor {
    fn floors(&self, tps: &[TopicPartition]) -> HashMap<TopicPartition, u64> {
        let Some(d) = self.readers.upgrade() else {
            return HashMap::new();
        };
        let wanted: HashSet<&TopicName> = tps.iter().map(|tp| &tp.topic).collect();
        let mut readers = self.departed_readers(&wanted);
        for session in d.live_sessions() {
            let subscriptions = session.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
            for topic in subscriptions.iter().filter(|t| wanted.contains(t)) {
                readers.entry(topic.clone()).or_default().insert(session.client_id.clone());
            }
        }
        let mut floors = HashMap::new();
        for tp in tps {
            let Some(clients) = readers.get(&tp.topic) else { continue };
            let mut floor = u64::MAX;
            for client in clients {
                let key = OffsetKey::new(tp.topic.clone(), client.clone(), tp.partition);
                floor = floor.min(d.committed(&key));
            }
            floors.insert(tp.clone(), floor);
        }
        floors
    }
}
