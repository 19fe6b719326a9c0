//! The deferred broker ACK of POP mode: a task acknowledges popped messages at the master that
//! popped them once every live client reading their partition here has a durable committed
//! offset past them, and extends the invisible time of the ones still owed.

use std::time::Duration;

use futures_util::StreamExt;

use super::pop::Handle;
use super::RocketMqLog;
use crate::core::clock::{Clock, SystemClock};
use crate::core::names::TopicPartition;

/// How often the broker-ack task runs when no ack wakes it.
const BROKER_ACK_PERIOD: Duration = Duration::from_millis(200);
/// Attempts of one broker ACK before it is counted as failed (the broker then revives it).
const BROKER_ACK_ATTEMPTS: u32 = 3;
/// Broker ACKs (and invisible-time changes) a settle round keeps in flight at once.
const BROKER_REQUESTS_IN_FLIGHT: usize = 16;
/// A failed invisible-time extension is tried again after this pause.
const EXTEND_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long a graceful shutdown waits for its last round of broker ACKs.
const SETTLE_AT_EXIT: Duration = Duration::from_secs(5);

impl RocketMqLog {
    /// The last round, at graceful shutdown (every session ended, its writes durable): after the
    /// round in progress, if any (so that no ACK of it is cut off by the exit), ACKs only, each
    /// wait bounded; then the settle task stops.
    pub(super) async fn settle_at_exit(&self) {
        let owed = self.ledger.len();
        match tokio::time::timeout(SETTLE_AT_EXIT, self.settling.lock()).await {
            Ok(one_round) => {
                if tokio::time::timeout(SETTLE_AT_EXIT, self.settle_round(false)).await.is_err() {
                    tracing::warn!(timeout = ?SETTLE_AT_EXIT, "the last broker ACKs did not finish; the broker revives what they were for");
                }
                drop(one_round);
            }
            Err(_) => tracing::warn!(timeout = ?SETTLE_AT_EXIT, "the settle round in progress did not finish; no last round"),
        }
        self.stop.cancel();
        tracing::info!(handles_before = owed, handles_left = self.ledger.len(), "last broker ACKs sent (POP)");
    }

    /// One round of broker ACKs and invisible-time extensions; one round at a time.
    async fn settle_handles(&self) {
        let _one_round = self.settling.lock().await;
        if self.stop.is_cancelled() {
            return; // after the last round (`settle_at_exit`)
        }
        self.settle_round(true).await;
    }

    /// A round, under the `settling` lock; `extend`: also keep the handles still owed invisible.
    async fn settle_round(&self, extend: bool) {
        let Some(floor) = self.ack_floor.get() else { return };
        crate::core::metrics::rocketmq_pending_handles().set(self.ledger.len() as f64);
        let tps = self.ledger.partitions();
        if tps.is_empty() {
            return;
        }
        // The floors read the offset store: off the async workers.
        let floor = floor.clone();
        let floors = match tokio::task::spawn_blocking(move || floor.floors(&tps)).await {
            Ok(floors) => floors,
            Err(e) => {
                tracing::warn!(error = %e, "reading the ack floors failed");
                return;
            }
        };
        let now = SystemClock.now_ms();
        let invisible_ms = self.settings.invisible_time.as_millis() as u64;
        let due = self.ledger.due(&floors, now, invisible_ms / 2);
        // Several requests in flight: one round trip per handle, one after another, held the
        // ledger back behind the broker's latency.
        futures_util::stream::iter(due.ack).for_each_concurrent(BROKER_REQUESTS_IN_FLIGHT, |handle| self.ack_at_broker(handle)).await;
        if !extend {
            return;
        }
        futures_util::stream::iter(due.extend)
            .for_each_concurrent(BROKER_REQUESTS_IN_FLIGHT, |(tp, offset, handle)| async move { self.extend(&tp, offset, handle).await })
            .await;
    }

