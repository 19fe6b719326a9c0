//! Messages as the broker stores and returns them (PULL and POP bodies), and the properties
//! string of a message sent.

use std::collections::HashMap;

use crate::core::backend::Event;

const MAGIC_V1: i32 = -626_843_481;
const MAGIC_V2: i32 = -626_843_477;
/// sysFlag bits (Apache RocketMQ's `MessageSysFlag`).
const COMPRESSED: i32 = 1;
const BORN_HOST_V6: i32 = 1 << 4;
const STORE_HOST_V6: i32 = 1 << 5;
/// The compression type of a compressed body: 1 lz4, 2 zstd, 3 zlib, and 0 zlib too (producers
/// from before the type bits).
const COMPRESSION_TYPE: i32 = 0x7 << 8;
/// A body that inflates past this is refused: a small message must not take gigabytes, and a
/// PULL answer holds up to a few hundred messages. Twice RocketMQ's default `maxMessageSize`.
const MAX_INFLATED: u64 = 8 << 20;
const NAME_VALUE_SEPARATOR: u8 = 1;
const PROPERTY_SEPARATOR: u8 = 2;

/// Property holding the event's key (RocketMQ's message keys).
pub const KEYS: &str = "KEYS";
/// Property holding a message id unique per send; a revived (retried) message keeps it, which is
/// how ackgate maps it back to its original queue and offset.
pub const UNIQ_KEY: &str = "UNIQ_KEY";
/// Property the broker sets on a POP retry message: its receipt handle.
pub const POP_CK: &str = "POP_CK";

/// Properties RocketMQ itself sets or reads; every other property is a user header.
const SYSTEM_PROPERTIES: &[&str] = &[
    "KEYS",
    "TAGS",
    "WAIT",
    "DELAY",
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "TRAN_MSG",
    "PGROUP",
    "MIN_OFFSET",
    "MAX_OFFSET",
    "BUYER_ID",
    "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG",
    "CORRECTION_FLAG",
    "MQ2_FLAG",
    "RECONSUME_TIME",
    "MSG_REGION",
    "TRACE_ON",
    "UNIQ_KEY",
    "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME",
    "POP_CK",
    "POP_CK_OFFSET",
    "1ST_POP_TIME",
    "CLUSTER",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "SHARDING_KEY",
    "__STARTDELIVERTIME",
    "TIMER_DELIVER_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TIMER_OUT_MS",
    "TIMER_ENQUEUE_MS",
    "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES",
    "TIMER_DEL_UNIQKEY",
    "INNER_NUM",
    "INNER_BASE",
    "INNER_MULTI_DISPATCH",
    "INNER_MULTI_QUEUE_OFFSET",
    "__LITE_TOPIC",
    "CONSUME_CONTEXT",
    "BORN_HOST",
    "DUP_INFO",
    "EXTEND_UNIQ_INFO",
    "bname",
    "propertiesString",
];

/// One message decoded from a broker body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub born_timestamp: u64,
    pub store_timestamp: u64,
    pub reconsume_times: i32,
    pub properties: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl StoredMessage {
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// The message as an ackgate event: partition = queue id, offset = queue offset.
    pub fn into_event(self) -> Event {
        let mut headers: Vec<(String, String)> =
            self.properties.iter().filter(|(k, _)| !SYSTEM_PROPERTIES.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        headers.sort();
        let payload_is_json = serde_json::from_slice::<serde::de::IgnoredAny>(&self.body).is_ok();
        Event {
            partition: self.queue_id,
            offset: self.queue_offset,
            timestamp: self.store_timestamp,
            key: self.properties.get(KEYS).cloned(),
            headers,
            headers_base64: Vec::new(),
            payload: self.body,
            payload_is_json,
            undecodable: false,
            frame: Default::default(),
        }
    }
}

/// A message of a body that could not be decoded, with its queue and offset when the fixed part
/// of its header was readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    pub queue_id: Option<u32>,
    pub queue_offset: Option<u64>,
    pub error: String,
}

/// One message of a body, decoded or not.
pub type Decoded = Result<StoredMessage, Undecodable>;

