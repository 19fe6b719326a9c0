//! The accept loop and the life of each connection, before any request is routed: connection
//! caps (in all and per IP), TCP keepalive, the TLS handshake, the header-read and idle timers,
//! and graceful shutdown. It replaces `axum::serve`, which has no header-read timer and no cap:
//! a few thousand sockets that connect and say nothing (slowloris) would otherwise hold every
//! descriptor before any auth check runs.
//!
//! Timers, per connection (a watchdog beside hyper's connection future):
//! - from accept (or the end of the TLS handshake) until a whole request head has arrived:
//!   `server.header_read_timeout_ms`;
//! - between requests of a keep-alive connection: `server.idle_timeout_ms`, but once bytes of
//!   the next request arrive, that head too must be whole within the header-read timeout;
//! - while a request's body is being read: `server.body_read_timeout_ms` from its head (a peer
//!   that announces 16 MB and trickles them would hold its slot for ever otherwise);
//! - while a request is being handled, none (a publish may take as long as the backend does).
//!
//! An upgraded connection (a WebSocket) leaves this module: its session has its own keepalive.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::activity::{Activity, HasActivity};
pub use super::connection_counts::{ConnectionCounts, ConnectionSlot, Refusal};
use super::forwarded::TrustedProxies;
use super::lingering::{Linger, LingeringStream, PeerAddr};
use super::tls::Tls;
use crate::core::log_throttle::Throttled;
use crate::core::metrics::connections_refused;

/// What bounds connections before any request is read.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Open connections (sessions included); beyond it a new one gets 503 and is closed.
    pub max_connections: usize,
    /// Open connections from one IP address; 0 = no limit. Beyond it 429.
    pub max_per_ip: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub linger: Linger,
    /// `server.trusted_proxies`: a connection from one of them is counted per IP by the client
    /// each request names, not by the proxy's address.
    pub trusted_proxies: Arc<TrustedProxies>,
}

/// Descriptors kept for everything but client connections (RocksDB's files, the backend's
/// sockets, refusals being written): this many, or a quarter of a smaller limit.
const RESERVED_DESCRIPTORS: u64 = 512;
/// Refusals (503, 429) being written at once; beyond it a connection is simply closed.
const MAX_REFUSING: usize = 1024;
/// A refusal that cannot be written within this is abandoned.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Raises the soft open-files limit to the hard one and returns the hard limit (what the
/// process may open), or `None` when it cannot be read.
pub fn raise_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    Some(limit.rlim_cur)
}

/// `limits.max_connections`, lowered to what the descriptor limit allows (with a reserve for
/// the stores and the backend), so that the cap, not `EMFILE`, is what a flood meets.
pub fn connection_capacity(configured: usize, descriptors: Option<u64>) -> usize {
    match descriptors {
        Some(n) => configured.min(n.saturating_sub(RESERVED_DESCRIPTORS.min(n / 4)).max(1) as usize),
        None => configured,
    }
}

