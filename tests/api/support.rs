//! Test support: start a real gateway (in this process, or as the real binary), talk to it over
//! real WebSockets and HTTP on 127.0.0.1.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ackgate::config::Config;
use ackgate::core::clock::Clock;
use ackgate::gateway::GatewayHandle;
use ackgate::Gateway;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for any one thing before failing (never a measured duration).
pub const WAIT: Duration = Duration::from_secs(10);
/// `cluster.token_key` of every test cluster (its instances verify each other's resume tokens).
pub const CLUSTER_TOKEN_KEY: &str = "ackgate-test-cluster-token-key-0123456789";

/// The resume token key of the gateway whose data dir is `data` (made at its first start).
pub fn data_dir_token_key(data: &Path) -> ackgate::core::resume_token::TokenKey {
    ackgate::resume_token_key::load_or_create(data).unwrap()
}

/// The resume token key of the test clusters (`CLUSTER_TOKEN_KEY`).
pub fn cluster_token_key() -> ackgate::core::resume_token::TokenKey {
    ackgate::core::resume_token::TokenKey::new(CLUSTER_TOKEN_KEY.as_bytes())
}

/// What an issued resume token names, opened with `key`: topic -> partition -> offset, or
/// `[offset, epoch]` where the epoch is not 0.
pub fn open_token(key: &ackgate::core::resume_token::TokenKey, token: &str) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, Value>> {
    let opened = key.open(token).unwrap_or_else(|refusal| panic!("token {token} refused: {refusal:?}"));
    opened
        .topics
        .into_iter()
        .map(|t| {
            let floors =
                t.partitions.into_iter().map(|(p, r)| (p.to_string(), if r.epoch == 0 { json!(r.offset) } else { json!([r.offset, r.epoch]) })).collect();
            (t.topic, floors)
        })
        .collect()
}

pub fn test_config(data_dir: &Path) -> Config {
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".into();
    config.storage.data_dir = data_dir.to_path_buf();
    config.server.shutdown_grace_ms = 3000;
    config
}

/// A gateway running inside the test process.
pub struct InProcess {
    pub handle: GatewayHandle,
    pub base: String,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    pub async fn start(config: Config) -> Self {
        let gateway = Gateway::build(config).await.expect("gateway builds");
        Self::from_gateway(gateway)
    }

    pub async fn start_with_clock(config: Config, clock: Arc<dyn Clock>) -> Self {
        let gateway = Gateway::build_with_clock(config, clock).await.expect("gateway builds");
        Self::from_gateway(gateway)
    }

