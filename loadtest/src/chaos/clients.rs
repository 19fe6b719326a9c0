//! The fault suite's workload: WebSocket and SSE clients that record what they are told in
//! the history (`crate::history`) and resume with tokens, and the publishers.

use super::*;

/// A client's view of its own progress: its resume point per partition, and what was delivered
/// at or above it (what may come again when the session ends: the bound on duplicates).
#[derive(Default)]
pub(super) struct Progress {
    /// Per partition, the offset its resume token names: the contiguous acked floor (WebSocket)
    /// or the last `id:` token (SSE).
    pub(super) floor: BTreeMap<u32, u64>,
    /// Offsets delivered at or above the floor: what a fault may deliver again.
    pub(super) above_floor: BTreeMap<u32, BTreeSet<u64>>,
    /// Offsets acked above the floor (WebSocket).
    pub(super) acked: BTreeMap<u32, BTreeSet<u64>>,
}

impl Progress {
    pub(super) fn in_flight(&self) -> u64 {
        self.above_floor.values().map(|s| s.len() as u64).sum()
    }

    pub(super) fn raise_floor(&mut self, partition: u32, to: u64) {
        let floor = self.floor.entry(partition).or_insert(to);
        *floor = (*floor).max(to);
        let floor = *floor;
        if let Some(above) = self.above_floor.get_mut(&partition) {
            *above = above.split_off(&floor);
        }
        if let Some(acked) = self.acked.get_mut(&partition) {
            *acked = acked.split_off(&floor);
        }
    }

    pub(super) fn delivered(&mut self, partition: u32, offset: u64) {
        if self.floor.get(&partition).is_none_or(|f| offset >= *f) {
            self.above_floor.entry(partition).or_default().insert(offset);
        }
    }

    pub(super) fn acked(&mut self, partition: u32, offset: u64) {
        let Some(mut floor) = self.floor.get(&partition).copied() else { return };
        if offset < floor {
            return;
        }
        let acked = self.acked.entry(partition).or_default();
        acked.insert(offset);
        while acked.remove(&floor) {
            floor += 1;
        }
        self.raise_floor(partition, floor);
    }
}

/// Counts the run prints.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) next_payload: AtomicU64,
    pub(super) publish_errors: AtomicU64,
    pub(super) reconnects: AtomicU64,
    pub(super) voluntary_reconnects: AtomicU64,
    pub(super) nacks: AtomicU64,
    pub(super) error_frames: AtomicU64,
    /// Tokens replaced in band (`refresh_needed`, then `refresh`, answered `refreshed`).
    pub(super) refreshed: AtomicU64,
    /// Sessions closed because their token expired (4004, or an SSE `close` with it).
    pub(super) expired: AtomicU64,
    /// Tokens refused (a session closed with 1008, a POST answered 401/403, a `refresh` answered `error`): the
    /// workload's tokens are fresh and within the clocks' bound, so each is an anomaly.
    pub(super) auth_refusals: AtomicU64,
    /// Sessions closed at their token's expiry (4004) sooner than the token's `exp` less the
    /// clocks' bound: the gateway cut a session whose token is valid (a clock step must not).
    pub(super) closed_with_valid_token: AtomicU64,
    /// Replays by time that got no `subscribed` (a fault in the way).
    pub(super) time_replays_failed: AtomicU64,
    /// Deliveries that may come again: what was in flight when each session ended and at each
    /// clock jump, plus the nacks.
    pub(super) duplicate_bound: AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AckStyle {
    Each,
    Batch,
    Confirmed,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    WebSocket(AckStyle),
    Sse,
}

pub(super) struct ClientPlan {
    pub(super) id: String,
    pub(super) transport: Transport,
    /// Closes its session now and then on its own and resumes.
    pub(super) wanders: bool,
    pub(super) urls: Arc<Vec<String>>,
    pub(super) history: Arc<Mutex<History>>,
    pub(super) progress: Arc<Mutex<Progress>>,
    pub(super) counters: Arc<Counters>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) rng: Rng,
    /// Clients on several instances: an SSE token may lawfully trail an `ack_ok` of another
    /// instance (docs/takeover.md), so its confirmed offsets are not held against later starts.
    pub(super) cluster: bool,
    /// The newest resume token the gateway issued this client (`subscribed`, `ack_ok`,
    /// `progress`): what a WebSocket session resumes with. The older map form is a claim the
    /// gateway applies only where it holds (or a peer answers with) the client's record, so on a
    /// cluster with an instance down it started clients from their reset policy.
    pub(super) resume_token: Option<String>,
}

