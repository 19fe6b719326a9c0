//! A session as a member of shared subscriptions (`subscribe` with `group`, `core::group`): it
//! joins the group, writes the event frames its group assigns it, and sends the acks, nacks,
//! extends and terms of those deliveries to the group instead of settling them itself. The
//! group's progress is its hub's; this session only holds the delivery ids it was given.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{run_session, Session, Step};
use crate::core::access::Access;
use crate::core::client_state::DeliveryRef;
use crate::core::dispatcher::Dispatcher;
use crate::core::group::{GroupHandle, GroupHome, HubEnds, HubStarter, MemberLink, Settled};
use crate::core::names::{ClientId, GroupName, TopicName};
use crate::core::offsets::OffsetFilter;
use crate::core::protocol::{close_code, ErrorCode, FrameError, GroupJoin, Resume, ServerFrame, StartFrom};
use crate::core::resume_token::{Holder, Refusal};
use crate::core::session_control::GroupMessage;
use crate::core::session_registry::Transport;
use crate::core::transport::Duplex;
use crate::core::transport::{Inbound, Outbound};
use crate::core::FastMap;

/// The groups a session is a member of and the group deliveries it holds.
#[derive(Default)]
pub(super) struct Memberships {
    joined: FastMap<TopicName, (GroupName, GroupHandle)>,
    /// Each group delivery the session holds, with the topic of its group: acks of these ids go
    /// to the group.
    held: FastMap<DeliveryRef, TopicName>,
    /// Group deliveries acked lately (at most `RECENT_KEPT`, oldest first out): an ack of one
    /// again (a client confirming what it acked plainly, with `req`) goes to the group too,
    /// whose answer is the no-op success with its floor.
    recent: FastMap<DeliveryRef, TopicName>,
    recent_order: VecDeque<DeliveryRef>,
}

/// Acked group deliveries a member remembers (`Memberships::recent`).
const RECENT_KEPT: usize = 4096;

/// How long a join waits for a group's old home to stop its hub, and how often it asks.
const HANDOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(15);
const HANDOVER_POLL: std::time::Duration = std::time::Duration::from_millis(250);

impl Memberships {
    /// The group topic of a delivery the session holds, or acked lately (`settled`: taken out of
    /// what it holds and remembered as acked).
    fn topic_of(&mut self, delivery: &DeliveryRef, settled: bool) -> Option<TopicName> {
        if let Some(topic) = self.held.get(delivery).cloned() {
            if settled {
                self.held.remove(delivery);
                self.recent.insert(*delivery, topic.clone());
                self.recent_order.push_back(*delivery);
                if self.recent_order.len() > RECENT_KEPT {
                    if let Some(oldest) = self.recent_order.pop_front() {
                        self.recent.remove(&oldest);
                    }
                }
            }
            return Some(topic);
        }
        self.recent.get(delivery).cloned()
    }
}

/// Starts hubs as sessions of this gateway (`HubStarter`).
struct SessionHubs<'a>(&'a Arc<Dispatcher>);

impl HubStarter for SessionHubs<'_> {
    fn start(&self, group: &GroupName) -> Result<HubEnds, FrameError> {
        let d = self.0;
        // A join that raced the group's move away (its hub here stopped meanwhile) starts
        // nothing here: the member subscribes again and is sent to the new home.
        if let Some((instance, _)) = self.home().and_then(|home| home.elsewhere(group)) {
            return Err(FrameError::new(ErrorCode::Unavailable, format!("group {group} now lives on instance {instance}; subscribe again")));
        }
        let registration = d.register(ClientId::of_group(group), None, Transport::Group)?;
        // Nothing is taken before members bring their windows (the distributor sizes it).
        registration.info.window.set_max_events(0);
        let window = registration.info.window.clone();
        let (inbound, inbound_rx) = mpsc::unbounded_channel::<Inbound>();
        let (outbound_tx, outbound) = mpsc::unbounded_channel::<Outbound>();
        let frames_in = futures_util::stream::unfold(inbound_rx, |mut rx| async move { rx.recv().await.map(|frame| (frame, rx)) });
        let frames_out = futures_util::sink::unfold(outbound_tx, |tx, frame: Outbound| async move {
            tx.send(frame).map_err(|_| ())?;
            Ok::<_, ()>(tx)
        });
        d.tasks.spawn(run_session(d.clone(), registration, Access::default(), Duplex { inbound: Box::pin(frames_in), outbound: Box::pin(frames_out) }, None));
        Ok(HubEnds { inbound, outbound, window, cap: d.settings().group_max_in_flight })
    }

    fn home(&self) -> Option<Arc<dyn GroupHome>> {
        self.0.group_home.get().cloned()
    }
}

