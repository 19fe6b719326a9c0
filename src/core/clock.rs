//! Wall-clock time as the gateway reads it: injectable, so tests move time with `ManualClock`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// How far the gateway's wall clock is stepped from the system's, in ms: 0, except under the fault
/// suite's clock fault on Kafka (`ACKGATE_DEV_CLOCK_STEP_FILE`, main.rs), which cannot step
/// the process's clock with libfaketime without breaking librdkafka's timed waits.
static STEP_MS: AtomicI64 = AtomicI64::new(0);

/// The wall clock every part of the gateway reads (`SystemClock`, token checks, Kafka record
/// times), in epoch milliseconds.
pub fn wall_now_ms() -> u64 {
    let system = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    system.saturating_add(STEP_MS.load(Ordering::Relaxed)).max(0) as u64
}

/// Steps the gateway's wall clock `ms` away from the system's (fault injection only).
pub fn step_wall_clock(ms: i64) {
    STEP_MS.store(ms, Ordering::Relaxed);
}

/// A clock step as libfaketime's offset files write it: `+30s`, `-12s`, `0`; in seconds.
pub fn parse_step_secs(text: &str) -> Option<i64> {
    text.trim().trim_end_matches('s').parse().ok()
}

/// Wall clock in epoch milliseconds; injectable so tests can move time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        wall_now_ms()
    }
}

/// A clock that moves only when told to (tests).
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now_ms: u64) -> Self {
        Self(AtomicU64::new(now_ms))
    }

    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_read_in_libfaketimes_form_and_garbage_is_none() {
        assert_eq!(parse_step_secs("+30s\n"), Some(30));
        assert_eq!(parse_step_secs("-12s"), Some(-12));
        assert_eq!(parse_step_secs("0"), Some(0));
        assert_eq!(parse_step_secs("soon"), None);
        assert_eq!(parse_step_secs(""), None);
    }
}
