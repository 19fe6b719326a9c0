//! Pulling from Kafka with `assign` + `seek`, never a consumer group.
//!
//! One consumer serves every pull cursor of this instance: each `topic#partition` gets its own
//! split queue (split *before* it is assigned, so no message of it ever lands in the main queue),
//! and `seek` moves a cursor for rewinds and boot alignment. librdkafka's version barrier drops
//! what was prefetched before a seek. Catch-up reads by offset (a subscriber behind or ahead of
//! the shared reader) use a second consumer, so they never move a pull cursor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{Consumer, DefaultConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::kafka_err;
use crate::backend::checkpoint::PullCursors;
use crate::core::backend::{BackendError, Event};
use crate::core::names::{TopicName, TopicPartition};

/// A catch-up read waits at least this long for the first message: a fetch from an arbitrary
/// offset needs a broker round trip, so "nothing yet" after zero wait would mean nothing.
const CATCH_UP_MIN_WAIT: Duration = Duration::from_millis(1000);
/// Catch-up consumers: one slow or idle catch-up reader holds only one of them.
const CATCH_UP_CONSUMERS: usize = 4;

type PartitionQueue = StreamPartitionQueue<DefaultConsumerContext>;

/// A partition's split queue plus the lock that keeps its polls in order.
type OrderedQueue = Arc<(PartitionQueue, tokio::sync::Mutex<()>)>;

/// A change of the pull consumer's assignment, applied by its own thread (`apply_assignments`).
enum Assignment {
    /// With the queue split for it: only that queue is taken out if the assignment fails.
    Assign(TopicPartition, u64, OrderedQueue),
    Unassign(TopicPartition),
    /// A seek that librdkafka refused (no fetch started yet): assign the partition anew there.
    Reassign(TopicPartition, u64),
}

type Queues = Arc<Mutex<HashMap<TopicPartition, OrderedQueue>>>;

/// Why a poll at the pull cursor failed.
pub enum PullError {
    /// The broker refused the fetch at `cursor` as out of range; `fetched_end` is the log end
    /// its answer named (librdkafka keeps the high watermark of an errored answer too).
    OutOfRange {
        cursor: u64,
        fetched_end: Option<u64>,
    },
    Backend(BackendError),
}

impl From<BackendError> for PullError {
    fn from(e: BackendError) -> Self {
        Self::Backend(e)
    }
}

/// The pull cursor consumer and the catch-up consumer.
pub struct Puller {
    consumer: Arc<StreamConsumer>,
    /// The split queue of every assigned `topic#partition`, with a lock that keeps polls of one
    /// partition in order (the cursor moves after each).
    queues: Queues,
    /// librdkafka's `assign` and `unassign` wait for its main thread to answer: they run on a
    /// thread of their own, in order, never on an async worker or under `queues`' lock (which
    /// every poll takes).
    assignments: std::sync::mpsc::Sender<Assignment>,
    catch_up: Vec<tokio::sync::Mutex<CatchUp>>,
    cursors: Arc<PullCursors>,
    stop: CancellationToken,
}

struct CatchUp {
    consumer: StreamConsumer,
    /// Where the catch-up consumer is assigned and the next offset it will return.
    position: Option<(TopicPartition, u64)>,
}

