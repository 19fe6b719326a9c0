//! A count of tasks waiting on something (subscribers at a partition's end, feeders for window
//! room), kept right even when a wait is cancelled: an unsubscribe drops the future mid-await.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts its holder as waiting for as long as it lives.
pub struct WaitingGuard<'a>(&'a AtomicUsize);

impl<'a> WaitingGuard<'a> {
    pub fn new(counter: &'a AtomicUsize) -> Self {
        // SeqCst: the side that frees room reads the count after its own release, and must see
        // every waiter that has not yet seen that release.
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