/// How a session ended.
pub(super) enum Ended {
    Stop,
    Again,
}

pub(super) fn partition_of(frame: &Value) -> (u32, u64) {
    (frame["partition"].as_u64().unwrap_or_default() as u32, frame["offset"].as_u64().unwrap_or_default())
}

pub(super) fn key(partition: u32) -> (String, u32) {
    (TOPIC.to_string(), partition)
}

impl ClientPlan {
    /// Records a `subscribed` frame.
    pub(super) fn subscribed(&self, frame: &Value) {
        let mut history = self.history.lock().unwrap();
        let mut progress = self.progress.lock().unwrap();
        for p in frame["partitions"].as_array().into_iter().flatten() {
            let (partition, from) = (p["partition"].as_u64().unwrap_or_default() as u32, p["from"].as_u64().unwrap_or_default());
            history.subscribed(&self.id, key(partition), from);
            if let (Some(gap_from), Some(gap_to)) = (p["gap"]["from"].as_u64(), p["gap"]["to"].as_u64()) {
                history.gap(&self.id, key(partition), gap_from, gap_to);
            }
            progress.raise_floor(partition, from);
        }
    }

    /// Records an `event`; returns its delivery id.
    pub(super) fn delivered(&self, frame: &Value) -> String {
        let (partition, offset) = partition_of(frame);
        let payload = frame["payload"]["id"].as_u64().unwrap_or(u64::MAX);
        {
            let mut history = self.history.lock().unwrap();
            history.delivered(&self.id, key(partition), offset, payload);
            if let Some(stamp) = frame["timestamp"].as_u64() {
                history.stamped(key(partition), offset, stamp);
            }
        }
        self.progress.lock().unwrap().delivered(partition, offset);
        frame["delivery_id"].as_str().unwrap_or_default().to_string()
    }

    pub(super) fn confirmed(&self, frame: &Value) {
        if self.cluster && self.transport == Transport::Sse {
            return;
        }
        let mut history = self.history.lock().unwrap();
        for (p, c) in frame["committed"][TOPIC].as_object().into_iter().flatten() {
            if let (Ok(p), Some(c)) = (p.parse::<u32>(), c.as_u64()) {
                history.confirmed(&self.id, key(p), c);
            }
        }
    }

    pub(super) fn gap(&self, frame: &Value) {
        if let (Some(from), Some(to)) = (frame["from"].as_u64(), frame["to"].as_u64()) {
            let partition = frame["partition"].as_u64().unwrap_or_default() as u32;
            self.history.lock().unwrap().gap(&self.id, key(partition), from, to);
        }
    }

    /// A voluntary end of this session, when the client wanders.
    pub(super) fn wander_deadline(&mut self) -> Option<tokio::time::Instant> {
        self.wanders.then(|| tokio::time::Instant::now() + self.rng.millis(3_000, 15_000))
    }

