//! Log lines anyone can cause (a refused request, a refused connection) at most once a second
//! per kind, each with how many were left out since the last (issue 40, item 10): a flood of bad
//! requests must neither flood the log nor pay a log write per request.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// One kind of line.
pub struct Throttled {
    /// When the last line was logged, in ms since `epoch()` plus 1000 (0: never).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Default for Throttled {
    fn default() -> Self {
        Self::new()
    }
}

impl Throttled {
    pub const fn new() -> Self {
        Self { last_ms: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(lines left out since the last one)` when a line may be logged now; `None` (counted)
    /// when one was logged less than a second ago.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(epoch().elapsed().as_millis() as u64 + 1000)
    }

    fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        if (last != 0 && now_ms < last.saturating_add(1000)) || self.last_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// A `Throttled` per kind, for kinds of a bounded set (a status and a route, never a path).
pub struct ThrottledByKind<K> {
    kinds: Mutex<HashMap<K, std::sync::Arc<Throttled>>>,
}

impl<K: Hash + Eq> Default for ThrottledByKind<K> {
    fn default() -> Self {
        Self { kinds: Mutex::new(HashMap::new()) }
    }
}

impl<K: Hash + Eq> ThrottledByKind<K> {
    /// `Throttled::allow` for the kind.
    pub fn allow(&self, kind: K) -> Option<u64> {
        let throttled = self.kinds.lock().unwrap().entry(kind).or_default().clone();
        throttled.allow()
    }
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_with_the_count_of_those_left_out() {
        let kind = Throttled::new();
        assert_eq!(kind.allow_at(1_000), Some(0), "the first line goes");
        assert_eq!((kind.allow_at(1_001), kind.allow_at(1_999)), (None, None));
        assert_eq!(kind.allow_at(2_000), Some(2), "a second later, with the two left out");
        assert_eq!(kind.allow_at(2_500), None);
        assert_eq!(kind.allow_at(u64::MAX - 1), Some(1));
        let kinds = ThrottledByKind::default();
        assert_eq!((kinds.allow((404, "a")), kinds.allow((404, "b")), kinds.allow((404, "a"))), (Some(0), Some(0), None), "kinds apart");
    }
}
