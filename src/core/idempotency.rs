//! Idempotent publish (docs/protocol.md, `POST /topics/{topic}/events`): a publisher that sends an
//! `Idempotency-Key` and retries after a timeout gets the first request's offsets back instead of
//! a second copy of its events. What a key answered is remembered in the offset store for
//! `publish.idempotency_window_secs`, with a digest of the request body, so the same key with
//! another body is told apart (409) from a retry.
//!
//! The body digest is SHA-256 (`ring`, already in the graph through rustls): it is stored, so it
//! must not change between versions of ackgate the way an in-process hasher may.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::backend::{BackendError, LogBackend, NewEvent};
use super::clock::Clock;
use super::names::TopicName;
use super::offsets::{OffsetStore, StoreError};
use super::remembered_publish::BodyDigest;
pub use super::remembered_publish::{IdempotencyKey, RememberedPublish};

fn body_digest(body: &[u8]) -> BodyDigest {
    let digest = ring::digest::digest(&ring::digest::SHA256, body);
    digest.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// Why an idempotent publish was not made.
#[derive(Debug, thiserror::Error)]
pub enum IdempotentPublishError {
    /// The key was used with another body within the window, or a request with it is running.
    #[error("{0}")]
    Conflict(String),
    /// `publish.idempotency_max_keys` keys are remembered already.
    #[error("{0}")]
    TooManyKeys(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a publish with a key went.
#[derive(Debug, PartialEq, Eq)]
pub enum PublishOutcome {
    /// Written now.
    Written(Vec<(u32, u64)>),
    /// A retry: the first request's offsets, nothing written.
    Replayed(Vec<(u32, u64)>),
}

/// Publishes with an `Idempotency-Key`; one per gateway.
pub struct IdempotentPublisher {
    store: Arc<dyn OffsetStore>,
    clock: Arc<dyn Clock>,
    window_ms: u64,
    max_keys: usize,
    /// Keys whose request runs now: a second request with one of them is a conflict, not a
    /// second write (the first may still be writing; its retry will find the answer).
    running: Mutex<HashSet<(TopicName, IdempotencyKey)>>,
    /// When the key limit last made a publish forget expired keys (epoch ms).
    last_forced_forget: AtomicU64,
    max_keys_per_publisher: usize,
    /// The expiry of every key each JWT publisher (by `sub`) had remembered since this instance
    /// started, oldest first; expired ones are dropped as it is asked (its own publishes).
    held: Mutex<HashMap<String, VecDeque<u64>>>,
}

/// Takes a running key out of the set when its publish ends, however it ends.
struct Running {
    publisher: Arc<IdempotentPublisher>,
    entry: Option<(TopicName, IdempotencyKey)>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            self.publisher.running.lock().unwrap().remove(&entry);
        }
    }
}

impl IdempotentPublisher {
    pub fn new(store: Arc<dyn OffsetStore>, clock: Arc<dyn Clock>, window_secs: u64, max_keys: usize, max_keys_per_publisher: usize) -> Self {
        Self {
            store,
            clock,
            window_ms: window_secs.saturating_mul(1000),
            max_keys,
            running: Mutex::new(HashSet::new()),
            last_forced_forget: AtomicU64::new(0),
            max_keys_per_publisher,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one more key for JWT publisher `sub` until `expires_at`, when it holds fewer than
    /// `publish.idempotency_max_keys_per_publisher` at `now` (issue 40, item 8: no publisher
    /// can use up the keys of all).
    fn take_publisher_key(&self, sub: &str, now: u64, expires_at: u64) -> bool {
        let mut held = self.held.lock().unwrap();
        let keys = held.entry(sub.to_string()).or_default();
        while keys.front().is_some_and(|at| *at <= now) {
            keys.pop_front();
        }
        if keys.len() >= self.max_keys_per_publisher {
            return false;
        }
        keys.push_back(expires_at);
        // Publishers whose keys all expired are forgotten on the way.
        if held.len() > 1024 {
            held.retain(|_, keys| keys.back().is_some_and(|at| *at > now));
        }
        true
    }

    /// At the key limit: forgets expired keys now instead of at the next sweep (at most once a
    /// second, as each pass reads every key); true when that made room.
    async fn forget_expired_now(&self, now: u64) -> bool {
        let last = self.last_forced_forget.load(Ordering::Relaxed);
        if now < last.saturating_add(1000) || self.last_forced_forget.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return false;
        }
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.forget_publishes_expired_at(now)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "forgetting expired idempotency keys failed"),
            Err(e) => tracing::error!(error = %e, "forgetting expired idempotency keys failed"),
        }
        self.store.remembered_publishes() < self.max_keys
    }

    /// Publishes `events` (the parsed `body`; a missing topic is created only when `may_create`) unless `key` answered the same body within the
    /// window; then answers those offsets without writing. The write runs detached from the
    /// caller: a request given up (a client's timeout drops this future) neither stops it
    /// halfway nor loses its answer, which a retry then gets. A pending mark is remembered before
    /// the write, so a retry after the gateway died in between is refused (the outcome is not
    /// known) instead of writing the events a second time (issue 39, item 9).
    pub async fn publish(
        self: &Arc<Self>,
        backend: Arc<dyn LogBackend>,
        topic: &TopicName,
        publisher: Option<&str>,
        key: IdempotencyKey,
        body: &[u8],
        events: Vec<NewEvent>,
        may_create: bool,
    ) -> Result<PublishOutcome, IdempotentPublishError> {
        let entry = (topic.clone(), key.clone());
        if !self.running.lock().unwrap().insert(entry.clone()) {
            return Err(IdempotentPublishError::Conflict(format!(
                "a publish with Idempotency-Key {:?} is still running; retry in a moment for its answer",
                key.as_sent()
            )));
        }
        let running = Running { publisher: self.clone(), entry: Some(entry) };
        let digest = body_digest(body);
        let (store, lookup_topic, lookup_key) = (self.store.clone(), topic.clone(), key.clone());
        let remembered = tokio::task::spawn_blocking(move || store.remembered_publish(&lookup_topic, &lookup_key))
            .await
            .map_err(|e| StoreError::Io(format!("reading an idempotency key failed: {e}")))??;
        let now = self.clock.now_ms();
        match remembered.filter(|r| r.expires_at > now) {
            Some(first) if first.is_pending() => {
                return Err(IdempotentPublishError::Conflict(format!(
                    "a publish with Idempotency-Key {:?} was cut short (the gateway stopped between writing it and remembering its answer): whether its events were written is unknown; read the topic, then publish under a new key if they are missing",
                    key.as_sent()
                )))
            }
            Some(first) if first.digest == digest => return Ok(PublishOutcome::Replayed(first.offsets)),
            Some(_) => {
                return Err(IdempotentPublishError::Conflict(format!(
                    "Idempotency-Key {:?} was used with another body on topic {topic} within publish.idempotency_window_secs",
                    key.as_sent()
                )))
            }
            None => {}
        }
        if self.store.remembered_publishes() >= self.max_keys && !self.forget_expired_now(now).await {
            return Err(IdempotentPublishError::TooManyKeys(format!(
                "{} idempotency keys are remembered (publish.idempotency_max_keys); retry after some expire, or publish without the header",
                self.max_keys
            )));
        }
        let expires_at = now.saturating_add(self.window_ms);
        if let Some(sub) = publisher.filter(|sub| !self.take_publisher_key(sub, now, expires_at)) {
            return Err(IdempotentPublishError::TooManyKeys(format!(
                "publisher {sub:?} holds {} idempotency keys (publish.idempotency_max_keys_per_publisher); retry after some expire, or publish without the header",
                self.max_keys_per_publisher
            )));
        }
        let pending = RememberedPublish { digest, offsets: Vec::new(), expires_at };
        let publisher = self.clone();
        let topic = topic.clone();
        // The mark is written inside the detached task, right before the log write: a request
        // given up while the mark was being written must not leave a mark with no publish
        // behind it, which would answer every retry "outcome unknown" for the whole window.
        let written = tokio::spawn(async move {
            let _running = running;
            let (store, marking_topic, marking_key) = (publisher.store.clone(), topic.clone(), key.clone());
            tokio::task::spawn_blocking(move || store.remember_publish(&marking_topic, &marking_key, &pending))
                .await
                .map_err(|e| StoreError::Io(format!("remembering an idempotency key failed: {e}")))??;
            let written = if may_create { backend.publish(&topic, events).await } else { backend.publish_existing(&topic, events).await };
            // The answer replaces the mark; after an error the mark goes (it is remembered as
            // expired): nothing was answered, and a retry may write (on the embedded log nothing
            // was written; on Kafka and RocketMQ part of a batch may have been, as without a key).
            let answer = match &written {
                Ok(offsets) => RememberedPublish { digest, offsets: offsets.clone(), expires_at: publisher.clock.now_ms().saturating_add(publisher.window_ms) },
                Err(_) => RememberedPublish { digest, offsets: Vec::new(), expires_at: 0 },
            };
            let store = publisher.store.clone();
            // A failure to remember is logged, never turned into an error (the publisher would
            // retry and write the events again); its retry meets the mark instead.
            match tokio::task::spawn_blocking(move || store.remember_publish(&topic, &key, &answer)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "remembering an idempotent publish's answer failed: a retry will be told its outcome is unknown"),
                Err(e) => tracing::error!(error = %e, "remembering an idempotent publish's answer failed: a retry will be told its outcome is unknown"),
            }
            written.map_err(IdempotentPublishError::from)
        })
        .await
        .map_err(|e| StoreError::Io(format!("the publish task failed: {e}")))??;
        Ok(PublishOutcome::Written(written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_keys_never_meet_another_publishers_or_a_raw_one() {
        let key = || IdempotencyKey::parse(b"k:1").unwrap();
        let (alice, bob, raw) = (key().scoped(Some("alice")), key().scoped(Some("bob")), key().scoped(None));
        assert!(alice != bob && alice != raw && bob != raw);
        // A sub that holds the separator cannot forge another sub's key.
        assert_ne!(IdempotencyKey::parse(b"c").unwrap().scoped(Some("a:b")), IdempotencyKey::parse(b"b:c").unwrap().scoped(Some("a")));
        assert_eq!((alice.as_sent(), raw.as_sent()), ("k:1", "k:1"));
    }

    #[test]
    fn keys_are_one_to_128_visible_ascii() {
        assert!(IdempotencyKey::parse(b"a").is_ok());
        assert!(IdempotencyKey::parse(&[b'~'; 128]).is_ok());
        assert!(IdempotencyKey::parse(b"order-42:retry/1").is_ok());
        for bad in [&b""[..], &[b'a'; 129], b"has space", b"tab\t", b"\x7f", "caf\u{e9}".as_bytes()] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_remembered_publish_round_trips_and_odd_bytes_do_not_decode() {
        let r = RememberedPublish { digest: body_digest(b"{}"), offsets: vec![(0, 0), (u32::MAX, u64::MAX)], expires_at: u64::MAX };
        assert_eq!(RememberedPublish::decode(&r.encode()), Some(r.clone()));
        assert_eq!(RememberedPublish::expires_at_of(&r.encode()), Some(u64::MAX));
        let mut bytes = r.encode();
        bytes.pop();
        assert_eq!(RememberedPublish::decode(&bytes), None);
        assert_eq!(RememberedPublish::decode(&[]), None);
        assert_eq!(RememberedPublish::decode(&[2; 41]), None);
    }

    #[test]
    fn the_digest_is_sha256() {
        let hex: String = body_digest(b"abc").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
