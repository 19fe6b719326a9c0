//! The history checker of the fault suite (issue 43, `loadtest chaos`): the workload records what
//! it was told (every publish answered 200, every `subscribed`, delivery, gap and `ack_ok` of each
//! client, in the order that client saw them); `check` then reports, per anomaly class, what
//! ackgate's promise (docs/semantics.md) rules out:
//!
//! - *lost*: published at or after the client's start, never delivered to it and covered by no
//!   gap; split into prefix (below everything it received on that partition), middle and suffix
//!   (above everything it received), as Jepsen's queue checker does;
//! - *unexpected*: delivered, but no publish ever carried that payload;
//! - *duplicates*: deliveries of an offset the client had already received (allowed, counted);
//! - *non-monotonic*: a first delivery below an earlier first delivery of the same partition;
//! - *skips*: a first delivery that passed over a known offset of the partition the client had not
//!   received yet and no gap covered;
//! - *committed went back*: an `ack_ok` below an earlier one, a session started (`subscribed`
//!   `from`) below a committed offset an `ack_ok` already confirmed, or a stored offset at the end
//!   below one; there are no operator resets in the workload, so none is allowed;
//! - *divergence*: one offset with two payloads (two publish answers, or a delivery that differs
//!   from the answer).
//!
//! - *replays by time*: a `subscribe` with `from: {"time": T}` (a fresh client) started a
//!   partition above its first event stamped at or after `T` (a skip), or below it at an event
//!   that was answered before the subscribe was sent (replayed too much, the log start at worst),
//!   judged by the `timestamp` of every delivery.
//!
//! Payloads carry a run-unique id (`{"id": N}`), which is how a delivery is matched to its publish.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A topic's partition.
pub type Partition = (String, u32);

/// What one client saw, in its order.
#[derive(Debug, Clone)]
enum Seen {
    /// A `subscribed` frame's `from` for one partition.
    Subscribed {
        partition: Partition,
        from: u64,
    },
    Delivered {
        partition: Partition,
        offset: u64,
        payload: u64,
    },
    /// A `gap` (or a `subscribed` gap): `from`..`to`-1 will never come.
    Gap {
        partition: Partition,
        from: u64,
        to: u64,
    },
    /// An `ack_ok`'s committed offset for one partition.
    Confirmed {
        partition: Partition,
        committed: u64,
    },
}

#[derive(Default)]
pub struct History {
    /// Answered 200: partition -> offset -> payload ids answered for it (more than one is divergence).
    published: BTreeMap<Partition, BTreeMap<u64, BTreeSet<u64>>>,
    /// Every payload id a publish carried, answered or not: a publish cut off by a fault may still
    /// have been written, so its events are never "unexpected".
    attempted: HashSet<u64>,
    clients: BTreeMap<String, Vec<Seen>>,
    /// Deliveries recorded, for progress lines.
    deliveries: u64,
    /// Committed offsets stored at the end (`GET /admin/offsets`), per client.
    stored: BTreeMap<String, BTreeMap<Partition, u64>>,
    /// Each event's `timestamp` as delivered (the gateway's clock when it was written).
    stamps: BTreeMap<Partition, BTreeMap<u64, u64>>,
    /// When each publish answer came (this machine's true clock, ms).
    answered_at: BTreeMap<Partition, BTreeMap<u64, u64>>,
    time_replays: Vec<TimeReplay>,
}

/// A `subscribe` with `from: {"time": time}` sent at `sent_at` (ms, the true clock) and the start
/// its `subscribed` named for one partition.
#[derive(Debug, Clone)]
struct TimeReplay {
    client: String,
    partition: Partition,
    time: u64,
    sent_at: u64,
    from: u64,
}

