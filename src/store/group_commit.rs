//! Group commit: writers whose writes are made share one fsync.
//!
//! A writer counts itself in (`writing`) before it takes its write lock and gets a ticket when its
//! write is made (`Writing::done`); then it waits until a sync covers its ticket
//! (`wait_durable`). The first writer to wait syncs for everyone written so far, after waiting up
//! to `max_wait` for writers still in the middle of their writes to join; the others wait for it.
//! A writer alone never waits: nobody else is writing. Writes reach the WAL in ticket order (they
//! are made under the caller's write lock), so a sync after ticket `t` was made covers every
//! ticket up to `t`.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct GroupCommit {
    state: Mutex<State>,
    changed: Condvar,
    max_wait: Duration,
}

#[derive(Default)]
struct State {
    /// Tickets handed out: writes made.
    written: u64,
    /// Every ticket up to this one is durable.
    synced: u64,
    /// A writer is syncing (or waiting for others to join its sync).
    syncing: bool,
    /// Writers counted in and not yet done.
    writing: usize,
}

/// A writer counted in; `done` hands out its ticket. Dropped without `done` (a failed write), it
/// counts itself out and holds up no sync.
pub struct Writing<'a> {
    group: &'a GroupCommit,
    counted: bool,
}

impl GroupCommit {
    pub fn new(max_wait: Duration) -> Self {
        Self { state: Mutex::new(State::default()), changed: Condvar::new(), max_wait }
    }

    /// Counts a writer in, before it takes its write lock.
    pub fn writing(&self) -> Writing<'_> {
        self.lock().writing += 1;
        Writing { group: self, counted: true }
    }

    /// Returns once a sync covers `ticket`: `sync` runs here when no other writer is syncing. A
    /// failed sync is this writer's error; a writer that waited for it tries again itself.
    pub fn wait_durable<E>(&self, ticket: u64, sync: impl Fn() -> Result<(), E>) -> Result<(), E> {
        let mut state = self.lock();
        loop {
            if state.synced >= ticket {
                return Ok(());
            }
            if state.syncing {
                state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.syncing = true;
            let deadline = Instant::now() + self.max_wait;
            while state.writing > 0 {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                state = self.changed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            }
            let target = state.written;
            drop(state);
            let synced = sync();
            state = self.lock();
            state.syncing = false;
            if synced.is_ok() {
                state.synced = state.synced.max(target);
            }
            self.changed.notify_all();
            synced?;
        }
    }

    /// Tickets handed out and tickets synced, for tests and logs.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.written, state.synced)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Writing<'_> {
    /// The write is made: its ticket, for `wait_durable`.
    pub fn done(mut self) -> u64 {
        self.counted = false;
        let mut state = self.group.lock();
        state.writing -= 1;
        state.written += 1;
        let ticket = state.written;
        drop(state);
        self.group.changed.notify_all();
        ticket
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.group.lock().writing -= 1;
            self.group.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    use super::*;

    #[test]
    fn a_writer_alone_syncs_at_once_and_each_ticket_once() {
        let group = GroupCommit::new(Duration::from_secs(60));
        let syncs = AtomicUsize::new(0);
        let sync = || -> Result<(), ()> {
            syncs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        let started = Instant::now();
        let ticket = group.writing().done();
        group.wait_durable(ticket, sync).unwrap();
        group.wait_durable(ticket, sync).unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 1, "a synced ticket is not synced again");
        assert!(started.elapsed() < Duration::from_secs(30), "nobody else was writing: no wait");
        assert_eq!(group.counts(), (1, 1));
    }

    /// Eight writers made their writes before any waited: one sync covers them all.
    #[test]
    fn writers_that_wait_together_share_one_sync() {
        let group = Arc::new(GroupCommit::new(Duration::from_millis(200)));
        let syncs = Arc::new(AtomicUsize::new(0));
        let made = Arc::new(Barrier::new(8));
        let writers: Vec<_> = (0..8)
            .map(|_| {
                let (group, syncs, made) = (group.clone(), syncs.clone(), made.clone());
                std::thread::spawn(move || {
                    let ticket = group.writing().done();
                    made.wait();
                    group.wait_durable(ticket, || -> Result<(), ()> {
                        syncs.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap().unwrap();
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 1);
        assert_eq!(group.counts(), (8, 8));
    }

    /// A writer in the middle of its write when another syncs is waited for (within the bound),
    /// and its write shares the sync.
    #[test]
    fn a_sync_waits_for_a_writer_in_the_middle_of_its_write() {
        let group = Arc::new(GroupCommit::new(Duration::from_secs(60)));
        let syncs = Arc::new(AtomicUsize::new(0));
        let first = group.writing().done();
        let second = group.writing();
        let leader = {
            let (group, syncs) = (group.clone(), syncs.clone());
            std::thread::spawn(move || {
                group.wait_durable(first, || -> Result<(), ()> {
                    syncs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(syncs.load(Ordering::SeqCst), 0, "the sync waits for the writer in progress");
        let ticket = second.done();
        leader.join().unwrap().unwrap();
        assert_eq!(group.counts(), (2, 2), "the second write shared the first one's sync");
        group.wait_durable(ticket, || -> Result<(), ()> { panic!("already synced") }).unwrap();
    }

    /// A failed sync is the error of the writer that ran it; the ticket stays unsynced, and the
    /// next wait syncs again.
    #[test]
    fn a_failed_sync_is_tried_again_by_the_next_wait() {
        let group = GroupCommit::new(Duration::ZERO);
        let ticket = group.writing().done();
        assert_eq!(group.wait_durable(ticket, || Err("disk full")), Err("disk full"));
        assert_eq!(group.counts(), (1, 0));
        group.wait_durable(ticket, || Ok::<(), &str>(())).unwrap();
        assert_eq!(group.counts(), (1, 1));
    }

    /// A writer whose write failed counts itself out: a sync does not wait the bound for it.
    #[test]
    fn a_failed_write_holds_up_no_sync() {
        let group = GroupCommit::new(Duration::from_secs(60));
        let ticket = group.writing().done();
        drop(group.writing());
        let started = Instant::now();
        group.wait_durable(ticket, || Ok::<(), ()>(())).unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
