//! Per-(client, topic, partition) acknowledgement state: which delivered events are still
//! unacknowledged, and the contiguous floor that becomes the committed offset.
//!
//! The floor is "the smallest delivered-but-unacknowledged offset, or one past the highest
//! delivered offset when none is pending". Storing the highest acked offset instead would skip an
//! unacknowledged gap after a restart. Defining the floor over delivered offsets (instead of
//! `floor + 1` steps) also handles logs whose offsets have gaps, such as Kafka's.

use std::collections::VecDeque;

use super::offsets::OffsetEpoch;

/// A delivered event that has not been acknowledged yet (or was, and waits to be dropped from
/// the front of the run: `acked`).
#[derive(Debug, Clone)]
struct PendingEvent {
    offset: u64,
    /// Deliveries of this event to this client on this instance (across sessions).
    attempts: u32,
    /// Acknowledged: a hole in the run, dropped once it reaches the front (or at compaction).
    acked: bool,
    /// Sequence number of the first delivery id issued for it, and of every later one (current
    /// and superseded: a late ack with any of them still counts). Apart, so a first delivery
    /// allocates nothing.
    first_seq: u64,
    later_seqs: Vec<u64>,
}

impl PendingEvent {
    fn has_seq(&self, seq: u64) -> bool {
        self.first_seq == seq || self.later_seqs.contains(&seq)
    }
}

