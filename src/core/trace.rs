//! Traces of an event's way through the gateway (issue 45, item 3): a publish starts or
//! continues a W3C trace, and its append, each delivery and each delivery's ack are spans of it.
//!
//! The trace travels in the event itself, as a `traceparent` header: the publish writes its own
//! span there (unless the event carries one of its producer's, which then wins), so a delivery on
//! any instance, even long after, and events written to Kafka or RocketMQ by their own producers,
//! continue the trace. Spans are plain data here; the gateway's telemetry module exports them
//! over OTLP.
//!
//! Nothing is spent on an event whose trace is not sampled: no header is added, and a delivery
//! only looks for a `traceparent` header when a tracer is set.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::backend::{Event, NewEvent};

/// The header that carries the trace, as the W3C Trace Context names it.
pub const TRACEPARENT: &str = "traceparent";

/// A W3C `traceparent`: `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    pub span_id: u64,
    pub sampled: bool,
}

impl TraceParent {
    /// `None` for anything that is not a valid version-00 (or later, read as 00) traceparent:
    /// a malformed header starts a new trace rather than failing the request.
    pub fn parse(text: &str) -> Option<TraceParent> {
        let text = text.trim();
        let mut parts = text.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        // Version 00 has exactly four parts; a later version may append more.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let span_id = u64::from_str_radix(span, 16).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        // All-zero ids are invalid by the specification.
        (trace_id != 0 && span_id != 0).then_some(TraceParent { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The `traceparent` of an event's headers, if it has a valid one.
    pub fn of_headers(headers: &[(String, String)]) -> Option<TraceParent> {
        headers.iter().find(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT)).and_then(|(_, value)| TraceParent::parse(value))
    }

    pub fn format(&self) -> String {
        format!("00-{:032x}-{:016x}-{:02x}", self.trace_id, self.span_id, u8::from(self.sampled))
    }

    /// The trace id as logs and trace viewers print it.
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Server,
    Client,
    Producer,
    Consumer,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    Text(String),
    Number(i64),
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: u128,
    pub span_id: u64,
    /// 0 for the root of a trace.
    pub parent_span_id: u64,
    /// The parent is another process's span (a caller's, or the one an event carries).
    pub remote_parent: bool,
    pub name: &'static str,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, AttributeValue)>,
}

/// Where finished spans go, and whether a new trace is sampled.
pub trait Tracer: Send + Sync {
    /// Whether a trace that starts here (no sampled parent) is recorded: `telemetry.sample_ratio`.
    fn sample_new_trace(&self) -> bool;
    /// Hands a finished span over for export; never blocks (a full queue drops it).
    fn export(&self, span: Span);
}

/// A random id that is not 0 (0 means "none" in both W3C and OTLP ids).
pub fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // std's RandomState is seeded from the OS once per thread and varied per instance: hashing
    // a counter with it gives ids that are unpredictable enough for traces, without a RNG crate.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish().max(1)
}

/// Epoch time of an `Instant` of this process: spans need wall-clock times, deliveries keep
/// monotonic ones.
pub fn wall_time_of(at: Instant) -> SystemTime {
    let now = (Instant::now(), SystemTime::now());
    now.1.checked_sub(now.0.saturating_duration_since(at)).unwrap_or(now.1)
}

/// A publish being traced: started when the request came in, finished once the log answered.
pub struct PublishTrace {
    tracer: Arc<dyn Tracer>,
    parent: TraceParent,
    /// 0 when the publish starts the trace.
    parent_span_id: u64,
    span_id: u64,
    started: SystemTime,
    append_started: Option<SystemTime>,
}

impl PublishTrace {
    /// A publish whose request carried `parent` (the HTTP `traceparent` header), or none: `None`
    /// when the trace is not recorded (an unsampled parent, or a new trace not sampled).
    pub fn start(tracer: &Arc<dyn Tracer>, parent: Option<TraceParent>) -> Option<PublishTrace> {
        let (parent, parent_span_id) = match parent {
            Some(parent) if parent.sampled => (parent, parent.span_id),
            Some(_) => return None,
            None if tracer.sample_new_trace() => {
                let trace_id = (u128::from(random_id()) << 64) | u128::from(random_id());
                (TraceParent { trace_id, span_id: 0, sampled: true }, 0)
            }
            None => return None,
        };
        let (tracer, started) = (tracer.clone(), SystemTime::now());
        Some(PublishTrace { tracer, parent, parent_span_id, span_id: random_id(), started, append_started: None })
    }

