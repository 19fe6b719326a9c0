//! Damaged files are found, never read around (issue 43, item 3): a flipped bit in a write-ahead
//! log of the embedded log or of the offset store stops the start with an error that names the
//! file. Before, RocksDB's default recovery stopped replaying at the damaged record and opened
//! with everything after it gone: six of eight acknowledged events vanished without a word. Only a
//! record cut short at the very end of a WAL (a crash in the middle of a write that was never
//! answered) is passed over.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

/// Eight events published in four requests and acked by client `c`, then SIGKILL: everything is
/// in the write-ahead logs, nothing in table files yet.
async fn eight_events_acked(data: &Path) {
    let gw = Process::start(data, &[]);
    for n in 0..4 {
        let pad = "x".repeat(60);
        publish(&gw.base, "w", json!({"events": [{"partition": 0, "payload": {"n": n * 2, "pad": pad}}, {"partition": 0, "payload": {"n": n * 2 + 1}}]})).await;
    }
    let mut client = TestClient::connect(gw.addr, "c").await;
    client.subscribe("w", json!({})).await;
    let events = client.recv_events(8).await;
    client.ack_confirmed(&ids(&events), "all").await;
    gw.kill9();
}

/// The largest write-ahead log of the RocksDB database in `dir`.
fn wal(dir: &Path) -> PathBuf {
    let logs = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "log"));
    logs.max_by_key(|p| std::fs::metadata(p).unwrap().len()).expect("a WAL")
}

fn flip_a_bit_in_the_middle(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(file, bytes).unwrap();
}

