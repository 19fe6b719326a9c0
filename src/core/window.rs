//! A session's in-flight window: at most `delivery.max_in_flight` unacknowledged deliveries and
//! at most `delivery.max_in_flight_bytes` of their payloads. Feeders take room for each event
//! before handing it over and wait while there is none, so nothing more is pushed to the
//! session; the room comes back when the delivery is acked, dead-lettered or released.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

pub struct Window {
    slots: Arc<Semaphore>,
    /// Payload bytes in flight. A plain counter, not a second semaphore: releasing a semaphore
    /// permit takes its waiter lock, and that doubled per event cost ~10% of one client's
    /// throughput.
    bytes: Arc<ByteBudget>,
}

struct ByteBudget {
    in_flight: AtomicU64,
    max: u64,
    /// Feeders waiting for payload room (a window can be full by bytes with slots free).
    waiting: AtomicUsize,
    freed: Notify,
}

impl ByteBudget {
    /// Takes `cost` bytes when they fit.
    fn try_take(&self, cost: u64) -> bool {
        self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| (now + cost <= self.max).then_some(now + cost)).is_ok()
    }

    fn give_back(&self, cost: u64) {
        self.in_flight.fetch_sub(cost, Ordering::AcqRel);
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.freed.notify_waiters();
        }
    }
}

/// Room for one delivery; dropping it gives the room back.
pub struct WindowPermit {
    _slot: OwnedSemaphorePermit,
    bytes: Arc<ByteBudget>,
    cost: u64,
}

impl Drop for WindowPermit {
    fn drop(&mut self) {
        self.bytes.give_back(self.cost);
    }
}

impl Window {
    pub fn new(max_events: usize, max_bytes: u32) -> Self {
        let bytes = ByteBudget { in_flight: AtomicU64::new(0), max: u64::from(max_bytes.max(1)), waiting: AtomicUsize::new(0), freed: Notify::new() };
        Self { slots: Arc::new(Semaphore::new(max_events)), bytes: Arc::new(bytes) }
    }

    /// Bytes an event of `payload_len` takes: its size, but never more than the whole budget (a
    /// larger event still goes, alone) and at least 1.
    fn cost(&self, payload_len: usize) -> u64 {
        (payload_len as u64).clamp(1, self.bytes.max)
    }

    /// Room for an event at once, when there is some (the common case: no waiter to arm).
    pub fn try_acquire(&self, payload_len: usize) -> Option<WindowPermit> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        let cost = self.cost(payload_len);
        self.bytes.try_take(cost).then(|| WindowPermit { _slot: slot, bytes: self.bytes.clone(), cost })
    }

    /// Waits for room for an event; `None` once the window is closed.
    pub async fn acquire(&self, payload_len: usize) -> Option<WindowPermit> {
        let slot = self.slots.clone().acquire_owned().await.ok()?;
        let cost = self.cost(payload_len);
        if !self.bytes.try_take(cost) {
            self.bytes.waiting.fetch_add(1, Ordering::AcqRel);
            loop {
                let freed = self.bytes.freed.notified();
                tokio::pin!(freed);
                freed.as_mut().enable();
                if self.bytes.try_take(cost) {
                    break;
                }
                freed.await;
            }
            self.bytes.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        Some(WindowPermit { _slot: slot, bytes: self.bytes.clone(), cost })
    }

    /// Deliveries that could still be added (ignoring bytes).
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// True when nothing more can be pushed: every slot taken, or a feeder waits for bytes.
    pub fn is_full(&self) -> bool {
        self.slots.available_permits() == 0 || self.bytes.waiting.load(Ordering::Relaxed) > 0
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
        let _waited = waiting.await.unwrap();
        let _x = window.try_acquire(1).unwrap();
        let _y = window.try_acquire(1).unwrap();
        assert!(window.is_full(), "three events in flight");
        assert!(window.try_acquire(1).is_none());
    }
}