    /// This publish's span, as the `traceparent` its events carry.
    pub fn traceparent(&self) -> TraceParent {
        TraceParent { trace_id: self.parent.trace_id, span_id: self.span_id, sampled: true }
    }

    /// Writes this publish's `traceparent` into every event that has none, so that their
    /// deliveries continue this trace; an event with its producer's own keeps it. Called after
    /// an idempotency digest is taken: a retry must match whatever trace it lands in.
    pub fn mark(&self, events: &mut [NewEvent]) {
        let value = self.traceparent().format();
        for event in events {
            if !event.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT)) {
                event.headers.push((TRACEPARENT.to_string(), value.clone()));
            }
        }
    }

    /// The write to the log starts now.
    pub fn appending(&mut self) {
        self.append_started = Some(SystemTime::now());
    }

    /// The publish span and its append child, exported. `written`: the events' offsets, and
    /// whether they were an idempotency key's replay; `None` when the publish failed.
    pub fn finish(self, topic: &str, written: Option<(&[(u32, u64)], bool)>) {
        let (offsets, outcome) = match written {
            Some((offsets, false)) => (offsets, "written"),
            Some((offsets, true)) => (offsets, "replayed"),
            None => (&[][..], "failed"),
        };
        let tracer = self.tracer.as_ref();
        let end = SystemTime::now();
        let trace_id = self.parent.trace_id;
        let mut attributes = vec![
            ("messaging.system", AttributeValue::Text("ackgate".into())),
            ("messaging.operation.type", AttributeValue::Text("send".into())),
            ("messaging.destination.name", AttributeValue::Text(topic.to_string())),
            ("messaging.batch.message_count", AttributeValue::Number(offsets.len() as i64)),
            ("ackgate.outcome", AttributeValue::Text(outcome.to_string())),
        ];
        if let [(partition, offset)] = offsets {
            attributes.push(("ackgate.partition", AttributeValue::Number(i64::from(*partition))));
            attributes.push(("ackgate.offset", AttributeValue::Number(*offset as i64)));
        }
        if let Some(append_started) = self.append_started {
            tracer.export(Span {
                trace_id,
                span_id: random_id(),
                parent_span_id: self.span_id,
                remote_parent: false,
                name: "ackgate append",
                kind: SpanKind::Client,
                start: append_started,
                end,
                attributes: vec![("messaging.destination.name", AttributeValue::Text(topic.to_string()))],
            });
        }
        let publish = Span {
            trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            remote_parent: true,
            name: "ackgate publish",
            kind: SpanKind::Server,
            start: self.started,
            end,
            attributes,
        };
        tracer.export(publish);
    }
}

/// A delivery that ended in an ack, in a sampled trace: what its spans need, taken while the
/// client's state is locked and exported after (`export_acked`).
pub struct AckedDelivery {
    parent: TraceParent,
    topic: String,
    delivery_id: String,
    partition: u32,
    offset: u64,
    attempt: u32,
    delivered_at: Instant,
}

impl AckedDelivery {
    /// `None` unless `event` carries a sampled `traceparent`: the cost for all other events is
    /// one look through their headers.
    pub fn of(event: &Event, topic: &str, delivery_id: &str, attempt: u32, delivered_at: Instant) -> Option<AckedDelivery> {
        let parent = TraceParent::of_headers(&event.headers).filter(|p| p.sampled)?;
        let (topic, delivery_id) = (topic.to_string(), delivery_id.to_string());
        Some(AckedDelivery { parent, topic, delivery_id, partition: event.partition, offset: event.offset, attempt, delivered_at })
    }
}

