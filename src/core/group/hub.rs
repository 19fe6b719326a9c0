//! A shared subscription's distributor: the other end of its hub session's "socket". It offers
//! the hub's event frames to `Sharing`, sends what that assigns to the members, forwards the
//! members' frames to the hub and the hub's answers back, and keeps the hub's window the size of
//! its members' windows together (so that no event waits long at the hub for a member: its ack
//! timeout runs from when the hub hands it out).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::sharing::{Offered, Sharing};
use super::{Command, GroupHome, GroupView, Groups, HubEnds, MemberLink, MemberView};
use crate::core::client_state::DeliveryRef;
use crate::core::names::{GroupName, TopicName};
use crate::core::protocol::{ErrorCode, FrameError, ResumeOffset, ShareOrder, StartFrom};
use crate::core::session_control::{GroupMessage, SessionControl};
use crate::core::transport::{Inbound, Outbound};
use crate::core::window::Window;

/// Whose answer a forwarded frame waits for.
enum Asker {
    Member(u64),
    /// The hub's own `subscribe`, sent when the first member joined.
    Subscribe,
}

type Answer = std::pin::Pin<Box<dyn std::future::Future<Output = (Asker, Vec<String>)> + Send>>;

struct Distributor {
    topic: TopicName,
    group: GroupName,
    /// `None` once the group stops: the hub's inbound ends, and with it the hub.
    hub: Option<mpsc::UnboundedSender<Inbound>>,
    window: Arc<Window>,
    sharing: Sharing,
    members: HashMap<u64, MemberLink>,
    /// The hub's `subscribed` frame, once it answered; joins wait for it.
    subscribed: Option<Value>,
    joining: Vec<(MemberLink, oneshot::Sender<Result<Value, FrameError>>)>,
    answers: FuturesUnordered<Answer>,
    /// A member joined once: from then on, no members and none joining stops the group.
    joined_once: bool,
    /// This run of the group (`Groups`): what its messages to members carry.
    generation: u64,
    /// The hub's `subscribe` is on its way (its answer not in).
    subscribing: bool,
    /// The resume token the hub subscribed with: per partition the highest its members brought.
    resumed: BTreeMap<u32, ResumeOffset>,
    /// Per partition the floor the hub last named (`subscribed`'s `from`, `ack_ok`s' `committed`,
    /// with `subscribed`'s epoch): a member's token at or below it is nothing new.
    floors: BTreeMap<u32, ResumeOffset>,
    /// What `resumed` was before a re-subscribe that may be refused (a token naming a partition
    /// the topic does not have): it is restored then.
    resumed_before: Option<BTreeMap<u32, ResumeOffset>>,
    /// The most the hub may have in flight (`delivery.group_max_in_flight`).
    cap: usize,
    /// A member brought a token above it: the hub subscribes again with it once the current
    /// `subscribe` is answered.
    resume_again: bool,
    /// The first member's `from`: where the hub starts a partition the group has no floor of.
    from: StartFrom,
    /// The paused events the hub's window was last sized for.
    paused: usize,
    /// The hub session's own byte window (`delivery.max_in_flight_bytes`).
    own_bytes: u64,
    /// Where the group lives, in a cluster: checked every `HOME_CHECK`; when it is elsewhere the
    /// members are sent there and the hub stops.
    home: Option<Arc<dyn GroupHome>>,
    /// Commands that came while the hub stops (joins, leaves, forwarded frames): dropped when it
    /// has stopped, so a join waiting on one tries the next hub.
    deferred: Vec<Command>,
    /// The group's home moved (to this instance and `ws_url`), at this time: its members were
    /// sent there; nothing more is handed out, and the hub stops once they have left (at most
    /// `MOVE_SETTLE` later).
    moving: Option<(String, String, tokio::time::Instant)>,
}

