//! RFC 6455 at the gateway's socket, byte by byte: a raw TCP client does the handshake and
//! sends frames no WebSocket library would (split characters, control frames between
//! fragments, unmasked and reserved-bit frames), then reads the gateway's frames as bytes.
//! tungstenite's client (every other test), Chromium (`browser`) and the JS client's tests
//! cover the well-formed side.

use std::ops::Not;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CONTINUATION: u8 = 0x0;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// A client frame: `fin`, the opcode, masked with a fixed key unless `masked` is false.
fn frame(fin: bool, opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut out = vec![if fin { 0x80 | opcode } else { opcode }];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        len @ 0..=125 => out.push(mask_bit | len as u8),
        len @ 126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend((len as u16).to_be_bytes());
        }
        len => {
            out.push(mask_bit | 127);
            out.extend((len as u64).to_be_bytes());
        }
    }
    if !masked {
        out.extend_from_slice(payload);
        return out;
    }
    let key = [0x12, 0x9A, 0x5C, 0xE3];
    out.extend(key);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    out
}

fn masked(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame(fin, opcode, payload, true)
}

/// A WebSocket spoken by hand.
struct RawSocket {
    tcp: TcpStream,
    read: Vec<u8>,
}

/// What the gateway sent: one frame, or the end of the connection.
#[derive(Debug, PartialEq)]
enum ServerFrame {
    Text(Value),
    Pong(Vec<u8>),
    Ping,
    Close(Option<u16>),
    Ended,
}

impl RawSocket {
    /// Handshake with RFC 6455's sample key; checks the 101 and its accept key, then reads the
    /// `welcome`.
    async fn connect(addr: std::net::SocketAddr, client_id: &str) -> Self {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        // Byte-sized writes leave as byte-sized segments.
        tcp.set_nodelay(true).unwrap();
        let request = format!(
            "GET /ws?client_id={client_id} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut socket = Self { tcp, read: Vec::new() };
        let head = socket.read_head().await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(head.to_ascii_lowercase().contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="), "{head}");
        match socket.next().await {
            ServerFrame::Text(welcome) => assert_eq!(welcome["type"], "welcome"),
            other => panic!("expected the welcome, got {other:?}"),
        }
        socket
    }

    async fn read_head(&mut self) -> String {
        loop {
            if let Some(end) = self.read.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.read[..end]).into_owned();
                self.read.drain(..end + 4);
                return head;
            }
            self.fill().await.expect("the handshake's answer");
        }
    }

    async fn fill(&mut self) -> Option<()> {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(WAIT, self.tcp.read(&mut chunk)).await.expect("the gateway answers in time") {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                self.read.extend_from_slice(&chunk[..n]);
                Some(())
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.unwrap();
    }

    /// The next frame from the gateway (server frames are never masked).
    async fn next(&mut self) -> ServerFrame {
        loop {
            if self.read.len() >= 2 {
                assert_eq!(self.read[1] & 0x80, 0, "a server frame is never masked");
                assert_eq!(self.read[0] & 0x70, 0, "no reserved bits");
                let (len, at) = match self.read[1] & 0x7F {
                    126 if self.read.len() >= 4 => (u16::from_be_bytes([self.read[2], self.read[3]]) as usize, 4),
                    127 if self.read.len() >= 10 => (u64::from_be_bytes(self.read[2..10].try_into().unwrap()) as usize, 10),
                    126 | 127 => (usize::MAX, 0),
                    len => (len as usize, 2),
                };
                if len != usize::MAX && self.read.len() >= at + len {
                    assert_ne!(self.read[0] & 0x80, 0, "the gateway sends whole frames");
                    let opcode = self.read[0] & 0x0F;
                    let payload: Vec<u8> = self.read.drain(..at + len).skip(at).collect();
                    return match opcode {
                        TEXT => ServerFrame::Text(serde_json::from_slice(&payload).expect("JSON text")),
                        PONG => ServerFrame::Pong(payload),
                        PING => ServerFrame::Ping,
                        CLOSE => ServerFrame::Close(payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]]))),
                        other => panic!("opcode {other}"),
                    };
                }
            }
            if self.fill().await.is_none() {
                return ServerFrame::Ended;
            }
        }
    }

    /// The close the gateway sends, skipping other frames; then the connection must end.
    async fn close_code(&mut self) -> Option<u16> {
        loop {
            match self.next().await {
                ServerFrame::Close(code) => {
                    let after = self.next().await;
                    assert_eq!(after, ServerFrame::Ended, "nothing after the close frame");
                    return code;
                }
                ServerFrame::Ended => panic!("the connection ended without a close frame"),
                _ => continue,
            }
        }
    }
}

