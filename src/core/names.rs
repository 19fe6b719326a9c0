//! Validated names and the offset key built from them.
//!
//! Every name that reaches the store or the dispatcher passes through a `parse` constructor here,
//! so the rest of the code never sees a raw string. `#` is outside both alphabets, so the display
//! key `topic#client_id#partition` can never be ambiguous; the store still encodes keys with length
//! prefixes (see `OffsetKey::encode`) and never hashes them (the Iggy review's collision lesson).

use std::fmt;
use std::sync::Arc;

/// Why a name was refused; the message is shown to the client as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidName(pub String);

fn check(kind: &str, value: &str, max: usize, extra: &[u8]) -> Result<(), InvalidName> {
    if value.is_empty() || value.len() > max {
        return Err(InvalidName(format!("{kind} must be 1 to {max} characters, got {}", value.len())));
    }
    if let Some(bad) = value.bytes().find(|b| !(b.is_ascii_alphanumeric() || b"._-".contains(b) || extra.contains(b))) {
        let allowed = String::from_utf8_lossy(extra);
        return Err(InvalidName(format!("{kind} {value:?} contains {:?}; allowed are letters, digits and . _ -{allowed}", bad as char)));
    }
    Ok(())
}

/// A topic name: `^[A-Za-z0-9._-]{1,249}$`, or a lite topic `parent@lite` (RocketMQ 5.x lite
/// topics, `rocketmq.lite_parents`) whose two halves each follow that rule: `@` is outside the
/// alphabet, so a lite topic never collides with a regular one. Cheap to clone (shared string).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(Arc<str>);

impl TopicName {
    pub const MAX_LEN: usize = 249;

