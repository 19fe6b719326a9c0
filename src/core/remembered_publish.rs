//! What the offset store remembers of an idempotent publish (`core::idempotency`): the key a
//! publisher sent and what its publish answered. Types only, shared by the publisher and the
//! stores, so that neither imports the other's module.

/// The value of an `Idempotency-Key` header: 1 to 128 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 128;

    pub fn parse(raw: &[u8]) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(format!("Idempotency-Key must be 1 to {} characters, got {}", Self::MAX_LEN, raw.len()));
        }
        if let Some(bad) = raw.iter().find(|b| !(0x21..=0x7e).contains(*b)) {
            return Err(format!("Idempotency-Key must be visible ASCII (no spaces); byte 0x{bad:02x} is not"));
        }
        Ok(Self(String::from_utf8_lossy(raw).into_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as remembered for a publisher known by `credential` (a JWT's `sub`): one
    /// publisher's keys never meet another's, so none can squat, probe or use up another's
    /// (issue 40, item 8). A byte no `Idempotency-Key` may hold (0x00) starts it, and the
    /// credential's length ends any ambiguity; keys of the admin token and of anonymous publishers
    /// stay as sent (`None`), as remembered before.
    pub fn scoped(self, credential: Option<&str>) -> Self {
        match credential {
            None => self,
            Some(sub) => Self(format!("\0{}:{sub}:{}", sub.len(), self.0)),
        }
    }

    /// The key as the publisher sent it (without its scope), for messages.
    pub fn as_sent(&self) -> &str {
        let Some(scoped) = self.0.strip_prefix('\0') else { return &self.0 };
        let parsed = scoped.split_once(':').and_then(|(len, rest)| rest.get(len.parse::<usize>().ok()? + 1..));
        parsed.unwrap_or(&self.0)
    }
}

/// SHA-256 of a request body.
pub type BodyDigest = [u8; 32];

/// What a publish under a key answered, until `expires_at` (epoch ms). No offsets: the publish
/// was begun and its answer never remembered (`is_pending`); a publish answers at least one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RememberedPublish {
    pub digest: BodyDigest,
    pub offsets: Vec<(u32, u64)>,
    pub expires_at: u64,
}

impl RememberedPublish {
    /// Remembered before the log's write, replaced by the answer after it: still there when a
    /// retry comes, the gateway stopped in between, and whether the events were written is not
    /// known (issue 39, item 9).
    pub fn is_pending(&self) -> bool {
        self.offsets.is_empty()
    }

    const VERSION: u8 = 1;
    const HEAD: usize = 1 + 8 + 32;

    /// Version 1, `expires_at` (u64), the digest, then `(partition u32, offset u64)` per event;
    /// big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::HEAD + 12 * self.offsets.len());
        out.push(Self::VERSION);
        out.extend_from_slice(&self.expires_at.to_be_bytes());
        out.extend_from_slice(&self.digest);
        for (partition, offset) in &self.offsets {
            out.extend_from_slice(&partition.to_be_bytes());
            out.extend_from_slice(&offset.to_be_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < Self::HEAD || bytes[0] != Self::VERSION || (bytes.len() - Self::HEAD) % 12 != 0 {
            return None;
        }
        let expires_at = u64::from_be_bytes(bytes[1..9].try_into().ok()?);
        let digest = bytes[9..41].try_into().ok()?;
        let offsets = bytes[Self::HEAD..]
            .chunks_exact(12)
            .map(|c| Some((u32::from_be_bytes(c[..4].try_into().ok()?), u64::from_be_bytes(c[4..].try_into().ok()?))))
            .collect::<Option<Vec<_>>>()?;
        Some(Self { digest, offsets, expires_at })
    }

    /// Expiry is read before anything else: a store may remove expired keys late.
    pub fn expires_at_of(bytes: &[u8]) -> Option<u64> {
        Some(u64::from_be_bytes(bytes.get(1..9)?.try_into().ok()?))
    }
}