/// A count per anomaly class, and the first few examples of each.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub published: u64,
    pub attempted: u64,
    pub deliveries: u64,
    pub first_deliveries: u64,
    pub duplicates: u64,
    pub lost_prefix: u64,
    pub lost_middle: u64,
    pub lost_suffix: u64,
    pub unexpected: u64,
    pub non_monotonic: u64,
    pub skips: u64,
    pub committed_went_back: u64,
    pub divergence: u64,
    /// Fresh tokens the gateways refused (set by `loadtest chaos`, not by the checker).
    pub tokens_refused: u64,
    /// Duplicates above the bound the workload summed (`apply_duplicate_bound`): at least once
    /// allows duplicates, but only of what was in flight when something ended.
    pub duplicates_over_bound: u64,
    /// Sessions closed at their token's expiry (4004) while the token was valid by more than the
    /// clocks' bound (set by `loadtest chaos`).
    pub closed_with_valid_token: u64,
    /// Partitions started by a `from: {"time": ...}` subscribe (not an anomaly: how many were
    /// checked).
    pub time_replays: u64,
    /// ... above the partition's first event stamped at or after the time.
    pub time_replay_skips: u64,
    /// ... below it, at an event answered before the subscribe was sent.
    pub time_replay_too_early: u64,
    pub examples: Vec<String>,
}

const EXAMPLES: usize = 20;

impl Report {
    /// The classes that break the promise (duplicates do not: at least once).
    pub fn anomalies(&self) -> u64 {
        self.lost_prefix
            + self.lost_middle
            + self.lost_suffix
            + self.unexpected
            + self.non_monotonic
            + self.skips
            + self.committed_went_back
            + self.divergence
            + self.tokens_refused
            + self.duplicates_over_bound
            + self.closed_with_valid_token
            + self.time_replay_skips
            + self.time_replay_too_early
    }

    /// Counts the duplicates above `bound` (what was in flight at each session's end, clock jump
    /// and nack, as the workload summed it) as an anomaly, with an example naming both: a bound
    /// that only printed a line could not fail a run (issue 60, item 2).
    pub fn apply_duplicate_bound(&mut self, bound: u64) {
        self.duplicates_over_bound = self.duplicates.saturating_sub(bound);
        if self.duplicates_over_bound > 0 {
            self.example(format!(
                "duplicates {} above the bound {bound} (what was in flight when each session ended and at each clock jump, plus nacks)",
                self.duplicates
            ));
        }
    }

    fn example(&mut self, text: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(text);
        }
    }

    /// The report as rows `(class, count)`, in print order.
    pub fn rows(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("published (answered 200)", self.published),
            ("publishes attempted (events)", self.attempted),
            ("deliveries", self.deliveries),
            ("first deliveries", self.first_deliveries),
            ("duplicates", self.duplicates),
            ("lost (prefix)", self.lost_prefix),
            ("lost (middle)", self.lost_middle),
            ("lost (suffix)", self.lost_suffix),
            ("unexpected", self.unexpected),
            ("non-monotonic", self.non_monotonic),
            ("skips", self.skips),
            ("committed went back", self.committed_went_back),
            ("divergence", self.divergence),
            ("tokens refused", self.tokens_refused),
            ("duplicates above the bound", self.duplicates_over_bound),
            ("closed with a valid token", self.closed_with_valid_token),
            ("replays by time (partitions)", self.time_replays),
            ("replay by time skipped", self.time_replay_skips),
            ("replay by time too early", self.time_replay_too_early),
        ]
    }
}

impl History {
    pub fn attempted(&mut self, payload: u64) {
        self.attempted.insert(payload);
    }

    pub fn published(&mut self, partition: Partition, offset: u64, payload: u64) {
        self.attempted.insert(payload);
        self.published.entry(partition).or_default().entry(offset).or_default().insert(payload);
    }

    /// When the publish answer for `offset` came, in ms of the true clock.
    pub fn answered_at(&mut self, partition: Partition, offset: u64, at_ms: u64) {
        self.answered_at.entry(partition).or_default().insert(offset, at_ms);
    }

    /// A delivery's `timestamp`.
    pub fn stamped(&mut self, partition: Partition, offset: u64, timestamp_ms: u64) {
        self.stamps.entry(partition).or_default().insert(offset, timestamp_ms);
    }

    /// A fresh `client`'s `subscribe` with `from: {"time": time}`, sent at `sent_at` (ms, the true
    /// clock), started `partition` at `from`.
    pub fn time_replay(&mut self, client: &str, partition: Partition, time: u64, sent_at: u64, from: u64) {
        self.time_replays.push(TimeReplay { client: client.to_string(), partition, time, sent_at, from });
    }

    fn seen(&mut self, client: &str, seen: Seen) {
        match self.clients.get_mut(client) {
            Some(list) => list.push(seen),
            None => {
                self.clients.insert(client.to_string(), vec![seen]);
            }
        }
    }

