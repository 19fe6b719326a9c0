//! Dead-letter redrive (docs/protocol.md `POST /admin/dead-letters/redrive`): dead letters an operator
//! marked are read from the log again and handed to the client's session, which delivers them as
//! events with `"redrive": true` outside its committed floor (`client_state::REDRIVE_SLOT`).
//!
//! The marks live in the offset store until each redelivery is settled, so a client that is
//! offline now gets its redrives at its next subscribe, after a restart too. One scan per
//! subscribed topic of a session walks the client's marks a page at a time; it takes room in the
//! session's window before it hands an event over, so a large redrive never floods a session.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::backend::ReadFrom;
use super::dead_letters::{DeadLetter, DeadLetterId};
use super::dispatcher::Dispatcher;
use super::names::{ClientId, TopicName, TopicPartition};
use super::offsets::StoreError;
use super::session_control::{ControlInbox, RedrivenEvent, SessionControl};
use super::window::Window;
use super::FastSet;

/// Marks read from the store at a time.
const PAGE: usize = 64;
/// How long one read of a dead letter's event may wait for the log (a Kafka catch-up fetch).
const READ_WAIT: Duration = Duration::from_secs(1);
/// The reason a mark is dropped with when the log no longer holds its event.
const GONE_FROM_LOG: &str = "redrive: the log no longer holds this event";
/// The reason a dead letter of an older log epoch keeps (issue 39, item 6).
const FROM_A_LOST_TAIL: &str = "redrive: the log lost its tail since this event was read; it now holds another event at this offset";

/// One scan of a client's redrive marks on one topic, for one subscription of a session.
pub struct RedriveScan {
    pub topic: TopicName,
    pub client_id: ClientId,
    pub subscription: u64,
    /// `(partition, offset)` of the redriven events the session has in flight already.
    pub skip: FastSet<(u32, u64)>,
}

/// Runs one scan, then tells the session it ended (`RedriveScanned`). Stops when `cancel` fires
/// (the subscription ended) or the session stops reading its inbox.
pub async fn scan_redrives(d: Arc<Dispatcher>, scan: RedriveScan, window: Arc<Window>, control: Arc<ControlInbox>, cancel: CancellationToken) {
    let scanned = tokio::select! {
        _ = cancel.cancelled() => return,
        scanned = scan_marks(&d, &scan, &window, &control) => scanned,
    };
    if let Err(e) = scanned {
        // The marks stay: the next subscribe, or the next redrive request, scans again.
        tracing::warn!(client_id = %scan.client_id, topic = %scan.topic, error = %e, "redrive scan stopped; the dead letters stay marked");
    }
    control.send(SessionControl::RedriveScanned { topic: scan.topic, subscription: scan.subscription });
}

async fn scan_marks(d: &Dispatcher, scan: &RedriveScan, window: &Window, control: &ControlInbox) -> Result<(), String> {
    let mut after: Option<DeadLetterId> = None;
    loop {
        let (store, topic, client, from) = (d.store.clone(), scan.topic.clone(), scan.client_id.clone(), after.clone());
        let page = blocking(move || store.redrives(&topic, &client, from.as_ref(), PAGE)).await?;
        let last_page = page.len() < PAGE;
        for dead in page {
            after = Some(dead.id());
            if scan.skip.contains(&(dead.partition, dead.offset)) {
                continue;
            }
            let tp = TopicPartition::new(scan.topic.clone(), dead.partition);
            // Read in a log that lost its tail since: whatever the log holds at its offset now is
            // another event. It stays a dead letter for the operator, never redriven.
            let log_epoch = d.store.log_epoch(&tp).map_err(|e| e.to_string())?.epoch;
            if dead.log_epoch < log_epoch {
                tracing::warn!(client_id = %dead.client_id, %tp, offset = dead.offset, dead_letter_log_epoch = dead.log_epoch, log_epoch, "a dead letter from before a lost log tail is not redriven");
                let again = DeadLetter { reason: FROM_A_LOST_TAIL.to_string(), at: d.clock.now_ms(), ..dead };
                let store = d.store.clone();
                blocking(move || store.settle_redrive(&again.id(), Some(&again))).await?;
                continue;
            }
            let read = match read_one(d, &tp, dead.offset).await {
                Ok(read) => read,
                Err(e) => {
                    // This mark stays for the next scan; the others go on.
                    tracing::warn!(client_id = %dead.client_id, %tp, offset = dead.offset, error = %e, "a dead letter could not be read for its redrive; it stays marked");
                    continue;
                }
            };
            match read {
                Read::Event(event) => {
                    let permit = window.acquire(event.size_bytes()).await;
                    let redriven = RedrivenEvent { topic: scan.topic.clone(), subscription: scan.subscription, dead, event: Arc::new(event), permit };
                    if !control.send(SessionControl::Redriven(Box::new(redriven))) {
                        return Ok(()); // the session ended
                    }
                }
                Read::Gone | Read::Undecodable => {
                    // It stays a dead letter, no longer marked, with a reason that says why.
                    let reason = if matches!(read, Read::Gone) { GONE_FROM_LOG.to_string() } else { dead.reason.clone() };
                    tracing::warn!(client_id = %dead.client_id, topic = %dead.topic, partition = dead.partition, offset = dead.offset, %reason, "a dead letter cannot be redriven");
                    let again = DeadLetter { reason, at: d.clock.now_ms(), ..dead };
                    let store = d.store.clone();
                    blocking(move || store.settle_redrive(&again.id(), Some(&again))).await?;
                }
            }
        }
        if last_page {
            return Ok(());
        }
    }
}

/// What the log holds at a dead letter's offset.
enum Read {
    Event(super::backend::Event),
    /// Retention (or compaction) removed it.
    Gone,
    Undecodable,
}

/// Reads the event at `offset`. An empty answer is not taken as "gone" (a Kafka catch-up read
/// may simply not have arrived within `READ_WAIT`): only an offset below the log start, or the
/// log answering with a later offset, is; anything else is an error, and the mark stays.
async fn read_one(d: &Dispatcher, tp: &TopicPartition, offset: u64) -> Result<Read, String> {
    let read = d.backend.poll(tp, ReadFrom::Offset(offset), 1, READ_WAIT).await.map_err(|e| e.to_string())?;
    match read.into_iter().next() {
        Some(event) if event.offset == offset && event.undecodable => Ok(Read::Undecodable),
        Some(event) if event.offset == offset => Ok(Read::Event(event)),
        Some(_) => Ok(Read::Gone),
        None if offset < d.backend.log_bounds(tp).await.map_err(|e| e.to_string())?.log_start => Ok(Read::Gone),
        None => Err(format!("no event read at offset {offset} within {READ_WAIT:?}")),
    }
}

/// A store call on the blocking pool (with `storage.durability = "power"` a write fsyncs).
pub async fn blocking<T: Send + 'static>(call: impl FnOnce() -> Result<T, StoreError> + Send + 'static) -> Result<T, String> {
    match tokio::task::spawn_blocking(call).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}
