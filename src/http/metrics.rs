//! `GET /metrics` (Prometheus text format) and the HTTP request metrics middleware. The only
//! import of metrics-exporter-prometheus. Counters are bumped where things happen (`core::metrics`);
//! gauges that describe current state are computed here, at scrape time, so the hot path never
//! pays for them.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use super::AppState;
use crate::core::metrics::{
    ACK_LATENCY, BACKEND_UP, BROKER_ACKS, BUILD_INFO, CLIENT_COMMITTED_LAG, COMMITTED_LAG, COMMITTED_LAG_MAX, CONNECTIONS, DATA_DIR_FREE, DATA_DIR_SIZE,
    DEAD_LETTER_BACKLOG, GROUP_MEMBERS, GROUP_WAITING, HTTP_DURATION, HTTP_REQUESTS, IN_FLIGHT, OFFSET_WRITES, OLDEST_SESSION_AGE, PEERS, PROCESS_CPU,
    PROCESS_MAX_FDS, PROCESS_OPEN_FDS, PROCESS_RSS, PROCESS_START, PUBLISH_TO_DELIVERY, PULL_LAG, READY, SESSIONS, STALLED_SESSIONS,
};
use crate::core::names::{ClientId, OffsetKey, TopicName, TopicPartition};
use crate::core::offsets::OffsetFilter;
use crate::core::session_registry::Transport;

/// Histogram buckets in seconds: 50 us to 10 s.
const BUCKETS: [f64; 16] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// A gauge not set for this long is dropped from the scrape output.
const GAUGE_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the process-wide Prometheus recorder (once; later gateways in the same process share
/// it). Must run before the dispatcher registers its metric handles.
pub fn install_recorder() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            // Every gauge is set at scrape time; one not set for a while describes something
            // gone (a deleted topic's pull lag) and is dropped from the output.
            let builder = PrometheusBuilder::new()
                .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
                .set_buckets_for_metric(Matcher::Full(ACK_LATENCY.into()), &BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(HTTP_DURATION.into()), &BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(PUBLISH_TO_DELIVERY.into()), &BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(crate::core::metrics::FSYNC.into()), &BUCKETS));
            match builder.and_then(|b| b.install_recorder()) {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed; /metrics will be empty");
                    None
                }
            }
        })
        .as_ref()
}

