//! A log end found below a committed offset. Either the log lost its tail (a power loss with an
//! unsynced log, a topic recreated outside ackgate) and the offset must come down to the end, or
//! the broker answered low for a moment (Kafka's high watermark right after a leader change) and
//! lowering would be durable damage: every offset lowered is an offset whose events the client
//! acknowledged and gets again. So a low end is read a second time, `RECHECK` later, and an
//! offset is lowered only when both reads put the end below it.

use std::time::Duration;

use super::backend::{BackendError, LogBackend, PartitionBounds};
use super::names::TopicPartition;

/// How long a low log end is given to come back before offsets above it are lowered.
const RECHECK: Duration = Duration::from_secs(1);

/// The bounds of `tps` read again after `RECHECK` (one wait for all of them).
pub async fn read_again(backend: &dyn LogBackend, tps: &[TopicPartition]) -> Result<Vec<PartitionBounds>, BackendError> {
    if tps.is_empty() {
        return Ok(Vec::new());
    }
    tokio::time::sleep(RECHECK).await;
    let mut bounds = Vec::with_capacity(tps.len());
    for tp in tps {
        bounds.push(backend.log_bounds(tp).await?);
    }
    Ok(bounds)
}

/// Logs and counts a log end that was low on the first read and not on the second.
pub fn transient(tp: &TopicPartition, first: u64, second: u64) {
    tracing::warn!(%tp, first_log_end = first, log_end = second, "the log end was low for a moment: committed offsets kept");
    super::metrics::transient_log_ends().increment(1);
}