/// How often a running hub checks that its group still lives on this instance.
const HOME_CHECK: std::time::Duration = std::time::Duration::from_millis(500);
/// How long a hub whose group moved waits for its members to leave before it stops anyway.
const MOVE_SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) async fn distribute(
    groups: Arc<Groups>,
    topic: TopicName,
    group: GroupName,
    generation: u64,
    order: ShareOrder,
    links: HubEnds,
    mut commands: mpsc::UnboundedReceiver<Command>,
    home: Option<Arc<dyn GroupHome>>,
) {
    let HubEnds { inbound, mut outbound, window, cap } = links;
    let own_bytes = window.max_bytes();
    let mut g = Distributor {
        topic: topic.clone(),
        group: group.clone(),
        hub: Some(inbound),
        window,
        sharing: Sharing::new(order),
        members: HashMap::new(),
        subscribed: None,
        joining: Vec::new(),
        answers: FuturesUnordered::new(),
        joined_once: false,
        generation,
        subscribing: false,
        resumed: BTreeMap::new(),
        floors: BTreeMap::new(),
        resumed_before: None,
        cap,
        resume_again: false,
        from: StartFrom::Committed,
        paused: 0,
        own_bytes,
        home,
        deferred: Vec::new(),
        moving: None,
    };
    let mut home_check = tokio::time::interval(HOME_CHECK);
    home_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut commands_open = true;
    loop {
        tokio::select! {
            command = commands.recv(), if commands_open => match command {
                Some(command) if g.hub.is_some() => g.on_command(command),
                // A stopping hub still describes itself: a peer that would start the group asks
                // whether it runs here (`GroupHome::live_at_peers`).
                Some(Command::Describe(reply)) => g.on_command(Command::Describe(reply)),
                Some(command) => g.deferred.push(command),
                None => {
                    commands_open = false;
                    g.stop();
                }
            },
            _ = home_check.tick(), if g.hub.is_some() && g.home.is_some() => g.check_home(),
            frame = outbound.recv() => match frame {
                Some(frame) => {
                    g.on_hub_frame(frame);
                    // What the hub sent together is shared out together.
                    while let Ok(frame) = outbound.try_recv() {
                        g.on_hub_frame(frame);
                    }
                }
                None => break,
            },
            Some((asker, frames)) = g.answers.next() => g.on_answer(asker, frames),
        }
        if g.hub.is_some() && g.moving.is_none() {
            g.share_out();
        }
        if g.sharing.paused_without_member() != g.paused && g.hub.is_some() {
            g.resize_window();
        }
        if g.hub.is_some() && g.joined_once && g.members.is_empty() && g.joining.is_empty() {
            g.stop();
        }
    }
    // The hub has ended (its acks durable): only now is the group not live here, for a join here
    // (deferred joins try again, `Groups::join`) and for a peer that would start it.
    groups.forget(&topic, &group, generation);
    drop(std::mem::take(&mut g.deferred));
    for (_, reply) in g.joining.drain(..) {
        let _ = reply.send(Err(FrameError::new(ErrorCode::Unavailable, format!("group {group} of topic {topic} stopped; subscribe again"))));
    }
    for link in g.members.values() {
        link.control.send(SessionControl::Group { generation, message: GroupMessage::Ended { topic: topic.clone(), moved_to: None } });
    }
    tracing::info!(%topic, %group, "shared subscription stopped on this instance");
}