    pub fn parse(value: &str) -> Result<Self, InvalidName> {
        match value.split_once('@') {
            Some((parent, lite)) => {
                check("topic", parent, Self::MAX_LEN, b"")?;
                check("lite topic", lite, Self::MAX_LEN, b"")?;
            }
            None => check("topic", value, Self::MAX_LEN, b"")?,
        }
        Ok(Self(value.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `(parent, lite)` of a lite topic `parent@lite`; `None` for a regular topic.
    pub fn lite(&self) -> Option<(&str, &str)> {
        self.0.split_once('@')
    }
}

/// A durable consumer identity: `^[A-Za-z0-9._:@-]{1,128}$`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(Arc<str>);

impl ClientId {
    pub const MAX_LEN: usize = 128;

    pub fn parse(value: &str) -> Result<Self, InvalidName> {
        check("client_id", value, Self::MAX_LEN, b":@")?;
        Ok(Self(value.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The identity a shared subscription's progress is stored under: `$` and the group's name.
    /// `$` is outside the client id alphabet, so no client's offset key, dead letter or gap can
    /// ever be a group's, whatever the client is named (the Iggy review's collision lesson).
    pub fn of_group(group: &GroupName) -> Self {
        Self(format!("{GROUP_MARK}{group}").into())
    }

    /// The group whose identity this is (`of_group`); `None` for a client.
    pub fn group(&self) -> Option<&str> {
        self.0.strip_prefix(GROUP_MARK)
    }

    /// A client id, or a group's identity as the store holds it (`of_group`).
    pub fn parse_stored(value: &str) -> Result<Self, InvalidName> {
        match value.strip_prefix(GROUP_MARK) {
            Some(group) => Ok(Self::of_group(&GroupName::parse(group)?)),
            None => Self::parse(value),
        }
    }
}

/// Marks a group's identity among client ids (`ClientId::of_group`).
const GROUP_MARK: char = '$';

/// A shared subscription's name (`subscribe`'s `group`): the topic name rule, without lite
/// topics' `@`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupName(Arc<str>);

impl GroupName {
    pub fn parse(value: &str) -> Result<Self, InvalidName> {
        check("group", value, TopicName::MAX_LEN, b"")?;
        Ok(Self(value.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One partition of one topic: the unit the pull layer reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: TopicName,
    pub partition: u32,
}

impl TopicPartition {
    pub fn new(topic: TopicName, partition: u32) -> Self {
        Self { topic, partition }
    }
}

impl TopicPartition {
    /// The pull-layer key (the seed's two forms): `topic#partition` for a regular topic,
    /// `parent#lite@queue` for a lite topic.
    pub fn pull_key(&self) -> String {
        match self.topic.lite() {
            Some((parent, lite)) => format!("{parent}#{lite}@{}", self.partition),
            None => format!("{}#{}", self.topic, self.partition),
        }
    }

    /// Inverse of `pull_key`.
    pub fn parse_pull_key(key: &str) -> Option<Self> {
        let (head, tail) = key.split_once('#')?;
        let (topic, partition) = match tail.rsplit_once('@') {
            Some((lite, queue)) => (format!("{head}@{lite}"), queue),
            None => (head.to_string(), tail),
        };
        if partition.is_empty() || !partition.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self::new(TopicName::parse(&topic).ok()?, partition.parse().ok()?))
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.topic, self.partition)
    }
}

/// The ack-layer key: one committed offset per `topic#client_id#partition`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffsetKey {
    pub topic: TopicName,
    pub client_id: ClientId,
    pub partition: u32,
}

impl OffsetKey {
    pub fn new(topic: TopicName, client_id: ClientId, partition: u32) -> Self {
        Self { topic, client_id, partition }
    }

    /// Store encoding, ordered by topic: `len(topic) topic len(client) client partition(be)`.
    /// Length prefixes make every prefix of a key (topic, or topic + client) a distinct byte
    /// prefix, so a filter is a prefix scan and no two keys can collide.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = topic_prefix(&self.topic);
        push_name(&mut out, self.client_id.as_str());
        out.extend_from_slice(&self.partition.to_be_bytes());
        out
    }

    /// Second index, ordered by client: `len(client) client len(topic) topic partition(be)`.
    pub fn encode_by_client(&self) -> Vec<u8> {
        let mut out = client_prefix(&self.client_id);
        push_name(&mut out, self.topic.as_str());
        out.extend_from_slice(&self.partition.to_be_bytes());
        out
    }

    /// Inverse of `encode`; `None` for bytes that are not a key this code wrote.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (topic, rest) = take_name(bytes)?;
        let (client, rest) = take_name(rest)?;
        let partition = u32::from_be_bytes(rest.try_into().ok()?);
        Some(Self::new(TopicName::parse(topic).ok()?, ClientId::parse_stored(client).ok()?, partition))
    }

    /// Inverse of `encode_by_client`.
    pub fn decode_by_client(bytes: &[u8]) -> Option<Self> {
        let (client, rest) = take_name(bytes)?;
        let (topic, rest) = take_name(rest)?;
        let partition = u32::from_be_bytes(rest.try_into().ok()?);
        Some(Self::new(TopicName::parse(topic).ok()?, ClientId::parse_stored(client).ok()?, partition))
    }

    /// Inverse of the display form `topic#client_id#partition` (neither name may hold `#`).
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('#');
        let (topic, client, partition) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some(Self::new(TopicName::parse(topic).ok()?, ClientId::parse_stored(client).ok()?, partition.parse().ok()?))
    }
}

/// The display form `topic#client_id#partition` used in REST answers and logs.
impl fmt::Display for OffsetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}#{}", self.topic, self.client_id, self.partition)
    }
}

/// Byte prefix of every key of `topic` in the topic-ordered encoding.
pub fn topic_prefix(topic: &TopicName) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    push_name(&mut out, topic.as_str());
    out
}

/// Byte prefix of every key of `client` in the client-ordered encoding.
pub fn client_prefix(client: &ClientId) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    push_name(&mut out, client.as_str());
    out
}

fn push_name(out: &mut Vec<u8>, name: &str) {
    // Names are at most 499 bytes (validated: a lite topic is two names and an `@`), so one u16
    // always holds the length.
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
}

