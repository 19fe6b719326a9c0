//! Safe to put in front of browsers (issue 20, docs/protocol.md "Exposure"): the Origin and Host
//! checks, no anonymous start off loopback, limits before any request is read, and WebSocket
//! keepalive. Every test here failed on the code before its fix (the issue note lists them).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::support::*;

/// A WebSocket handshake with extra headers: the HTTP status (101 when upgraded) and, when
/// refused, the error code of the body.
async fn handshake(addr: std::net::SocketAddr, client_id: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut request = format!("ws://{addr}/ws?client_id={client_id}").into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(name.parse::<tokio_tungstenite::tungstenite::http::HeaderName>().unwrap(), value.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((_ws, response)) => (response.status().as_u16(), String::new()),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body: Value = response.body().as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or(Value::Null);
            (response.status().as_u16(), body["error"]["code"].as_str().unwrap_or_default().to_string())
        }
        Err(e) => panic!("handshake failed without an HTTP answer: {e}"),
    }
}

/// The status and error code of a raw request (method, path, headers, body) sent as written.
async fn raw(addr: std::net::SocketAddr, head: &str, body: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let request = format!("{head}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut answer)).await.expect("answered in time").unwrap();
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body: Value = text.split_once("\r\n\r\n").and_then(|(_, b)| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, body["error"]["code"].as_str().unwrap_or_default().to_string())
}

/// The issue's scenario: with the defaults, a page on another site opened a session as alice and
/// moved her committed offsets to the log end with `from: latest`, and her own client was taken
/// over (4001, final). Now the handshake is refused before any session exists.
#[tokio::test]
async fn a_cross_site_page_cannot_open_a_session_or_skip_a_backlog() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "orders", 1, 0, 5).await;
    let mut alice = TestClient::connect(gw.addr(), "alice").await;
    alice.subscribe("orders", json!({})).await;
    let first = alice.recv_type("event").await;
    alice.ack_confirmed(&[id(&first)], "a").await;

    let evil = [("origin", "https://evil.example")];
    assert_eq!(handshake(gw.addr(), "alice", &evil).await, (403, "forbidden".into()));
    let null = [("origin", "null")];
    assert_eq!(handshake(gw.addr(), "alice", &null).await, (403, "forbidden".into()), "sandboxed frames and file:// pages send null");
    // Alice's session is untouched: no takeover, her offset where she left it.
    alice.send(json!({"op": "ping", "req": "still"})).await;
    assert_eq!(alice.recv_type("pong").await["req"], "still");
    assert_eq!(stored_offset(&gw.base, "orders", "alice", 0).await.unwrap()["committed"], 1);

    // The gateway's own pages (the console) and clients without Origin keep working.
    let own = format!("http://{}", gw.addr());
    assert_eq!(handshake(gw.addr(), "console", &[("origin", &own)]).await.0, 101);
    assert_eq!(handshake(gw.addr(), "native", &[]).await.0, 101);
    alice.close().await;
    gw.stop().await;
}