impl Puller {
    pub fn start(config: &ClientConfig, cursors: Arc<PullCursors>) -> Result<Self, BackendError> {
        // A fetch at the pull cursor that the broker refuses as out of range must not move the
        // cursor by itself (to the log start, where the poll would skip up to the old cursor):
        // it comes back as an error the poll answers (`PullError::OutOfRange`).
        let mut pull_config = config.clone();
        pull_config.set("auto.offset.reset", "error");
        let consumer: Arc<StreamConsumer> = Arc::new(pull_config.create().map_err(kafka_err)?);
        let catch_up = (0..CATCH_UP_CONSUMERS)
            .map(|_| Ok(tokio::sync::Mutex::new(CatchUp { consumer: config.create().map_err(kafka_err)?, position: None })))
            .collect::<Result<Vec<_>, BackendError>>()?;
        let stop = CancellationToken::new();
        // The main queue must be served for librdkafka's events and errors; every message goes
        // to a split queue, so anything here is logged and dropped.
        let (main, stopped) = (consumer.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    received = main.recv() => match received {
                        Ok(m) => tracing::warn!(topic = m.topic(), partition = m.partition(), offset = m.offset(), "message on the main Kafka queue ignored"),
                        Err(e) => {
                            tracing::warn!(error = %e, "Kafka consumer error");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
        });
        let queues: Queues = Default::default();
        let (assignments, pending) = std::sync::mpsc::channel();
        let (assigning, assigned) = (consumer.clone(), queues.clone());
        std::thread::Builder::new()
            .name("kafka-assign".into())
            .spawn(move || apply_assignments(&assigning, &assigned, pending))
            .map_err(|e| BackendError::Io(format!("starting the Kafka assignment thread: {e}")))?;
        Ok(Self { consumer, queues, assignments, catch_up, cursors, stop })
    }

    /// Moves the pull cursor of `tp`. An assigned partition is moved at once; one nobody pulls
    /// yet (boot alignment sets every cursor) is assigned by its first poll, so idle partitions
    /// cost no split queue and no prefetch.
    pub fn seek(&self, tp: &TopicPartition, offset: u64) {
        self.cursors.set(tp, offset);
        let (topic, partition) = (tp.topic.as_str(), tp.partition as i32);
        let assigned = self.queues.lock().unwrap().contains_key(tp);
        // A seek with no timeout does not wait for librdkafka's answer.
        if assigned {
            if let Err(e) = self.consumer.seek(topic, partition, Offset::Offset(offset as i64), Duration::ZERO) {
                // A partition whose first fetch has not started cannot seek yet: assign it anew.
                tracing::debug!(%tp, offset, error = %e, "seek refused; re-assigning the partition");
                let _ = self.assignments.send(Assignment::Reassign(tp.clone(), offset));
            }
        }
    }

    /// Assigns `tp` at `offset` with its own split queue.
    fn assign(&self, tp: &TopicPartition, offset: u64) {
        let (topic, partition) = (tp.topic.as_str(), tp.partition as i32);
        let mut queues = self.queues.lock().unwrap();
        if queues.contains_key(tp) {
            return;
        }
        let Some(queue) = self.consumer.split_partition_queue(topic, partition) else {
            tracing::error!(%tp, "cannot split a queue for this Kafka partition");
            return;
        };
        // The queue is in place before the assignment is applied: nothing of the partition can
        // reach the main queue, and polls find nothing until it is.
        let queue: OrderedQueue = Arc::new((queue, tokio::sync::Mutex::new(())));
        queues.insert(tp.clone(), queue.clone());
        let _ = self.assignments.send(Assignment::Assign(tp.clone(), offset, queue));
    }

    /// Reads up to `max` events at the pull cursor of `tp` and advances it.
    pub async fn poll_cursor(&self, tp: &TopicPartition, max: usize, wait: Duration) -> Result<Vec<Event>, PullError> {
        let queue = self.queues.lock().unwrap().get(tp).cloned();
        let Some(queue) = queue else {
            // Not assigned yet: start where the cursor (or the log start) says.
            self.assign(tp, self.cursors.get(tp).unwrap_or(0));
            tokio::time::sleep(wait.min(Duration::from_millis(100))).await;
            return Ok(Vec::new());
        };
        let (queue, order) = &*queue;
        let _in_order = order.lock().await;
        let cursor = self.cursors.get(tp).unwrap_or(0);
        let mut stream = queue.stream();
        let events = match receive(&mut stream, tp, cursor, max, wait).await {
            Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)) => {
                return Err(PullError::OutOfRange { cursor, fetched_end: self.last_fetched_log_end(tp) });
            }
            received => received.map_err(kafka_err)?,
        };
        if let Some(last) = events.last() {
            self.cursors.set(tp, last.offset + 1);
        }
        Ok(events)
    }

    /// The log end of `tp` as the last fetch answer gave it (librdkafka keeps each assigned
    /// partition's high watermark: no request), or `None` before any answer came or after one
    /// that carried an error. It can be stale after a seek or a new assignment: a caller confirms
    /// a low value with the broker.
    pub fn last_fetched_log_end(&self, tp: &TopicPartition) -> Option<u64> {
        use rdkafka::bindings as rd;
        let topic = std::ffi::CString::new(tp.topic.as_str()).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer lives as long as `self.consumer`; librdkafka reads `topic`
        // only during the call and writes the two integers.
        let answered =
            unsafe { rd::rd_kafka_get_watermark_offsets(self.consumer.client().native_ptr(), topic.as_ptr(), tp.partition as i32, &mut low, &mut high) };
        // Before the first fetch answer the high watermark is librdkafka's "invalid" (-1001).
        (answered == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| u64::try_from(high).ok()).flatten()
    }

    /// Reads up to `max` events of `tp` from `offset` on, without touching the pull cursor.
    pub async fn read_at(&self, tp: &TopicPartition, offset: u64, max: usize, wait: Duration) -> Result<Vec<Event>, BackendError> {
        let mut catch_up = self.catch_up_consumer(tp, offset).await;
        if catch_up.position.as_ref() != Some(&(tp.clone(), offset)) {
            catch_up.consumer.assign(&one_partition(tp, Offset::Offset(offset as i64))).map_err(kafka_err)?;
            catch_up.position = Some((tp.clone(), offset));
        }
        let mut stream = catch_up.consumer.stream();
        let events = receive(&mut stream, tp, offset, max, wait.max(CATCH_UP_MIN_WAIT)).await.map_err(kafka_err)?;
        drop(stream);
        if let Some(last) = events.last() {
            catch_up.position = Some((tp.clone(), last.offset + 1));
        }
        Ok(events)
    }

    /// A catch-up consumer for a read of `tp` at `offset`: the one already standing there, else
    /// a free one, else the first to come free.
    async fn catch_up_consumer(&self, tp: &TopicPartition, offset: u64) -> tokio::sync::MutexGuard<'_, CatchUp> {
        let wanted = Some((tp.clone(), offset));
        let mut free = None;
        for slot in &self.catch_up {
            if let Ok(guard) = slot.try_lock() {
                if guard.position == wanted {
                    return guard;
                }
                free.get_or_insert(guard);
            }
        }
        if let Some(guard) = free {
            return guard;
        }
        let waits = self.catch_up.iter().map(|slot| Box::pin(slot.lock()));
        futures_util::future::select_all(waits).await.0
    }

    /// Unassigns a partition nobody reads any more (its prefetched messages go with it); the
    /// cursor stays, and the next poll assigns it again there.
    pub fn unassign(&self, tp: &TopicPartition) {
        if self.queues.lock().unwrap().remove(tp).is_some() {
            let _ = self.assignments.send(Assignment::Unassign(tp.clone()));
        }
    }

    /// Unassigns the partitions of a deleted topic.
    pub fn forget_topic(&self, topic: &TopicName) {
        let mut queues = self.queues.lock().unwrap();
        let gone: Vec<TopicPartition> = queues.keys().filter(|tp| tp.topic == *topic).cloned().collect();
        for tp in gone {
            queues.remove(&tp);
            let _ = self.assignments.send(Assignment::Unassign(tp));
        }
    }
}