impl Session {
    /// `subscribe` with `group`: joins the group on this topic (a direct subscription of the
    /// topic, or another group's, is replaced). A group that lives on another instance of the
    /// cluster sends the session there: `reconnect` naming it, then 1012.
    pub(super) async fn subscribe_group(
        &mut self,
        topic: &str,
        from: StartFrom,
        resume: &Resume,
        join: GroupJoin,
        req: Option<Value>,
    ) -> Result<(), FrameError> {
        let topic = TopicName::parse(topic).map_err(|e| FrameError::new(ErrorCode::InvalidName, e.0))?;
        let group = GroupName::parse(&join.name).map_err(|e| FrameError::new(ErrorCode::InvalidName, e.0))?;
        if !self.access.allows(topic.as_str()) {
            return Err(FrameError::new(ErrorCode::Forbidden, format!("this session's token does not allow topic {topic}")));
        }
        if !self.access.may_join(group.as_str()) {
            return Err(FrameError::new(ErrorCode::Forbidden, format!("this session's token does not allow group {group} (its groups claim)")));
        }
        self.count_subscribe()?;
        if let Some((instance, ws_url)) = self.d.group_home.get().and_then(|home| home.elsewhere(&group)) {
            tracing::info!(session_id = %self.info.session_id, %group, %instance, "member sent to its group's instance");
            self.send(ServerFrame::Reconnect { after_ms: 0, instance: Some(instance), ws_url: Some(ws_url) });
            // Closes with 1012 on this step (`settle_check` past its deadline).
            self.settling = Some(tokio::time::Instant::now());
            return Ok(());
        }
        let joined = self.groups.as_ref().is_some_and(|g| g.joined.contains_key(&topic));
        let limit = self.d.settings().max_subscriptions_per_session;
        if !joined && !self.subscriptions.contains_key(&topic) && self.subscriptions.len() + self.group_count() >= limit {
            return Err(FrameError::new(ErrorCode::LimitExceeded, format!("a session may hold {limit} subscriptions (limits.max_subscriptions_per_session)")));
        }
        self.release_topic(&topic);
        self.leave_group(&topic);
        let link = MemberLink {
            member: self.info.number,
            session_id: self.info.session_id.clone(),
            client_id: self.info.client_id.clone(),
            control: self.control.clone(),
            capacity: self.window.max_events(),
            capacity_bytes: self.window.max_bytes(),
        };
        // A named start (`latest`, a time, the last n) is where a group with no floor begins; a
        // group that has one goes on from it, whichever member comes first.
        let from = match from {
            StartFrom::Committed | StartFrom::Earliest => from,
            named => match self.group_has_floor(&topic, &group).await? {
                true => StartFrom::Committed,
                false => named,
            },
        };
        // A group's floor moves only through its members' acks and tokens issued to the group:
        // a client's own token or map, or another group's token, is refused (and never joins).
        let (floors, outcome) = match resume {
            Resume::None => (BTreeMap::new(), None),
            Resume::Claimed(_) => (BTreeMap::new(), Some(Err(Refusal::OtherGroup))),
            Resume::Token(text) => match self.d.open_resume_token(text, &Holder::Group(group.to_string()), &topic) {
                Ok(floors) => (floors, Some(Ok(()))),
                Err(refusal) => (BTreeMap::new(), Some(Err(refusal))),
            },
        };
        if let Some(Err(refusal)) = outcome {
            tracing::info!(client_id = %self.info.client_id, %topic, %group, reason = refusal.as_str(), "resume token refused for a shared subscription: the group goes on from its floor");
        }
        let groups = self.d.groups.clone();
        if !groups.is_live(&topic, &group) {
            self.wait_while_live_at_peers(&topic, &group).await?;
        }
        let (handle, mut subscribed) = groups.join(&SessionHubs(&self.d), &topic, &group, join.order, from, &floors, link).await?;
        subscribed["group"] = Value::from(group.as_str());
        if let Some(frame) = subscribed.as_object_mut() {
            frame.remove("resume");
            frame.remove("resume_reason");
            if let Some(outcome) = outcome {
                frame.insert("resume".into(), Value::from(if outcome.is_ok() { "applied" } else { "refused" }));
                if let Err(refusal) = outcome {
                    frame.insert("resume_reason".into(), Value::from(refusal.as_str()));
                }
            }
        }
        match req {
            Some(req) => subscribed["req"] = req,
            None => {
                if let Some(frame) = subscribed.as_object_mut() {
                    frame.remove("req");
                }
            }
        }
        self.d.metrics.frame_out("subscribed");
        self.out.push(super::Outbound::Text(subscribed.to_string()));
        self.info.groups.lock().unwrap().push((topic.clone(), group.clone()));
        self.groups.get_or_insert_with(Default::default).joined.insert(topic, (group, handle));
        Ok(())
    }

