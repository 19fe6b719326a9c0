//! `--broadcast N --find-rate --p99-ms MS`: the highest publish rate at which the broadcast
//! shape's p99 publish-to-delivery stays within the bound, every event delivered and acked.
//!
//! Each rate tried is a whole broadcast run (`shapes::throughput`) of `--duration-secs` on a fresh
//! gateway: doubling from `--rate` (100/s unless given) until a rate misses, then bisecting between
//! the best rate that held and the lowest that missed, until they are within a tenth of each
//! other. A rate "holds" when its run is complete and its p99 is within the bound; a run that
//! loses anything is a problem of the whole search, whatever its latency.

use serde_json::{json, Value};

use crate::report::Summary;
use crate::shapes;
use crate::Cli;

/// Runs tried at most (each is a gateway start, N connections and a timed broadcast).
const MAX_STEPS: usize = 10;

pub async fn run(cli: &Cli) -> anyhow::Result<Summary> {
    let clients = cli.clients;
    let bound_us = cli.p99_ms.saturating_mul(1000);
    let mut summary = Summary::new(format!("find-rate: broadcast to {clients} clients, p99 publish-to-delivery within {} ms", cli.p99_ms));
    let (mut held, mut missed): (Option<u64>, Option<u64>) = (None, None);
    let mut rate = cli.rate.unwrap_or(100).max(1);
    let mut steps = Vec::new();
    for step in 1..=MAX_STEPS {
        let attempt = Cli { rate: Some(rate), events: rate * cli.duration_secs, find_rate: false, ..cli.clone() };
        let result = shapes::throughput(&attempt).await?;
        let latency = result.figure("publish_to_delivery").cloned().unwrap_or(Value::Null);
        let p99_us = latency["p99_us"].as_u64();
        let holds = result.complete && p99_us.is_some_and(|p| p <= bound_us);
        eprintln!(
            "find-rate step {step}: {rate} events/s to {clients} clients: p50 {} ms, p99 {} ms, {}",
            latency["p50_us"].as_u64().map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0)),
            p99_us.map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0)),
            if !result.complete {
                "INCOMPLETE"
            } else if holds {
                "holds"
            } else {
                "misses"
            },
        );
        if let Some(first) = result.problems.first() {
            eprintln!("find-rate step {step}: {first}");
        }
        for problem in &result.problems {
            summary.problem(format!("at {rate} events/s: {problem}"));
        }
        steps.push(json!({
            "rate": rate,
            "deliveries_offered_per_s": rate * clients as u64,
            "delivered_per_s": result.figure("delivered_per_s"),
            "gateway_cpu_percent": result.figure("gateway_cpu_percent"),
            "gateway_rss_mib": result.figure("gateway_rss_mib"),
            "publish_to_delivery": latency,
            "holds": holds,
        }));
        if holds {
            held = held.max(Some(rate));
        } else {
            missed = Some(missed.map_or(rate, |m| m.min(rate)));
        }
        rate = match next_rate(held, missed) {
            Some(next) => next,
            None => break,
        };
    }
    summary.add("p99_bound_ms", cli.p99_ms);
    summary.add("clients", clients);
    summary.add("highest_rate_within_bound", held.unwrap_or(0));
    summary.add("deliveries_per_s_at_that_rate", held.unwrap_or(0) * clients as u64);
    summary.add("lowest_rate_missed", missed.map_or(Value::Null, Value::from));
    summary.add("steps", Value::Array(steps));
    Ok(summary)
}

/// The next rate to try, or `None` when the search is done: doubling while nothing missed,
/// halving while nothing held, else the middle until the two are within a tenth of each other.
fn next_rate(held: Option<u64>, missed: Option<u64>) -> Option<u64> {
    match (held, missed) {
        (Some(h), None) => Some(h.saturating_mul(2)),
        (None, Some(1)) => None,
        (None, Some(m)) => Some((m / 2).max(1)),
        (Some(h), Some(m)) if m <= h + (h / 10).max(1) => None,
        (Some(h), Some(m)) => Some(h + (m - h) / 2),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::next_rate;

    #[test]
    fn the_search_doubles_then_bisects_and_stops() {
        assert_eq!(next_rate(Some(10), None), Some(20));
        assert_eq!(next_rate(None, Some(10)), Some(5));
        assert_eq!(next_rate(None, Some(1)), None, "nothing holds even at 1/s");
        assert_eq!(next_rate(Some(80), Some(160)), Some(120));
        assert_eq!(next_rate(Some(150), Some(160)), None, "within a tenth");
        assert_eq!(next_rate(Some(1), Some(2)), None);
        assert_eq!(next_rate(Some(u64::MAX), None), Some(u64::MAX));
    }
}