    pub fn subscribed(&mut self, client: &str, partition: Partition, from: u64) {
        self.seen(client, Seen::Subscribed { partition, from });
    }

    pub fn delivered(&mut self, client: &str, partition: Partition, offset: u64, payload: u64) {
        self.deliveries += 1;
        self.seen(client, Seen::Delivered { partition, offset, payload });
    }

    pub fn gap(&mut self, client: &str, partition: Partition, from: u64, to: u64) {
        self.seen(client, Seen::Gap { partition, from, to });
    }

    pub fn confirmed(&mut self, client: &str, partition: Partition, committed: u64) {
        self.seen(client, Seen::Confirmed { partition, committed });
    }

    /// A committed offset stored at the end; with several instances, the largest any holds.
    pub fn stored_max(&mut self, client: &str, partition: Partition, committed: u64) {
        let stored = self.stored.entry(client.to_string()).or_default().entry(partition).or_insert(committed);
        *stored = (*stored).max(committed);
    }

    /// True once `client` received every offset answered 200 so far at or after its start (or a
    /// gap covers it): the workload's settle phase waits for this.
    pub fn caught_up(&self, client: &str) -> bool {
        let Some(seen) = self.clients.get(client) else { return self.published.is_empty() };
        let view = ClientView::of(seen);
        self.published.iter().all(|(partition, offsets)| {
            let start = view.start.get(partition).copied();
            offsets.keys().all(|offset| start.is_some_and(|s| *offset < s) || view.received(partition, *offset) || view.in_gap(partition, *offset))
        })
    }

    /// Events answered 200 and deliveries so far: the progress line, without a check.
    pub fn counts(&self) -> (u64, u64) {
        (self.published.values().map(|o| o.len() as u64).sum(), self.deliveries)
    }

    pub fn check(&self) -> Report {
        let mut report =
            Report { published: self.published.values().map(|o| o.len() as u64).sum(), attempted: self.attempted.len() as u64, ..Default::default() };
        // Every offset known to hold an event: answered, or delivered to anyone; and the payload
        // each offset holds as first answered or delivered (divergence against it).
        let mut known: BTreeMap<Partition, BTreeMap<u64, u64>> = BTreeMap::new();
        for (partition, offsets) in &self.published {
            for (offset, payloads) in offsets {
                let mut payloads = payloads.iter();
                let first = *payloads.next().expect("an answered offset has a payload");
                known.entry(partition.clone()).or_default().insert(*offset, first);
                for other in payloads {
                    report.divergence += 1;
                    report.example(format!("divergence: {partition:?} offset {offset} answered for payloads {first} and {other}"));
                }
            }
        }
        for (client, seen) in &self.clients {
            for s in seen {
                if let Seen::Delivered { partition, offset, payload } = s {
                    if !self.attempted.contains(payload) {
                        report.unexpected += 1;
                        report.example(format!("unexpected: {client} got payload {payload} at {partition:?} offset {offset}, never published"));
                    }
                    let holds = known.entry(partition.clone()).or_default().entry(*offset).or_insert(*payload);
                    if *holds != *payload {
                        report.divergence += 1;
                        report.example(format!("divergence: {client} got payload {payload} at {partition:?} offset {offset}, which holds {holds}"));
                    }
                }
            }
        }
        for (client, seen) in &self.clients {
            self.check_client(client, seen, &known, &mut report);
        }
        self.check_time_replays(&mut report);
        report
    }

    /// Each replay by time started at the partition's first event stamped at or after its time,
    /// as far as the stamps delivered show: not above it (a skip), and not below it at an event
    /// that was already answered when the subscribe went out (events answered later may lawfully
    /// come first: they were not there to be passed over).
    fn check_time_replays(&self, report: &mut Report) {
        let none = BTreeMap::new();
        for replay in &self.time_replays {
            report.time_replays += 1;
            let stamps = self.stamps.get(&replay.partition).unwrap_or(&none);
            let first = stamps.iter().find(|(_, stamp)| **stamp >= replay.time).map(|(offset, _)| *offset);
            let TimeReplay { client, partition, time, from, .. } = replay;
            if let Some(first) = first.filter(|first| *first < *from) {
                report.time_replay_skips += 1;
                report.example(format!(
                    "replay by time skipped: {client} {partition:?} from {time} started at {from}, above offset {first} stamped {}",
                    stamps[&first]
                ));
            }
            let answered = self.answered_at.get(partition).unwrap_or(&none);
            // Only events known to be stamped before the time: one no client received may be
            // stamped after it.
            let too_early = answered
                .range(*from..first.unwrap_or(u64::MAX).max(*from))
                .find(|(offset, at)| **at < replay.sent_at && stamps.get(offset).is_some_and(|stamp| *stamp < replay.time));
            if let Some((offset, _)) = too_early {
                report.time_replay_too_early += 1;
                let stamp = stamps.get(offset).map_or("unknown".to_string(), u64::to_string);
                report.example(format!("replay by time too early: {client} {partition:?} from {time} started at {from}, below offset {offset} stamped {stamp}, answered before the subscribe"));
            }
        }
    }

