//! RocketMQ's remoting protocol, spoken directly: one TCP connection per address, requests
//! multiplexed by `opaque`.
//!
//! A frame is `[total length: u32][header length: u32, top byte = serialize type][header][body]`,
//! all big-endian; the header is JSON (`code`, `opaque`, `flag`, `remark`, `extFields` whose values
//! are strings). The protocol is small enough that a client crate (and its dependency graph)
//! would cost more than these few hundred lines.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Request codes ackgate sends (RocketMQ's `RequestCode`).
pub mod code {
    pub const SEND_MESSAGE: i32 = 10;
    pub const PULL_MESSAGE: i32 = 11;
    pub const QUERY_MESSAGE: i32 = 12;
    pub const QUERY_CONSUMER_OFFSET: i32 = 14;
    pub const UPDATE_AND_CREATE_TOPIC: i32 = 17;
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    pub const GET_MAX_OFFSET: i32 = 30;
    pub const GET_MIN_OFFSET: i32 = 31;
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    pub const UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: i32 = 200;
    pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
    pub const DELETE_TOPIC_IN_BROKER: i32 = 215;
    pub const DELETE_TOPIC_IN_NAMESRV: i32 = 216;
    pub const POP_MESSAGE: i32 = 200050;
    pub const ACK_MESSAGE: i32 = 200051;
    pub const CHANGE_MESSAGE_INVISIBLETIME: i32 = 200053;
    pub const POP_LITE_MESSAGE: i32 = 200070;
    pub const LITE_SUBSCRIPTION_CTL: i32 = 200071;
    pub const GET_LITE_CLIENT_INFO: i32 = 200077;
    pub const TRIGGER_LITE_DISPATCH: i32 = 200079;
}

/// Response codes ackgate tells apart (RocketMQ's `ResponseCode`).
pub mod response {
    pub const SUCCESS: i32 = 0;
    pub const SYSTEM_BUSY: i32 = 2;
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const PULL_NOT_FOUND: i32 = 19;
    pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
    pub const PULL_OFFSET_MOVED: i32 = 21;
    pub const QUERY_NOT_FOUND: i32 = 22;
    pub const POLLING_FULL: i32 = 209;
    pub const POLLING_TIMEOUT: i32 = 210;
}

/// Frames above this are refused (a broken peer must not make us allocate gigabytes).
const MAX_FRAME: usize = 64 * 1024 * 1024;
const RESPONSE_FLAG: i32 = 1;

/// A decoded response.
#[derive(Debug, Clone)]
pub struct Response {
    pub code: i32,
    pub remark: String,
    pub ext: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.ext.get(name).map(String::as_str)
    }

    /// A numeric header field.
    pub fn number(&self, name: &str) -> Result<i64, RemotingError> {
        self.field(name).and_then(|v| v.parse().ok()).ok_or_else(|| RemotingError::Protocol(format!("response {} has no numeric {name}", self.code)))
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RemotingError {
    #[error("{addr}: {message}")]
    Connection { addr: String, message: String },
    /// The request was sent whole, then the connection ended before its answer: the broker may
    /// have applied it, so it is never sent again from here (a SEND_MESSAGE would be stored twice).
    #[error("{addr}: connection closed after the request was sent and before its answer (it may have been applied)")]
    Unanswered { addr: String },
    #[error("{addr}: no response within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("protocol: {0}")]
    Protocol(String),
}

type Pending = Arc<Mutex<Option<HashMap<i32, oneshot::Sender<Response>>>>>;

/// One connection: a writer behind a lock and a reader task that hands responses to waiters.
struct Connection {
    writer: tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>,
    /// Waiters by opaque; `None` once the connection is gone.
    pending: Pending,
    /// A write stopped mid-frame (its request timed out): nothing more may be written here.
    cut: AtomicBool,
    /// Frames read from the peer so far. A request that times out with none read since it
    /// started found the connection silent (a broker stopped or gone without a word, a half-open
    /// socket): later requests go over a new connection instead of timing out on it forever.
    frames_read: Arc<AtomicU64>,
    /// The task reading responses: a connection no request uses any more stops it, so a silent
    /// peer (which never closes its end) does not keep a socket and a task per retired connection.
    reader: tokio::task::AbortHandle,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// How a peer that vanished (a host down, a NAT that forgot the flow) is found within about a
/// minute, and its connection's reader and waiters end: TCP keepalive while the connection is
/// idle, and a limit on how long sent data may stay unacknowledged while it is not (without it,
/// Linux retransmits for ~15 minutes).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;
const UNACKNOWLEDGED_LIMIT: Duration = Duration::from_secs(60);

/// One frame being written, holding the connection's writer. Dropped with part of the frame
/// written (the request's timeout cancelled the write), it retires the connection: the peer
/// holds part of a frame, and whatever came next on that stream it would read as the rest of it.
/// Retiring ends the write side at once (the broker reads the cut frame, then the end) and takes
/// the connection out of use; the requests already written keep waiting for their answers.
struct FrameWrite<'a> {
    remoting: &'a Remoting,
    addr: &'a str,
    connection: &'a Arc<Connection>,
    writer: tokio::sync::MutexGuard<'a, tokio::net::tcp::OwnedWriteHalf>,
    written: usize,
    len: usize,
}

impl FrameWrite<'_> {
    async fn write(&mut self, frame: &[u8]) -> std::io::Result<()> {
        while self.written < frame.len() {
            match self.writer.write(&frame[self.written..]).await? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                n => self.written += n,
            }
        }
        Ok(())
    }
}

