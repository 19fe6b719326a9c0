//! Messages to a running session from outside its task (takeover, an operator's disconnect, the
//! admin route that describes its deliveries) and the inbox that carries them.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

use super::dispatcher::InFlightView;

/// Messages to a running session from outside its task.
#[derive(Debug)]
pub enum SessionControl {
    /// A newer connection of the same client took over: close with 4001.
    TakenOver,
    /// An operator asked to disconnect it: close with 4002.
    Disconnect,
    /// Describe the in-flight deliveries.
    Describe(tokio::sync::oneshot::Sender<Vec<InFlightView>>),
}

/// A session's queue of `SessionControl` messages and its wake-up. Not a tokio channel: one of
/// those allocates ~1 KiB per session up front (heaptrack, README "Where the memory goes") for
/// messages that almost never come.
pub struct ControlInbox {
    /// `None` once the session stopped reading it.
    queue: Mutex<Option<VecDeque<SessionControl>>>,
    wake: Notify,
}

impl ControlInbox {
    pub fn new() -> Self {
        Self { queue: Mutex::new(Some(VecDeque::new())), wake: Notify::new() }
    }

    /// False when the session no longer reads its messages.
    pub fn send(&self, message: SessionControl) -> bool {
        match self.queue.lock().unwrap().as_mut() {
            Some(queue) => queue.push_back(message),
            None => return false,
        }
        self.wake.notify_one();
        true
    }

    /// The next message. Cancel-safe: a message is taken only in the poll that returns it.
    pub async fn recv(&self) -> SessionControl {
        loop {
            // A `send` between this check and the wait leaves a permit in `wake`: not lost.
            if let Some(message) = self.queue.lock().unwrap().as_mut().and_then(VecDeque::pop_front) {
                return message;
            }
            self.wake.notified().await;
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
        assert!(inbox.send(SessionControl::Disconnect));
        assert!(inbox.send(SessionControl::TakenOver));
        assert!(matches!(inbox.recv().await, SessionControl::Disconnect));
        assert!(matches!(inbox.recv().await, SessionControl::TakenOver));
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
}
