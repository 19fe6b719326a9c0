//! The task that drives one `Session`: a loop over its sources (client frames, fed events,
//! control messages, its two timers, the gateway's shutdown) that hands each to the session's
//! methods and writes what they queued with one flush. The session's logic is in those methods
//! (`Session::on_text`, `on_fed`, `on_control`, `on_housekeeping`, `on_timers`), which hold no I/O:
//! they queue `Outbound` frames. Generic over a transport that is a `Stream` of `Inbound` and a
//! `Sink` of `Outbound` (`core::transport`), so it holds no HTTP types; `http::ws` and
//! `http::sse` adapt their sockets to it.

use super::*;
/// How long since the connection under a session last took bytes from it (`http::connections`
/// records it): a write that waits on a socket that takes nothing is a dead peer's, one that
/// takes a little at a time is a slow reader's.
pub trait WriteProgress: Send + Sync {
    fn since_last_write(&self) -> Duration;
}

/// Runs a session until the client leaves, it is closed, or the gateway shuts down.
/// `progress`: the socket's write progress, where it has one of its own (a WebSocket): a write
/// that waits is then also ended as a dead peer's (`flush_blocked`).
pub async fn run_session<T>(d: Arc<Dispatcher>, registration: Registration, access: Access, mut transport: T, progress: Option<Arc<dyn WriteProgress>>)
where
    T: Stream<Item = Inbound> + Sink<Outbound> + Unpin,
{
    let Registration { info, control, client } = registration;
    let (feed_tx, mut feed_rx) = mpsc::channel(FEED_BATCHES_QUEUED);
    let mut s = Session {
        window: info.window.clone(),
        d: d.clone(),
        info: info.clone(),
        client,
        subscriptions: FastMap::default(),
        in_flight: InFlightWindow::default(),
        feed_tx,
        next_subscription: 1,
        stalled_since: None,
        termed: 0,
        settled_at_last_check: 0,
        last_heard: Instant::now(),
        last_ping: Instant::now(),
        timing: Timing::of(&d),
        window_bounds: (info.window.max_events(), info.window.max_bytes()),
        grow_due: false,
        waiting: Default::default(),
        acked: WriteRequest { writes: Vec::new(), broker_acks: Vec::new(), done: None },
        ack_touched: Vec::new(),
        access,
        cancel: CancellationToken::new(),
        out: Vec::new(),
        control: control.clone(),
        redrives: None,
        subscribes_in_second: (Instant::now(), 0),
        told: FastMap::default(),
        tokens_due: Default::default(),
        progress_sent: Instant::now(),
        confirms: false,
        settling: None,
        refresh_notice_at: None,
        expiry: None,
        groups: None,
        peer_records: None,
    };
    s.expiry = s.expiry_of_token();
    s.refresh_notice_at = s.notice_for_current_token();
    tracing::info!(session_id = %info.session_id, client_id = %info.client_id, remote = info.remote_addr.map(tracing::field::display), "session started");
    s.send(ServerFrame::Welcome {
        session_id: info.session_id.clone(),
        client_id: info.client_id.to_string(),
        instance: d.instance.clone(),
        ack_timeout_ms: d.settings().redelivery.default_policy().ack_timeout.as_millis() as u64,
        max_in_flight: info.window.max_events(),
    });
    // One timer for everything periodic (`Session::housekeeping_due`): keepalive, dead peer,
    // credentials (`refresh_needed`, 4004), a full window (4003), progress frames, partitions to
    // feed, a drain's settle. Armed at the earliest due instant; moved only when something falls
    // due earlier (a later one is found when it fires and re-arms it), so a busy session resets
    // no timer per pass. `None`: not armed.
    let mut housekeeping_at: Option<Instant> = None;
    let housekeeping = tokio::time::sleep_until(far_future());
    tokio::pin!(housekeeping);
    // Nothing is armed earlier than this (`HOUSEKEEPING_MIN_GAP` after the last wake-up).
    let mut housekeeping_floor = Instant::now();
    let mut reason = "client left";
    let mut ended = SessionEnd::ClientLeft;
    // A client that stops reading blocks our writes; give up on it after the slow-client limit.
    let write_limit = Some(d.settings().slow_client_timeout).filter(|t| !t.is_zero()).unwrap_or(Duration::MAX);
    // The gateway's shutdown rings every session's doorbell (`gateway`); one that registered
    // after that looks at it on its first pass. No session polls the shutdown token itself: its
    // lock is shared by every session.
    control.ring();
    // The next redelivery deadline the timer is armed for; `None`: nothing in flight, no timer
    // (a "never" computed per pass would be a new instant each time, and a reset each pass).
    let mut timer_at: Option<Instant> = None;
    let redelivery_timer = tokio::time::sleep_until(far_future());
    tokio::pin!(redelivery_timer);
    loop {
        let flushed = {
            let flushing = flush(&mut transport, &mut s.out);
            tokio::pin!(flushing);
            // Most flushes finish at once; only a blocked socket needs a deadline.
            match (&mut flushing).now_or_never() {
                Some(done) => Ok(done),
                None => {
                    let dead_peer = progress.as_deref().filter(|_| !d.settings().ping_interval.is_zero()).map(|p| (p, d.settings().pong_timeout, s.last_heard));
                    let flushed = flush_blocked(flushing, write_limit, dead_peer).await;
                    // A write that had to wait went out because the peer took bytes: it is alive.
                    // Its pongs wait unread behind that write, so the dead-peer check counts from
                    // here, not from the last frame read (a slow reader's pings are answered late).
                    if flushed.is_ok() {
                        s.last_heard = Instant::now();
                    }
                    flushed
                }
            }
        };
        match flushed {
            Ok(true) => {}
            Ok(false) => {
                reason = "socket write failed";
                ended = SessionEnd::WriteFailed;
                break;
            }
            Err(why) => {
                reason = why;
                ended = if why == SLOW_SOCKET { SessionEnd::Closed(close_code::SLOW_CLIENT) } else { SessionEnd::DeadPeer };
                break;
            }
        }
        if let Some(due) = s.housekeeping_due() {
            let due = due.max(housekeeping_floor);
            if housekeeping_at.is_none_or(|at| due < at) {
                housekeeping_at = Some(due);
                housekeeping.as_mut().reset(due);
            }
        }
        // Armed at the earliest live deadline; as above, moved only when one falls due earlier:
        // an armed timer whose delivery was acked meanwhile fires once and re-arms, at most once
        // per ack timeout, instead of a timer reset per delivery.
        if let Some(next) = s.in_flight.next_live_deadline() {
            if timer_at.is_none_or(|at| next < at) {
                timer_at = Some(next);
                redelivery_timer.as_mut().reset(next);
            }
        }
        let step = tokio::select! {
            biased;
            _ = control.rung() => match control.try_recv() {
                _ if d.shutdown.is_cancelled() => Step::Close(close_code::GOING_AWAY, "gateway shutting down"),
                Some(message) => s.on_control(message),
                None => Step::Continue,
            },
            frame = transport.next() => {
                s.last_heard = Instant::now();
                let mut step = s.on_inbound(frame).await;
                // Frames already read are handled together: their acks become one write request.
                for _ in 0..INBOUND_DRAIN {
                    if !matches!(step, Step::Continue) {
                        break;
                    }
                    match transport.next().now_or_never() {
                        Some(frame) => step = s.on_inbound(frame).await,
                        None => break,
                    }
                }
                s.submit_acked().await;
                step
            },
            // Settling (draining): nothing is sent again here; the next instance does that.
            _ = &mut redelivery_timer, if timer_at.is_some() && s.settling.is_none() => {
                s.on_timers().await;
                // Fired: armed again on the next pass even if the next deadline is the same.
                timer_at = None;
                Step::Continue
            }
            Some(fed) = feed_rx.recv(), if s.settling.is_none() => {
                let mut step = s.on_fed(fed).await;
                while matches!(step, Step::Continue) && s.out.len() < FEED_DRAIN_FRAMES {
                    match feed_rx.try_recv() {
                        Ok(fed) => step = s.on_fed(fed).await,
                        Err(_) => break,
                    }
                }
                step
            }
            _ = &mut housekeeping, if housekeeping_at.is_some() => {
                housekeeping_at = None;
                let step = s.on_housekeeping().await;
                housekeeping_floor = Instant::now() + HOUSEKEEPING_MIN_GAP;
                step
            }
        };
        let step = match step {
            Step::Continue if s.settling.is_some() => s.settle_check(),
            step => step,
        };
        match step {
            Step::Continue => {}
            Step::End => break,
            Step::Gone(why) => {
                reason = why;
                ended = SessionEnd::DeadPeer;
                break;
            }
            Step::Close(code, why) => {
                let mut limit = write_limit;
                if code == close_code::TAKEN_OVER {
                    // Its successor has the client now: events still queued here would only be
                    // duplicates, and a replaced session must not linger on a slow socket.
                    s.out.clear();
                    limit = limit.min(TAKEN_OVER_CLOSE_WAIT);
                }
                s.out.push(Outbound::Close(code, why.to_string()));
                // A peer that stopped reading must not keep the session (and its topics) alive.
                let _ = tokio::time::timeout(limit, flush(&mut transport, &mut s.out)).await;
                reason = why;
                ended = SessionEnd::Closed(code);
                break;
            }
        }
    }
    // What the transport still holds (the echo of a client's close, a pong) gets one more try.
    let _ = transport.flush().now_or_never();
    // A group's hub is no client's session (`ackgate_sessions{transport="group"}` counts it).
    if !s.is_hub() {
        d.metrics.session_ended(ended);
    }
    // Registered until its writes are durable, below: no longer a stalled session meanwhile.
    info.stats.stalled.store(false, Ordering::Relaxed);
    control.close();
    s.leave_groups();
    let released = s.in_flight.len();
    s.cancel.cancel();
    // Its feeders leave the readers now, not after the barrier below (which waits on the store):
    // a feeder parked there would count as waiting meanwhile, and its reader pull for nobody.
    for subscription in s.subscriptions.values_mut() {
        subscription.feeds.clear();
    }
    // Every offset write of this session is durable before the client counts as offline (and
    // before its topics count as unused): an operator's reset or delete, allowed from then on,
    // must never be undone by a write still queued from here.
    s.submit_acked().await;
    let durable = match d.writer.barrier().await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(session_id = %info.session_id, error = %e, "offset writes of an ending session not confirmed");
            false
        }
    };
    let topics: Vec<TopicName> = s.subscriptions.keys().cloned().collect();
    if let Some(floor) = d.ack_floor.get().filter(|_| durable) {
        // Still counted for the floors a moment (`LiveClientsAckFloor`): its last acks are durable
        // now, and once it has unregistered no live client may hold the partition's floor.
        floor.client_left(&info.client_id, &topics);
        d.backend.settle_soon();
    }
    for topic in &topics {
        s.release_topic(topic);
    }
    s.in_flight.clear();
    s.touch_offsets().await;
    d.unregister(&info);
    let stats = &info.stats;
    tracing::info!(
        session_id = %info.session_id,
        client_id = %info.client_id,
        reason,
        delivered = stats.delivered.load(Ordering::Relaxed),
        acked = stats.acked.load(Ordering::Relaxed),
        redelivered = stats.redelivered.load(Ordering::Relaxed),
        released,
        "session ended"
    );
}