    pub fn from_gateway(gateway: Gateway) -> Self {
        let handle = gateway.handle();
        let base = format!("http://{}", handle.local_addr);
        let task = tokio::spawn(gateway.run(std::future::pending()));
        Self { handle, base, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.handle.local_addr
    }

    /// Graceful shutdown; waits until the stores are closed.
    pub async fn stop(self) {
        self.handle.shutdown();
        drop(self.handle);
        tokio::time::timeout(WAIT, self.task).await.expect("gateway stops in time").unwrap().unwrap();
    }
}

/// The real `ackgate` binary, started with a config file and environment overrides.
pub struct Process {
    child: Child,
    pub addr: SocketAddr,
    pub base: String,
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Process {
    pub fn start(data_dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_at(data_dir, "127.0.0.1:0", env)
    }

    pub fn start_at(data_dir: &Path, listen: &str, env: &[(&str, &str)]) -> Self {
        Self::start_limited(data_dir, listen, None, "", env)
    }

    /// `start` with `file_extra` (TOML tables) at the end of its config file: settings a reload
    /// reads again (the environment would win over the file).
    pub fn start_with_file(data_dir: &Path, file_extra: &str, env: &[(&str, &str)]) -> Self {
        Self::start_limited(data_dir, "127.0.0.1:0", None, file_extra, env)
    }

    /// `start` under an open-files limit (soft and hard), as `ulimit -n` sets it.
    pub fn start_with_open_files(data_dir: &Path, open_files: u32, env: &[(&str, &str)]) -> Self {
        Self::start_limited(data_dir, "127.0.0.1:0", Some(open_files), "", env)
    }

    fn start_limited(data_dir: &Path, listen: &str, open_files: Option<u32>, file_extra: &str, env: &[(&str, &str)]) -> Self {
        let config = data_dir.with_extension("toml");
        std::fs::write(&config, format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = {listen:?}\n{file_extra}\n", data_dir.display().to_string())).unwrap();
        let mut command = match open_files {
            None => Command::new(env!("CARGO_BIN_EXE_ackgate")),
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(format!("ulimit -n {n} && exec \"$0\" \"$@\"")).arg(env!("CARGO_BIN_EXE_ackgate"));
                sh
            }
        };
        command.arg("--config").arg(&config).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("ackgate binary starts");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        // Keep reading stderr for the life of the process, or it would block on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Text logs say `local_addr=127.0.0.1:PORT`, JSON logs `"local_addr":"127.0.0.1:PORT"`.
                if let Some(rest) = line.split("local_addr").nth(1) {
                    let addr: String = rest.chars().skip_while(|c| !c.is_ascii_digit()).take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr: SocketAddr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr.parse().unwrap(),
            Err(_) => panic!("ackgate did not start; logs:\n{}", logs.lock().unwrap().join("\n")),
        };
        Self { child, base: format!("http://{addr}"), addr, logs }
    }

    /// The process's resident memory in KiB (`VmRSS` of /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    /// Sends a signal by name (`HUP`, `TERM`, ...) with the shell's `kill` builtin.
    pub fn signal(&self, name: &str) {
        let status = Command::new("sh").arg("-c").arg(format!("kill -{name} {}", self.child.id())).status().unwrap();
        assert!(status.success(), "kill -{name}");
    }

    /// Waits until a log line contains `needle` (at most `WAIT`); returns that line.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        let started = std::time::Instant::now();
        loop {
            if let Some(line) = self.logs.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return line.clone();
            }
            assert!(started.elapsed() < WAIT, "no log line with {needle:?}; logs:\n{}", self.logs.lock().unwrap().join("\n"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits at most `within` for the process to exit by itself; its status, or `None` (then it
    /// is killed).
    pub fn wait_exit(mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// SIGTERM, then waits for a clean exit (a drain spreads the sessions' closes over
    /// `server.drain_ms`, 10 s by default).
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // The shell's own `kill` builtin: no procps package needed.
        let _ = Command::new("sh").arg("-c").arg(format!("kill -TERM {}", self.child.id())).status();
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("ackgate did not exit after SIGTERM");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::new()
}

pub async fn publish(base: &str, topic: &str, body: Value) -> Value {
    let response = http().post(format!("{base}/topics/{topic}/events")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200, "publish failed: {:?}", response.text().await);
    response.json().await.unwrap()
}

/// Publishes `count` events to one partition of a (new) topic with `partitions` partitions.
pub async fn publish_numbered(base: &str, topic: &str, partitions: u32, partition: u32, count: usize) {
    let created = http().post(format!("{base}/topics")).json(&json!({"name": topic, "partitions": partitions})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let events: Vec<Value> = (0..count).map(|i| json!({"partition": partition, "payload": {"n": i}})).collect();
    for chunk in events.chunks(1000) {
        publish(base, topic, json!({ "events": chunk })).await;
    }
}

pub async fn post_json(url: &str, body: Value) -> (u16, Value) {
    let response = http().post(url).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

pub async fn get_json(url: &str) -> (u16, Value) {
    let response = http().get(url).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `PUT /admin/offsets/{topic}/{client}/{partition}` with `{"offset": offset}`; the status.
pub async fn put_offset(base: &str, topic: &str, client: &str, partition: u32, offset: Value) -> u16 {
    let url = format!("{base}/admin/offsets/{topic}/{client}/{partition}");
    http().put(url).json(&json!({ "offset": offset })).send().await.unwrap().status().as_u16()
}

/// The stored offset row of one key, if any.
pub async fn stored_offset(base: &str, topic: &str, client: &str, partition: u32) -> Option<Value> {
    let (status, body) = get_json(&format!("{base}/admin/offsets?topic={topic}&client_id={client}&partition={partition}")).await;
    assert_eq!(status, 200);
    body["offsets"].as_array().unwrap().first().cloned()
}

/// The value of an unlabelled metric in `/metrics`, 0 when absent.
pub async fn metric(base: &str, name: &str) -> f64 {
    let text = http().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let prefix = format!("{name} ");
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).map_or(0.0, |v| v.parse().unwrap())
}

/// A client speaking docs/protocol.md frames over a WebSocket or over Server-Sent Events (frames
/// POSTed to the session's `ack_url`, their answers read back as if they came down the stream).
pub struct TestClient {
    conn: Conn,
    pub welcome: Value,
}

enum Conn {
    Ws(Box<WebSocketStream<MaybeTlsStream<TcpStream>>>),
    Sse(Box<SseConn>),
}

/// What a client reads next.
#[derive(Debug)]
pub enum Received {
    Frame(Value),
    Close(u16),
    /// The connection ended without a close frame.
    Ended,
    Timeout,
}

/// The reading half of an SSE session and where its frames go.
pub struct SseConn {
    response: reqwest::Response,
    buffer: String,
    base: String,
    ack_url: String,
    /// POST answers and parsed stream messages not read yet, in order.
    pending: std::collections::VecDeque<Received>,
    /// The `id:` of the last event message (the resume token).
    pub last_event_id: Option<String>,
    /// The last `retry:` (how long a browser's EventSource waits before it reconnects).
    pub retry: Option<u64>,
}

impl SseConn {
    async fn receive(&mut self, within: Duration) -> Received {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(received) = self.pending.pop_front() {
                return received;
            }
            if let Some(end) = self.buffer.find("\n\n") {
                let message: String = self.buffer.drain(..end + 2).collect();
                if let Some(received) = self.parse(&message) {
                    return received;
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return Received::Timeout,
                Ok(Ok(Some(chunk))) => self.buffer.push_str(std::str::from_utf8(&chunk).expect("the stream is UTF-8")),
                Ok(_) => return Received::Ended,
            }
        }
    }

    /// One SSE message; `None` for a comment (keepalive).
    fn parse(&mut self, message: &str) -> Option<Received> {
        let (mut event, mut lines) = (None, Vec::new());
        for line in message.lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                event = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                lines.push(v);
            } else if let Some(v) = line.strip_prefix("id: ") {
                self.last_event_id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("retry: ") {
                self.retry = Some(v.parse().expect("retry is a number of milliseconds"));
            }
        }
        // Several data lines are one value joined with newlines, as a browser joins them.
        if lines.is_empty() {
            return None;
        }
        let data: Value = serde_json::from_str(&lines.join("\n")).expect("data is JSON");
        Some(match event.as_deref() {
            Some("close") => Received::Close(data["code"].as_u64().unwrap() as u16),
            Some(kind) => {
                assert_eq!(data["type"], kind, "the event name is the frame's type");
                Received::Frame(data)
            }
            None => panic!("an SSE message without event: {message:?}"),
        })
    }

    /// POSTs frames; their answers are read next. `None` when the POST is refused (the status).
    async fn post(&mut self, body: String) -> Result<(), (u16, Value)> {
        let response = http().post(format!("{}{}", self.base, self.ack_url)).body(body).send().await.map_err(|_| (0, Value::Null))?;
        let status = response.status().as_u16();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        if status != 200 {
            return Err((status, answer));
        }
        for frame in answer.as_array().expect("the answer is an array") {
            self.pending.push_back(Received::Frame(frame.clone()));
        }
        Ok(())
    }
}

impl TestClient {
    pub async fn connect(addr: SocketAddr, client_id: &str) -> Self {
        Self::connect_url(&format!("ws://{addr}/ws?client_id={client_id}")).await
    }

    pub async fn connect_url(url: &str) -> Self {
        let (ws, _) = tokio_tungstenite::connect_async(url).await.expect("websocket connects");
        Self::welcomed(Conn::Ws(Box::new(ws))).await
    }

    /// `connect` that answers `None` instead of failing (a gateway that may be gone).
    pub async fn try_connect(addr: SocketAddr, client_id: &str) -> Option<Self> {
        Self::try_connect_url(&format!("ws://{addr}/ws?client_id={client_id}")).await
    }

    /// `connect_url` that answers `None` instead of failing.
    pub async fn try_connect_url(url: &str) -> Option<Self> {
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url)).await.ok()?.ok()?;
        let mut client = Self { conn: Conn::Ws(Box::new(ws)), welcome: Value::Null };
        client.welcome = client.try_recv(WAIT).await.filter(|w| w["type"] == "welcome")?;
        Some(client)
    }

    /// Connects with `Authorization: Bearer <token>` on the handshake.
    pub async fn connect_with_bearer(addr: SocketAddr, client_id: &str, token: &str) -> Self {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{addr}/ws?client_id={client_id}").into_client_request().unwrap();
        request.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(request).await.expect("websocket connects");
        Self::welcomed(Conn::Ws(Box::new(ws))).await
    }

    /// A session over Server-Sent Events: `GET /sse?client_id=...&<query>` with `headers`.
    pub async fn connect_sse(addr: SocketAddr, client_id: &str, query: &str, headers: &[(&str, &str)]) -> Self {
        match Self::try_connect_sse(addr, client_id, query, headers).await {
            Ok(client) => client,
            Err((status, body)) => panic!("GET /sse answered {status}: {body}"),
        }
    }

    /// `connect_sse` that answers the refusal (status and JSON body) instead of failing.
    pub async fn try_connect_sse(addr: SocketAddr, client_id: &str, query: &str, headers: &[(&str, &str)]) -> Result<Self, (u16, Value)> {
        let base = format!("http://{addr}");
        let mut request = http().get(format!("{base}/sse?client_id={client_id}&{query}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.map_err(|e| (0, json!(e.to_string())))?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err((status, response.json().await.unwrap_or(Value::Null)));
        }
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let sse = SseConn { response, buffer: String::new(), base, ack_url: String::new(), pending: Default::default(), last_event_id: None, retry: None };
        let mut client = Self::welcomed(Conn::Sse(Box::new(sse))).await;
        let ack_url = client.welcome["ack_url"].as_str().expect("the SSE welcome has an ack_url").to_string();
        if let Conn::Sse(sse) = &mut client.conn {
            sse.ack_url = ack_url;
        }
        Ok(client)
    }

    async fn welcomed(conn: Conn) -> Self {
        let mut client = Self { conn, welcome: Value::Null };
        client.welcome = client.recv().await;
        assert_eq!(client.welcome["type"], "welcome", "first frame is welcome");
        client
    }

    /// The SSE half of this client (panics on a WebSocket one).
    pub fn sse(&mut self) -> &mut SseConn {
        match &mut self.conn {
            Conn::Sse(sse) => sse,
            Conn::Ws(_) => panic!("not an SSE client"),
        }
    }

    pub async fn receive(&mut self, within: Duration) -> Received {
        match &mut self.conn {
            Conn::Sse(sse) => sse.receive(within).await,
            Conn::Ws(ws) => loop {
                return match tokio::time::timeout(within, ws.next()).await {
                    Err(_) => Received::Timeout,
                    Ok(Some(Ok(Message::Text(text)))) => Received::Frame(serde_json::from_str(text.as_str()).unwrap()),
                    Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
                    Ok(Some(Ok(Message::Close(Some(frame))))) => Received::Close(u16::from(frame.code)),
                    Ok(Some(Ok(Message::Close(None)))) => Received::Close(u16::from(CloseCode::Status)),
                    Ok(_) => Received::Ended,
                };
            },
        }
    }

    pub async fn send(&mut self, frame: Value) {
        self.send_text(&frame.to_string()).await;
    }

    /// Sends one frame's text as it is (over SSE: POSTed as the one element of an array).
    pub async fn send_text(&mut self, text: &str) {
        assert!(self.try_send_text(text).await, "the frame could not be sent");
    }

    async fn try_send_text(&mut self, text: &str) -> bool {
        match &mut self.conn {
            Conn::Ws(ws) => ws.send(Message::Text(text.to_string().into())).await.is_ok(),
            Conn::Sse(sse) => sse.post(format!("[{text}]")).await.is_ok(),
        }
    }

    /// Next JSON frame; fails the test on close or silence.
    pub async fn recv(&mut self) -> Value {
        match self.receive(WAIT).await {
            Received::Frame(frame) => frame,
            Received::Timeout => panic!("a frame did not arrive in time"),
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    /// Next JSON frame within `within`; `None` on close, error or silence (a client that keeps
    /// going while the gateway is killed under it).
    pub async fn try_recv(&mut self, within: Duration) -> Option<Value> {
        match self.receive(within).await {
            Received::Frame(frame) => Some(frame),
            _ => None,
        }
    }

    /// `send` that answers false instead of failing when the connection is gone.
    pub async fn try_send(&mut self, frame: Value) -> bool {
        self.try_send_text(&frame.to_string()).await
    }

    /// Next frame of `kind`, skipping others (e.g. events while waiting for an ack_ok).
    pub async fn recv_type(&mut self, kind: &str) -> Value {
        loop {
            let frame = self.recv().await;
            if frame["type"] == kind {
                return frame;
            }
        }
    }

    /// The next `n` events, skipping other frames.
    pub async fn recv_events(&mut self, n: usize) -> Vec<Value> {
        let mut events = Vec::with_capacity(n);
        while events.len() < n {
            events.push(self.recv_type("event").await);
        }
        events
    }

    /// Nothing arrives for `quiet`.
    pub async fn expect_silence(&mut self, quiet: Duration) {
        match self.receive(quiet).await {
            Received::Timeout => {}
            other => panic!("expected silence, got {other:?}"),
        }
    }

    /// Reads and discards frames, with no deadline, until the connection ends (a background
    /// reader that keeps a session live).
    pub async fn read_until_closed(&mut self) {
        while let Received::Frame(_) | Received::Timeout = self.receive(Duration::from_secs(86_400)).await {}
    }

    /// Waits for the close frame (over SSE: the `close` message) and returns its code.
    pub async fn close_code(&mut self) -> u16 {
        loop {
            match self.receive(WAIT).await {
                Received::Close(code) => return code,
                Received::Frame(_) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    }

    pub async fn subscribe(&mut self, topic: &str, extra: Value) -> Value {
        let mut frame = json!({"op": "subscribe", "topic": topic, "req": "sub"});
        frame.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        self.send(frame).await;
        let answer = self.recv().await;
        assert_eq!(answer["type"], "subscribed", "subscribe answered {answer}");
        answer
    }

    /// Acks with a receipt and returns the `ack_ok` frame.
    pub async fn ack_confirmed(&mut self, ids: &[&str], req: &str) -> Value {
        self.send(json!({"op": "ack", "delivery_ids": ids, "req": req})).await;
        loop {
            let frame = self.recv().await;
            if frame["req"] == req {
                return frame;
            }
        }
    }

    pub async fn close(self) {
        match self.conn {
            Conn::Ws(mut ws) => {
                let _ = WebSocketStream::close(&mut ws, None).await;
            }
            // Dropping the response closes the connection: the gateway ends the session.
            Conn::Sse(sse) => drop(sse),
        }
    }
}

/// Polls `check` until it holds (60 s at most: a deadline for a hang, never a measured time).
pub async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Connects `client_id`, subscribes to `topic`, receives `n` events and acks them all with a
/// receipt; returns the still-open client.
pub async fn consume_and_ack(addr: SocketAddr, client_id: &str, topic: &str, n: usize) -> TestClient {
    let mut client = TestClient::connect(addr, client_id).await;
    client.subscribe(topic, json!({})).await;
    let events = client.recv_events(n).await;
    client.ack_confirmed(&ids(&events), "all").await;
    client
}

/// The delivery_id of an event frame.
pub fn id(event: &Value) -> &str {
    event["delivery_id"].as_str().unwrap()
}

pub fn ids(events: &[Value]) -> Vec<&str> {
    events.iter().map(id).collect()
}

pub fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    (dir, data)
}

/// A port free on 127.0.0.1 now (for an instance that must know its peers' URLs before it starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Real gateways on one Kafka-protocol broker, each on its own port and data dir, each naming all
/// of them in `cluster.peers` (probed every 200 ms).
pub struct KafkaCluster {
    pub ports: Vec<u16>,
    pub urls: Vec<String>,
    peers: String,
    bootstrap: String,
    dirs: Vec<(tempfile::TempDir, PathBuf)>,
}

impl KafkaCluster {
    pub fn new(bootstrap: String, instances: usize) -> Self {
        let ports: Vec<u16> = (0..instances).map(|_| free_port()).collect();
        let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
        let peers = serde_json::to_string(&urls).unwrap();
        let dirs = (0..instances).map(|_| temp_dir()).collect();
        Self { ports, urls, peers, bootstrap, dirs }
    }

    /// Starts instance `i` (again: on its own port and data dir).
    pub fn start(&self, i: usize) -> Process {
        self.start_with(i, &[])
    }

    /// `start` with more settings in the environment.
    pub fn start_with(&self, i: usize, extra: &[(&str, &str)]) -> Process {
        let mut env = vec![
            ("ACKGATE_STORAGE__BACKEND", "kafka"),
            ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", self.bootstrap.as_str()),
            ("ACKGATE_CLUSTER__PEERS", self.peers.as_str()),
            ("ACKGATE_CLUSTER__TOKEN_KEY", CLUSTER_TOKEN_KEY),
            ("ACKGATE_CLUSTER__PROBE_INTERVAL_MS", "200"),
        ];
        env.extend_from_slice(extra);
        Process::start_at(&self.dirs[i].1, &format!("127.0.0.1:{}", self.ports[i]), &env)
    }
}

/// An embedded log in `dir` with one partition per topic, nothing expired, no fsync, on a manual
/// clock: for tests that drive the core's readers and feeders directly.
pub fn plain_embedded_log(dir: &Path) -> Arc<ackgate::backend::embedded::EmbeddedLog> {
    let settings = ackgate::backend::embedded::EmbeddedLogSettings {
        default_partitions: 1,
        retention_ms: 0,
        retention_bytes_per_partition: 0,
        durable: false,
        group_commit_max_wait: Duration::ZERO,
        max_topics: 10_000,
        memtable_bytes: 1 << 20,
        block_cache_bytes: 1 << 20,
    };
    Arc::new(ackgate::backend::embedded::EmbeddedLog::open(dir, settings, Arc::new(ackgate::core::clock::ManualClock::new(1))).unwrap())
}
