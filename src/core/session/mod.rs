//! One session (WebSocket, SSE, or a shared subscription's hub): its subscriptions, its in-flight
//! window and what falls due when, fed by client frames, by partition readers, and by control
//! messages.
//!
//! `Session`'s methods are the logic and do no I/O: they queue `Outbound` frames in `out`. The
//! task that drives a session and writes what it queued is `task` (`run_session`). Frames of a
//! session are handled one at a time in the order sent; everything a step wants to send is
//! queued and written in one flush.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{FutureExt, Sink, SinkExt, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::access::Access;
use crate::core::client_state::{ClientState, EventRef};
use crate::core::dispatcher::Dispatcher;
use crate::core::feeder::{FedBatch, PartitionFeed};
use crate::core::in_flight::InFlightWindow;
use crate::core::metrics::SessionEnd;
use crate::core::names::{OffsetKey, TopicName, TopicPartition};
use crate::core::offset_retention::{lower_to_log_end, touch_client_offsets};
use crate::core::offset_writer::WriteRequest;
use crate::core::offsets::{OffsetEpoch, StoreError};
use crate::core::protocol::{close_code, parse_client_frame, plain_ack_id, ClientFrame, ErrorCode, FrameError, ResumeOffset, ServerFrame};
use crate::core::redelivery::RedeliveryPolicy;
use crate::core::session_control::SessionControl;
use crate::core::session_registry::{Registration, SessionInfo};
use crate::core::window::Window;
use crate::core::FastMap;

mod acks;
mod groups;
mod publishing;
mod redrives;
mod subscriptions;
mod task;

pub use task::{run_session, WriteProgress};

pub use crate::core::transport::{Inbound, Outbound};

/// Batches of events (one partition's fetch each) a session's feeders may queue for it.
const FEED_BATCHES_QUEUED: usize = 16;
/// Frames queued in one step before the socket is flushed (more batches are taken until then).
const FEED_DRAIN_FRAMES: usize = 256;
/// Client frames already received that are handled in one step (their acks: one write request).
const INBOUND_DRAIN: usize = 256;
/// How long a taken-over session tries to write its close frame.
const TAKEN_OVER_CLOSE_WAIT: Duration = Duration::from_secs(1);
/// How often the session looks again at something it watches: a window that stays full (4003),
/// partitions it could not feed yet, a drain's settle. Only while there is one: a session with
/// nothing to watch arms its housekeeping timer at its next ping or credentials notice, and an
/// idle session costs no wake-up in between (the engine review's finding 2: a 500 ms interval per
/// session was about 27 us of CPU per session-second).
const SLOW_CHECK: Duration = Duration::from_millis(500);
/// The least time between two housekeeping wake-ups: something that stays due (a progress frame
/// whose barrier failed) is tried again at this pace, not in a busy loop.
const HOUSEKEEPING_MIN_GAP: Duration = Duration::from_millis(100);

struct Subscription {
    id: u64,
    /// Ack timeout, backoff and attempts of its topic.
    redelivery: Arc<RedeliveryPolicy>,
    slot: u32,
    /// The epoch its trackers carry while they are its own.
    epoch: crate::core::ack_tracker::Epoch,
    /// Partitions it feeds (`0..partitions`), and how many the topic has now: more are fed on
    /// the next tick (`Session::grow_subscriptions`), tried again until that works.
    partitions: u32,
    wanted: u32,
    cancel: CancellationToken,
    /// One per partition it feeds: their holds on the readers, and the feeders parked there.
    feeds: Vec<PartitionFeed>,
    /// The topic's incarnation when subscribed: what its resume tokens bind (a deletion of the
    /// topic ends the subscription).
    incarnation: u64,
}