/// Applies assignment changes in the order made, until the `Puller` is dropped. An assignment
/// that fails takes its queue out again, so the next poll assigns the partition anew.
fn apply_assignments(consumer: &StreamConsumer, queues: &Queues, pending: std::sync::mpsc::Receiver<Assignment>) {
    for change in pending {
        match change {
            Assignment::Assign(tp, offset, queue) => {
                if let Err(e) = consumer.incremental_assign(&one_partition(&tp, Offset::Offset(offset as i64))) {
                    tracing::error!(%tp, offset, error = %e, "assigning a Kafka partition failed");
                    let mut queues = queues.lock().unwrap();
                    if queues.get(&tp).is_some_and(|q| Arc::ptr_eq(q, &queue)) {
                        queues.remove(&tp);
                    }
                }
            }
            Assignment::Unassign(tp) => {
                let _ = consumer.incremental_unassign(&one_partition(&tp, Offset::Invalid));
            }
            Assignment::Reassign(tp, offset) => {
                let _ = consumer.incremental_unassign(&one_partition(&tp, Offset::Invalid));
                if let Err(e) = consumer.incremental_assign(&one_partition(&tp, Offset::Offset(offset as i64))) {
                    tracing::error!(%tp, offset, error = %e, "re-assigning a Kafka partition failed");
                }
            }
        }
    }
}

impl Drop for Puller {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn one_partition(tp: &TopicPartition, offset: Offset) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    // Only fails for an offset that cannot be represented, which `Offset::Offset(u64 as i64)` is not.
    let _ = list.add_partition_offset(tp.topic.as_str(), tp.partition as i32, offset);
    list
}

