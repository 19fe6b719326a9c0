//! The stored form of one event in the embedded log.

use crate::core::backend::{Event, NewEvent};

/// The stored form of an event:
/// `timestamp(8) bytes_before(8) flags(1) [key_len(4) key] header_count(4) {len(4) name len(4) value}* payload`.
pub(super) struct StoredEvent {
    pub timestamp: u64,
    pub bytes_before: u64,
    pub encoded_len: u64,
    key: Option<String>,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
    payload_is_json: bool,
}

const FLAG_JSON: u8 = 1;
const FLAG_KEY: u8 = 2;

impl StoredEvent {
    pub fn encode(event: &NewEvent, timestamp: u64, bytes_before: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + event.payload.len());
        out.extend_from_slice(&timestamp.to_be_bytes());
        out.extend_from_slice(&bytes_before.to_be_bytes());
        let flags = if event.payload_is_json { FLAG_JSON } else { 0 } | if event.key.is_some() { FLAG_KEY } else { 0 };
        out.push(flags);
        let push = |out: &mut Vec<u8>, bytes: &[u8]| {
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(bytes);
        };
        if let Some(key) = &event.key {
            push(&mut out, key.as_bytes());
        }
        out.extend_from_slice(&(event.headers.len() as u32).to_be_bytes());
        for (name, value) in &event.headers {
            push(&mut out, name.as_bytes());
            push(&mut out, value.as_bytes());
        }
        out.extend_from_slice(&event.payload);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut fields = Fields { rest: bytes };
        let timestamp = fields.u64()?;
        let bytes_before = fields.u64()?;
        let flags = fields.u8()?;
        let key = if flags & FLAG_KEY != 0 { Some(fields.string()?) } else { None };
        let header_count = fields.u32()?;
        let mut headers = Vec::with_capacity(header_count.min(64) as usize);
        for _ in 0..header_count {
            headers.push((fields.string()?, fields.string()?));
        }
        Some(Self {
            timestamp,
            bytes_before,
            encoded_len: bytes.len() as u64,
            key,
            headers,
            payload: fields.rest.to_vec(),
            payload_is_json: flags & FLAG_JSON != 0,
        })
    }

    pub fn into_event(self, partition: u32, offset: u64) -> Event {
        Event {
            partition,
            offset,
            timestamp: self.timestamp,
            key: self.key,
            headers: self.headers,
            headers_base64: Vec::new(),
            payload: self.payload,
            payload_is_json: self.payload_is_json,
            undecodable: false,
            frame: Default::default(),
        }
    }
}

/// A cursor over length-prefixed fields.
struct Fields<'a> {
    rest: &'a [u8],
}

impl Fields<'_> {
    fn u8(&mut self) -> Option<u8> {
        let value = *self.rest.first()?;
        self.rest = &self.rest[1..];
        Some(value)
    }

    fn u64(&mut self) -> Option<u64> {
        let value = u64::from_be_bytes(self.rest.get(..8)?.try_into().ok()?);
        self.rest = &self.rest[8..];
        Some(value)
    }

    fn u32(&mut self) -> Option<u32> {
        let value = u32::from_be_bytes(self.rest.get(..4)?.try_into().ok()?);
        self.rest = &self.rest[4..];
        Some(value)
    }

    fn string(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        let value = String::from_utf8(self.rest.get(..len)?.to_vec()).ok()?;
        self.rest = &self.rest[len..];
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_truncation_is_detected() {
        let event = NewEvent {
            key: Some("k".into()),
            partition: None,
            headers: vec![("a".into(), "1".into()), ("b".into(), String::new())],
            payload: b"{\"x\":1}".to_vec(),
            payload_is_json: true,
        };
        let bytes = StoredEvent::encode(&event, 42, 1000);
        let stored = StoredEvent::decode(&bytes).unwrap();
        assert_eq!((stored.timestamp, stored.bytes_before, stored.encoded_len), (42, 1000, bytes.len() as u64));
        let read = stored.into_event(3, 9);
        assert_eq!((read.partition, read.offset, read.key.as_deref()), (3, 9, Some("k")));
        assert_eq!((read.headers, read.payload, read.payload_is_json), (event.headers, event.payload, true));
        // Cut inside the header block: not an event.
        assert!(StoredEvent::decode(&bytes[..20]).is_none());
        let keyless = NewEvent { key: None, headers: vec![], payload: vec![0xff], payload_is_json: false, partition: None };
        let read = StoredEvent::decode(&StoredEvent::encode(&keyless, 1, 0)).unwrap().into_event(0, 0);
        assert_eq!((read.key, read.payload, read.payload_is_json), (None, vec![0xff], false));
    }
}