/// A `ping` op, its text cut into fragments between the two bytes of "é", with a WebSocket ping
/// and an empty fragment between them: one message, the ping answered with its payload first.
#[tokio::test]
async fn fragments_with_a_split_character_and_a_ping_between_them_are_one_message() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let mut ws = RawSocket::connect(gw.addr(), "fragments").await;
    let text = r#"{"op":"ping","req":"café ✓"}"#.as_bytes();
    let split = text.iter().position(|b| *b == 0xC3).unwrap() + 1;
    let mut bytes = masked(false, TEXT, &text[..split]);
    bytes.extend(masked(true, PING, b"between"));
    bytes.extend(masked(false, CONTINUATION, b""));
    bytes.extend(masked(true, CONTINUATION, &text[split..]));
    // Sent one byte at a time: every frame straddles reads.
    for byte in bytes {
        ws.send(&[byte]).await;
    }
    assert_eq!(ws.next().await, ServerFrame::Pong(b"between".to_vec()));
    assert_eq!(ws.next().await, ServerFrame::Text(json!({"type": "pong", "req": "café ✓"})));
    // Several whole frames in one write are read in order.
    let mut bytes = masked(true, TEXT, br#"{"op":"ping","req":1}"#);
    bytes.extend(masked(true, PING, b""));
    bytes.extend(masked(true, TEXT, br#"{"op":"ping","req":2}"#));
    ws.send(&bytes).await;
    // The WebSocket pong is written as soon as its ping is read; the session's answers follow
    // in the order of their frames.
    let mut frames = Vec::new();
    for _ in 0..3 {
        frames.push(ws.next().await);
    }
    assert!(frames.contains(&ServerFrame::Pong(Vec::new())), "{frames:?}");
    frames.retain(|f| *f != ServerFrame::Pong(Vec::new()));
    assert_eq!(frames, [ServerFrame::Text(json!({"type": "pong", "req": 1})), ServerFrame::Text(json!({"type": "pong", "req": 2}))]);
    gw.stop().await;
}

/// Zero-length text and binary frames are messages like any other: the session says what is
/// wrong with them and stays open.
#[tokio::test]
async fn zero_length_and_binary_frames_get_bad_frame_and_the_session_stays_open() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let mut ws = RawSocket::connect(gw.addr(), "empty").await;
    for bytes in [masked(true, TEXT, b""), masked(true, BINARY, b""), [masked(false, BINARY, &[1]), masked(true, CONTINUATION, &[2])].concat()] {
        ws.send(&bytes).await;
        match ws.next().await {
            ServerFrame::Text(error) => assert_eq!((&error["type"], &error["code"]), (&json!("error"), &json!("bad_frame")), "{error}"),
            other => panic!("expected an error frame, got {other:?}"),
        }
    }
    ws.send(&masked(true, TEXT, br#"{"op":"ping"}"#)).await;
    assert_eq!(ws.next().await, ServerFrame::Text(json!({"type": "pong"})));
    gw.stop().await;
}

/// A client's close is answered with its own code (or an empty close), then the connection
/// ends; the client counts as offline.
#[tokio::test]
async fn a_clients_close_is_echoed_with_and_without_a_code() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    for (payload, expected) in
        [(4321u16.to_be_bytes().to_vec(), Some(4321)), (Vec::new(), None), ([1000u16.to_be_bytes().as_slice(), "bye ✓".as_bytes()].concat(), Some(1000))]
    {
        let mut ws = RawSocket::connect(gw.addr(), "closer").await;
        ws.send(&masked(true, CLOSE, &payload)).await;
        assert_eq!(ws.close_code().await, expected);
    }
    wait_for("the client is offline", async || get_json(&format!("{}/admin/sessions", gw.base)).await.1.to_string().contains("closer").not()).await;
    gw.stop().await;
}

/// What breaks the protocol closes the connection with 1002; text that is not UTF-8 (also when
/// only the whole of its fragments shows it) with 1007.
#[tokio::test]
async fn protocol_errors_close_with_1002_and_text_that_is_not_utf8_with_1007() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let mut reserved = masked(true, TEXT, b"{}");
    reserved[0] |= 0x40;
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("an unmasked frame", frame(true, TEXT, br#"{"op":"ping"}"#, false), 1002),
        ("a reserved bit", reserved, 1002),
        ("a reserved opcode", masked(true, 0x3, b""), 1002),
        ("a continuation with nothing to continue", masked(true, CONTINUATION, b"{}"), 1002),
        ("a new message among fragments", [masked(false, TEXT, b"{"), masked(true, TEXT, b"}")].concat(), 1002),
        ("a fragmented ping", masked(false, PING, b""), 1002),
        ("a ping over 125 bytes", masked(true, PING, &[7; 126]), 1002),
        ("a close code that may not be sent", masked(true, CLOSE, &1006u16.to_be_bytes()), 1002),
        ("text that is not UTF-8", masked(true, TEXT, &[b'"', 0xFF, b'"']), 1007),
        ("fragments that are not UTF-8 together", [masked(false, TEXT, &[0xE2, 0x9C]), masked(true, CONTINUATION, b"x")].concat(), 1007),
    ];
    let broken = cases.len() as f64;
    for (name, bytes, code) in cases {
        let mut ws = RawSocket::connect(gw.addr(), "breaker").await;
        ws.send(&bytes).await;
        assert_eq!(ws.close_code().await, Some(code), "{name}");
    }
    let ended = r#"ackgate_sessions_ended_total{reason="protocol_error"}"#;
    // At least: the metrics of every gateway in this test process are one registry.
    wait_for("every broken session is counted", async || metric(&gw.base, ended).await >= broken).await;
    gw.stop().await;
}

/// A frame whose header alone announces more than the limit is answered with 1009 before its
/// payload comes; absurd lengths (2^63 - 1, 2^64 - 1) never allocate or overflow.
#[tokio::test]
async fn an_announced_length_over_the_limit_is_1009_at_once() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_frame_bytes = 1024;
    let gw = InProcess::start(config).await;
    for (len, code) in [(1025u64, 1009), ((1 << 63) - 1, 1009), (u64::MAX, 1002)] {
        let mut ws = RawSocket::connect(gw.addr(), "huge").await;
        let mut header = vec![0x81, 0x80 | 127];
        header.extend(len.to_be_bytes());
        header.extend([1, 2, 3, 4]);
        ws.send(&header).await;
        assert_eq!(ws.close_code().await, Some(code), "{len}");
    }
    // At the limit is fine.
    let mut ws = RawSocket::connect(gw.addr(), "huge").await;
    let text = format!(r#"{{"op":"ping","req":"{}"}}"#, "x".repeat(1024 - 22));
    assert_eq!(text.len(), 1024);
    ws.send(&masked(true, TEXT, text.as_bytes())).await;
    match ws.next().await {
        ServerFrame::Text(pong) => assert_eq!(pong["type"], "pong"),
        other => panic!("{other:?}"),
    }
    gw.stop().await;
}

/// Requests to `/ws` that are no WebSocket handshake get 400 with the error body, not a session.
#[tokio::test]
async fn a_request_that_is_no_websocket_handshake_gets_400() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let url = format!("{}/ws?client_id=plain", gw.base);
    let upgrade = [("Connection", "upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")];
    let key = ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("Connection", "keep-alive"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"), key],
        vec![("Connection", "upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "8"), key],
        upgrade.to_vec(),
        [&upgrade[..], &[("Sec-WebSocket-Key", "c2hvcnQ=")]].concat(),
        [&upgrade[..], &[("Sec-WebSocket-Key", "not base64 at all!")]].concat(),
        [&upgrade[..], &[key, ("Sec-WebSocket-Key", "AAAAAAAAAAAAAAAAAAAAAA==")]].concat(),
    ];
    for headers in cases {
        let mut request = http().get(&url);
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 400, "{headers:?}");
        let wrong_version = headers.contains(&("Sec-WebSocket-Version", "8"));
        assert_eq!(response.headers().get("sec-websocket-version").is_some(), wrong_version, "the versions it speaks: {headers:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "bad_request", "{headers:?}");
    }
    // A HEAD (which axum routes with GET) is no handshake either.
    let mut head = http().head(&url);
    for (name, value) in [&upgrade[..], &[key]].concat() {
        head = head.header(name, value);
    }
    assert_eq!(head.send().await.unwrap().status(), 405);
    gw.stop().await;
}

/// A client that pings and never reads cannot make the gateway queue pongs without end: once the
/// socket refuses them, the gateway stops reading, so the client's own writes stop. When it reads
/// again, every pong comes, in order, with its ping's payload.
#[tokio::test]
async fn a_client_that_pings_and_never_reads_is_stopped_and_then_answered_in_order() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let mut ws = RawSocket::connect(gw.addr(), "pinger").await;
    // 120-byte payloads (126-byte frames); unbounded, 1 GiB of them would be read and answered.
    let mut sent: u64 = 0;
    let stopped = loop {
        let mut payload = [0u8; 120];
        payload[..8].copy_from_slice(&sent.to_be_bytes());
        let frame = masked(true, PING, &payload);
        match tokio::time::timeout(Duration::from_secs(2), ws.tcp.write_all(&frame)).await {
            Ok(written) => written.unwrap(),
            // The gateway read nothing more for 2 s: stopped.
            Err(_) => break true,
        }
        sent += 1;
        if sent * 126 > 1 << 30 {
            break false;
        }
    };
    assert!(stopped, "the gateway kept reading pings whose pongs nobody took ({sent} pings)");
    // The last frame may be cut: its pong may never come. Every one before it does, in order.
    for expected in 0..sent {
        match ws.next().await {
            ServerFrame::Pong(payload) => assert_eq!(payload[..8], expected.to_be_bytes(), "pong {expected} of {sent}"),
            other => panic!("pong {expected} of {sent}: {other:?}"),
        }
    }
    gw.stop().await;
}

/// Python's `websockets` (tests/websocket/python_client.py), an implementation that shares no
/// code with tungstenite: fragments, a ping with a payload, an extension offered and not
/// negotiated, events consumed and acked, a close code echoed.
#[tokio::test]
async fn pythons_websockets_client_speaks_to_the_gateway() {
    let venv =
        std::env::var_os("ACKGATE_DEV_SCHEMATHESIS_VENV").map(std::path::PathBuf::from).unwrap_or_else(|| "/root/.cache/ackgate/venv-schemathesis".into());
    let python = venv.join("bin/python3");
    assert!(python.exists(), "{} is missing: run scripts/schemathesis install", python.display());
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "py", 1, 0, 3).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/websocket/python_client.py");
    let output = tokio::process::Command::new(&python).arg(script).arg(format!("ws://{}", gw.addr())).arg("py").output();
    let output = tokio::time::timeout(Duration::from_secs(60), output).await.expect("the Python client ends in time").unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.contains("python client: ok"), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stored_offset(&gw.base, "py", "python", 0).await.expect("python's offset")["committed"], 3, "the acks were committed");
    gw.stop().await;
}
