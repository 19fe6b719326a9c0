//! Partition readers: one per `topic#partition` on this instance, shared by its subscribers.
//!
//! A reader pulls at the backend-managed cursor (`ReadFrom::PullCursor`, the pull layer) only while some
//! subscriber waits at the end of what was pulled, and keeps the last `capacity` events in a ring
//! buffer. Subscribers read from the buffer; one that is behind the buffer (slow, or starting from
//! an older committed offset) or ahead of it reads the log directly by offset (a catch-up read).
//! So a slow client never holds back the others, and memory per partition stays bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backend::{BackendError, Event, LogBackend, ReadFrom};
use super::names::{TopicName, TopicPartition};
use super::waiting::WaitingGuard;

/// How long one long poll of the backend waits for new events.
const PULL_WAIT: Duration = Duration::from_millis(500);
/// How long a subscriber waits at the end before looking again on its own.
const FETCH_RECHECK: Duration = Duration::from_millis(1000);

struct Buffer {
    /// Every event with an offset in `[covered_from, covered_to)` is in `events` (a log with
    /// offset gaps simply has fewer events). `covered_to` is the pull cursor.
    covered_from: u64,
    covered_to: u64,
    events: VecDeque<Arc<Event>>,
}

pub struct PartitionReader {
    tp: TopicPartition,
    backend: Arc<dyn LogBackend>,
    capacity: usize,
    batch: usize,
    buffer: Mutex<Buffer>,
    /// Woken when new events enter the buffer.
    pulled: Notify,
    /// Woken when a subscriber waits at the end.
    demand: Notify,
    waiting: AtomicUsize,
    pulled_events: metrics::Counter,
}

impl PartitionReader {
    /// The pull cursor as the reader sees it.
    pub fn pull_offset(&self) -> u64 {
        self.buffer.lock().unwrap().covered_to
    }

    /// Up to `max` events from `from` on, in offset order; waits when there are none yet.
    pub async fn fetch(&self, from: u64, max: usize) -> Result<Vec<Arc<Event>>, BackendError> {
        loop {
            let pulled = self.pulled.notified();
            tokio::pin!(pulled);
            pulled.as_mut().enable();
            let direct = {
                let buffer = self.buffer.lock().unwrap();
                if from >= buffer.covered_from && from < buffer.covered_to {
                    let first = buffer.events.partition_point(|e| e.offset < from);
                    let events: Vec<_> = buffer.events.range(first..).take(max).cloned().collect();
                    if !events.is_empty() {
                        return Ok(events);
                    }
                    false
                } else {
                    from != buffer.covered_to
                }
            };
            if direct {
                let events = self.backend.poll(&self.tp, ReadFrom::Offset(from), max, Duration::ZERO).await?;
                if !events.is_empty() {
                    return Ok(events.into_iter().map(Arc::new).collect());
                }
            }
            let _waiting = WaitingGuard::new(&self.waiting);
            self.demand.notify_one();
            let _ = tokio::time::timeout(FETCH_RECHECK, pulled).await;
        }
    }

