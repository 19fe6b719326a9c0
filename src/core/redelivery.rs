//! How an unacknowledged event comes again (docs/protocol.md, delivery rules): after the ack timeout,
//! or a `nack`, it is pushed again once the pause `delivery.redelivery_backoff_ms` names for that
//! attempt has passed, until `max_attempts` deliveries make it a dead letter. A topic may have its
//! own rules (`[delivery.topics."<pattern>"]`, an exact name or a prefix ending in `*`; the exact
//! name, else the longest prefix, wins).

use std::sync::Arc;
use std::time::Duration;

/// The redelivery rules of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedeliveryPolicy {
    pub ack_timeout: Duration,
    pub max_attempts: u32,
    /// The pause before attempt n+1 is `backoff[n-1]`, the last value repeating; empty: none.
    pub backoff: Vec<Duration>,
}

impl RedeliveryPolicy {
    /// The pause between the end of attempt `attempt` (1-based: its ack timeout, or a `nack`
    /// without `delay_ms`) and the next delivery.
    pub fn backoff_after(&self, attempt: u32) -> Duration {
        match self.backoff.len() {
            0 => Duration::ZERO,
            n => self.backoff[(attempt.max(1) as usize - 1).min(n - 1)],
        }
    }
}

/// The default rules and the per-topic ones.
#[derive(Debug, Clone)]
pub struct RedeliveryPolicies {
    default: Arc<RedeliveryPolicy>,
    /// `(pattern, policy)`, most specific first: exact names, then prefixes by length.
    by_pattern: Vec<(String, Arc<RedeliveryPolicy>)>,
}

impl RedeliveryPolicies {
    pub fn new(default: RedeliveryPolicy, by_pattern: Vec<(String, RedeliveryPolicy)>) -> Self {
        let mut by_pattern: Vec<(String, Arc<RedeliveryPolicy>)> = by_pattern.into_iter().map(|(p, policy)| (p, Arc::new(policy))).collect();
        // Exact names before any prefix, then longer prefixes before shorter ones.
        by_pattern.sort_by_key(|(p, _)| (p.ends_with('*'), std::cmp::Reverse(p.len())));
        Self { default: Arc::new(default), by_pattern }
    }

    pub fn default_policy(&self) -> &Arc<RedeliveryPolicy> {
        &self.default
    }

    pub fn for_topic(&self, topic: &str) -> Arc<RedeliveryPolicy> {
        let matching = self.by_pattern.iter().find(|(pattern, _)| match pattern.strip_suffix('*') {
            Some(prefix) => topic.starts_with(prefix),
            None => pattern == topic,
        });
        matching.map_or_else(|| self.default.clone(), |(_, policy)| policy.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(backoff_ms: &[u64], max_attempts: u32) -> RedeliveryPolicy {
        RedeliveryPolicy { ack_timeout: Duration::from_secs(30), max_attempts, backoff: backoff_ms.iter().map(|ms| Duration::from_millis(*ms)).collect() }
    }

    #[test]
    fn the_last_pause_repeats_and_none_means_at_once() {
        let p = policy(&[100, 1000, 5000], 16);
        let pauses: Vec<u64> = (0..6).map(|a| p.backoff_after(a).as_millis() as u64).collect();
        assert_eq!(pauses, vec![100, 100, 1000, 5000, 5000, 5000]);
        assert_eq!(policy(&[], 16).backoff_after(3), Duration::ZERO);
        assert_eq!(p.backoff_after(u32::MAX), Duration::from_millis(5000));
    }

    #[test]
    fn an_exact_name_wins_then_the_longest_prefix() {
        let policies = RedeliveryPolicies::new(
            policy(&[], 16),
            vec![
                ("orders*".into(), policy(&[], 3)),
                ("orders.eu*".into(), policy(&[], 5)),
                ("orders.eu.vip".into(), policy(&[], 9)),
                ("*".into(), policy(&[], 2)),
            ],
        );
        let attempts = |topic: &str| policies.for_topic(topic).max_attempts;
        assert_eq!(attempts("orders.eu.vip"), 9);
        assert_eq!(attempts("orders.eu.x"), 5);
        assert_eq!(attempts("orders"), 3);
        assert_eq!(attempts("payments"), 2);
        assert_eq!(RedeliveryPolicies::new(policy(&[], 16), vec![]).for_topic("x").max_attempts, 16);
    }
}
