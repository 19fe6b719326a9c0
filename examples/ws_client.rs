//! A tiny WebSocket client for the walkthrough: subscribes to a topic, prints every event and
//! acknowledges it (with a receipt, so each line also shows the durable committed offset).
//!
//! `cargo run --example ws_client -- [ws://127.0.0.1:8080] CLIENT_ID TOPIC [--no-ack]`

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let ack = !args.iter().any(|a| a == "--no-ack");
    args.retain(|a| a != "--no-ack");
    let base = if args.first().is_some_and(|a| a.starts_with("ws")) { args.remove(0) } else { "ws://127.0.0.1:8080".into() };
    let [client_id, topic] = <[String; 2]>::try_from(args).map_err(|_| "usage: ws_client [URL] CLIENT_ID TOPIC [--no-ack]")?;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{base}/ws?client_id={client_id}")).await?;
    ws.send(Message::Text(json!({"op": "subscribe", "topic": topic, "req": "sub"}).to_string().into())).await?;
    while let Some(message) = ws.next().await {
        let text = match message? {
            Message::Text(text) => text,
            Message::Close(frame) => {
                println!("closed: {frame:?}");
                break;
            }
            _ => continue,
        };
        println!("{text}");
        let frame: Value = serde_json::from_str(text.as_str())?;
        if ack && frame["type"] == "event" {
            let ack = json!({"op": "ack", "delivery_id": frame["delivery_id"], "req": frame["offset"]});
            ws.send(Message::Text(ack.to_string().into())).await?;
        }
    }
    Ok(())
}