    pub(super) async fn run(mut self) -> anyhow::Result<()> {
        let mut attempt = 0u32;
        // SSE: the last `id:` seen, sent back as Last-Event-ID.
        let mut last_event_id: Option<String> = None;
        loop {
            if *self.stop.borrow() {
                return Ok(());
            }
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt.min(3))).await;
            }
            let base = self.urls[self.rng.below(self.urls.len() as u64) as usize].clone();
            let base = recommended(&base, &self.id).await.unwrap_or(base);
            let ended = match self.transport {
                Transport::WebSocket(style) => self.websocket_session(&base, style).await,
                Transport::Sse => self.sse_session(&base, &mut last_event_id).await,
            };
            // Whatever ended the session (a fault, the client itself), what was delivered at or
            // above its resume point may come again.
            let in_flight = self.progress.lock().unwrap().in_flight();
            self.counters.duplicate_bound.fetch_add(in_flight, Ordering::Relaxed);
            match ended {
                Ok(Ended::Stop) => return Ok(()),
                Ok(Ended::Again) => attempt = 1,
                Err(_) => attempt += 1,
            }
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A fresh HS256 token for this client, good for `TOKEN_LIFETIME_SECS` by this machine's
    /// clock, and its `exp`.
    pub(super) fn token(&self) -> (String, u64) {
        token_for(&self.id)
    }

    /// A session ended with 4004 (its token expired): by the true clock the token's `exp` must be
    /// within the clocks' bound, else the gateway cut a valid session.
    fn expired(&self, exp: u64) {
        self.counters.expired.fetch_add(1, Ordering::Relaxed);
        let now = now_ms() / 1000;
        // A second of slack: libfaketime reads its offset file at most once a second.
        if now + MAX_CLOCK_SKEW_SECS as u64 + 1 < exp {
            self.counters.closed_with_valid_token.fetch_add(1, Ordering::Relaxed);
            eprintln!("chaos: {} closed with 4004 at {now}, its token valid until {exp}", self.id);
        }
    }

    pub(super) async fn websocket_session(&mut self, base: &str, style: AckStyle) -> anyhow::Result<Ended> {
        let (token, mut token_exp) = self.token();
        // The `exp` of a `refresh` sent, until `refreshed` says the session holds it.
        let mut refreshing_exp = token_exp;
        let url = format!("{}/ws?client_id={}&token={token}", base.replacen("http", "ws", 1), self.id);
        let connected = tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(url)).await.context("connect timed out")?;
        if let Err(tokio_tungstenite::tungstenite::Error::Http(response)) = &connected {
            if matches!(response.status().as_u16(), 401 | 403) {
                self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (mut ws, _) = connected?;
        let subscribe = match &self.resume_token {
            Some(token) => json!({"op": "subscribe", "topic": TOPIC, "resume": token, "req": "sub"}),
            None => json!({"op": "subscribe", "topic": TOPIC, "req": "sub"}),
        }
        .to_string();
        ws.send(Message::Text(subscribe.clone().into())).await?;
        let wander = self.wander_deadline();
        let mut batch: Vec<(String, u32, u64)> = Vec::new();
        let mut req = 0u64;
        let mut silent_since = Instant::now();
        let mut pinged = false;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(Duration::from_millis(500), ws.next()) => next,
                _ = self.stop.changed() => {
                    let _ = ws.close(None).await;
                    return Ok(Ended::Stop);
                }
                _ = async { tokio::time::sleep_until(wander.expect("guarded")).await }, if wander.is_some() => {
                    self.voluntary();
                    let _ = ws.close(None).await;
                    return Ok(Ended::Again);
                }
            };
            let text = match next {
                Err(_) => {
                    // Nothing for a while: flush a batch, ping, and give up on a silent socket.
                    self.flush_batch(&mut ws, &mut batch).await?;
                    if silent_since.elapsed() > CLIENT_SILENCE {
                        bail!("silent connection");
                    }
                    if !pinged && silent_since.elapsed() > CLIENT_SILENCE / 3 {
                        pinged = true;
                        ws.send(Message::Text(r#"{"op":"ping","req":"alive"}"#.into())).await?;
                    }
                    continue;
                }
                Ok(Some(Ok(Message::Text(text)))) => text,
                Ok(Some(Ok(Message::Close(close)))) => {
                    match close.map(|c| u16::from(c.code)) {
                        Some(4004) => {
                            self.expired(token_exp);
                            0
                        }
                        // Credentials refused: said in the socket (an `error`, then 1008).
                        Some(1008) => self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    return Ok(Ended::Again);
                }
                Ok(None) => return Ok(Ended::Again),
                Ok(Some(Ok(_))) => {
                    silent_since = Instant::now();
                    continue;
                }
                Ok(Some(Err(e))) => return Err(e.into()),
            };
            silent_since = Instant::now();
            pinged = false;
            let frame: Value = serde_json::from_str(text.as_str()).context("a frame that is not JSON")?;
            match frame["type"].as_str() {
                Some("subscribed") => {
                    self.subscribed(&frame);
                    self.keep_token(&frame["token"]);
                }
                Some("event") => {
                    let id = self.delivered(&frame);
                    let (partition, offset) = partition_of(&frame);
                    if self.rng.chance(0.01) {
                        self.counters.nacks.fetch_add(1, Ordering::Relaxed);
                        self.counters.duplicate_bound.fetch_add(1, Ordering::Relaxed);
                        ws.send(Message::Text(json!({"op": "nack", "delivery_id": id}).to_string().into())).await?;
                        continue;
                    }
                    match style {
                        AckStyle::Each | AckStyle::Confirmed => {
                            let mut ack = json!({"op": "ack", "delivery_id": id});
                            if style == AckStyle::Confirmed {
                                req += 1;
                                ack["req"] = json!(req);
                            }
                            ws.send(Message::Text(ack.to_string().into())).await?;
                            self.progress.lock().unwrap().acked(partition, offset);
                        }
                        AckStyle::Batch => {
                            batch.push((id, partition, offset));
                            if batch.len() >= 20 {
                                self.flush_batch(&mut ws, &mut batch).await?;
                            }
                        }
                    }
                }
                Some("ack_ok") => {
                    self.confirmed(&frame);
                    self.keep_token(&frame["tokens"][TOPIC]);
                }
                Some("progress") => self.keep_token(&frame["tokens"][TOPIC]),
                Some("gap") => self.gap(&frame),
                // The token expires soon: a new one replaces it in the same session.
                Some("refresh_needed") => {
                    let (token, exp) = self.token();
                    refreshing_exp = exp;
                    ws.send(Message::Text(json!({"op": "refresh", "token": token, "req": "refresh"}).to_string().into())).await?
                }
                Some("refreshed") => {
                    token_exp = refreshing_exp;
                    self.counters.refreshed.fetch_add(1, Ordering::Relaxed);
                }
                Some("error") => {
                    self.counters.error_frames.fetch_add(1, Ordering::Relaxed);
                    if frame["req"] == "refresh" {
                        self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
                    }
                    if frame["req"] == "sub" {
                        // Not subscribed (the backend unavailable): try again shortly.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        ws.send(Message::Text(subscribe.clone().into())).await?;
                    }
                }
                _ => {}
            }
        }
    }

    pub(super) async fn flush_batch(&self, ws: &mut crate::client::Ws, batch: &mut Vec<(String, u32, u64)>) -> anyhow::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = batch.iter().map(|(id, _, _)| id.as_str()).collect();
        ws.send(Message::Text(json!({"op": "ack", "delivery_ids": ids}).to_string().into())).await?;
        let mut progress = self.progress.lock().unwrap();
        for (_, partition, offset) in batch.drain(..) {
            progress.acked(partition, offset);
        }
        Ok(())
    }

    fn keep_token(&mut self, token: &Value) {
        if let Some(token) = token.as_str() {
            self.resume_token = Some(token.to_string());
        }
    }

    pub(super) fn voluntary(&self) {
        self.counters.voluntary_reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) async fn sse_session(&mut self, base: &str, last_event_id: &mut Option<String>) -> anyhow::Result<Ended> {
        let http = reqwest::Client::new();
        // SSE sessions do not refresh: at the token's expiry the stream closes (4004) and the
        // client comes back with a new one, resuming by its Last-Event-ID.
        let (token, token_exp) = self.token();
        let mut request = http.get(format!("{base}/sse?client_id={}&topics={TOPIC}&token={token}", self.id));
        if let Some(id) = last_event_id.as_ref() {
            request = request.header("Last-Event-ID", id.clone());
        }
        let mut stream = tokio::time::timeout(Duration::from_secs(5), request.send()).await.context("connect timed out")??;
        if !stream.status().is_success() {
            if matches!(stream.status().as_u16(), 401 | 403) {
                self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            }
            bail!("GET /sse answered {}", stream.status());
        }
        let wander = self.wander_deadline();
        let mut buffer: Vec<u8> = Vec::new();
        let mut frames_url: Option<String> = None;
        let mut req = 0u64;
        loop {
            let chunk = tokio::select! {
                chunk = tokio::time::timeout(CLIENT_SILENCE, stream.chunk()) => chunk,
                _ = self.stop.changed() => return Ok(Ended::Stop),
                _ = async { tokio::time::sleep_until(wander.expect("guarded")).await }, if wander.is_some() => {
                    self.voluntary();
                    return Ok(Ended::Again);
                }
            };
            match chunk.context("silent stream")?? {
                Some(chunk) => buffer.extend_from_slice(&chunk),
                None => return Ok(Ended::Again),
            }
            let mut acks: Vec<String> = Vec::new();
            while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                let message: Vec<u8> = buffer.drain(..end + 2).collect();
                let message = String::from_utf8_lossy(&message).into_owned();
                let (mut kind, mut data, mut id) = ("message", String::new(), None);
                for line in message.lines() {
                    if let Some(k) = line.strip_prefix("event: ") {
                        kind = if k == "event" { "event" } else { k.trim() };
                        if !["event", "welcome", "subscribed", "gap", "close", "reconnect"].contains(&kind) {
                            kind = "other";
                        }
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    } else if let Some(i) = line.strip_prefix("id: ") {
                        id = Some(i.to_string());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let frame: Value = serde_json::from_str(&data).context("SSE data that is not JSON")?;
                match kind {
                    "welcome" => frames_url = frame["ack_url"].as_str().map(|u| format!("{base}{u}")),
                    "subscribed" => self.subscribed(&frame),
                    "event" => {
                        acks.push(self.delivered(&frame));
                        if let Some(id) = id {
                            // The token: the committed offsets as durable when this was written.
                            self.sse_token(&id);
                            *last_event_id = Some(id);
                        }
                    }
                    "gap" => self.gap(&frame),
                    "close" => {
                        if frame["code"] == 4004 {
                            self.expired(token_exp);
                        }
                        // Credentials refused: said in the stream (an `error`, then 1008).
                        if frame["code"] == 1008 {
                            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
                        }
                        return Ok(Ended::Again);
                    }
                    _ => {}
                }
            }
            if acks.is_empty() {
                continue;
            }
            let Some(url) = frames_url.as_ref() else { bail!("an event before the welcome") };
            req += 1;
            let body = json!([{"op": "ack", "delivery_ids": acks, "req": req}]);
            let answered = tokio::time::timeout(Duration::from_secs(5), http.post(url).bearer_auth(self.token().0).json(&body).send())
                .await
                .context("POST of acks timed out")??;
            if !answered.status().is_success() {
                if matches!(answered.status().as_u16(), 401 | 403) {
                    self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(Ended::Again);
            }
            let answers: Vec<Value> = answered.json().await?;
            for answer in answers {
                if answer["type"] == "ack_ok" {
                    self.confirmed(&answer);
                }
            }
        }
    }

    /// Takes an SSE `id:` token as the client's floor.
    pub(super) fn sse_token(&self, token: &str) {
        let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token) else { return };
        let Ok(parsed) = serde_json::from_slice::<Value>(&bytes) else { return };
        let mut progress = self.progress.lock().unwrap();
        for (p, o) in parsed[TOPIC].as_object().into_iter().flatten() {
            // `offset`, or `[offset, epoch]` in a non-zero epoch.
            let offset = o.as_u64().or_else(|| o[0].as_u64());
            if let (Ok(p), Some(o)) = (p.parse::<u32>(), offset) {
                progress.raise_floor(p, o);
            }
        }
    }
}

/// Milliseconds since the epoch by this machine's clock: the true one (the nemesis steps only the
/// gateways' clocks).
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A fresh HS256 token for `client_id`, good for `TOKEN_LIFETIME_SECS` by the true clock, and its
/// `exp` (seconds).
fn token_for(client_id: &str) -> (String, u64) {
    let exp = now_ms() / 1000 + TOKEN_LIFETIME_SECS;
    let claims = json!({"sub": client_id, "exp": exp});
    let token =
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes())).expect("HS256 signs");
    (token, exp)
}

