//! Lingering close: when a connection is done, ackgate stops writing (FIN) but keeps reading and
//! discarding what the client still sends, until the client closes too, a short grace passes, or
//! a byte bound is reached; only then is the socket closed.
//!
//! Closing a TCP socket with unread data makes the kernel answer with a reset, and a reset can
//! destroy what the client had not read yet: a client still sending a frame over
//! `limits.max_frame_bytes` would lose the close frame (1009) sent to it, and a client cut off in
//! the middle of a large request body would lose the error answer. HTTP servers have done this
//! since Apache's `lingering_close`; here it wraps every accepted connection, HTTP and WebSocket.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::activity::{Activity, HasActivity};
use super::connection_counts::ConnectionSlot;

/// How long and how much a closed connection is drained.
#[derive(Debug, Clone, Copy)]
pub struct Linger {
    pub grace: Duration,
    pub max_bytes: usize,
}

/// The client's address, as `ConnectInfo` hands it to handlers (`http::connections` sets it).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// An accepted connection that drains before it closes (see the module documentation).
pub struct LingeringStream {
    tcp: Option<TcpStream>,
    linger: Linger,
    /// Released when the socket is finally closed, after lingering.
    slot: Option<ConnectionSlot>,
    /// Reads are recorded for the connection's header-read and idle timers.
    pub(super) activity: Arc<Activity>,
}

impl LingeringStream {
    pub fn new(tcp: TcpStream, linger: Linger, slot: Option<ConnectionSlot>) -> Self {
        let activity = Arc::new(Activity::new());
        activity.watch_socket(std::os::fd::AsRawFd::as_raw_fd(&tcp));
        Self { tcp: Some(tcp), linger, slot, activity }
    }

    /// A write the socket took bytes of is progress (a dead peer's socket takes none).
    fn record_write(&self, written: &Poll<io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0) {
            self.activity.on_bytes_written();
        }
    }

    fn tcp(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.tcp.as_mut().expect("the stream is only taken by drop"))
    }
}

impl AsyncRead for LingeringStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = self.tcp().poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.on_bytes_read();
        }
        read
    }
}

impl AsyncWrite for LingeringStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = self.tcp().poll_write(cx, buf);
        self.record_write(&written);
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp().poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let written = self.tcp().poll_write_vectored(cx, bufs);
        self.record_write(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.as_ref().is_some_and(|t| t.is_write_vectored())
    }
}

impl Drop for LingeringStream {
    fn drop(&mut self) {
        self.activity.watch_socket(-1);
        let Some(tcp) = self.tcp.take() else { return };
        // Outside a runtime (process exit) the socket simply closes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain_then_close(tcp, self.linger, self.slot.take()));
        }
    }
}

/// Sends FIN, then reads and discards until the client closes, the grace passes or `max_bytes`
/// were read; dropping the socket then closes it.
async fn drain_then_close(mut tcp: TcpStream, linger: Linger, _slot: Option<ConnectionSlot>) {
    let _ = tcp.shutdown().await;
    let deadline = tokio::time::Instant::now() + linger.grace;
    // Small: thousands of connections may close at once (a shutdown), each draining for a while.
    let mut buf = [0u8; 8 * 1024];
    let mut drained = 0usize;
    while drained < linger.max_bytes {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            // EOF, an error, or the grace is over.
            _ => return,
        }
    }
}

impl HasActivity for LingeringStream {
    fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Accepts one connection as the gateway does (lingering, uncounted).
    async fn accept(listener: &TcpListener, linger: Linger) -> LingeringStream {
        let (tcp, _) = listener.accept().await.unwrap();
        LingeringStream::new(tcp, linger, None)
    }

    /// A server that closes while the client is still sending: with lingering the client's
    /// whole write goes through and it reads the server's last words; it sees no reset.
    #[tokio::test]
    async fn a_client_still_sending_reads_the_last_answer_instead_of_a_reset() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut conn = accept(&listener, Linger { grace: Duration::from_secs(2), max_bytes: 64 << 20 }).await;
            let mut head = [0u8; 16];
            conn.read_exact(&mut head).await.unwrap();
            conn.write_all(b"too big").await.unwrap();
            // Dropped with megabytes still on their way.
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        let payload = vec![b'x'; 16 << 20];
        client.write_all(&payload).await.expect("the whole payload is accepted (drained), not reset");
        server.await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("a clean end of stream, not a reset");
        assert_eq!(answer, b"too big");
    }

    #[tokio::test]
    async fn draining_stops_at_the_byte_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let conn = accept(&listener, Linger { grace: Duration::from_secs(30), max_bytes: 1 << 20 }).await;
            drop(conn);
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        server.await.unwrap();
        // A client that never stops sending is cut off after about max_bytes, long before the grace.
        let endless = vec![b'x'; 1 << 20];
        let mut failed = false;
        for _ in 0..256 {
            if client.write_all(&endless).await.is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "the connection was closed after the byte bound, not after 256 MiB");
    }
}
