//! Where a subscription starts: per partition the stored committed offset, the client's resume
//! token (within the record's offset epoch), `from` or the reset policy, never below the log start
//! (a gap when the start wanted was below it), and the trackers and offset records that go with it
//! (`Dispatcher::plan_subscription`).

use std::sync::Mutex;

use futures_util::{StreamExt, TryStreamExt};

use super::ack_tracker::{AckTracker, Epoch};
use super::backend::PartitionBounds;
use super::client_state::ClientState;
use super::delivery_settings::ResetPolicy;
use super::dispatcher::Dispatcher;
use super::frame_errors::{backend_frame_error, store_frame_error};
use super::log_end;
use super::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use super::offset_retention::lower_to_log_end;
use super::offsets::{LogEpoch, OffsetEpoch, OffsetWrite, StoreError};
use super::protocol::{ErrorCode, FrameError, ResumeOffset, StartFrom};

/// Partitions whose bounds (and times) are asked at once: on Kafka each is a broker round trip.
const BOUNDS_IN_PARALLEL: usize = 16;

/// One partition's starting point chosen at subscribe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartPoint {
    pub partition: u32,
    pub from: u64,
    pub log_start: u64,
    /// The partition's offset epoch for this client (the stored record's, after any lowering).
    pub epoch: OffsetEpoch,
    /// The start the client wanted (its stored offset or token) and the log start above it:
    /// offsets `wanted..log_start` are gone (retention) and will never reach it.
    pub gap: Option<(u64, u64)>,
    /// A claimed resume (the older map form) named this partition and was not applied: an epoch
    /// above the stored record's (one the gateway never issued), or no stored record to clamp it to.
    pub claim_refused: bool,
}

/// The resume offsets a subscription plan is given, and whether the gateway issued them.
#[derive(Debug, Clone, Copy)]
pub struct ResumeFloors<'a> {
    pub floors: &'a std::collections::BTreeMap<u32, ResumeOffset>,
    /// The older map form, a client's claim: applied only within the stored record's epoch,
    /// never raising it. Issued floors (a verified token, the peers' records, a group's hub)
    /// may carry an epoch above the record's.
    pub claimed: bool,
}

