//! Wiring: open the stores, align the pull layer, bind the listener (`Gateway::build`), then serve
//! until shutdown and drain (`Gateway::run`).

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::cluster::{Cluster, Instance};
use crate::config::{Config, Durability, OffsetStoreKind};
use crate::core::ack_floor::LiveClientsAckFloor;
use crate::core::alignment::align_pull_offsets_to_ack;
use crate::core::backend::LogBackend;
use crate::core::bounds_cache::BoundsCache;
use crate::core::clock::{Clock, SystemClock};
use crate::core::dispatcher::Dispatcher;
use crate::core::idempotency::IdempotentPublisher;
use crate::core::offset_retention::{live_touch_period_ms, sweep_expired_offsets, touch_client_offsets};
use crate::core::offset_writer::OffsetWriter;
use crate::core::offsets::OffsetStore;
use crate::http::connections::{connection_capacity, raise_descriptor_limit, serve, ConnectionLimits};
use crate::http::exposure::Exposure;
use crate::http::lingering::Linger;
use crate::http::reload::{reload_and_log, ConfigReload};
use crate::http::tls::Tls;
use crate::http::{router, AppState};
use crate::reload::{delivery_settings, ConfigFile, Reloader};
use crate::store::memory::MemoryOffsetStore;
use crate::store::rocks::RocksOffsetStore;

/// How old the bounds `GET /topics` lists may be: anyone may ask for them, and each is a round
/// trip to the log (issue 40, item 5).
const LISTED_BOUNDS_MAX_AGE: Duration = Duration::from_secs(1);

/// Capacity of the offset writer's queue (requests, each one or more writes).
const WRITE_QUEUE: usize = 65_536;

/// A gateway whose stores are open and whose listener is bound, ready to `run`.
pub struct Gateway {
    listener: TcpListener,
    /// `Some` when `server.tls_cert` / `tls_key` are set: the listener speaks only TLS.
    tls: Option<Arc<Tls>>,
    app: AppState,
    backend: Backend,
    writer_thread: std::thread::JoinHandle<()>,
    reloader: Arc<Reloader>,
    /// Set when `telemetry.otlp_endpoint` is: flushed at shutdown.
    tracer: Option<Arc<crate::telemetry::OtlpTracer>>,
}

/// What outside code (tests, signal handlers) may do with a running gateway.
#[derive(Clone)]
pub struct GatewayHandle {
    pub local_addr: SocketAddr,
    pub dispatcher: Arc<Dispatcher>,
    retention_ms: u64,
    dead_letter_retention_ms: u64,
}

impl GatewayHandle {
    /// Starts a graceful shutdown.
    pub fn shutdown(&self) {
        self.dispatcher.shutdown.cancel();
    }

    /// Runs the offset retention sweep now; returns how many offsets expired.
    pub fn sweep_offsets_now(&self) -> anyhow::Result<usize> {
        sweep_offsets(&self.dispatcher, self.retention_ms)
    }

    /// Runs the dead-letter retention now; returns how many dead letters expired.
    pub fn sweep_dead_letters_now(&self) -> anyhow::Result<usize> {
        sweep_dead_letters(&self.dispatcher, self.dead_letter_retention_ms)
    }
}

/// Removed records past which a sweep compacts the store (a restart would otherwise scan their
/// tombstones).
const COMPACT_AFTER_REMOVED: usize = 10_000;

fn sweep_offsets(d: &Dispatcher, retention_ms: u64) -> anyhow::Result<usize> {
    let removed = sweep_expired_offsets(d.store.as_ref(), d.clock.now_ms(), retention_ms, |c| d.is_live(c))?;
    if removed > 0 {
        tracing::info!(removed, "expired offsets of absent clients");
    }
    if removed >= COMPACT_AFTER_REMOVED {
        d.store.compact()?;
    }
    Ok(removed)
}

