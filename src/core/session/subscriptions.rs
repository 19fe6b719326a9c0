//! Subscriptions of a session and the deliveries they feed: subscribe (start points, one feeder
//! per partition), unsubscribe (release in-flight deliveries), and each fed event becoming an
//! in-flight delivery and an `event` frame.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Outbound, Session, Step, Subscription};
use crate::core::ack_tracker::Epoch;
use crate::core::backend::Event;
use crate::core::client_state::{DeliveryRef, EventRef};
use crate::core::feeder::{start_feed, FedBatch, FeedPlan, FeedTarget, PartitionFeed};
use crate::core::in_flight::Delivery;
use crate::core::metrics::RedeliveryReason;
use crate::core::names::{TopicName, TopicPartition};
use crate::core::offsets::{LogEpoch, OffsetFilter};
use crate::core::peer_offsets::newest;
use crate::core::protocol::{close_code, ErrorCode, FrameError, GapRange, Resume, ResumeOffset, ServerFrame, StartFrom, SubscribedPartition};
use crate::core::resume_token::{Holder, Refusal};
use crate::core::subscription_plan::{ResumeFloors, StartPoint};

impl Session {
    pub(super) async fn subscribe(&mut self, topic: &str, from: StartFrom, resume: &Resume, req: Option<Value>) -> Result<(), FrameError> {
        let topic = TopicName::parse(topic).map_err(|e| FrameError::new(ErrorCode::InvalidName, e.0))?;
        if !self.access.allows(topic.as_str()) {
            return Err(FrameError::new(ErrorCode::Forbidden, format!("this session's token does not allow topic {topic}")));
        }
        self.count_subscribe()?;
        if matches!(resume, Resume::None) {
            self.create_missing_topic(&topic).await?;
        }
        let limit = self.d.settings().max_subscriptions_per_session;
        if !self.subscriptions.contains_key(&topic) && self.subscriptions.len() >= limit {
            return Err(FrameError::new(ErrorCode::LimitExceeded, format!("a session may hold {limit} subscriptions (limits.max_subscriptions_per_session)")));
        }
        // Subscribing again restarts the subscription from the committed offsets, but only once
        // the new one is planned: a re-subscribe that fails (backend down, a bad resume token,
        // the topic being deleted) leaves the running subscription as it was.
        // A group of the topic this session is a member of is left for the topic itself.
        self.leave_group(&topic);
        let resubscribing = self.subscriptions.contains_key(&topic);
        if !resubscribing {
            self.d.add_subscriber(&topic)?;
        }
        let id = self.next_subscription;
        self.next_subscription += 1;
        let epoch = Epoch { session: self.info.number, subscription: id };
        // Read before the plan reads the log's bounds: a truncation found after this is one the
        // plan may not have seen, so the feeders must hear of it.
        let truncations = self.d.readers.truncations();
        let holder = Holder::of(&self.info.client_id);
        let (floors, claimed, mut outcome) = match resume {
            Resume::None => (BTreeMap::new(), false, None),
            // A group's hub subscribes with the floors its members' verified group tokens named.
            Resume::Claimed(floors) if self.is_hub() => (floors.clone(), false, None),
            Resume::Claimed(floors) => (floors.clone(), true, Some(Ok(()))),
            Resume::Token(text) => match self.d.open_resume_token(text, &holder, &topic) {
                Ok(floors) => (floors, false, Some(Ok(()))),
                Err(refusal) => {
                    tracing::info!(client_id = %self.info.client_id, %topic, reason = refusal.as_str(), "resume token refused: starting from the stored offsets");
                    (BTreeMap::new(), false, Some(Err(refusal)))
                }
            },
        };
        // No token applied, and no record here: the client's records at the peers stand in for
        // it. A claim (the older map) is clamped to them as to a record here: within a record's
        // epoch, never above it.
        let from_peers = match (floors.is_empty(), claimed, from) {
            // A group's hub, whatever its start: the group's records at the peers (an instance it
            // lived on before, stopped since: `wait_while_live_at_peers`) and its members'
            // tokens, the newest of each partition. Started from its own floor here (or from
            // `latest`), it would replay what the group acked elsewhere (or skip what it had not).
            _ if self.is_hub() => self.records_at_peers(&topic).await.map(|records| newest(records.into_iter().chain(floors.clone()))),
            (true, _, StartFrom::Committed) => self.records_at_peers(&topic).await,
            (false, true, StartFrom::Committed) => self.records_at_peers(&topic).await.map(|records| {
                let (clamped, all_applied) = clamp_claim(&floors, records);
                if !all_applied {
                    outcome = Some(Err(Refusal::Invalid));
                }
                clamped
            }),
            _ => None,
        };
        let resume = match &from_peers {
            Some(records) => ResumeFloors { floors: records, claimed: false },
            None => ResumeFloors { floors: &floors, claimed },
        };
        let starts = match self.d.plan_subscription(&self.info.client_id, &self.client, &topic, from, resume, epoch, 0).await {
            Ok(starts) => starts,
            Err(e) => {
                if !resubscribing {
                    self.d.remove_subscriber(&topic);
                }
                return Err(e);
            }
        };
        // The subscription this one replaces ends here, but its hold on the partitions' readers
        // goes only once the new feeders hold them: a resubscribe keeps the readers' rings.
        let replaced = if resubscribing {
            // Released with its subscriber count, counted again at once: a deletion can only
            // claim a topic nobody subscribes to, and this session still does.
            let replaced = self.take_subscription(&topic);
            self.d.add_subscriber(&topic)?;
            replaced
        } else {
            None
        };
        let slot = self.client.lock().unwrap().slot(&topic);
        let cancel = self.cancel.child_token();
        for start in &starts {
            self.told.insert(TopicPartition::new(topic.clone(), start.partition), start.from);
        }
        if claimed && starts.iter().any(|s| s.claim_refused) {
            outcome = Some(Err(Refusal::Invalid));
        }
        let incarnation = self.d.incarnation_id(&topic);
        let token = self.d.issue_resume_token(
            holder,
            [(topic.clone(), incarnation, starts.iter().map(|s| (s.partition, ResumeOffset { offset: s.from, epoch: s.epoch })).collect())],
        );
        self.send(ServerFrame::Subscribed {
            topic: topic.to_string(),
            req,
            group: None,
            partitions: starts
                .iter()
                .map(|s| SubscribedPartition { partition: s.partition, from: s.from, epoch: s.epoch, gap: s.gap.map(|(from, to)| GapRange { from, to }) })
                .collect(),
            token,
            resume: outcome.map(|o| if o.is_ok() { "applied" } else { "refused" }),
            resume_reason: outcome.and_then(Result::err).map(Refusal::as_str),
        });
        for start in starts.iter().filter(|s| s.gap.is_some()) {
            self.d.report_gap(&self.info.client_id, &topic, start.partition, start.gap.expect("filtered"));
        }
        let feeds = self.feed(&topic, &starts, id, &cancel, truncations);
        drop(replaced);
        // Listed before the partition count is read: a growth after this reaches it as a
        // control message, one before it through the count (`Dispatcher::partitions_grown`).
        self.info.subscriptions.lock().unwrap().push(topic.clone());
        let partitions = starts.len() as u32;
        let wanted = self.d.grown_partitions(&topic).unwrap_or(0).max(partitions);
        let redelivery = self.d.settings().redelivery.for_topic(topic.as_str());
        self.subscriptions.insert(topic.clone(), Subscription { id, redelivery, slot, epoch, cancel, feeds, partitions, wanted, incarnation });
        self.grow_due |= wanted > partitions;
        let subscribed = &self.subscriptions;
        self.client.lock().unwrap().forget_unused(self.info.number, |t| subscribed.contains_key(t));
        // Dead letters an operator redrove while the client was away come now.
        if self.d.store.redrives_pending() > 0 {
            self.start_redrive(&topic);
        }
        Ok(())
    }

