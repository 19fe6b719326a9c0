//! TLS without a proxy: the real binary with `server.tls_cert` / `server.tls_key` (a certificate
//! made here with rcgen) serves `https://` and `wss://` to clients that verify it, refuses
//! clients that do not trust it and plain HTTP, and on SIGHUP switches new connections to a new
//! certificate while a live WebSocket session carries on (a broken file keeps the old one).

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::support::*;

/// A self-signed certificate for localhost and 127.0.0.1, written as cert.pem / key.pem.
pub(crate) fn write_certificate(dir: &std::path::Path) -> CertificateDer<'static> {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    std::fs::write(dir.join("cert.pem"), made.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), made.key_pair.serialize_pem()).unwrap();
    made.cert.der().clone()
}

/// `write_certificate` with a certificate valid until January 1st of `year`.
fn write_certificate_until(dir: &std::path::Path, year: i32) -> CertificateDer<'static> {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.not_after = rcgen::date_time_ymd(year, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    cert.der().clone()
}

/// `ackgate_tls_cert_expiry_timestamp_seconds` as scraped over https.
async fn cert_expiry(addr: SocketAddr, tls: &TlsConnector) -> Option<f64> {
    let (status, text) = https(addr, tls, "GET", "/metrics", None).await.unwrap();
    assert_eq!(status, 200, "{text}");
    text.lines().find_map(|l| l.strip_prefix("ackgate_tls_cert_expiry_timestamp_seconds ")).map(|v| v.trim().parse().unwrap())
}

/// A client that trusts exactly `trusted` (and verifies the name, as browsers do).
pub(crate) fn trusting(trusted: &CertificateDer<'static>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn connect(addr: SocketAddr, tls: &TlsConnector) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tls.connect(ServerName::try_from("localhost").unwrap(), tcp).await
}

/// One HTTP/1.1 request over a verified TLS connection: (status, body).
async fn https(addr: SocketAddr, tls: &TlsConnector, method: &str, path: &str, body: Option<Value>) -> std::io::Result<(u16, String)> {
    let mut stream = connect(addr, tls).await?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    // The server may end without close_notify; what was read up to then is the answer.
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((status, answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string()))
}

