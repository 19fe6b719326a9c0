//! POP receipt handles and the rule for acknowledging them at the broker.
//!
//! Every popped message comes with a receipt handle (RocketMQ's `POP_CK` / extraInfo). The
//! broker keeps the message invisible for `invisible_time` and revives it (re-queues it in the
//! group's retry topic) unless the handle is acknowledged first. ackgate acknowledges a handle
//! (the deferred broker ACK) only once every live client subscribed to its partition on this
//! instance has a durable committed offset past the event's original offset, and extends the
//! invisible time while one of them still owes an ack, so a slow but live client causes no
//! redelivery. Handles of a partition nobody on this instance reads any more are left to the
//! broker: it revives them, and whoever pops them again acknowledges them by the same rule.
//!
//! A revived message comes back from the retry topic with another queue and offset, but keeps
//! its `UNIQ_KEY`; `Positions` maps that key to the original `topic#partition` and offset,
//! learned from every message this instance reads (popped or pulled). A key it has not learned
//! (an original read before a restart) is looked up at the broker (`revived.rs`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::broker::PopHeader;
use super::layout::PartitionQueue;
use super::message::{StoredMessage, POP_CK, UNIQ_KEY};
use crate::core::names::TopicPartition;

/// The receipt handle of a popped message and the original `topic#partition` and offset it
/// stands for. A fresh message's handle is built from the POP answer (as RocketMQ's clients do:
/// `checkpoint start offset, pop time, invisible time, revive queue, retry marker, broker, queue,
/// queue offset`); a revived one carries its own (`POP_CK`) or lives in the group's retry topic,
/// and is mapped back through its `UNIQ_KEY`. `None` when that key is unknown here.
pub fn receipt(
    group: &str,
    queue: &PartitionQueue,
    polled: &TopicPartition,
    header: &PopHeader,
    m: &StoredMessage,
    positions: &Positions,
) -> Option<(TopicPartition, u64, Handle)> {
    let handle = handle(group, queue, polled, header, m);
    if !is_revived(m) {
        // A POP of one queue answers that queue's messages (and revived ones): the partition polled.
        if m.queue_id != queue.queue_id {
            return None;
        }
        if let Some(uniq) = m.property(UNIQ_KEY) {
            positions.learn(uniq, polled, m.queue_offset);
        }
        return Some((polled.clone(), m.queue_offset, handle));
    }
    let (tp, offset) = positions.find(m.property(UNIQ_KEY)?)?;
    Some((tp, offset, handle))
}

/// A message the broker revived (from the group's retry topic, or carrying its own checkpoint).
pub fn is_revived(m: &StoredMessage) -> bool {
    m.topic.starts_with("%RETRY%") || m.property(POP_CK).is_some()
}

/// The receipt handle of a popped message, fresh or revived.
pub fn handle(group: &str, queue: &PartitionQueue, polled: &TopicPartition, header: &PopHeader, m: &StoredMessage) -> Handle {
    let in_retry_topic = m.topic.starts_with("%RETRY%");
    let revived = is_revived(m);
    let extra_info = match m.property(POP_CK) {
        Some(ck) => ck.to_string(),
        None => {
            let marker = match (revived, m.topic.contains('+')) {
                (false, _) => "0",
                (true, true) => "2",
                (true, false) => "1",
            };
            let start = header.start_offsets.get(&format!("{marker}@{}", m.queue_id)).copied().unwrap_or(m.queue_offset as i64);
            format!(
                "{start} {} {} {} {marker} {} {} {}",
                header.pop_time, header.invisible_time, header.revive_qid, queue.broker_name, m.queue_id, m.queue_offset
            )
        }
    };
    let topic = if revived && !in_retry_topic {
        // The broker named the original topic; the handle belongs to the retry topic its marker names.
        match extra_info.split(' ').nth(4) {
            Some("2") => format!("%RETRY%{group}+{}", polled.topic),
            _ => format!("%RETRY%{group}_{}", polled.topic),
        }
    } else {
        m.topic.clone()
    };
    let invisible_until = header.pop_time + header.invisible_time;
    Handle { topic, queue_id: m.queue_id, queue_offset: m.queue_offset, extra_info, invisible_until, retry_extend_at: 0 }
}

