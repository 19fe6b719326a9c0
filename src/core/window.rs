//! A session's in-flight window: at most `delivery.max_in_flight` unacknowledged deliveries and
//! at most `delivery.max_in_flight_bytes` of their events (payload, key and headers). Feeders take room for each event
//! before handing it over and wait while there is none, so nothing more is pushed to the
//! session; the room comes back when the delivery is acked, dead-lettered or released.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use super::waiting::WaitingGuard;

/// Room is counted with two atomics and one compare-and-swap each, not with semaphores: a
/// semaphore's release takes its waiter lock on every event (it was ~5% of a busy session's CPU).
pub struct Window {
    budget: Arc<Budget>,
}

struct Budget {
    /// Deliveries in flight.
    slots: AtomicUsize,
    /// Changed only by `Window::set_max_events` (a shared subscription's hub, as members come and go).
    max_slots: AtomicUsize,
    /// Payload bytes in flight.
    bytes: AtomicU64,
    /// Changed only by `Window::set_max_bytes` (a hub, as for `max_slots`). A relaxed load is the
    /// same plain load on x86-64 as the field it was.
    max_bytes: AtomicU64,
    /// Feeders waiting for room.
    waiting: AtomicUsize,
    freed: Notify,
}

impl Budget {
    /// Takes one slot and `cost` bytes when both fit.
    fn try_take(&self, cost: u64) -> bool {
        let max_slots = self.max_slots.load(Ordering::Relaxed);
        if self.slots.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max_slots).then_some(n + 1)).is_err() {
            return false;
        }
        let max_bytes = self.max_bytes.load(Ordering::Relaxed);
        if self.bytes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n + cost <= max_bytes).then_some(n + cost)).is_err() {
            // Undone without waking anyone: the bytes are held by deliveries in flight, and the
            // release of each of them wakes the waiters. (Waking here, a waiter that fails on
            // bytes would wake itself forever.)
            self.slots.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Takes up to `want` slots and every free byte, when at least one slot and one byte are
    /// free: the room a feeder's read may fill.
    fn try_reserve(&self, want: usize) -> Option<(usize, u64, u64)> {
        let max_slots = self.max_slots.load(Ordering::Relaxed);
        let before = self.slots.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max_slots).then(|| n + want.min(max_slots - n))).ok()?;
        let slots = want.min(max_slots - before);
        let max_bytes = self.max_bytes.load(Ordering::Relaxed);
        match self.bytes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max_bytes).then_some(max_bytes)) {
            Ok(before) => Some((slots, max_bytes - before, max_bytes)),
            Err(_) => {
                // No wake-up, as in `try_take`: the bytes are held by deliveries in flight.
                self.slots.fetch_sub(slots, Ordering::SeqCst);
                None
            }
        }
    }

    fn give_back(&self, cost: u64) {
        self.give_back_many(1, cost);
    }

    fn give_back_many(&self, slots: usize, cost: u64) {
        self.bytes.fetch_sub(cost, Ordering::SeqCst);
        self.slots.fetch_sub(slots, Ordering::SeqCst);
        // SeqCst on both sides: a waiter counts itself before it checks again, so either it sees
        // this room or this sees it waiting.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }
}

/// Room for one delivery; dropping it gives the room back.
pub struct WindowPermit {
    budget: Arc<Budget>,
    cost: u64,
}

impl std::fmt::Debug for WindowPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowPermit").field("cost", &self.cost).finish()
    }
}