/// Removes dead letters older than `retention_ms` (0: keeps them).
fn sweep_dead_letters(d: &Dispatcher, retention_ms: u64) -> anyhow::Result<usize> {
    if retention_ms == 0 {
        return Ok(0);
    }
    let before = d.clock.now_ms().saturating_sub(retention_ms);
    let removed = d.store.remove_dead_letters_before(before)?;
    if removed > 0 {
        tracing::info!(removed, "expired dead letters");
    }
    // Gaps are kept as long as dead letters.
    let gaps = d.store.remove_gaps(None, before)?;
    if gaps > 0 {
        tracing::info!(removed = gaps, "expired gaps");
    }
    Ok(removed)
}

/// How long past the drain window a draining shutdown waits for the last sessions to finish
/// closing before it closes whatever is left with 1001.
const DRAIN_SLACK: Duration = Duration::from_secs(2);

/// How often `Gateway::run` looks whether the data dir still takes writes.
const WRITE_FAILURE_CHECK: Duration = Duration::from_millis(250);

/// Returns when no session runs any more, after `at_most`, or on `cancel`.
async fn wait_for_sessions_to_end(d: &Dispatcher, at_most: Duration, cancel: &CancellationToken) {
    let deadline = tokio::time::Instant::now() + at_most;
    while !d.sessions().is_empty() && tokio::time::Instant::now() < deadline && !cancel.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Forgets the idempotency keys whose window has ended.
fn sweep_publishes(d: &Dispatcher) -> anyhow::Result<usize> {
    let forgotten = d.store.forget_publishes_expired_at(d.clock.now_ms())?;
    if forgotten > 0 {
        tracing::info!(forgotten, "expired idempotency keys");
    }
    Ok(forgotten)
}

/// How long a connection's sent data may stay unacknowledged before the kernel drops it: the
/// dead-peer bound (`server.ws_pong_timeout_ms`), but never below the slow-client bound, since a
/// receive window that stays closed counts too and a slow reader is `slow_client_timeout_ms`'s
/// to end (with 4003). Without a slow-client bound (0 = never), none: the kernel's own limit.
fn unacknowledged_timeout(config: &Config) -> Option<Duration> {
    match config.delivery.slow_client_timeout_ms {
        0 => None,
        slow => Some(Duration::from_millis(slow.max(config.server.ws_pong_timeout_ms))),
    }
}

/// An `http://` URL whose host is not a loopback name or address.
fn is_plain_remote(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else { return false };
    let authority = rest.split('/').next().unwrap_or("");
    let host = authority.rsplit_once(':').filter(|(_, port)| port.parse::<u16>().is_ok()).map_or(authority, |(host, _)| host);
    !is_loopback_name(host.trim_start_matches('[').trim_end_matches(']'))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

fn open_store(config: &Config, data_dir: &Path) -> anyhow::Result<Arc<dyn OffsetStore>> {
    Ok(match config.offsets.store {
        OffsetStoreKind::Memory => Arc::new(MemoryOffsetStore::new()),
        OffsetStoreKind::RocksDb => Arc::new(
            RocksOffsetStore::open(data_dir, config.storage.durability == Durability::Power)
                .with_context(|| format!("opening the offset store in {}", data_dir.display()))?,
        ),
    })
}

/// What a start reads of the files a config names before it writes anything, and what
/// `ackgate check` reads without starting: the data dir's format (when it has one) and the TLS
/// certificate and key. A file that `ackgate check` passes can still stop a start only on what
/// needs the running system: a port taken, a broker away, a store that does not open.
pub fn check_start(config: &Config) -> anyhow::Result<Option<Arc<Tls>>> {
    let data_dir = &config.storage.data_dir;
    if data_dir.exists() {
        anyhow::ensure!(data_dir.is_dir(), "storage.data_dir {} is not a directory", data_dir.display());
        crate::data_format::check(data_dir)?;
    }
    Ok(match config.server.tls_cert.as_str() {
        "" => None,
        cert => Some(Arc::new(Tls::load(Path::new(cert), Path::new(&config.server.tls_key))?)),
    })
}

impl Gateway {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        Self::build_with_clock(config, Arc::new(SystemClock)).await
    }

    /// `build` with an injected clock (tests move time with `ManualClock`).
    pub async fn build_with_clock(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        Self::build_with_store(config, clock, None).await
    }

    /// `build_with_clock` with an offset store opened by the caller (tests wrap the real RocksDB
    /// store to hold or fail its writes); `None` opens the one the config names.
    pub async fn build_with_store(config: Config, clock: Arc<dyn Clock>, store: Option<Arc<dyn OffsetStore>>) -> anyhow::Result<Self> {
        // Read before anything is written: a bad certificate stops the start with the file named.
        let tls = check_start(&config)?;
        let data_dir = config.storage.data_dir.clone();
        crate::durable_files::create_dir_all(&data_dir).with_context(|| format!("creating data_dir {}", data_dir.display()))?;
        crate::data_format::check_or_write(&data_dir)?;
        // The resume tokens' key: the cluster's, else this data dir's own (made once, kept).
        let resume_token_key = match config.cluster.token_key.as_str() {
            "" => crate::resume_token_key::load_or_create(&data_dir)?,
            key => crate::core::resume_token::TokenKey::new(key.as_bytes()),
        };
        let store = match store {
            Some(store) => store,
            None => open_store(&config, &data_dir)?,
        };
        // Before the dispatcher registers its metric handles.
        crate::http::metrics::install_recorder();
        let opened = Backend::open(&config, &data_dir, clock.clone()).await?;
        let backend: Arc<dyn LogBackend> = opened.log();
        let delivery = delivery_settings(&config);
        crate::core::topic_removal::finish_pending_removals(backend.as_ref(), store.as_ref())
            .await
            .map_err(|e| anyhow::anyhow!("finishing a topic removal cut short: {e}"))?;
        let started = std::time::Instant::now();
        let report = align_pull_offsets_to_ack(backend.as_ref(), store.as_ref(), delivery.reset_policy, clock.now_ms())
            .await
            .map_err(|e| anyhow::anyhow!("aligning pull offsets: {e}"))?;
        tracing::info!(
            partitions = report.partitions,
            aligned = report.aligned,
            by_policy = report.by_policy,
            lowered_to_log_end = report.lowered,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pull offsets aligned to committed offsets"
        );
        // With an fsync per write a store write can take milliseconds: never on a session task.
        let inline_when_idle = config.storage.durability == Durability::Crash;
        let (writer, writer_thread) =
            OffsetWriter::start(store.clone(), backend.clone(), WRITE_QUEUE, inline_when_idle, Duration::from_millis(config.offsets.plain_ack_linger_ms));
        let listener = TcpListener::bind(&config.server.listen).await.with_context(|| format!("binding {}", config.server.listen))?;
        // Before anything slow: a connection accepted before the options are set would go without.
        crate::http::connections::configure_listener(&listener, unacknowledged_timeout(&config));
        let local_addr = listener.local_addr()?;
        let instance = match config.server.instance_id.as_str() {
            "" => format!("{}:{}", host_name(), local_addr.port()),
            id => id.to_string(),
        };
        let dispatcher = Arc::new(Dispatcher::new(delivery, instance, backend, store, writer, clock, CancellationToken::new()));
        let _ = dispatcher.token_key.set(resume_token_key);
        if dispatcher.backend.acknowledges_at_broker() {
            let readers: std::sync::Weak<dyn crate::core::ack_floor::LiveReaders> = Arc::downgrade(&dispatcher) as std::sync::Weak<Dispatcher>;
            let floor = Arc::new(LiveClientsAckFloor::new(readers));
            dispatcher.backend.set_ack_floor(floor.clone());
            let _ = dispatcher.ack_floor.set(floor);
        }
        let token_keys = Arc::new(crate::http::auth::TokenKeys::new(&config.auth));
        let plain_jwks_host =
            config.auth.jwks_url.strip_prefix("http://").and_then(|rest| rest.split('/').next()).and_then(crate::config::origin::split_host_port);
        if plain_jwks_host.is_some_and(|(host, _)| !is_loopback_name(&host)) {
            tracing::warn!(url = %config.auth.jwks_url, "auth.jwks_url is plain http off this machine: anyone on the way can replace the keys and forge tokens; use https");
        }
        if token_keys.uses_jwks() {
            // Tokens of the identity provider are refused until its keys are here; the start
            // does not wait longer than one fetch, and the refresh task tries again.
            match token_keys.fetch().await {
                Ok(keys) => tracing::info!(url = %config.auth.jwks_url, keys, "JWKS fetched"),
                Err(e) => tracing::error!(error = %e, "fetching the JWKS failed; its tokens are refused until a fetch succeeds"),
            }
        }
        if config.auth.checks_tokens() {
            let _ = dispatcher.token_check.set(Arc::new(crate::http::auth::JwtCheck(config.auth.clone(), token_keys.clone())));
        }
        let public_url = match config.server.public_url.as_str() {
            "" if tls.is_some() => format!("https://{local_addr}"),
            "" => format!("http://{local_addr}"),
            url => url.trim_end_matches('/').to_string(),
        };
        let this = Instance { instance: dispatcher.instance.clone(), http_url: public_url };
        let cluster = Arc::new(Cluster::new(this, &config.cluster.peers, &config.cluster.ca_file, Duration::from_millis(config.cluster.group_move_after_ms)));
        if cluster.has_peers() {
            let draining = dispatcher.draining.clone();
            let home = crate::cluster::ClusterGroupHome {
                cluster: cluster.clone(),
                available: Box::new(move || !draining.is_cancelled()),
                admin_token: config.auth.admin_token.clone(),
            };
            let _ = dispatcher.group_home.set(Arc::new(home));
            let records = crate::cluster::ClusterPeerOffsets { cluster: cluster.clone(), admin_token: config.auth.admin_token.clone() };
            let _ = dispatcher.peer_offsets.set(Arc::new(records));
        }
        let tracer = crate::telemetry::OtlpTracer::start(&config.telemetry, &dispatcher.instance)?;
        if let Some(tracer) = &tracer {
            let _ = dispatcher.tracer.set(tracer.clone());
        }
        if !config.server.listens_on_loopback() && (config.auth.admin_token.is_empty() || !config.auth.checks_tokens()) {
            // Only reachable with auth.allow_anonymous = true (validate refuses it otherwise).
            tracing::warn!(
                listen = %config.server.listen,
                admin_token = !config.auth.admin_token.is_empty(),
                tokens = config.auth.checks_tokens(),
                "serving off loopback without full auth (auth.allow_anonymous = true): anyone who can reach this address can act as any client"
            );
        }
        let public_host = crate::config::origin::parse_origin(&config.server.public_url).map(|o| o.host);
        if config.server.listens_on_loopback() && config.server.trusted_proxies.is_empty() && public_host.as_deref().is_some_and(|h| !is_loopback_name(h)) {
            // Only a proxy on this host can reach a loopback listener for a public name: every
            // client then has the proxy's address.
            tracing::warn!(
                listen = %config.server.listen,
                public_url = %config.server.public_url,
                "listening on loopback behind a proxy (public_url names another host) without server.trusted_proxies: per-IP limits, logs and /admin/sessions see the proxy's address, not the clients' (docs/deployment.md)"
            );
        }
        if !config.cluster.peers.is_empty() && config.server.public_url.is_empty() {
            // Rendezvous hashing ranks instances by their URL strings: a default public_url
            // (`http://<listen>`, e.g. 0.0.0.0) differs from how peers name this instance, so the
            // instances disagree on where each client belongs.
            tracing::warn!(default = %format!("http://{local_addr}"), "cluster.peers is set but server.public_url is not: set it to the URL the peers list for this instance");
        }
        let plain_peers: Vec<&String> = config.cluster.peers.iter().filter(|p| is_plain_remote(p)).collect();
        if !config.auth.admin_token.is_empty() && !plain_peers.is_empty() {
            // The admin lists with scope=cluster and a subscribe without a token ask the peers
            // with the admin token.
            tracing::warn!(peers = ?plain_peers, "cluster.peers names http:// peers off loopback: the admin token goes to them in the clear (cluster-scoped admin lists, a client's records); use https:// peers (cluster.ca_file) or a private network");
        }
        let exposure = Arc::new(crate::core::live::Live::new(Exposure::from_config(&config)));
        let publisher = Arc::new(IdempotentPublisher::new(
            dispatcher.store.clone(),
            dispatcher.clock.clone(),
            config.publish.idempotency_window_secs,
            config.publish.idempotency_max_keys,
            config.publish.idempotency_max_keys_per_publisher,
        ));
        let _ = dispatcher.publisher.set(publisher.clone());
        let reloader = Arc::new(Reloader::new(config.clone(), &dispatcher, exposure.clone(), token_keys.clone()));
        let app = AppState {
            dispatcher,
            config: Arc::new(config),
            cluster,
            connections: Default::default(),
            exposure,
            publisher,
            sse: Default::default(),
            listed_bounds: Arc::new(BoundsCache::new(LISTED_BOUNDS_MAX_AGE)),
            token_keys,
            reload: reloader.clone(),
            tls: tls.clone(),
        };
        Ok(Self { listener, tls, app, backend: opened, writer_thread, reloader, tracer })
    }

    /// SIGHUP and `POST /admin/reload` read the configuration again from `file` (without it they
    /// refuse: a gateway built in process has no file).
    pub fn reload_from(self, file: ConfigFile) -> Self {
        self.reloader.read_from(file);
        self
    }

    pub fn handle(&self) -> GatewayHandle {
        GatewayHandle {
            local_addr: self.listener.local_addr().expect("a bound listener has an address"),
            dispatcher: self.app.dispatcher.clone(),
            retention_ms: self.app.config.offsets.retention_secs.saturating_mul(1000),
            dead_letter_retention_ms: self.app.config.dead_letters.retention_secs.saturating_mul(1000),
        }
    }

    /// Serves until `shutdown` resolves (or `GatewayHandle::shutdown`), then closes sessions
    /// with 1001, drains offset writes, checkpoints the pull cursors and closes the stores.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Gateway { listener, tls, app, backend, writer_thread, reloader: _, tracer } = self;
        let cancel = app.dispatcher.shutdown.clone();
        let config = app.config.clone();
        let local_addr = listener.local_addr()?;
        spawn_background(&app, &backend);
        let linger = Linger { grace: Duration::from_millis(config.limits.close_drain_ms), max_bytes: config.limits.close_drain_bytes };
        let descriptors = raise_descriptor_limit();
        let limits = ConnectionLimits {
            max_connections: connection_capacity(config.limits.max_connections, descriptors),
            max_per_ip: config.limits.max_connections_per_ip,
            header_read_timeout: Duration::from_millis(config.server.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(config.server.body_read_timeout_ms),
            idle_timeout: Duration::from_millis(config.server.idle_timeout_ms),
            tls_handshake_timeout: Duration::from_millis(config.server.tls_handshake_timeout_ms),
            linger,
            trusted_proxies: Arc::new(crate::http::forwarded::TrustedProxies::new(&config.server.trusted_proxies)),
        };
        tracing::info!(
            max_connections = limits.max_connections,
            configured = config.limits.max_connections,
            open_files_limit = descriptors,
            max_connections_per_ip = limits.max_per_ip,
            "connection capacity"
        );
        reload_on_sighup(tls.clone(), app.reload.clone(), cancel.clone())?;
        let server = tokio::spawn(serve(listener, tls.clone(), router(app.clone()), limits, app.connections.clone(), cancel.clone()));
        tracing::info!(%local_addr, instance = %app.dispatcher.instance, tls = tls.is_some(), "ackgate listening");
        let drain = Duration::from_millis(config.server.drain_ms);
        let mut stopped_writes = None;
        tokio::select! {
            reason = writes_stopped(&app.dispatcher) => {
                tracing::error!(error = %reason, "the data dir takes no more writes (a full disk, a failing device): ackgate stops, so that its supervisor starts it again once it can write; everything answered is on disk");
                stopped_writes = Some(reason);
            }
            _ = shutdown => {
                // SIGTERM: drain first (sessions closed with 1012 over the window), unless an
                // operator's drain already runs; then what is left closes with 1001.
                if !drain.is_zero() {
                    crate::core::drain::start_drain(&app.dispatcher, drain);
                    let settle = Duration::from_millis(config.server.drain_settle_ms);
                    wait_for_sessions_to_end(&app.dispatcher, drain + settle + DRAIN_SLACK, &cancel).await;
                }
            }
            _ = cancel.cancelled() => {}
        }
        tracing::info!(sessions_left = app.dispatcher.sessions().len(), "shutting down: closing sessions with 1001");
        cancel.cancel();
        let grace = Duration::from_millis(config.server.shutdown_grace_ms);
        let tasks = app.dispatcher.tasks.clone();
        tasks.close();
        if tokio::time::timeout(grace, tasks.wait()).await.is_err() {
            tracing::warn!(?grace, "sessions did not finish within the shutdown grace period");
        }
        if tokio::time::timeout(grace, server).await.is_err() {
            tracing::warn!("HTTP connections did not close within the shutdown grace period");
        }
        // Everything queued before this barrier is durable once it returns.
        if let Err(e) = app.dispatcher.writer.barrier().await {
            tracing::error!(error = %e, "draining offset writes failed");
        }
        // The broker ACKs the last acks allow (RocketMQ POP): left unsent, the broker would
        // revive those events, and nothing after a restart could map them back.
        app.dispatcher.backend.settle_before_exit().await;
        let writes = &app.dispatcher.writer.stats;
        tracing::info!(
            advanced = writes.advanced.load(Ordering::Relaxed),
            stale = writes.stale.load(Ordering::Relaxed),
            failed_batches = writes.failed_batches.load(Ordering::Relaxed),
            broker_acks = writes.broker_acks.load(Ordering::Relaxed),
            "offset writes since start"
        );
        if let Err(e) = app.dispatcher.backend.checkpoint() {
            tracing::error!(error = %e, "final pull checkpoint failed");
        }
        if let Some(Err(e)) = backend.embedded().map(|log| log.flush()) {
            tracing::error!(error = %e, "flushing the embedded log failed");
        }
        // Dropping the last dispatcher closes the writer queue; the thread flushes and exits,
        // releasing the stores (so the same data_dir can be opened again in this process).
        let last = Arc::strong_count(&app.dispatcher) == 1;
        drop(app);
        drop(backend);
        if last {
            let _ = tokio::task::spawn_blocking(move || writer_thread.join()).await;
        }
        if let Some(tracer) = tracer {
            // The spans of the last acks, exported within the grace period or dropped.
            let flushed = tokio::task::spawn_blocking(move || tracer.shutdown(grace));
            if tokio::time::timeout(grace, flushed).await.is_err() {
                tracing::warn!("the last spans were not exported within the shutdown grace period");
            }
        }
        tracing::info!("ackgate stopped");
        match stopped_writes {
            Some(reason) => Err(anyhow::anyhow!("the data dir took no more writes: {reason}")),
            None => Ok(()),
        }
    }
}

/// Resolves with the reason once the offset store or the embedded log takes no more writes
/// (`write_failure`): RocksDB stays so until it is opened again.
async fn writes_stopped(dispatcher: &Dispatcher) -> String {
    let mut check = tokio::time::interval(WRITE_FAILURE_CHECK);
    loop {
        check.tick().await;
        if let Some(reason) = dispatcher.store.write_failure().or_else(|| dispatcher.backend.write_failure()) {
            return reason;
        }
    }
}

/// Pull checkpoint, metrics upkeep, peer probes, offset retention sweep and log retention, each
/// until shutdown.
/// SIGHUP reads the configuration again (`crate::reload`: what may change live is applied, the
/// rest refused and logged) and the TLS certificate and key (rotation without a restart; sessions
/// and other open connections keep the certificate they were opened with). A failure of either
/// is logged and changes nothing: a stray `kill -HUP` (log rotation scripts send it) must never
/// stop a gateway.
fn reload_on_sighup(tls: Option<Arc<Tls>>, reload: Arc<dyn ConfigReload>, cancel: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = hangup.recv() => {}
                _ = cancel.cancelled() => return,
            }
            let reload = reload.clone();
            let _ = tokio::task::spawn_blocking(move || reload_and_log(reload.as_ref(), "SIGHUP")).await;
            match tls.as_ref().map(|tls| tls.reload()) {
                None => {}
                Some(Ok(())) => tracing::info!("SIGHUP: TLS certificate and key reloaded; new connections use them"),
                Some(Err(e)) => {
                    crate::core::metrics::config_reloads(false).increment(1);
                    tracing::error!(
                        error = format!("{e:#}"),
                        "SIGHUP: TLS reload failed; the previous certificate stays in use, and a restart with these files would stop"
                    )
                }
            }
        }
    });
    Ok(())
}

