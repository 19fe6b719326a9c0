//! A small WebSocket client for the walkthrough: subscribes to a topic, prints every frame and
//! acknowledges each event (with a receipt, so each line also shows the durable committed offset).
//!
//! It follows a takeover by itself, by the rules of PROTOCOL.md and the JS client
//! (`clients/js/ackgate.js`): after any close that is not final (final: 1008, 4001) or a dropped
//! connection it waits (exponential backoff with jitter), asks `GET /session/recommend` of an
//! instance it knows (the one it was given, `--peer` URLs, every instance an answer named),
//! connects to the instance named and subscribes again with the newest resume token the gateway
//! issued it (`subscribed`'s `token`, `ack_ok`'s `tokens`; every ack here asks for an `ack_ok`): an
//! opaque string naming, per partition, the offset after its contiguous acknowledged floor as the
//! gateway confirmed it durable. The instances of a cluster share `cluster.token_key`, so any of
//! them takes it.
//!
//! `scripts/client [ws://127.0.0.1:8080] CLIENT_ID TOPIC [--no-ack] [--peer http://host:port]...`

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// Closes after which a client must not reconnect by itself.
const FINAL_CLOSES: [u16; 2] = [1008, 4001];

/// The newest resume token the gateway issued: only confirmed progress goes into one, so an ack
/// lost with the connection means one redelivery, never a skipped event.
type Progress = Option<String>;

enum Ended {
    /// Final close (or the server is gone for good): stop.
    Final(String),
    /// Anything else: reconnect.
    Retry(String),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let ack = !args.iter().any(|a| a == "--no-ack");
    args.retain(|a| a != "--no-ack");
    let mut known: Vec<String> = Vec::new();
    while let Some(at) = args.iter().position(|a| a == "--peer") {
        args.remove(at);
        if at < args.len() {
            known.push(args.remove(at).trim_end_matches('/').to_string());
        }
    }
    let base = if args.first().is_some_and(|a| a.starts_with("ws")) { args.remove(0) } else { "ws://127.0.0.1:8080".into() };
    let [client_id, topic] = <[String; 2]>::try_from(args).map_err(|_| "usage: ws_client [URL] CLIENT_ID TOPIC [--no-ack] [--peer URL]...")?;
    let ws_url = format!("{}/ws", base.trim_end_matches('/').trim_end_matches("/ws"));
    known.insert(0, http_base(&ws_url));
    // Where to connect, in order: the instance recommended, then the one that recommended it.
    let mut candidates = vec![ws_url];
    let mut progress: Progress = None;
    let mut attempt = 0u32;
    loop {
        match session(&candidates, &client_id, &topic, ack, &mut progress).await {
            Ended::Final(why) => {
                println!("closed for good: {why}");
                return Ok(());
            }
            Ended::Retry(why) => {
                attempt += 1;
                let pause = backoff(attempt);
                println!("connection ended ({why}); reconnect attempt {attempt} in {} ms", pause.as_millis());
                tokio::time::sleep(pause).await;
                if let Some((named, answered)) = recommended(&mut known, &client_id).await {
                    candidates = if named == answered { vec![named] } else { vec![named, answered] };
                }
                println!("reconnecting to {}", candidates.join(", else "));
            }
        }
    }
}

/// One connection to the first of `ws_urls` that accepts it: subscribe (with the resume token
/// once there is one), print, ack. The instance that answered /session/recommend comes second: it
/// is alive, while the one it named may have died before its probes noticed.
async fn session(ws_urls: &[String], client_id: &str, topic: &str, ack: bool, progress: &mut Progress) -> Ended {
    let mut failures = Vec::new();
    let mut connected = None;
    for ws_url in ws_urls {
        match tokio_tungstenite::connect_async(format!("{ws_url}?client_id={client_id}")).await {
            Ok((ws, _)) => {
                connected = Some(ws);
                break;
            }
            Err(e) => failures.push(format!("connect to {ws_url}: {e}")),
        }
    }
    let Some(mut ws) = connected else { return Ended::Retry(failures.join("; ")) };
    let mut subscribe = json!({"op": "subscribe", "topic": topic, "req": "sub"});
    if let Some(token) = progress {
        subscribe["resume"] = json!(token);
    }
    if let Err(e) = ws.send(Message::Text(subscribe.to_string().into())).await {
        return Ended::Retry(format!("send: {e}"));
    }
    while let Some(message) = ws.next().await {
        let text = match message {
            Ok(Message::Text(text)) => text,
            Ok(Message::Close(frame)) => {
                let code = frame.as_ref().map_or(1005, |f| u16::from(f.code));
                let why = format!("close {code} {}", frame.map(|f| f.reason.to_string()).unwrap_or_default());
                return if FINAL_CLOSES.contains(&code) { Ended::Final(why) } else { Ended::Retry(why) };
            }
            Ok(_) => continue,
            Err(e) => return Ended::Retry(format!("connection failed: {e}")),
        };
        println!("{text}");
        let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else { continue };
        match frame["type"].as_str() {
            Some("subscribed") => {
                if let Some(token) = frame["token"].as_str() {
                    *progress = Some(token.to_string());
                }
            }
            // `progress` frames carry fresh tokens too (for acks without a receipt).
            Some("ack_ok" | "progress") => {
                if let Some(token) = frame["tokens"][topic].as_str() {
                    *progress = Some(token.to_string());
                }
            }
            Some("event") if ack => {
                let ack = json!({"op": "ack", "delivery_id": frame["delivery_id"], "req": frame["offset"]});
                if let Err(e) = ws.send(Message::Text(ack.to_string().into())).await {
                    return Ended::Retry(format!("send: {e}"));
                }
            }
            _ => {}
        }
    }
    Ended::Retry("connection closed without a close frame".into())
}

/// Asks each known instance in turn which instance this client should use; learns the answer.
/// Returns the `/ws` URL named and the one of the instance that answered.
async fn recommended(known: &mut Vec<String>, client_id: &str) -> Option<(String, String)> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
    for base in known.clone() {
        let Ok(answer) = http.get(format!("{base}/session/recommend")).query(&[("client_id", client_id)]).send().await else { continue };
        let Ok(answer) = answer.json::<Value>().await else { continue };
        if let Some(url) = answer["http_url"].as_str().map(|u| u.trim_end_matches('/').to_string()) {
            if !known.contains(&url) {
                known.push(url);
            }
        }
        if let Some(ws_url) = answer["ws_url"].as_str() {
            let answered = format!("{}/ws", base.replacen("https://", "wss://", 1).replacen("http://", "ws://", 1));
            return Some((ws_url.to_string(), answered));
        }
    }
    None
}

/// 250 ms doubling up to 10 s, each with jitter (half to all of it).
fn backoff(attempt: u32) -> Duration {
    let full = 250u64.saturating_mul(1 << attempt.min(6).saturating_sub(1)).min(10_000);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
    Duration::from_millis(full / 2 + nanos % (full / 2 + 1))
}

/// "ws://host:8080/ws" -> "http://host:8080".
fn http_base(ws_url: &str) -> String {
    let base = ws_url.trim_end_matches('/').trim_end_matches("/ws");
    base.replacen("wss://", "https://", 1).replacen("ws://", "http://", 1)
}