async fn next_json(ws: &mut WebSocketStream<TlsStream<TcpStream>>) -> Value {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("a frame in time") {
            Some(Ok(Message::Text(text))) => return serde_json::from_str(text.as_str()).unwrap(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

async fn next_event(ws: &mut WebSocketStream<TlsStream<TcpStream>>) -> Value {
    loop {
        let frame = next_json(ws).await;
        if frame["type"] == "event" {
            return frame;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_and_wss_work_directly_and_sighup_rotates_the_certificate_without_dropping_sessions() {
    let (dir, data) = temp_dir();
    let first = write_certificate(dir.path());
    let cert = dir.path().join("cert.pem").display().to_string();
    let key = dir.path().join("key.pem").display().to_string();
    let gw = Process::start(&data, &[("ACKGATE_SERVER__TLS_CERT", &cert), ("ACKGATE_SERVER__TLS_KEY", &key)]);
    let trusts_first = trusting(&first);

    // https: a verifying client gets answers; recommend names wss:// and https:// URLs.
    let (status, body) = https(gw.addr, &trusts_first, "GET", "/healthz", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = https(gw.addr, &trusts_first, "GET", "/session/recommend?client_id=tls-1", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let recommended: Value = serde_json::from_str(&body).unwrap();
    assert!(recommended["ws_url"].as_str().unwrap().starts_with("wss://"), "{recommended}");
    assert!(recommended["http_url"].as_str().unwrap().starts_with("https://"), "{recommended}");

    // Plain HTTP on the TLS port gets no answer, and a client that does not trust the
    // certificate refuses it (the handshake is verified).
    let mut plain = TcpStream::connect(gw.addr).await.unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut answer)).await.expect("the server ends a plain connection");
    assert!(!String::from_utf8_lossy(&answer).contains("200 OK"), "plain HTTP was served on the TLS port");
    let stranger = {
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        trusting(other.cert.der())
    };
    assert!(connect(gw.addr, &stranger).await.is_err(), "a client that does not trust the certificate must not connect");

    // wss: a session receives and acknowledges an event published over https.
    let (status, body) = https(gw.addr, &trusts_first, "POST", "/topics", Some(json!({"name": "secure", "partitions": 1}))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let stream = connect(gw.addr, &trusts_first).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async("wss://localhost/ws?client_id=tls-1", stream).await.expect("wss handshake");
    assert_eq!(next_json(&mut ws).await["type"], "welcome");
    ws.send(Message::Text(json!({"op": "subscribe", "topic": "secure"}).to_string().into())).await.unwrap();
    let (status, _) = https(gw.addr, &trusts_first, "POST", "/topics/secure/events", Some(json!({"payload": {"n": 1}}))).await.unwrap();
    assert_eq!(status, 200);
    let event = next_event(&mut ws).await;
    assert_eq!(event["payload"], json!({"n": 1}));
    ws.send(Message::Text(json!({"op": "ack", "delivery_id": event["delivery_id"], "req": "a1"}).to_string().into())).await.unwrap();
    loop {
        let frame = next_json(&mut ws).await;
        if frame["type"] == "ack_ok" {
            assert_eq!(frame["committed"]["secure"]["0"], 1);
            break;
        }
    }

    // SIGHUP with a new certificate: new connections present it, the old one is refused by a
    // client that only trusts the new one, and the live session goes on receiving.
    // Issue 62: the certificate's expiry is exported, and follows a reload.
    assert_eq!(cert_expiry(gw.addr, &trusts_first).await, Some(67_090_118_400.0), "rcgen's default: 4096-01-01");
    let second = write_certificate_until(dir.path(), 2040);
    gw.signal("HUP");
    gw.wait_for_log("TLS certificate and key reloaded").await;
    let trusts_second = trusting(&second);
    assert_eq!(cert_expiry(gw.addr, &trusts_second).await, Some(2_208_988_800.0), "2040-01-01");
    let (status, _) = https(gw.addr, &trusts_second, "GET", "/healthz", None).await.unwrap();
    assert_eq!(status, 200);
    assert!(connect(gw.addr, &trusts_first).await.is_err(), "new connections present the new certificate");
    let (status, _) = https(gw.addr, &trusts_second, "POST", "/topics/secure/events", Some(json!({"payload": {"n": 2}}))).await.unwrap();
    assert_eq!(status, 200);
    let event = next_event(&mut ws).await;
    assert_eq!(event["payload"], json!({"n": 2}), "the session opened before the reload still receives");

    // A broken file on SIGHUP: logged, and the current certificate stays in use.
    std::fs::write(dir.path().join("cert.pem"), "not a certificate").unwrap();
    gw.signal("HUP");
    let failed = gw.wait_for_log("TLS reload failed").await;
    assert!(failed.contains("a restart with these files would stop"), "said before the restart: {failed}");
    let (status, _) = https(gw.addr, &trusts_second, "GET", "/healthz", None).await.unwrap();
    assert_eq!(status, 200, "the previous certificate still serves");
    ws.close(None).await.unwrap();
    drop(gw);
}

#[tokio::test]
async fn a_missing_or_half_configured_certificate_stops_the_start_with_a_clear_error() {
    let (dir, data) = temp_dir();
    let config = data.with_extension("toml");
    std::fs::write(&config, format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:0\"\n", data.display().to_string())).unwrap();
    let run = |env: &[(&str, String)]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ackgate"));
        command.arg("--config").arg(&config);
        for (k, v) in env {
            command.env(k, v);
        }
        let output = command.output().unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).to_string())
    };
    let missing = dir.path().join("absent.pem").display().to_string();
    let (ok, stderr) = run(&[("ACKGATE_SERVER__TLS_CERT", missing.clone()), ("ACKGATE_SERVER__TLS_KEY", missing)]);
    assert!(!ok);
    assert!(stderr.contains("server.tls_cert") && stderr.contains("absent.pem"), "{stderr}");
    let (ok, stderr) = run(&[("ACKGATE_SERVER__TLS_CERT", "cert.pem".into())]);
    assert!(!ok);
    assert!(stderr.contains("server.tls_cert and server.tls_key"), "{stderr}");
}

/// Two instances that speak only TLS find each other healthy: the peer probes go over https://,
/// verified against `cluster.ca_file`, so `/session/recommend` spreads clients over both. Before,
/// probes spoke plain HTTP only and an https:// peer was never recommended. Without the file
/// (the system's authorities, which do not know the test's certificate) the peer stays unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_serving_tls_probe_each_other_over_https() {
    let (dir, data_a) = temp_dir();
    let (_dir_b, data_b) = temp_dir();
    let certificate = write_certificate(dir.path());
    let trusted = trusting(&certificate);
    let (cert, key, authorities) = (dir.path().join("cert.pem"), dir.path().join("key.pem"), dir.path().join("cert.pem"));
    let ports = [free_port(), free_port()];
    let urls = ports.map(|p| format!("https://localhost:{p}"));
    let start = |i: usize, data: &std::path::Path, ca_file: &str| {
        let peers = serde_json::to_string(&[&urls[1 - i]]).unwrap();
        let env = [
            ("ACKGATE_SERVER__TLS_CERT", cert.display().to_string()),
            ("ACKGATE_SERVER__TLS_KEY", key.display().to_string()),
            ("ACKGATE_SERVER__PUBLIC_URL", urls[i].clone()),
            ("ACKGATE_CLUSTER__PEERS", peers),
            ("ACKGATE_CLUSTER__TOKEN_KEY", CLUSTER_TOKEN_KEY.to_string()),
            ("ACKGATE_CLUSTER__PROBE_INTERVAL_MS", "200".to_string()),
            ("ACKGATE_CLUSTER__CA_FILE", ca_file.to_string()),
        ];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Process::start_at(data, &format!("127.0.0.1:{}", ports[i]), &env)
    };
    let a = start(0, &data_a, &authorities.display().to_string());
    let b = start(1, &data_b, &authorities.display().to_string());
    a.wait_for_log("peer healthy").await;
    let mut named = std::collections::BTreeSet::new();
    for n in 0..32 {
        let (status, body) = https(a.addr, &trusted, "GET", &format!("/session/recommend?client_id=c{n}"), None).await.unwrap();
        assert_eq!(status, 200, "{body}");
        named.insert(serde_json::from_str::<Value>(&body).unwrap()["http_url"].as_str().unwrap().to_string());
    }
    assert_eq!(named, urls.iter().cloned().collect(), "clients are spread over both instances");
    drop(b);
    drop(a);

    // The system's authorities do not know the test's certificate: B is never healthy for A.
    let (_dir_c, data_c) = temp_dir();
    let lone = start(0, &data_c, "");
    let b = start(1, &data_b, &authorities.display().to_string());
    b.wait_for_log("peer healthy").await; // B trusts A; A must not trust B
    for n in 0..32 {
        let (_, body) = https(lone.addr, &trusted, "GET", &format!("/session/recommend?client_id=c{n}"), None).await.unwrap();
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["http_url"], urls[0], "an unverified peer gets no clients");
    }
    assert!(!lone.logs.lock().unwrap().iter().any(|l| l.contains("peer healthy")));
    drop(b);
    drop(lone);
}