fn spawn_background(app: &AppState, backend: &Backend) {
    let config = &app.config;
    let cancel = app.dispatcher.shutdown.clone();
    let every = |ms: u64| {
        let mut interval = tokio::time::interval(Duration::from_millis(ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    };

    // Partitions added to a topic reach its live subscriptions: on Kafka at each metadata
    // refresh, on the embedded log (counts in memory) every second, on RocketMQ at each route
    // refresh (which also refuses a route that would renumber partitions).
    let watch_every = match backend {
        Backend::Kafka(_) => Some(config.kafka.metadata_refresh_ms),
        Backend::Embedded(_) => Some(1000),
        Backend::RocketMq(_) => Some(config.rocketmq.route_refresh_ms),
    };
    if let Some(ms) = watch_every {
        let watching = crate::core::partition_watch::watch_partition_counts(app.dispatcher.clone(), Duration::from_millis(ms), cancel.clone());
        app.dispatcher.tasks.spawn(watching);
    }

    if app.token_keys.uses_jwks() {
        // Keys rotate at the identity provider: the set is fetched again on a period (and by
        // `TokenKeys::prepare` when a token names a key it lacks).
        let (keys, stop, mut tick) = (app.token_keys.clone(), cancel.clone(), every(config.auth.jwks_refresh_secs.saturating_mul(1000)));
        tick.reset(); // the first tick is now, and the start fetched already
        app.dispatcher.tasks.spawn(async move {
            loop {
                tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
                match keys.fetch().await {
                    Ok(count) => tracing::debug!(keys = count, "JWKS fetched again"),
                    Err(e) => tracing::warn!(error = %e, "fetching the JWKS again failed; the keys fetched before stay in use"),
                }
            }
        });
    }

    // Sessions wait on their own doorbells, not on the shutdown token: ring them all when it fires.
    let (d, stop) = (app.dispatcher.clone(), cancel.clone());
    app.dispatcher.tasks.spawn(async move {
        stop.cancelled().await;
        d.ring_every_session();
    });

    let (d, stop, mut tick) = (app.dispatcher.clone(), cancel.clone(), every(config.offsets.checkpoint_interval_ms));
    app.dispatcher.tasks.spawn(async move {
        loop {
            tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
            // It fsyncs a file and its directory: off the async workers.
            let checkpointing = d.clone();
            match tokio::task::spawn_blocking(move || checkpointing.backend.checkpoint()).await {
                Ok(Err(e)) => tracing::error!(error = %e, "pull checkpoint failed"),
                Err(e) => tracing::error!(error = %e, "pull checkpoint panicked"),
                Ok(Ok(())) => {}
            }
        }
    });

    let (stop, mut tick) = (cancel.clone(), every(crate::http::metrics::UPKEEP_EVERY.as_millis() as u64));
    app.dispatcher.tasks.spawn(async move {
        loop {
            tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
            crate::http::metrics::upkeep();
        }
    });

    if app.cluster.has_peers() {
        let period = Duration::from_millis(config.cluster.probe_interval_ms);
        let (cluster, stop, mut tick) = (app.cluster.clone(), cancel.clone(), every(config.cluster.probe_interval_ms));
        app.dispatcher.tasks.spawn(async move {
            loop {
                tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
                cluster.probe_peers(period).await;
            }
        });
    }

    let retention_ms = config.offsets.retention_secs.saturating_mul(1000);
    let dead_letter_retention_ms = config.dead_letters.retention_secs.saturating_mul(1000);
    let (d, stop, mut tick) = (app.dispatcher.clone(), cancel.clone(), every(config.offsets.sweep_interval_ms));
    app.dispatcher.tasks.spawn(async move {
        loop {
            // The first tick fires at once: a sweep right after start must find nothing to expire
            // that a client still owns (the KAFKA-8069 regression).
            tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
            // A sweep reads every record (and may compact): keep it off the async workers.
            let sweeping = d.clone();
            let swept = move || {
                sweep_offsets(&sweeping, retention_ms)?;
                sweep_dead_letters(&sweeping, dead_letter_retention_ms)?;
                sweep_publishes(&sweeping)
            };
            match tokio::task::spawn_blocking(swept).await {
                Ok(Err(e)) => tracing::error!(error = %e, "offset retention sweep failed"),
                Err(e) => tracing::error!(error = %e, "offset retention sweep panicked"),
                Ok(Ok(_)) => {}
            }
        }
    });

    // Live clients' offsets are marked as seen while they are live, not only when they leave:
    // after a crash (no clean session end) the boot sweep must not expire them.
    if let Some(period) = live_touch_period_ms(retention_ms) {
        let (d, stop, mut tick) = (app.dispatcher.clone(), cancel.clone(), every(period));
        app.dispatcher.tasks.spawn(async move {
            loop {
                tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
                let clients = d.live_clients();
                if clients.is_empty() {
                    continue;
                }
                let (store, now) = (d.store.clone(), d.clock.now_ms());
                match tokio::task::spawn_blocking(move || touch_client_offsets(store.as_ref(), &clients, now)).await {
                    Ok(Err(e)) => tracing::error!(error = %e, "refreshing live clients' offset times failed"),
                    Err(e) => tracing::error!(error = %e, "refreshing live clients' offset times panicked"),
                    // Durable with the offset writer's next fsync (a touch makes none of its own).
                    Ok(Ok(touched)) if touched > 0 => {
                        if let Err(e) = d.writer.make_written_durable().await {
                            tracing::error!(error = %e, "refreshing live clients' offset times: not made durable");
                        }
                    }
                    Ok(Ok(_)) => {}
                }
            }
        });
    }

    // Kafka enforces its own retention.
    let Some(embedded) = backend.embedded() else { return };
    let (log, stop, mut tick) = (embedded.clone(), cancel, every(config.embedded.retention_check_interval_ms));
    app.dispatcher.tasks.spawn(async move {
        loop {
            tokio::select! { _ = stop.cancelled() => return, _ = tick.tick() => {} }
            let trimming = log.clone();
            match tokio::task::spawn_blocking(move || trimming.enforce_retention()).await {
                Ok(Ok(0)) => {}
                Ok(Ok(removed)) => tracing::info!(removed, "log retention deleted old events"),
                Ok(Err(e)) => tracing::error!(error = %e, "log retention failed"),
                Err(e) => tracing::error!(error = %e, "log retention panicked"),
            }
        }
    });
}

/// A host name that means this machine: `localhost`, a loopback address.
fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}
