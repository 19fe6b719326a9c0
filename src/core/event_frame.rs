//! An `event` frame written once per event and shared by every session that delivers it.
//!
//! A frame is the event's fields (topic, partition, offset, timestamp, key, headers, payload) plus
//! two that are each session's own: the delivery id and the attempt. The second delivery of an
//! event writes the shared parts into the event's `FrameCache`; every later one copies them around
//! its own id and attempt, instead of escaping and encoding the event again (a broadcast to 10,000
//! sessions writes each event twice, not 10,000 times). The first delivery writes its frame in
//! full: most events of a split go to one client only, and would pay for parts nobody shares.
//! `protocol::write_shared_event_frame` writes with it; the result is the same bytes as
//! `protocol::write_event_frame` (a property test there holds them equal). Apart from `protocol`,
//! which the events it caches for (`backend::Event`) do not depend on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The shared parts of an event's frame, once written. Empty when cloned (a clone may be changed:
/// its frame is written again), equal to any other (it is derived from the event's fields).
#[derive(Default)]
pub struct FrameCache {
    /// Delivered once already: the next delivery writes the shared parts.
    delivered: AtomicBool,
    parts: OnceLock<Box<SharedParts>>,
}

pub struct SharedParts {
    /// The topic they were written for: an event delivered under another name (none is today)
    /// is written in full.
    pub topic: Box<str>,
    /// From the end of the delivery id to the attempt's value.
    pub middle: Box<str>,
    /// After the attempt's value, to the end.
    pub tail: Box<str>,
}

impl FrameCache {
    /// `None` for the event's first delivery (its frame is written in full); the shared parts for
    /// every later one, written with `write` for the second.
    pub fn shared(&self, write: impl FnOnce() -> SharedParts) -> Option<&SharedParts> {
        if self.parts.get().is_none() && !self.delivered.swap(true, Ordering::Relaxed) {
            return None;
        }
        Some(self.parts.get_or_init(|| Box::new(write())))
    }
}

impl Clone for FrameCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for FrameCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for FrameCache {}

impl std::fmt::Debug for FrameCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.parts.get().is_some() { "FrameCache(written)" } else { "FrameCache(empty)" })
    }
}