/// How often histogram samples are folded into their buckets (a scrape folds them too). Each
/// sample waits as 8 bytes until then: at 400,000 acks/s, with two histograms per ack, 5 s of them
/// were up to 32 MB of a busy gateway's heap, and a second of them still 7 MB of a fan-out's
/// (docs/performance.md, "Memory of one busy client"). A fold costs the same per sample however
/// often it runs.
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Folds recorded histogram samples into their buckets. Each sample sits in a queue until this
/// runs (a scrape runs it too): without it, a gateway nobody scrapes would keep 8 bytes per ack.
pub fn upkeep() {
    if let Some(handle) = install_recorder() {
        handle.run_upkeep();
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "health",
    summary = "Prometheus metrics (text format), names prefixed ackgate_",
    responses(
        (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
    )
)]
pub async fn scrape(State(app): State<AppState>) -> Response {
    let d = &app.dispatcher;
    let sessions = d.sessions();
    for transport in Transport::ALL {
        let count = sessions.iter().filter(|s| s.transport == transport).count();
        metrics::gauge!(SESSIONS, "transport" => transport.as_str()).set(count as f64);
    }
    let in_flight: usize = sessions.iter().map(|s| s.stats.in_flight.load(Ordering::Relaxed)).sum();
    metrics::gauge!(IN_FLIGHT).set(in_flight as f64);
    let stalled = sessions.iter().filter(|s| s.stats.stalled.load(Ordering::Relaxed)).count();
    metrics::gauge!(STALLED_SESSIONS).set(stalled as f64);
    metrics::gauge!(CONNECTIONS).set(app.connections.open() as f64);
    let writes = &d.writer.stats;
    // The offset writer thread keeps its own counters; export them as they stand.
    metrics::counter!(OFFSET_WRITES, "result" => "advanced").absolute(writes.advanced.load(Ordering::Relaxed));
    metrics::counter!(OFFSET_WRITES, "result" => "stale").absolute(writes.stale.load(Ordering::Relaxed));
    metrics::counter!(OFFSET_WRITES, "result" => "obsolete").absolute(writes.obsolete.load(Ordering::Relaxed));
    metrics::counter!(OFFSET_WRITES, "result" => "failed").absolute(writes.failed_batches.load(Ordering::Relaxed));
    metrics::counter!(BROKER_ACKS, "result" => "ok").absolute(writes.broker_acks.load(Ordering::Relaxed));
    metrics::counter!(BROKER_ACKS, "result" => "skipped").absolute(writes.broker_acks_skipped.load(Ordering::Relaxed));
    record_pull_lag(&app).await;
    record_committed_lag(&app).await;
    record_dead_letter_backlog(&app).await;
    let readiness = super::health::readiness(&app).await;
    metrics::gauge!(READY).set(if readiness.ready { 1.0 } else { 0.0 });
    metrics::gauge!(BACKEND_UP).set(if readiness.backend_ok { 1.0 } else { 0.0 });
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let cpu_seconds = record_process();
    record_data_dir(&app.config.storage.data_dir);
    record_certificate(app.tls.as_deref());
    let peers = app.cluster.peers();
    let ready = peers.iter().filter(|(_, instance)| instance.is_some()).count();
    metrics::gauge!(PEERS, "state" => "ready").set(ready as f64);
    metrics::gauge!(PEERS, "state" => "unready").set((peers.len() - ready) as f64);
    let Some(handle) = install_recorder() else {
        return ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], String::new()).into_response();
    };
    handle.run_upkeep();
    let mut text = handle.render();
    // A counter of fractional seconds, as Prometheus' client libraries export it: the metrics
    // crate's counters count whole numbers (and a gauge named `_total` fails `promtool check
    // metrics`), so its lines are written here.
    if let Some(seconds) = cpu_seconds {
        text.push_str(&format!("# HELP {PROCESS_CPU} User and system CPU time of the process.\n# TYPE {PROCESS_CPU} counter\n{PROCESS_CPU} {seconds}\n"));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// `log_end - pull_offset` for every partition this instance has pulled from. A backend that
/// cannot answer now (Kafka outage) leaves the last value.
async fn record_pull_lag(app: &AppState) {
    let backend = &app.dispatcher.backend;
    let Ok(topics) = backend.topics().await else { return };
    for (topic, partitions) in topics {
        for partition in 0..partitions {
            let tp = crate::core::names::TopicPartition::new(topic.clone(), partition);
            let Some(pulled) = backend.pull_offset(&tp) else { continue };
            let Ok(bounds) = backend.log_bounds(&tp).await else { continue };
            let lag = bounds.log_end.saturating_sub(pulled.max(bounds.log_start));
            metrics::gauge!(PULL_LAG, "topic" => topic.to_string(), "partition" => partition.to_string()).set(lag as f64);
        }
    }
}

/// The process's memory, descriptors and start time, from /proc (Linux); returns its CPU time in
/// seconds (written as a counter by `scrape`). A figure that cannot be read is left out.
fn record_process() -> Option<f64> {
    // SAFETY: sysconf and getrlimit only read the system's settings and write the struct passed.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    let mut cpu_seconds = None;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // The command name (field 2) is in parentheses and may hold spaces: count after it.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
        if let (Some(user), Some(system)) = (field(14), field(15)) {
            cpu_seconds = Some((user + system) / ticks);
        }
        if let Some(rss_pages) = field(24) {
            metrics::gauge!(PROCESS_RSS).set(rss_pages * page);
        }
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok()));
        if let (Some(boot), Some(started)) = (boot, field(22)) {
            metrics::gauge!(PROCESS_START).set(boot + started / ticks);
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!(PROCESS_OPEN_FDS).set(fds.count() as f64);
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        metrics::gauge!(PROCESS_MAX_FDS).set(limit.rlim_cur as f64);
    }
    cpu_seconds
}

/// Free and total bytes of the file system `storage.data_dir` is on: a full disk stops offset
/// writes and publishes, and the process may exit before an alert's `for:` on anything else.
fn record_data_dir(data_dir: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(data_dir.as_os_str().as_bytes()) else { return };
    // SAFETY: statvfs reads the path (a NUL-terminated string that outlives the call) and writes
    // only the struct passed.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return;
    }
    let block = stat.f_frsize as f64;
    metrics::gauge!(DATA_DIR_FREE).set(stat.f_bavail as f64 * block);
    metrics::gauge!(DATA_DIR_SIZE).set(stat.f_blocks as f64 * block);
}

/// When the certificate in use expires (set at each scrape: gauges not set are dropped).
fn record_certificate(tls: Option<&super::tls::Tls>) {
    if let Some(at) = tls.and_then(|tls| tls.not_after()) {
        crate::core::metrics::tls_cert_expires_at(at);
    }
}

/// The clients with the most committed lag that get a series of their own
/// (`ackgate_client_committed_lag`): a bounded label set, however many clients there are.
const TOP_LAGGING_CLIENTS: usize = 10;

