//! A client's records on the other instances of a cluster (issue 45, item 5). Each instance
//! keeps its own offsets; the resume token is the only thing that carries a client's progress
//! from one instance to another. A client that comes without one (a reloaded page whose
//! EventSource lost its `Last-Event-ID`, a service restarted without its token, a new device)
//! to an instance that has no record of it, after instances were added or removed and rendezvous
//! hashing moved it, would start at `delivery.reset_policy`: the whole retention window again, or
//! a silent skip. Its records on the peers stand in for the token it lacks: per partition the
//! record of the newest offset epoch, and in it the largest committed offset, planned exactly as
//! a token is (fenced when its epoch is older than this instance's record).

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::names::{ClientId, TopicName};
use super::protocol::ResumeOffset;

/// What the peers hold of one client on one topic.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerRecords {
    /// Per partition, the record to start from (as a resume token would name it).
    pub offsets: BTreeMap<u32, ResumeOffset>,
    /// The peers that did not answer in time: what they hold is not in `offsets`.
    pub unanswered: Vec<String>,
}

#[async_trait]
pub trait PeerOffsets: Send + Sync {
    /// The client's records on `topic` at every peer, asked in parallel, in bounded time.
    async fn client_records(&self, topic: &TopicName, client_id: &ClientId) -> PeerRecords;
}

/// Per partition the record of the newest offset epoch, and of those the largest offset.
pub fn newest(records: impl IntoIterator<Item = (u32, ResumeOffset)>) -> BTreeMap<u32, ResumeOffset> {
    let mut best: BTreeMap<u32, ResumeOffset> = BTreeMap::new();
    for (partition, record) in records {
        let slot = best.entry(partition).or_insert(record);
        if (record.epoch, record.offset) > (slot.epoch, slot.offset) {
            *slot = record;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_epoch_wins_then_the_largest_offset() {
        let r = |offset, epoch| ResumeOffset { offset, epoch };
        let best = newest([(0, r(9, 0)), (0, r(5, 1)), (0, r(4, 1)), (1, r(3, 0)), (1, r(7, 0))]);
        assert_eq!(best, BTreeMap::from([(0, r(5, 1)), (1, r(7, 0))]), "a record made after a lowering wins over a larger one made before");
    }
}