    /// A chat room or a dashboard subscribes before anything was published: on the embedded log a
    /// session that could create `topic` by publishing to it (`embedded.auto_create_topics`, its
    /// publish rights) creates it by subscribing too, with `embedded.default_partitions`, within
    /// `limits.max_topics`. Only a first subscribe (no resume token) of a name never deleted here:
    /// a client coming back to a topic an operator deleted does not bring it back. Anyone else
    /// still gets `unknown_topic` (issue 61, item 1).
    async fn create_missing_topic(&self, topic: &TopicName) -> Result<(), FrameError> {
        let settings = self.d.settings();
        let Some(partitions) = settings.subscribe_creates_partitions else { return Ok(()) };
        if !self.publish_creates_topics() || self.is_hub() || !self.access.may_publish(topic.as_str()) || topic.lite().is_some() {
            return Ok(());
        }
        if self.d.backend.partitions(topic).await.map_err(crate::core::frame_errors::backend_frame_error)?.is_some() {
            return Ok(());
        }
        // A topic of this name was deleted here: an operator's deletion stands against
        // subscribers (a client coming back without its token included); a publish recreates it.
        if self.d.store.topic_incarnation(topic).map_or(true, |incarnation| incarnation.id != 0) {
            return Ok(());
        }
        match self.d.backend.create_topic(topic, partitions).await {
            Ok(created) => {
                if created {
                    tracing::info!(client_id = %self.info.client_id, %topic, partitions, "topic created by a subscribe");
                }
                Ok(())
            }
            // Created meanwhile by a publish or another subscribe, with another partition count.
            Err(crate::core::backend::BackendError::Conflict(_)) => Ok(()),
            Err(e) => Err(crate::core::frame_errors::backend_frame_error(e)),
        }
    }

