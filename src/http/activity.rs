//! Where a connection stands (`Activity`): when its requests started and were answered and when
//! its socket last took bytes, for the connection's watchdog (`http::connections`) and a
//! WebSocket session's dead-peer check (`core::session::WriteProgress`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a connection stands, for its watchdog. Times are milliseconds since the connection was
/// accepted, plus one (0 = not set).
pub struct Activity {
    pub(super) accepted: Instant,
    /// Requests being handled.
    pub(super) in_flight: AtomicUsize,
    /// When the last request was answered (0: none yet).
    pub(super) idle_since_ms: AtomicU64,
    /// When bytes first arrived while idle after a request: the next request head has started.
    pub(super) head_started_ms: AtomicU64,
    /// When the body of the request being handled must have arrived whole (0: no body being read).
    pub(super) body_deadline_ms: AtomicU64,
    /// The watchdog is still watching (reads after an upgrade need not record anything).
    pub(super) watching: AtomicBool,
    /// When the socket last took bytes, or its peer last read some of what it holds (0: never):
    /// a WebSocket session's dead-peer check (`core::session::WriteProgress`).
    pub(super) last_write_ms: AtomicU64,
    /// The socket's descriptor (-1: none, or closed), for the bytes its send queue holds.
    fd: std::sync::atomic::AtomicI32,
    /// Bytes its send queue held when last asked (`u64::MAX`: never asked).
    pub(super) queued: AtomicU64,
    /// The per-IP slot of the client a trusted proxy named for the WebSocket this connection was
    /// upgraded to (`http::forwarded`): released with the connection.
    pub(super) forwarded_slot: std::sync::Mutex<Option<super::connection_counts::ConnectionSlot>>,
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
            forwarded_slot: std::sync::Mutex::new(None),
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

    pub(super) fn now_ms(&self) -> u64 {
        self.accepted.elapsed().as_millis() as u64 + 1
    }

    /// Called by the stream for every read that returned bytes.
    pub fn on_bytes_read(&self) {
        if self.watching.load(Ordering::Relaxed) && self.in_flight.load(Ordering::Relaxed) == 0 && self.idle_since_ms.load(Ordering::Relaxed) != 0 {
            let _ = self.head_started_ms.compare_exchange(0, self.now_ms(), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    pub(super) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started_ms.store(0, Ordering::Relaxed);
    }

    pub(super) fn request_done(&self) {
        self.body_deadline_ms.store(0, Ordering::Relaxed);
        self.idle_since_ms.store(self.now_ms(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// How long until the connection must be closed as things stand (`None`: a request is being
    /// handled and its body, if any, has arrived). The first head counts from accept (a TLS
    /// handshake included), later heads from their first byte, a body from its head, and an idle
    /// keep-alive connection from its last answer.
    pub(super) fn time_left(&self, header_read_timeout: Duration, idle_timeout: Duration) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return match self.body_deadline_ms.load(Ordering::Relaxed) {
                0 => None,
                at_ms => Some(Duration::from_millis(at_ms.saturating_sub(self.now_ms()))),
            };
        }
        let header_read = header_read_timeout.as_millis() as u64;
        let (idle_since, head) = (self.idle_since_ms.load(Ordering::Relaxed), self.head_started_ms.load(Ordering::Relaxed));
        let at_ms = if idle_since == 0 {
            1 + header_read
        } else if head != 0 {
            head + header_read
        } else {
            idle_since + idle_timeout.as_millis() as u64
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

/// A stream that records its reads in an `Activity` (the connection's watchdog reads it).
pub trait HasActivity {
    fn activity(&self) -> Arc<Activity>;
}
