//! One event as a publisher writes it (`POST /topics/{topic}/events`, the `publish` frame):
//! `{"key"?, "partition"?, "headers"?, "payload" | "payload_base64"}`, the payload kept as raw
//! JSON text, never parsed into a tree.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::backend::NewEvent;

/// One event of a publish body. `payload` is kept as raw JSON text, never parsed into a tree.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedEvent<'a> {
    #[serde(default)]
    key: Option<String>,
    #[serde(default, deserialize_with = "crate::core::whole_number::optional_whole")]
    partition: Option<u32>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    /// `Some` whenever the field is present, `null` included (a JSON payload like any other).
    #[serde(default, borrow, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
    /// Binary payloads, base64 (an extension: `payload` must be JSON).
    #[serde(default)]
    payload_base64: Option<String>,
}

/// Deserializes a present field as `Some`, even when its value is `null`.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue as Deserialize>::deserialize(deserializer).map(Some)
}

/// Standard base64 with padding that ignores the unused low bits of the last character
/// (`"N2=="` decodes like `"Nw=="`): the document's pattern accepts both, as do most decoders, and
/// the bits carry no data.
pub(crate) const LENIENT_BASE64: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(&base64::alphabet::STANDARD, base64::engine::general_purpose::PAD.with_decode_allow_trailing_bits(true));

/// What one publish may carry (`limits.max_batch_events`, `max_key_bytes`,
/// `max_header_name_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct EventBounds {
    pub max_batch_events: usize,
    pub max_key_bytes: usize,
    pub max_header_name_bytes: usize,
}

pub fn to_new_event(event: PublishedEvent, bounds: &EventBounds) -> Result<NewEvent, String> {
    if let Some(key) = event.key.as_ref().filter(|key| key.len() > bounds.max_key_bytes) {
        return Err(format!("key is {} bytes; at most {} (limits.max_key_bytes)", key.len(), bounds.max_key_bytes));
    }
    if let Some(name) = event.headers.iter().flatten().map(|(name, _)| name).find(|name| name.len() > bounds.max_header_name_bytes) {
        return Err(format!("a header name is {} bytes; at most {} (limits.max_header_name_bytes)", name.len(), bounds.max_header_name_bytes));
    }
    let (payload, payload_is_json) = match (event.payload, event.payload_base64) {
        (Some(raw), None) => (raw.get().as_bytes().to_vec(), true),
        (None, Some(b64)) => {
            let bytes = LENIENT_BASE64.decode(b64).map_err(|e| format!("payload_base64 is not base64: {e}"))?;
            let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok();
            (bytes, is_json)
        }
        (Some(_), Some(_)) => return Err("give payload or payload_base64, not both".into()),
        (None, None) => return Err("payload is required".into()),
    };
    Ok(NewEvent { key: event.key, partition: event.partition, headers: event.headers.unwrap_or_default().into_iter().collect(), payload, payload_is_json })
}

/// A publish's `events` list (JSON text) as events to write: at least one, within `bounds`.
pub fn parse_events(events: &str, bounds: &EventBounds) -> Result<Vec<NewEvent>, String> {
    let max = bounds.max_batch_events;
    let raw: Vec<PublishedEvent> = serde_json::from_str(events).map_err(|e| format!("\"events\" is not a list of events: {e}"))?;
    if raw.is_empty() {
        return Err("\"events\" is empty".into());
    }
    if raw.len() > max {
        return Err(format!("{} events in one publish; at most {max} (limits.max_batch_events)", raw.len()));
    }
    raw.into_iter().enumerate().map(|(i, e)| to_new_event(e, bounds).map_err(|m| format!("event {i}: {m}"))).collect()
}