impl Drop for FrameWrite<'_> {
    fn drop(&mut self) {
        if self.written > 0 && self.written < self.len {
            self.connection.cut.store(true, Ordering::Relaxed);
            let stream: &TcpStream = (*self.writer).as_ref();
            let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
            self.remoting.forget(self.addr, self.connection);
            tracing::warn!(addr = %self.addr, written = self.written, frame = self.len, "RocketMQ request cut mid-write (timed out): its connection takes no more requests");
        }
    }
}

/// Removes a request's waiter when the request ends, however it ends: a timed-out request's
/// entry stayed until its connection closed.
struct Waiter<'a> {
    pending: &'a Pending,
    opaque: i32,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.lock().unwrap().as_mut() {
            pending.remove(&self.opaque);
        }
    }
}

/// Connections by address, opened on first use and reopened after a failure.
#[derive(Default)]
pub struct Remoting {
    connections: Mutex<HashMap<String, Arc<Connection>>>,
    next_opaque: AtomicI32,
}

impl Remoting {
    /// Sends a request and waits up to `timeout` for its response.
    pub async fn request(&self, addr: &str, code: i32, ext: &[(&str, String)], body: &[u8], timeout: Duration) -> Result<Response, RemotingError> {
        let opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        let frame = encode_request(code, opaque, ext, body);
        // Once the frame is written whole: the connection, and its `frames_read` when the
        // request started (a silence judged over the whole timeout, not from the write on).
        let mut sent_on: Option<(Arc<Connection>, u64)> = None;
        let call = async {
            let connection = self.connection(addr).await?;
            let read_at_start = connection.frames_read.load(Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            match connection.pending.lock().unwrap().as_mut() {
                Some(pending) => pending.insert(opaque, tx),
                None => return Err(gone(addr, "connection closed")),
            };
            let _waiter = Waiter { pending: &connection.pending, opaque };
            let writer = connection.writer.lock().await;
            if connection.cut.load(Ordering::Relaxed) {
                return Err(gone(addr, "connection closed after a cut write"));
            }
            let mut write = FrameWrite { remoting: self, addr, connection: &connection, writer, written: 0, len: frame.len() };
            let written = write.write(&frame).await;
            drop(write);
            if let Err(e) = written {
                self.drop_connection(addr, &connection);
                return Err(gone(addr, &e.to_string()));
            }
            sent_on = Some((connection.clone(), read_at_start));
            rx.await.map_err(|_| RemotingError::Unanswered { addr: addr.to_string() })
        };
        let result = tokio::time::timeout(timeout, call).await;
        match result {
            Ok(result) => result,
            Err(_) => {
                if let Some((connection, read_before)) = sent_on.filter(|(c, read)| c.frames_read.load(Ordering::Relaxed) == *read) {
                    // Silent for a whole timeout. Only forgotten: requests already waiting on it
                    // keep their chance, and it closes when the last of them ends.
                    tracing::warn!(%addr, code, ?timeout, frames_read = read_before, "RocketMQ connection silent for a whole request timeout: the next request opens a new one");
                    self.forget(addr, &connection);
                }
                Err(RemotingError::Timeout { addr: addr.to_string(), timeout })
            }
        }
    }

    async fn connection(&self, addr: &str) -> Result<Arc<Connection>, RemotingError> {
        if let Some(c) = self.connections.lock().unwrap().get(addr) {
            return Ok(c.clone());
        }
        let stream = TcpStream::connect(addr).await.map_err(|e| gone(addr, &e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL).with_retries(KEEPALIVE_PROBES);
        let socket = socket2::SockRef::from(&stream);
        if let Err(e) = socket.set_tcp_keepalive(&keepalive).and_then(|()| socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_LIMIT))) {
            tracing::debug!(%addr, error = %e, "TCP keepalive not set on a RocketMQ connection");
        }
        let (reader, writer) = stream.into_split();
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let frames_read = Arc::new(AtomicU64::new(0));
        let reader = tokio::spawn(read_responses(addr.to_string(), reader, pending.clone(), frames_read.clone())).abort_handle();
        let connection = Arc::new(Connection { writer: tokio::sync::Mutex::new(writer), pending, cut: AtomicBool::new(false), frames_read, reader });
        let mut connections = self.connections.lock().unwrap();
        if let Some(raced) = connections.get(addr) {
            return Ok(raced.clone()); // ours is dropped, and its reader with it
        }
        connections.insert(addr.to_string(), connection.clone());
        Ok(connection)
    }