/// Per topic, what the clients with a live session here have not acknowledged: `log_end -
/// committed` over their partitions (stored committed offsets; none stored counts from the log
/// start). One label, the topic. Then every stored client's, live or offline
/// (`stored_client_lags`): the worst per topic is `ackgate_committed_lag_max{topic}`, and the
/// `TOP_LAGGING_CLIENTS` (topic, client) pairs with the most lag get
/// `ackgate_client_committed_lag{topic, client_id}` (every client's own lag is in
/// `GET /admin/offsets`). A series no longer set is dropped (`GAUGE_IDLE`). Also the age of the
/// oldest live session.
async fn record_committed_lag(app: &AppState) {
    let d = &app.dispatcher;
    let mut readers: std::collections::BTreeMap<TopicName, std::collections::BTreeSet<ClientId>> = Default::default();
    let sessions = d.sessions();
    let now_ms = d.clock.now_ms();
    let oldest = sessions.iter().map(|s| s.connected_at).min();
    metrics::gauge!(OLDEST_SESSION_AGE).set(oldest.map_or(0.0, |at| now_ms.saturating_sub(at) as f64 / 1000.0));
    let groups = d.groups.describe(None, None).await;
    metrics::gauge!(GROUP_MEMBERS).set(groups.iter().map(|g| g.members.len()).sum::<usize>() as f64);
    metrics::gauge!(GROUP_WAITING).set(groups.iter().map(|g| g.waiting).sum::<usize>() as f64);
    for session in sessions {
        for topic in session.subscriptions.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            readers.entry(topic.clone()).or_default().insert(session.client_id.clone());
        }
    }
    let mut per_client: Vec<(u64, TopicName, ClientId)> = Vec::new();
    for (topic, clients) in readers {
        let Ok(Some(partitions)) = d.backend.partitions(&topic).await else { continue };
        let mut lags: std::collections::BTreeMap<&ClientId, u64> = clients.iter().map(|c| (c, 0)).collect();
        for partition in 0..partitions {
            let Ok(bounds) = d.backend.log_bounds(&TopicPartition::new(topic.clone(), partition)).await else { continue };
            for client in &clients {
                let key = OffsetKey::new(topic.clone(), client.clone(), partition);
                let committed = d.store.read(&key).ok().flatten().map(|r| r.committed);
                let lag = lags.entry(client).or_default();
                *lag = lag.saturating_add(bounds.lag(committed));
            }
        }
        let total = lags.values().fold(0u64, |sum, lag| sum.saturating_add(*lag));
        metrics::gauge!(COMMITTED_LAG, "topic" => topic.to_string()).set(total as f64);
        per_client.extend(lags.into_iter().filter(|(_, lag)| *lag > 0).map(|(client, lag)| (lag, topic.clone(), client.clone())));
    }
    // Offline clients too: Kafka's and NATS's operators page on consumer lag first, and a client
    // that went away is the one whose lag grows unseen.
    let stored = stored_client_lags(app).await;
    for (topic, worst) in worst_per_topic(stored.iter().chain(&per_client)) {
        metrics::gauge!(COMMITTED_LAG_MAX, "topic" => topic.to_string()).set(worst as f64);
    }
    let mut lags: std::collections::BTreeMap<(TopicName, ClientId), u64> = Default::default();
    for (lag, topic, client) in stored.into_iter().chain(per_client) {
        let kept = lags.entry((topic, client)).or_default();
        *kept = (*kept).max(lag);
    }
    let mut per_client: Vec<(u64, TopicName, ClientId)> =
        lags.into_iter().filter(|(_, lag)| *lag > 0).map(|((topic, client), lag)| (lag, topic, client)).collect();
    per_client.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (&a.1, &a.2).cmp(&(&b.1, &b.2))));
    // A client that left the top (caught up, reset, deleted) reads 0 at once, then its series
    // goes (`GAUGE_IDLE`), instead of its last lag lingering.
    static EXPORTED: std::sync::Mutex<std::collections::BTreeSet<(String, String)>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut exported = EXPORTED.lock().unwrap_or_else(|e| e.into_inner());
    let top: std::collections::BTreeSet<(String, String)> = per_client
        .into_iter()
        .take(TOP_LAGGING_CLIENTS)
        .map(|(lag, topic, client)| {
            metrics::gauge!(CLIENT_COMMITTED_LAG, "topic" => topic.to_string(), "client_id" => client.to_string()).set(lag as f64);
            (topic.to_string(), client.to_string())
        })
        .collect();
    for (topic, client) in exported.difference(&top) {
        metrics::gauge!(CLIENT_COMMITTED_LAG, "topic" => topic.clone(), "client_id" => client.clone()).set(0.0);
    }
    *exported = top;
}