    /// Each subscribe plans every partition (bounds, store reads, a write; a group's may start a
    /// hub): a client may not make thousands a second (an SSE URL naming a topic over and over,
    /// a frames POST).
    pub(super) fn count_subscribe(&mut self) -> Result<(), FrameError> {
        let now = tokio::time::Instant::now();
        let (second, made) = &mut self.subscribes_in_second;
        if now.duration_since(*second) >= std::time::Duration::from_secs(1) {
            (*second, *made) = (now, 0);
        }
        let per_sec = self.d.settings().max_subscribes_per_sec;
        if *made >= per_sec {
            return Err(FrameError::new(
                ErrorCode::LimitExceeded,
                format!("a session may subscribe {per_sec} times a second (limits.max_subscribes_per_sec); retry in a second"),
            ));
        }
        *made += 1;
        Ok(())
    }

    /// One feeder per start point, for subscription `id`, planned when `truncations` had been
    /// found (`Readers::truncations`): kept in the subscription, they end with it.
    fn feed(&self, topic: &TopicName, starts: &[StartPoint], id: u64, cancel: &CancellationToken, truncations: u64) -> Vec<PartitionFeed> {
        let batch = self.d.settings().fetch_batch;
        starts
            .iter()
            .map(|start| {
                let reader = self.d.readers.get(&TopicPartition::new(topic.clone(), start.partition), start.log_start);
                let plan = FeedPlan { reader, partition: start.partition, from: start.from, batch, subscription: id, topic: topic.clone(), truncations };
                let target = FeedTarget { window: self.window.clone(), tx: self.feed_tx.clone(), cancel: cancel.clone(), tasks: self.d.tasks.clone() };
                start_feed(plan, target)
            })
            .collect()
    }

