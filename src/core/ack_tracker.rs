//! Per-(client, topic, partition) acknowledgement state: which delivered events are still
//! unacknowledged, and the contiguous floor that becomes the committed offset.
//!
//! The floor is "the smallest delivered-but-unacknowledged offset, or one past the highest
//! delivered offset when none is pending". Storing the highest acked offset instead would skip an
//! unacknowledged gap after a restart. Defining the floor over delivered offsets (instead of
//! `floor + 1` steps) also handles logs whose offsets have gaps, such as Kafka's.

use std::collections::BTreeMap;

use super::offsets::OffsetEpoch;

/// A delivered event that has not been acknowledged yet.
#[derive(Debug, Clone, Default)]
struct PendingEvent {
    /// Deliveries of this event to this client on this instance (across sessions).
    attempts: u32,
    /// Sequence numbers of every delivery id issued for it, current and superseded: a late ack
    /// with any of them still counts.
    delivery_seqs: Vec<u64>,
}

/// What `AckTracker::ack` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckEffect {
    /// The event was pending and is now acknowledged.
    Acked,
    /// The event was acknowledged before: a no-op success.
    AlreadyAcked,
    /// The offset was never delivered or the sequence number was never issued for it.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct AckTracker {
    /// One past the highest offset handed out for a first delivery (at least the starting floor).
    delivered_end: u64,
    pending: BTreeMap<u64, PendingEvent>,
    last_acked: Option<u64>,
    /// The subscription that owns this tracker: a session whose subscription has another epoch
    /// must not record deliveries here, or its offsets would raise `delivered_end` past events
    /// the owner has not fed yet (issue 21).
    pub epoch: Epoch,
    /// The offset epoch of the stored record this tracker started from (`OffsetEpoch`): its
    /// writes carry it, and a plan that finds the record lowered since discards the tracker.
    pub offset_epoch: OffsetEpoch,
}

/// A subscription of a client, ordered by age: a later session's subscriptions come after an
/// earlier session's, and within a session later ones after earlier ones. A plan never takes a
/// tracker from a later epoch than its own (a taken-over session that re-subscribes late must not
/// take the client's trackers back from its successor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch {
    /// The session's number on this instance (registration order).
    pub session: u64,
    /// The subscription's id within the session.
    pub subscription: u64,
}

impl AckTracker {
    /// A tracker whose every offset below `committed` counts as acknowledged.
    pub fn new(committed: u64, last_acked: Option<u64>) -> Self {
        Self { delivered_end: committed, pending: BTreeMap::new(), last_acked, epoch: Epoch::default(), offset_epoch: 0 }
    }

    /// The committed offset: next offset not acknowledged.
    pub fn floor(&self) -> u64 {
        self.pending.keys().next().copied().unwrap_or(self.delivered_end)
    }

    pub fn last_acked(&self) -> Option<u64> {
        self.last_acked
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// True when `offset` needs no delivery: below the floor, or delivered and acknowledged.
    fn is_acked(&self, offset: u64) -> bool {
        offset < self.delivered_end && !self.pending.contains_key(&offset)
    }

    /// Records a delivery of `offset` with delivery sequence `seq`; returns its attempt number, or
    /// `None` when the event is already acknowledged and must not be sent.
    pub fn on_delivery(&mut self, offset: u64, seq: u64) -> Option<u32> {
        if self.is_acked(offset) {
            return None;
        }
        self.delivered_end = self.delivered_end.max(offset + 1);
        let pending = self.pending.entry(offset).or_default();
        pending.attempts += 1;
        pending.delivery_seqs.push(seq);
        Some(pending.attempts)
    }

    /// Acknowledges `offset` named by a delivery id with sequence `seq`.
    pub fn ack(&mut self, offset: u64, seq: u64) -> AckEffect {
        match self.pending.get(&offset) {
            Some(p) if p.delivery_seqs.contains(&seq) => {
                self.pending.remove(&offset);
                self.last_acked = Some(self.last_acked.map_or(offset, |l| l.max(offset)));
                AckEffect::Acked
            }
            Some(_) => AckEffect::Unknown,
            None if offset < self.delivered_end => AckEffect::AlreadyAcked,
            None => AckEffect::Unknown,
        }
    }

    /// Acknowledges a pending `offset` without a delivery id (dead letters).
    pub fn settle(&mut self, offset: u64) {
        if self.pending.remove(&offset).is_some() {
            self.last_acked = Some(self.last_acked.map_or(offset, |l| l.max(offset)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_acks_hold_the_floor_until_the_gap_closes() {
        let mut t = AckTracker::new(0, None);
        for offset in 0..10 {
            assert_eq!(t.on_delivery(offset, 100 + offset), Some(1));
        }
        for offset in 1..10 {
            assert_eq!(t.ack(offset, 100 + offset), AckEffect::Acked);
        }
        assert_eq!(t.floor(), 0);
        assert_eq!(t.last_acked(), Some(9));
        assert_eq!(t.ack(0, 100), AckEffect::Acked);
        assert_eq!(t.floor(), 10);
        assert_eq!(t.ack(0, 100), AckEffect::AlreadyAcked);
    }

    #[test]
    fn superseded_ids_count_and_foreign_ids_do_not() {
        let mut t = AckTracker::new(5, Some(4));
        assert_eq!(t.on_delivery(5, 1), Some(1));
        assert_eq!(t.on_delivery(5, 2), Some(2), "redelivery counts attempts");
        assert_eq!(t.ack(5, 3), AckEffect::Unknown, "seq never issued for offset 5");
        assert_eq!(t.ack(6, 1), AckEffect::Unknown, "offset never delivered");
        assert_eq!(t.ack(5, 1), AckEffect::Acked, "late ack with the superseded id");
        assert_eq!(t.floor(), 6);
        assert_eq!(t.on_delivery(5, 4), None, "acked events are not sent again");
        assert_eq!(t.on_delivery(3, 5), None, "events below the floor are not sent again");
    }

    #[test]
    fn gaps_in_log_offsets_do_not_stall_the_floor() {
        let mut t = AckTracker::new(0, None);
        t.on_delivery(0, 1);
        t.on_delivery(7, 2);
        assert_eq!(t.ack(7, 2), AckEffect::Acked);
        assert_eq!(t.floor(), 0);
        assert_eq!(t.ack(0, 1), AckEffect::Acked);
        assert_eq!(t.floor(), 8);
        t.on_delivery(8, 3);
        t.settle(8);
        assert_eq!((t.floor(), t.last_acked()), (9, Some(8)));
    }
}
