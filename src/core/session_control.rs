//! Messages to a running session from outside its task (takeover, an operator's disconnect, the
//! admin route that describes its deliveries) and the inbox that carries them.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

use super::backend::Event;
use super::client_state::DeliveryRef;
use super::dead_letters::DeadLetter;
use super::in_flight::InFlightView;
use super::names::TopicName;
use super::window::WindowPermit;

/// `Describe` requests a session may have waiting (more are answered "no answer" at once).
const DESCRIBES_QUEUED: usize = 16;

/// Messages to a running session from outside its task.
#[derive(Debug)]
pub enum SessionControl {
    /// A newer connection of the same client took over: close with 4001.
    TakenOver,
    /// An operator asked to disconnect it: close with 4002.
    Disconnect,
    /// Describe the in-flight deliveries.
    Describe(tokio::sync::oneshot::Sender<Vec<InFlightView>>),
    /// `topic` has `partitions` now (more than when the session subscribed): feed the new ones.
    PartitionsAdded { topic: TopicName, partitions: u32 },
    /// The instance is draining: send `reconnect` with `after_ms`, settle (no new events, wait up
    /// to `DeliverySettings::drain_settle` for the client's acks), then close with 1012.
    Drain { after_ms: u64 },
    /// An operator marked dead letters of this client on `topic` for redrive: scan for them.
    Redrive { topic: TopicName },
    /// A marked dead letter read again by a redrive scan: deliver it.
    Redriven(Box<RedrivenEvent>),
    /// The redrive scan of `topic` for subscription `subscription` ended.
    RedriveScanned { topic: TopicName, subscription: u64 },
    /// From a shared subscription the session is a member of (bounded by the member's window),
    /// run as `generation` (a message of a group the session left, or of an earlier run of it,
    /// is no longer its).
    Group { generation: u64, message: GroupMessage },
}

/// What a group sends a member session (through its `ControlInbox`).
#[derive(Debug)]
pub enum GroupMessage {
    /// Event frames for the member, each with its delivery id.
    Events { topic: TopicName, events: Vec<(DeliveryRef, String)> },
    /// Frames the hub answered the member's forwarded frames with (`ack_ok`, `error`), or sent to
    /// every member (`gap`).
    Frames(Vec<String>),
    /// Deliveries taken back from the member (their ack timed out; another member has them now).
    TakenBack(Vec<DeliveryRef>),
    /// The group's hub ended (the instance drains or shuts down, the log was truncated, the
    /// group moved to `moved_to`: its instance and `ws_url`): the member must subscribe again.
    Ended { topic: TopicName, moved_to: Option<(String, String)> },
}

/// A dead letter read again, with room in the session's window, on its way to the session.
#[derive(Debug)]
pub struct RedrivenEvent {
    pub topic: TopicName,
    /// The subscription whose scan read it: a later one (or none) drops it.
    pub subscription: u64,
    pub dead: DeadLetter,
    pub event: Arc<Event>,
    pub permit: WindowPermit,
}

/// A session's queue of `SessionControl` messages and its doorbell. Not a tokio channel: one of
/// those allocates ~1 KiB per session up front (heaptrack, README "Where the memory goes") for
/// messages that almost never come. The session polls only the doorbell (a flag and a waker, no
/// lock) on each pass of its loop; the queue is locked when the bell rang. The gateway's shutdown
/// rings it too (`ring`), so a session waits on no lock shared with every other session.
pub struct ControlInbox {
    /// `None` once the session stopped reading it.
    queue: Mutex<Option<VecDeque<SessionControl>>>,
    rung: AtomicBool,
    waker: AtomicWaker,
}

impl Default for ControlInbox {
    fn default() -> Self {
        Self::new()
    }
}

impl ControlInbox {
    pub fn new() -> Self {
        Self { queue: Mutex::new(Some(VecDeque::new())), rung: AtomicBool::new(false), waker: AtomicWaker::new() }
    }