impl Distributor {
    fn on_command(&mut self, command: Command) {
        match command {
            Command::Join { reply, .. } if self.moving.is_some() => {
                let _ = reply.send(Err(self.moved_error()));
            }
            Command::Join { link, from, resume, reply } => {
                if !self.joined_once {
                    self.from = from;
                }
                self.joined_once = true;
                // A member's token above where the hub started (it was told a floor this
                // instance did not store: another instance served the group before it died)
                // moves the hub there: it subscribes again, with the higher token.
                let before = self.resumed.clone();
                let higher = self.merge_resume(&resume);
                if !higher {
                    // Nothing above what the hub stands at: kept as it was (a lower token of a
                    // partition the hub never named would only start it lower next time).
                    self.resumed = before.clone();
                }
                match (&self.subscribed, higher) {
                    (Some(subscribed), false) => {
                        let _ = reply.send(Ok(subscribed.clone()));
                        self.add_member(link);
                    }
                    _ => {
                        self.joining.push((link, reply));
                        if self.subscribing {
                            self.resume_again |= higher;
                        } else {
                            if self.subscribed.is_some() {
                                self.resumed_before = Some(before);
                            }
                            self.subscribe_hub();
                        }
                    }
                }
            }
            Command::Leave { member } => {
                let Some(link) = self.members.remove(&member) else {
                    self.joining.retain(|(l, _)| l.member != member);
                    return;
                };
                let released = self.sharing.leave(member);
                self.resize_window();
                tracing::debug!(topic = %self.topic, group = %self.group, session_id = %link.session_id, released = released.len(), "member left its group");
                if !released.is_empty() {
                    // Released at once, as a session's end releases its deliveries.
                    let frames = released.iter().map(|d| json!({"op": "nack", "delivery_id": d.to_id(), "delay_ms": 0}).to_string()).collect();
                    self.ask_quietly(frames);
                }
            }
            Command::Forward { member, settles, frame } => {
                for (delivery, how) in settles {
                    self.sharing.settle(member, delivery, how);
                }
                self.ask(Asker::Member(member), vec![frame]);
            }
            Command::Describe(reply) => {
                let members = self
                    .sharing
                    .members()
                    .into_iter()
                    .filter_map(|(id, in_flight, keys)| {
                        let link = self.members.get(&id)?;
                        Some(MemberView { session_id: link.session_id.clone(), client_id: link.client_id.to_string(), in_flight, keys })
                    })
                    .collect();
                let order = self.sharing.order().as_str();
                let _ = reply.send(GroupView { topic: self.topic.to_string(), group: self.group.to_string(), order, members, waiting: self.sharing.waiting() });
            }
        }
    }

    /// Takes the higher of each partition's offsets (by epoch, then offset) into the hub's token;
    /// true when any is above both what the hub subscribed with and the floor it last named (a
    /// member that was told a floor this instance never stored: the group's last instance died).
    fn merge_resume(&mut self, resume: &BTreeMap<u32, ResumeOffset>) -> bool {
        let mut higher = false;
        for (partition, token) in resume {
            let floor = self.floors.get(partition).map_or((0, 0), |f| (f.epoch, f.offset));
            let known = self.resumed.entry(*partition).or_insert(ResumeOffset { offset: 0, epoch: 0 });
            if (token.epoch, token.offset) > (known.epoch, known.offset) {
                *known = *token;
                higher |= (token.epoch, token.offset) > floor;
            }
        }
        higher
    }

    /// The hub's `subscribe`: from the first member's `from` the first time, from the group's
    /// committed floor after that (a named start again would skip what the group holds), with
    /// the highest token.
    fn subscribe_hub(&mut self) {
        let resume: BTreeMap<String, u64> = self.resumed.iter().map(|(p, t)| (p.to_string(), t.offset)).collect();
        let epochs: BTreeMap<String, u64> = self.resumed.iter().map(|(p, t)| (p.to_string(), t.epoch)).collect();
        let from = match self.subscribed {
            Some(_) => StartFrom::Committed,
            None => self.from,
        };
        let frame = json!({"op": "subscribe", "topic": self.topic.as_str(), "from": from.to_json(), "resume": resume, "epochs": epochs});
        self.subscribing = true;
        self.ask(Asker::Subscribe, vec![frame.to_string()]);
    }

    /// Learns the floors a `subscribed` or an `ack_ok` of the hub names.
    fn learn_floors(&mut self, frame: &Value) {
        match frame["type"].as_str() {
            Some("subscribed") => {
                for p in frame["partitions"].as_array().into_iter().flatten() {
                    if let (Some(partition), Some(from)) = (p["partition"].as_u64(), p["from"].as_u64()) {
                        let epoch = p["epoch"].as_u64().unwrap_or(0);
                        self.floors.insert(partition as u32, ResumeOffset { offset: from, epoch });
                    }
                }
            }
            Some("ack_ok") => {
                for (partition, floor) in frame["committed"][self.topic.as_str()].as_object().into_iter().flatten() {
                    if let (Ok(partition), Some(floor)) = (partition.parse::<u32>(), floor.as_u64()) {
                        let known = self.floors.entry(partition).or_insert(ResumeOffset { offset: 0, epoch: 0 });
                        known.offset = known.offset.max(floor);
                    }
                }
            }
            _ => {}
        }
    }

    fn add_member(&mut self, link: MemberLink) {
        tracing::debug!(topic = %self.topic, group = %self.group, session_id = %link.session_id, client_id = %link.client_id, "member joined its group");
        self.sharing.join(link.member, link.capacity, link.capacity_bytes);
        self.members.insert(link.member, link);
        self.resize_window();
    }