/// Why a session ends whose socket took no write for `delivery.slow_client_timeout_ms`.
const SLOW_SOCKET: &str = "socket write timed out (slow client)";

/// "Never" for a timer that must exist: a year from now.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 86_400)
}

/// Writes queued frames with one flush; false when the socket is gone.
/// Waits for a write the socket did not take at once: at most `write_limit` (the slow-client
/// timeout), and with `dead_peer` (the socket's progress, `server.ws_pong_timeout_ms` and when
/// the peer was last heard from) until the socket has taken no byte and the peer was not heard
/// from for that long: a dead peer's (issue 40, item 10). Nothing is read meanwhile, so pongs
/// wait unread: a slow reader whose socket takes bytes now and then is therefore never ended for
/// its pongs, only for taking nothing.
async fn flush_blocked(
    mut flushing: std::pin::Pin<&mut impl std::future::Future<Output = bool>>,
    write_limit: Duration,
    dead_peer: Option<(&dyn WriteProgress, Duration, Instant)>,
) -> Result<bool, &'static str> {
    let Some((progress, pong_timeout, last_heard)) = dead_peer else {
        return tokio::time::timeout(write_limit, flushing).await.map_err(|_| SLOW_SOCKET);
    };
    let started = Instant::now();
    loop {
        let silent = progress.since_last_write().min(last_heard.elapsed());
        if silent >= pong_timeout {
            return Err("dead peer: its socket took nothing and nothing was received within server.ws_pong_timeout_ms");
        }
        let Some(left) = write_limit.checked_sub(started.elapsed()) else { return Err(SLOW_SOCKET) };
        if let Ok(done) = tokio::time::timeout(left.min(pong_timeout - silent), flushing.as_mut()).await {
            return Ok(done);
        }
    }
}

async fn flush<O: Sink<Outbound> + Unpin>(outbound: &mut O, queue: &mut Vec<Outbound>) -> bool {
    if queue.is_empty() {
        return true;
    }
    for frame in queue.drain(..) {
        if outbound.feed(frame).await.is_err() {
            return false;
        }
    }
    outbound.flush().await.is_ok()
}