    /// The group deliveries it holds fill its window (`delivery.max_in_flight`).
    pub(super) fn group_window_full(&self) -> bool {
        self.groups.as_ref().is_some_and(|g| g.held.len() >= self.window.max_events())
    }

    /// Waits (at most `HANDOVER_WAIT`) until no peer runs the group: its old home stops its hub
    /// once it sees the group's home moved (`hub::distribute`), and its acks are durable by then,
    /// so the hub starting here reads the group's floor from it (`records_at_peers`).
    async fn wait_while_live_at_peers(&self, topic: &TopicName, group: &GroupName) -> Result<(), FrameError> {
        let Some(home) = self.d.group_home.get().cloned() else { return Ok(()) };
        let started = tokio::time::Instant::now();
        loop {
            let live = home.live_at_peers(topic, group).await;
            if live.is_empty() {
                return Ok(());
            }
            if started.elapsed() >= HANDOVER_WAIT {
                return Err(FrameError::new(
                    ErrorCode::Unavailable,
                    format!("group {group} of topic {topic} still runs on {}; subscribe again in a moment", live.join(", ")),
                ));
            }
            tracing::info!(%topic, %group, peers = ?live, "shared subscription still runs at a peer: its hub here waits for it to stop");
            tokio::time::sleep(HANDOVER_POLL).await;
        }
    }

    /// True when the store holds a floor of `group` on `topic`.
    async fn group_has_floor(&self, topic: &TopicName, group: &GroupName) -> Result<bool, FrameError> {
        let (store, filter) = (self.d.store.clone(), OffsetFilter { topic: Some(topic.clone()), client_id: Some(ClientId::of_group(group)), partition: None });
        let scanned = tokio::task::spawn_blocking(move || store.scan(&filter)).await;
        match scanned {
            Ok(Ok(rows)) => Ok(!rows.is_empty()),
            Ok(Err(e)) => Err(FrameError::unavailable("the offset store", e)),
            Err(e) => Err(FrameError::unavailable("the offset store", e)),
        }
    }

    /// A shared subscription the session is a member of that `access` does not allow (its topic,
    /// or its group), if any.
    pub(super) fn group_not_allowed(&self, access: &Access) -> Option<(TopicName, GroupName)> {
        let joined = self.groups.as_ref()?;
        joined
            .joined
            .iter()
            .find(|(topic, (group, _))| !access.allows(topic.as_str()) || !access.may_join(group.as_str()))
            .map(|(t, (g, _))| (t.clone(), g.clone()))
    }

    fn group_count(&self) -> usize {
        self.groups.as_ref().map_or(0, |g| g.joined.len())
    }

    /// Leaves the group the session joined on `topic`; false when it joined none there. Its
    /// group deliveries are released to the other members.
    pub(super) fn leave_group(&mut self, topic: &TopicName) -> bool {
        let Some(groups) = self.groups.as_mut() else { return false };
        let Some((_, handle)) = groups.joined.remove(topic) else { return false };
        handle.leave(self.info.number);
        groups.held.retain(|_, t| t != topic);
        groups.recent.retain(|_, t| t != topic);
        groups.recent_order.retain(|d| groups.recent.contains_key(d));
        self.info.groups.lock().unwrap().retain(|(t, _)| t != topic);
        true
    }

    /// Leaves every group (the session ends).
    pub(super) fn leave_groups(&mut self) {
        let topics: Vec<TopicName> = self.groups.as_ref().map(|g| g.joined.keys().cloned().collect()).unwrap_or_default();
        for topic in topics {
            self.leave_group(&topic);
        }
    }

    /// True when the session is a member, on `topic`, of the group run `generation`.
    fn joined_run(&self, topic: &TopicName, generation: u64) -> bool {
        self.groups.as_ref().and_then(|g| g.joined.get(topic)).is_some_and(|(_, handle)| handle.generation() == generation)
    }