    /// Feeds the partitions added to subscribed topics since they were planned (issue 21): each
    /// new partition starts at the client's stored offset, else at its log start, never at the
    /// log end, so nothing published to it is skipped. A plan that fails is tried again on the
    /// next tick.
    pub(super) async fn grow_subscriptions(&mut self) {
        let growing: Vec<TopicName> = self.subscriptions.iter().filter(|(_, s)| s.wanted > s.partitions).map(|(t, _)| t.clone()).collect();
        for topic in growing {
            let Some(subscription) = self.subscriptions.get(&topic) else { continue };
            let (id, epoch, first, cancel) = (subscription.id, subscription.epoch, subscription.partitions, subscription.cancel.clone());
            let truncations = self.d.readers.truncations();
            let none = BTreeMap::new();
            let planned = self
                .d
                .plan_subscription(
                    &self.info.client_id,
                    &self.client,
                    &topic,
                    StartFrom::Earliest,
                    ResumeFloors { floors: &none, claimed: false },
                    epoch,
                    first,
                )
                .await;
            let starts = match planned {
                Ok(starts) => starts,
                Err(e) => {
                    tracing::warn!(session_id = %self.info.session_id, %topic, error = %e.message, "feeding partitions added to a topic failed; trying again");
                    continue;
                }
            };
            // Unsubscribed or subscribed anew meanwhile: that subscription planned its own.
            if self.subscriptions.get(&topic).is_none_or(|s| s.id != id) {
                continue;
            }
            // No `subscribed` frame for an added partition: a gap there gets its own frame.
            for start in &starts {
                if let Some((from, to)) = start.gap {
                    self.gap(&topic, start.partition, from, to);
                }
            }
            let feeds = self.feed(&topic, &starts, id, &cancel, truncations);
            let subscription = self.subscriptions.get_mut(&topic).expect("checked above");
            subscription.feeds.extend(feeds);
            subscription.partitions = subscription.partitions.max(first + starts.len() as u32);
            if starts.is_empty() {
                continue; // the backend's count lags the watch's: tried again on the next tick
            }
            tracing::info!(session_id = %self.info.session_id, %topic, partitions = subscription.partitions, "subscription extended to partitions added to its topic");
        }
        self.grow_due = self.subscriptions.values().any(|s| s.wanted > s.partitions);
    }

    pub(super) fn unsubscribe(&mut self, topic: &str, req: Option<Value>) -> Result<(), FrameError> {
        let topic = TopicName::parse(topic).map_err(|e| FrameError::new(ErrorCode::InvalidName, e.0))?;
        if !self.release_topic(&topic) && !self.leave_group(&topic) {
            return Err(FrameError::new(ErrorCode::NotSubscribed, format!("not subscribed to {topic}")));
        }
        self.send(ServerFrame::Unsubscribed { topic: topic.to_string(), req });
        Ok(())
    }

    /// Stops a subscription and releases its in-flight deliveries; false when there was none.
    pub(super) fn release_topic(&mut self, topic: &TopicName) -> bool {
        self.take_subscription(topic).is_some()
    }

    /// Stops a subscription and releases its in-flight deliveries; its feeds (the readers' leases)
    /// go when the caller drops it.
    fn take_subscription(&mut self, topic: &TopicName) -> Option<Subscription> {
        let subscription = self.subscriptions.remove(topic)?;
        subscription.cancel.cancel();
        self.d.remove_subscriber(topic);
        self.in_flight.release_slot(subscription.slot);
        self.release_redrives(topic, subscription.slot);
        self.info.stats.in_flight.store(self.in_flight.len(), Ordering::Relaxed);
        self.info.subscriptions.lock().unwrap().retain(|t| t != topic);
        Some(subscription)
    }