    /// The hub may have in flight what its members can hold together, within its cap, and the
    /// paused events of members that left besides (they wait at the hub, charged to no member's
    /// slot): a member that nacks with a delay takes room from itself only (issue 59). A member's
    /// own paused events are in its slots, which the members' windows already count.
    fn resize_window(&mut self) {
        self.paused = self.sharing.paused_without_member();
        self.window.set_max_events(self.sharing.capacity().min(self.cap) + self.paused.min(self.cap));
        // In bytes: its members' byte windows together, and its own (the session's
        // `delivery.max_in_flight_bytes`) for the events waiting at it besides.
        self.window.set_max_bytes(self.own_bytes.saturating_add(self.sharing.capacity_bytes()));
    }

    /// Sends frames to the hub; their answers come back to `asker`.
    fn ask(&mut self, asker: Asker, texts: Vec<String>) {
        let Some(hub) = &self.hub else { return };
        let (answer, answered) = oneshot::channel();
        if hub.send(Inbound::Frames { texts, answer }).is_ok() {
            self.answers.push(Box::pin(async move { (asker, answered.await.unwrap_or_default()) }));
        }
    }

    /// Sends frames to the hub whose answers nobody reads.
    fn ask_quietly(&mut self, texts: Vec<String>) {
        if let Some(hub) = &self.hub {
            let (answer, _) = oneshot::channel();
            let _ = hub.send(Inbound::Frames { texts, answer });
        }
    }

    fn on_answer(&mut self, asker: Asker, frames: Vec<String>) {
        match asker {
            Asker::Member(member) => {
                for frame in frames.iter().filter(|f| f.starts_with("{\"type\":\"ack_ok\"")) {
                    if let Ok(frame) = serde_json::from_str::<Value>(frame) {
                        self.learn_floors(&frame);
                    }
                }
                if let Some(link) = self.members.get(&member).filter(|_| !frames.is_empty()) {
                    link.control.send(SessionControl::Group { generation: self.generation, message: GroupMessage::Frames(frames) });
                }
            }
            Asker::Subscribe => {
                self.subscribing = false;
                if std::mem::take(&mut self.resume_again) {
                    self.subscribe_hub();
                    return;
                }
                let parsed: Vec<Value> = frames.iter().filter_map(|f| serde_json::from_str(f).ok()).collect();
                match parsed.iter().find(|f| f["type"] == "subscribed") {
                    Some(subscribed) => {
                        self.resumed_before = None;
                        // A subscribe again drops what the old subscription held in flight: its
                        // paused events are not offered again as such.
                        if self.subscribed.is_some() {
                            self.sharing.forget_paused();
                        }
                        self.learn_floors(subscribed);
                        self.subscribed = Some(subscribed.clone());
                        for (link, reply) in std::mem::take(&mut self.joining) {
                            if reply.send(Ok(subscribed.clone())).is_ok() {
                                self.add_member(link);
                            }
                        }
                    }
                    None => {
                        let error = parsed.iter().find(|f| f["type"] == "error");
                        let code = error.and_then(|e| serde_json::from_value::<ErrorCode>(e["code"].clone()).ok()).unwrap_or(ErrorCode::Unavailable);
                        let message = error.and_then(|e| e["message"].as_str()).unwrap_or("the group could not subscribe").to_string();
                        tracing::warn!(topic = %self.topic, group = %self.group, %message, "shared subscription could not subscribe");
                        // A refused token (a re-subscribe) is forgotten; the running subscription
                        // goes on as it was.
                        if let Some(before) = self.resumed_before.take() {
                            self.resumed = before;
                        }
                        for (_, reply) in self.joining.drain(..) {
                            let _ = reply.send(Err(FrameError::new(code, message.clone())));
                        }
                    }
                }
            }
        }
    }

