//! ackgate behind a real reverse proxy (issue 42): Debian's nginx, running the shipped
//! `deploy/nginx/ackgate.conf` (its names, ports and paths replaced), ends TLS in front of the
//! real binary configured as docs/deployment.md says (`public_url` the proxy's, `trusted_proxies`
//! nginx's address). Through the proxy: the console loads in headless Chromium and acks; a wss://
//! session receives and acks; an SSE stream gets its events as they come (unbuffered); a foreign
//! Origin is refused; `/admin/sessions` names the client's own address; and the per-IP limit
//! counts clients by the address nginx names (clients connect from 127.0.0.2, .3, ... so each
//! has its own), not nginx's.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::ServerName;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;
use crate::tls::{trusting, write_certificate};

/// nginx in the foreground on `port`, proxying to `upstream`, with the shipped server block.
struct Nginx(Child);

impl Nginx {
    fn start(dir: &Path, port: u16, upstream: SocketAddr) -> Self {
        let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx/ackgate.conf")).unwrap();
        let path = |name: &str| dir.join(name).display().to_string();
        let server = shipped
            .replace("server 127.0.0.1:8080;", &format!("server {upstream};"))
            .replace("listen 443 ssl;", &format!("listen 127.0.0.1:{port} ssl;"))
            .replace("server_name gw.example.com;", "server_name localhost;")
            .replace("/etc/ssl/ackgate/cert.pem", &path("cert.pem"))
            .replace("/etc/ssl/ackgate/key.pem", &path("key.pem"));
        assert!(server.contains(&upstream.to_string()) && server.contains(&path("cert.pem")), "the shipped file changed shape:\n{server}");
        let temp = |name: &str| format!("{name}_temp_path {};", path(name));
        let config = format!(
            "daemon off;\nmaster_process off;\npid {};\nerror_log {} info;\nevents {{ worker_connections 512; }}\nhttp {{\naccess_log {};\n{}\n{}\n{}\n{}\n{}\n{server}\n}}\n",
            path("nginx.pid"),
            path("error.log"),
            path("access.log"),
            temp("client_body"),
            temp("proxy"),
            temp("fastcgi"),
            temp("uwsgi"),
            temp("scgi"),
        );
        std::fs::write(dir.join("nginx.conf"), config).unwrap();
        let nginx = Command::new("/usr/sbin/nginx")
            .args(["-p", &dir.display().to_string(), "-e", &path("error.log"), "-c", &path("nginx.conf")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nginx runs (scripts/prereqs installs it)");
        Self(nginx)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TLS connection to the proxy from the local address `from` (any of 127.0.0.0/8).
async fn connect_from(from: &str, proxy: SocketAddr, tls: &TlsConnector) -> std::io::Result<TlsStream<TcpStream>> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))?;
    let tcp = socket.connect(proxy).await?;
    tls.connect(ServerName::try_from("localhost").unwrap(), tcp).await
}

/// One request over its own connection from `from`: (status, body).
async fn request(from: &str, proxy: SocketAddr, tls: &TlsConnector, head: &str, body: Option<Value>) -> (u16, String) {
    let mut stream = connect_from(from, proxy, tls).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let text = format!(
        "{head}\r\nHost: localhost:{}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        proxy.port(),
        body.len()
    );
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut answer)).await.expect("answered in time");
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// A WebSocket through the proxy from `from`, with an Origin: the handshake's status (101 when
/// upgraded) and the socket.
async fn websocket(
    from: &str,
    proxy: SocketAddr,
    tls: &TlsConnector,
    client_id: &str,
    origin: &str,
) -> (u16, Option<tokio_tungstenite::WebSocketStream<TlsStream<TcpStream>>>) {
    let stream = connect_from(from, proxy, tls).await.unwrap();
    let mut handshake = format!("wss://localhost:{}/ws?client_id={client_id}", proxy.port()).into_client_request().unwrap();
    handshake.headers_mut().insert("origin", origin.parse().unwrap());
    match tokio_tungstenite::client_async(handshake, stream).await {
        Ok((ws, response)) => (response.status().as_u16(), Some(ws)),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => (response.status().as_u16(), None),
        Err(e) => panic!("handshake through the proxy failed without an answer: {e}"),
    }
}

async fn next_frame(ws: &mut tokio_tungstenite::WebSocketStream<TlsStream<TcpStream>>, kind: &str) -> Value {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("a frame in time") {
            Some(Ok(Message::Text(text))) => {
                let frame: Value = serde_json::from_str(text.as_str()).unwrap();
                if frame["type"] == kind {
                    return frame;
                }
            }
            Some(Ok(_)) => continue,
            other => panic!("expected a {kind} frame, got {other:?}"),
        }
    }
}