/// Acknowledged holes tolerated in the run beyond the pending events before it is compacted.
const HOLES_SLACK: usize = 64;

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
    /// Delivered events by offset, ascending: a run, not a tree, since first deliveries come in
    /// offset order (appended at the back) and acks mostly in that order too (taken from the
    /// front), so a delivery in the browser shape (one pending at a time) allocates nothing.
    /// Acked events in the middle stay as holes until the front reaches them.
    run: VecDeque<PendingEvent>,
    /// Events of `run` not acked.
    pending: usize,
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
        Self { delivered_end: committed, run: VecDeque::new(), pending: 0, last_acked, epoch: Epoch::default(), offset_epoch: 0 }
    }

    /// The committed offset: next offset not acknowledged (the run's front is never a hole).
    pub fn floor(&self) -> u64 {
        self.run.front().map_or(self.delivered_end, |p| p.offset)
    }

    pub fn last_acked(&self) -> Option<u64> {
        self.last_acked
    }

    pub fn pending_count(&self) -> usize {
        self.pending
    }

    /// Where `offset` is in the run (`Ok`) or would go (`Err`). Most lookups are at the front.
    fn find(&self, offset: u64) -> Result<usize, usize> {
        match self.run.front() {
            Some(front) if front.offset == offset => Ok(0),
            _ => self.run.binary_search_by_key(&offset, |p| p.offset),
        }
    }

    /// The pending (not acked) event at `offset`.
    fn pending_at(&self, offset: u64) -> Option<usize> {
        self.find(offset).ok().filter(|&i| !self.run[i].acked)
    }

    /// True when `offset` needs no delivery: below the floor, or delivered and acknowledged.
    fn is_acked(&self, offset: u64) -> bool {
        offset < self.delivered_end && self.pending_at(offset).is_none()
    }

    /// Marks the event at `i` acked: holes at the front are dropped, and holes elsewhere once
    /// they outnumber the pending events (a stuck front event with many acked behind it).
    fn remove_at(&mut self, i: usize) {
        self.run[i].acked = true;
        self.pending -= 1;
        let offset = self.run[i].offset;
        self.last_acked = Some(self.last_acked.map_or(offset, |l| l.max(offset)));
        while self.run.front().is_some_and(|p| p.acked) {
            self.run.pop_front();
        }
        if self.run.len() > 2 * self.pending + HOLES_SLACK {
            self.run.retain(|p| !p.acked);
        }
    }

    /// Records a delivery of `offset` with delivery sequence `seq`; returns its attempt number, or
    /// `None` when the event is already acknowledged and must not be sent.
    pub fn on_delivery(&mut self, offset: u64, seq: u64) -> Option<u32> {
        if self.is_acked(offset) {
            return None;
        }
        // A first delivery past every delivered offset (the common case) goes at the back.
        if self.run.back().is_none_or(|last| last.offset < offset) {
            self.delivered_end = self.delivered_end.max(offset + 1);
            self.run.push_back(PendingEvent { offset, attempts: 1, acked: false, first_seq: seq, later_seqs: Vec::new() });
            self.pending += 1;
            return Some(1);
        }
        self.delivered_end = self.delivered_end.max(offset + 1);
        match self.find(offset) {
            Ok(i) => {
                // Pending (`is_acked` said so): a redelivery.
                let event = &mut self.run[i];
                event.attempts += 1;
                event.later_seqs.push(seq);
                Some(event.attempts)
            }
            Err(i) => {
                self.run.insert(i, PendingEvent { offset, attempts: 1, acked: false, first_seq: seq, later_seqs: Vec::new() });
                self.pending += 1;
                Some(1)
            }
        }
    }

    /// Acknowledges `offset` named by a delivery id with sequence `seq`.
    pub fn ack(&mut self, offset: u64, seq: u64) -> AckEffect {
        match self.pending_at(offset) {
            Some(i) if self.run[i].has_seq(seq) => {
                self.remove_at(i);
                AckEffect::Acked
            }
            Some(_) => AckEffect::Unknown,
            None if offset < self.delivered_end => AckEffect::AlreadyAcked,
            None => AckEffect::Unknown,
        }
    }

    /// Acknowledges a pending `offset` without a delivery id (dead letters).
    pub fn settle(&mut self, offset: u64) {
        if let Some(i) = self.pending_at(offset) {
            self.remove_at(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// The tracker as it was (a map of pending offsets to their delivery seqs), as the model.
    #[derive(Default)]
    struct Model {
        delivered_end: u64,
        pending: BTreeMap<u64, (u32, Vec<u64>)>,
        last_acked: Option<u64>,
    }

    impl Model {
        fn on_delivery(&mut self, offset: u64, seq: u64) -> Option<u32> {
            if offset < self.delivered_end && !self.pending.contains_key(&offset) {
                return None;
            }
            self.delivered_end = self.delivered_end.max(offset + 1);
            let p = self.pending.entry(offset).or_default();
            p.0 += 1;
            p.1.push(seq);
            Some(p.0)
        }
        fn ack(&mut self, offset: u64, seq: u64) -> AckEffect {
            match self.pending.get(&offset) {
                Some(p) if p.1.contains(&seq) => {
                    self.pending.remove(&offset);
                    self.last_acked = Some(self.last_acked.map_or(offset, |l| l.max(offset)));
                    AckEffect::Acked
                }
                Some(_) => AckEffect::Unknown,
                None if offset < self.delivered_end => AckEffect::AlreadyAcked,
                None => AckEffect::Unknown,
            }
        }
        fn floor(&self) -> u64 {
            self.pending.keys().next().copied().unwrap_or(self.delivered_end)
        }
    }

    proptest! {
        /// The run of pending offsets answers every delivery, ack and settle as the map it
        /// replaced: attempts, ack effects, floor, last acked and pending count.
        #[test]
        fn the_run_behaves_as_the_map_it_replaced(ops in proptest::collection::vec((0u8..4, 0u64..40, 0u64..8), 1..400)) {
            let (mut t, mut m) = (AckTracker::new(0, None), Model::default());
            let mut seq = 0u64;
            for (kind, offset, back) in ops {
                match kind {
                    0 | 1 => {
                        seq += 1;
                        prop_assert_eq!(t.on_delivery(offset, seq), m.on_delivery(offset, seq));
                    }
                    2 => {
                        // An ack with a recent seq: the current, a superseded or a foreign one.
                        let s = seq.saturating_sub(back);
                        prop_assert_eq!(t.ack(offset, s), m.ack(offset, s));
                    }
                    _ => {
                        t.settle(offset);
                        if m.pending.remove(&offset).is_some() {
                            m.last_acked = Some(m.last_acked.map_or(offset, |l| l.max(offset)));
                        }
                    }
                }
                prop_assert_eq!(t.floor(), m.floor());
                prop_assert_eq!(t.last_acked(), m.last_acked);
                prop_assert_eq!(t.pending_count(), m.pending.len());
                prop_assert!(t.run.len() <= 2 * t.pending + HOLES_SLACK + 1);
            }
        }
    }

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
