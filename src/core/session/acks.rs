//! Acknowledgement side of a session: acks (floors, durable writes, broker ACKs), nack,
//! extend, term, ack-timeout redelivery and dead letters.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{Session, Waiting};
use crate::core::ack_tracker::AckEffect;
use crate::core::client_state::{ClientState, DeliveryRef, EventRef};
use crate::core::dead_letters::DeadLetter;
use crate::core::metrics::RedeliveryReason;
use crate::core::names::{OffsetKey, TopicName, TopicPartition};
use crate::core::offset_writer::WriteRequest;
use crate::core::offsets::{LogEpoch, OffsetWrite, StoreError};
use crate::core::protocol::{ErrorCode, FrameError, ResumeOffset, ServerFrame};
use crate::core::redelivery::RedeliveryPolicy;
use crate::core::resume_token::Holder;
use crate::core::trace::{export_acked, AckedDelivery, Tracer};

impl Session {
    /// `ids` are delivery ids: a `&[&str]` of one for the plain ack frame (no allocation on that
    /// path, the most frequent frame of all), the parsed list otherwise.
    /// `ack` of a member of shared subscriptions: its group deliveries are settled by their
    /// groups (`groups`), the rest here. Apart from `ack`, so that a session that joined no group
    /// (the hot path) carries none of it.
    pub(super) async fn ack_as_member<S: AsRef<str>>(&mut self, ids: &[S], req: Option<Value>) -> Result<(), FrameError> {
        match self.ack_group_deliveries(ids, &req) {
            Some(own) if own.is_empty() => Ok(()),
            Some(own) => self.ack(&own, req).await,
            None => self.ack(ids, req).await,
        }
    }

