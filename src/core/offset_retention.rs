//! Retention of committed offsets: clients absent longer than `offsets.retention_secs` lose
//! them, judged by the stored `updated_at` only (KAFKA-8069: a reload must never look like
//! activity, nor shorten what is left), and offsets above the log end are lowered.

use super::names::{ClientId, OffsetKey};
use super::offsets::{OffsetEpoch, OffsetFilter, OffsetRecord, OffsetStore, StoreError, UNKNOWN_TIME};

/// True when a record has not been written for longer than `retention_ms`. Computed from the
/// stored `updated_at` only, never from when the record was loaded; an unknown time never expires.
fn is_expired(record: &OffsetRecord, now_ms: u64, retention_ms: u64) -> bool {
    record.updated_at != UNKNOWN_TIME && now_ms.saturating_sub(record.updated_at) > retention_ms
}

/// A committed offset above its partition's log end is never trusted (the log lost its tail in
/// a power loss, or the topic was recreated outside ackgate): it would skip the events published
/// next at the reused offsets. It is lowered to `log_end`, logged with the key and both numbers,
/// and counted (the caller logs: boot alignment may lower millions and logs a summary). Besides
/// the admin reset, the only way an offset goes down. In the record's next offset epoch, at least
/// `min_epoch` (the first of the partition's log epoch, when a lost tail is known).
pub fn lower_to_log_end(store: &dyn OffsetStore, key: &OffsetKey, log_end: u64, min_epoch: OffsetEpoch, now_ms: u64) -> Result<OffsetRecord, StoreError> {
    super::metrics::offsets_above_log_end().increment(1);
    store.reset(key, log_end, min_epoch, now_ms)
}

/// Removes the offsets of clients that stayed away longer than `retention_ms` (0: never).
/// Clients for which `is_live` answers true (a live session on this instance) never expire.
/// Returns how many went.
pub fn sweep_expired_offsets(store: &dyn OffsetStore, now_ms: u64, retention_ms: u64, is_live: impl Fn(&ClientId) -> bool) -> Result<usize, StoreError> {
    if retention_ms == 0 {
        return Ok(0);
    }
    let mut expired = Vec::new();
    store.scan_each(&OffsetFilter::default(), &mut |key, record| {
        if is_expired(&record, now_ms, retention_ms) {
            expired.push((key, record.updated_at));
        }
    })?;
    // Asked after the scan: `is_live` takes the session registry's lock. A client may still
    // connect between here and the removal: its subscribe touches (or writes) its records first,
    // and a record changed since the scan is not removed.
    expired.retain(|(key, _)| !is_live(&key.client_id));
    store.remove_unchanged(&expired)
}

/// Marks every stored offset of `clients` as seen at `now_ms` (one client-prefix scan each, then
/// one batch), so retention counts from then. Returns how many records were touched.
pub fn touch_client_offsets(store: &dyn OffsetStore, clients: &[ClientId], now_ms: u64) -> Result<usize, StoreError> {
    let mut keys = Vec::new();
    for client in clients {
        let filter = OffsetFilter { client_id: Some(client.clone()), ..Default::default() };
        store.scan_each(&filter, &mut |key, _| keys.push(key))?;
    }
    if keys.is_empty() {
        return Ok(0);
    }
    store.touch(&keys, now_ms)
}

/// How often live clients' offsets are marked as seen: a quarter of the retention, at most a
/// minute, so a client live when the gateway dies has nearly all of its retention after it
/// (KAFKA-8069: a restart must never shorten it). `None` when offsets never expire.
pub fn live_touch_period_ms(retention_ms: u64) -> Option<u64> {
    (retention_ms > 0).then(|| (retention_ms / 4).clamp(1, 60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_uses_stored_time_and_never_expires_unknown_time() {
        let day = 86_400_000;
        let at = |updated_at| OffsetRecord { committed: 1, last_acked: Some(0), updated_at, epoch: 0 };
        assert!(!is_expired(&at(UNKNOWN_TIME), u64::MAX, day), "sentinel must never expire (KAFKA-8069)");
        assert!(!is_expired(&at(10 * day), 10 * day + day, day));
        assert!(is_expired(&at(10 * day), 10 * day + day + 1, day));
        // A clock behind the stored time (skew) is not an expiry.
        assert!(!is_expired(&at(10 * day), 0, day));
    }
}