    pub(super) fn on_group_message(&mut self, generation: u64, message: GroupMessage) -> Step {
        match message {
            GroupMessage::Events { topic, events } => {
                // Left meanwhile (the group released them), or of a run it no longer belongs to.
                if !self.joined_run(&topic, generation) {
                    return Step::Continue;
                }
                let Some(groups) = self.groups.as_mut() else { return Step::Continue };
                let n = events.len() as u64;
                for (delivery, text) in events {
                    groups.held.insert(delivery, topic.clone());
                    self.out.push(super::Outbound::Text(text));
                }
                self.d.metrics.delivered(n);
                self.info.stats.delivered.fetch_add(n, Ordering::Relaxed);
            }
            GroupMessage::Frames(frames) => {
                for frame in frames {
                    self.out.push(super::Outbound::Text(frame));
                }
            }
            GroupMessage::TakenBack(deliveries) => {
                if let Some(groups) = self.groups.as_mut() {
                    for delivery in deliveries {
                        groups.held.remove(&delivery);
                    }
                }
            }
            GroupMessage::Ended { topic, moved_to } => {
                if self.joined_run(&topic, generation) {
                    self.leave_group(&topic);
                    let (instance, ws_url) = moved_to.unzip();
                    self.send(ServerFrame::Reconnect { after_ms: 0, instance, ws_url });
                    return Step::Close(close_code::DRAINING, "the shared subscription stopped on this instance; subscribe again");
                }
            }
        }
        Step::Continue
    }

    /// Sends the group deliveries among `ids` to their groups as acks (one frame per group, with
    /// `req`, whose `ack_ok` the group answers); answers the other ids, `None` when none was a
    /// group delivery.
    pub(super) fn ack_group_deliveries<S: AsRef<str>>(&mut self, ids: &[S], req: &Option<Value>) -> Option<Vec<String>> {
        let groups = self.groups.as_mut()?;
        let mut own = Vec::new();
        let mut by_topic: FastMap<TopicName, Vec<DeliveryRef>> = FastMap::default();
        for id in ids {
            match DeliveryRef::parse(id.as_ref()).and_then(|d| groups.topic_of(&d, true).map(|topic| (d, topic))) {
                Some((delivery, topic)) => by_topic.entry(topic).or_default().push(delivery),
                None => own.push(id.as_ref().to_string()),
            }
        }
        if by_topic.is_empty() {
            return None;
        }
        let mut acked = 0;
        for (topic, deliveries) in by_topic {
            let Some((_, handle)) = groups.joined.get(&topic) else { continue };
            acked += deliveries.len() as u64;
            let mut frame = json!({"op": "ack", "delivery_ids": deliveries.iter().map(|d| d.to_id()).collect::<Vec<_>>()});
            if let Some(req) = req {
                frame["req"] = req.clone();
            }
            handle.forward(self.info.number, deliveries.into_iter().map(|d| (d, Settled::Done)).collect(), frame.to_string());
        }
        self.info.stats.acked.fetch_add(acked, Ordering::Relaxed);
        self.info.stats.last_ack_at.store(self.d.clock.now_ms(), Ordering::Relaxed);
        Some(own)
    }

    /// A nack, extend or term of a group delivery goes to its group as the client sent it; false
    /// when `delivery_id` is not a group delivery of this session.
    pub(super) fn forward_to_group(&mut self, delivery_id: &str, mut frame: Value) -> bool {
        let Some(groups) = self.groups.as_mut() else { return false };
        let Some(delivery) = DeliveryRef::parse(delivery_id) else { return false };
        let Some(topic) = groups.held.get(&delivery).cloned() else { return false };
        let Some((_, handle)) = groups.joined.get(&topic) else { return false };
        let settles = match frame["op"].as_str() {
            Some("nack") => {
                // A pause is capped for a group (`delivery.group_max_nack_delay_ms`), and holds a
                // slot of this member until the event comes back.
                let cap = self.d.settings().group_max_nack_delay.as_millis() as u64;
                if frame["delay_ms"].as_u64().is_some_and(|delay| delay > cap) {
                    frame["delay_ms"] = cap.into();
                }
                let paused = frame["delay_ms"].as_u64().is_some_and(|delay| delay > 0);
                vec![(delivery, if paused { Settled::Paused } else { Settled::Released })]
            }
            Some("term") => vec![(delivery, Settled::Done)],
            _ => Vec::new(),
        };
        if !settles.is_empty() {
            groups.held.remove(&delivery);
        }
        handle.forward(self.info.number, settles, frame.to_string());
        true
    }
}