impl WindowPermit {
    /// The bytes it holds of the window.
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Drop for WindowPermit {
    fn drop(&mut self) {
        self.budget.give_back(self.cost);
    }
}

/// Room a feeder took for one read (`Window::try_reserve`): each event it hands over becomes a
/// permit out of it, and what the read did not fill goes back when it drops. The room is taken
/// before the read, so what a session's feeders read is never more than its window has free
/// (each used to read a whole free window and only then take room: (1 + partitions) windows).
pub struct Reservation {
    budget: Arc<Budget>,
    slots: usize,
    bytes: u64,
    /// The window's byte bound when it was taken: what one event costs at most. Read once, not
    /// per event from the budget's line, which acks on other threads keep writing.
    max_cost: u64,
}

impl Reservation {
    /// Room for an event out of the reservation, if it fits (its cost as in `Window::cost`).
    pub fn take(&mut self, event_bytes: usize) -> Option<WindowPermit> {
        let cost = (event_bytes as u64).clamp(1, self.max_cost);
        if self.slots == 0 || cost > self.bytes {
            return None;
        }
        self.slots -= 1;
        self.bytes -= cost;
        Some(WindowPermit { budget: self.budget.clone(), cost })
    }

    /// Events and bytes it still holds.
    pub fn room(&self) -> (usize, u64) {
        (self.slots, self.bytes)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.slots > 0 || self.bytes > 0 {
            self.budget.give_back_many(self.slots, self.bytes);
        }
    }
}

impl Window {
    pub fn new(max_events: usize, max_bytes: u32) -> Self {
        let budget = Budget {
            slots: AtomicUsize::new(0),
            max_slots: AtomicUsize::new(max_events),
            bytes: AtomicU64::new(0),
            max_bytes: AtomicU64::new(u64::from(max_bytes.max(1))),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
        };
        Self { budget: Arc::new(budget) }
    }

    /// Bytes an event of `event_bytes` takes: its size, but never more than the whole budget (a
    /// larger event still goes, alone) and at least 1.
    fn cost(&self, event_bytes: usize) -> u64 {
        (event_bytes as u64).clamp(1, self.budget.max_bytes.load(Ordering::Relaxed))
    }

    fn permit(&self, cost: u64) -> WindowPermit {
        WindowPermit { budget: self.budget.clone(), cost }
    }

    /// Room for an event at once, when there is some (the common case: no waiter to arm).
    pub fn try_acquire(&self, event_bytes: usize) -> Option<WindowPermit> {
        let cost = self.cost(event_bytes);
        self.budget.try_take(cost).then(|| self.permit(cost))
    }

    /// Waits for room for an event (cancel-safe: dropping the future takes nothing).
    pub async fn acquire(&self, event_bytes: usize) -> WindowPermit {
        let cost = self.cost(event_bytes);
        let budget = &self.budget;
        if !budget.try_take(cost) {
            let _waiting = WaitingGuard::new(&budget.waiting);
            loop {
                let freed = budget.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if budget.try_take(cost) {
                    break;
                }
                freed.await;
            }
        }
        self.permit(cost)
    }

    /// Up to `max_events` slots and every free byte for one read, when there is room (takes
    /// nothing otherwise).
    pub fn try_reserve(&self, max_events: usize) -> Option<Reservation> {
        let (slots, bytes, max_cost) = self.budget.try_reserve(max_events.max(1))?;
        Some(Reservation { budget: self.budget.clone(), slots, bytes, max_cost })
    }

    /// Deliveries that could still be added (ignoring bytes).
    pub fn free_slots(&self) -> usize {
        self.budget.max_slots.load(Ordering::Relaxed).saturating_sub(self.budget.slots.load(Ordering::Relaxed))
    }

    /// Payload bytes that could still be added (an event larger than this still goes once the
    /// window is empty).
    pub fn free_bytes(&self) -> u64 {
        self.budget.max_bytes.load(Ordering::Relaxed).saturating_sub(self.budget.bytes.load(Ordering::Relaxed))
    }

    /// Waits until a slot and room for an event of `event_bytes` are free (cancel-safe; takes
    /// nothing): a feeder reads from the log only then, and only as much as there is room for.
    pub async fn room_for(&self, event_bytes: usize) {
        let budget = &self.budget;
        let cost = self.cost(event_bytes);
        let has_room = || self.free_slots() > 0 && self.free_bytes() >= cost;
        if has_room() {
            return;
        }
        let _waiting = WaitingGuard::new(&budget.waiting);
        loop {
            let freed = budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if has_room() {
                return;
            }
            freed.await;
        }
    }

