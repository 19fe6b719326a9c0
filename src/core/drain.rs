//! Draining an instance for a rolling deploy (docs/protocol.md, `POST /admin/drain`, SIGTERM): the
//! instance stops taking sessions and turns not-ready, then closes the sessions it has one by
//! one over the drain window, each with a `reconnect` frame (when to come back) and close 1012,
//! so its clients reconnect elsewhere spread over the window instead of all in one second.
//!
//! Between the two a session settles (`server.drain_settle_ms`): no new events go out, and it
//! closes once its client acked what it holds and those acks are durable and confirmed, so the
//! token the client brings to the next instance covers them (issue 39, item 8: a drained client
//! got its whole window again).

use std::sync::Arc;
use std::time::Duration;

use super::dispatcher::Dispatcher;
use super::session_control::SessionControl;

/// The most a `reconnect` frame asks a client to wait: the closes are already spread over the
/// window; this only spreads the clients closed in the same moment a little more.
const MAX_RECONNECT_JITTER_MS: u64 = 1000;

/// Starts draining `d` over `window`; false when it was draining already.
pub fn start_drain(d: &Arc<Dispatcher>, window: Duration) -> bool {
    if d.drain_started.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return false;
    }
    d.draining.cancel();
    d.tasks.spawn(drain_sessions(d.clone(), window));
    true
}

/// Closes every session of `d` over `window`, in the order they connected, each at its share of
/// the window. Returns once the last one was asked to close. Sessions that start meanwhile are
/// refused by the HTTP edge while `d.draining` is set.
pub async fn drain_sessions(d: Arc<Dispatcher>, window: Duration) {
    let sessions = d.sessions();
    let count = sessions.len() as u32;
    tracing::info!(sessions = count, window_ms = window.as_millis() as u64, "draining: closing sessions with reconnect and 1012, spread over the window");
    let started = tokio::time::Instant::now();
    for (i, session) in sessions.iter().enumerate() {
        tokio::select! {
            _ = d.shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(started + window.mul_f64(i as f64 / count.max(1) as f64)) => {}
        }
        let after_ms = reconnect_after_ms(session.number, window);
        d.control(&session.session_id, SessionControl::Drain { after_ms });
    }
    tracing::info!(sessions = count, "draining: every session was asked to reconnect elsewhere");
}

/// A pause in `0..=min(1 s, window)` that differs from session to session (a multiplicative
/// hash of its number: no random source needed, and the same session always gets the same).
fn reconnect_after_ms(session: u64, window: Duration) -> u64 {
    let bound = MAX_RECONNECT_JITTER_MS.min(window.as_millis() as u64);
    session.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (bound + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_pauses_stay_within_the_bound_and_spread() {
        let window = Duration::from_secs(10);
        let pauses: Vec<u64> = (1..=200).map(|n| reconnect_after_ms(n, window)).collect();
        assert!(pauses.iter().all(|p| *p <= 1000));
        let distinct: std::collections::BTreeSet<u64> = pauses.iter().copied().collect();
        assert!(distinct.len() > 150, "{} distinct pauses of 200", distinct.len());
        assert_eq!(reconnect_after_ms(7, Duration::ZERO), 0);
        assert!(reconnect_after_ms(u64::MAX, Duration::from_millis(5)) <= 5);
    }
}