fn take_name(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u16::from_be_bytes(bytes.get(..2)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(bytes.get(2..2 + len)?).ok()?;
    Some((name, &bytes[2 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_protocol_alphabets() {
        assert!(TopicName::parse("orders.v1_eu-west").is_ok());
        assert!(TopicName::parse("").is_err());
        assert!(TopicName::parse("a#b").is_err());
        assert!(TopicName::parse("a:b").is_err());
        assert!(TopicName::parse(&"t".repeat(249)).is_ok());
        assert!(TopicName::parse(&"t".repeat(250)).is_err());
        assert_eq!(TopicName::parse("chat@room-42").unwrap().lite(), Some(("chat", "room-42")));
        assert_eq!(TopicName::parse("chat").unwrap().lite(), None);
        for bad in ["@room", "chat@", "chat@a@b", "chat@a#b", "chat@a b", "a#b@c"] {
            assert!(TopicName::parse(bad).is_err(), "{bad}");
        }
        assert!(TopicName::parse(&format!("{}@{}", "p".repeat(249), "l".repeat(249))).is_ok());
        assert!(TopicName::parse(&format!("p@{}", "l".repeat(250))).is_err());
        assert!(ClientId::parse("user:42@web-1").is_ok());
        assert!(ClientId::parse("a#b").is_err());
        // A group's identity is no client's, and the store reads both back.
        let group = ClientId::of_group(&GroupName::parse("workers").unwrap());
        assert_eq!((group.as_str(), group.group()), ("$workers", Some("workers")));
        assert!(ClientId::parse("$workers").is_err());
        assert_eq!(ClientId::parse_stored("$workers").unwrap(), group);
        assert_eq!(ClientId::parse_stored("workers").unwrap().group(), None);
        assert!(ClientId::parse_stored("$").is_err() && ClientId::parse_stored("$a@b").is_err());
        let key = OffsetKey::new(TopicName::parse("t").unwrap(), group.clone(), 3);
        assert_eq!(OffsetKey::decode(&key.encode()), Some(key.clone()));
        assert_eq!(OffsetKey::decode_by_client(&key.encode_by_client()), Some(key.clone()));
        assert_eq!(OffsetKey::parse(&key.to_string()), Some(key));
        assert!(ClientId::parse("a b").is_err());
        assert!(ClientId::parse(&"c".repeat(128)).is_ok());
        assert!(ClientId::parse(&"c".repeat(129)).is_err());
    }

    #[test]
    fn pull_keys_take_the_seeds_two_forms_and_parse_back() {
        let regular = TopicPartition::new(TopicName::parse("orders").unwrap(), 3);
        let lite = TopicPartition::new(TopicName::parse("chat@room-42").unwrap(), 0);
        assert_eq!((regular.pull_key().as_str(), lite.pull_key().as_str()), ("orders#3", "chat#room-42@0"));
        for tp in [regular, lite] {
            assert_eq!(TopicPartition::parse_pull_key(&tp.pull_key()), Some(tp));
        }
        for bad in ["orders", "orders#", "orders#x", "chat#room@", "chat#@0", "#room@0", "chat#room@-1", "orders#4294967296", "chat#a@b@0"] {
            assert_eq!(TopicPartition::parse_pull_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_round_trip_and_do_not_collide() {
        let key = |t: &str, c: &str, p| OffsetKey::new(TopicName::parse(t).unwrap(), ClientId::parse(c).unwrap(), p);
        // Without length prefixes "ab"+"c" and "a"+"bc" would share bytes.
        let a = key("ab", "c", 1);
        let b = key("a", "bc", 1);
        assert_ne!(a.encode(), b.encode());
        assert_ne!(a.encode_by_client(), b.encode_by_client());
        assert_eq!(OffsetKey::decode(&a.encode()), Some(a.clone()));
        assert_eq!(OffsetKey::decode_by_client(&b.encode_by_client()), Some(b));
        assert!(a.encode().starts_with(&topic_prefix(&a.topic)));
        assert!(!key("abc", "x", 0).encode().starts_with(&topic_prefix(&a.topic)));
        assert_eq!(a.to_string(), "ab#c#1");
    }
}