/// A subscription that ends stops its feeders: those parked at a reader have no task that
/// would see the token, and are taken out of the reader's list as `feeds` drop.
impl Drop for Subscription {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// How long a full window must go without any ack before its session counts as stuck
/// (`ackgate_stalled_sessions`): a quarter of the slow-client timeout, at most a minute, so that
/// the `AckgateWindowsFull` alert (`for: 1m`) fires before the session is closed with 4003.
pub(crate) fn stuck_after(slow_client_timeout: Duration) -> Duration {
    if slow_client_timeout.is_zero() {
        return STUCK_AFTER_MAX;
    }
    (slow_client_timeout / 4).min(STUCK_AFTER_MAX)
}

const STUCK_AFTER_MAX: Duration = Duration::from_secs(60);

/// Why an in-flight event's deadline is a pause (`Session::waiting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    Nacked,
    BackingOff,
}

enum Step {
    Continue,
    Close(u16, &'static str),
    /// The client left (its stream ended).
    End,
    /// The peer is gone without a word: end without a close frame, with this reason logged.
    Gone(&'static str),
}

/// The reloadable settings the housekeeping timer depends on.
#[derive(Clone, Copy)]
struct Timing {
    ping_interval: Duration,
    pong_timeout: Duration,
    progress_interval: Duration,
}

impl Timing {
    fn of(d: &Dispatcher) -> Self {
        let settings = d.settings();
        Self { ping_interval: settings.ping_interval, pong_timeout: settings.pong_timeout, progress_interval: settings.progress_interval }
    }
}

struct Session {
    d: Arc<Dispatcher>,
    info: Arc<SessionInfo>,
    client: Arc<Mutex<ClientState>>,
    window: Arc<Window>,
    subscriptions: FastMap<TopicName, Subscription>,
    in_flight: InFlightWindow,
    feed_tx: mpsc::Sender<FedBatch>,
    next_subscription: u64,
    /// Since when the window has been full with no ack arriving (4003 counts from here).
    stalled_since: Option<Instant>,
    /// Events the client gave up on with `term`: progress, like acks.
    termed: u64,
    /// Acks and terms at the previous window check: a change means the client made progress.
    settled_at_last_check: u64,
    /// When the peer was last heard from (a frame, a pong; one clock read per batch of frames):
    /// the dead-peer check counts from here, and a peer heard within the ping interval is not
    /// pinged.
    last_heard: Instant,
    /// When the last keepalive ping went out.
    last_ping: Instant,
    /// Its window's bounds (events, bytes), read once: whether the window is full is judged from
    /// `in_flight` on every pass, not from the atomics the feeders write (a cache miss per pass).
    /// A hub's window is resized; hubs are never judged full.
    window_bounds: (usize, u64),
    /// Some subscription has fewer partitions fed than the topic has (`Session::grow_subscriptions`).
    grow_due: bool,
    /// The settings the housekeeping timer is computed from, read again at each of its wake-ups
    /// (a reload applies from the next): not a shared `Arc` touched on every pass of the loop.
    timing: Timing,
    /// In-flight events whose deadline is not an ack timeout but the end of a pause: a `nack`'s
    /// (the redelivery counts as `nack`) or a backoff after a timeout (it counts as `timeout`).
    waiting: FastMap<EventRef, Waiting>,
    /// Offset writes and broker ACKs of acks without `req`, submitted once per batch of frames.
    acked: WriteRequest,
    /// The partitions one ack touched, with their floors before it (`ack`); kept empty between
    /// acks, for its capacity.
    ack_touched: Vec<(TopicPartition, (u64, Option<u64>))>,
    access: Access,
    cancel: CancellationToken,
    out: Vec<Outbound>,
    /// Its inbox, for the tasks that report back to it (redrive scans).
    control: Arc<crate::core::session_control::ControlInbox>,
    /// Dead letters redriven to it (`redrives`); `None` until the first.
    redrives: Option<Box<redrives::Redrives>>,
    /// The second its last subscribes were made in, and how many (`limits.max_subscribes_per_sec`).
    subscribes_in_second: (Instant, usize),
    /// Per partition, the floor the client was last told (`subscribed`'s `from`, `ack_ok`'s
    /// `committed`): what its resume token holds. Kept for the drain's settle.
    told: FastMap<TopicPartition, u64>,
    /// Topics whose floors moved since the last resume token the client was sent (`progress`).
    tokens_due: crate::core::FastSet<TopicName>,
    /// When the last `progress` frame went out (the session's start before the first: a floor
    /// that moves is told at most every `delivery.progress_interval_ms`, the first time too).
    progress_sent: Instant,
    /// The client sent an ack with `req` at least once: it builds its token from `ack_ok`s, so
    /// a settling session waits for one that covers its acks too.
    confirms: bool,
    /// Draining: until when it waits for its client's acks before it closes with 1012.
    settling: Option<Instant>,
    /// When to send `refresh_needed` for the current token (cleared once sent).
    refresh_notice_at: Option<Instant>,
    /// When the current token expires, on the session's clock (set with the token).
    expiry: Option<Instant>,
    /// The shared subscriptions it is a member of (`groups`); `None` until the first.
    groups: Option<Box<groups::Memberships>>,
    /// Per topic, the client's records the peers held when it first subscribed without a token
    /// and this instance had none (`core::peer_offsets`); `None` until then.
    peer_records: Option<Box<FastMap<TopicName, BTreeMap<u32, ResumeOffset>>>>,
}

impl Session {
    fn send(&mut self, frame: ServerFrame) {
        self.d.metrics.frame_out(frame.kind());
        self.out.push(Outbound::Text(frame.to_json()));
    }

    fn error(&mut self, e: FrameError) {
        self.send(e.into());
    }

    async fn on_inbound(&mut self, frame: Option<Inbound>) -> Step {
        match frame {
            Some(Inbound::Text(text)) => self.on_text(&text).await,
            Some(Inbound::Binary) => {
                self.error(FrameError::new(ErrorCode::BadFrame, "binary frames are not supported; send JSON text frames"));
                Step::Continue
            }
            Some(Inbound::TooLarge) => Step::Close(close_code::TOO_BIG, "frame too large"),
            Some(Inbound::Broken(code, why)) => Step::Close(code, why),
            Some(Inbound::Alive) => Step::Continue,
            Some(Inbound::Frames { texts, answer }) => Box::pin(self.on_frames(texts, answer)).await,
            None => Step::End,
        }
    }

    fn on_control(&mut self, message: SessionControl) -> Step {
        match message {
            SessionControl::TakenOver => Step::Close(close_code::TAKEN_OVER, "taken over by a newer session"),
            SessionControl::Disconnect => Step::Close(close_code::OPERATOR, "disconnected by an operator"),
            SessionControl::Drain { after_ms } => {
                self.send(ServerFrame::Reconnect { after_ms, instance: None, ws_url: None });
                self.settling = Some(Instant::now() + self.d.settings().drain_settle);
                self.settle_check()
            }
            SessionControl::Describe(reply) => {
                let _ = reply.send(self.in_flight_views());
                Step::Continue
            }
            SessionControl::PartitionsAdded { topic, partitions } => {
                if let Some(subscription) = self.subscriptions.get_mut(&topic) {
                    subscription.wanted = subscription.wanted.max(partitions);
                    self.grow_due |= subscription.wanted > subscription.partitions;
                }
                Step::Continue
            }
            SessionControl::Redrive { topic } => {
                self.start_redrive(&topic);
                Step::Continue
            }
            SessionControl::Redriven(redriven) => {
                self.on_redriven(*redriven);
                Step::Continue
            }
            SessionControl::RedriveScanned { topic, subscription } => {
                self.on_redrive_scanned(&topic, subscription);
                Step::Continue
            }
            SessionControl::Group { generation, message } => self.on_group_message(generation, message),
        }
    }

    /// When the current token expires, as an instant of the session's clock.
    fn expiry_of_token(&self) -> Option<Instant> {
        self.access.expires_at_ms.map(|at| Instant::now() + Duration::from_millis(at.saturating_sub(self.d.clock.now_ms())))
    }

    /// When to warn the client that its token expires (`refresh_before` ahead), if it does.
    fn notice_for_current_token(&self) -> Option<Instant> {
        self.expiry.map(|at| at.checked_sub(self.d.settings().refresh_before).unwrap_or(at).max(Instant::now()))
    }

    /// The credentials timer's next instant: the notice, else the expiry; `None`: never.
    fn credentials_due(&self) -> Option<Instant> {
        self.refresh_notice_at.or(self.expiry)
    }

    fn on_credentials_timer(&mut self) -> Step {
        let now = Instant::now();
        if self.expiry.is_some_and(|at| at <= now) {
            return Step::Close(close_code::TOKEN_EXPIRED, "token expired: get a new token and reconnect");
        }
        match self.access.expires_at_ms {
            Some(at) if self.refresh_notice_at.is_some_and(|notice| notice <= now) => {
                self.refresh_notice_at = None;
                self.send(ServerFrame::RefreshNeeded { expires_at: at });
                Step::Continue
            }
            _ => Step::Continue,
        }
    }

    /// `refresh`: a new token for the same client replaces the session's; checked as the
    /// handshake's (signature, `exp`, `nbf`, audience, issuer, lifetime, `sub`). It may not take
    /// away a topic the session reads or a group it is a member of: unsubscribe it first.
    fn refresh(&mut self, token: &str, req: Option<serde_json::Value>) -> Result<(), FrameError> {
        let Some(check) = self.d.token_check.get() else {
            return Err(FrameError::new(
                ErrorCode::BadFrame,
                "this gateway checks no tokens (neither auth.jwt_secret nor auth.jwks_url is set): there is nothing to refresh",
            ));
        };
        let access = check.check(token, &self.info.client_id).map_err(|why| FrameError::new(ErrorCode::Unauthorized, why))?;
        if let Some(topic) = self.subscriptions.keys().find(|t| !access.allows(t.as_str())) {
            return Err(FrameError::new(
                ErrorCode::Forbidden,
                format!("the new token does not allow topic {topic}, which this session reads: unsubscribe it first"),
            ));
        }
        // The same for a shared subscription the session is a member of (issue 55, item 7: a
        // token without the group kept it receiving the group's events and moving its floor).
        if let Some((topic, group)) = self.group_not_allowed(&access) {
            return Err(FrameError::new(
                ErrorCode::Forbidden,
                format!("the new token does not allow group {group} of topic {topic}, which this session is a member of: unsubscribe it first"),
            ));
        }
        let expires_at = access.expires_at_ms;
        self.access = access;
        self.expiry = self.expiry_of_token();
        self.refresh_notice_at = self.notice_for_current_token();
        tracing::debug!(session_id = %self.info.session_id, expires_at, "session token refreshed");
        self.send(ServerFrame::Refreshed { req, expires_at });
        Ok(())
    }

    /// A draining session closes (1012) once its client holds nothing unacknowledged that it
    /// could still ack (events paused by a nack or a backoff are not sent again here) and, for a
    /// client that confirms its acks, once an `ack_ok` told it every floor; or at the deadline.
    fn settle_check(&self) -> Step {
        const CLOSE: Step = Step::Close(close_code::DRAINING, "instance draining; reconnect elsewhere");
        let Some(until) = self.settling else { return Step::Continue };
        if Instant::now() >= until {
            return CLOSE;
        }
        if self.in_flight.len() > self.waiting.len() {
            return Step::Continue;
        }
        if self.confirms {
            let client = self.client.lock().unwrap();
            let untold = client
                .trackers
                .iter()
                .any(|(tp, tracker)| self.subscriptions.contains_key(&tp.topic) && self.told.get(tp).is_some_and(|told| tracker.floor() > *told));
            if untold {
                return Step::Continue;
            }
        }
        CLOSE
    }

    /// Lowers the client's committed offset of `tp` if it stands above a truncated log's new end
    /// (acks of events the log no longer holds), so that a return after the log grew past it
    /// again does not skip what it wrote there. On the blocking pool, like every store write here.
    async fn lower_truncated_offset(&self, tp: &TopicPartition, log_end: u64, min_epoch: OffsetEpoch) {
        let (store, now) = (self.d.store.clone(), self.d.clock.now_ms());
        let key = OffsetKey::new(tp.topic.clone(), self.info.client_id.clone(), tp.partition);
        let lowering = key.clone();
        let lowered = tokio::task::spawn_blocking(move || match store.read(&lowering)? {
            Some(record) if record.committed > log_end => lower_to_log_end(store.as_ref(), &lowering, log_end, min_epoch, now).map(|_| Some(record.committed)),
            _ => Ok(None),
        })
        .await;
        match lowered.map_err(|e| StoreError::Io(e.to_string())) {
            Ok(Ok(Some(committed))) => tracing::warn!(%key, committed, log_end, "committed offset above a truncated log's end: lowered to the end"),
            Ok(Ok(None)) => {}
            Ok(Err(e)) | Err(e) => tracing::warn!(%key, error = %e, "could not lower an offset above a truncated log's end; the next subscribe lowers it"),
        }
    }

    /// Marks every stored offset of the client as seen now, so retention counts from when it
    /// left and not from its last ack. On the blocking pool (it takes the store's write lock),
    /// then durable with the offset writer's next fsync: thousands of sessions ending at once
    /// share fsyncs instead of making one each.
    async fn touch_offsets(&self) {
        let (store, client, now) = (self.d.store.clone(), self.info.client_id.clone(), self.d.clock.now_ms());
        let touched = tokio::task::spawn_blocking(move || touch_client_offsets(store.as_ref(), &[client], now)).await;
        let durable = match touched.map_err(|e| StoreError::Io(e.to_string())) {
            Ok(Ok(0)) => Ok(()),
            Ok(Ok(_)) => self.d.writer.make_written_durable().await.map_err(StoreError::Io),
            Ok(Err(e)) | Err(e) => Err(e),
        };
        if let Err(e) = durable {
            tracing::warn!(client_id = %self.info.client_id, error = %e, "could not refresh offset times at session end");
        }
    }

    /// When the housekeeping timer must next fire (`on_housekeeping`); `None`: nothing to do until
    /// something happens (an idle session with keepalive off and no expiring token).
    fn housekeeping_due(&self) -> Option<Instant> {
        let mut due = self.credentials_due();
        let mut at = |t: Instant| due = Some(due.map_or(t, |d| d.min(t)));
        let timing = &self.timing;
        let hub = self.is_hub();
        if !timing.ping_interval.is_zero() && !hub {
            at(self.last_ping.max(self.last_heard) + timing.ping_interval);
            at(self.last_heard + timing.pong_timeout);
        }
        if !timing.progress_interval.is_zero() && !self.tokens_due.is_empty() {
            at(self.progress_sent + timing.progress_interval);
        }
        // Full as the session itself sees it: its deliveries fill the bounds (feeders hold room
        // only for the moment a batch is on its way; `check_window` reads the window itself).
        let (max_events, max_bytes) = self.window_bounds;
        let full = self.in_flight.len() >= max_events || self.in_flight.bytes() >= max_bytes || self.group_window_full();
        let watching = self.stalled_since.is_some() || self.settling.is_some() || (full && !hub) || self.grow_due;
        if watching {
            at(Instant::now() + SLOW_CHECK);
        }
        due
    }

    /// Whatever fell due: credentials, partitions to feed, progress frames, keepalive, a window
    /// that stays full. Each check tells for itself whether it is due.
    async fn on_housekeeping(&mut self) -> Step {
        self.timing = Timing::of(&self.d);
        if self.credentials_due().is_some_and(|at| at <= Instant::now()) {
            match self.on_credentials_timer() {
                Step::Continue => {}
                step => return step,
            }
        }
        if self.grow_due {
            Box::pin(self.grow_subscriptions()).await;
        }
        if !self.tokens_due.is_empty() {
            Box::pin(self.send_progress()).await;
        }
        match self.check_peer() {
            Step::Continue => self.check_window(),
            gone => gone,
        }
    }

    /// Keepalive: pings the peer every `ping_interval`; a peer not heard from (no frame, no pong)
    /// for `pong_timeout` is dead (a half-open socket: a laptop closed, a NAT that forgot the
    /// flow) and its session ends at once, releasing its deliveries, with no close frame since
    /// nobody would read it.
    fn check_peer(&mut self) -> Step {
        let settings = self.d.settings();
        // A group's hub has no peer to lose: its distributor ends it.
        if settings.ping_interval.is_zero() || self.is_hub() {
            return Step::Continue;
        }
        if self.last_heard.elapsed() > settings.pong_timeout {
            return Step::Gone("dead peer: nothing received within server.ws_pong_timeout_ms");
        }
        // A peer heard from within the interval is alive: no ping (nor a pong to read back).
        if self.last_ping.max(self.last_heard).elapsed() >= settings.ping_interval {
            self.last_ping = Instant::now();
            self.out.push(Outbound::Ping);
        }
        Step::Continue
    }

    /// 4003 means "no ack progress", not "busy": a client behind a backlog keeps its window full
    /// all the time while acking steadily, and must never be closed for it. Only a window that
    /// stays full with no ack at all for `slow_client_timeout` is slow. Sampled every
    /// `SLOW_CHECK` while the window is full or was stalled (`housekeeping_due`), so the ack path
    /// itself pays nothing for it.
    fn check_window(&mut self) -> Step {
        // A group's hub is never slow: its members are, each on its own (a member whose share of
        // a group fills its window and who acks none of it is as slow as any client).
        let full = (self.window.is_full() || self.group_window_full()) && !self.is_hub();
        let settled = self.info.stats.acked.load(Ordering::Relaxed) + self.termed;
        let progressed = settled != self.settled_at_last_check;
        self.settled_at_last_check = settled;
        let stalled = full && !progressed;
        if !stalled {
            self.info.stats.stalled.store(false, Ordering::Relaxed);
            self.stalled_since = None;
            return Step::Continue;
        }
        let since = *self.stalled_since.get_or_insert_with(Instant::now);
        let limit = self.d.settings().slow_client_timeout;
        // `ackgate_stalled_sessions` counts these at scrape: stuck, not merely slow (a client
        // acking every few seconds behind a full window counted most of the time, and the alert
        // fired on it), and seen well before the 4003 (`stuck_after`).
        self.info.stats.stalled.store(since.elapsed() >= stuck_after(limit), Ordering::Relaxed);
        if !limit.is_zero() && since.elapsed() > limit {
            return Step::Close(close_code::SLOW_CLIENT, "slow client: no ack while the in-flight window was full");
        }
        Step::Continue
    }

    /// Every frame the session queues while it handles these is an answer to them: events come
    /// from feeders and timers, other branches of the session loop, so none is queued meanwhile.
    async fn on_frames(&mut self, texts: Vec<String>, answer: tokio::sync::oneshot::Sender<Vec<String>>) -> Step {
        let mark = self.out.len();
        let mut step = Step::Continue;
        for text in &texts {
            step = self.on_text(text).await;
            if !matches!(step, Step::Continue) {
                break;
            }
        }
        let answers = self.out.split_off(mark).into_iter().filter_map(|frame| if let Outbound::Text(text) = frame { Some(text) } else { None }).collect();
        let _ = answer.send(answers);
        step
    }

    async fn on_text(&mut self, text: &str) -> Step {
        if let Some(id) = plain_ack_id(text) {
            self.d.metrics.frame_in("ack");
            let acked = match self.groups.is_some() {
                true => Box::pin(self.ack_as_member(&[id], None)).await,
                false => self.ack(&[id], None).await,
            };
            if let Err(e) = acked {
                self.error(e);
            }
            return Step::Continue;
        }
        // Boxed, as every rare await of a session: a session's future is as large as its largest
        // await, and every session, idle or not, carries it (README "Where the memory goes").
        // Frames other than the plain ack are rare or carry many ids.
        Box::pin(self.on_frame(text)).await
    }

    /// A shared subscription's hub (`core::group`), not a client's session.
    fn is_hub(&self) -> bool {
        self.info.transport == crate::core::session_registry::Transport::Group
    }

    async fn on_frame(&mut self, text: &str) -> Step {
        let frame = match parse_client_frame(text) {
            Ok(frame) => {
                self.d.metrics.frame_in(frame.kind());
                frame
            }
            Err(e) => {
                self.d.metrics.frame_in("invalid");
                self.error(e);
                return Step::Continue;
            }
        };
        let result = match frame {
            ClientFrame::Subscribe { topic, from, resume, group: Some(join), req } => {
                self.subscribe_group(&topic, from, &resume, join, req.clone()).await.map_err(|e| e.with_req(req))
            }
            ClientFrame::Subscribe { topic, from, resume, group: None, req } => {
                self.subscribe(&topic, from, &resume, req.clone()).await.map_err(|e| e.with_req(req))
            }
            ClientFrame::Unsubscribe { topic, req } => self.unsubscribe(&topic, req.clone()).map_err(|e| e.with_req(req)),
            ClientFrame::Nack { delivery_id, delay_ms, req }
                if self.groups.is_some()
                    && self.forward_to_group(&delivery_id, serde_json::json!({"op": "nack", "delivery_id": delivery_id, "delay_ms": delay_ms, "req": req})) =>
            {
                Ok(())
            }
            ClientFrame::Extend { delivery_id, req }
                if self.groups.is_some()
                    && self.forward_to_group(&delivery_id, serde_json::json!({"op": "extend", "delivery_id": delivery_id, "req": req})) =>
            {
                Ok(())
            }
            ClientFrame::Term { delivery_id, reason, req }
                if self.groups.is_some()
                    && self.forward_to_group(&delivery_id, serde_json::json!({"op": "term", "delivery_id": delivery_id, "reason": reason, "req": req})) =>
            {
                Ok(())
            }
            ClientFrame::Ack { delivery_ids, req } if self.groups.is_some() => {
                Box::pin(self.ack_as_member(&delivery_ids, req.clone())).await.map_err(|e| e.with_req(req))
            }
            ClientFrame::Ack { delivery_ids, req } => self.ack(&delivery_ids, req.clone()).await.map_err(|e| e.with_req(req)),
            ClientFrame::Nack { delivery_id, delay_ms, req } => self.nack(&delivery_id, delay_ms.map(Duration::from_millis)).map_err(|e| e.with_req(req)),
            ClientFrame::Extend { delivery_id, req } => self.extend(&delivery_id).map_err(|e| e.with_req(req)),
            ClientFrame::Term { delivery_id, reason, req } => self.term(&delivery_id, reason).await.map_err(|e| e.with_req(req)),
            ClientFrame::Ping { req } => {
                self.send(ServerFrame::Pong { req });
                Ok(())
            }
            ClientFrame::Refresh { token, req } => self.refresh(&token, req.clone()).map_err(|e| e.with_req(req)),
            ClientFrame::Publish { topic, events, idempotency_key, req } => {
                self.publish(&topic, &events, idempotency_key.as_deref(), req.clone()).await.map_err(|e| e.with_req(req))
            }
        };
        if let Err(e) = result {
            self.error(e);
        }
        Step::Continue
    }
}