    fn check_client(&self, client: &str, seen: &[Seen], known: &BTreeMap<Partition, BTreeMap<u64, u64>>, report: &mut Report) {
        let mut received: HashMap<&Partition, BTreeSet<u64>> = HashMap::new();
        let mut gaps: HashMap<&Partition, Vec<(u64, u64)>> = HashMap::new();
        let mut highest_first: HashMap<&Partition, u64> = HashMap::new();
        // Per partition, the known offsets below this one were looked at for skips already:
        // each is looked at once, not at every first delivery above it.
        let mut skips_checked_to: HashMap<&Partition, u64> = HashMap::new();
        let mut confirmed: HashMap<&Partition, u64> = HashMap::new();
        let mut start: HashMap<&Partition, u64> = HashMap::new();
        let in_gap = |gaps: &HashMap<&Partition, Vec<(u64, u64)>>, partition: &Partition, offset: u64| {
            gaps.get(partition).is_some_and(|g| g.iter().any(|(from, to)| (*from..*to).contains(&offset)))
        };
        for s in seen {
            match s {
                Seen::Subscribed { partition, from } => {
                    start.entry(partition).or_insert(*from);
                    if let Some(c) = confirmed.get(partition).filter(|c| from < c) {
                        report.committed_went_back += 1;
                        report.example(format!("committed went back: {client} {partition:?} started at {from} after an ack_ok confirmed {c}"));
                    }
                }
                Seen::Gap { partition, from, to } => gaps.entry(partition).or_default().push((*from, *to)),
                Seen::Confirmed { partition, committed } => {
                    let before = confirmed.entry(partition).or_insert(0);
                    if committed < before {
                        report.committed_went_back += 1;
                        report.example(format!("committed went back: {client} {partition:?} ack_ok {committed} after {before}"));
                    }
                    *before = (*before).max(*committed);
                }
                Seen::Delivered { partition, offset, .. } => {
                    report.deliveries += 1;
                    let got = received.entry(partition).or_default();
                    if !got.insert(*offset) {
                        report.duplicates += 1;
                        continue;
                    }
                    report.first_deliveries += 1;
                    let highest = highest_first.get(partition).copied();
                    if highest.is_some_and(|h| *offset < h) {
                        report.non_monotonic += 1;
                        report.example(format!("non-monotonic: {client} {partition:?} first delivery of {offset} after {}", highest.unwrap_or_default()));
                    }
                    highest_first.insert(partition, highest.map_or(*offset, |h| h.max(*offset)));
                    // Known offsets passed over: at or after the client's start, below this one,
                    // not received yet, no gap.
                    let checked_to = skips_checked_to.entry(partition).or_insert(0);
                    let from = start.get(partition).copied().unwrap_or(0).max(*checked_to);
                    *checked_to = (*checked_to).max(*offset + 1);
                    if let Some(offsets) = known.get(partition).filter(|_| from < *offset) {
                        for skipped in offsets.range(from..*offset).map(|(o, _)| *o) {
                            if !got.contains(&skipped) && !in_gap(&gaps, partition, skipped) {
                                report.skips += 1;
                                report.example(format!("skip: {client} {partition:?} got {offset} before {skipped}, no gap"));
                            }
                        }
                    }
                }
            }
        }
        // Lost: answered, at or after the start, never received, no gap.
        for (partition, offsets) in &self.published {
            let Some(from) = start.get(partition).copied() else {
                if !offsets.is_empty() {
                    report.lost_suffix += offsets.len() as u64;
                    report.example(format!("lost: {client} never subscribed to {partition:?}, {} events", offsets.len()));
                }
                continue;
            };
            let got = received.get(partition);
            let (lowest, highest) = (got.and_then(|g| g.first().copied()), got.and_then(|g| g.last().copied()));
            for offset in offsets.keys().copied().filter(|o| *o >= from) {
                if got.is_some_and(|g| g.contains(&offset)) || in_gap(&gaps, partition, offset) {
                    continue;
                }
                match (lowest, highest) {
                    (Some(l), _) if offset < l => report.lost_prefix += 1,
                    (_, Some(h)) if offset < h => report.lost_middle += 1,
                    _ => report.lost_suffix += 1,
                }
                report.example(format!("lost: {client} {partition:?} offset {offset} (received {lowest:?}..={highest:?})"));
            }
        }
        for (partition, stored) in self.stored.get(client).into_iter().flatten() {
            if let Some(c) = confirmed.get(partition).filter(|c| stored < c) {
                report.committed_went_back += 1;
                report.example(format!("committed went back: {client} {partition:?} stored {stored} at the end after an ack_ok confirmed {c}"));
            }
        }
    }
}

