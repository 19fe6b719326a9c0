//! Partition bounds for subscribe plans, read once for every plan that asks at the same time
//! (issue 41: a storm of sessions moving to this instance after another one died asked the
//! broker once per session and partition, and on Kafka the broker timed out under it).
//!
//! Unlike `BoundsCache` (the listing's, at most a second old), an answer here is never older
//! than the request: a plan may only take bounds read after it asked, or a client starting at
//! `latest` right after a publish could start before it. So a plan that finds a read in flight
//! waits for it to finish and for the next one, which starts after it asked and serves every
//! plan that queued meanwhile: a storm of N plans costs about two reads per partition, not N.
//! A read that fails as the broker being unavailable or slow is tried again before any client
//! hears `unavailable`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::backend::{BackendError, LogBackend, PartitionBounds};
use super::names::TopicPartition;

/// Pauses before the second and third read after a transient failure.
const RETRY_PAUSES: [Duration; 2] = [Duration::from_millis(200), Duration::from_millis(500)];
/// Partitions whose last answer is kept; past it the idle ones are dropped.
const MAX_ENTRIES: usize = 100_000;

/// The last read of one partition: its answer and when the read started.
type Slot = Arc<tokio::sync::Mutex<Option<(PartitionBounds, Instant)>>>;

#[derive(Default)]
pub struct BoundsReads {
    slots: Mutex<HashMap<TopicPartition, Slot>>,
}

impl BoundsReads {
    /// The bounds of `tp` as read after this call began.
    pub async fn bounds(&self, backend: &dyn LogBackend, tp: &TopicPartition) -> Result<PartitionBounds, BackendError> {
        self.bounds_read_by(tp, || backend.log_bounds(tp)).await
    }

    async fn bounds_read_by<F>(&self, tp: &TopicPartition, read: impl Fn() -> F) -> Result<PartitionBounds, BackendError>
    where
        F: std::future::Future<Output = Result<PartitionBounds, BackendError>>,
    {
        let asked = Instant::now();
        let slot = self.slot(tp);
        let mut last = slot.lock().await;
        if let Some((bounds, started)) = *last {
            if started >= asked {
                return Ok(bounds);
            }
        }
        let started = Instant::now();
        let bounds = read_with_retries(&read).await?;
        *last = Some((bounds, started));
        Ok(bounds)
    }

    fn slot(&self, tp: &TopicPartition) -> Slot {
        let mut slots = self.slots.lock().unwrap();
        if slots.len() >= MAX_ENTRIES && !slots.contains_key(tp) {
            // Only slots nobody holds or waits for can go.
            slots.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        slots.entry(tp.clone()).or_default().clone()
    }
}

async fn read_with_retries<F>(read: &impl Fn() -> F) -> Result<PartitionBounds, BackendError>
where
    F: std::future::Future<Output = Result<PartitionBounds, BackendError>>,
{
    let mut pauses = RETRY_PAUSES.iter();
    loop {
        match read().await {
            Err(BackendError::Unavailable(why) | BackendError::Io(why)) => match pauses.next() {
                Some(pause) => {
                    tracing::debug!(error = %why, "reading a partition's bounds failed; trying again");
                    tokio::time::sleep(*pause).await;
                }
                None => return Err(BackendError::Unavailable(why)),
            },
            answered => return answered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::names::TopicName;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn tp() -> TopicPartition {
        TopicPartition::new(TopicName::parse("t").unwrap(), 0)
    }

    /// 50 plans at once: the first reads, the 49 that queued meanwhile share the one read that
    /// starts after they asked. Each answer was read after its plan asked (the log end grows by
    /// one per read, and no plan gets the first read's end except the first).
    #[tokio::test]
    async fn plans_that_ask_together_share_one_read_started_after_they_asked() {
        let reads = Arc::new(BoundsReads::default());
        let count = Arc::new(AtomicU64::new(0));
        let first = {
            let (reads, count) = (reads.clone(), count.clone());
            tokio::spawn(async move {
                reads
                    .bounds_read_by(&tp(), || {
                        let count = count.clone();
                        async move {
                            let n = count.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok(PartitionBounds { log_start: 0, log_end: n })
                        }
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waiting: Vec<_> = (0..49)
            .map(|_| {
                let (reads, count) = (reads.clone(), count.clone());
                tokio::spawn(async move {
                    reads
                        .bounds_read_by(&tp(), || {
                            let count = count.clone();
                            async move { Ok(PartitionBounds { log_start: 0, log_end: count.fetch_add(1, Ordering::SeqCst) }) }
                        })
                        .await
                })
            })
            .collect();
        assert_eq!(first.await.unwrap().unwrap().log_end, 0);
        for plan in waiting {
            assert_eq!(plan.await.unwrap().unwrap().log_end, 1, "the read that started after it asked");
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_failure_is_read_again_and_a_lasting_one_answers_unavailable() {
        let reads = BoundsReads::default();
        let count = AtomicU64::new(0);
        let flaky = reads
            .bounds_read_by(&tp(), || {
                let n = count.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Err(BackendError::Io("Meta data fetch error: OperationTimedOut".into()))
                    } else {
                        Ok(PartitionBounds { log_start: 0, log_end: 9 })
                    }
                }
            })
            .await;
        assert_eq!(flaky.unwrap().log_end, 9);
        let lasting = reads.bounds_read_by(&tp(), || async { Err(BackendError::Unavailable("down".into())) }).await;
        assert!(matches!(lasting, Err(BackendError::Unavailable(_))));
        let unknown = reads.bounds_read_by(&tp(), || async { Err(BackendError::UnknownTopic("t".into())) }).await;
        assert!(matches!(unknown, Err(BackendError::UnknownTopic(_))), "not retried: {unknown:?}");
    }
}