/// Decodes every message of a body. A message that does not decode is an `Err` in its place
/// and the next one is decoded after it; a size that leaves no way to find the next message
/// (truncated, negative) ends the list with an `Err` that knows no offset.
pub fn decode_messages(mut body: &[u8]) -> Vec<Decoded> {
    let mut messages = Vec::new();
    while !body.is_empty() {
        let size = read_i32(&mut &body[..]).unwrap_or(0);
        if size <= 0 || size as usize > body.len() {
            let error = format!("message of {size} bytes in a body of {}", body.len());
            messages.push(Err(Undecodable { queue_id: None, queue_offset: None, error }));
            break;
        }
        let (one, rest) = body.split_at(size as usize);
        messages.push(decode_one(one).map_err(|error| Undecodable { queue_id: fixed_queue_id(one), queue_offset: fixed_queue_offset(one), error }));
        body = rest;
    }
    messages
}

/// The queue id at its fixed place in the header (after size, magic, body CRC).
fn fixed_queue_id(m: &[u8]) -> Option<u32> {
    u32::try_from(i32::from_be_bytes(m.get(12..16)?.try_into().ok()?)).ok()
}

/// The queue offset at its fixed place in the header (after the queue id and flag).
fn fixed_queue_offset(m: &[u8]) -> Option<u64> {
    u64::try_from(i64::from_be_bytes(m.get(20..28)?.try_into().ok()?)).ok()
}

fn decode_one(mut m: &[u8]) -> Result<StoredMessage, String> {
    let input = &mut m;
    let _size = read_i32(input)?;
    let magic = read_i32(input)?;
    if magic != MAGIC_V1 && magic != MAGIC_V2 {
        return Err(format!("unknown message magic code {magic}"));
    }
    let _body_crc = read_i32(input)?;
    let queue_id = read_i32(input)?;
    let _flag = read_i32(input)?;
    let queue_offset = read_i64(input)?;
    let _physical_offset = read_i64(input)?;
    let sys_flag = read_i32(input)?;
    let born_timestamp = read_i64(input)?;
    take(input, if sys_flag & BORN_HOST_V6 != 0 { 20 } else { 8 })?;
    let store_timestamp = read_i64(input)?;
    take(input, if sys_flag & STORE_HOST_V6 != 0 { 20 } else { 8 })?;
    let reconsume_times = read_i32(input)?;
    let _prepared_transaction_offset = read_i64(input)?;
    let body_len = read_i32(input)?;
    let body = take(input, usize::try_from(body_len).map_err(|_| "negative body length")?)?;
    let body = if sys_flag & COMPRESSED != 0 { decompress(sys_flag, body, MAX_INFLATED)? } else { body.to_vec() };
    let topic_len = if magic == MAGIC_V2 { usize::try_from(read_i16(input)?).map_err(|_| "negative topic length")? } else { take(input, 1)?[0] as usize };
    let topic = String::from_utf8_lossy(take(input, topic_len)?).into_owned();
    let properties_len = usize::try_from(read_i16(input)?).map_err(|_| "negative properties length")?;
    let properties = decode_properties(take(input, properties_len)?);
    Ok(StoredMessage {
        topic,
        queue_id: u32::try_from(queue_id).map_err(|_| format!("queue id {queue_id}"))?,
        queue_offset: u64::try_from(queue_offset).map_err(|_| format!("queue offset {queue_offset}"))?,
        born_timestamp: born_timestamp.max(0) as u64,
        store_timestamp: store_timestamp.max(0) as u64,
        reconsume_times,
        properties,
        body,
    })
}

/// A compressed body as the producer sent it: Apache's Java producer compresses bodies above
/// 4 KiB (zlib unless told otherwise). A type ackgate does not decompress is an error, so the
/// message becomes a dead letter with the reason instead of reaching clients as compressed bytes.
fn decompress(sys_flag: i32, body: &[u8], max_inflated: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    match (sys_flag & COMPRESSION_TYPE) >> 8 {
        0 | 3 => {
            let mut inflated = Vec::new();
            flate2::read::ZlibDecoder::new(body)
                .take(max_inflated + 1)
                .read_to_end(&mut inflated)
                .map_err(|e| format!("a zlib-compressed body does not inflate: {e}"))?;
            if inflated.len() as u64 > max_inflated {
                return Err(format!("a zlib-compressed body inflates past {max_inflated} bytes"));
            }
            Ok(inflated)
        }
        1 => Err("the body is lz4-compressed, which ackgate does not decompress (use zlib, the producer's default)".into()),
        2 => Err("the body is zstd-compressed, which ackgate does not decompress (use zlib, the producer's default)".into()),
        other => Err(format!("the body is compressed with unknown type {other}")),
    }
}