/// Counts open connections, in all and per IP. A slot is released when its connection's socket
/// is finally closed (after lingering), since until then it holds a descriptor.
/// Serves `router` on `listener` until `stop` is cancelled, then lets every connection finish
/// its request in flight (graceful shutdown) and returns once all have closed.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    router: Router,
    limits: ConnectionLimits,
    counts: Arc<ConnectionCounts>,
    stop: CancellationToken,
) {
    let connections = TaskTracker::new();
    let (refused_log, accept_log) = (Throttled::new(), Throttled::new());
    let mut backoff = Duration::from_millis(5);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.cancelled() => break,
        };
        let (tcp, remote) = match accepted {
            Ok(accepted) => {
                backoff = Duration::from_millis(5);
                accepted
            }
            // A connection that died before it was accepted concerns nobody else.
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused) => continue,
            Err(e) => {
                // Out of descriptors (the cap should prevent it): a short pause, growing to at
                // most 100 ms, instead of spinning. Sessions run in their own tasks meanwhile.
                if let Some(suppressed) = accept_log.allow() {
                    tracing::error!(error = %e, suppressed, open = counts.open(), "accepting a connection failed");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
                continue;
            }
        };
        // A proxy's connections carry many clients: each is counted per IP as its requests name it.
        let max_per_ip = if limits.trusted_proxies.trusts(remote.ip()) { 0 } else { limits.max_per_ip };
        let slot = match counts.admit(remote.ip(), limits.max_connections, max_per_ip) {
            Ok(slot) => slot,
            Err(refusal) => {
                connections_refused(refusal.label()).increment(1);
                if let Some(suppressed) = refused_log.allow() {
                    tracing::warn!(%remote, reason = refusal.label(), open = counts.open(), suppressed, "connection refused");
                }
                refuse(tcp, refusal, &counts);
                continue;
            }
        };
        let stream = LingeringStream::new(tcp, limits.linger, Some(slot));
        let (router, tls, limits, stop, counts) = (router.clone(), tls.clone(), limits.clone(), stop.clone(), counts.clone());
        connections.spawn(async move {
            match tls {
                None => serve_connection(stream, remote, router, &limits, counts, stop).await,
                Some(tls) => {
                    if let Some(stream) = tls.handshake(stream, limits.tls_handshake_timeout).await {
                        serve_connection(stream, remote, router, &limits, counts, stop).await
                    }
                }
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Answers a refused connection with its status and closes it, without reading its request.
fn refuse(mut tcp: TcpStream, refusal: Refusal, counts: &Arc<ConnectionCounts>) {
    if counts.refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
        counts.refusing.fetch_sub(1, Ordering::Relaxed);
        return; // dropped: closed at once
    }
    let counts = counts.clone();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, tcp.write_all(&refusal.response())).await;
        let _ = tcp.shutdown().await;
        // A short read so the client's request does not turn our close into a reset.
        let mut buf = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_millis(100), tokio::io::AsyncReadExt::read(&mut tcp, &mut buf)).await;
        counts.refusing.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Small frames without Nagle's 40 ms wait; keepalive probes find idle peers that vanished
/// without a FIN (a laptop closed, a NAT that forgot the flow). Probes are sent only while
/// nothing is unacknowledged, and a Server-Sent Events stream writes a keepalive comment every
/// few seconds into a socket whose peer is gone: without a user timeout the kernel retransmits
/// for about 15 minutes, a session held as live all that while. With one, the user timeout also
/// decides when unanswered keepalive probes end an idle connection (WebSockets are pinged and
/// find a dead peer within `server.ws_pong_timeout_ms` anyway).
///
/// Set once on the listening socket, right after it is bound (`Gateway::build`, before anything
/// slow): Linux copies all of them to each socket it accepts from then on (the test below checks
/// that), which saves six system calls per connection in a reconnect storm.
/// `unacknowledged_timeout`: sent data unacknowledged this long (a peer gone without a FIN) makes
/// the kernel drop the connection (TCP_USER_TIMEOUT); `None`: the kernel's limit (~15 minutes).
pub fn configure_listener(listener: &TcpListener, unacknowledged_timeout: Option<Duration>) {
    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60)).with_interval(Duration::from_secs(10)).with_retries(6);
    let socket = socket2::SockRef::from(listener);
    let set = [
        ("TCP_NODELAY", socket.set_tcp_nodelay(true)),
        ("TCP keepalive", socket.set_tcp_keepalive(&keepalive)),
        ("TCP_USER_TIMEOUT", unacknowledged_timeout.map_or(Ok(()), |timeout| socket.set_tcp_user_timeout(Some(timeout)))),
    ];
    for (option, result) in set {
        if let Err(e) = result {
            tracing::warn!(option, error = %e, "a socket option could not be set on the listener; accepted connections go without it");
        }
    }
}

/// What `route` needs of the connection beyond the request.
#[derive(Clone)]
struct Routing {
    router: Router,
    activity: Arc<Activity>,
    remote: SocketAddr,
    body_read_timeout: Duration,
    trusted_proxies: Arc<TrustedProxies>,
    counts: Arc<ConnectionCounts>,
    max_per_ip: usize,
}

/// The client of a request from a trusted proxy (`http::forwarded`) and its per-IP slot, held
/// while the request is answered (an upgraded WebSocket's for the connection's life); `Err` with
/// why when its address has no slot left.
fn forwarded_client(routing: &Routing, request: &mut hyper::Request<Incoming>) -> Result<(SocketAddr, Option<ConnectionSlot>), Refusal> {
    let Some(forwarded) = routing.trusted_proxies.forwarded(routing.remote.ip(), request.headers()) else {
        return Ok((routing.remote, None));
    };
    let client = SocketAddr::new(forwarded.client, 0);
    request.extensions_mut().insert(forwarded);
    if routing.max_per_ip == 0 {
        return Ok((client, None));
    }
    let slot = routing.counts.admit_forwarded(client.ip(), routing.max_per_ip)?;
    Ok((client, Some(slot)))
}

