//! Partition bounds for the listing anyone may read (`GET /topics`), at most `max_age` old: a
//! flood of anonymous listings costs the log one round trip per partition per `max_age` (on
//! Kafka a `fetch_watermarks` each), not one per request (issue 40, item 5). Subscriptions,
//! offsets and gaps never use it: they read the log's bounds as they are.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::backend::{BackendError, LogBackend, PartitionBounds};
use super::names::TopicPartition;

/// Entries past which the stale ones are dropped at the next refresh: a listing's partitions
/// are bounded by the log's topics, but a topic deleted stays here until then.
const MAX_ENTRIES: usize = 100_000;

pub struct BoundsCache {
    max_age: Duration,
    entries: Mutex<HashMap<TopicPartition, (PartitionBounds, Instant)>>,
    /// One refresh at a time: requests that miss together ask the log once, not once each.
    refreshing: tokio::sync::Mutex<()>,
}

impl BoundsCache {
    pub fn new(max_age: Duration) -> Self {
        Self { max_age, entries: Mutex::new(HashMap::new()), refreshing: tokio::sync::Mutex::new(()) }
    }

    /// The partition's bounds as the log answered them at most `max_age` ago.
    pub async fn bounds(&self, backend: &dyn LogBackend, tp: &TopicPartition) -> Result<PartitionBounds, BackendError> {
        self.bounds_read_by(tp, || backend.log_bounds(tp)).await
    }

    /// `bounds`, reading them with `read` when they are too old.
    async fn bounds_read_by<F>(&self, tp: &TopicPartition, read: impl FnOnce() -> F) -> Result<PartitionBounds, BackendError>
    where
        F: std::future::Future<Output = Result<PartitionBounds, BackendError>>,
    {
        if let Some(bounds) = self.fresh(tp) {
            return Ok(bounds);
        }
        let _one = self.refreshing.lock().await;
        if let Some(bounds) = self.fresh(tp) {
            return Ok(bounds);
        }
        let bounds = read().await?;
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, (_, at)| at.elapsed() < self.max_age);
        }
        entries.insert(tp.clone(), (bounds, Instant::now()));
        Ok(bounds)
    }

    fn fresh(&self, tp: &TopicPartition) -> Option<PartitionBounds> {
        let entries = self.entries.lock().unwrap();
        entries.get(tp).filter(|(_, at)| at.elapsed() < self.max_age).map(|(bounds, _)| *bounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::names::TopicName;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_listing_asks_the_log_once_per_max_age() {
        let tp = TopicPartition::new(TopicName::parse("t").unwrap(), 0);
        let asked = Arc::new(AtomicUsize::new(0));
        let read = || {
            let asked = asked.clone();
            async move {
                asked.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await; // the others arrive meanwhile
                Ok(PartitionBounds { log_start: 0, log_end: 7 })
            }
        };
        let cache = BoundsCache::new(Duration::from_secs(3600));
        // Sixteen listings at once: one of them asks the log, the others take its answer.
        let listings = (0..16).map(|_| cache.bounds_read_by(&tp, read));
        for bounds in futures_util::future::join_all(listings).await {
            assert_eq!(bounds.unwrap().log_end, 7);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        // Nothing is kept when no age is allowed, and an error is not kept either.
        let uncached = BoundsCache::new(Duration::ZERO);
        for _ in 0..3 {
            uncached.bounds_read_by(&tp, read).await.unwrap();
        }
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        let failing = BoundsCache::new(Duration::from_secs(3600));
        assert!(failing.bounds_read_by(&tp, || async { Err(BackendError::Unavailable("down".into())) }).await.is_err());
        assert_eq!(failing.bounds_read_by(&tp, read).await.unwrap().log_end, 7);
    }
}
