//! The `publish` frame: a session publishes to a topic as `POST /topics/{topic}/events` does,
//! allowed by its JWT's `publish` claim (or by no credentials configured at all), answered
//! `published` once the log took the events.

use serde_json::Value;

use super::Session;
use crate::core::backend::NewEvent;
use crate::core::frame_errors::{backend_frame_error, store_frame_error};
use crate::core::idempotency::{IdempotencyKey, IdempotentPublishError, PublishOutcome};
use crate::core::names::TopicName;
use crate::core::protocol::{ErrorCode, FrameError, PublishedOffset, ServerFrame};
use crate::core::published_event::parse_events;
use crate::core::trace::{PublishTrace, TraceParent};

impl Session {
    pub(super) async fn publish(&mut self, topic: &str, events: &str, idempotency_key: Option<&str>, req: Option<Value>) -> Result<(), FrameError> {
        let topic = TopicName::parse(topic).map_err(|e| FrameError::new(ErrorCode::InvalidName, e.0))?;
        if !self.access.may_publish(topic.as_str()) {
            return Err(FrameError::new(
                ErrorCode::Forbidden,
                format!("this session may not publish to {topic}: its token's publish claim does not allow it (with auth.admin_token set and no JWTs, publish over REST)"),
            ));
        }
        let settings = self.d.settings();
        let events = parse_events(events, &settings.event_bounds).map_err(|m| FrameError::new(ErrorCode::BadFrame, m))?;
        // A frame has no headers of its own: the trace continues the first event's, or starts here.
        let mut trace = self.d.tracer.get().and_then(|t| PublishTrace::start(t, events.first().and_then(|e| TraceParent::of_headers(&e.headers))));
        let by_jwt = self.d.token_check.get().is_some();
        let may_create = self.publish_creates_topics();
        let written = self.write_events(&topic, events, idempotency_key, may_create, by_jwt, trace.as_mut()).await;
        if let Some(trace) = trace {
            trace.finish(topic.as_str(), written.as_ref().ok().map(|(offsets, replayed)| (offsets.as_slice(), *replayed)));
        }
        let (offsets, replayed) = written?;
        let offsets = offsets.into_iter().map(|(partition, offset)| PublishedOffset { partition, offset }).collect();
        self.send(ServerFrame::Published { req, offsets, replayed: replayed.then_some(true) });
        Ok(())
    }

    /// Whether a publish by this session creates a missing topic (`embedded.auto_create_topics`,
    /// which tells a session with a JWT from one without); a first subscribe follows it too.
    pub(super) fn publish_creates_topics(&self) -> bool {
        let (without_jwt, with_jwt) = self.d.settings().publish_creates_topics;
        if self.d.token_check.get().is_some() {
            with_jwt
        } else {
            without_jwt
        }
    }

    /// The events written (or, for an idempotency key's retry, the first write's offsets: then
    /// `true`), marked with `trace` when there is one.
    async fn write_events(
        &self,
        topic: &TopicName,
        mut events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
        may_create: bool,
        by_jwt: bool,
        trace: Option<&mut PublishTrace>,
    ) -> Result<(Vec<(u32, u64)>, bool), FrameError> {
        let backend = self.d.backend.clone();
        if !may_create && backend.partitions(topic).await.map_err(backend_frame_error)?.is_none() {
            return Err(FrameError::new(
                ErrorCode::UnknownTopic,
                format!("topic {topic} does not exist (embedded.auto_create_topics: create it with POST /topics and the admin token)"),
            ));
        }
        // A key's digest is of the events as sent: a retry must match whatever trace it is in.
        let body = idempotency_key.is_some().then(|| events_digest_body(&events));
        if let Some(trace) = trace {
            trace.mark(&mut events);
            trace.appending();
        }
        Ok(match idempotency_key {
            None if may_create => (backend.publish(topic, events).await.map_err(backend_frame_error)?, false),
            None => (backend.publish_existing(topic, events).await.map_err(backend_frame_error)?, false),
            Some(raw) => {
                let publisher = self.d.publisher.get().ok_or_else(|| FrameError::unavailable("idempotent publishing", "not set up on this instance"))?.clone();
                // Keys are the publisher's: a JWT's `sub` (the client id), or anonymous's.
                let sub = by_jwt.then(|| self.info.client_id.to_string());
                let key = IdempotencyKey::parse(raw.as_bytes())
                    .map_err(|m| FrameError::new(ErrorCode::BadFrame, format!("idempotency_key: {m}")))?
                    .scoped(sub.as_deref());
                let body = body.unwrap_or_default();
                match publisher.publish(backend, topic, sub.as_deref(), key, &body, events, may_create).await {
                    Ok(PublishOutcome::Written(offsets)) => (offsets, false),
                    Ok(PublishOutcome::Replayed(offsets)) => {
                        self.d.metrics.publish_replays.increment(1);
                        (offsets, true)
                    }
                    Err(IdempotentPublishError::Conflict(m)) => return Err(FrameError::new(ErrorCode::Conflict, m)),
                    Err(IdempotentPublishError::TooManyKeys(m)) => return Err(FrameError::new(ErrorCode::LimitExceeded, m)),
                    Err(IdempotentPublishError::Backend(e)) => return Err(backend_frame_error(e)),
                    Err(IdempotentPublishError::Store(e)) => return Err(store_frame_error(e)),
                }
            }
        })
    }
}

/// What an idempotency key's retry must repeat: the events as parsed (key, partition, headers,
/// payload), so the same events written another way (spacing, field order) still match.
fn events_digest_body(events: &[crate::core::backend::NewEvent]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in events {
        body.extend(format!("{:?}|{:?}|{:?}|{}|", e.key, e.partition, e.headers, e.payload.len()).as_bytes());
        body.extend(&e.payload);
    }
    body
}
