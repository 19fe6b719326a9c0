//! Redrive side of a session (`core::redrive`): starting a scan of the client's marked dead
//! letters on a subscribed topic, delivering what it reads as `redrive: true` events, and
//! removing a dead letter once its redelivery is acknowledged.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Session;
use crate::core::client_state::{EventRef, REDRIVE_SLOT};
use crate::core::dead_letters::DeadLetterId;
use crate::core::in_flight::Delivery;
use crate::core::names::{OffsetKey, TopicName};
use crate::core::protocol::FrameError;
use crate::core::redrive::{blocking, scan_redrives, RedriveScan};
use crate::core::session_control::RedrivenEvent;
use crate::core::FastMap;

/// What a session keeps about redrives; boxed in the session, since most never see one.
#[derive(Default)]
pub(super) struct Redrives {
    /// Topics whose scan runs, each with whether another scan was asked for meanwhile.
    scanning: FastMap<TopicName, bool>,
    /// The attempts recorded with each in-flight redriven event's dead letter: a redrive that is
    /// given up on again records them plus its own.
    in_flight: FastMap<EventRef, u32>,
}

impl Redrives {
    pub(super) fn prior_attempts(&self, at: &EventRef) -> Option<u32> {
        self.in_flight.get(at).copied()
    }
}

impl Session {
    /// Scans the client's marked dead letters on `topic` (subscribed) and delivers them. A scan
    /// asked for while one runs starts when that one ends, so marks made meanwhile are seen.
    pub(super) fn start_redrive(&mut self, topic: &TopicName) {
        let Some(subscription) = self.subscriptions.get(topic) else { return };
        let redrives = self.redrives.get_or_insert_with(Default::default);
        if let Some(again) = redrives.scanning.get_mut(topic) {
            *again = true;
            return;
        }
        redrives.scanning.insert(topic.clone(), false);
        let slot = subscription.slot | REDRIVE_SLOT;
        let skip = redrives.in_flight.keys().filter(|at| at.slot == slot).map(|at| (at.partition, at.offset)).collect();
        let scan = RedriveScan { topic: topic.clone(), client_id: self.info.client_id.clone(), subscription: subscription.id, skip };
        let (d, window, control, cancel) = (self.d.clone(), self.window.clone(), self.control.clone(), subscription.cancel.clone());
        self.d.tasks.spawn(scan_redrives(d, scan, window, control, cancel));
    }

    pub(super) fn on_redrive_scanned(&mut self, topic: &TopicName, subscription: u64) {
        if self.subscriptions.get(topic).is_none_or(|s| s.id != subscription) {
            return; // a scan of a subscription that ended (its state went with it)
        }
        let again = self.redrives.as_mut().and_then(|r| r.scanning.remove(topic));
        if again == Some(true) {
            self.start_redrive(topic);
        }
    }

    /// A dead letter read again becomes an in-flight delivery (attempt 1) and an event frame.
    pub(super) fn on_redriven(&mut self, redriven: RedrivenEvent) {
        let RedrivenEvent { topic, subscription, dead, event, permit } = redriven;
        let Some(current) = self.subscriptions.get(&topic).filter(|s| s.id == subscription) else {
            return; // its subscription ended: the mark stays for the next one
        };
        let ack_timeout = current.redelivery.ack_timeout;
        let at = EventRef { slot: current.slot | REDRIVE_SLOT, partition: dead.partition, offset: dead.offset };
        if self.in_flight.get(&at).is_some() {
            return; // a second scan found it in flight already
        }
        let seq = self.d.next_seqs(1);
        self.push_event(&topic, seq, 1, &event, at);
        let (delivered_at, now_ms) = (Instant::now(), self.d.clock.now_ms());
        self.in_flight.insert(at, Delivery { seq, topic, attempt: 1, event, delivered_at, permit }, ack_timeout, delivered_at, now_ms);
        self.redrives.get_or_insert_with(Default::default).in_flight.insert(at, dead.attempts);
        self.d.metrics.delivered(1);
        self.info.stats.delivered.fetch_add(1, Ordering::Relaxed);
        self.info.stats.in_flight.store(self.in_flight.len(), Ordering::Relaxed);
    }

    /// The attempts recorded with a redriven event's dead letter (it leaves the session's view).
    pub(super) fn take_prior_attempts(&mut self, at: &EventRef) -> u32 {
        self.redrives.as_mut().and_then(|r| r.in_flight.remove(at)).unwrap_or(0)
    }

    /// Acknowledged redriven events: their dead letters go, durably, before the ack is answered
    /// (those no longer marked stay as they are: settled already).
    pub(super) async fn settle_redriven(&mut self, acked: Vec<(EventRef, TopicName)>) -> Result<(), FrameError> {
        let mut ids = Vec::with_capacity(acked.len());
        for (at, topic) in acked {
            self.take_prior_attempts(&at);
            ids.push(DeadLetterId { key: OffsetKey::new(topic, self.info.client_id.clone(), at.partition), offset: at.offset });
        }
        let store = self.d.store.clone();
        let settled = blocking(move || ids.iter().try_for_each(|id| store.settle_redrive(id, None))).await;
        settled.map_err(|e| FrameError::unavailable("the offset store", e))
    }

    /// Forgets the redrive state of a topic whose subscription ends (its marks stay stored).
    pub(super) fn release_redrives(&mut self, topic: &TopicName, slot: u32) {
        if let Some(redrives) = self.redrives.as_mut() {
            redrives.scanning.remove(topic);
            redrives.in_flight.retain(|at, _| at.slot != slot | REDRIVE_SLOT);
        }
        self.in_flight.release_slot(slot | REDRIVE_SLOT);
    }
}