    /// A batch of one partition's events becoming in-flight deliveries and `event` frames: one
    /// client-state lock, one block of sequence numbers and one clock read for the batch.
    /// `Step::Close` when the batch says the partition's log was truncated below this session.
    pub(super) async fn on_fed(&mut self, fed: FedBatch) -> Step {
        let fed = *fed;
        let Some(subscription) = self.subscriptions.get(&fed.topic).filter(|s| s.id == fed.subscription) else {
            return Step::Continue; // from a subscription that has ended
        };
        if let Some(log_end) = fed.truncated {
            let epoch = subscription.epoch;
            self.close_for_truncation(TopicPartition::new(fed.topic.clone(), fed.partition), epoch, log_end).await;
            return Step::Close(close_code::DRAINING, "the log was truncated below this session; resubscribe");
        }
        let (slot, epoch) = (subscription.slot, subscription.epoch);
        let (ack_timeout, max_attempts) = (subscription.redelivery.ack_timeout, subscription.redelivery.max_attempts);
        if let Some((from, to)) = fed.gap {
            self.gap(&fed.topic, fed.partition, from, to);
        }
        let first_seq = self.d.next_seqs(fed.events.len() as u64);
        let tp = TopicPartition::new(fed.topic.clone(), fed.partition);
        let attempts: Vec<Option<u32>> = {
            let mut client = self.client.lock().unwrap();
            match client.tracker_of_epoch(&tp, epoch) {
                Some(tracker) => fed.events.iter().zip(first_seq..).map(|((event, _), seq)| tracker.on_delivery(event.offset, seq)).collect(),
                None => vec![None; fed.events.len()],
            }
        };
        let (delivered_at, now_ms) = (Instant::now(), self.d.clock.now_ms());
        let mut pushed = 0;
        for (((event, permit), seq), attempt) in fed.events.into_iter().zip(first_seq..).zip(attempts) {
            let at = EventRef { slot, partition: fed.partition, offset: event.offset };
            let Some(attempt) = attempt else {
                continue; // already acknowledged, or the tracker belongs to a later subscription
            };
            if attempt > max_attempts {
                drop(permit);
                Box::pin(self.dead_letter(&fed.topic, at, attempt - 1, "max_attempts".into())).await;
                continue;
            }
            if event.undecodable {
                // Nothing to deliver: recorded as a dead letter and counted as acknowledged.
                drop(permit);
                Box::pin(self.dead_letter(&fed.topic, at, attempt, "undecodable".into())).await;
                continue;
            }
            self.push_event(&fed.topic, seq, attempt, &event, at);
            pushed += 1;
            if attempt == 1 {
                self.d.metrics.publish_to_delivery.record(now_ms.saturating_sub(event.timestamp) as f64 / 1000.0);
            }
            if attempt > 1 {
                // Pushed before to a session that ended or unsubscribed without acking it.
                self.d.metrics.redelivered(RedeliveryReason::Disconnect);
            }
            let delivery = Delivery { seq, topic: fed.topic.clone(), attempt, event, delivered_at, permit };
            self.in_flight.insert(at, delivery, ack_timeout, delivered_at, now_ms);
        }
        self.d.metrics.delivered(pushed);
        self.info.stats.delivered.fetch_add(pushed, Ordering::Relaxed);
        self.info.stats.in_flight.store(self.in_flight.len(), Ordering::Relaxed);
        Step::Continue
    }

    /// The log of `tp` ends at `log_end`, below this session's position: what it handed out from
    /// there is gone, and the log writes new events at those offsets, which an ack of an old
    /// delivery would pass. Before the client hears anything (it reconnects at once): its acks so
    /// far are made durable, the partition's tracker (this subscription's) is forgotten, and its
    /// committed offset above the end is lowered, so the resubscribe starts at the end even when
    /// the log has grown past the old offset by then. Then `reconnect`, and the caller closes
    /// with 1012, as a drain does.
    async fn close_for_truncation(&mut self, tp: TopicPartition, epoch: Epoch, log_end: u64) {
        tracing::warn!(session_id = %self.info.session_id, client_id = %self.info.client_id, %tp, log_end, "the log was truncated below this session's position: closing it so that its client resubscribes");
        self.submit_acked().await;
        if let Err(e) = self.d.writer.barrier().await {
            tracing::warn!(session_id = %self.info.session_id, error = %e, "offset writes before a truncation close not confirmed");
        }
        // A later session of the client that planned this partition meanwhile has its own
        // tracker (and offset epoch): lowering the record under it would fence its acks; it
        // meets the truncation itself and lowers then.
        let newer = {
            let mut client = self.client.lock().unwrap();
            if client.tracker_of_epoch(&tp, epoch).is_some() {
                client.trackers.remove(&tp);
            }
            client.trackers.get(&tp).is_some_and(|t| t.epoch > epoch)
        };
        // The partition's reader started its next log epoch before any subscriber heard of the
        // loss (`PartitionReader::truncate`); the offset lowered here belongs to it.
        if !newer {
            let (min_epoch, log_end) = match self.d.store.log_epoch(&tp) {
                // A further loss came after the one this close is for (its epoch ends lower):
                // the offset is lowered to where that one ended, within it, or the client would
                // resume above events the log wrote again there (review finding of 6db1fef).
                Ok(log) if log.epoch > 0 && log.log_end < log_end => (log.first_offset_epoch(), log.log_end),
                Ok(log) => (log.first_offset_epoch(), log_end),
                Err(e) => {
                    tracing::warn!(%tp, error = %e, "could not read the partition's log epoch after a lost tail");
                    (LogEpoch::default().first_offset_epoch(), log_end)
                }
            };
            self.lower_truncated_offset(&tp, log_end, min_epoch).await;
        }
        self.send(ServerFrame::Reconnect { after_ms: 0, instance: None, ws_url: None });
    }

