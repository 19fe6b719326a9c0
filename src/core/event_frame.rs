//! An `event` frame written once per event and shared by every session that delivers it.
//!
//! A frame is the event's fields (topic, partition, offset, timestamp, key, headers, payload) plus
//! two that are each session's own: the delivery id and the attempt. The first session that
//! delivers an event writes the shared parts into the event's `FrameCache`; every session then
//! copies them around its own id and attempt, instead of escaping and encoding the event again
//! (a broadcast to 10,000 sessions writes each event once, not 10,000 times). The result is the
//! same bytes as `protocol::write_event_frame` (a property test holds them equal).

use std::sync::OnceLock;

use super::backend::Event;
use super::client_state::DeliveryRef;
use super::protocol::{write_event_frame_middle, write_event_frame_tail, EVENT_FRAME_START};

/// The shared parts of an event's frame, once written. Empty when cloned (a clone may be changed:
/// its frame is written again), equal to any other (it is derived from the event's fields).
#[derive(Default)]
pub struct FrameCache(OnceLock<Box<SharedParts>>);

struct SharedParts {
    /// The topic they were written for: an event delivered under another name (none is today)
    /// is written in full.
    topic: Box<str>,
    /// From the end of the delivery id to the attempt's value.
    middle: Box<str>,
    /// After the attempt's value, to the end.
    tail: Box<str>,
}

impl Clone for FrameCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for FrameCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for FrameCache {}

impl std::fmt::Debug for FrameCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "FrameCache(written)" } else { "FrameCache(empty)" })
    }
}

/// Writes `event`'s frame for one delivery into `out`, from the shared parts (written now when
/// this is the event's first delivery).
pub fn write_event(out: &mut String, delivery: DeliveryRef, topic: &str, attempt: u32, event: &Event) {
    let parts = event.frame.0.get_or_init(|| {
        let (mut middle, mut tail) = (String::new(), String::with_capacity(96 + event.payload.len()));
        write_event_frame_middle(&mut middle, topic, event);
        write_event_frame_tail(&mut tail, event);
        Box::new(SharedParts { topic: topic.into(), middle: middle.into(), tail: tail.into() })
    });
    if &*parts.topic != topic {
        super::protocol::write_event_frame(out, delivery, topic, attempt, event);
        return;
    }
    out.reserve(EVENT_FRAME_START.len() + 40 + parts.middle.len() + parts.tail.len());
    out.push_str(EVENT_FRAME_START);
    delivery.write_id(out);
    out.push_str(&parts.middle);
    super::protocol::push_u64(out, attempt as u64);
    out.push_str(&parts.tail);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::core::protocol::write_event_frame;

    fn text() -> impl Strategy<Value = String> {
        // Plain text, quotes, backslashes, control characters and non-ASCII.
        proptest::string::string_regex("[a-z\"\\\\\\x00-\\x1fé€😀 ]{0,12}").unwrap()
    }

    prop_compose! {
        fn event()(
            partition in 0u32..8,
            offset in any::<u64>(),
            timestamp in any::<u64>(),
            key in proptest::option::of(text()),
            headers in proptest::collection::vec((text(), text()), 0..3),
            headers_base64 in proptest::collection::vec((text(), proptest::collection::vec(any::<u8>(), 0..6)), 0..2),
            json in any::<bool>(),
            raw in proptest::collection::vec(any::<u8>(), 0..24),
        ) -> Event {
            let payload = if json { serde_json::to_vec(&serde_json::json!({"t": timestamp, "s": String::from_utf8_lossy(&raw)})).unwrap() } else { raw };
            Event { partition, offset, timestamp, key, headers, headers_base64, payload, payload_is_json: json, undecodable: false, frame: Default::default() }
        }
    }

    proptest! {
        /// Every delivery of an event, through the shared parts, is the frame written in full:
        /// first and later deliveries, any attempt, redrive ids, any topic.
        #[test]
        fn shared_frames_are_the_frames_written_in_full(
            event in event(),
            deliveries in proptest::collection::vec((any::<u64>(), any::<u32>(), any::<u32>()), 1..4),
            topic in "[A-Za-z0-9._-]{1,20}(@[a-z]{1,5})?",
        ) {
            // Any slot: a redrive's too (its high bit).
            for (seq, slot, attempt) in deliveries {
                let id = DeliveryRef { seq, slot, partition: event.partition, offset: event.offset };
                let (mut shared, mut full) = (String::new(), String::new());
                write_event(&mut shared, id, &topic, attempt, &event);
                write_event_frame(&mut full, id, &topic, attempt, &event);
                prop_assert_eq!(&shared, &full);
                serde_json::from_str::<serde_json::Value>(&shared).unwrap();
            }
            // Under another topic name: written in full, still equal.
            let id = DeliveryRef { seq: 1, slot: 0, partition: event.partition, offset: event.offset };
            let (mut shared, mut full) = (String::new(), String::new());
            write_event(&mut shared, id, "other", 1, &event);
            write_event_frame(&mut full, id, "other", 1, &event);
            prop_assert_eq!(shared, full);
        }
    }
}
