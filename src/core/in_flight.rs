//! The in-flight deliveries of one session and their ack deadlines.
//!
//! Keyed by the event (`EventRef`), not by delivery id: a redelivery replaces the id in place.
//! Deadlines sit in a min-heap; a changed deadline bumps the entry's generation so the older heap
//! entry is skipped when it comes up, instead of searching the heap to remove it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use super::FastMap;

use super::window::WindowPermit;
use tokio::time::Instant;

use super::backend::Event;
use super::client_state::{DeliveryRef, EventRef};
use super::names::TopicName;

/// One in-flight delivery as the admin routes show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InFlightView {
    pub delivery_id: String,
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub attempt: u32,
    /// Epoch ms.
    pub deadline: u64,
    /// Epoch ms of the next delivery of this event if no ack comes: the deadline, plus the
    /// backoff after this attempt when the deadline is an ack timeout.
    pub next_attempt_at: u64,
}

/// One unacknowledged delivery.
pub struct Delivery {
    /// Sequence number of the current delivery id.
    pub seq: u64,
    pub topic: TopicName,
    pub attempt: u32,
    pub event: Arc<Event>,
    /// When the current delivery id was pushed (ack latency).
    pub delivered_at: Instant,
    /// The delivery's room in the session's window, given back when it is dropped.
    // Held for its drop only, never read: the lint cannot see the guard's purpose.
    #[allow(dead_code)]
    pub permit: WindowPermit,
}

struct Entry {
    delivery: Delivery,
    /// Epoch ms, for the admin view.
    deadline_ms: u64,
    generation: u64,
}

/// Stale deadline entries tolerated beyond the live ones before the heap is compacted.
const STALE_SLACK: usize = 1024;

#[derive(Default)]
pub struct InFlightWindow {
    entries: FastMap<EventRef, Entry>,
    /// The window bytes the entries' permits hold: with `len`, whether the session's window is
    /// full, from the session's own memory (`Window::is_full` reads atomics the feeders write).
    bytes: u64,
    deadlines: BinaryHeap<Reverse<(Instant, EventRef, u64)>>,
    next_generation: u64,
}

impl InFlightWindow {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn get(&self, at: &EventRef) -> Option<&Delivery> {
        self.entries.get(at).map(|e| &e.delivery)
    }

    /// Adds a delivery due for redelivery `after` from `now` (`now_ms` on the wall clock).
    pub fn insert(&mut self, at: EventRef, delivery: Delivery, after: Duration, now: Instant, now_ms: u64) {
        let (deadline_ms, generation) = self.schedule(at, after, now, now_ms);
        self.bytes += delivery.permit.cost();
        if let Some(replaced) = self.entries.insert(at, Entry { delivery, deadline_ms, generation }) {
            self.bytes -= replaced.delivery.permit.cost();
        }
    }

    pub fn remove(&mut self, at: &EventRef) -> Option<Delivery> {
        let removed = self.entries.remove(at)?;
        self.bytes -= removed.delivery.permit.cost();
        Some(removed.delivery)
    }

    /// Moves the deadline of a delivery (nack delay, extend); false when it is not in flight.
    pub fn reschedule(&mut self, at: EventRef, after: Duration, now_ms: u64) -> bool {
        if !self.entries.contains_key(&at) {
            return false;
        }
        let (deadline_ms, generation) = self.schedule(at, after, Instant::now(), now_ms);
        if let Some(entry) = self.entries.get_mut(&at) {
            entry.deadline_ms = deadline_ms;
            entry.generation = generation;
        }
        true
    }

    /// Records a redelivery under a new delivery id and restarts its deadline.
    pub fn redelivered(&mut self, at: EventRef, seq: u64, attempt: u32, after: Duration, now_ms: u64) {
        if self.reschedule(at, after, now_ms) {
            if let Some(entry) = self.entries.get_mut(&at) {
                entry.delivery.seq = seq;
                entry.delivery.attempt = attempt;
                entry.delivery.delivered_at = Instant::now();
            }
        }
    }

    fn schedule(&mut self, at: EventRef, after: Duration, now: Instant, now_ms: u64) -> (u64, u64) {
        self.next_generation += 1;
        // Delays are bounded by config and protocol, but an overflow must never panic.
        let deadline = now.checked_add(after).unwrap_or_else(|| now + Duration::from_secs(86_400 * 365));
        // Acked deliveries leave their heap entry behind until its deadline; at full speed that is
        // ack_timeout x rate entries (millions). Drop the stale ones once they outnumber the live
        // ones: O(n) every ~n pushes, so the heap stays within a small multiple of the window.
        if self.deadlines.len() >= 2 * self.entries.len() + STALE_SLACK {
            let entries = &self.entries;
            self.deadlines.retain(|Reverse((_, event, generation))| entries.get(event).is_some_and(|e| e.generation == *generation));
        }
        self.deadlines.push(Reverse((deadline, at, self.next_generation)));
        (now_ms.saturating_add(after.as_millis() as u64), self.next_generation)
    }