    /// Wakes the session: it looks at its queue and at the gateway's shutdown.
    pub fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Ready once the bell rang since the last time this was ready. Cancel-safe: the ring is taken
    /// only by the poll that returns it.
    pub fn rung(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx: &mut Context<'_>| {
            if self.rung.swap(false, Ordering::AcqRel) {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // A ring between the check and the registration found no waker (or the old one).
            match self.rung.swap(false, Ordering::AcqRel) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
    }

    /// The next queued message, if any; with more behind it, the bell is rung again, so each
    /// pass of the session's loop handles one (as each pass flushes what it answered).
    pub fn try_recv(&self) -> Option<SessionControl> {
        let mut queue = self.queue.lock().unwrap();
        let queue = queue.as_mut()?;
        let message = queue.pop_front();
        if !queue.is_empty() {
            self.rung.store(true, Ordering::Release);
        }
        message
    }

    /// False when the session no longer reads its messages. Bounded, for a session stuck in an
    /// await while requests keep coming: a second close (`TakenOver`, `Disconnect`, `Drain`) is dropped
    /// (the first one ends the session), a `Describe` beyond `DESCRIBES_QUEUED` is dropped, so
    /// its asker hears at once that no answer comes, and a `PartitionsAdded` or `Redrive`
    /// replaces the one of its topic still waiting. Redriven events are bounded by the session's
    /// window (their scan takes room before it sends one).
    pub fn send(&self, message: SessionControl) -> bool {
        match self.queue.lock().unwrap().as_mut() {
            Some(queue) => {
                let describes = queue.iter().filter(|m| matches!(m, SessionControl::Describe(_))).count();
                let closes =
                    queue.iter().filter(|m| matches!(m, SessionControl::TakenOver | SessionControl::Disconnect | SessionControl::Drain { .. })).count();
                let keep = match &message {
                    SessionControl::Describe(_) => describes < DESCRIBES_QUEUED,
                    // At most one per topic waiting (a later count includes the earlier ones).
                    SessionControl::PartitionsAdded { topic, .. } => {
                        queue.retain(|m| !matches!(m, SessionControl::PartitionsAdded { topic: t, .. } if t == topic));
                        true
                    }
                    SessionControl::Redrive { topic } => {
                        queue.retain(|m| !matches!(m, SessionControl::Redrive { topic: t } if t == topic));
                        true
                    }
                    SessionControl::Redriven(_) | SessionControl::RedriveScanned { .. } | SessionControl::Group { .. } => true,
                    SessionControl::TakenOver | SessionControl::Disconnect | SessionControl::Drain { .. } => closes == 0,
                };
                if keep {
                    queue.push_back(message);
                }
            }
            None => return false,
        }
        self.ring();
        true
    }

    /// The next message, waiting for one (tests; the session uses `rung` and `try_recv`).
    #[cfg(test)]
    async fn recv(&self) -> SessionControl {
        loop {
            if let Some(message) = self.try_recv() {
                return message;
            }
            self.rung().await;
        }
    }

    /// The session stopped reading: later sends fail, and queued messages are dropped (a
    /// waiting `Describe` is answered "gone" at once).
    pub fn close(&self) {
        self.queue.lock().unwrap().take();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn control_inbox_delivers_in_order_and_drops_what_a_closed_session_leaves() {
        let inbox = Arc::new(ControlInbox::new());
        // Sent before anyone waits: kept, in order.
        let (first, _asked) = tokio::sync::oneshot::channel();
        assert!(inbox.send(SessionControl::Describe(first)));
        assert!(inbox.send(SessionControl::Disconnect));
        assert!(matches!(inbox.recv().await, SessionControl::Describe(_)));
        assert!(matches!(inbox.recv().await, SessionControl::Disconnect));
        // Sent while the session waits: wakes it.
        let waiting = tokio::spawn({
            let inbox = inbox.clone();
            async move { matches!(inbox.recv().await, SessionControl::TakenOver) }
        });
        tokio::task::yield_now().await;
        assert!(inbox.send(SessionControl::TakenOver));
        assert!(waiting.await.unwrap());
        // Closed: a queued Describe is dropped (its asker hears "gone" at once), later sends fail.
        let (reply, answer) = tokio::sync::oneshot::channel();
        assert!(inbox.send(SessionControl::Describe(reply)));
        inbox.close();
        assert!(answer.await.is_err());
        assert!(!inbox.send(SessionControl::Disconnect));
    }

    /// Issue 21, item 10: a session stuck in an await does not collect control messages without
    /// bound. Failed before the fix: 10,000 queued.
    #[tokio::test]
    async fn control_inbox_is_bounded_while_its_session_is_stuck() {
        let inbox = ControlInbox::new();
        let mut answers = Vec::new();
        for _ in 0..10_000 {
            let (reply, answer) = tokio::sync::oneshot::channel();
            assert!(inbox.send(SessionControl::Describe(reply)));
            assert!(inbox.send(SessionControl::Disconnect));
            answers.push(answer);
        }
        assert_eq!(inbox.queue.lock().unwrap().as_ref().unwrap().len(), DESCRIBES_QUEUED + 1);
        // The ones beyond the bound hear at once that no answer comes.
        assert!(answers.pop().unwrap().await.is_err());
    }
}