impl Dispatcher {
    /// Picks where each partition of `topic` starts for `client`, and prepares its trackers.
    ///
    /// Per partition: the larger of the stored committed offset and the client's resume token
    /// when the token names the record's offset epoch (a token from before a lowering is fenced:
    /// the operator's reset or the lost tail stands); without either, `from` (or the reset policy
    /// for `committed`). Never below `log_start`.
    /// When the start is above the stored committed offset (a resume token, `latest`, or
    /// retention), the committed offset moves there too, or acks above it could never lift it.
    pub async fn plan_subscription(
        &self,
        client_id: &ClientId,
        client: &Mutex<ClientState>,
        topic: &TopicName,
        from: StartFrom,
        resume: ResumeFloors<'_>,
        epoch: Epoch,
        first: u32,
    ) -> Result<Vec<StartPoint>, FrameError> {
        let ResumeFloors { floors: resume, claimed } = resume;
        let most = self.settings().max_rewind_events;
        if let StartFrom::Last(n) = from {
            if n > most {
                return Err(FrameError::new(
                    ErrorCode::LimitExceeded,
                    format!("from.last is {n}; at most {most} events per partition (limits.max_rewind_events)"),
                ));
            }
        }
        let partitions = self
            .backend
            .partitions(topic)
            .await
            .map_err(backend_frame_error)?
            .ok_or_else(|| FrameError::new(ErrorCode::UnknownTopic, format!("topic {topic} does not exist")))?;
        // The offsets of a deleted topic of this name are still being removed (a removal cut
        // short): they must never apply to this one.
        if self.store.pending_topic_removals().iter().any(|(t, _)| t == topic) {
            return Err(FrameError::new(
                ErrorCode::Unavailable,
                format!("the offsets of an earlier topic {topic}, deleted, are still being removed; retry once an operator has deleted it again (or restarted the gateway)"),
            ));
        }
        if let Some(bad) = resume.keys().find(|p| **p >= partitions) {
            return Err(FrameError::new(ErrorCode::BadFrame, format!("resume names partition {bad}; {topic} has {partitions}")));
        }
        // Partitions `first..` (all of them for a subscribe; those added since for a grown
        // subscription): the others are not touched.
        let range = first.min(partitions)..partitions;
        let index = |partition: u32| (partition - range.start) as usize;
        let generation = self.store.topic_generation(topic).map_err(store_frame_error)?;
        client.lock().unwrap().set_generation(topic, generation);
        // The bounds of every partition, asked a few at a time: on Kafka each is a broker round
        // trip, and one after the other they made a subscribe (and so a takeover) wait for the sum.
        // Plans that ask at the same time share a read (`bounds_reads`).
        let mut bounds: Vec<PartitionBounds> = futures_util::stream::iter(range.clone())
            .map(|partition| {
                let tp = TopicPartition::new(topic.clone(), partition);
                async move { self.plan_bounds.bounds(self.backend.as_ref(), &tp).await }
            })
            .buffered(BOUNDS_IN_PARALLEL)
            .try_collect()
            .await
            .map_err(backend_frame_error)?;
        // A start by time: each partition's first offset at or after it (a search per partition).
        let by_time: Vec<u64> = match from {
            StartFrom::Time(time_ms) => futures_util::stream::iter(range.clone())
                .map(|partition| {
                    let tp = TopicPartition::new(topic.clone(), partition);
                    async move { self.backend.offset_for_time(&tp, time_ms).await }
                })
                .buffered(BOUNDS_IN_PARALLEL)
                .try_collect()
                .await
                .map_err(backend_frame_error)?,
            _ => Vec::new(),
        };
        // What this instance remembers of the client's progress, else what the store holds, and
        // the record's offset epoch. A tracker of an older epoch is not trusted: the record was
        // lowered since it started (an admin reset, a lost log tail), and acks it holds count in
        // the old log only.
        let mut known = Vec::with_capacity(range.len());
        let mut epochs = Vec::with_capacity(range.len());
        let mut logs = Vec::with_capacity(range.len());
        for partition in range.clone() {
            let tp = TopicPartition::new(topic.clone(), partition);
            let key = OffsetKey::new(topic.clone(), client_id.clone(), partition);
            let mut record = self.store.read(&key).map_err(store_frame_error)?;
            // A record made before the partition's log lost its tail (found since by any
            // instance, while this client was away or served elsewhere): what it acked above
            // where the log ended is gone, however far the log has grown back since. It is
            // lowered there, or moved into the log's epoch as it is, so that nothing made before
            // the loss (a token, a tracker, a queued write) counts any more (issue 39, item 3).
            let log = self.store.log_epoch(&tp).map_err(store_frame_error)?;
            if let Some(before) = record.filter(|r| LogEpoch::of(r.epoch) < log.epoch) {
                let now_ms = self.clock.now_ms();
                let moved = if before.committed > log.log_end {
                    tracing::warn!(%key, committed = before.committed, log_end = log.log_end, log_epoch = log.epoch, "committed offset above where the log ended when it lost its tail: lowered there");
                    lower_to_log_end(self.store.as_ref(), &key, log.log_end, log.first_offset_epoch(), now_ms)
                } else {
                    self.store.reset(&key, before.committed, log.first_offset_epoch(), now_ms)
                };
                record = Some(moved.map_err(store_frame_error)?);
            }
            // Where an operator deleted the record, its fence stands for it: nothing from
            // before the deletion counts.
            let epoch = match record {
                Some(r) => r.epoch,
                None => log.first_offset_epoch().max(self.store.fence(&key).map_err(store_frame_error)?.unwrap_or(0)),
            };
            let remembered = client.lock().unwrap().trackers.get(&tp).filter(|t| t.offset_epoch >= epoch).map(|t| (t.floor(), t.last_acked()));
            known.push(remembered.or(record.map(|r| (r.committed, r.last_acked))));
            epochs.push(epoch);
            logs.push(log);
        }
        // A log end below the committed offset is read again before anything is lowered: it
        // may be a broker's answer of a moment (`core::log_end`).
        let low: Vec<TopicPartition> = range
            .clone()
            .filter(|p| known[index(*p)].is_some_and(|(committed, _)| committed > bounds[index(*p)].log_end))
            .map(|p| TopicPartition::new(topic.clone(), p))
            .collect();
        for (tp, second) in low.iter().zip(log_end::read_again(self.backend.as_ref(), &low).await.map_err(backend_frame_error)?) {
            let read_first = &mut bounds[index(tp.partition)];
            if second.log_end > read_first.log_end {
                log_end::transient(tp, read_first.log_end, second.log_end);
            }
            *read_first = second;
        }
        // A client with a stored offset on some partition of the topic subscribed to it before:
        // a partition it has none for was added since (a subscribe stores one for every
        // partition), and `reset_policy = latest` must not skip what was published to it.
        let subscribed_before = known.iter().any(Option::is_some);
        let mut starts = Vec::with_capacity(range.len());
        let mut writes = Vec::new();
        // Each partition's tracker as planned: put in place only once nothing can fail any more,
        // so a re-subscribe that fails leaves the running subscription's trackers as they were.
        let mut trackers = Vec::with_capacity(range.len());
        for ((((partition, bounds), mut stored), mut offset_epoch), log) in range.clone().zip(bounds).zip(known).zip(epochs).zip(logs) {
            let tp = TopicPartition::new(topic.clone(), partition);
            let key = OffsetKey::new(topic.clone(), client_id.clone(), partition);
            if let Some((committed, _)) = stored.filter(|(committed, _)| *committed > bounds.log_end) {
                // The log lost its tail (the end was read twice): the partition's next log epoch
                // starts, for every client of it, then this one's offset is lowered into it.
                let log = self.store.step_log_epoch(&tp, log.epoch, bounds.log_end).map_err(store_frame_error)?;
                tracing::warn!(%key, committed, log_end = bounds.log_end, log_epoch = log.epoch, "committed offset above the log end: lowered to the log end");
                let lowered =
                    lower_to_log_end(self.store.as_ref(), &key, bounds.log_end, log.first_offset_epoch(), self.clock.now_ms()).map_err(store_frame_error)?;
                stored = Some((lowered.committed, lowered.last_acked));
                offset_epoch = lowered.epoch;
            }
            let policy = match (from, self.settings().reset_policy) {
                (StartFrom::Latest, _) => bounds.log_end,
                (StartFrom::Last(n), _) => bounds.log_end.saturating_sub(n).max(bounds.log_start),
                (StartFrom::Time(_), _) => by_time[index(partition)].clamp(bounds.log_start, bounds.log_end),
                (StartFrom::Committed, ResetPolicy::Latest) if !subscribed_before => bounds.log_end,
                _ => bounds.log_start,
            };
            // A token made before the record's last lowering is trusted only up to the offset that
            // lowering set, which the stored offset already is: it counts for nothing.
            let fenced = resume.get(&partition).filter(|r| r.epoch < offset_epoch);
            if let Some(token) = fenced {
                tracing::info!(%key, token = token.offset, token_epoch = token.epoch, epoch = offset_epoch, "resume token from before the offset was lowered (admin reset or lost log tail): not trusted");
            }
            // A claim is applied only within the stored record's epoch: an epoch above it is one
            // the gateway never issued, and without a record there is nothing to clamp it to.
            let claim_refused = claimed && resume.get(&partition).is_some_and(|r| r.epoch > offset_epoch || stored.is_none());
            let trusted = resume.get(&partition).filter(|r| r.epoch >= offset_epoch && !(claimed && (r.epoch != offset_epoch || stored.is_none())));
            let requested = trusted.map(|r| r.offset.min(bounds.log_end));
            // A token of a later epoch than the record's: the record was removed since (offsets
            // deleted, expired) and is written again. It goes on in the token's epoch, so a later
            // lowering steps above every epoch the client has seen and fences its token.
            // Never into a log epoch this instance has not recorded (a token from an instance
            // that saw a loss this one has not): this instance's own step for that loss must
            // still fence the record, so its log half stays this instance's.
            if let Some(token) = trusted.filter(|_| !claimed) {
                offset_epoch = offset_epoch.max(token.epoch.min(log.first_offset_epoch() | u64::from(u32::MAX)));
            }
            let wanted = match (stored, requested) {
                (Some((committed, _)), Some(token)) => committed.max(token),
                // Never below what the client acknowledged: replaying its own history is the
                // admin reset's (by offset or by time).
                (Some((committed, _)), None) if matches!(from, StartFrom::Latest | StartFrom::Time(_) | StartFrom::Last(_)) => committed.max(policy),
                (Some((committed, _)), None) => committed,
                (None, Some(token)) => token,
                (None, None) => policy,
            };
            let start = wanted.max(bounds.log_start);
            // Only a start the client holds (a stored offset or a token) can miss events; a
            // policy start is where the client chose to begin.
            let gap = (wanted < bounds.log_start && (stored.is_some() || requested.is_some())).then_some((wanted, bounds.log_start));
            // A later session of the client planned this partition meanwhile: it is that
            // session's now, and nothing is written for it from here.
            let newer = client.lock().unwrap().trackers.get(&tp).is_some_and(|t| t.epoch > epoch);
            let last_acked = stored.and_then(|(_, l)| l);
            if !newer && stored.is_none_or(|(committed, _)| committed < start) {
                writes.push(OffsetWrite { key, committed: start, last_acked, updated_at: self.clock.now_ms(), generation, epoch: offset_epoch });
            }
            trackers.push((tp, start, last_acked, offset_epoch));
            starts.push(StartPoint { partition, from: start, log_start: bounds.log_start, epoch: offset_epoch, gap, claim_refused });
        }
        // A retention sweep may have read this client's records as expired before it
        // connected: touch them now (a sweep removes only records unchanged since its scan), and
        // write back any the sweep already took, so a subscription served from memory never
        // leaves its client without a stored offset (issue 21). On the blocking pool (it takes
        // the store's write lock); made durable below through the offset writer, which shares one
        // fsync among every subscribe of a storm.
        let (store, now_ms) = (self.store.clone(), self.clock.now_ms());
        let keys: Vec<OffsetKey> = starts.iter().map(|s| OffsetKey::new(topic.clone(), client_id.clone(), s.partition)).collect();
        let planned: Vec<OffsetKey> = writes.iter().map(|w: &OffsetWrite| w.key.clone()).collect();
        let (touched, missing) = tokio::task::spawn_blocking(move || -> Result<(usize, Vec<OffsetKey>), StoreError> {
            let touched = store.touch(&keys, now_ms)?;
            let mut missing = Vec::new();
            for key in keys {
                if !planned.contains(&key) && store.read(&key)?.is_none() {
                    missing.push(key);
                }
            }
            Ok((touched, missing))
        })
        .await
        .map_err(|e| FrameError::unavailable("the offset store", format!("reading stored offsets: {e}")))?
        .map_err(store_frame_error)?;
        for key in missing {
            if let Some((_, start, last_acked, epoch)) = trackers.iter().find(|(tp, ..)| tp.partition == key.partition) {
                writes.push(OffsetWrite { key, committed: *start, last_acked: *last_acked, updated_at: now_ms, generation, epoch: *epoch });
            }
        }
        // A session taken over meanwhile writes nothing: its successor plans from what is stored.
        if !self.is_current(client_id, epoch.session) {
            return Err(FrameError::new(ErrorCode::Conflict, "this session was taken over by a newer one"));
        }
        // Durable before the client hears `subscribed`: the writes, and the touch with them.
        if !writes.is_empty() {
            self.writer.write_durably(writes, Vec::new()).await.map_err(|e| FrameError::unavailable("the offset store", e))?;
        } else if touched > 0 {
            self.writer.make_written_durable().await.map_err(|e| FrameError::unavailable("the offset store", e))?;
        }
        // The trackers become this subscription's (`Epoch`): kept when one is where the plan
        // starts in the same offset epoch (its pending deliveries stay pending), replaced
        // otherwise, and left alone when a later session of the client planned it meanwhile.
        let mut state = client.lock().unwrap();
        for (tp, start, last_acked, offset_epoch) in trackers {
            match state.trackers.get_mut(&tp) {
                Some(tracker) if tracker.epoch > epoch => {}
                Some(tracker) if tracker.floor() == start && tracker.offset_epoch == offset_epoch => tracker.epoch = epoch,
                _ => {
                    let mut tracker = AckTracker::new(start, last_acked);
                    tracker.epoch = epoch;
                    tracker.offset_epoch = offset_epoch;
                    state.trackers.insert(tp, tracker);
                }
            }
        }
        Ok(starts)
    }
}