/// Reads an SSE stream's lines until one contains `wanted`.
async fn read_until(lines: &mut tokio::io::Lines<tokio::io::BufReader<TlsStream<TcpStream>>>, wanted: &str) {
    loop {
        let line = tokio::time::timeout(WAIT, lines.next_line()).await.expect("the stream goes on").unwrap().expect("the stream is open");
        if line.contains(wanted) {
            return;
        }
    }
}

/// Sessions one client address may hold here: above the connections a browser opens at once to
/// one host (6, and the console's WebSocket), so the console's page is never refused.
const PER_IP: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_with_tls_pages_sessions_and_limits_see_the_real_client() {
    let (dir, data) = temp_dir();
    let certificate = write_certificate(dir.path());
    let tls = trusting(&certificate);
    let (gateway_port, proxy_port) = (free_port(), free_port());
    let public_url = format!("https://localhost:{proxy_port}");
    let gw = Process::start_at(
        &data,
        &format!("127.0.0.1:{gateway_port}"),
        &[
            ("ACKGATE_SERVER__PUBLIC_URL", public_url.as_str()),
            ("ACKGATE_SERVER__TRUSTED_PROXIES", r#"["127.0.0.1"]"#),
            ("ACKGATE_LIMITS__MAX_CONNECTIONS_PER_IP", &PER_IP.to_string()),
        ],
    );
    let _nginx = Nginx::start(dir.path(), proxy_port, gw.addr);
    let proxy: SocketAddr = format!("127.0.0.1:{proxy_port}").parse().unwrap();
    // nginx is up once it answers through to the gateway.
    let mut up = false;
    for _ in 0..100 {
        if connect_from("127.0.0.9", proxy, &tls).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(up, "nginx did not start: {}", std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default());
    assert_eq!(request("127.0.0.9", proxy, &tls, "GET /healthz HTTP/1.1", None).await.0, 200);
    for topic in ["proxied", "web"] {
        let (status, body) = request("127.0.0.9", proxy, &tls, "POST /topics HTTP/1.1", Some(json!({"name": topic, "partitions": 1}))).await;
        assert_eq!(status, 200, "{body}");
    }
    let (_, body) = request("127.0.0.9", proxy, &tls, "GET /session/recommend?client_id=a HTTP/1.1", None).await;
    let recommended: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(recommended["ws_url"], format!("wss://localhost:{proxy_port}/ws"), "{recommended}");

    // A wss:// session from the gateway's own (proxied) page receives and acknowledges.
    let (status, ws) = websocket("127.0.0.2", proxy, &tls, "proxied-1", &public_url).await;
    assert_eq!(status, 101, "the page served through the proxy is the gateway's own origin");
    let mut ws = ws.unwrap();
    next_frame(&mut ws, "welcome").await;
    ws.send(Message::Text(json!({"op": "subscribe", "topic": "proxied", "req": "s"}).to_string().into())).await.unwrap();
    next_frame(&mut ws, "subscribed").await;
    let (status, _) = request("127.0.0.9", proxy, &tls, "POST /topics/proxied/events HTTP/1.1", Some(json!({"payload": {"n": 0}}))).await;
    assert_eq!(status, 200);
    let event = next_frame(&mut ws, "event").await;
    ws.send(Message::Text(json!({"op": "ack", "delivery_id": event["delivery_id"], "req": "a"}).to_string().into())).await.unwrap();
    assert_eq!(next_frame(&mut ws, "ack_ok").await["committed"]["proxied"]["0"], 1);

    // A page of another origin is refused through the proxy too.
    assert_eq!(websocket("127.0.0.4", proxy, &tls, "evil", "https://evil.example").await.0, 403);

    // The session is listed with the client's address, not nginx's.
    let (_, body) = request("127.0.0.9", proxy, &tls, "GET /admin/sessions HTTP/1.1", None).await;
    let sessions: Value = serde_json::from_str(&body).unwrap();
    let row = sessions["sessions"].as_array().unwrap().iter().find(|s| s["client_id"] == "proxied-1").cloned().expect("the session is listed");
    assert!(row["remote_addr"].as_str().unwrap().starts_with("127.0.0.2:"), "{row}");

    // Per IP: 127.0.0.2 holds one session; it may open more up to the limit, the next is
    // refused, while another address behind the same proxy still gets in.
    let mut more = Vec::new();
    for n in 2..=PER_IP {
        let (status, ws) = websocket("127.0.0.2", proxy, &tls, &format!("proxied-{n}"), &public_url).await;
        assert_eq!(status, 101, "session {n} of the client");
        more.push(ws);
    }
    assert_eq!(websocket("127.0.0.2", proxy, &tls, "proxied-over", &public_url).await.0, 429, "one over the client's limit");
    let (status, other) = websocket("127.0.0.3", proxy, &tls, "proxied-other", &public_url).await;
    assert_eq!(status, 101, "another client behind the same proxy has its own count");
    drop(more);
    drop(other);

    // SSE through the proxy: events arrive as published (nginx must not buffer them).
    let mut sse = connect_from("127.0.0.5", proxy, &tls).await.unwrap();
    let head = format!("GET /sse?client_id=proxied-sse&topics=proxied HTTP/1.1\r\nHost: localhost:{proxy_port}\r\nAccept: text/event-stream\r\n\r\n");
    sse.write_all(head.as_bytes()).await.unwrap();
    let mut lines = tokio::io::BufReader::new(sse).lines();
    read_until(&mut lines, "event: subscribed").await;
    read_until(&mut lines, r#""n":0"#).await;
    let (status, _) = request("127.0.0.9", proxy, &tls, "POST /topics/proxied/events HTTP/1.1", Some(json!({"payload": {"n": 1}}))).await;
    assert_eq!(status, 200);
    read_until(&mut lines, r#""n":1"#).await;
    drop(lines);

    // The console, loaded through the proxy in a real browser, subscribes, receives and acks.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console.mjs");
    let shot = std::env::temp_dir().join(format!("ackgate-proxied-console-{}.png", std::process::id()));
    let (base, shot_arg) = (public_url.clone(), shot.clone());
    let output = tokio::task::spawn_blocking(move || Command::new("node").arg(script).arg(&base).arg(&shot_arg).output().expect("node runs")).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the console through the proxy failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("acked: "), "{stdout}");
    assert_eq!(stored_offset(&gw.base, "web", "browser-1", 0).await.expect("the console's client has an offset")["committed"], 2);
    ws.close(None).await.unwrap();
    drop(gw);
}

/// A raw request to `addr`: the status and the head (lower-cased) and body of the answer.
async fn raw(addr: SocketAddr, head: &str) -> (u16, String, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut answer)).await.expect("answered in time").unwrap();
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// Without `public_url`, `/session/recommend` names the URL the request came in by (a trusted
/// proxy's scheme and host), never the listen address; a page of an allowed origin may publish
/// cross-origin (its preflight is answered) and import the client, served gzipped with an ETag.
#[tokio::test]
async fn recommend_names_the_proxys_url_and_cross_origin_pages_get_cors() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.server.trusted_proxies = vec!["127.0.0.1".into()];
    config.server.allowed_hosts = vec!["gw.example.com".into()];
    config.server.allowed_origins = vec!["https://app.example".into()];
    let gw = InProcess::start(config).await;
    let addr = gw.addr();
    let forwarded = "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: gw.example.com";
    let (status, _, body) = raw(addr, &format!("GET /session/recommend?client_id=a HTTP/1.1\r\nHost: {addr}\r\n{forwarded}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["ws_url"], "wss://gw.example.com/ws");
    let (_, _, body) = raw(addr, &format!("GET /session/recommend?client_id=a HTTP/1.1\r\nHost: {addr}")).await;
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["ws_url"], format!("ws://{addr}/ws"), "its own Host without a proxy");

    // The preflight of a publish from an allowed page, and from another.
    let preflight = |origin: &str| {
        format!("OPTIONS /topics/t/events HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type, idempotency-key")
    };
    let (status, head, _) = raw(addr, &preflight("https://app.example")).await;
    assert_eq!(status, 204, "{head}");
    assert!(head.contains("access-control-allow-origin: https://app.example") && head.contains("idempotency-key"), "{head}");
    assert_eq!(raw(addr, &preflight("https://evil.example")).await.0, 403);

    // The client: CORS for the allowed page's module import, gzip, and a 304 for its ETag.
    let (status, head, _) =
        raw(addr, &format!("GET /static/ackgate.js HTTP/1.1\r\nHost: {addr}\r\nOrigin: https://app.example\r\nAccept-Encoding: gzip")).await;
    assert_eq!(status, 200);
    assert!(head.contains("access-control-allow-origin: https://app.example") && head.contains("content-encoding: gzip"), "{head}");
    let etag = head.lines().find_map(|l| l.strip_prefix("etag: ")).expect("an ETag").to_string();
    let (status, _, body) = raw(addr, &format!("GET /static/ackgate.js HTTP/1.1\r\nHost: {addr}\r\nAccept-Encoding: gzip\r\nIf-None-Match: {etag}")).await;
    assert_eq!((status, body.as_str()), (304, ""));
    // Its minified build and source map too (issue 61 item 8).
    for file in ["ackgate.min.js", "ackgate.min.js.map"] {
        let (status, head, _) =
            raw(addr, &format!("GET /static/{file} HTTP/1.1\r\nHost: {addr}\r\nOrigin: https://app.example\r\nAccept-Encoding: gzip")).await;
        assert_eq!(status, 200, "{file}");
        assert!(
            head.contains("access-control-allow-origin: https://app.example") && head.contains("content-encoding: gzip") && head.contains("etag: "),
            "{file}: {head}"
        );
    }
    gw.stop().await;
}