/// Waits up to `wait` for a first message of `tp` at or after `from`, then takes whatever else is
/// already there, up to `max`. Messages below `from` (fetched before a seek) are skipped.
async fn receive<'a, S>(stream: &mut S, tp: &TopicPartition, from: u64, max: usize, wait: Duration) -> Result<Vec<Event>, rdkafka::error::KafkaError>
where
    S: futures_util::Stream<Item = Result<BorrowedMessage<'a>, rdkafka::error::KafkaError>> + Unpin,
{
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while events.len() < max {
        let next = if events.is_empty() {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        } else {
            match stream.next().now_or_never() {
                Some(next) => next,
                None => break,
            }
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) if events.is_empty() => return Err(e),
            Some(Err(_)) | None => break,
        };
        if message.topic() != tp.topic.as_str() || message.partition() != tp.partition as i32 || (message.offset() as u64) < from {
            continue;
        }
        events.push(to_event(&message));
    }
    Ok(events)
}

fn to_event(message: &BorrowedMessage<'_>) -> Event {
    let payload = message.payload().unwrap_or_default().to_vec();
    let headers = read_headers(message);
    if headers.dropped > 0 {
        crate::core::metrics::kafka_headers_dropped().increment(headers.dropped);
        tracing::warn!(
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            dropped = headers.dropped,
            "Kafka record headers whose key is not UTF-8 dropped"
        );
    }
    Event {
        partition: message.partition() as u32,
        offset: message.offset() as u64,
        timestamp: message.timestamp().to_millis().unwrap_or(0).max(0) as u64,
        key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        headers: headers.text,
        headers_base64: headers.binary,
        payload_is_json: serde_json::from_slice::<serde::de::IgnoredAny>(&payload).is_ok(),
        payload,
        undecodable: false,
        frame: Default::default(),
    }
}

/// A record's headers as the event frame carries them.
#[derive(Debug, Default)]
struct RecordHeaders {
    /// UTF-8 values (a null value is an empty string).
    text: Vec<(String, String)>,
    /// Values that are not UTF-8 (the frame's `headers_base64`).
    binary: Vec<(String, Vec<u8>)>,
    /// Headers whose key is not UTF-8.
    dropped: u64,
}

impl RecordHeaders {
    fn add(&mut self, key: &[u8], value: Option<&[u8]>) {
        let Ok(key) = std::str::from_utf8(key) else {
            self.dropped += 1;
            return;
        };
        match std::str::from_utf8(value.unwrap_or_default()) {
            Ok(text) => self.text.push((key.to_string(), text.to_string())),
            Err(_) => self.binary.push((key.to_string(), value.unwrap_or_default().to_vec())),
        }
    }
}

/// Reads a record's headers through librdkafka's C API. rdkafka's own `Headers::get` and
/// `try_get` unwrap the key as UTF-8: any producer could stop a partition for every client, at
/// every restart, with one header key that is not (issue 20).
fn read_headers(message: &BorrowedMessage<'_>) -> RecordHeaders {
    use rdkafka::bindings as rd;
    let mut headers = RecordHeaders::default();
    let mut native: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `message.ptr()` is the live message this borrow keeps alive; the header list and
    // every name and value pointer it hands out belong to that message and are only read here,
    // before the borrow ends. librdkafka returns names NUL-terminated.
    unsafe {
        if rd::rd_kafka_message_headers(message.ptr(), &mut native) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || native.is_null() {
            return headers;
        }
        for index in 0..rd::rd_kafka_header_cnt(native) {
            let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0usize);
            if rd::rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                || name.is_null()
            {
                continue;
            }
            let key = std::ffi::CStr::from_ptr(name).to_bytes();
            let value = (!value.is_null()).then(|| std::slice::from_raw_parts(value as *const u8, size));
            headers.add(key, value);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::RecordHeaders;

    #[test]
    fn keys_that_are_not_utf8_are_dropped_and_binary_values_kept_apart() {
        let mut h = RecordHeaders::default();
        h.add(b"trace", Some(b"abc"));
        h.add(b"\xff\xfebad", Some(b"x"));
        h.add(b"blob", Some(&[0xff, 0x00, 0x80]));
        h.add(b"empty", None);
        assert_eq!(h.text, vec![("trace".to_string(), "abc".to_string()), ("empty".to_string(), String::new())]);
        assert_eq!(h.binary, vec![("blob".to_string(), vec![0xff, 0x00, 0x80])]);
        assert_eq!(h.dropped, 1);
    }
}
