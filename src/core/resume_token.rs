//! Resume tokens the gateway issues (docs/protocol.md, "Resume tokens"): a fact this gateway (or
//! another instance holding the same `cluster.token_key`) wrote, never a client's claim.
//!
//! A token binds who it was issued to (a client id or a group name), when, and per topic the
//! topic's incarnation and per partition the next offset after the contiguous acknowledged floor
//! with the offset epoch it was seen under. It is the URL-safe base64 of
//! `payload ‖ HMAC-SHA256(key, DOMAIN ‖ payload)[..16]`, prefixed `r1.` (so the older SSE form,
//! base64 JSON, is told apart). The payload is binary with LEB128 numbers: 64 partitions of one
//! topic fit in well under 2 KiB.
//!
//! Verifying checks the MAC first (constant time, `ring`), then what the token says against what
//! the caller holds (`ResumeToken::check`): nothing in a token that fails the MAC is read.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;

use super::names::ClientId;
use super::offsets::OffsetEpoch;
use super::protocol::ResumeOffset;

/// What every token starts with.
const PREFIX: &str = "r1.";
/// Bytes of the MAC kept (128 bits: forging one is 2^128 guesses, each a subscribe).
const MAC_BYTES: usize = 16;
/// Mixed into every MAC, so a key shared with something else never makes a valid token.
const DOMAIN: &[u8] = b"ackgate resume token v1\0";
/// The longest token read (a token of 64 partitions is about 1 KiB; SSE's may name 64 topics).
pub const MAX_TOKEN_CHARS: usize = 64 * 1024;
/// At most this many topics and partitions per topic are read from a token.
const MAX_TOPICS: u64 = 1024;
const MAX_PARTITIONS: u64 = 1 << 16;
/// The key's length when the gateway generates it, and the least `cluster.token_key` may be.
pub const KEY_BYTES: usize = 32;

/// Who a token was issued to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    Client(String),
    Group(String),
}

/// One topic of a token: its incarnation when issued and each partition's floor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFloors {
    pub topic: String,
    pub incarnation: u64,
    pub partitions: BTreeMap<u32, ResumeOffset>,
}

/// What a token says, once its MAC verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeToken {
    pub holder: Holder,
    pub issued_at_ms: u64,
    pub topics: Vec<TopicFloors>,
}

/// Why a token is not applied (`subscribed`'s `resume_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a token, or its MAC does not verify (another key, a change, a made-up token).
    Invalid,
    /// Issued to another client id (or to a group, for a client's own subscription).
    OtherClient,
    /// Issued to another group (or to a client, for a group's subscription).
    OtherGroup,
    /// Issued for an earlier topic of this name (deleted since), or names no floor of this topic.
    OtherIncarnation,
    /// Older than `offsets.retention_secs`: the records it stood for may have expired since.
    Expired,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Invalid => "invalid",
            Self::OtherClient => "other_client",
            Self::OtherGroup => "other_group",
            Self::OtherIncarnation => "other_incarnation",
            Self::Expired => "expired",
        }
    }
}

/// The key tokens are MAC'd with.
pub struct TokenKey(hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    pub fn new(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    fn mac(&self, payload: &[u8]) -> [u8; MAC_BYTES] {
        let mut context = hmac::Context::with_key(&self.0);
        context.update(DOMAIN);
        context.update(payload);
        let tag = context.sign();
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&tag.as_ref()[..MAC_BYTES]);
        out
    }

    /// The token's text.
    pub fn issue(&self, token: &ResumeToken) -> String {
        let mut payload = Vec::with_capacity(64 + token.topics.iter().map(|t| t.topic.len() + 12 * t.partitions.len()).sum::<usize>());
        payload.push(1);
        let (kind, name) = match &token.holder {
            Holder::Client(id) => (0u8, id),
            Holder::Group(name) => (1u8, name),
        };
        payload.push(kind);
        put_bytes(&mut payload, name.as_bytes());
        put_number(&mut payload, token.issued_at_ms);
        put_number(&mut payload, token.topics.len() as u64);
        for topic in &token.topics {
            put_bytes(&mut payload, topic.topic.as_bytes());
            put_number(&mut payload, topic.incarnation);
            put_number(&mut payload, topic.partitions.len() as u64);
            for (partition, floor) in &topic.partitions {
                put_number(&mut payload, u64::from(*partition));
                put_number(&mut payload, floor.offset);
                put_number(&mut payload, floor.epoch);
            }
        }
        let mac = self.mac(&payload);
        payload.extend_from_slice(&mac);
        let mut text = String::with_capacity(PREFIX.len() + payload.len() * 4 / 3 + 4);
        text.push_str(PREFIX);
        URL_SAFE_NO_PAD.encode_string(&payload, &mut text);
        text
    }

    /// What `text` says, when it is a token this key issued.
    pub fn open(&self, text: &str) -> Result<ResumeToken, Refusal> {
        if text.len() > MAX_TOKEN_CHARS {
            return Err(Refusal::Invalid);
        }
        let body = text.strip_prefix(PREFIX).ok_or(Refusal::Invalid)?;
        let bytes = URL_SAFE_NO_PAD.decode(body).map_err(|_| Refusal::Invalid)?;
        if bytes.len() <= MAC_BYTES {
            return Err(Refusal::Invalid);
        }
        let (payload, mac) = bytes.split_at(bytes.len() - MAC_BYTES);
        // Constant time: a forger learns nothing from how long a refusal took.
        if !equal_in_constant_time(&self.mac(payload), mac) {
            return Err(Refusal::Invalid);
        }
        decode_payload(payload).ok_or(Refusal::Invalid)
    }

    /// Is `text` a token (of any key)? The older SSE form and garbage are not.
    pub fn looks_like_token(text: &str) -> bool {
        text.starts_with(PREFIX)
    }
}