/// One receipt handle: what an ACK_MESSAGE or CHANGE_MESSAGE_INVISIBLETIME for it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle {
    /// The topic the handle belongs to: the event's topic, or the group's retry topic.
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub extra_info: String,
    /// Epoch ms at which the broker revives the message unless acknowledged or extended.
    pub invisible_until: u64,
    /// Epoch ms before which no extension is tried again (after one failed); 0: any time.
    pub retry_extend_at: u64,
}

/// What a round of the broker-ack task must do.
#[derive(Debug, Default)]
pub struct Due {
    pub ack: Vec<Handle>,
    /// Handles to keep invisible longer: `(partition, original offset, handle)`.
    pub extend: Vec<(TopicPartition, u64, Handle)>,
}

/// Handles waiting for their clients, by partition and original offset.
#[derive(Default)]
pub struct Ledger {
    pending: Mutex<HashMap<TopicPartition, BTreeMap<u64, Vec<Handle>>>>,
    /// Handles in `pending`, readable without the lock (every poll asks).
    count: AtomicUsize,
}

impl Ledger {
    pub fn record(&self, tp: &TopicPartition, offset: u64, handle: Handle) {
        self.pending.lock().unwrap().entry(tp.clone()).or_default().entry(offset).or_default().push(handle);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn recount(&self, pending: &HashMap<TopicPartition, BTreeMap<u64, Vec<Handle>>>) {
        self.count.store(pending.values().flat_map(|p| p.values()).map(Vec::len).sum(), Ordering::Relaxed);
    }

    /// Partitions with pending handles.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        self.pending.lock().unwrap().keys().cloned().collect()
    }

    /// Takes the handles every client is done with (original offset below the partition's floor)
    /// and picks those to extend: owed by a live client, still invisible, and for less than
    /// `margin_ms` more. A handle past its invisible time is still acknowledged once its clients
    /// are done (harmless where the broker revived it; needed where a failed extension left it
    /// in flight). A partition without a floor (no live subscriber) drops its handles once they
    /// lapse: the broker revives them and whoever pops them again settles them.
    pub fn due(&self, floors: &HashMap<TopicPartition, u64>, now_ms: u64, margin_ms: u64) -> Due {
        let mut due = Due::default();
        let mut pending = self.pending.lock().unwrap();
        for (tp, by_offset) in pending.iter_mut() {
            match floors.get(tp) {
                Some(&floor) => {
                    let owed = by_offset.split_off(&floor);
                    for (_, handles) in std::mem::replace(by_offset, owed) {
                        due.ack.extend(handles);
                    }
                    for (offset, handles) in by_offset.iter() {
                        let extend =
                            handles.iter().filter(|h| h.invisible_until > now_ms && h.invisible_until <= now_ms + margin_ms && h.retry_extend_at <= now_ms);
                        due.extend.extend(extend.map(|h| (tp.clone(), *offset, h.clone())));
                    }
                }
                None => {
                    for handles in by_offset.values_mut() {
                        handles.retain(|h| h.invisible_until > now_ms);
                    }
                }
            }
            by_offset.retain(|_, handles| !handles.is_empty());
        }
        pending.retain(|_, by_offset| !by_offset.is_empty());
        self.recount(&pending);
        due
    }

    /// Swaps an extended handle for its new one.
    pub fn replace(&self, tp: &TopicPartition, offset: u64, old: &Handle, new: Handle) {
        let mut pending = self.pending.lock().unwrap();
        if let Some(handles) = pending.get_mut(tp).and_then(|p| p.get_mut(&offset)) {
            if let Some(slot) = handles.iter_mut().find(|h| h.extra_info == old.extra_info) {
                *slot = new;
            }
        }
    }