    /// Takes `connection` out of use (if it is still the one for `addr`): the next request
    /// opens a new one.
    fn forget(&self, addr: &str, connection: &Arc<Connection>) {
        let mut connections = self.connections.lock().unwrap();
        if connections.get(addr).is_some_and(|c| Arc::ptr_eq(c, connection)) {
            connections.remove(addr);
        }
    }

    /// `forget`, and wakes every waiter on it with "connection closed".
    fn drop_connection(&self, addr: &str, connection: &Arc<Connection>) {
        self.forget(addr, connection);
        connection.pending.lock().unwrap().take();
    }

    /// Forgets connections whose reader ended, so the next request reconnects.
    fn prune(&self) {
        self.connections.lock().unwrap().retain(|_, c| c.pending.lock().unwrap().is_some());
    }

    /// Like `request`, reconnecting once when a stale connection fails at once: before the
    /// request was sent, or after it for a request that changes nothing at the broker. Any other
    /// request sent whole is never sent again here, whatever became of its connection
    /// (`Unanswered`): its caller decides (a publish answers `unavailable`; whether it was stored
    /// is unknown).
    pub async fn call(&self, addr: &str, code: i32, ext: &[(&str, String)], body: &[u8], timeout: Duration) -> Result<Response, RemotingError> {
        self.prune();
        match self.request(addr, code, ext, body, timeout).await {
            Err(e) if matches!(e, RemotingError::Connection { .. }) || (matches!(e, RemotingError::Unanswered { .. }) && is_idempotent(code)) => {
                self.prune();
                self.request(addr, code, ext, body, timeout).await
            }
            other => other,
        }
    }
}

/// Requests that read, create-if-missing, delete or trigger, so sending one twice is harmless. A
/// SEND_MESSAGE sent twice is stored twice, a POP twice hides a second batch until its revival,
/// an ACK or an invisible-time change names a receipt handle the first may have used up, and a
/// lite subscription change may have been overtaken by a later one.
fn is_idempotent(code: i32) -> bool {
    matches!(
        code,
        code::PULL_MESSAGE
            | code::QUERY_MESSAGE
            | code::QUERY_CONSUMER_OFFSET
            | code::UPDATE_AND_CREATE_TOPIC
            | code::SEARCH_OFFSET_BY_TIMESTAMP
            | code::VIEW_MESSAGE_BY_ID
            | code::GET_MAX_OFFSET
            | code::GET_MIN_OFFSET
            | code::GET_ROUTEINFO_BY_TOPIC
            | code::GET_BROKER_CLUSTER_INFO
            | code::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
            | code::GET_ALL_TOPIC_LIST_FROM_NAMESERVER
            | code::GET_LITE_CLIENT_INFO
            | code::DELETE_TOPIC_IN_BROKER
            | code::DELETE_TOPIC_IN_NAMESRV
            | code::TRIGGER_LITE_DISPATCH
    )
}

fn gone(addr: &str, message: &str) -> RemotingError {
    RemotingError::Connection { addr: addr.to_string(), message: message.to_string() }
}

async fn read_responses(addr: String, mut reader: tokio::net::tcp::OwnedReadHalf, pending: Pending, frames_read: Arc<AtomicU64>) {
    loop {
        match read_frame(&mut reader).await {
            Ok(Some((flag, opaque, response))) => {
                frames_read.fetch_add(1, Ordering::Relaxed);
                if flag & RESPONSE_FLAG == 0 {
                    // A request from the broker (consumer-ids-changed notices and the like): ackgate
                    // registers no consumers, so there is nothing to answer.
                    continue;
                }
                let waiter = pending.lock().unwrap().as_mut().and_then(|p| p.remove(&opaque));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(response);
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%addr, error = %e, "RocketMQ connection failed");
                break;
            }
        }
    }
    // Dropping the waiters wakes them with "connection closed".
    pending.lock().unwrap().take();
}