impl ResumeToken {
    /// The floors of `topic` this token gives `holder`, if it may: issued to `holder`, for the
    /// topic's current `incarnation`, no older than `max_age_ms` at `now_ms` (0 = no bound).
    pub fn check(&self, holder: &Holder, topic: &str, incarnation: u64, now_ms: u64, max_age_ms: u64) -> Result<BTreeMap<u32, ResumeOffset>, Refusal> {
        if &self.holder != holder {
            return Err(match holder {
                Holder::Client(_) => Refusal::OtherClient,
                Holder::Group(_) => Refusal::OtherGroup,
            });
        }
        if max_age_ms > 0 && now_ms.saturating_sub(self.issued_at_ms) > max_age_ms {
            return Err(Refusal::Expired);
        }
        let floors = self.topics.iter().find(|t| t.topic == topic).ok_or(Refusal::OtherIncarnation)?;
        if floors.incarnation != incarnation {
            return Err(Refusal::OtherIncarnation);
        }
        Ok(floors.partitions.clone())
    }
}

impl TokenKey {
    /// A key of its own, for a dispatcher that was given none (unit tests).
    pub fn random() -> Self {
        Self::new(&Self::random_bytes())
    }

    /// Bytes for a new key, from the system's random source.
    pub fn random_bytes() -> [u8; KEY_BYTES] {
        let mut bytes = [0u8; KEY_BYTES];
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
            // Never on Linux (getrandom); a key of zeros would be forgeable, so no key at all.
            panic!("no random source for a resume token key");
        }
        bytes
    }
}

impl Holder {
    /// The holder whose offsets are stored under `client_id` (a client, or a group's identity).
    pub fn of(client_id: &ClientId) -> Self {
        match client_id.group() {
            Some(group) => Self::Group(group.to_string()),
            None => Self::Client(client_id.to_string()),
        }
    }
}

/// A random, non-zero topic incarnation id (`offsets::TopicIncarnation`).
pub fn new_incarnation_id() -> u64 {
    let mut bytes = [0u8; 8];
    // The system's random source does not fail on Linux; a clock-derived id is still unlike the
    // previous incarnation's, which is all it must be.
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
        bytes = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64).to_be_bytes();
    }
    u64::from_be_bytes(bytes).max(1)
}

fn decode_payload(payload: &[u8]) -> Option<ResumeToken> {
    let mut r = Reader(payload);
    if r.byte()? != 1 {
        return None;
    }
    let kind = r.byte()?;
    let name = r.text()?;
    let holder = match kind {
        0 => Holder::Client(name),
        1 => Holder::Group(name),
        _ => return None,
    };
    let issued_at_ms = r.number()?;
    let count = r.number()?;
    if count > MAX_TOPICS {
        return None;
    }
    let mut topics = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let topic = r.text()?;
        let incarnation = r.number()?;
        let partitions = r.number()?;
        if partitions > MAX_PARTITIONS {
            return None;
        }
        let mut floors = BTreeMap::new();
        for _ in 0..partitions {
            let partition = u32::try_from(r.number()?).ok()?;
            let offset = r.number()?;
            let epoch: OffsetEpoch = r.number()?;
            floors.insert(partition, ResumeOffset { offset, epoch });
        }
        topics.push(TopicFloors { topic, incarnation, partitions: floors });
    }
    r.0.is_empty().then_some(ResumeToken { holder, issued_at_ms, topics })
}