/// What `caught_up` needs of one client's history.
struct ClientView<'a> {
    start: HashMap<&'a Partition, u64>,
    received: HashMap<&'a Partition, HashSet<u64>>,
    gaps: HashMap<&'a Partition, Vec<(u64, u64)>>,
}

impl<'a> ClientView<'a> {
    fn of(seen: &'a [Seen]) -> Self {
        let mut view = Self { start: HashMap::new(), received: HashMap::new(), gaps: HashMap::new() };
        for s in seen {
            match s {
                Seen::Subscribed { partition, from } => {
                    view.start.entry(partition).or_insert(*from);
                }
                Seen::Delivered { partition, offset, .. } => {
                    view.received.entry(partition).or_default().insert(*offset);
                }
                Seen::Gap { partition, from, to } => view.gaps.entry(partition).or_default().push((*from, *to)),
                Seen::Confirmed { .. } => {}
            }
        }
        view
    }

    fn received(&self, partition: &Partition, offset: u64) -> bool {
        self.received.get(partition).is_some_and(|r| r.contains(&offset))
    }

    fn in_gap(&self, partition: &Partition, offset: u64) -> bool {
        self.gaps.get(partition).is_some_and(|g| g.iter().any(|(from, to)| (*from..*to).contains(&offset)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u32) -> Partition {
        ("t".to_string(), n)
    }

    /// Ten events on partition 0, payload id = 100 + offset.
    fn ten_published() -> History {
        let mut h = History::default();
        for offset in 0..10 {
            h.published(p(0), offset, 100 + offset);
        }
        h
    }

    fn deliver(h: &mut History, client: &str, offsets: impl IntoIterator<Item = u64>) {
        for offset in offsets {
            h.delivered(client, p(0), offset, 100 + offset);
        }
    }

    #[test]
    fn duplicates_above_the_bound_are_an_anomaly_and_within_it_are_not() {
        let mut report = Report { duplicates: 10, ..Report::default() };
        report.apply_duplicate_bound(10);
        assert_eq!((report.anomalies(), report.duplicates_over_bound), (0, 0));
        report.apply_duplicate_bound(7);
        assert_eq!((report.anomalies(), report.duplicates_over_bound), (3, 3));
        assert!(report.examples[0].contains("above the bound 7"), "{:?}", report.examples);
        assert!(report.rows().contains(&("duplicates above the bound", 3)));
    }

    #[test]
    fn a_clean_history_has_no_anomaly_and_counts_duplicates() {
        let mut h = ten_published();
        h.subscribed("c", p(0), 0);
        deliver(&mut h, "c", 0..6);
        h.confirmed("c", p(0), 4);
        // A crash: the session starts again at the confirmed floor, 4 and 5 come again.
        h.subscribed("c", p(0), 4);
        deliver(&mut h, "c", 4..10);
        h.confirmed("c", p(0), 10);
        h.stored_max("c", p(0), 10);
        let r = h.check();
        assert_eq!(r.anomalies(), 0, "{r:?}");
        assert_eq!((r.published, r.deliveries, r.first_deliveries, r.duplicates), (10, 12, 10, 2));
        assert!(h.caught_up("c"));
    }

    #[test]
    fn lost_events_are_split_into_prefix_middle_and_suffix() {
        let mut h = ten_published();
        h.subscribed("c", p(0), 0);
        deliver(&mut h, "c", [2, 3, 5, 6, 7]);
        let r = h.check();
        assert_eq!((r.lost_prefix, r.lost_middle, r.lost_suffix), (2, 1, 2), "{r:?}");
        assert!(!h.caught_up("c"));
    }

    #[test]
    fn events_before_the_start_or_in_a_gap_are_not_lost() {
        let mut h = ten_published();
        h.subscribed("c", p(0), 3);
        deliver(&mut h, "c", 3..5);
        h.gap("c", p(0), 5, 8);
        deliver(&mut h, "c", 8..10);
        let r = h.check();
        assert_eq!(r.anomalies(), 0, "{r:?}");
        assert!(h.caught_up("c"));
    }

    #[test]
    fn a_skip_without_a_gap_and_a_late_first_delivery_are_reported() {
        let mut h = ten_published();
        h.subscribed("c", p(0), 0);
        deliver(&mut h, "c", [0, 1, 3, 2, 4]);
        let r = h.check();
        assert_eq!((r.skips, r.non_monotonic), (1, 1), "{r:?}");
    }

    #[test]
    fn a_committed_offset_that_goes_back_is_reported_three_ways() {
        let mut h = ten_published();
        h.subscribed("c", p(0), 0);
        deliver(&mut h, "c", 0..8);
        h.confirmed("c", p(0), 8);
        h.confirmed("c", p(0), 6);
        h.subscribed("c", p(0), 5);
        deliver(&mut h, "c", 5..10);
        h.stored_max("c", p(0), 7);
        let r = h.check();
        assert_eq!(r.committed_went_back, 3, "{r:?}");
    }

    #[test]
    fn unexpected_payloads_and_divergent_offsets_are_reported() {
        let mut h = ten_published();
        h.published(p(0), 3, 999);
        h.attempted(500);
        h.subscribed("c", p(0), 0);
        deliver(&mut h, "c", 0..5);
        h.delivered("c", p(0), 5, 500);
        h.delivered("c", p(0), 6, 777);
        let r = h.check();
        // Offset 3 answered twice; 5 delivered with an attempted (written, unanswered) payload
        // that differs from the answer; 6 with a payload nobody published.
        assert_eq!((r.divergence, r.unexpected), (3, 1), "{r:?}");
    }

    /// Ten events stamped 1000, 1010, ... 1090 (offsets 0-9), answered at 2000 + offset.
    fn ten_stamped() -> History {
        let mut h = ten_published();
        for offset in 0..10 {
            h.stamped(p(0), offset, 1000 + 10 * offset);
            h.answered_at(p(0), offset, 2000 + offset);
        }
        h
    }

    #[test]
    fn a_replay_by_time_must_start_at_the_first_event_stamped_at_or_after_the_time() {
        // From 1035: offset 4 (stamped 1040) is the first at or after it.
        let mut h = ten_stamped();
        h.time_replay("exact", p(0), 1035, 3000, 4);
        h.time_replay("at a stamp", p(0), 1040, 3000, 4);
        // Nothing stamped at or after 5000 yet: the log end, 10.
        h.time_replay("future", p(0), 5000, 3000, 10);
        // Offsets 6.. answered after the subscribe was sent (at 2005): they could not be passed over.
        h.time_replay("raced", p(0), 1095, 2005, 6);
        let r = h.check();
        assert_eq!((r.anomalies(), r.time_replays), (0, 4), "{r:?}");

        let mut h = ten_stamped();
        h.time_replay("skipped", p(0), 1035, 3000, 5);
        h.time_replay("from the log start", p(0), 1035, 3000, 0);
        h.time_replay("before the end", p(0), 5000, 3000, 9);
        let r = h.check();
        assert_eq!((r.time_replay_skips, r.time_replay_too_early, r.anomalies()), (1, 2, 3), "{r:?}");
        assert!(r.examples.iter().any(|e| e.contains("skipped: skipped") && e.contains("above offset 4 stamped 1040")), "{:?}", r.examples);
        assert!(r.examples.iter().any(|e| e.contains("too early: from the log start") && e.contains("below offset 0")), "{:?}", r.examples);
    }
}