/// Encodes a request frame (JSON header).
fn encode_request(code: i32, opaque: i32, ext: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let ext: serde_json::Map<String, serde_json::Value> = ext.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone()))).collect();
    let header = serde_json::json!({
        "code": code,
        "language": "RUST",
        "version": 0,
        "opaque": opaque,
        "flag": 0,
        "remark": null,
        "extFields": ext,
        "serializeTypeCurrentRPC": "JSON",
    });
    let header = serde_json::to_vec(&header).expect("a JSON value always serializes");
    let mut frame = Vec::with_capacity(8 + header.len() + body.len());
    frame.extend_from_slice(&((4 + header.len() + body.len()) as u32).to_be_bytes());
    frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(body);
    frame
}

/// Reads one frame: `(flag, opaque, response)`, `None` at a clean end of stream.
async fn read_frame(reader: &mut (impl AsyncReadExt + Unpin)) -> Result<Option<(i32, i32, Response)>, RemotingError> {
    let mut length = [0u8; 4];
    match reader.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(RemotingError::Protocol(e.to_string())),
    }
    let length = u32::from_be_bytes(length) as usize;
    if !(4..=MAX_FRAME).contains(&length) {
        return Err(RemotingError::Protocol(format!("frame of {length} bytes")));
    }
    let mut frame = vec![0u8; length];
    reader.read_exact(&mut frame).await.map_err(|e| RemotingError::Protocol(e.to_string()))?;
    decode_frame(&frame).map(Some)
}