#[tokio::test]
async fn cross_site_posts_are_refused_and_listed_origins_allowed() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.allowed_origins = vec!["https://app.example".into()];
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    let host = format!("Host: {addr}");
    // A "simple" cross-site POST: text/plain needs no CORS preflight, so the browser sends it.
    let create = format!("POST /topics HTTP/1.1\r\n{host}\r\nOrigin: https://evil.example\r\nContent-Type: text/plain");
    assert_eq!(raw(addr, &create, r#"{"name":"huge","partitions":10000}"#).await, (403, "forbidden".into()));
    let publish = format!("POST /topics/t/events HTTP/1.1\r\n{host}\r\nOrigin: https://evil.example\r\nContent-Type: text/plain");
    assert_eq!(raw(addr, &publish, r#"{"payload":1}"#).await, (403, "forbidden".into()));
    let reset = format!("DELETE /admin/offsets/t/alice HTTP/1.1\r\n{host}\r\nOrigin: https://evil.example");
    assert_eq!(raw(addr, &reset, "").await, (403, "forbidden".into()));
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"], json!([]), "nothing was created");
    // A listed origin and the gateway's own origin may.
    let allowed = format!("POST /topics/t/events HTTP/1.1\r\n{host}\r\nOrigin: https://app.example\r\nContent-Type: application/json");
    assert_eq!(raw(addr, &allowed, r#"{"payload":1}"#).await.0, 200);
    let own = format!("POST /topics/t/events HTTP/1.1\r\n{host}\r\nOrigin: http://{addr}");
    assert_eq!(raw(addr, &own, r#"{"payload":2}"#).await.0, 200);
    // Reads are not Origin-checked (the browser keeps their answers from the page anyway).
    let read = format!("GET /topics HTTP/1.1\r\n{host}\r\nOrigin: https://evil.example");
    assert_eq!(raw(addr, &read, "").await.0, 200);
    gw.stop().await;
}

/// DNS rebinding: a page whose own name now resolves to 127.0.0.1 sends its own name as Host.
#[tokio::test]
async fn a_loopback_listener_refuses_foreign_host_names() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.allowed_hosts = vec!["gw.internal".into()];
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    for path in ["/admin/offsets", "/topics", "/admin/sessions"] {
        let rebound = format!("GET {path} HTTP/1.1\r\nHost: rebind.evil.example:{}", addr.port());
        assert_eq!(raw(addr, &rebound, "").await, (403, "forbidden".into()), "{path}");
    }
    assert_eq!(handshake(addr, "alice", &[("host", "rebind.evil.example")]).await, (403, "forbidden".into()));
    for host in [format!("localhost:{}", addr.port()), format!("127.0.0.1:{}", addr.port()), "gw.internal".to_string()] {
        assert_eq!(raw(addr, &format!("GET /topics HTTP/1.1\r\nHost: {host}"), "").await.0, 200, "{host}");
    }
    gw.stop().await;
}

/// Runs the binary until it exits (at most `WAIT`: one that starts serving instead of refusing is
/// killed and reported); its exit code and stderr.
fn exit_of(command: &mut Command) -> (Option<i32>, String) {
    let mut child = command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > WAIT {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!("the gateway started instead of refusing: {}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).to_string())
}

/// Off loopback without full auth, the gateway refuses to start (exit 2, naming the keys) unless
/// `auth.allow_anonymous = true`, which starts with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_without_auth_refuses_to_start() {
    let (_dir, data) = temp_dir();
    let config = data.with_extension("toml");
    std::fs::write(&config, format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = \"0.0.0.0:0\"\n", data.display().to_string())).unwrap();
    let (code, stderr) = exit_of(Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&config).env("ACKGATE_AUTH__ADMIN_TOKEN", "t0ken"));
    assert_eq!(code, Some(2));
    for key in ["auth.admin_token", "auth.jwt_secret", "auth.allow_anonymous"] {
        assert!(stderr.contains(key), "{key} named: {stderr}");
    }
    let (code, stderr) = exit_of(
        Command::new(env!("CARGO_BIN_EXE_ackgate"))
            .arg("--config")
            .arg(&config)
            .env("ACKGATE_AUTH__ADMIN_TOKEN", "t0ken")
            .env("ACKGATE_AUTH__JWT_SECRET", "short"),
    );
    assert_eq!(code, Some(2));
    assert!(stderr.contains("at least 32 bytes"), "{stderr}");
    // Issue 40, item 10: a short admin token is refused like a short JWT secret (it started).
    let (code, stderr) = exit_of(
        Command::new(env!("CARGO_BIN_EXE_ackgate"))
            .arg("--config")
            .arg(&config)
            .env("ACKGATE_AUTH__ADMIN_TOKEN", "t0ken")
            .env("ACKGATE_AUTH__JWT_SECRET", "s".repeat(32)),
    );
    assert_eq!(code, Some(2));
    assert!(stderr.contains("auth.admin_token must be at least 32 bytes"), "{stderr}");

    // Issue 40, item 7: anonymous off loopback with no Host check was open to DNS rebinding (any
    // page could act as any client); it needs server.allowed_hosts now (it started before).
    let (code, stderr) = exit_of(Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&config).env("ACKGATE_AUTH__ALLOW_ANONYMOUS", "true"));
    assert_eq!(code, Some(2));
    assert!(stderr.contains("server.allowed_hosts"), "{stderr}");

    let gw = Process::start_at(&data, "0.0.0.0:0", &[("ACKGATE_AUTH__ALLOW_ANONYMOUS", "true"), ("ACKGATE_SERVER__ALLOWED_HOSTS", r#"["gw.internal"]"#)]);
    gw.wait_for_log("auth.allow_anonymous").await;
    let port = gw.addr.port();
    let rebound = format!("GET /topics HTTP/1.1\r\nHost: rebind.evil.example:{port}");
    assert_eq!(raw(format!("127.0.0.1:{port}").parse().unwrap(), &rebound, "").await, (403, "forbidden".into()));
    let named = format!("GET /healthz HTTP/1.1\r\nHost: gw.internal:{port}");
    assert_eq!(raw(format!("127.0.0.1:{port}").parse().unwrap(), &named, "").await.0, 200);
    drop(gw);
    let gw = Process::start_at(&data, "0.0.0.0:0", &[("ACKGATE_AUTH__ALLOW_ANONYMOUS", "true"), ("ACKGATE_SERVER__ALLOWED_HOSTS", r#"["*"]"#)]);
    let any = format!("GET /healthz HTTP/1.1\r\nHost: anything.example:{}", gw.addr.port());
    assert_eq!(raw(format!("127.0.0.1:{}", gw.addr.port()).parse().unwrap(), &any, "").await.0, 200, "\"*\" said explicitly: any Host");
}

/// Reads a raw connection until the server closes it; the bytes it sent first.
async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut got)).await.expect("the server closed the connection in time").ok();
    got
}

/// Slowloris: a connection that never finishes its request head, or sits idle between requests,
/// is closed; before, `axum::serve` had no header-read timer and both stayed open forever.
#[tokio::test]
async fn slow_and_idle_connections_are_closed_before_auth() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.header_read_timeout_ms = 300;
    config.server.idle_timeout_ms = 600;
    config.auth.admin_token = "admin".into();
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    // Nothing at all.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // Half a request head, then a byte now and then (each within any per-read timeout).
    let mut dribbling = TcpStream::connect(addr).await.unwrap();
    dribbling.write_all(b"GET /topics HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    let dribble = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if dribbling.write_all(b"X-A: b\r\n").await.is_err() {
                return true;
            }
        }
        false
    });
    assert!(until_closed(&mut silent).await.is_empty());
    assert!(dribble.await.unwrap(), "a head that never ends is cut off");
    // A keep-alive connection after its answer: idle, then closed.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let started = Instant::now();
    let answer = until_closed(&mut idle).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"), "answered first");
    assert!(started.elapsed() >= Duration::from_millis(300), "kept for the idle timeout, not only the header-read one");
    // A real session outlives both: its own keepalive governs it.
    let mut session = TestClient::connect(addr, "kept").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    session.send(json!({"op": "ping", "req": 1})).await;
    assert_eq!(session.recv_type("pong").await["req"], 1);
    gw.stop().await;
}

/// `limits.max_connections` and `limits.max_connections_per_ip`: beyond them a new connection is
/// answered 503 `unavailable` or 429 `limit_exceeded` at once and closed, and counted.
#[tokio::test]
async fn connections_beyond_the_caps_are_refused_at_once() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_connections = 4;
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // The accept loop counts a connection when it takes it; give it the four first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut over = TcpStream::connect(addr).await.unwrap();
    let answer = String::from_utf8_lossy(&until_closed(&mut over).await).to_string();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains(r#""code":"unavailable""#), "{answer}");
    drop(held);
    // Their slots come back once the sockets are closed (after lingering).
    let started = Instant::now();
    while raw(addr, &format!("GET /healthz HTTP/1.1\r\nHost: {addr}"), "").await.0 != 200 {
        assert!(started.elapsed() < WAIT, "the closed connections' slots never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"ackgate_connections_refused_total{reason="capacity"}"#), "{metrics}");
    gw.stop().await;

    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_connections_per_ip = 2;
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    let _a = TestClient::connect(addr, "a").await;
    let _b = TestClient::connect(addr, "b").await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    let answer = String::from_utf8_lossy(&until_closed(&mut third).await).to_string();
    assert!(answer.starts_with("HTTP/1.1 429") && answer.contains("limit_exceeded"), "{answer}");
    drop(_a);
    drop(_b);
    gw.stop().await;
}

/// A WebSocket peer that vanished without a FIN (half-open) kept its session, its deliveries and
/// its descriptor forever. Now it is pinged, and a session that hears nothing for
/// `ws_pong_timeout_ms` ends, releasing its in-flight deliveries at once.
#[tokio::test]
async fn a_silent_websocket_peer_is_ended_and_its_deliveries_released() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.ws_ping_interval_ms = 100;
    config.server.ws_pong_timeout_ms = 800;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    // A peer that keeps reading answers the pings (tungstenite does) and stays, idle or not.
    let mut alive = TestClient::connect(gw.addr(), "alive").await;
    let mut gone = TestClient::connect(gw.addr(), "gone").await;
    gone.subscribe("t", json!({})).await;
    let first = gone.recv_type("event").await;
    assert_eq!(first["attempt"], 1);
    // From here `gone` reads nothing: no pong goes back, as from a peer that vanished.
    assert!(tokio::time::timeout(Duration::from_millis(2000), alive.recv()).await.is_err(), "pings only, no frame");
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    let clients: Vec<&str> = sessions["sessions"].as_array().unwrap().iter().map(|s| s["client_id"].as_str().unwrap()).collect();
    assert_eq!(clients, vec!["alive"], "the silent peer's session ended, the reading one stays");
    // Its delivery was released, not held for the ack timeout (30 s): it comes again at once.
    let mut back = TestClient::connect(gw.addr(), "gone").await;
    back.subscribe("t", json!({})).await;
    let again = back.recv_type("event").await;
    assert_eq!((again["offset"].as_u64(), again["attempt"].as_u64()), (Some(0), Some(2)));
    drop(gone);
    gw.stop().await;
}

/// Issue 40, item 10: a silent peer whose socket is full (it reads nothing and answers no ping)
/// held its session until `delivery.slow_client_timeout_ms` (5 minutes by default), because the
/// dead-peer check does not run while a write waits. Now a write that waits ends the session as
/// a dead peer's once the socket has taken no byte and nothing was heard for
/// `server.ws_pong_timeout_ms`. Failed before the fix: the session stood for 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_with_a_full_socket_ends_at_the_pong_timeout() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(config_for_large_writes(&data, 800)).await;
    publish_large_events(&gw.base, 120).await;
    // Subscribes, then reads nothing more: 30 MB head its way and fill both socket buffers.
    let mut silent = TestClient::connect(gw.addr(), "silent").await;
    silent.subscribe("big", json!({})).await;
    let started = Instant::now();
    wait_for("the silent peer's session to end", async || {
        let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
        sessions["sessions"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(60), "ended as a dead peer, not as a slow client");
    drop(silent);
    gw.stop().await;
}

/// The other side of the rule above, and why its first version was reverted: a client that
/// reads slowly keeps a write waiting for many pong timeouts, and its pongs wait unread behind
/// it; it must stay, because the peer takes bytes of the socket's queue now and then. (Not
/// much more often than the pong timeout: a receiver advertises no room until half its buffer
/// is free, megabytes, so at 2.5 MB/s the queue moves about once a second.) Ended after 3 s by
/// the first version, which counted only what was heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_stays_while_its_writes_wait_longer_than_the_pong_timeout() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(config_for_large_writes(&data, 3000)).await;
    publish_large_events(&gw.base, 120).await;
    let mut slow = TestClient::connect(gw.addr(), "slow").await;
    slow.subscribe("big", json!({})).await;
    // About 2.5 MB/s: each write of a batch of events waits many seconds.
    for _ in 0..80 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let frame = slow.recv().await;
        assert_eq!(frame["type"], "event", "{}", frame["type"]);
    }
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    let clients: Vec<&str> = sessions["sessions"].as_array().unwrap().iter().map(|s| s["client_id"].as_str().unwrap()).collect();
    assert_eq!(clients, vec!["slow"], "a slow reader is not a dead peer");
    drop(slow);
    gw.stop().await;
}

fn config_for_large_writes(data: &std::path::Path, pong_timeout_ms: u64) -> ackgate::config::Config {
    let mut config = test_config(data);
    config.server.ws_ping_interval_ms = 100;
    config.server.ws_pong_timeout_ms = pong_timeout_ms;
    config.delivery.slow_client_timeout_ms = 120_000;
    config
}

/// `count` events of 256 KiB on the one partition of topic `big`.
async fn publish_large_events(base: &str, count: usize) {
    let created = http().post(format!("{base}/topics")).json(&json!({"name": "big", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let text = "x".repeat(256 << 10);
    for _ in 0..count / 20 {
        let events: Vec<_> = (0..20).map(|_| json!({"payload": text})).collect();
        publish(base, "big", json!({ "events": events })).await;
    }
}

/// Nothing read from a log may stop a partition (docs/protocol.md "Exposure", Producers): an event of
/// the embedded log that cannot be decoded is dead-lettered (`undecodable`) for the subscriber and
/// the partition goes on. Failed before the fix: every read that reached it failed and was
/// retried forever, so the client received nothing past offset 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_event_is_dead_lettered_and_the_partition_goes_on() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    gw.stop().await;
    // Bits flipped on disk: the event at offset 1 no longer decodes.
    flip_bits_of_events(&data, &[1]);
    let gw = InProcess::start(test_config(&data)).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let events = client.recv_events(2).await;
    let offsets: Vec<u64> = events.iter().map(|e| e["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![0, 2], "the events around it arrive");
    assert_eq!(client.ack_confirmed(&ids(&events), "both").await["committed"], json!({"t": {"0": 3}}), "it counts as settled");
    let (_, page) = get_json(&format!("{}/admin/dead-letters?topic=t", gw.base)).await;
    let dead = &page["dead_letters"][0];
    assert_eq!((dead["offset"].as_u64(), dead["reason"].as_str(), dead["client_id"].as_str()), (Some(1), Some("undecodable"), Some("c")));
    let metrics = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("ackgate_undecodable_records_total") && !l.ends_with(" 0")), "{metrics}");
    gw.stop().await;
}

/// Overwrites the stored events at `offsets` (of the one partition there is) with bytes that do
/// not decode, as a disk that flipped bits would.
fn flip_bits_of_events(data: &std::path::Path, offsets: &[u64]) {
    let names = ["topics", "events", "partition_ends"];
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), data.join("log"), names).unwrap();
    let events = db.cf_handle("events").unwrap();
    for offset in offsets {
        let key = db
            .iterator_cf(events, rocksdb::IteratorMode::Start)
            .map(|item| item.unwrap().0)
            .find(|key| key.ends_with(&offset.to_be_bytes()))
            .expect("the event at that offset");
        db.put_cf(events, &key, [0xffu8]).unwrap();
    }
}

/// The same at both ends of a partition, which the embedded log reads at start to recover its
/// bounds and sizes, and which retention reads first: the gateway starts, the readable event
/// arrives, both others are dead-lettered, offsets go on from the old end, and a retention pass
/// runs clean. Failed before the fix: the gateway refused to start ("corrupt event").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_events_at_both_ends_of_a_partition_do_not_stop_the_start() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    gw.stop().await;
    flip_bits_of_events(&data, &[0, 2]);
    let mut config = test_config(&data);
    config.embedded.retention_check_interval_ms = 50;
    config.embedded.retention_bytes_per_partition = 1 << 20;
    let gw = InProcess::start(config).await;
    let mut client = TestClient::connect(gw.addr(), "c").await;
    client.subscribe("t", json!({})).await;
    let event = client.recv_type("event").await;
    assert_eq!(event["offset"], 1);
    client.ack_confirmed(&[id(&event)], "a").await;
    let published = publish(&gw.base, "t", json!({"partition": 0, "payload": "next"})).await;
    assert_eq!(published["offsets"][0]["offset"], 3, "offsets go on from the recovered end: {published}");
    assert_eq!(client.recv_type("event").await["offset"], 3);
    let (_, page) = get_json(&format!("{}/admin/dead-letters?topic=t", gw.base)).await;
    let dead: Vec<u64> = page["dead_letters"].as_array().unwrap().iter().map(|d| d["offset"].as_u64().unwrap()).collect();
    assert_eq!(dead, vec![0, 2], "{page}");
    // Retention passes ran meanwhile (every 50 ms) and kept everything: within its size limit.
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    assert_eq!(topics["topics"][0]["partitions"][0]["log_start"], 0, "{topics}");
    gw.stop().await;
}

/// Issue 20, item 4, as the issue measured it: at `ulimit -n 256`, 400 WebSocket clients at
/// once. Every one is answered promptly, with a session or a 503 `unavailable` refusal (none hangs
/// until its own timeout), the refusals are logged, and once they leave a new client gets in.
/// Failed before the fix: some 170 of the 400 hung with no answer and no log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_256_open_files_every_client_is_answered_or_refused() {
    let (_dir, data) = temp_dir();
    let gw = Process::start_with_open_files(&data, 256, &[]);
    let addr = gw.addr;
    let tries: Vec<_> = (0..400)
        .map(|i| {
            tokio::spawn(async move {
                let url = format!("ws://{addr}/ws?client_id=c{i}");
                match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url)).await {
                    Err(_) => Err("no answer".to_string()),
                    Ok(Ok((mut ws, _))) => {
                        use futures_util::StreamExt;
                        // The welcome frame: a session exists.
                        match tokio::time::timeout(WAIT, ws.next()).await {
                            Ok(Some(Ok(message))) if message.to_text().is_ok_and(|t| t.contains("welcome")) => Ok(Some(ws)),
                            other => Err(format!("no welcome: {other:?}")),
                        }
                    }
                    Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) if response.status() == 503 => Ok(None),
                    Ok(Err(e)) => Err(format!("{e}")),
                }
            })
        })
        .collect();
    let mut sessions = Vec::new();
    let mut refused = 0;
    for attempt in tries {
        match attempt.await.unwrap() {
            Ok(Some(ws)) => sessions.push(ws),
            Ok(None) => refused += 1,
            Err(e) => panic!("a client was neither served nor refused: {e}"),
        }
    }
    assert!(refused > 0 && sessions.len() >= 100, "{} sessions, {refused} refused", sessions.len());
    gw.wait_for_log("connection refused").await;
    drop(sessions);
    // Their slots come back: a new client is served.
    let started = std::time::Instant::now();
    loop {
        match tokio_tungstenite::connect_async(format!("ws://{addr}/ws?client_id=later")).await {
            Ok(_) => break,
            Err(e) => assert!(started.elapsed() < WAIT, "no room after the others left: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The status of `GET /sse?client_id=...&<query>` sent with `headers`; the stream is dropped.
async fn sse_status(addr: std::net::SocketAddr, client_id: &str, query: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut request = http().get(format!("http://{addr}/sse?client_id={client_id}&{query}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    if status == 200 {
        return (200, String::new());
    }
    let body: Value = response.json().await.unwrap_or(Value::Null);
    (status, body["error"]["code"].as_str().unwrap_or_default().to_string())
}

/// Issue 40, item 1: browsers send no `Origin` on a GET they make blind (`<img>`, `<iframe>`,
/// `<script>`, a navigation, a no-cors `fetch`), but they do send Fetch Metadata. Before the fix
/// each of these opened a session as alice with `from=latest` and moved her committed offset from
/// 5 to the log end (20): her backlog skipped for good. Now each is refused with 403 before a
/// session exists; EventSource, fetch and WebSocket requests of allowed pages, and clients that
/// send no Fetch Metadata (curl, servers), keep working.
#[tokio::test]
async fn requests_a_page_makes_blind_cannot_open_a_session_or_move_an_offset() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.allowed_origins = vec!["https://app.example".into()];
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    publish_numbered(&gw.base, "orders", 1, 0, 20).await;
    let mut alice = TestClient::connect(addr, "alice").await;
    alice.subscribe("orders", json!({})).await;
    let events = alice.recv_events(5).await;
    alice.ack_confirmed(&ids(&events), "a").await;
    alice.close().await;
    assert_eq!(stored_offset(&gw.base, "orders", "alice", 0).await.unwrap()["committed"], 5);

    let skip = "topics=orders&from=latest";
    let blind: [(&str, &[(&str, &str)]); 6] = [
        ("<img> on another site", &[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors"), ("sec-fetch-dest", "image")]),
        ("no-cors fetch on another site", &[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "no-cors"), ("sec-fetch-dest", "empty")]),
        ("<iframe> on a sibling subdomain", &[("sec-fetch-site", "same-site"), ("sec-fetch-mode", "navigate"), ("sec-fetch-dest", "iframe")]),
        ("<script> on the gateway's own origin", &[("sec-fetch-site", "same-origin"), ("sec-fetch-mode", "no-cors"), ("sec-fetch-dest", "script")]),
        ("a navigation typed or followed", &[("sec-fetch-site", "none"), ("sec-fetch-mode", "navigate"), ("sec-fetch-dest", "document")]),
        (
            "a CORS fetch of a foreign origin",
            &[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "cors"), ("sec-fetch-dest", "empty"), ("origin", "https://evil.example")],
        ),
    ];
    for (what, headers) in blind {
        assert_eq!(sse_status(addr, "alice", skip, headers).await, (403, "forbidden".into()), "{what}");
        assert_eq!(handshake(addr, "alice", headers).await, (403, "forbidden".into()), "{what}, /ws");
    }
    // A blind cross-site POST is refused too, whatever it carries.
    let publish =
        format!("POST /topics/orders/events HTTP/1.1\r\nHost: {addr}\r\nSec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\nContent-Type: text/plain");
    assert_eq!(raw(addr, &publish, r#"{"payload":1}"#).await, (403, "forbidden".into()));
    assert_eq!(stored_offset(&gw.base, "orders", "alice", 0).await.unwrap()["committed"], 5, "nothing moved alice's offset");
    let (_, sessions) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    assert_eq!(sessions["sessions"], json!([]), "no session was opened");

    // What real clients send keeps working: EventSource on the gateway's own page, on an allowed
    // origin (CORS: it carries Origin), WebSocket from an allowed page, and no Fetch Metadata.
    let own = format!("http://{addr}");
    let event_source = [("sec-fetch-site", "same-origin"), ("sec-fetch-mode", "cors"), ("sec-fetch-dest", "empty")];
    assert_eq!(sse_status(addr, "own-page", "topics=orders", &event_source).await.0, 200);
    let cors = [("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "cors"), ("sec-fetch-dest", "empty"), ("origin", "https://app.example")];
    assert_eq!(sse_status(addr, "app-page", "topics=orders", &cors).await.0, 200);
    let socket = [("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "websocket"), ("sec-fetch-dest", "websocket"), ("origin", "https://app.example")];
    assert_eq!(handshake(addr, "app-socket", &socket).await.0, 101);
    let same_origin_socket = [("sec-fetch-site", "same-origin"), ("sec-fetch-mode", "websocket"), ("sec-fetch-dest", "empty"), ("origin", own.as_str())];
    assert_eq!(handshake(addr, "own-socket", &same_origin_socket).await.0, 101);
    assert_eq!(sse_status(addr, "curl", "topics=orders", &[]).await.0, 200);
    let own_publish =
        format!("POST /topics/orders/events HTTP/1.1\r\nHost: {addr}\r\nSec-Fetch-Site: same-origin\r\nOrigin: {own}\r\nContent-Type: application/json");
    assert_eq!(raw(addr, &own_publish, r#"{"payload":1}"#).await.0, 200);
    gw.stop().await;
}

/// Issue 40, item 2: slowloris on the body. With both auth keys set, connections that send a head
/// announcing 16,000,000 bytes and then trickle the body held their slot for as long as they
/// liked (the header-read timer stops at the head), and `POST /sse/{id}/frames` read up to 16 MiB
/// before it looked up the session. Now a body must arrive whole within
/// `server.body_read_timeout_ms` of its head (the connection is closed otherwise), and the frames
/// route answers 404 for a session that is not there before it reads a byte of the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_holds_no_slot_and_frames_are_refused_before_their_body_is_read() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.admin_token = "a".repeat(32);
    config.auth.jwt_secret = "s".repeat(32);
    config.limits.max_connections = 16;
    config.server.header_read_timeout_ms = 1000;
    config.server.idle_timeout_ms = 2000;
    config.server.body_read_timeout_ms = 1000;
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    let admin = format!("Authorization: Bearer {}", "a".repeat(32));
    let heads = [
        format!("POST /topics/t/events HTTP/1.1\r\nHost: {addr}\r\n{admin}\r\nContent-Type: application/json\r\nContent-Length: 16000000\r\n\r\n"),
        format!("POST /admin/dead-letters/redrive HTTP/1.1\r\nHost: {addr}\r\n{admin}\r\nContent-Length: 16000000\r\n\r\n"),
    ];
    let mut slow = Vec::new();
    for i in 0..12 {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(heads[i % 2].as_bytes()).await.unwrap();
        tcp.write_all(&vec![b' '; 64 * 1024]).await.unwrap();
        slow.push(tcp);
    }
    // Each keeps trickling a byte every 200 ms; it is cut off, not served for ever.
    let trickles: Vec<_> = slow
        .into_iter()
        .map(|mut tcp| {
            tokio::spawn(async move {
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if tcp.write_all(b" ").await.is_err() {
                        return true;
                    }
                    let mut byte = [0u8; 1];
                    if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), tcp.read(&mut byte)).await {
                        return true;
                    }
                }
                false
            })
        })
        .collect();
    for trickle in trickles {
        assert!(trickle.await.unwrap(), "a body that never ends is cut off");
    }
    // Their slots came back.
    assert_eq!(raw(addr, &format!("GET /healthz HTTP/1.1\r\nHost: {addr}"), "").await.0, 200);

    gw.stop().await;

    // The frames route (default body timer): no such session, so 404 at once, with 16 MB
    // announced and none sent. Before, it waited for the whole body.
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let addr = gw.addr();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("POST /sse/s1-0/frames HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 16000000\r\n\r\n").as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(WAIT, tcp.read(&mut answer)).await.expect("answered without the body").unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 404"), "{}", String::from_utf8_lossy(&answer[..n]));
    gw.stop().await;
}

/// Issue 40, item 6: subscribes were unlimited, each re-planning every partition (bounds, store
/// reads, a write): an SSE URL naming a topic a thousand times re-subscribed it a thousand times
/// per GET. Now `topics=` names each topic once and a session may subscribe
/// `limits.max_subscribes_per_sec` times a second (an error `limit_exceeded` past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribes_are_limited_per_second_and_sse_topics_named_once() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.limits.max_subscribes_per_sec = 5;
    config.limits.max_subscriptions_per_session = 5;
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "t", 1, 0, 1).await;
    let topics = vec!["t"; 1000].join(",");
    let mut sse = TestClient::connect_sse(gw.addr(), "repeats", &format!("topics={topics}"), &[]).await;
    // Every frame up to the first event: one `subscribed` (a thousand before).
    let mut before_event = Vec::new();
    loop {
        let frame = sse.recv().await;
        if frame["type"] == "event" {
            break;
        }
        before_event.push(frame["type"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(before_event.len(), 1, "frames before the first event: {:?}...", &before_event[..before_event.len().min(3)]);
    assert_eq!(before_event[0], "subscribed");
    sse.expect_silence(Duration::from_millis(500)).await;
    sse.close().await;

    let mut ws = TestClient::connect(gw.addr(), "eager").await;
    for n in 0..8 {
        ws.send(json!({"op": "subscribe", "topic": "t", "req": n})).await;
    }
    let mut answers = Vec::new();
    while answers.len() < 8 {
        let frame = ws.recv().await;
        if frame["req"].is_number() {
            answers.push(frame["type"].as_str().unwrap().to_string() + ":" + frame["code"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(answers.iter().filter(|a| *a == "subscribed:").count(), 5, "{answers:?}");
    assert_eq!(answers.iter().filter(|a| *a == "error:limit_exceeded").count(), 3, "{answers:?}");
    gw.stop().await;
}

/// Issue 40, item 10: every refused request wrote a log line (its path too, as the caller wrote
/// it), so anyone could fill the log and pay it a write per request. Now a refused request's line
/// is written at most once a second per status and route, and the next line says how many were
/// left out; a refusal by the Origin check likewise. Failed before the fix: 201 lines for 201
/// requests, none with `suppressed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_logged_once_a_second_with_the_count_left_out() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    let client = http();
    for n in 0..200 {
        let response = client.get(format!("{}/nope-{n}", gw.base)).send().await.unwrap();
        assert_eq!(response.status(), 404);
        let foreign = client.post(format!("{}/topics/t/events", gw.base)).header("origin", "https://evil.example").body("{}").send().await.unwrap();
        assert_eq!(foreign.status(), 403);
    }
    // A second later the next refusal is logged, with the count of those left out before it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(client.get(format!("{}/nope-last", gw.base)).send().await.unwrap().status(), 404);
    let lines = gw.wait_for_log("/nope-last").await;
    assert!(lines.contains("suppressed="), "{lines}");
    let logs = gw.logs.lock().unwrap().clone();
    let suppressed = |line: &String| line.split("suppressed=").nth(1).and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok());
    let not_found: Vec<&String> = logs.iter().filter(|l| l.contains("http request") && l.contains("status=404")).collect();
    assert!(not_found.len() <= 10, "{} lines for 201 refused requests", not_found.len());
    let counted: u64 = not_found.iter().map(|l| suppressed(l).expect("each line says how many it stands for") + 1).sum();
    assert_eq!(counted, 201, "every refused request is logged or counted: {not_found:?}");
    let origin_lines = logs.iter().filter(|l| l.contains("refused by the Origin")).count();
    assert!((1..=10).contains(&origin_lines), "{origin_lines} lines for 200 refusals by the Origin check");
}

/// Issue 40, item 10: every successful request wrote a line at info, so a publisher or a page
/// polling `GET /topics` filled the log at its own rate. Now a success is logged at info only
/// when it is an operator's change (the audit trail: resets, removals, redrives, drains, topics
/// created or deleted); reads and publishes go to debug. Failed before the fix: 41 lines at info
/// (the 20 publishes, the 20 reads and the reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successful_reads_and_publishes_are_logged_at_debug_and_operator_changes_at_info() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    let client = http();
    for n in 0..20 {
        let published = client.post(format!("{}/topics/quiet/events", gw.base)).json(&json!({"payload": {"n": n}})).send().await.unwrap();
        assert_eq!(published.status(), 200);
        assert_eq!(client.get(format!("{}/topics", gw.base)).send().await.unwrap().status(), 200);
    }
    assert_eq!(put_offset(&gw.base, "quiet", "auditor", 0, json!(3)).await, 200);
    gw.wait_for_log("/admin/offsets/quiet/auditor/0").await;
    let logs = gw.logs.lock().unwrap().clone();
    let success_lines: Vec<&String> = logs.iter().filter(|l| l.contains("http request") && l.contains("status=200")).collect();
    assert_eq!(success_lines.len(), 1, "only the operator's reset is logged: {success_lines:?}");
    assert!(success_lines[0].contains("PUT"), "{}", success_lines[0]);
}
