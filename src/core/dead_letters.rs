//! Dead letters (events a client will never get again: terms and exhausted attempts) and gaps
//! (offsets the log dropped before a client got them), as the offset store keeps and pages them.

use super::names::{ClientId, OffsetKey, TopicName};

/// An event that will never be delivered again to one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub topic: TopicName,
    pub client_id: ClientId,
    pub partition: u32,
    pub offset: u64,
    /// Deliveries made before giving up.
    pub attempts: u32,
    /// `max_attempts`, or the reason the client gave with `term`.
    pub reason: String,
    /// Epoch ms.
    pub at: u64,
    /// The partition's log epoch the event was read in (`offsets::LogEpoch`): a dead letter of
    /// an older one names an event of a log that lost its tail since, and is never redriven
    /// (the new log holds another event at its offset), only kept for the operator.
    pub log_epoch: u32,
}

impl DeadLetter {
    pub fn id(&self) -> DeadLetterId {
        DeadLetterId { key: OffsetKey::new(self.topic.clone(), self.client_id.clone(), self.partition), offset: self.offset }
    }
}

/// Events a client will never receive because the log no longer held them when it read there
/// (retention removed them): offsets `from`..`to`-1 of one partition, reported to the client as
/// `subscribed.partitions[].gap` or a `gap` frame (docs/protocol.md) and kept for the admin view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub topic: TopicName,
    pub client_id: ClientId,
    pub partition: u32,
    pub from: u64,
    pub to: u64,
    /// Epoch ms.
    pub at: u64,
}

impl Gap {
    /// Named like a dead letter, by the first offset missing: `topic#client_id#partition#from`.
    pub fn id(&self) -> DeadLetterId {
        DeadLetterId { key: OffsetKey::new(self.topic.clone(), self.client_id.clone(), self.partition), offset: self.from }
    }
}

/// A page of gaps, in topic, client, partition and `from` order.
#[derive(Debug, Clone, Default)]
pub struct GapPage {
    pub gaps: Vec<Gap>,
    pub next: Option<DeadLetterId>,
}

/// Names one dead letter: `topic#client_id#partition#offset` (`#` is in neither name, so the form
/// is unambiguous). The paging cursor of `GET /admin/dead-letters`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeadLetterId {
    pub key: OffsetKey,
    pub offset: u64,
}

impl std::fmt::Display for DeadLetterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.key, self.offset)
    }
}

impl DeadLetterId {
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('#');
        let (topic, client, partition, offset) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let key = OffsetKey::new(TopicName::parse(topic).ok()?, ClientId::parse_stored(client).ok()?, partition.parse().ok()?);
        Some(Self { key, offset: offset.parse().ok()? })
    }
}

/// One page of dead letters. Ordered by topic, client, partition and offset; by client first
/// when only `client_id` filters (the store answers that from a client-ordered index).
#[derive(Debug, Clone)]
pub struct DeadLetterQuery {
    pub topic: Option<TopicName>,
    pub client_id: Option<ClientId>,
    /// Only with `topic` and `client_id` (the redrive and delete routes' filter).
    pub partition: Option<u32>,
    /// Only this offset (one dead letter with `partition`).
    pub offset: Option<u64>,
    /// Start after this one (the previous page's `next`).
    pub after: Option<DeadLetterId>,
    pub limit: usize,
}

impl DeadLetterQuery {
    pub fn matches(&self, dead: &DeadLetter) -> bool {
        self.topic.as_ref().is_none_or(|t| *t == dead.topic)
            && self.client_id.as_ref().is_none_or(|c| *c == dead.client_id)
            && self.partition.is_none_or(|p| p == dead.partition)
            && self.offset.is_none_or(|o| o == dead.offset)
    }

    /// True when the page is ordered by client first.
    pub fn by_client(&self) -> bool {
        self.topic.is_none() && self.client_id.is_some()
    }
}

/// A page of dead letters; `next` is set when more follow (the `after` of the next page).
#[derive(Debug, Clone, Default)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<DeadLetter>,
    pub next: Option<DeadLetterId>,
}

impl DeadLetterPage {
    /// From up to `limit + 1` rows in page order: the extra row only says that more follow.
    pub fn from_rows(mut rows: Vec<DeadLetter>, limit: usize) -> Self {
        let next = (rows.len() > limit).then(|| {
            rows.truncate(limit);
            rows.last().map(DeadLetter::id)
        });
        Self { dead_letters: rows, next: next.flatten() }
    }
}