    /// Tells the client that `from`..`to`-1 of a partition are gone (a `gap` frame) and reports it.
    fn gap(&mut self, topic: &TopicName, partition: u32, from: u64, to: u64) {
        self.send(ServerFrame::Gap { topic: topic.to_string(), partition, from, to });
        self.d.report_gap(&self.info.client_id, topic, partition, (from, to));
    }

    pub(super) fn push_event(&mut self, topic: &TopicName, seq: u64, attempt: u32, event: &Event, at: EventRef) {
        let id = DeliveryRef { seq, slot: at.slot, partition: at.partition, offset: at.offset };
        let mut frame = String::new();
        crate::core::protocol::write_shared_event_frame(&mut frame, id, topic.as_str(), attempt, event);
        if at.is_redrive() {
            frame.pop();
            frame.push_str(",\"redrive\":true}");
        }
        if self.is_hub() {
            self.out.push(Outbound::Shared(Box::new(crate::core::transport::SharedEvent {
                text: frame,
                delivery: id,
                key: event.key.clone(),
                bytes: event.size_bytes(),
            })));
            return;
        }
        self.out.push(Outbound::Text(frame));
    }
}

impl Session {
    /// The client's records on `topic` at the other instances, when the cluster has peers and
    /// this instance has no record of it there (a group's hub: always) (`core::peer_offsets`);
    /// asked once per topic and session. A peer that does not answer in time is left out (its records are not used, and
    /// the plan falls back on what the others hold, else on `delivery.reset_policy`).
    async fn records_at_peers(&mut self, topic: &TopicName) -> Option<BTreeMap<u32, ResumeOffset>> {
        let peers = self.d.peer_offsets.get()?.clone();
        if let Some(known) = self.peer_records.as_ref().and_then(|r| r.get(topic)) {
            return Some(known.clone());
        }
        // A group's hub asks even with a record here: the group may have lived elsewhere since.
        if !self.is_hub() {
            let filter = OffsetFilter { topic: Some(topic.clone()), client_id: Some(self.info.client_id.clone()), partition: None };
            let store = self.d.store.clone();
            let has_record = tokio::task::spawn_blocking(move || store.scan_page(&filter, None, 1).map(|rows| !rows.is_empty())).await;
            if !matches!(has_record, Ok(Ok(false))) {
                return None;
            }
        }
        let records = peers.client_records(topic, &self.info.client_id).await;
        if !records.offsets.is_empty() || !records.unanswered.is_empty() {
            tracing::info!(
                client_id = %self.info.client_id,
                %topic,
                partitions = records.offsets.len(),
                unanswered = records.unanswered.len(),
                "subscribe without a resume token or a record here: starting from the client's records at the peers"
            );
        }
        self.peer_records.get_or_insert_with(Default::default).insert(topic.clone(), records.offsets.clone());
        Some(records.offsets)
    }
}

/// The peers' records of a client, raised by its claim (the older map form) where the claim is of
/// a record's epoch: as a record here would be (`plan_subscription`). False with them when a
/// claimed partition had no record of its epoch to be clamped to (not applied).
fn clamp_claim(claim: &BTreeMap<u32, ResumeOffset>, mut records: BTreeMap<u32, ResumeOffset>) -> (BTreeMap<u32, ResumeOffset>, bool) {
    let all_applied = claim.iter().all(|(partition, claimed)| records.get(partition).is_some_and(|r| r.epoch == claimed.epoch));
    for (partition, record) in records.iter_mut() {
        if let Some(claimed) = claim.get(partition).filter(|c| c.epoch == record.epoch) {
            record.offset = record.offset.max(claimed.offset);
        }
    }
    (records, all_applied)
}
