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
//! learned from every message this instance reads (popped or pulled).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use crate::core::names::TopicPartition;

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
}

impl Ledger {
    pub fn record(&self, tp: &TopicPartition, offset: u64, handle: Handle) {
        self.pending.lock().unwrap().entry(tp.clone()).or_default().entry(offset).or_default().push(handle);
    }

    /// Partitions with pending handles.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        self.pending.lock().unwrap().keys().cloned().collect()
    }

    /// Takes the handles every client is done with (original offset below the partition's floor)
    /// and picks those to extend: owed by a live client and invisible for less than `margin_ms`
    /// more. A partition without a floor (no live subscriber) keeps its handles until the broker
    /// revives them; lapsed ones are dropped.
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
                    for (offset, handles) in by_offset.iter_mut() {
                        handles.retain(|h| h.invisible_until > now_ms);
                        for h in handles.iter().filter(|h| h.invisible_until <= now_ms + margin_ms) {
                            due.extend.push((tp.clone(), *offset, h.clone()));
                        }
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
        self.pending.lock().unwrap().retain(|tp, _| tp.topic != *topic);
    }

    pub fn len(&self) -> usize {
        self.pending.lock().unwrap().values().flat_map(|p| p.values()).map(Vec::len).sum()
    }
}

/// `UNIQ_KEY` -> original `topic#partition` and offset, for the most recent `capacity` messages.
pub struct Positions {
    capacity: usize,
    inner: Mutex<(HashMap<String, (TopicPartition, u64)>, VecDeque<String>)>,
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
        Handle { topic: "t".into(), queue_id: 0, queue_offset: 0, extra_info: info.into(), invisible_until: until }
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
        let due = ledger.due(&[(tp(0), 7)].into(), 9_500, 2_000);
        let mut acked: Vec<_> = due.ack.iter().map(|h| h.extra_info.as_str()).collect();
        acked.sort();
        assert_eq!(acked, ["b2", "c"]);
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