/// Offset records read at one scrape for the stored clients' lag: a store holding more is read
/// this far (the scrape stays short; `GET /admin/offsets` lists every row's lag).
const STORED_LAG_RECORDS: usize = 100_000;

/// Every stored client's lag per topic, `(lag, topic, client)`, live or not: its stored
/// committed offsets against the log ends (one read of the log per partition).
async fn stored_client_lags(app: &AppState) -> Vec<(u64, TopicName, ClientId)> {
    let store = app.dispatcher.store.clone();
    let scanned = tokio::task::spawn_blocking(move || {
        let (mut records, mut after) = (Vec::new(), None);
        while records.len() < STORED_LAG_RECORDS {
            let page = store.scan_page(&OffsetFilter::default(), after.as_ref(), 10_000).ok()?;
            let full = page.len() == 10_000;
            after = page.last().map(|(key, _)| key.clone());
            records.extend(page.into_iter().map(|(key, record)| (key, record.committed)));
            if !full {
                break;
            }
        }
        Some(records)
    })
    .await;
    let Ok(Some(records)) = scanned else { return Vec::new() };
    let mut bounds: std::collections::HashMap<TopicPartition, Option<crate::core::backend::PartitionBounds>> = Default::default();
    let mut lags: std::collections::BTreeMap<(TopicName, ClientId), u64> = Default::default();
    for (key, committed) in records {
        let tp = TopicPartition::new(key.topic.clone(), key.partition);
        if !bounds.contains_key(&tp) {
            let read = app.dispatcher.backend.log_bounds(&tp).await.ok();
            bounds.insert(tp.clone(), read);
        }
        // A partition the log no longer answers for (a topic deleted meanwhile): no lag.
        let Some(partition) = bounds[&tp] else { continue };
        let lag = lags.entry((key.topic, key.client_id)).or_default();
        *lag = lag.saturating_add(partition.lag(Some(committed)));
    }
    lags.into_iter().map(|((topic, client), lag)| (lag, topic, client)).collect()
}

/// The largest lag of one client per topic.
fn worst_per_topic<'a>(lags: impl Iterator<Item = &'a (u64, TopicName, ClientId)>) -> std::collections::BTreeMap<&'a TopicName, u64> {
    let mut worst = std::collections::BTreeMap::new();
    for (lag, topic, _) in lags {
        let kept: &mut u64 = worst.entry(topic).or_default();
        *kept = (*kept).max(*lag);
    }
    worst
}

/// Dead letters counted at one scrape, in all: a store holding more is counted this far (the
/// scrape stays short), the topics past it left at their last value.
const DEAD_LETTERS_COUNTED: usize = 100_000;

/// `ackgate_dead_letter_backlog{topic}`: the dead letters stored per topic, waiting for an
/// operator (redrive or delete). A topic whose last one went is set to 0, not dropped, so an
/// alert on it resolves at once.
async fn record_dead_letter_backlog(app: &AppState) {
    static SEEN: std::sync::Mutex<std::collections::BTreeSet<String>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let store = app.dispatcher.store.clone();
    // Up to 100 pages of RocksDB reads: off the async workers.
    let counted = tokio::task::spawn_blocking(move || {
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        let mut query = crate::core::dead_letters::DeadLetterQuery { topic: None, client_id: None, partition: None, offset: None, after: None, limit: 1000 };
        let mut read = 0;
        loop {
            let page = store.dead_letters(&query).ok()?;
            read += page.dead_letters.len();
            for dead in &page.dead_letters {
                *counts.entry(dead.topic.to_string()).or_default() += 1;
            }
            match page.next {
                Some(next) if read < DEAD_LETTERS_COUNTED => query.after = Some(next),
                Some(next) => {
                    // Pages go by topic: the topic at the cut has more than was counted.
                    counts.remove(next.key.topic.as_str());
                    return Some((counts, false));
                }
                None => return Some((counts, true)),
            }
        }
    })
    .await;
    let Ok(Some((counts, complete))) = counted else { return };
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if complete {
        for gone in seen.iter().filter(|topic| !counts.contains_key(*topic)) {
            metrics::gauge!(DEAD_LETTER_BACKLOG, "topic" => gone.clone()).set(0.0);
        }
        seen.retain(|topic| counts.contains_key(topic));
    }
    for (topic, count) in counts {
        metrics::gauge!(DEAD_LETTER_BACKLOG, "topic" => topic.clone()).set(count as f64);
        seen.insert(topic);
    }
}

/// Counts every request by route template (never the raw path: ids would explode the label set)
/// and status, and times it.
pub async fn count_requests(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(HTTP_DURATION, "route" => route.clone()).record(started.elapsed().as_secs_f64());
    metrics::counter!(HTTP_REQUESTS, "route" => route, "status" => status).increment(1);
    response
}