    pub fn forget_topic(&self, topic: &crate::core::names::TopicName) {
        let mut pending = self.pending.lock().unwrap();
        pending.retain(|tp, _| tp.topic != *topic);
        self.recount(&pending);
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// Original position by `UNIQ_KEY`, and the keys in arrival order (the oldest go first).
type PositionsByKey = (HashMap<String, (TopicPartition, u64)>, VecDeque<String>);

/// `UNIQ_KEY` -> original `topic#partition` and offset, for the most recent `capacity` messages.
pub struct Positions {
    capacity: usize,
    inner: Mutex<PositionsByKey>,
}

impl Positions {
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), inner: Mutex::new((HashMap::new(), VecDeque::new())) }
    }

    pub fn learn(&self, uniq_key: &str, tp: &TopicPartition, offset: u64) {
        let mut inner = self.inner.lock().unwrap();
        let (map, order) = &mut *inner;
        if map.insert(uniq_key.to_string(), (tp.clone(), offset)).is_none() {
            order.push_back(uniq_key.to_string());
            while order.len() > self.capacity {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }

    pub fn find(&self, uniq_key: &str) -> Option<(TopicPartition, u64)> {
        self.inner.lock().unwrap().0.get(uniq_key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::names::TopicName;

    fn tp(p: u32) -> TopicPartition {
        TopicPartition::new(TopicName::parse("t").unwrap(), p)
    }

    fn handle(info: &str, until: u64) -> Handle {
        Handle { topic: "t".into(), queue_id: 0, queue_offset: 0, extra_info: info.into(), invisible_until: until, retry_extend_at: 0 }
    }

    fn message(topic: &str, queue_id: u32, queue_offset: u64, properties: &[(&str, &str)]) -> StoredMessage {
        StoredMessage {
            topic: topic.into(),
            queue_id,
            queue_offset,
            born_timestamp: 0,
            store_timestamp: 0,
            reconsume_times: 0,
            properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: Vec::new(),
        }
    }

    fn queue(queue_id: u32) -> PartitionQueue {
        PartitionQueue { broker_name: "b1".into(), broker_addr: String::new(), queue_id }
    }

    fn header() -> PopHeader {
        PopHeader { pop_time: 1000, invisible_time: 30_000, revive_qid: 3, start_offsets: [("0@2".to_string(), 40), ("1@0".to_string(), 7)].into() }
    }

    #[test]
    fn a_fresh_message_gets_a_handle_built_from_the_pop_answer() {
        let positions = Positions::new(10);
        let polled = tp(2);
        let (at, offset, h) = receipt("g", &queue(2), &polled, &header(), &message("t", 2, 42, &[(UNIQ_KEY, "u42")]), &positions).unwrap();
        assert_eq!((at, offset), (tp(2), 42));
        assert_eq!(h.extra_info, "40 1000 30000 3 0 b1 2 42");
        assert_eq!((h.topic.as_str(), h.queue_id, h.queue_offset, h.invisible_until), ("t", 2, 42, 31_000));
        assert_eq!(positions.find("u42"), Some((tp(2), 42)), "its position is learned for a later revival");
        // On a second broker, queue 2 is a later partition: the event is that partition's, the
        // handle names the broker's queue.
        let b2 = PartitionQueue { broker_name: "b2".into(), ..queue(2) };
        let (at, _, h) = receipt("g", &b2, &tp(6), &header(), &message("t", 2, 43, &[(UNIQ_KEY, "u43")]), &positions).unwrap();
        assert_eq!((at, h.queue_id, h.extra_info.as_str()), (tp(6), 2, "40 1000 30000 3 0 b2 2 43"));
        assert_eq!(positions.find("u43"), Some((tp(6), 43)));
    }

    #[test]
    fn a_revived_message_maps_back_to_its_original_offset_through_its_uniq_key() {
        let positions = Positions::new(10);
        positions.learn("u5", &tp(1), 5);
        // Returned under the retry topic's own name (popResponseReturnActualRetryTopic).
        let retry = message("%RETRY%g_t", 0, 9, &[(UNIQ_KEY, "u5")]);
        let (at, offset, h) = receipt("g", &queue(0), &tp(0), &header(), &retry, &positions).unwrap();
        assert_eq!((at, offset), (tp(1), 5), "the original partition and offset, not the retry queue's");
        assert_eq!(h.topic, "%RETRY%g_t");
        assert_eq!(h.extra_info, "7 1000 30000 3 1 b1 0 9");
        // Returned under the original name with the broker's own handle.
        let renamed = message("t", 0, 9, &[(UNIQ_KEY, "u5"), (POP_CK, "9 1000 30000 3 2 b1 0 9 4")]);
        let (at, offset, h) = receipt("g", &queue(0), &tp(0), &header(), &renamed, &positions).unwrap();
        assert_eq!((at, offset), (tp(1), 5));
        assert_eq!((h.topic.as_str(), h.extra_info.as_str()), ("%RETRY%g+t", "9 1000 30000 3 2 b1 0 9 4"));
        // Unknown here: left to the broker.
        assert!(receipt("g", &queue(0), &tp(0), &header(), &message("%RETRY%g_t", 0, 10, &[(UNIQ_KEY, "u-other")]), &positions).is_none());
        assert!(receipt("g", &queue(0), &tp(0), &header(), &message("%RETRY%g_t", 0, 11, &[]), &positions).is_none());
    }

    #[test]
    fn a_failed_extension_waits_before_the_next_try() {
        let ledger = Ledger::default();
        ledger.record(&tp(0), 1, Handle { retry_extend_at: 5_000, ..handle("a", 10_000) });
        assert!(ledger.due(&[(tp(0), 0)].into(), 4_000, 8_000).extend.is_empty());
        assert_eq!(ledger.due(&[(tp(0), 0)].into(), 5_000, 8_000).extend.len(), 1);
    }

    #[test]
    fn handles_below_the_floor_are_acked_the_rest_extended_near_their_end() {
        let ledger = Ledger::default();
        ledger.record(&tp(0), 3, handle("a", 10_000));
        ledger.record(&tp(0), 5, handle("b", 10_000));
        ledger.record(&tp(0), 6, handle("c", 60_000));
        let due = ledger.due(&[(tp(0), 5)].into(), 9_000, 2_000);
        assert_eq!(due.ack.iter().map(|h| h.extra_info.as_str()).collect::<Vec<_>>(), ["a"], "offset 5 is not below floor 5");
        assert_eq!(due.extend.iter().map(|(_, o, h)| (*o, h.extra_info.as_str())).collect::<Vec<_>>(), [(5, "b")]);
        assert_eq!(ledger.len(), 2);
        ledger.replace(&tp(0), 5, &handle("b", 10_000), handle("b2", 40_000));
        let due = ledger.due(&[(tp(0), 5)].into(), 70_000, 2_000);
        assert!(due.ack.is_empty() && due.extend.is_empty(), "past its invisible time: kept, not extended");
        let due = ledger.due(&[(tp(0), 7)].into(), 70_000, 2_000);
        let mut acked: Vec<_> = due.ack.iter().map(|h| h.extra_info.as_str()).collect();
        acked.sort();
        assert_eq!(acked, ["b2", "c"], "acknowledged once the clients are done, even late");
        assert_eq!(ledger.len(), 0);
    }

    #[test]
    fn without_a_live_reader_handles_lapse_unacked() {
        let ledger = Ledger::default();
        ledger.record(&tp(1), 0, handle("a", 1_000));
        let due = ledger.due(&HashMap::new(), 500, 2_000);
        assert!(due.ack.is_empty() && due.extend.is_empty());
        assert_eq!(ledger.len(), 1);
        let due = ledger.due(&HashMap::new(), 1_000, 2_000);
        assert!(due.ack.is_empty());
        assert_eq!(ledger.len(), 0, "the broker revives it; nothing is acked");
    }

    #[test]
    fn positions_are_bounded() {
        let positions = Positions::new(2);
        positions.learn("a", &tp(0), 1);
        positions.learn("b", &tp(0), 2);
        positions.learn("c", &tp(1), 3);
        assert_eq!(positions.find("a"), None);
        assert_eq!(positions.find("c"), Some((tp(1), 3)));
    }
}