    pub(super) async fn ack<S: AsRef<str>>(&mut self, ids: &[S], req: Option<Value>) -> Result<(), FrameError> {
        // Only when traces are on: where the spans go, when the ack came, and the deliveries it
        // settled in sampled traces (exported once the client's state is unlocked).
        let mut traced: Option<(Arc<dyn Tracer>, Instant, Vec<AckedDelivery>)> = self.d.tracer.get().map(|t| (t.clone(), Instant::now(), Vec::new()));
        let mut unknown = Vec::new();
        let mut acked = 0u64;
        // Floor and last_acked of every touched partition before this ack, to see which moved
        // (a frame touches one or a few partitions: a list beats a map here). The session's own
        // list, emptied after each ack: no allocation per ack frame.
        let mut touched = std::mem::take(&mut self.ack_touched);
        let mut committed: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        // The floors a confirmed ack reports, remembered once its `ack_ok` went out (`told`).
        let mut reported: Vec<(TopicPartition, u64)> = Vec::new();
        // Per topic a confirmed ack touched: its incarnation and every partition's floor.
        let mut tokens: Vec<(TopicName, u64, BTreeMap<u32, ResumeOffset>)> = Vec::new();
        // A confirmed ack writes (and answers) on its own; the others join the batch submitted
        // once per burst of frames (`submit_acked`).
        let (mut confirmed_writes, mut confirmed_broker_acks) = (Vec::new(), Vec::new());
        let (writes, broker_acks) = match req {
            Some(_) => (&mut confirmed_writes, &mut confirmed_broker_acks),
            None => (&mut self.acked.writes, &mut self.acked.broker_acks),
        };
        let now_ms = self.d.clock.now_ms();
        let metrics = &self.d.metrics;
        let mut redriven = Vec::new();
        {
            let mut client = self.client.lock().unwrap();
            if self.access.topics.is_some() {
                // A session that took over with a narrower token settles nothing outside it.
                for id in ids {
                    if let Some(topic) =
                        DeliveryRef::parse(id.as_ref()).and_then(|d| client.topic_of(d.topic_slot())).filter(|t| !self.access.allows(t.as_str()))
                    {
                        return Err(forbidden(topic));
                    }
                }
            }
            for id in ids {
                let id = id.as_ref();
                let Some(delivery) = DeliveryRef::parse(id) else {
                    unknown.push(id);
                    continue;
                };
                if delivery.event().is_redrive() {
                    // Outside the floor: its ack removes the dead letter.
                    let event = delivery.event();
                    let Some(topic) = client.topic_of(delivery.topic_slot()).cloned() else {
                        unknown.push(id);
                        continue;
                    };
                    match self.in_flight.get(&event) {
                        // The current id or an earlier one (this session's, or a taken-over
                        // session's: sequence numbers are the instance's, so any id of it has one
                        // up to the current); never one not issued yet.
                        Some(current) if delivery.seq <= current.seq => {
                            self.in_flight.remove(&event);
                            self.waiting.remove(&event);
                            redriven.push((event, topic));
                            acked += 1;
                        }
                        Some(_) => unknown.push(id),
                        // Not in flight here: another session of the client delivered it, or it
                        // was acknowledged already. Settled if still marked, else a no-op.
                        None => redriven.push((event, topic)),
                    }
                    continue;
                }
                let Some((tp, tracker)) = client.tracker_mut(delivery.event()) else {
                    unknown.push(id);
                    continue;
                };
                let before = (tracker.floor(), tracker.last_acked());
                match tracker.ack(delivery.offset, delivery.seq) {
                    AckEffect::Acked => {
                        let event = delivery.event();
                        if let Some(settled) = self.in_flight.remove(&event) {
                            metrics.ack_latency.record(settled.delivered_at.elapsed().as_secs_f64());
                            if let Some((_, _, traced)) = traced.as_mut() {
                                traced.extend(AckedDelivery::of(&settled.event, settled.topic.as_str(), id, settled.attempt, settled.delivered_at.into_std()));
                            }
                        }
                        if !self.waiting.is_empty() {
                            self.waiting.remove(&event);
                        }
                        broker_acks.push((tp.clone(), event.offset));
                        acked += 1;
                    }
                    AckEffect::AlreadyAcked => {}
                    AckEffect::Unknown => {
                        unknown.push(id);
                        continue;
                    }
                }
                if !touched.iter().any(|(seen, _)| *seen == tp) {
                    touched.push((tp, before));
                }
            }
            for (tp, before) in &touched {
                let tracker = &client.trackers[tp];
                // A confirmed ack writes the floor even when this ack did not move it: an earlier
                // write of it may have failed, and `ack_ok` reports only what is durable.
                if req.is_some() || (tracker.floor(), tracker.last_acked()) != *before {
                    writes.push(OffsetWrite {
                        key: OffsetKey::new(tp.topic.clone(), self.info.client_id.clone(), tp.partition),
                        committed: tracker.floor(),
                        last_acked: tracker.last_acked(),
                        updated_at: now_ms,
                        generation: client.generation(&tp.topic),
                        epoch: tracker.offset_epoch,
                    });
                }
                // Only a confirmed ack reports the floors (in its `ack_ok`).
                if req.is_some() {
                    committed.entry(tp.topic.to_string()).or_default().insert(tp.partition.to_string(), tracker.floor());
                    reported.push((tp.clone(), tracker.floor()));
                } else if tracker.floor() != before.0 {
                    // A moved floor no `ack_ok` carries: a `progress` frame will.
                    self.tokens_due.insert(tp.topic.clone());
                }
            }
            // Each topic's token as of this ack: every partition's floor, durable once the
            // writes below are (the writer applies requests in order).
            if req.is_some() {
                for (tp, _) in &touched {
                    if !tokens.iter().any(|(topic, ..)| *topic == tp.topic) {
                        if let Some((incarnation, floors)) = self.token_floors(&client, &tp.topic) {
                            tokens.push((tp.topic.clone(), incarnation, floors));
                        }
                    }
                }
            }
        }
        touched.clear();
        self.ack_touched = touched;
        if let Some((tracer, received, settled)) = traced {
            if !settled.is_empty() {
                export_acked(tracer.as_ref(), self.info.client_id.as_str(), settled, received.into_std(), req.is_some());
            }
        }
        metrics.acks.increment(acked);
        let stats = &self.info.stats;
        stats.acked.fetch_add(acked, Ordering::Relaxed);
        stats.in_flight.store(self.in_flight.len(), Ordering::Relaxed);
        if acked > 0 {
            stats.last_ack_at.store(now_ms, Ordering::Relaxed);
        }
        let valid = ids.len() - unknown.len();
        if !redriven.is_empty() {
            Box::pin(self.settle_redriven(redriven)).await?;
        }
        if let Some(req) = req {
            // Boxed, as every rare await of a session (see `on_text`).
            self.confirms = true;
            Box::pin(self.confirm_ack(req, confirmed_writes, confirmed_broker_acks, Reported { committed, floors: reported, tokens }, unknown.is_empty()))
                .await?;
        }
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(FrameError::new(ErrorCode::UnknownDelivery, format!("unknown delivery ids: {}; the other {valid} were acknowledged", unknown.join(", "))))
        }
    }

    /// The durable half of an ack with `req`: `ack_ok` (when every id was known) once its writes
    /// are durable. Earlier unconfirmed acks go first, so the writer sees them in order.
    async fn confirm_ack(
        &mut self,
        req: Value,
        writes: Vec<OffsetWrite>,
        broker_acks: Vec<(TopicPartition, u64)>,
        reported: Reported,
        all_known: bool,
    ) -> Result<(), FrameError> {
        self.submit_acked().await;
        self.d.writer.write_durably(writes, broker_acks).await.map_err(|e| FrameError::unavailable("the offset store", e))?;
        if all_known {
            let Reported { committed, floors: reported, tokens } = reported;
            let holder = Holder::of(&self.info.client_id);
            let tokens = tokens
                .into_iter()
                .map(|(topic, incarnation, floors)| {
                    self.tokens_due.remove(&topic);
                    (topic.to_string(), self.d.issue_resume_token(holder.clone(), [(topic, incarnation, floors)]))
                })
                .collect();
            self.send(ServerFrame::AckOk { req, committed, tokens });
            for (tp, floor) in reported {
                let told = self.told.entry(tp).or_default();
                *told = (*told).max(floor);
            }
        }
        Ok(())
    }

    /// The incarnation and every partition's floor (with its offset epoch) of the session's
    /// subscription to `topic`, as a resume token names them; `None` when it has none.
    pub(super) fn token_floors(&self, client: &ClientState, topic: &TopicName) -> Option<(u64, BTreeMap<u32, ResumeOffset>)> {
        let subscription = self.subscriptions.get(topic)?;
        let floors = (0..subscription.partitions)
            .filter_map(|p| {
                let tracker = client.trackers.get(&TopicPartition::new(topic.clone(), p))?;
                Some((p, ResumeOffset { offset: tracker.floor(), epoch: tracker.offset_epoch }))
            })
            .collect();
        Some((subscription.incarnation, floors))
    }

    /// Sends `progress` with fresh tokens of the topics whose floors moved since the last token
    /// (acks without `req`), at most every `delivery.progress_interval_ms`, once those floors are
    /// durable.
    pub(super) async fn send_progress(&mut self) {
        let interval = self.d.settings().progress_interval;
        if interval.is_zero() || self.tokens_due.is_empty() || self.progress_sent.elapsed() < interval {
            return;
        }
        self.submit_acked().await;
        if self.d.writer.barrier().await.is_err() {
            return;
        }
        let due: Vec<TopicName> = self.tokens_due.drain().collect();
        let holder = Holder::of(&self.info.client_id);
        let tokens: BTreeMap<String, String> = {
            let client = self.client.lock().unwrap();
            due.into_iter()
                .filter_map(|topic| {
                    let (incarnation, floors) = self.token_floors(&client, &topic)?;
                    Some((topic.to_string(), self.d.issue_resume_token(holder.clone(), [(topic, incarnation, floors)])))
                })
                .collect()
        };
        self.progress_sent = tokio::time::Instant::now();
        if !tokens.is_empty() {
            self.send(ServerFrame::Progress { tokens });
        }
    }

    /// Submits the writes of acks without `req` collected so far (one request per batch of frames).
    pub(super) async fn submit_acked(&mut self) {
        if self.acked.writes.is_empty() && self.acked.broker_acks.is_empty() {
            return;
        }
        // The writer merges them per key (and keeps nothing of the vectors: their capacity stays
        // here, for the next burst).
        if let Err(e) = self.d.writer.submit_plain(&mut self.acked.writes, &mut self.acked.broker_acks).await {
            // Only at shutdown: the events are delivered again after the restart.
            tracing::warn!(error = %e, "offset writes not submitted");
        }
    }

    /// Finds the in-flight delivery a client frame names by its current delivery id.
    fn current_delivery(&self, delivery_id: &str) -> Result<EventRef, FrameError> {
        let unknown = || FrameError::new(ErrorCode::UnknownDelivery, format!("no in-flight delivery {delivery_id} in this session"));
        let delivery = DeliveryRef::parse(delivery_id).ok_or_else(unknown)?;
        if self.access.topics.is_some() {
            if let Some(topic) = self.client.lock().unwrap().topic_of(delivery.topic_slot()).filter(|t| !self.access.allows(t.as_str())) {
                return Err(forbidden(topic));
            }
        }
        match self.in_flight.get(&delivery.event()) {
            Some(current) if current.seq == delivery.seq => Ok(delivery.event()),
            _ => Err(unknown()),
        }
    }

    /// `nack`: redeliver after `delay` or, without one, after the backoff its topic names for
    /// the attempt.
    pub(super) fn nack(&mut self, delivery_id: &str, delay: Option<Duration>) -> Result<(), FrameError> {
        let event = self.current_delivery(delivery_id)?;
        let Some(current) = self.in_flight.get(&event) else { return Ok(()) };
        let after = delay.unwrap_or_else(|| self.redelivery_of(&current.topic).backoff_after(current.attempt));
        self.in_flight.reschedule(event, after, self.d.clock.now_ms());
        self.waiting.insert(event, Waiting::Nacked);
        Ok(())
    }

    /// `extend`: restart the delivery's ack deadline (a pause it was in ends).
    pub(super) fn extend(&mut self, delivery_id: &str) -> Result<(), FrameError> {
        let event = self.current_delivery(delivery_id)?;
        let Some(current) = self.in_flight.get(&event) else { return Ok(()) };
        let timeout = self.redelivery_of(&current.topic).ack_timeout;
        self.in_flight.reschedule(event, timeout, self.d.clock.now_ms());
        self.waiting.remove(&event);
        Ok(())
    }

    /// The redelivery rules of a subscribed topic (the default ones for a topic no longer
    /// subscribed, whose deliveries are about to be released).
    pub(super) fn redelivery_of(&self, topic: &TopicName) -> Arc<RedeliveryPolicy> {
        match self.subscriptions.get(topic) {
            Some(subscription) => subscription.redelivery.clone(),
            None => self.d.settings().redelivery.for_topic(topic.as_str()),
        }
    }

    /// The admin view of the in-flight deliveries, with when each comes again unacknowledged: at
    /// its deadline when that ends a pause, else after the backoff that follows its ack timeout.
    pub(super) fn in_flight_views(&self) -> Vec<crate::core::in_flight::InFlightView> {
        self.in_flight.views(|event, delivery| {
            if self.waiting.contains_key(&event) {
                Duration::ZERO
            } else {
                self.redelivery_of(&delivery.topic).backoff_after(delivery.attempt)
            }
        })
    }

    pub(super) async fn term(&mut self, delivery_id: &str, reason: Option<String>) -> Result<(), FrameError> {
        let event = self.current_delivery(delivery_id)?;
        let (topic, attempt) = match self.in_flight.get(&event) {
            Some(current) => (current.topic.clone(), current.attempt),
            None => return Ok(()),
        };
        self.termed += 1;
        Box::pin(self.dead_letter(&topic, event, attempt, reason.unwrap_or_else(|| "term".into()))).await;
        Ok(())
    }

    /// Redelivers every in-flight event whose deadline passed.
    pub(super) async fn on_timers(&mut self) {
        let now = Instant::now();
        while let Some(event) = self.in_flight.pop_due(now) {
            self.redeliver(event).await;
        }
    }

    async fn redeliver(&mut self, event: EventRef) {
        let waited = self.waiting.remove(&event);
        let reason = if waited == Some(Waiting::Nacked) { RedeliveryReason::Nack } else { RedeliveryReason::Timeout };
        let Some(current) = self.in_flight.get(&event) else { return };
        let (topic, attempt, payload) = (current.topic.clone(), current.attempt, current.event.clone());
        let redelivery = self.redelivery_of(&topic);
        if attempt >= redelivery.max_attempts {
            Box::pin(self.dead_letter(&topic, event, attempt, "max_attempts".into())).await;
            return;
        }
        // An ack timeout: the topic's backoff for this attempt first (the event keeps its slot
        // in the window, and an ack meanwhile still counts), then the redelivery.
        if waited.is_none() {
            let pause = redelivery.backoff_after(attempt);
            if !pause.is_zero() {
                self.in_flight.reschedule(event, pause, self.d.clock.now_ms());
                self.waiting.insert(event, Waiting::BackingOff);
                return;
            }
        }
        let seq = self.d.next_seqs(1);
        let tp = TopicPartition::new(topic.clone(), event.partition);
        // Only into the tracker of this session's own subscription: when a later plan (a newer
        // session of the client) replaced it, this delivery is that session's to make.
        let epoch = self.subscriptions.get(&topic).map(|s| s.epoch);
        let next_attempt = match event.is_redrive() {
            // Outside the trackers: its attempts are its own.
            true => Some(attempt + 1),
            false => epoch.and_then(|epoch| self.client.lock().unwrap().tracker_of_epoch(&tp, epoch).and_then(|t| t.on_delivery(event.offset, seq))),
        };
        let Some(next_attempt) = next_attempt else {
            self.in_flight.remove(&event); // acknowledged meanwhile (by a superseded id), or no longer ours
            return;
        };
        self.push_event(&topic, seq, next_attempt, &payload, event);
        self.d.metrics.delivered(1);
        self.in_flight.redelivered(event, seq, next_attempt, redelivery.ack_timeout, self.d.clock.now_ms());
        self.info.stats.redelivered.fetch_add(1, Ordering::Relaxed);
        self.d.metrics.redelivered(reason);
    }

    /// Gives up on an event: records the dead letter, then counts it as acknowledged. Rare: its
    /// callers box it, so that its awaits are not part of every session's future.
    /// A redriven event given up on again stays a dead letter, no longer marked, with the
    /// attempts of every redrive added up.
    pub(super) async fn dead_letter(&mut self, topic: &TopicName, event: EventRef, attempts: u32, reason: String) {
        let now_ms = self.d.clock.now_ms();
        let redriven = event.is_redrive();
        let prior = match redriven {
            true => self.redrives.as_ref().and_then(|r| r.prior_attempts(&event)).unwrap_or(0),
            false => 0,
        };
        // The log epoch its subscription read it in (its tracker's).
        let tp = TopicPartition::new(topic.clone(), event.partition);
        let log_epoch = self.client.lock().unwrap().trackers.get(&tp).map_or(0, |t| LogEpoch::of(t.offset_epoch));
        let dead = DeadLetter {
            topic: topic.clone(),
            client_id: self.info.client_id.clone(),
            partition: event.partition,
            offset: event.offset,
            attempts: prior.saturating_add(attempts),
            reason,
            at: now_ms,
            log_epoch,
        };
        // On the blocking pool: with `storage.durability = "power"` the write fsyncs.
        let (store, record) = (self.d.store.clone(), dead.clone());
        let recorded = tokio::task::spawn_blocking(move || match redriven {
            true => store.settle_redrive(&record.id(), Some(&record)),
            false => store.record_dead_letter(&record),
        })
        .await;
        if let Ok(Err(e)) | Err(e) = recorded.map_err(|e| StoreError::Io(e.to_string())) {
            // Keep the event pending, with a deadline again (the timer that led here consumed
            // its last one): it is tried again after the ack timeout rather than stranded.
            tracing::error!(error = %e, "recording a dead letter failed; trying again after the ack timeout");
            let timeout = self.redelivery_of(topic).ack_timeout;
            self.in_flight.reschedule(event, timeout, now_ms);
            return;
        }
        tracing::warn!(client_id = %dead.client_id, topic = %topic, partition = event.partition, offset = event.offset, reason = %dead.reason.escape_debug(), "dead letter");
        if self.is_hub() {
            self.out.push(crate::core::transport::Outbound::SharedGone(event.partition, event.offset));
        }
        self.in_flight.remove(&event);
        self.waiting.remove(&event);
        self.d.metrics.dead_letters.increment(1);
        self.info.stats.in_flight.store(self.in_flight.len(), Ordering::Relaxed);
        if redriven {
            self.take_prior_attempts(&event);
            return; // outside the floor, and acknowledged at the broker when it first died
        }
        let tp = TopicPartition::new(topic.clone(), event.partition);
        let write = {
            let mut client = self.client.lock().unwrap();
            let generation = client.generation(topic);
            // Any epoch's tracker: settling only removes a pending event (the client gave up on
            // it for good), it never claims offsets as delivered.
            let Some(tracker) = client.trackers.get_mut(&tp) else { return };
            let before = tracker.floor();
            tracker.settle(event.offset);
            (tracker.floor() > before).then(|| OffsetWrite {
                key: OffsetKey::new(topic.clone(), self.info.client_id.clone(), event.partition),
                committed: tracker.floor(),
                last_acked: tracker.last_acked(),
                updated_at: now_ms,
                generation,
                epoch: tracker.offset_epoch,
            })
        };
        let request = WriteRequest { writes: write.into_iter().collect(), broker_acks: vec![(tp, event.offset)], done: None };
        if let Err(e) = self.d.writer.submit(request).await {
            tracing::error!(error = %e, "offset write after a dead letter failed");
        }
    }
}

fn forbidden(topic: &TopicName) -> FrameError {
    FrameError::new(ErrorCode::Forbidden, format!("this session's token does not allow topic {topic}"))
}

/// What a confirmed ack's `ack_ok` reports once its writes are durable.
struct Reported {
    committed: BTreeMap<String, BTreeMap<String, u64>>,
    /// The floors it tells the client (`Session::told`).
    floors: Vec<(TopicPartition, u64)>,
    /// Per topic touched: its incarnation and every partition's floor, for its token.
    tokens: Vec<(TopicName, u64, BTreeMap<u32, ResumeOffset>)>,
}