    /// The bound on events in flight: what the session was opened with (`delivery.max_in_flight`
    /// then; a reload changes the next session's, not this one's), or a hub's `set_max_events`.
    pub fn max_events(&self) -> usize {
        self.budget.max_slots.load(Ordering::Relaxed)
    }

    pub fn max_bytes(&self) -> u64 {
        self.budget.max_bytes.load(Ordering::Relaxed)
    }

    /// A new bound on bytes (a hub: its own and its members' byte windows together), as
    /// `set_max_events` for events.
    pub fn set_max_bytes(&self, max_bytes: u64) {
        self.budget.max_bytes.store(max_bytes.max(1), Ordering::SeqCst);
        if self.budget.waiting.load(Ordering::SeqCst) > 0 {
            self.budget.freed.notify_waiters();
        }
    }

    /// A new bound on events (a shared subscription's hub: its members' windows together). Events
    /// in the window above a lower bound stay; nothing more is taken until they are below it.
    pub fn set_max_events(&self, max_events: usize) {
        self.budget.max_slots.store(max_events, Ordering::SeqCst);
        if self.budget.waiting.load(Ordering::SeqCst) > 0 {
            self.budget.freed.notify_waiters();
        }
    }

    /// True when nothing more can be pushed: every slot taken, or a feeder waits for room.
    pub fn is_full(&self) -> bool {
        self.free_slots() == 0 || self.budget.waiting.load(Ordering::Relaxed) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_and_bytes_both_bound_the_window() {
        let window = Window::new(3, 100);
        let a = window.try_acquire(60).unwrap();
        assert!(window.try_acquire(60).is_none(), "60 + 60 bytes is over 100");
        let b = window.try_acquire(40).unwrap();
        assert!(!window.is_full());
        // A payload larger than the whole budget goes alone once everything else is settled.
        drop((a, b));
        let big = window.try_acquire(1 << 30).unwrap();
        assert!(window.try_acquire(0).is_none(), "the budget is taken");
        let waiting = window.acquire(10);
        tokio::pin!(waiting);
        assert!(futures_util::FutureExt::now_or_never(&mut waiting).is_none());
        drop(big);
        let _waited = waiting.await;
        let _x = window.try_acquire(1).unwrap();
        let _y = window.try_acquire(1).unwrap();
        assert!(window.is_full(), "three events in flight");
        assert!(window.try_acquire(1).is_none());
    }

    /// A read's reservation takes the free room before the read: another feeder of the session
    /// finds none meanwhile, the events it hands over are permits out of it, and the rest goes
    /// back when it drops.
    #[tokio::test]
    async fn a_reservation_holds_the_free_room_for_one_read() {
        let window = Window::new(4, 100);
        let held = window.try_acquire(30).unwrap();
        let mut reservation = window.try_reserve(10).unwrap();
        assert_eq!(reservation.room(), (3, 70), "every free slot up to the batch, every free byte");
        assert!(window.try_reserve(1).is_none() && window.try_acquire(1).is_none(), "taken for the read");
        let a = reservation.take(50).unwrap();
        assert!(reservation.take(21).is_none(), "50 + 21 is over what it holds");
        let b = reservation.take(20).unwrap();
        assert_eq!(reservation.room(), (1, 0));
        drop(reservation);
        assert_eq!((window.free_slots(), window.free_bytes()), (1, 0));
        drop((a, b, held));
        assert_eq!((window.free_slots(), window.free_bytes()), (4, 100));
        // An event larger than the window takes all of it, from an empty window only.
        let mut whole = window.try_reserve(2).unwrap();
        assert_eq!(whole.room(), (2, 100));
        let big = whole.take(1 << 30).unwrap();
        assert!(whole.take(1).is_none());
        drop((whole, big));
        // `room_for` waits until the event's cost is free, not just one byte.
        let held = window.try_acquire(60).unwrap();
        let waiting = window.room_for(50);
        tokio::pin!(waiting);
        assert!(futures_util::FutureExt::now_or_never(&mut waiting).is_none());
        drop(held);
        waiting.await;
    }
}