    /// When the earliest live deadline falls. Stale heap tops (acked deliveries, superseded
    /// deadlines) are dropped on the way, so a session arms no timer for a delivery already
    /// acked: without this, every delivery cost one empty wake an ack timeout after it was sent.
    pub fn next_live_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, event, generation))) = self.deadlines.peek().copied() {
            if self.entries.get(&event).is_some_and(|e| e.generation == generation) {
                return Some(at);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The next delivery whose current deadline has passed.
    pub fn pop_due(&mut self, now: Instant) -> Option<EventRef> {
        while let Some(Reverse((at, event, generation))) = self.deadlines.peek().copied() {
            if at > now {
                return None;
            }
            self.deadlines.pop();
            if self.entries.get(&event).is_some_and(|e| e.generation == generation) {
                return Some(event);
            }
        }
        None
    }

    /// Drops every delivery of one topic slot (unsubscribe), releasing their window slots.
    pub fn release_slot(&mut self, slot: u32) {
        let bytes = &mut self.bytes;
        self.entries.retain(|at, e| {
            let keep = at.slot != slot;
            if !keep {
                *bytes -= e.delivery.permit.cost();
            }
            keep
        });
    }

    /// Drops everything (session end).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.deadlines.clear();
        self.bytes = 0;
    }

    /// The admin view, ordered by topic, partition and offset; `pause_after_deadline` says how
    /// long after its deadline each delivery comes again (its backoff when the deadline is an
    /// ack timeout).
    pub fn views(&self, pause_after_deadline: impl Fn(EventRef, &Delivery) -> Duration) -> Vec<InFlightView> {
        let mut views: Vec<InFlightView> = self
            .entries
            .iter()
            .map(|(at, e)| InFlightView {
                delivery_id: DeliveryRef { seq: e.delivery.seq, slot: at.slot, partition: at.partition, offset: at.offset }.to_id(),
                topic: e.delivery.topic.to_string(),
                partition: at.partition,
                offset: at.offset,
                attempt: e.delivery.attempt,
                deadline: e.deadline_ms,
                next_attempt_at: e.deadline_ms.saturating_add(pause_after_deadline(*at, &e.delivery).as_millis() as u64),
            })
            .collect();
        views.sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
        views
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::window::Window;

    fn delivery(seq: u64, permits: &Window) -> Delivery {
        let event = Event {
            partition: 0,
            offset: seq,
            timestamp: 0,
            key: None,
            headers: vec![],
            headers_base64: vec![],
            payload: vec![],
            payload_is_json: false,
            undecodable: false,
            frame: Default::default(),
        };
        Delivery {
            seq,
            topic: TopicName::parse("t").unwrap(),
            attempt: 1,
            event: Arc::new(event),
            delivered_at: Instant::now(),
            permit: permits.try_acquire(0).unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acked_deliveries_do_not_pile_up_in_the_deadline_heap() {
        let permits = Window::new(10, 1000);
        let mut window = InFlightWindow::default();
        for offset in 0..100_000u64 {
            let at = EventRef { slot: 0, partition: 0, offset };
            window.insert(at, delivery(offset, &permits), Duration::from_secs(30), Instant::now(), 0);
            if offset >= 5 {
                window.remove(&EventRef { slot: 0, partition: 0, offset: offset - 5 });
            }
        }
        assert_eq!(window.len(), 5);
        assert!(window.deadlines.len() <= 2 * 5 + STALE_SLACK + 1, "heap holds {} entries", window.deadlines.len());
        // The live ones still fire, in order.
        tokio::time::advance(Duration::from_secs(31)).await;
        let due: Vec<u64> = std::iter::from_fn(|| window.pop_due(Instant::now())).map(|e| e.offset).collect();
        assert_eq!(due, vec![99_995, 99_996, 99_997, 99_998, 99_999]);
    }

    /// The engine review's finding 3: an acked delivery's deadline arms no timer. Failed before
    /// the fix: the next deadline was the acked delivery's, 30 s out.
    #[tokio::test(start_paused = true)]
    async fn an_acked_delivery_arms_no_timer() {
        let permits = Window::new(10, 1000);
        let mut window = InFlightWindow::default();
        let (a, b) = (EventRef { slot: 0, partition: 0, offset: 1 }, EventRef { slot: 0, partition: 0, offset: 2 });
        window.insert(a, delivery(1, &permits), Duration::from_secs(30), Instant::now(), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        window.insert(b, delivery(2, &permits), Duration::from_secs(30), Instant::now(), 0);
        let b_due = Instant::now() + Duration::from_secs(30);
        window.remove(&a);
        assert_eq!(window.next_live_deadline(), Some(b_due), "the acked delivery's deadline is skipped");
        window.remove(&b);
        assert_eq!(window.next_live_deadline(), None, "nothing in flight: no timer");
        // A superseded deadline is skipped too.
        window.insert(a, delivery(1, &permits), Duration::from_secs(5), Instant::now(), 0);
        assert!(window.reschedule(a, Duration::from_secs(50), 0));
        assert_eq!(window.next_live_deadline(), Some(Instant::now() + Duration::from_secs(50)));
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_fire_in_order_and_rescheduling_supersedes_old_ones() {
        let permits = Window::new(3, 1000);
        let mut window = InFlightWindow::default();
        let (a, b) = (EventRef { slot: 0, partition: 0, offset: 1 }, EventRef { slot: 0, partition: 0, offset: 2 });
        window.insert(a, delivery(1, &permits), Duration::from_secs(1), Instant::now(), 0);
        window.insert(b, delivery(2, &permits), Duration::from_secs(2), Instant::now(), 0);
        assert!(window.reschedule(a, Duration::from_secs(5), 0));
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert_eq!(window.pop_due(Instant::now()), Some(b));
        assert_eq!(window.pop_due(Instant::now()), None, "a's first deadline was superseded");
        window.redelivered(b, 9, 2, Duration::from_secs(1), 0);
        assert_eq!((window.get(&b).unwrap().seq, window.get(&b).unwrap().attempt), (9, 2));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(window.pop_due(Instant::now()), Some(b));
        assert_eq!(window.pop_due(Instant::now()), Some(a));
        assert_eq!(permits.free_slots(), 1);
        assert_eq!(window.bytes(), 2, "two permits of one byte each");
        window.release_slot(0);
        assert_eq!((window.len(), window.bytes()), (0, 0));
        assert_eq!(permits.free_slots(), 3, "dropping deliveries frees the window");
    }
}
