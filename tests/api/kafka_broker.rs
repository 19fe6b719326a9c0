//! A real Kafka-protocol broker for the Kafka tests: tansu (scripts/kafka-test-broker installs
//! it), one per test, on a free port of 127.0.0.1 with its SQLite data in a temp dir. It keeps its
//! data across `stop`/`start`, which the outage test relies on.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::free_port;

pub struct TestBroker {
    dir: tempfile::TempDir,
    pub port: u16,
    /// The port clients are told to use (metadata answers): the broker's own, or a proxy's.
    advertised: u16,
    child: Option<Child>,
}

/// The tansu binary: `ACKGATE_DEV_TANSU`, else where `scripts/kafka-test-broker install` puts it.
fn binary() -> PathBuf {
    let path = std::env::var_os("ACKGATE_DEV_TANSU").map(PathBuf::from).unwrap_or_else(|| {
        let root = std::env::var_os("ACKGATE_DEV_TANSU_ROOT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root/.cache/ackgate/tansu"));
        root.join("bin/tansu")
    });
    assert!(path.exists(), "Kafka test broker missing at {}: run `scripts/kafka-test-broker install`", path.display());
    path
}

impl TestBroker {
    pub fn start() -> Self {
        let port = free_port();
        let mut broker = Self { dir: tempfile::tempdir().unwrap(), port, advertised: port, child: None };
        broker.resume();
        broker
    }

    /// A broker whose clients all go through `crate::kafka_proxy::KafkaProxy` (it advertises
    /// the proxy's port); answers the proxy, whose `port` is the bootstrap address to use.
    pub fn start_behind_proxy() -> (Self, crate::kafka_proxy::KafkaProxy) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let advertised = listener.local_addr().unwrap().port();
        let mut broker = Self { dir: tempfile::tempdir().unwrap(), port: free_port(), advertised, child: None };
        broker.resume();
        let proxy = crate::kafka_proxy::KafkaProxy::start(listener, format!("127.0.0.1:{}", broker.port));
        (broker, proxy)
    }

    /// `host:port` for `kafka.bootstrap_servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn url(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// Starts the broker process (again) on the same port and data, and waits until it answers.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "broker already running");
        let child = Command::new(binary())
            .args(["broker", "--listener-url", &self.url(), "--advertised-listener-url", &format!("tcp://127.0.0.1:{}", self.advertised)])
            // Relative on purpose: tansu resolves the SQLite path against its working directory.
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("ACKGATE_DEV_TANSU_LOGS").is_some() { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .expect("tansu starts");
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let listed = Command::new(binary()).args(["topic", "list", "--broker", &self.url()]).stdout(Stdio::null()).stderr(Stdio::null()).status();
            if listed.is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("tansu broker on port {} not ready after 30 s", self.port);
    }

    /// Grows `topic` to `partitions` partitions, as Kafka's CreatePartitions would. tansu 0.6
    /// answers no CreatePartitions, but its metadata, produce and fetch answers are read from
    /// its SQLite store each time: the new partitions' rows (and empty watermarks) are added there,
    /// by python3's sqlite3 (every machine has it) while the broker runs.
    pub fn add_partitions(&self, topic: &str, partitions: u32) {
        let script = r#"
import sqlite3, sys
db, topic, wanted = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = sqlite3.connect(db, timeout=30)
with c:
    tid, have = c.execute("select id, partitions from topic where name = ?", (topic,)).fetchone()
    for p in range(have, wanted):
        c.execute("insert into topition (topic, partition) values (?, ?)", (tid, p))
        tp = c.execute("select id from topition where topic = ? and partition = ?", (tid, p)).fetchone()[0]
        c.execute("insert into watermark (topition) values (?)", (tp,))
    c.execute("update topic set partitions = ? where id = ?", (wanted, tid))
"#;
        let db = self.dir.path().join("tansu.db");
        let status = Command::new("python3").arg("-c").arg(script).arg(&db).arg(topic).arg(partitions.to_string()).status().expect("python3 runs");
        assert!(status.success(), "adding partitions to {topic} in {}", db.display());
    }

    /// Cuts `topic`'s `partition` back to `end` (its records from `end` on are gone and the next
    /// one written gets `end`), as a failover to a replica behind or a topic recreated outside
    /// ackgate leaves it. tansu reads its log end from the SQLite store at each request, so the
    /// rows are changed there while the broker runs (python3's sqlite3, as `add_partitions`).
    pub fn truncate(&self, topic: &str, partition: u32, end: u64) {
        let script = r#"
import sqlite3, sys
db, topic, partition, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = sqlite3.connect(db, timeout=30)
with c:
    tp = c.execute("select tp.id from topition tp join topic t on tp.topic = t.id where t.name = ? and tp.partition = ?", (topic, partition)).fetchone()[0]
    c.execute("delete from header where topition = ? and offset_id >= ?", (tp, end))
    c.execute("delete from record where topition = ? and offset_id >= ?", (tp, end))
    assert c.execute("update watermark set high = ? where topition = ?", (end, tp)).rowcount == 1
"#;
        let db = self.dir.path().join("tansu.db");
        let status =
            Command::new("python3").arg("-c").arg(script).arg(&db).arg(topic).arg(partition.to_string()).arg(end.to_string()).status().expect("python3 runs");
        assert!(status.success(), "truncating {topic} in {}", db.display());
    }

    /// Stops the broker process (SIGKILL: an outage, not a clean shutdown); data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.stop();
    }
}