    async fn ack_at_broker(&self, handle: Handle) {
        let Some(addr) = self.broker_addr_of_handle(&handle).await else {
            // Dropped: the broker revives the message, and whoever pops it again settles it.
            crate::core::metrics::rocketmq_broker_acks("failed").increment(1);
            return;
        };
        for attempt in 1..=BROKER_ACK_ATTEMPTS {
            match self.broker.ack(&addr, &self.settings.consumer_group, &handle.topic, handle.queue_id, &handle.extra_info, handle.queue_offset).await {
                Ok(()) => {
                    crate::core::metrics::rocketmq_broker_acks("acked").increment(1);
                    return;
                }
                Err(e) if attempt < BROKER_ACK_ATTEMPTS => {
                    crate::core::metrics::rocketmq_broker_acks("retried").increment(1);
                    tracing::warn!(topic = %handle.topic, queue = handle.queue_id, offset = handle.queue_offset, attempt, error = %e, "broker ACK failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                }
                Err(e) => {
                    crate::core::metrics::rocketmq_broker_acks("failed").increment(1);
                    tracing::error!(topic = %handle.topic, queue = handle.queue_id, offset = handle.queue_offset, error = %e, "broker ACK failed; the broker will redeliver the message (clients that acked it do not get it again)");
                }
            }
        }
    }

    async fn extend(&self, tp: &TopicPartition, offset: u64, handle: Handle) {
        let Some(addr) = self.broker_addr_of_handle(&handle).await else {
            crate::core::metrics::rocketmq_invisible_extensions("failed").increment(1);
            let retry_extend_at = SystemClock.now_ms() + EXTEND_RETRY_PAUSE.as_millis() as u64;
            self.ledger.replace(tp, offset, &handle, Handle { retry_extend_at, ..handle.clone() });
            return;
        };
        let invisible = self.settings.invisible_time;
        let changed = self
            .broker
            .change_invisible_time(&addr, &self.settings.consumer_group, &handle.topic, handle.queue_id, &handle.extra_info, handle.queue_offset, invisible)
            .await;
        match changed {
            Ok((pop_time, revive_qid)) => {
                crate::core::metrics::rocketmq_invisible_extensions("ok").increment(1);
                let fields: Vec<&str> = handle.extra_info.split(' ').collect();
                let (marker, broker_name) = (fields.get(4).copied().unwrap_or("0"), fields.get(5).copied().unwrap_or_default());
                // The new checkpoint covers this one message: its start offset is the message's.
                let extra_info = format!(
                    "{} {pop_time} {} {revive_qid} {marker} {broker_name} {} {}",
                    handle.queue_offset,
                    invisible.as_millis(),
                    handle.queue_id,
                    handle.queue_offset
                );
                let new = Handle { extra_info, invisible_until: pop_time + invisible.as_millis() as u64, retry_extend_at: 0, ..handle.clone() };
                self.ledger.replace(tp, offset, &handle, new);
            }
            Err(e) => {
                crate::core::metrics::rocketmq_invisible_extensions("failed").increment(1);
                tracing::warn!(%tp, offset, error = %e, "extending a popped message's invisible time failed; the broker may redeliver it");
                // Not again every round: once more after a pause, while the handle is still valid.
                let retry_extend_at = SystemClock.now_ms() + EXTEND_RETRY_PAUSE.as_millis() as u64;
                self.ledger.replace(tp, offset, &handle, Handle { retry_extend_at, ..handle.clone() });
            }
        }
    }

    /// The master that popped a handle: its extra info names the broker (ACKs and invisible-time
    /// changes are valid only there; its retry topic lives there too).
    async fn broker_addr_of_handle(&self, handle: &Handle) -> Option<String> {
        let Some(broker) = handle.extra_info.split(' ').nth(5).filter(|b| !b.is_empty()) else {
            tracing::warn!(topic = %handle.topic, extra_info = %handle.extra_info, "a receipt handle names no broker");
            return None;
        };
        let known = self.broker_addrs.lock().unwrap().get(broker).cloned();
        if known.is_some() {
            return known;
        }
        match self.broker.brokers().await {
            Ok(brokers) => {
                let mut addrs = self.broker_addrs.lock().unwrap();
                addrs.extend(brokers);
                let found = addrs.get(broker).cloned();
                if found.is_none() {
                    tracing::warn!(topic = %handle.topic, broker, "the broker named by a receipt handle is not in the cluster");
                }
                found
            }
            Err(e) => {
                tracing::warn!(topic = %handle.topic, broker, error = %e, "no broker address for a receipt handle");
                None
            }
        }
    }
}

/// Acknowledges handles at the broker as clients' acks become durable, and extends the ones
/// still owed.
pub(super) fn spawn_broker_acks(log: std::sync::Weak<RocketMqLog>) {
    tokio::spawn(async move {
        loop {
            let Some(this) = log.upgrade() else { return };
            this.settle_handles().await;
            let stop = this.stop.clone();
            let woken = async {
                this.acked.notified().await;
                // Let a burst of acks collect into one round.
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = woken => {}
                _ = tokio::time::sleep(BROKER_ACK_PERIOD) => {}
            }
        }
    });
}
