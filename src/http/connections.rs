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

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    /// Sent data unacknowledged this long (a peer gone without a FIN) makes the kernel drop the
    /// connection (TCP_USER_TIMEOUT); `None` = the kernel's retransmission limit (~15 minutes).
    pub unacknowledged_timeout: Option<Duration>,
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
#[derive(Default)]
pub struct ConnectionCounts {
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    refusing: AtomicUsize,
}

/// One counted connection; dropping it releases the count.
pub struct ConnectionSlot {
    counts: Arc<ConnectionCounts>,
    ip: Option<IpAddr>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.counts.open.fetch_sub(1, Ordering::Relaxed);
        if let Some(ip) = self.ip {
            let mut per_ip = self.counts.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
    }
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `limits.max_connections` reached: 503 `unavailable`.
    Capacity,
    /// `limits.max_connections_per_ip` reached: 429 `limit_exceeded`.
    PerIp,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::Capacity => "capacity",
            Refusal::PerIp => "per_ip",
        }
    }

    /// The whole HTTP answer: status line, headers and the error body, then the connection closes.
    fn response(self) -> Vec<u8> {
        let (status, code, message) = match self {
            Refusal::Capacity => {
                ("503 Service Unavailable", "unavailable", "this instance has no room for more connections; retry later or use another instance")
            }
            Refusal::PerIp => ("429 Too Many Requests", "limit_exceeded", "too many connections from this address (limits.max_connections_per_ip)"),
        };
        let body = format!(r#"{{"error":{{"code":"{code}","message":"{message}"}}}}"#);
        let retry = if self == Refusal::Capacity { "retry-after: 1\r\n" } else { "" };
        format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n{body}", body.len()).into_bytes()
    }
}