/// Hands the request to the router with the client's address, counting it for the watchdog; a
/// body is timed from here until it has been read to its end (or dropped unread).
async fn route(routing: Routing, mut request: hyper::Request<Incoming>) -> Result<axum::response::Response, Infallible> {
    use hyper::body::Body as _;
    use tower_service::Service;
    let (remote, forwarded_slot) = match forwarded_client(&routing, &mut request) {
        Ok(client) => client,
        Err(refusal) => {
            connections_refused(refusal.label()).increment(1);
            let mut answer = axum::response::Response::new(Body::from(refusal.body()));
            *answer.status_mut() = axum::http::StatusCode::TOO_MANY_REQUESTS;
            answer.headers_mut().insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
            return Ok(answer);
        }
    };
    let Routing { router, activity, body_read_timeout, .. } = routing;
    activity.request_started();
    let mut request = if request.body().is_end_stream() {
        request.map(Body::new)
    } else {
        let deadline = activity.now_ms().saturating_add(body_read_timeout.as_millis() as u64);
        activity.body_deadline_ms.store(deadline, Ordering::Relaxed);
        let read = Some(BodyRead(activity.clone()));
        request.map(|inner| Body::new(TimedBody { inner, read }))
    };
    request.extensions_mut().insert(ConnectInfo(PeerAddr(remote)));
    // For a WebSocket's session: how long since its socket last took bytes.
    request.extensions_mut().insert(activity.clone());
    let mut router = router;
    let response = router.call(request).await?;
    let streaming = response.headers().get(axum::http::header::CONTENT_TYPE).is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        if response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS {
            // A WebSocket: its client holds the slot for as long as the connection lives.
            *activity.forwarded_slot.lock().unwrap_or_else(|e| e.into_inner()) = forwarded_slot;
        }
        activity.request_done();
        return Ok(response);
    }
    // A Server-Sent Events stream is a request still being answered for as long as its body
    // runs: the idle timeout must not cut it (its keepalive comments are writes, not requests),
    // and a forwarded client holds its slot as long.
    let done = (RequestDone(activity), forwarded_slot);
    Ok(response.map(|body| {
        Body::from_stream(futures_util::StreamExt::map(body.into_data_stream(), move |chunk| {
            let _ = &done;
            chunk
        }))
    }))
}

/// A request body whose timer (`Activity::body_deadline_ms`) stops once it has been read to its
/// end; otherwise hyper's body as it is (its size hint included: readers size their buffer by it).
struct TimedBody {
    inner: Incoming,
    read: Option<BodyRead>,
}

impl hyper::body::Body for TimedBody {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.take(); // the whole body arrived: the timer stops
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Stops the body timer when the body has been read whole or is dropped unread (the answer then
/// goes out, and what is left of the body is the next head's to time).
struct BodyRead(Arc<Activity>);

impl Drop for BodyRead {
    fn drop(&mut self) {
        self.0.body_deadline_ms.store(0, Ordering::Relaxed);
    }
}

/// Counts a request done when dropped (with the body of a streamed answer).
struct RequestDone(Arc<Activity>);

impl Drop for RequestDone {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

async fn serve_connection<IO>(io: IO, remote: SocketAddr, router: Router, limits: &ConnectionLimits, counts: Arc<ConnectionCounts>, stop: CancellationToken)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + HasActivity + Unpin + Send + 'static,
{
    let activity = io.activity();
    activity.watching.store(true, Ordering::Relaxed);
    let routing = Routing {
        router,
        activity: activity.clone(),
        remote,
        body_read_timeout: limits.body_read_timeout,
        trusted_proxies: limits.trusted_proxies.clone(),
        counts,
        max_per_ip: limits.max_per_ip,
    };
    let service = hyper::service::service_fn(move |request| route(routing.clone(), request));
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog below is the header-read timer (hyper's would also close idle keep-alive
    // connections after the shorter header-read time).
    builder.header_read_timeout(Option::<Duration>::None);
    let conn = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(conn);
    let stopping = stop.cancelled();
    tokio::pin!(stopping);
    let mut stopped = false;
    loop {
        // Re-checked at least every second: a request may start or end without waking us.
        let nap = activity.time_left(limits.header_read_timeout, limits.idle_timeout).unwrap_or(Duration::MAX).min(Duration::from_secs(1));
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%remote, error = %e, "connection ended with an error");
                }
                break;
            }
            _ = &mut stopping, if !stopped => {
                stopped = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep(nap) => {
                if activity.time_left(limits.header_read_timeout, limits.idle_timeout).is_some_and(|left| left.is_zero()) {
                    tracing::debug!(%remote, "connection closed: no whole request head (or body) in time, or idle too long");
                    break;
                }
            }
        }
    }
    activity.watching.store(false, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option set on the listener reaches the sockets it accepts: no-delay, keepalive with
    /// its three timers, and the user timeout (a half-open SSE peer is dropped after it).
    #[tokio::test]
    async fn accepted_sockets_inherit_the_listeners_options() {
        for user_timeout in [Some(Duration::from_millis(75_000)), None] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            configure_listener(&listener, user_timeout);
            let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (accepted, _) = listener.accept().await.unwrap();
            let socket = socket2::SockRef::from(&accepted);
            assert!(socket.tcp_nodelay().unwrap());
            assert!(socket.keepalive().unwrap());
            assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(60));
            assert_eq!(socket.tcp_keepalive_interval().unwrap(), Duration::from_secs(10));
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), 6);
            assert_eq!(socket.tcp_user_timeout().unwrap(), user_timeout, "None: the kernel's default");
        }
    }

    #[test]
    fn the_cap_leaves_descriptors_for_the_stores() {
        assert_eq!(connection_capacity(100_000, Some(4096)), 4096 - 512);
        assert_eq!(connection_capacity(100_000, Some(256)), 192, "a quarter of a small limit");
        assert_eq!(connection_capacity(100_000, Some(0)), 1, "never zero");
        assert_eq!(connection_capacity(1000, Some(1 << 20)), 1000);
        assert_eq!(connection_capacity(1000, None), 1000);
    }
}