/// Compares every byte whatever the first difference (no early return on a mismatch).
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

fn put_number(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_number(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn number(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return None;
            }
            n |= part << shift;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    fn text(&mut self) -> Option<String> {
        let len = usize::try_from(self.number()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(text.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(holder: Holder, incarnation: u64) -> ResumeToken {
        let partitions = (0..64u32).map(|p| (p, ResumeOffset { offset: u64::MAX - u64::from(p), epoch: (u64::from(p) << 32) | 7 })).collect();
        ResumeToken { holder, issued_at_ms: 1_700_000_000_000, topics: vec![TopicFloors { topic: "orders".into(), incarnation, partitions }] }
    }

    #[test]
    fn a_token_round_trips_and_binds_holder_incarnation_and_age() {
        let key = TokenKey::new(&[7u8; 32]);
        let issued = token(Holder::Client("alice".into()), 42);
        let text = key.issue(&issued);
        assert!(text.len() < 2048, "64 partitions at the largest numbers: {} chars", text.len());
        assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)), "URL-safe: {text}");
        let opened = key.open(&text).unwrap();
        assert_eq!(opened, issued);
        let now = issued.issued_at_ms + 1000;
        assert_eq!(opened.check(&Holder::Client("alice".into()), "orders", 42, now, 0).unwrap().len(), 64);
        assert_eq!(opened.check(&Holder::Client("bob".into()), "orders", 42, now, 0), Err(Refusal::OtherClient));
        assert_eq!(opened.check(&Holder::Group("alice".into()), "orders", 42, now, 0), Err(Refusal::OtherGroup));
        assert_eq!(opened.check(&Holder::Client("alice".into()), "orders", 43, now, 0), Err(Refusal::OtherIncarnation));
        assert_eq!(opened.check(&Holder::Client("alice".into()), "other", 42, now, 0), Err(Refusal::OtherIncarnation));
        assert_eq!(opened.check(&Holder::Client("alice".into()), "orders", 42, now, 999), Err(Refusal::Expired));
        assert!(opened.check(&Holder::Client("alice".into()), "orders", 42, now, 1000).is_ok());
        // A clock that went back: a token "from the future" is not expired.
        assert!(opened.check(&Holder::Client("alice".into()), "orders", 42, 0, 1).is_ok());
    }

    #[test]
    fn a_changed_forged_or_foreign_token_is_invalid() {
        let key = TokenKey::new(&[7u8; 32]);
        let text = key.issue(&token(Holder::Group("workers".into()), 1));
        assert_eq!(TokenKey::new(&[8u8; 32]).open(&text), Err(Refusal::Invalid), "another key");
        // Every single-character change of the text is refused.
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        for i in PREFIX.len()..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[i] = *alphabet.iter().find(|c| **c != bytes[i]).unwrap();
            let changed = String::from_utf8(bytes).unwrap();
            assert!(key.open(&changed).is_err_and(|r| r == Refusal::Invalid), "change at {i} accepted");
        }
        for garbage in ["", "r1.", "r1.AAAA", "eyIwIjo1fQ", "r1.!!!!", &"r1.".repeat(30_000)] {
            assert_eq!(key.open(garbage), Err(Refusal::Invalid), "{garbage:.20}");
        }
        // A payload with a valid MAC but trailing bytes or absurd counts is still refused.
        let mut payload = vec![1, 0, 1, b'a', 0, 0xff, 0xff, 0xff, 0xff, 0x0f];
        let mac = key.mac(&payload);
        payload.extend_from_slice(&mac);
        assert_eq!(key.open(&format!("r1.{}", URL_SAFE_NO_PAD.encode(&payload))), Err(Refusal::Invalid));
    }

    #[test]
    fn numbers_at_every_edge_round_trip_and_overlong_ones_are_refused() {
        for n in [0, 1, 127, 128, 1 << 32, (1 << 63) - 1, 1 << 63, u64::MAX] {
            let mut out = Vec::new();
            put_number(&mut out, n);
            assert_eq!(Reader(&out).number(), Some(n));
        }
        // 2^64 and an eleven-byte number do not fit a u64.
        assert_eq!(Reader(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]).number(), None);
        assert_eq!(Reader(&[0x80; 11]).number(), None);
    }
}
