//! A session's in-flight window: at most `delivery.max_in_flight` unacknowledged deliveries and
//! at most `delivery.max_in_flight_bytes` of their payloads. Feeders take room for each event
//! before handing it over and wait while there is none, so nothing more is pushed to the
//! session; the room comes back when the delivery is acked, dead-lettered or released.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Window {
    slots: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes: u32,
    /// Feeders waiting for payload room (a window can be full by bytes with slots free).
    waiting_for_bytes: AtomicUsize,
}

/// Room for one delivery; dropping it gives the room back.
pub struct WindowPermit {
    _slot: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

impl Window {
    pub fn new(max_events: usize, max_bytes: u32) -> Self {
        let max_bytes = max_bytes.max(1);
        Self { slots: Arc::new(Semaphore::new(max_events)), bytes: Arc::new(Semaphore::new(max_bytes as usize)), max_bytes, waiting_for_bytes: AtomicUsize::new(0) }
    }

    /// Bytes an event of `payload_len` takes: its size, but never more than the whole budget (a
    /// larger event still goes, alone) and at least 1.
    fn cost(&self, payload_len: usize) -> u32 {
        u32::try_from(payload_len).unwrap_or(u32::MAX).clamp(1, self.max_bytes)
    }

    /// Room for an event at once, when there is some (the common case: no waiter to arm).
    pub fn try_acquire(&self, payload_len: usize) -> Option<WindowPermit> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        let bytes = self.bytes.clone().try_acquire_many_owned(self.cost(payload_len)).ok()?;
        Some(WindowPermit { _slot: slot, _bytes: bytes })
    }

    /// Waits for room for an event; `None` once the window is closed.
    pub async fn acquire(&self, payload_len: usize) -> Option<WindowPermit> {
        let slot = self.slots.clone().acquire_owned().await.ok()?;
        let cost = self.cost(payload_len);
        let bytes = match self.bytes.clone().try_acquire_many_owned(cost) {
            Ok(bytes) => bytes,
            Err(_) => {
                self.waiting_for_bytes.fetch_add(1, Ordering::Relaxed);
                let bytes = self.bytes.clone().acquire_many_owned(cost).await;
                self.waiting_for_bytes.fetch_sub(1, Ordering::Relaxed);
                bytes.ok()?
            }
        };
        Some(WindowPermit { _slot: slot, _bytes: bytes })
    }

    /// Deliveries that could still be added (ignoring bytes).
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// True when nothing more can be pushed: every slot taken, or a feeder waits for bytes.
    pub fn is_full(&self) -> bool {
        self.slots.available_permits() == 0 || self.waiting_for_bytes.load(Ordering::Relaxed) > 0
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