impl ConnectionCounts {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Takes a slot for a connection from `ip`, or says why there is none.
    fn admit(self: &Arc<Self>, ip: IpAddr, limits: &ConnectionLimits) -> Result<ConnectionSlot, Refusal> {
        if self.open.fetch_add(1, Ordering::Relaxed) >= limits.max_connections {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Capacity);
        }
        if limits.max_per_ip == 0 {
            return Ok(ConnectionSlot { counts: self.clone(), ip: None });
        }
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= limits.max_per_ip {
            drop(per_ip);
            self.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::PerIp);
        }
        *n += 1;
        Ok(ConnectionSlot { counts: self.clone(), ip: Some(ip) })
    }
}

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
        let slot = match counts.admit(remote.ip(), &limits) {
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
        configure_socket(&tcp, limits.unacknowledged_timeout);
        let stream = LingeringStream::new(tcp, limits.linger, Some(slot));
        let (router, tls, limits, stop) = (router.clone(), tls.clone(), limits.clone(), stop.clone());
        connections.spawn(async move {
            match tls {
                None => serve_connection(stream, remote, router, &limits, stop).await,
                Some(tls) => {
                    if let Some(stream) = tls.handshake(stream, limits.tls_handshake_timeout).await {
                        serve_connection(stream, remote, router, &limits, stop).await
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
fn configure_socket(tcp: &TcpStream, unacknowledged_timeout: Option<Duration>) {
    let _ = tcp.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(60)).with_interval(Duration::from_secs(10)).with_retries(6);
    let socket = socket2::SockRef::from(tcp);
    let _ = socket.set_tcp_keepalive(&keepalive);
    if let Some(timeout) = unacknowledged_timeout {
        let _ = socket.set_tcp_user_timeout(Some(timeout));
    }
}

/// Where a connection stands, for its watchdog. Times are milliseconds since the connection was
/// accepted, plus one (0 = not set).
pub struct Activity {
    accepted: Instant,
    /// Requests being handled.
    in_flight: AtomicUsize,
    /// When the last request was answered (0: none yet).
    idle_since_ms: AtomicU64,
    /// When bytes first arrived while idle after a request: the next request head has started.
    head_started_ms: AtomicU64,
    /// When the body of the request being handled must have arrived whole (0: no body being read).
    body_deadline_ms: AtomicU64,
    /// The watchdog is still watching (reads after an upgrade need not record anything).
    watching: AtomicBool,
    /// When the socket last took bytes, or its peer last read some of what it holds (0: never):
    /// a WebSocket session's dead-peer check (`core::session::WriteProgress`).
    last_write_ms: AtomicU64,
    /// The socket's descriptor (-1: none, or closed), for the bytes its send queue holds.
    fd: std::sync::atomic::AtomicI32,
    /// Bytes its send queue held when last asked (`u64::MAX`: never asked).
    queued: AtomicU64,
}

impl Activity {
    pub fn new() -> Self {
        Self {
            accepted: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            body_deadline_ms: AtomicU64::new(0),
            watching: AtomicBool::new(false),
            last_write_ms: AtomicU64::new(0),
            fd: std::sync::atomic::AtomicI32::new(-1),
            queued: AtomicU64::new(u64::MAX),
        }
    }

    /// The socket whose send queue `WriteProgress` watches (-1: none any more).
    pub fn watch_socket(&self, fd: i32) {
        self.fd.store(fd, Ordering::Relaxed);
    }

    /// Called by the stream for every write the socket took bytes of.
    pub fn on_bytes_written(&self) {
        self.last_write_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        self.accepted.elapsed().as_millis() as u64 + 1
    }

    /// Called by the stream for every read that returned bytes.
    pub fn on_bytes_read(&self) {
        if self.watching.load(Ordering::Relaxed) && self.in_flight.load(Ordering::Relaxed) == 0 && self.idle_since_ms.load(Ordering::Relaxed) != 0 {
            let _ = self.head_started_ms.compare_exchange(0, self.now_ms(), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started_ms.store(0, Ordering::Relaxed);
    }

    fn request_done(&self) {
        self.body_deadline_ms.store(0, Ordering::Relaxed);
        self.idle_since_ms.store(self.now_ms(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// How long until the connection must be closed as things stand (`None`: a request is being
    /// handled and its body, if any, has arrived). The first head counts from accept (a TLS
    /// handshake included), later heads from their first byte, a body from its head, and an idle
    /// keep-alive connection from its last answer.
    fn time_left(&self, limits: &ConnectionLimits) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return match self.body_deadline_ms.load(Ordering::Relaxed) {
                0 => None,
                at_ms => Some(Duration::from_millis(at_ms.saturating_sub(self.now_ms()))),
            };
        }
        let header_read = limits.header_read_timeout.as_millis() as u64;
        let (idle_since, head) = (self.idle_since_ms.load(Ordering::Relaxed), self.head_started_ms.load(Ordering::Relaxed));
        let at_ms = if idle_since == 0 {
            1 + header_read
        } else if head != 0 {
            head + header_read
        } else {
            idle_since + limits.idle_timeout.as_millis() as u64
        };
        Some(Duration::from_millis(at_ms.saturating_sub(self.now_ms())))
    }
}

/// Progress is a write the socket took, or bytes of its send queue the peer took since the last
/// question: the socket signals room for writes only once much of its buffer is free (half of
/// megabytes), so a slow reader's writes wait seconds between progress at the socket, while its
/// send queue shrinks steadily. A peer that reads nothing leaves the queue as it is.
impl crate::core::session::WriteProgress for Activity {
    fn since_last_write(&self) -> Duration {
        let fd = self.fd.load(Ordering::Relaxed);
        if fd >= 0 {
            let mut queued: libc::c_int = 0;
            // SAFETY: `fd` is the open socket of the session asking (it is only asked while a
            // write to it waits), and TIOCOUTQ (SIOCOUTQ) writes one int.
            if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) } == 0 {
                let queued = queued.max(0) as u64;
                if queued < self.queued.swap(queued, Ordering::Relaxed) {
                    self.on_bytes_written();
                }
            }
        }
        let last = self.last_write_ms.load(Ordering::Relaxed).max(1);
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

/// Hands the request to the router with the peer's address, counting it for the watchdog; a
/// body is timed from here until it has been read to its end (or dropped unread).
async fn route(
    router: Router,
    activity: Arc<Activity>,
    remote: SocketAddr,
    body_read_timeout: Duration,
    request: hyper::Request<Incoming>,
) -> Result<axum::response::Response, Infallible> {
    use hyper::body::Body as _;
    use tower_service::Service;
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
        activity.request_done();
        return Ok(response);
    }
    // A Server-Sent Events stream is a request still being answered for as long as its body
    // runs: the idle timeout must not cut it (its keepalive comments are writes, not requests).
    let done = RequestDone(activity);
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

async fn serve_connection<IO>(io: IO, remote: SocketAddr, router: Router, limits: &ConnectionLimits, stop: CancellationToken)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + HasActivity + Unpin + Send + 'static,
{
    let activity = io.activity();
    activity.watching.store(true, Ordering::Relaxed);
    let watched = activity.clone();
    let body_read_timeout = limits.body_read_timeout;
    let service = hyper::service::service_fn(move |request| route(router.clone(), watched.clone(), remote, body_read_timeout, request));
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
        let nap = activity.time_left(limits).unwrap_or(Duration::MAX).min(Duration::from_secs(1));
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
                if activity.time_left(limits).is_some_and(|left| left.is_zero()) {
                    tracing::debug!(%remote, "connection closed: no whole request head (or body) in time, or idle too long");
                    break;
                }
            }
        }
    }
    activity.watching.store(false, Ordering::Relaxed);
}

/// A stream that records its reads in an `Activity` (the connection's watchdog reads it).
pub trait HasActivity {
    fn activity(&self) -> Arc<Activity>;
}

impl HasActivity for LingeringStream {
    fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_per_ip: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            max_per_ip,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            tls_handshake_timeout: Duration::from_secs(10),
            linger: Linger { grace: Duration::from_secs(1), max_bytes: 1 << 20 },
            unacknowledged_timeout: None,
        }
    }

    /// The user timeout reaches the accepted socket (a half-open SSE peer is dropped after it).
    #[tokio::test]
    async fn accepted_sockets_get_the_user_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        configure_socket(&accepted, Some(Duration::from_millis(75_000)));
        assert_eq!(socket2::SockRef::from(&accepted).tcp_user_timeout().unwrap(), Some(Duration::from_millis(75_000)));
        assert!(socket2::SockRef::from(&accepted).tcp_nodelay().unwrap());
        let (_client, accepted) = (TcpStream::connect(listener.local_addr().unwrap()).await.unwrap(), listener.accept().await.unwrap().0);
        configure_socket(&accepted, None);
        assert_eq!(socket2::SockRef::from(&accepted).tcp_user_timeout().unwrap(), None, "the kernel's default");
    }

    #[test]
    fn slots_are_counted_in_all_and_per_ip_and_released_on_drop() {
        let counts = Arc::new(ConnectionCounts::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let l = limits(3, 2);
        let a1 = counts.admit(a, &l).unwrap();
        let _a2 = counts.admit(a, &l).unwrap();
        assert_eq!(counts.admit(a, &l).err(), Some(Refusal::PerIp));
        let _b1 = counts.admit(b, &l).unwrap();
        assert_eq!(counts.admit(b, &l).err(), Some(Refusal::Capacity));
        assert_eq!(counts.open(), 3);
        drop(a1);
        assert_eq!(counts.open(), 2);
        let _a3 = counts.admit(a, &l).expect("a's slot came back");
        assert_eq!(counts.admit(b, &l).err(), Some(Refusal::Capacity), "refusals took no slot");
    }

    #[test]
    fn without_a_per_ip_limit_nothing_is_kept_per_ip() {
        let counts = Arc::new(ConnectionCounts::default());
        let l = limits(usize::MAX, 0);
        let slots: Vec<_> = (0..100).map(|_| counts.admit("10.0.0.1".parse().unwrap(), &l).unwrap()).collect();
        assert!(counts.per_ip.lock().unwrap().is_empty());
        assert_eq!(counts.open(), 100);
        drop(slots);
        assert_eq!(counts.open(), 0);
    }

    #[test]
    fn the_cap_leaves_descriptors_for_the_stores() {
        assert_eq!(connection_capacity(100_000, Some(4096)), 4096 - 512);
        assert_eq!(connection_capacity(100_000, Some(256)), 192, "a quarter of a small limit");
        assert_eq!(connection_capacity(100_000, Some(0)), 1, "never zero");
        assert_eq!(connection_capacity(1000, Some(1 << 20)), 1000);
        assert_eq!(connection_capacity(1000, None), 1000);
    }

    #[test]
    fn refusals_are_complete_http_answers_with_the_error_body() {
        let text = String::from_utf8(Refusal::Capacity.response()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "unavailable");
        let text = String::from_utf8(Refusal::PerIp.response()).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 ") && text.contains("limit_exceeded"));
    }
}