/// Replays by time: every few seconds a fresh client subscribes with `from: {"time": T}`, `T` up
/// to 40 s before and 5 s after the true now (the gateways' clocks are up to 30 s off, so `T` lands
/// before, among and after what their stamps say), and records where each partition started.
/// The history checks each start against the stamps every delivery showed.
pub(super) async fn replay_by_time(
    urls: Arc<Vec<String>>,
    history: Arc<Mutex<History>>,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
    mut rng: Rng,
) {
    let mut n = 0u64;
    while !*stop.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(rng.millis(2_000, 6_000)) => {}
            _ = stop.changed() => return,
        }
        n += 1;
        let client = format!("chaos-time-{n}");
        let base = &urls[rng.below(urls.len() as u64) as usize];
        let time = (now_ms() + 5_000).saturating_sub(rng.below(45_000));
        // A replay cut off by a fault is counted, not judged: it recorded nothing.
        if replay_once(base, &client, time, &history).await.is_err() {
            counters.time_replays_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn replay_once(base: &str, client: &str, time: u64, history: &Mutex<History>) -> anyhow::Result<()> {
    let url = format!("{}/ws?client_id={client}&token={}", base.replacen("http", "ws", 1), token_for(client).0);
    let (mut ws, _) = tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(url)).await.context("connect timed out")??;
    let sent_at = now_ms();
    ws.send(Message::Text(json!({"op": "subscribe", "topic": TOPIC, "from": {"time": time}, "req": "time"}).to_string().into())).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let next = tokio::time::timeout_at(deadline, ws.next()).await.context("no subscribed")?;
        let Some(Ok(Message::Text(text))) = next else { bail!("closed before subscribed") };
        let frame: Value = serde_json::from_str(text.as_str())?;
        match frame["type"].as_str() {
            Some("subscribed") => {
                {
                    let mut history = history.lock().unwrap();
                    for p in frame["partitions"].as_array().into_iter().flatten() {
                        if let (Some(partition), Some(from)) = (p["partition"].as_u64(), p["from"].as_u64()) {
                            history.time_replay(client, key(partition as u32), time, sent_at, from);
                        }
                    }
                }
                let _ = ws.close(None).await;
                return Ok(());
            }
            Some("error") => bail!("an error frame: {frame}"),
            _ => {}
        }
    }
}