/// `name \x01 value \x02 ...`
fn decode_properties(bytes: &[u8]) -> HashMap<String, String> {
    bytes
        .split(|b| *b == PROPERTY_SEPARATOR)
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == NAME_VALUE_SEPARATOR)?;
            let (name, value) = (&entry[..at], &entry[at + 1..]);
            (!name.is_empty()).then(|| (String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned()))
        })
        .collect()
}

pub fn encode_properties(properties: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (name, value) in properties {
        out.push_str(name);
        out.push(NAME_VALUE_SEPARATOR as char);
        out.push_str(value);
        out.push(PROPERTY_SEPARATOR as char);
    }
    out
}

/// Whether `text` can be a property name or value (the separators cannot be escaped).
pub fn is_property_safe(text: &str) -> bool {
    !text.bytes().any(|b| b == NAME_VALUE_SEPARATOR || b == PROPERTY_SEPARATOR)
}

/// Whether a header name would be taken for one of RocketMQ's own properties.
pub fn is_system_property(name: &str) -> bool {
    SYSTEM_PROPERTIES.contains(&name)
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if input.len() < n {
        return Err(format!("message truncated: wanted {n} bytes, {} left", input.len()));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

fn read_i16(input: &mut &[u8]) -> Result<i16, String> {
    Ok(i16::from_be_bytes(take(input, 2)?.try_into().expect("2 bytes")))
}

fn read_i32(input: &mut &[u8]) -> Result<i32, String> {
    Ok(i32::from_be_bytes(take(input, 4)?.try_into().expect("4 bytes")))
}

fn read_i64(input: &mut &[u8]) -> Result<i64, String> {
    Ok(i64::from_be_bytes(take(input, 8)?.try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message in the broker's stored layout (IPv4 hosts, magic v1).
    fn stored(queue_id: i32, offset: i64, topic: &str, properties: &str, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&0i32.to_be_bytes()); // size, patched below
        m.extend_from_slice(&MAGIC_V1.to_be_bytes());
        m.extend_from_slice(&0i32.to_be_bytes());
        m.extend_from_slice(&queue_id.to_be_bytes());
        m.extend_from_slice(&0i32.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&1234i64.to_be_bytes());
        m.extend_from_slice(&0i32.to_be_bytes());
        m.extend_from_slice(&111i64.to_be_bytes());
        m.extend_from_slice(&[127, 0, 0, 1, 0, 0, 0, 1]);
        m.extend_from_slice(&222i64.to_be_bytes());
        m.extend_from_slice(&[127, 0, 0, 1, 0, 0, 0, 2]);
        m.extend_from_slice(&0i32.to_be_bytes());
        m.extend_from_slice(&0i64.to_be_bytes());
        m.extend_from_slice(&(body.len() as i32).to_be_bytes());
        m.extend_from_slice(body);
        m.push(topic.len() as u8);
        m.extend_from_slice(topic.as_bytes());
        m.extend_from_slice(&(properties.len() as i16).to_be_bytes());
        m.extend_from_slice(properties.as_bytes());
        let size = m.len() as i32;
        m[..4].copy_from_slice(&size.to_be_bytes());
        m
    }

    /// `stored` with its sysFlag (at its fixed place, after the physical offset) set to `flag`.
    fn stored_with_flag(flag: i32, body: &[u8]) -> Vec<u8> {
        let mut m = stored(1, 5, "t", "", body);
        m[36..40].copy_from_slice(&flag.to_be_bytes());
        m
    }

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// Issue 22, item 6: a body Apache's producer compressed (sysFlag bit 0; zlib by the type bits
    /// 0 or 3) is delivered inflated; lz4, zstd, a broken stream or a bomb are undecodable with
    /// the reason, never the compressed bytes as a payload. Before, every one came out raw.
    #[test]
    fn compressed_bodies_are_inflated_or_refused_with_the_reason() {
        let payload = br#"{"big":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;
        for flag in [COMPRESSED, COMPRESSED | (3 << 8)] {
            let decoded = decode_messages(&stored_with_flag(flag, &zlib(payload)));
            assert_eq!(decoded[0].as_ref().unwrap().body, payload, "sysFlag {flag:#x}");
        }
        let refused = |flag: i32, body: &[u8]| decode_messages(&stored_with_flag(flag, body)).remove(0).unwrap_err();
        assert!(refused(COMPRESSED | (1 << 8), b"lz4 bytes").error.contains("lz4"));
        assert!(refused(COMPRESSED | (2 << 8), b"zstd bytes").error.contains("zstd"));
        assert!(refused(COMPRESSED | (5 << 8), b"?").error.contains("unknown type 5"));
        let broken = refused(COMPRESSED, b"not zlib at all");
        assert_eq!((broken.queue_id, broken.queue_offset), (Some(1), Some(5)), "the dead letter knows its offset");
        assert!(decompress(COMPRESSED, &zlib(&[0u8; 4097]), 4096).unwrap_err().contains("inflates past 4096"));
        assert_eq!(decompress(COMPRESSED, &zlib(&[0u8; 4096]), 4096).unwrap().len(), 4096, "exactly the bound is fine");
        // The type bits without the compressed bit mean nothing: the body is as stored.
        assert_eq!(decode_messages(&stored_with_flag(3 << 8, b"plain"))[0].as_ref().unwrap().body, b"plain");
    }

    #[test]
    fn decodes_a_body_of_two_messages_into_events() {
        let props = encode_properties(&[(KEYS, "k1"), (UNIQ_KEY, "u1"), ("trace", "abc")]);
        let mut body = stored(2, 7, "orders", &props, br#"{"a":1}"#);
        body.extend(stored(2, 8, "orders", "", b"raw"));
        let messages: Vec<StoredMessage> = decode_messages(&body).into_iter().map(Result::unwrap).collect();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].property(UNIQ_KEY), Some("u1"));
        let event = messages[0].clone().into_event();
        assert_eq!((event.partition, event.offset, event.timestamp), (2, 7, 222));
        assert_eq!(event.key.as_deref(), Some("k1"));
        assert_eq!(event.headers, vec![("trace".to_string(), "abc".to_string())], "system properties are not headers");
        assert!(event.payload_is_json);
        assert!(!messages[1].clone().into_event().payload_is_json);
    }

    /// Issue 20, item 7: a message that does not decode is an error in its place, the next one
    /// still decodes, and its offset is known when its header's fixed part is readable. Before,
    /// one bad message failed the whole body, so every read of the queue failed forever.
    #[test]
    fn a_bad_message_is_an_error_in_its_place_and_the_rest_decode() {
        let whole = stored(0, 1, "t", "", b"x");
        let mut bad_magic = stored(0, 2, "t", "", b"y");
        bad_magic[4] = 0;
        let mut body = whole.clone();
        body.extend(&bad_magic);
        body.extend(stored(0, 3, "t", "", b"z"));
        let decoded = decode_messages(&body);
        assert_eq!(decoded.len(), 3);
        assert_eq!(decoded[0].as_ref().unwrap().queue_offset, 1);
        let bad = decoded[1].as_ref().unwrap_err();
        assert_eq!((bad.queue_id, bad.queue_offset), (Some(0), Some(2)));
        assert!(bad.error.contains("magic"), "{}", bad.error);
        assert_eq!(decoded[2].as_ref().unwrap().queue_offset, 3);
        // A body cut short, or a size of zero: the list ends with an error that knows no offset.
        for cut in [&whole[..whole.len() - 1], &[0, 0, 0, 0][..], &[0xff, 0xff][..]] {
            let decoded = decode_messages(cut);
            assert_eq!(decoded.len(), 1);
            assert_eq!(decoded[0].as_ref().unwrap_err().queue_offset, None);
        }
        // A negative body length inside an intact frame: known offset.
        let mut negative = stored(4, 9, "t", "", b"q");
        negative[84..88].copy_from_slice(&(-5i32).to_be_bytes());
        let decoded = decode_messages(&negative);
        assert_eq!(decoded[0].as_ref().unwrap_err().queue_offset, Some(9));
        assert!(decode_messages(&[]).is_empty());
    }
}