/// For each acked delivery: a `deliver` span from the push to the ack, and an `ack` child from
/// the ack's arrival to now, both in the trace of the event's `traceparent`.
pub fn export_acked(tracer: &dyn Tracer, client_id: &str, acked: Vec<AckedDelivery>, ack_received: Instant, confirmed: bool) {
    let (received, now) = (wall_time_of(ack_received), SystemTime::now());
    let text = |s: &str| AttributeValue::Text(s.to_string());
    for delivery in acked {
        let delivered = wall_time_of(delivery.delivered_at);
        let deliver_span_id = random_id();
        tracer.export(Span {
            trace_id: delivery.parent.trace_id,
            span_id: deliver_span_id,
            parent_span_id: delivery.parent.span_id,
            remote_parent: true,
            name: "ackgate deliver",
            kind: SpanKind::Producer,
            start: delivered,
            end: received.max(delivered),
            attributes: vec![
                ("messaging.system", text("ackgate")),
                ("messaging.operation.type", text("deliver")),
                ("messaging.destination.name", AttributeValue::Text(delivery.topic)),
                ("messaging.message.id", AttributeValue::Text(delivery.delivery_id)),
                ("ackgate.client_id", text(client_id)),
                ("ackgate.partition", AttributeValue::Number(i64::from(delivery.partition))),
                ("ackgate.offset", AttributeValue::Number(delivery.offset as i64)),
                ("ackgate.attempt", AttributeValue::Number(i64::from(delivery.attempt))),
            ],
        });
        tracer.export(Span {
            trace_id: delivery.parent.trace_id,
            span_id: random_id(),
            parent_span_id: deliver_span_id,
            remote_parent: false,
            name: "ackgate ack",
            kind: SpanKind::Consumer,
            start: received,
            end: now.max(received),
            attributes: vec![
                ("messaging.operation.type", text("settle")),
                ("ackgate.client_id", text(client_id)),
                ("ackgate.ack", text(if confirmed { "confirmed" } else { "plain" })),
            ],
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_written_and_bad_ones_are_none() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(text).unwrap();
        assert_eq!(parsed, TraceParent { trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736, span_id: 0x00f067aa0ba902b7, sampled: true });
        assert_eq!(parsed.format(), text);
        assert!(!TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version may carry more parts; its first four are read as version 00's.
        assert!(TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more").is_some());
    }

    struct Recorder {
        sample: bool,
        spans: std::sync::Mutex<Vec<Span>>,
    }

    impl Tracer for Recorder {
        fn sample_new_trace(&self) -> bool {
            self.sample
        }
        fn export(&self, span: Span) {
            self.spans.lock().unwrap().push(span);
        }
    }

    fn event(headers: Vec<(String, String)>) -> NewEvent {
        NewEvent { key: None, partition: None, headers, payload: b"{}".to_vec(), payload_is_json: true }
    }

    #[test]
    fn a_publish_marks_unmarked_events_and_its_spans_hang_under_the_callers() {
        let recorder = Arc::new(Recorder { sample: false, spans: Default::default() });
        let tracer: Arc<dyn Tracer> = recorder.clone();
        let caller = TraceParent { trace_id: 7, span_id: 9, sampled: true };
        let mut trace = PublishTrace::start(&tracer, Some(caller)).unwrap();
        let own = "00-000000000000000000000000000000aa-00000000000000bb-01".to_string();
        let mut events = vec![event(vec![]), event(vec![("TraceParent".into(), own.clone())])];
        trace.mark(&mut events);
        let marked = TraceParent::of_headers(&events[0].headers).unwrap();
        assert_eq!((marked.trace_id, marked.sampled), (7, true));
        assert_ne!(marked.span_id, 9, "the events hang under the publish span, not the caller's");
        assert_eq!(events[1].headers, vec![("TraceParent".to_string(), own)], "a producer's own traceparent wins");
        trace.appending();
        trace.finish("orders", Some((&[(0, 4)], false)));
        let spans = recorder.spans.lock().unwrap();
        let publish = spans.iter().find(|s| s.name == "ackgate publish").unwrap();
        let append = spans.iter().find(|s| s.name == "ackgate append").unwrap();
        assert_eq!((publish.trace_id, publish.parent_span_id, publish.span_id), (7, 9, marked.span_id));
        assert_eq!((append.trace_id, append.parent_span_id), (7, publish.span_id));
    }

    #[test]
    fn unsampled_parents_and_unsampled_new_traces_record_nothing() {
        let tracer: Arc<dyn Tracer> = Arc::new(Recorder { sample: false, spans: Default::default() });
        assert!(PublishTrace::start(&tracer, Some(TraceParent { trace_id: 7, span_id: 9, sampled: false })).is_none());
        assert!(PublishTrace::start(&tracer, None).is_none());
        let sampling: Arc<dyn Tracer> = Arc::new(Recorder { sample: true, spans: Default::default() });
        let root = PublishTrace::start(&sampling, None).unwrap();
        assert_eq!(root.parent_span_id, 0);
        assert_ne!(root.traceparent().trace_id, 0);
    }
}