/// The instance `/session/recommend` names for `client_id`, asked of `base`.
pub(super) async fn recommended(base: &str, client_id: &str) -> Option<String> {
    let answer = reqwest::Client::new().get(format!("{base}/session/recommend?client_id={client_id}")).timeout(Duration::from_secs(2)).send().await.ok()?;
    let body: Value = answer.json().await.ok()?;
    body["http_url"].as_str().map(str::to_string)
}

/// Publishes batches of 1-4 events with run-unique payload ids at about `rate` events/s, to a
/// random instance each time; records what was answered, and what was only attempted.
pub(super) async fn publish(
    urls: Arc<Vec<String>>,
    rate: u64,
    history: Arc<Mutex<History>>,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
    mut rng: Rng,
) {
    let http = reqwest::Client::new();
    while !*stop.borrow() {
        let n = 1 + rng.below(4);
        let ids: Vec<u64> = (0..n).map(|_| counters.next_payload.fetch_add(1, Ordering::Relaxed)).collect();
        let events: Vec<Value> = ids.iter().map(|id| json!({"key": format!("k{}", id % 32), "payload": {"id": id}})).collect();
        let base = &urls[rng.below(urls.len() as u64) as usize];
        let sent = http.post(format!("{base}/topics/{TOPIC}/events")).json(&json!({"events": events})).timeout(Duration::from_secs(5)).send().await;
        let answered = match sent {
            Ok(response) if response.status().is_success() => response.json::<Value>().await.ok(),
            _ => None,
        };
        let offsets = answered.as_ref().and_then(|a| a["offsets"].as_array()).filter(|o| o.len() == ids.len());
        {
            let mut history = history.lock().unwrap();
            match offsets {
                Some(offsets) => {
                    let answered_at = now_ms();
                    for (id, at) in ids.iter().zip(offsets) {
                        let (partition, offset) = partition_of(at);
                        history.published(key(partition), offset, *id);
                        history.answered_at(key(partition), offset, answered_at);
                    }
                }
                None => {
                    counters.publish_errors.fetch_add(1, Ordering::Relaxed);
                    ids.iter().for_each(|id| history.attempted(*id));
                }
            }
        }
        let pause = if offsets.is_some() { Duration::from_micros(n * 1_000_000 / rate.max(1)) } else { Duration::from_millis(200) };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}