/// Decodes a frame after its length prefix.
fn decode_frame(frame: &[u8]) -> Result<(i32, i32, Response), RemotingError> {
    let marked = frame.get(..4).ok_or_else(|| RemotingError::Protocol("frame shorter than its header length".into()))?;
    let marked = u32::from_be_bytes(marked.try_into().expect("4 bytes"));
    if marked >> 24 != 0 {
        return Err(RemotingError::Protocol(format!("serialize type {} (only JSON is spoken)", marked >> 24)));
    }
    let header_len = (marked & 0x00FF_FFFF) as usize;
    let header = frame.get(4..4 + header_len).ok_or_else(|| RemotingError::Protocol("header longer than its frame".into()))?;
    let header: serde_json::Value = serde_json::from_slice(header).map_err(|e| RemotingError::Protocol(format!("header: {e}")))?;
    let number = |name: &str| header.get(name).and_then(serde_json::Value::as_i64).unwrap_or(0) as i32;
    let ext = match header.get("extFields") {
        Some(serde_json::Value::Object(fields)) => {
            fields.iter().map(|(k, v)| (k.clone(), v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()))).collect()
        }
        _ => HashMap::new(),
    };
    let response = Response {
        code: number("code"),
        remark: header.get("remark").and_then(serde_json::Value::as_str).unwrap_or_default().to_string(),
        ext,
        body: frame[4 + header_len..].to_vec(),
    };
    Ok((number("flag"), number("opaque"), response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_frame_decodes_back() {
        let frame = encode_request(code::PULL_MESSAGE, 7, &[("topic", "t".into()), ("queueId", "3".into())], b"body");
        assert_eq!(u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize, frame.len() - 4);
        let (flag, opaque, decoded) = decode_frame(&frame[4..]).unwrap();
        assert_eq!((flag, opaque, decoded.code), (0, 7, code::PULL_MESSAGE));
        assert_eq!(decoded.field("topic"), Some("t"));
        assert_eq!(decoded.number("queueId").unwrap(), 3);
        assert_eq!(decoded.body, b"body");
    }

    /// A request whose timeout cancels its write mid-frame must not leave that connection in
    /// use: the next request's bytes would run into the cut frame, and the broker would read
    /// them as the rest of its body (a publish stored with a foreign tail). The next request
    /// goes over a new connection, where the peer reads it whole.
    #[tokio::test]
    async fn a_write_cut_by_the_timeout_retires_its_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let remoting = Remoting::default();
        // The peer reads nothing at first: 64 MiB cannot fit in the socket buffers.
        let big = vec![b'x'; MAX_FRAME - 1024];
        let (first, accepted) = tokio::join!(remoting.request(&addr, code::SEND_MESSAGE, &[], &big, Duration::from_millis(200)), listener.accept());
        assert!(matches!(first, Err(RemotingError::Timeout { .. })), "{first:?}");
        let (mut cut, _) = accepted.unwrap();
        let second = tokio::spawn({
            let addr = addr.clone();
            async move { Remoting::request(&remoting, &addr, code::GET_MAX_OFFSET, &[("topic", "t".into())], b"", Duration::from_secs(5)).await }
        });
        // The cut connection ends after its partial frame (read to the end, nothing more on it).
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), cut.read_to_end(&mut rest)).await;
        assert!(read.is_ok_and(|r| r.is_ok()), "the cut connection was closed");
        assert!(rest.len() < 4 + 4 + big.len(), "only part of the big frame was sent: {}", rest.len());
        // The next request arrives whole on a new connection.
        let (mut fresh, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await.expect("a new connection").unwrap();
        let mut length = [0u8; 4];
        fresh.read_exact(&mut length).await.unwrap();
        let mut frame = vec![0u8; u32::from_be_bytes(length) as usize];
        fresh.read_exact(&mut frame).await.unwrap();
        let (_, _, request) = decode_frame(&frame).unwrap();
        assert_eq!((request.code, request.field("topic")), (code::GET_MAX_OFFSET, Some("t")));
        drop(fresh);
        assert!(second.await.unwrap().is_err(), "the peer closed without answering");
    }

    /// Reads one request frame from a peer's side of a connection.
    async fn read_request(socket: &mut TcpStream) -> Option<Response> {
        let mut length = [0u8; 4];
        socket.read_exact(&mut length).await.ok()?;
        let mut frame = vec![0u8; u32::from_be_bytes(length) as usize];
        socket.read_exact(&mut frame).await.ok()?;
        decode_frame(&frame).ok().map(|(_, _, request)| request)
    }

    /// Issue 22 item 9: a publish whose connection closed after it was sent may be stored; sent
    /// again on a new connection it was stored twice. The peer reads each request and closes
    /// without an answer, counting what it got; it got the publish twice on the old code.
    #[tokio::test]
    async fn a_publish_sent_whole_is_not_sent_again_when_its_answer_is_lost() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peer = tokio::spawn({
            let received = received.clone();
            async move {
                loop {
                    let (mut socket, _) = listener.accept().await.unwrap();
                    if read_request(&mut socket).await.is_some() {
                        received.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        let remoting = Remoting::default();
        let publish = remoting.call(&addr, code::SEND_MESSAGE, &[("topic", "t".into())], b"event", Duration::from_secs(5)).await;
        assert!(matches!(publish, Err(RemotingError::Unanswered { .. })), "{publish:?}");
        assert_eq!(received.load(Ordering::SeqCst), 1, "the publish was sent once");
        // A read is harmless to send again, and is.
        let read = remoting.call(&addr, code::GET_MAX_OFFSET, &[("topic", "t".into())], b"", Duration::from_secs(5)).await;
        assert!(read.is_err());
        assert_eq!(received.load(Ordering::SeqCst), 3, "the read was sent twice");
        peer.abort();
    }

    /// Issue 22 item 9: a connection that went silent (a broker stopped without closing it, a
    /// half-open socket) was kept, and every later request timed out on it. The request after a
    /// timeout on a silent connection goes over a new one.
    #[tokio::test]
    async fn a_request_after_a_timeout_on_a_silent_connection_opens_a_new_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let remoting = Remoting::default();
        let (first_ext, second_ext) = ([("topic", "first".to_string())], [("topic", "second".to_string())]);
        let request = |ext| remoting.request(&addr, code::GET_MAX_OFFSET, ext, b"", Duration::from_secs(1));
        let (first, accepted) = tokio::join!(request(&first_ext), listener.accept());
        assert!(matches!(first, Err(RemotingError::Timeout { .. })), "{first:?}");
        let (mut silent, _) = accepted.unwrap();
        assert_eq!(read_request(&mut silent).await.unwrap().field("topic"), Some("first"));
        // The peer never answers on the first connection; the next request must not go there.
        let (second, accepted) = tokio::join!(request(&second_ext), tokio::time::timeout(Duration::from_secs(5), listener.accept()));
        assert!(second.is_err());
        let (mut fresh, _) = accepted.expect("the second request opened a new connection").unwrap();
        assert_eq!(read_request(&mut fresh).await.unwrap().field("topic"), Some("second"));
    }

    #[test]
    fn broken_frames_are_errors_not_panics() {
        assert!(decode_frame(&[0, 0, 0, 200, b'{']).is_err(), "header longer than the frame");
        assert!(decode_frame(&[1, 0, 0, 0]).is_err(), "binary serialize type");
        assert!(decode_frame(&[0, 0, 0, 1, b'x']).is_err(), "not JSON");
    }
}