    fn on_hub_frame(&mut self, frame: Outbound) {
        match frame {
            Outbound::Shared(event) => {
                let event = *event;
                let offered = Offered { delivery: event.delivery, key: event.key, text: event.text, bytes: event.bytes };
                if let Some(taken) = self.sharing.offer(offered) {
                    if let Some(link) = self.members.get(&taken.member) {
                        link.control.send(SessionControl::Group { generation: self.generation, message: GroupMessage::TakenBack(vec![taken.delivery]) });
                    }
                }
            }
            Outbound::Text(text) => {
                let kind = serde_json::from_str::<Value>(&text).ok().and_then(|v| v["type"].as_str().map(str::to_string)).unwrap_or_default();
                match kind.as_str() {
                    // A gap the hub's reads found concerns every member, and so does the group's
                    // fresh resume token (plain acks moved its floor: `progress`).
                    "gap" | "progress" => {
                        for link in self.members.values() {
                            link.control.send(SessionControl::Group { generation: self.generation, message: GroupMessage::Frames(vec![text.clone()]) });
                        }
                    }
                    "error" => tracing::warn!(topic = %self.topic, group = %self.group, frame = %text, "a shared subscription's hub reported an error"),
                    _ => {}
                }
            }
            Outbound::SharedGone(partition, offset) => {
                if let Some(taken) = self.sharing.forget((partition, offset)) {
                    if let Some(link) = self.members.get(&taken.member) {
                        link.control.send(SessionControl::Group { generation: self.generation, message: GroupMessage::TakenBack(vec![taken.delivery]) });
                    }
                }
            }
            Outbound::Ping => {
                if let Some(hub) = &self.hub {
                    let _ = hub.send(Inbound::Alive);
                }
            }
            Outbound::Close(code, reason) => {
                tracing::info!(topic = %self.topic, group = %self.group, code, %reason, "a shared subscription's hub closed");
            }
        }
    }

    /// Sends each member what `Sharing` assigns it, in one message per member.
    fn share_out(&mut self) {
        let given = self.sharing.assign();
        if given.is_empty() {
            return;
        }
        let mut by_member: HashMap<u64, Vec<(DeliveryRef, String)>> = HashMap::new();
        for (member, offered) in given {
            by_member.entry(member).or_default().push((offered.delivery, offered.text));
        }
        for (member, events) in by_member {
            if let Some(link) = self.members.get(&member) {
                // A member whose session ended meanwhile leaves next; its events are released then.
                link.control.send(SessionControl::Group { generation: self.generation, message: GroupMessage::Events { topic: self.topic.clone(), events } });
            }
        }
    }

    /// When the group's home is another instance now (a peer added, this one draining, a peer
    /// back after a silence), its members are sent there and the hub stops: it ends as a client's
    /// session does (its acks durable, its deliveries released), and the new home's hub, which
    /// waits for it, starts from the floor it leaves. Meanwhile it still answers `Describe`.
    fn check_home(&mut self) {
        if let Some((instance, _, since)) = &self.moving {
            if since.elapsed() >= MOVE_SETTLE {
                tracing::warn!(topic = %self.topic, group = %self.group, %instance, members = self.members.len(), "shared subscription moved, but members did not leave in time: its hub here stops anyway");
                self.stop();
            }
            return;
        }
        let Some((instance, ws_url)) = self.home.as_ref().and_then(|home| home.elsewhere(&self.group)) else { return };
        tracing::info!(topic = %self.topic, group = %self.group, %instance, members = self.members.len(), "shared subscription's home moved: its members are sent there and its hub here stops");
        for link in self.members.values() {
            let moved_to = Some((instance.clone(), ws_url.clone()));
            link.control.send(SessionControl::Group { generation: self.generation, message: GroupMessage::Ended { topic: self.topic.clone(), moved_to } });
        }
        self.joined_once = true;
        self.moving = Some((instance, ws_url, tokio::time::Instant::now()));
        for (_, reply) in std::mem::take(&mut self.joining) {
            let _ = reply.send(Err(self.moved_error()));
        }
    }

    /// What a join hears while the group moves: the member subscribes again and is sent on.
    fn moved_error(&self) -> FrameError {
        let instance = self.moving.as_ref().map(|(instance, ..)| instance.as_str()).unwrap_or_default();
        FrameError::new(ErrorCode::Unavailable, format!("group {} now lives on instance {instance}; subscribe again", self.group))
    }

    /// No members: the hub's inbound ends, so the hub ends as a client's session does.
    fn stop(&mut self) {
        self.hub = None;
        self.window.set_max_events(0);
    }
}