/// Runs the binary on `data`; its stderr when it exits by itself within 30 s, or `Err` with its
/// stderr when it was still running (it started) and was killed.
fn run_to_exit(data: &Path) -> Result<String, String> {
    let config = data.with_extension("toml");
    std::fs::write(&config, format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:0\"\n", data.display().to_string())).unwrap();
    let stderr = data.with_extension("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ackgate"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if let Some(status) = child.try_wait().unwrap() {
            let said = std::fs::read_to_string(&stderr).unwrap();
            assert!(!status.success(), "exited 0: {said}");
            return Ok(said);
        }
        if std::fs::read_to_string(&stderr).unwrap().contains("listening") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(std::fs::read_to_string(&stderr).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_the_logs_wal_stops_the_start_and_names_the_file() {
    let (_dir, data) = temp_dir();
    eight_events_acked(&data).await;
    let damaged = wal(&data.join("log"));
    flip_a_bit_in_the_middle(&damaged);
    let said = run_to_exit(&data).expect("it refuses to start on a damaged log");
    assert!(said.contains(&format!("{} is damaged", damaged.display())) && said.contains("Backups"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_the_offset_stores_wal_stops_the_start_and_names_the_file() {
    let (_dir, data) = temp_dir();
    eight_events_acked(&data).await;
    let damaged = wal(&data.join("offsets"));
    flip_a_bit_in_the_middle(&damaged);
    let said = run_to_exit(&data).expect("it refuses to start on damaged offsets");
    assert!(said.contains(&format!("{} is damaged", damaged.display())), "{said}");
}

/// A WAL cut short at its end is not damage: the gateway starts, with every record before the
/// cut. The record cut short was answered (a publish of two events, 200 after its fsync) and
/// acknowledged, so this is a lost tail, and it is treated as one (issue 60 item 1: the test
/// checked only the log end): the client resumes at the new end, nothing past it skipped; the
/// loss is counted in `ackgate_log_truncations_total` (its alert pages) and logged with both
/// numbers; the partition's log epoch steps, so a token from before it is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_cut_short_at_its_end_still_starts_with_what_came_before() {
    let (_dir, data) = temp_dir();
    eight_events_acked(&data).await;
    let cut = wal(&data.join("log"));
    let length = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&cut).unwrap().set_len(length - 5).unwrap();
    // It starts (`Process::start` waits until it listens).
    let gw = Process::start(&data, &[]);
    let (_, topics) = get_json(&format!("{}/topics", gw.base)).await;
    let log_end = topics["topics"][0]["partitions"][0]["log_end"].as_u64().unwrap();
    assert_eq!(log_end, 6, "the last publish (two events) was the record cut short: {topics}");
    // Both numbers of the range lost, in the log.
    let line = gw.wait_for_log("committed offset above the log end").await;
    assert!(line.contains("committed=8") && line.contains("log_end=6"), "{line}");
    gw.wait_for_log("lost its tail").await;
    let metrics = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ackgate_log_truncations_total 1\n"), "the lost tail is not counted:\n{metrics}");
    // The client that had acked to 8 resumes at 6, in the partition's next log epoch.
    let mut client = TestClient::connect(gw.addr, "c").await;
    let subscribed = client.subscribe("w", json!({})).await;
    assert_eq!(subscribed["partitions"][0]["from"], 6, "{subscribed}");
    assert!(subscribed["partitions"][0]["epoch"].as_u64().unwrap() >= 1, "the log epoch did not step: {subscribed}");
    publish(&gw.base, "w", json!({"partition": 0, "payload": {"n": "after"}})).await;
    let [event] = client.recv_events(1).await.try_into().unwrap();
    assert_eq!((event["offset"].as_u64(), event["payload"]["n"].as_str()), (Some(6), Some("after")), "nothing new is skipped");
    gw.kill9();
}

/// A flipped bit in a table file of the embedded log (issue 43, item 3): RocksDB checks a data
/// block only when a read reaches it, so the gateway starts and serves up to the damaged block.
/// There it stops, naming the file, and never serves past it: the subscriber's events are
/// contiguous from 0, its committed offset is below the damage, and no gap covers it. The next
/// start refuses while the file is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_a_table_file_of_the_log_stops_the_gateway_and_nothing_is_served_past_it() {
    let (_dir, data) = temp_dir();
    const EVENTS: u64 = 2000;
    let gw = Process::start(&data, &[]);
    for batch in 0..20u64 {
        // Random padding: a block compresses to about its own size, so the table has many blocks.
        let events: Vec<_> = (0..100u64)
            .map(|i| {
                let pad: String = (0..200).map(|_| char::from(b'a' + (rand_byte() % 26))).collect();
                json!({"partition": 0, "payload": {"n": batch * 100 + i, "pad": pad}})
            })
            .collect();
        publish(&gw.base, "t", json!({"events": events})).await;
    }
    gw.kill9();
    // Opening replays the WAL into a table file; the next start reads that file.
    let gw = Process::start(&data, &[]);
    gw.kill9();
    let table = std::fs::read_dir(data.join("log")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "sst"));
    let table = table.max_by_key(|p| std::fs::metadata(p).unwrap().len()).expect("a table file");
    let mut bytes = std::fs::read(&table).unwrap();
    let at = bytes.len() / 3; // a data block in the middle of the partition
    bytes[at] ^= 0x10;
    std::fs::write(&table, bytes).unwrap();

    let gw = Process::start(&data, &[]);
    let mut client = TestClient::connect(gw.addr, "reader").await;
    client.subscribe("t", json!({"from": "earliest"})).await;
    let mut offsets = Vec::new();
    // Until the gateway stops: every event it sent is acked.
    while let Some(frame) = client.try_recv(Duration::from_secs(5)).await {
        if frame["type"] == "event" && frame["partition"] == 0 {
            offsets.push(frame["offset"].as_u64().unwrap());
            client.try_send(json!({"op": "ack", "delivery_id": frame["delivery_id"]})).await;
        }
    }
    gw.wait_for_log("is damaged").await;
    let logs = gw.logs.lock().unwrap().join("\n");
    assert!(logs.contains(&format!("{} is damaged", table.display())), "the file is named:\n{logs}");
    assert!(!offsets.is_empty() && (offsets.len() as u64) < EVENTS, "served up to the damage: {} events", offsets.len());
    let mut sorted = offsets.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, (0..sorted.len() as u64).collect::<Vec<_>>(), "nothing served past the damaged block");
    drop(gw);

    // The next start refuses while the damaged file is there.
    let said = run_to_exit(&data).expect("it refuses to start on the marked file");
    assert!(said.contains(&format!("{} is damaged", table.display())), "{said}");
}

/// A byte from a small xorshift: random padding without a dependency.
fn rand_byte() -> u8 {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u64> = Cell::new(0x2545_f491_4f6c_dd1d ^ std::process::id() as u64));
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 24) as u8
    })
}