    async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.demand.notified() => {}
            }
            while self.waiting.load(Ordering::SeqCst) > 0 && !cancel.is_cancelled() {
                let polled = tokio::select! {
                    _ = cancel.cancelled() => return,
                    polled = self.backend.poll(&self.tp, ReadFrom::PullCursor, self.batch, PULL_WAIT) => polled,
                };
                match polled {
                    Ok(events) if events.is_empty() => {}
                    Ok(events) => {
                        self.pulled_events.increment(events.len() as u64);
                        self.append(events)
                    }
                    Err(e) => {
                        tracing::warn!(tp = %self.tp, error = %e, "pull failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
    }

    fn append(&self, events: Vec<Event>) {
        let mut buffer = self.buffer.lock().unwrap();
        let first = events[0].offset;
        if first < buffer.covered_to {
            // The cursor was moved back under us (a seek): the range restarts here.
            buffer.events.clear();
            buffer.covered_from = first;
        }
        let last = events[events.len() - 1].offset;
        buffer.events.extend(events.into_iter().map(Arc::new));
        buffer.covered_to = buffer.covered_to.max(last + 1);
        while buffer.events.len() > self.capacity {
            buffer.events.pop_front();
            let next = buffer.events.front().map_or(buffer.covered_to, |e| e.offset);
            buffer.covered_from = next;
        }
        drop(buffer);
        self.pulled.notify_waiters();
    }
}

/// One partition's reader and how many feeders hold it.
struct ReaderEntry {
    reader: Arc<PartitionReader>,
    cancel: CancellationToken,
    leases: usize,
}

type ReaderMap = Arc<Mutex<HashMap<TopicPartition, ReaderEntry>>>;

/// A feeder's hold on a partition reader. When the last lease of a reader is dropped the reader
/// stops and is forgotten with its buffer: a partition nobody reads costs nothing (the pull
/// cursor stays with the backend, so a new reader resumes where this one stopped).
pub struct ReaderLease {
    tp: TopicPartition,
    reader: Arc<PartitionReader>,
    map: ReaderMap,
}

impl std::ops::Deref for ReaderLease {
    type Target = PartitionReader;

    fn deref(&self) -> &PartitionReader {
        &self.reader
    }
}

impl Drop for ReaderLease {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap();
        let Some(entry) = map.get_mut(&self.tp).filter(|e| Arc::ptr_eq(&e.reader, &self.reader)) else { return };
        entry.leases -= 1;
        if entry.leases == 0 {
            entry.cancel.cancel();
            map.remove(&self.tp);
            self.reader.backend.stop_pulling(&self.tp);
        }
    }
}

/// All partition readers of this instance, created on first subscription and dropped when the
/// last subscriber of the partition goes.
pub struct Readers {
    backend: Arc<dyn LogBackend>,
    capacity: usize,
    batch: usize,
    readers: ReaderMap,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// `ackgate_pull_events_total`, shared by every reader.
    pulled_events: metrics::Counter,
}

impl Readers {
    pub fn new(
        backend: Arc<dyn LogBackend>,
        capacity: usize,
        batch: usize,
        shutdown: CancellationToken,
        tasks: TaskTracker,
        pulled_events: metrics::Counter,
    ) -> Self {
        Self { backend, capacity, batch, readers: Arc::new(Mutex::new(HashMap::new())), shutdown, tasks, pulled_events }
    }

    /// A lease on the reader of `tp`, started at the backend's pull cursor (or `log_start`) when new.
    pub fn get(&self, tp: &TopicPartition, log_start: u64) -> ReaderLease {
        let mut readers = self.readers.lock().unwrap();
        if let Some(entry) = readers.get_mut(tp) {
            entry.leases += 1;
            return ReaderLease { tp: tp.clone(), reader: entry.reader.clone(), map: self.readers.clone() };
        }
        let cursor = self.backend.pull_offset(tp).unwrap_or(log_start).max(log_start);
        self.backend.seek(tp, cursor);
        let reader = Arc::new(PartitionReader {
            tp: tp.clone(),
            backend: self.backend.clone(),
            capacity: self.capacity,
            batch: self.batch,
            buffer: Mutex::new(Buffer { covered_from: cursor, covered_to: cursor, events: VecDeque::new() }),
            pulled: Notify::new(),
            demand: Notify::new(),
            waiting: AtomicUsize::new(0),
            pulled_events: self.pulled_events.clone(),
        });
        let cancel = self.shutdown.child_token();
        self.tasks.spawn(reader.clone().run(cancel.clone()));
        readers.insert(tp.clone(), ReaderEntry { reader: reader.clone(), cancel, leases: 1 });
        ReaderLease { tp: tp.clone(), reader, map: self.readers.clone() }
    }

    /// Partitions with a running reader.
    pub fn len(&self) -> usize {
        self.readers.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops and forgets the readers of a deleted topic.
    pub fn remove_topic(&self, topic: &TopicName) {
        self.readers.lock().unwrap().retain(|tp, entry| {
            let keep = tp.topic != *topic;
            if !keep {
                entry.cancel.cancel();
            }
            keep
        });
    }
}
