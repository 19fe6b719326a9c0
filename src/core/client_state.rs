//! What this instance remembers about one client across its sessions: an ack tracker per
//! partition and the delivery id format that points back into them.
//!
//! A delivery id is `seq.slot.partition.offset` in hex: `seq` is unique for the life of the
//! instance, `slot` indexes the client's topics. Because the id names its event, a late ack with a
//! superseded id is resolved without keeping a map of every id ever issued.

use std::collections::HashMap;

use super::FastMap;

use super::ack_tracker::{AckTracker, Epoch};
use super::names::{TopicName, TopicPartition};

/// Set in the slot of a delivery id whose event is a dead letter sent again (`core::redrive`):
/// such a delivery is outside the client's ack trackers (its ack removes the dead letter, it
/// never moves a committed offset), and its ids never collide with the topic's own deliveries
/// of the same offset. Slots are small indexes (`TRACKERS_KEPT`), far below this bit.
pub const REDRIVE_SLOT: u32 = 1 << 31;

/// The parts of a delivery id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliveryRef {
    pub seq: u64,
    pub slot: u32,
    pub partition: u32,
    pub offset: u64,
}

impl DeliveryRef {
    pub fn to_id(self) -> String {
        let mut id = String::with_capacity(40);
        self.write_id(&mut id);
        id
    }

    /// Appends the id (`seq.slot.partition.offset`, lowercase hex) without a formatter: it is
    /// written into every event frame.
    pub fn write_id(self, out: &mut String) {
        push_hex(out, self.seq);
        out.push('.');
        push_hex(out, self.slot.into());
        out.push('.');
        push_hex(out, self.partition.into());
        out.push('.');
        push_hex(out, self.offset);
    }

    /// `None` for anything this instance could not have issued.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.split('.');
        let mut next = || parts.next().and_then(|p| u64::from_str_radix(p, 16).ok());
        let (seq, slot, partition, offset) = (next()?, next()?, next()?, next()?);
        if parts.next().is_some() {
            return None;
        }
        Some(Self { seq, slot: u32::try_from(slot).ok()?, partition: u32::try_from(partition).ok()?, offset })
    }

    /// The event this delivery carries: `(slot, partition, offset)`.
    pub fn event(self) -> EventRef {
        EventRef { slot: self.slot, partition: self.partition, offset: self.offset }
    }

    /// The slot of its topic, redriven or not.
    pub fn topic_slot(self) -> u32 {
        self.slot & !REDRIVE_SLOT
    }
}

fn push_hex(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[at..]).expect("hex digits"));
}

/// One event of one client's topics, independent of which delivery carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventRef {
    pub slot: u32,
    pub partition: u32,
    pub offset: u64,
}

impl EventRef {
    /// A dead letter sent again (`REDRIVE_SLOT`).
    pub fn is_redrive(&self) -> bool {
        self.slot & REDRIVE_SLOT != 0
    }
}

/// Trackers a client keeps before the idle ones of topics it no longer uses go
/// (`ClientState::forget_unused`).
const TRACKERS_KEPT: usize = 1024;

/// Per-client acknowledgement state, shared by the client's sessions on this instance.
#[derive(Debug, Default)]
pub struct ClientState {
    pub trackers: FastMap<TopicPartition, AckTracker>,
    /// The topic of each slot of this client's delivery ids; `None` for a freed slot.
    topic_slots: Vec<Option<TopicName>>,
    /// The store's generation of each topic the trackers belong to, read when the subscription
    /// started: every offset write carries it, so none lands on a later topic of the same name.
    generations: HashMap<TopicName, u64>,
}

impl ClientState {
    /// The slot of `topic` in this client's delivery ids, assigning one on first use.
    pub fn slot(&mut self, topic: &TopicName) -> u32 {
        if let Some(i) = self.topic_slots.iter().position(|t| t.as_ref() == Some(topic)) {
            return i as u32;
        }
        // A freed slot is taken again: an old delivery id naming it carries a sequence number
        // the new topic's trackers never issued, so it cannot ack anything there.
        match self.topic_slots.iter().position(Option::is_none) {
            Some(i) => {
                self.topic_slots[i] = Some(topic.clone());
                i as u32
            }
            None => {
                self.topic_slots.push(Some(topic.clone()));
                (self.topic_slots.len() - 1) as u32
            }
        }
    }

    pub fn topic_of(&self, slot: u32) -> Option<&TopicName> {
        self.topic_slots.get(slot as usize)?.as_ref()
    }

