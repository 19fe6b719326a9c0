//! A Kafka-protocol proxy between the gateway and tansu that answers fetches as Apache Kafka
//! does where tansu does not: a fetch at an offset above the partition's log end, or below its
//! log start, is refused with OFFSET_OUT_OF_RANGE (tansu answers it empty). Everything else
//! passes through byte for byte. The broker must advertise the proxy's address
//! (`TestBroker::start_behind`), or the client would reach tansu directly after bootstrap.
//!
//! Only what the rewrite needs is parsed: request and response headers (to pair a fetch answer
//! with its request by correlation id) and the fetch request's and answer's partition lists, in
//! every Fetch version from 4 to 17 (flexible from 12, topic ids from 13).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const FETCH: i16 = 1;
const OFFSET_OUT_OF_RANGE: i16 = 1;

/// A fetch request's partitions: (topic name or id, partition) to the offset asked for.
type Asked = HashMap<(Vec<u8>, i32), i64>;

pub struct KafkaProxy {
    pub port: u16,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl KafkaProxy {
    /// Serves on `listener` (bound first, so the broker can advertise its port), forwarding to
    /// `upstream` (`host:port`).
    pub fn start(listener: std::net::TcpListener, upstream: String) -> Self {
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let listener = TcpListener::from_std(listener).unwrap();
        let refused = Arc::new(AtomicU64::new(0));
        let counted = refused.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, refused) = (upstream.clone(), counted.clone());
                tokio::spawn(async move {
                    if let Ok(broker) = TcpStream::connect(&upstream).await {
                        let _ = relay(client, broker, refused).await;
                    }
                });
            }
        });
        Self { port, refused, task }
    }

    /// Fetches refused with OFFSET_OUT_OF_RANGE so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for KafkaProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, broker: TcpStream, refused: Arc<AtomicU64>) -> std::io::Result<()> {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_broker, mut to_broker) = broker.into_split();
    // Correlation id to (Fetch version, partitions asked), for each fetch not answered yet.
    let fetches: Arc<Mutex<HashMap<i32, (i16, Asked)>>> = Default::default();
    let asked = fetches.clone();
    let requests = async move {
        while let Some(frame) = read_frame(&mut from_client).await? {
            if let Some((correlation, version, partitions)) = parse_fetch_request(&frame) {
                asked.lock().unwrap().insert(correlation, (version, partitions));
            }
            write_frame(&mut to_broker, &frame).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let answers = async move {
        while let Some(mut frame) = read_frame(&mut from_broker).await? {
            let correlation = frame.get(..4).map(|b| i32::from_be_bytes(b.try_into().unwrap()));
            let fetch = correlation.and_then(|c| fetches.lock().unwrap().remove(&c));
            if let Some((version, partitions)) = fetch {
                let n = refuse_out_of_range(&mut frame, version, &partitions);
                refused.fetch_add(n, Ordering::SeqCst);
            }
            write_frame(&mut to_client, &frame).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::select! {
        r = requests => r,
        r = answers => r,
    }
}

async fn read_frame(stream: &mut tokio::net::tcp::OwnedReadHalf) -> std::io::Result<Option<Vec<u8>>> {
    let mut size = [0u8; 4];
    if stream.read_exact(&mut size).await.is_err() {
        return Ok(None);
    }
    let mut frame = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    stream.read_exact(&mut frame).await?;
    Ok(Some(frame))
}

async fn write_frame(stream: &mut tokio::net::tcp::OwnedWriteHalf, frame: &[u8]) -> std::io::Result<()> {
    stream.write_all(&(frame.len() as i32).to_be_bytes()).await?;
    stream.write_all(frame).await
}

/// A cursor over a frame; every read answers `None` past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let taken = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(taken)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn uvarint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    /// An array's length: compact (length + 1, 0 = null) in flexible versions.
    fn array_len(&mut self, flexible: bool) -> Option<usize> {
        if flexible {
            Some((self.uvarint()? as usize).saturating_sub(1))
        } else {
            Some(self.i32()?.max(0) as usize)
        }
    }
    fn string(&mut self, flexible: bool) -> Option<&'a [u8]> {
        let len = if flexible { (self.uvarint()? as usize).checked_sub(1)? } else { usize::try_from(self.i16()?).ok()? };
        self.take(len)
    }
    fn nullable_bytes(&mut self, flexible: bool) -> Option<()> {
        let len = if flexible { (self.uvarint()? as usize).saturating_sub(1) } else { self.i32()?.max(0) as usize };
        self.take(len).map(|_| ())
    }
    fn tagged_fields(&mut self, flexible: bool) -> Option<()> {
        if flexible {
            for _ in 0..self.uvarint()? {
                self.uvarint()?;
                let size = self.uvarint()? as usize;
                self.take(size)?;
            }
        }
        Some(())
    }
    /// A topic as a fetch names it: its name up to version 12, its id from 13.
    fn topic(&mut self, version: i16, flexible: bool) -> Option<Vec<u8>> {
        if version >= 13 {
            Some(self.take(16)?.to_vec())
        } else {
            Some(self.string(flexible)?.to_vec())
        }
    }
}

/// A Fetch request's correlation id, version and the offset asked for per partition.
fn parse_fetch_request(frame: &[u8]) -> Option<(i32, i16, Asked)> {
    let mut r = Reader { bytes: frame, at: 0 };
    let (api_key, version, correlation) = (r.i16()?, r.i16()?, r.i32()?);
    if api_key != FETCH || !(4..=17).contains(&version) {
        return None;
    }
    let flexible = version >= 12;
    // The client id is a nullable string with an int16 length in every header version.
    let client_id = r.i16()?;
    r.take(client_id.max(0) as usize)?;
    r.tagged_fields(flexible)?;
    if version <= 14 {
        r.i32()?; // replica_id
    }
    r.take(4 + 4 + 4 + 1)?; // max_wait_ms, min_bytes, max_bytes, isolation_level
    if version >= 7 {
        r.take(8)?; // session_id, session_epoch
    }
    let mut asked = Asked::new();
    for _ in 0..r.array_len(flexible)? {
        let topic = r.topic(version, flexible)?;
        for _ in 0..r.array_len(flexible)? {
            let partition = r.i32()?;
            if version >= 9 {
                r.i32()?; // current_leader_epoch
            }
            let fetch_offset = r.i64()?;
            if version >= 12 {
                r.i32()?; // last_fetched_epoch
            }
            if version >= 5 {
                r.i64()?; // log_start_offset
            }
            r.i32()?; // partition_max_bytes
            r.tagged_fields(flexible)?;
            asked.insert((topic.clone(), partition), fetch_offset);
        }
        r.tagged_fields(flexible)?;
    }
    Some((correlation, version, asked))
}

/// Sets OFFSET_OUT_OF_RANGE on every partition of a Fetch answer that answered no error for
/// an offset above its high watermark or below its log start; answers how many it set.
fn refuse_out_of_range(frame: &mut [u8], version: i16, asked: &Asked) -> u64 {
    let flexible = version >= 12;
    let mut refuse = Vec::new();
    let parsed = (|| {
        let mut r = Reader { bytes: frame, at: 0 };
        r.i32()?; // correlation id
        r.tagged_fields(flexible)?;
        r.i32()?; // throttle_time_ms
        if version >= 7 {
            r.take(2 + 4)?; // error_code, session_id
        }
        for _ in 0..r.array_len(flexible)? {
            let topic = r.topic(version, flexible)?;
            for _ in 0..r.array_len(flexible)? {
                let partition = r.i32()?;
                let error_at = r.at;
                let error = r.i16()?;
                let high_watermark = r.i64()?;
                r.i64()?; // last_stable_offset
                let log_start = if version >= 5 { r.i64()? } else { -1 };
                let aborted = r.array_len(flexible)?;
                for _ in 0..aborted {
                    r.take(16)?;
                    r.tagged_fields(flexible)?;
                }
                if version >= 11 {
                    r.i32()?; // preferred_read_replica
                }
                r.nullable_bytes(flexible)?;
                r.tagged_fields(flexible)?;
                if let Some(offset) = asked.get(&(topic.clone(), partition)) {
                    if error == 0 && (*offset > high_watermark || (log_start >= 0 && *offset < log_start)) {
                        refuse.push(error_at);
                    }
                }
            }
            r.tagged_fields(flexible)?;
        }
        Some(())
    })();
    if parsed.is_none() {
        return 0;
    }
    for at in &refuse {
        frame[*at..*at + 2].copy_from_slice(&OFFSET_OUT_OF_RANGE.to_be_bytes());
    }
    refuse.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_v11(topic: &str, partition: i32, offset: i64) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend(FETCH.to_be_bytes());
        f.extend(11i16.to_be_bytes());
        f.extend(7i32.to_be_bytes());
        f.extend(2i16.to_be_bytes());
        f.extend(b"id");
        f.extend((-1i32).to_be_bytes()); // replica
        f.extend([0u8; 13]);
        f.extend([0u8; 8]);
        f.extend(1i32.to_be_bytes());
        f.extend((topic.len() as i16).to_be_bytes());
        f.extend(topic.as_bytes());
        f.extend(1i32.to_be_bytes());
        f.extend(partition.to_be_bytes());
        f.extend(0i32.to_be_bytes()); // leader epoch
        f.extend(offset.to_be_bytes());
        f.extend(0i64.to_be_bytes()); // log start
        f.extend(1024i32.to_be_bytes());
        f
    }

    fn answer_v11(topic: &str, partition: i32, high_watermark: i64) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend(7i32.to_be_bytes());
        f.extend(0i32.to_be_bytes());
        f.extend([0u8; 6]);
        f.extend(1i32.to_be_bytes());
        f.extend((topic.len() as i16).to_be_bytes());
        f.extend(topic.as_bytes());
        f.extend(1i32.to_be_bytes());
        f.extend(partition.to_be_bytes());
        f.extend(0i16.to_be_bytes());
        f.extend(high_watermark.to_be_bytes());
        f.extend(high_watermark.to_be_bytes());
        f.extend(0i64.to_be_bytes());
        f.extend((-1i32).to_be_bytes()); // no aborted transactions
        f.extend((-1i32).to_be_bytes()); // preferred read replica
        f.extend(0i32.to_be_bytes()); // empty records
        f
    }

    #[test]
    fn a_fetch_above_the_high_watermark_is_refused_and_one_within_it_is_not() {
        let (correlation, version, asked) = parse_fetch_request(&request_v11("t", 0, 10)).unwrap();
        assert_eq!((correlation, version, asked[&(b"t".to_vec(), 0)]), (7, 11, 10));
        let mut above = answer_v11("t", 0, 4);
        assert_eq!(refuse_out_of_range(&mut above, version, &asked), 1);
        assert_eq!(&above[above.len() - 38..above.len() - 36], &OFFSET_OUT_OF_RANGE.to_be_bytes());
        let mut within = answer_v11("t", 0, 12);
        assert_eq!(refuse_out_of_range(&mut within, version, &asked), 0);
        assert_eq!(within, answer_v11("t", 0, 12));
    }
}