    /// Bounds what a long-lived client leaves behind (one topic per room, subscribed and left):
    /// beyond `TRACKERS_KEPT` trackers, those that session `session` planned for topics it no
    /// longer uses (`in_use`) and that have nothing pending go, and with the last of a topic's
    /// trackers its slot. Trackers another session of the client planned are never touched. A
    /// later subscribe reads the topic's offsets from the store again.
    pub fn forget_unused(&mut self, session: u64, in_use: impl Fn(&TopicName) -> bool) {
        if self.trackers.len() <= TRACKERS_KEPT {
            return;
        }
        let keep = |tp: &TopicPartition, t: &AckTracker| t.epoch.session != session || in_use(&tp.topic) || t.pending_count() > 0;
        let busy: std::collections::HashSet<TopicName> = self.trackers.iter().filter(|(tp, t)| keep(tp, t)).map(|(tp, _)| tp.topic.clone()).collect();
        self.trackers.retain(|tp, _| busy.contains(&tp.topic));
        self.generations.retain(|topic, _| busy.contains(topic) || in_use(topic));
        for slot in &mut self.topic_slots {
            if slot.as_ref().is_some_and(|topic| !busy.contains(topic) && !in_use(topic)) {
                *slot = None;
            }
        }
    }

    /// The tracker of `tp` when it belongs to `epoch`: `None` for a subscription that a later
    /// plan (another session of the client, or a re-subscribe) has replaced.
    pub fn tracker_of_epoch(&mut self, tp: &TopicPartition, epoch: Epoch) -> Option<&mut AckTracker> {
        self.trackers.get_mut(tp).filter(|t| t.epoch == epoch)
    }

    /// The tracker of the partition an event belongs to.
    pub fn tracker_mut(&mut self, event: EventRef) -> Option<(TopicPartition, &mut AckTracker)> {
        let tp = TopicPartition::new(self.topic_of(event.slot)?.clone(), event.partition);
        let tracker = self.trackers.get_mut(&tp)?;
        Some((tp, tracker))
    }

    /// True when nothing delivered is waiting for an ack: the state can be dropped.
    pub fn is_idle(&self) -> bool {
        self.trackers.values().all(|t| t.pending_count() == 0)
    }

    /// Forgets the trackers of `topic` (unsubscribe does not; topic deletion and resets do).
    pub fn forget_topic(&mut self, topic: &TopicName) {
        self.trackers.retain(|tp, _| tp.topic != *topic);
        self.generations.remove(topic);
    }

    pub fn set_generation(&mut self, topic: &TopicName, generation: u64) {
        self.generations.insert(topic.clone(), generation);
    }

    /// The generation offset writes for `topic` carry (0 for a topic never seen: the store drops
    /// such a write if the topic was ever deleted).
    pub fn generation(&self, topic: &TopicName) -> u64 {
        self.generations.get(topic).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_ids_round_trip_and_reject_garbage() {
        let d = DeliveryRef { seq: 7, slot: 1, partition: 3, offset: u64::MAX };
        assert_eq!(DeliveryRef::parse(&d.to_id()), Some(d));
        assert_eq!(d.to_id(), format!("{:x}.{:x}.{:x}.{:x}", d.seq, d.slot, d.partition, d.offset));
        assert_eq!(DeliveryRef { seq: 0, slot: 0, partition: u32::MAX, offset: 0xabc }.to_id(), "0.0.ffffffff.abc");
        for bad in ["", "1.2.3", "1.2.3.4.5", "x.1.2.3", "1.1.1ffffffff.1", "1..2.3"] {
            assert_eq!(DeliveryRef::parse(bad), None, "{bad}");
        }
    }

    /// Issue 21, item 10: a client that subscribes to one topic after another (a room each) and
    /// leaves them keeps a bounded number of trackers and slots; pending ones and those in use stay.
    #[test]
    fn trackers_of_topics_a_client_left_are_bounded() {
        let mut state = ClientState::default();
        let topic = |i: usize| TopicName::parse(&format!("room-{i}")).unwrap();
        for i in 0..10_000 {
            let slot = state.slot(&topic(i));
            let mut tracker = AckTracker::new(0, None);
            if i == 3 {
                tracker.on_delivery(0, 1); // pending: kept whatever happens
            }
            // Room 7 is another session's: never this one's to forget.
            tracker.epoch = Epoch { session: if i == 7 { 2 } else { 1 }, subscription: i as u64 };
            state.trackers.insert(TopicPartition::new(topic(i), 0), tracker);
            state.forget_unused(1, |t| *t == topic(i) || *t == topic(5));
            assert!(state.trackers.len() <= TRACKERS_KEPT + 2, "{i}: {}", state.trackers.len());
            assert!(state.topic_slots.len() <= TRACKERS_KEPT + 2, "{i}: {}", state.topic_slots.len());
            assert_eq!(state.topic_of(slot), Some(&topic(i)));
        }
        for kept in [3, 5, 7, 9_999] {
            assert!(state.trackers.contains_key(&TopicPartition::new(topic(kept), 0)), "room-{kept}");
        }
    }
}
