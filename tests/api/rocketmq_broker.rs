//! A real RocketMQ broker for the RocketMQ tests: rocketmq-rust's name server and broker (the Rust
//! port; `scripts/rocketmq-test-broker install` builds them), one pair per test, started through
//! `scripts/rocketmq-test-broker start PORT` with its data in a temp dir, stopped on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ackgate::backend::rocketmq::message::StoredMessage;
use ackgate::backend::rocketmq::remoting::{code, Remoting, Response};

use crate::support::free_port;

pub struct TestRocketMq {
    dir: tempfile::TempDir,
    pub port: u16,
    extra: String,
    brokers: usize,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/rocketmq-test-broker")
}

impl TestRocketMq {
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// With extra `[broker]` TOML lines (revive timing, ...).
    pub fn start_with(extra: &str) -> Self {
        Self::start_cluster(1, extra)
    }

    /// A name server and `brokers` masters of one cluster (broker-a, broker-b, ...).
    pub fn start_cluster(brokers: usize, extra: &str) -> Self {
        let broker = Self { dir: tempfile::tempdir().unwrap(), port: free_port(), extra: extra.to_string(), brokers };
        broker.run("start", &[]);
        broker
    }

    /// Every master the name server routes: (broker name, address), by name.
    pub async fn brokers(&self) -> Vec<(String, String)> {
        ackgate::backend::rocketmq::Broker::new(self.namesrv(), Duration::from_secs(5)).brokers().await.expect("cluster info")
    }

    /// SIGKILL of the `n`th master (1-based, as `start_cluster` named them a, b, ...).
    pub fn kill_broker(&self, n: usize) {
        self.signal_broker(n, "KILL");
    }

    /// Starts the `n`th master again after `kill_broker` (same store, a new port); returns once
    /// the name server routes it.
    pub fn restart_broker(&self, n: usize) {
        self.run("restart-broker", &[&n.to_string()]);
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`) to the `n`th master.
    pub fn signal_broker(&self, n: usize, signal: &str) {
        let pid = std::fs::read_to_string(self.dir.path().join(format!("broker-{n}.pid"))).expect("the broker's pid file");
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.trim()).status().unwrap();
        assert!(status.success());
    }

    /// `scripts/rocketmq-test-broker VERB PORT ARGS...` with this cluster's data dir and settings.
    fn run(&self, verb: &str, args: &[&str]) {
        let status = Command::new("bash")
            .arg(script())
            .arg(verb)
            .arg(self.port.to_string())
            .args(args)
            .env("ACKGATE_DEV_ROCKETMQ_DATA", self.dir.path())
            .env("ACKGATE_DEV_ROCKETMQ_BROKER_EXTRA", &self.extra)
            .env("ACKGATE_DEV_ROCKETMQ_BROKERS", self.brokers.to_string())
            .status()
            .expect("scripts/rocketmq-test-broker runs");
        assert!(status.success() || verb == "stop", "rocketmq-test-broker {verb} failed: see {}", self.dir.path().display());
    }

    /// `host:port` of the name server, for `rocketmq.namesrv_addr`.
    pub fn namesrv(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's address as the name server routes it.
    pub async fn broker_addr(&self) -> String {
        let r = self.call(&self.namesrv(), 106, &[]).await;
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("cluster info is JSON");
        let table = body["brokerAddrTable"].as_object().expect("brokerAddrTable");
        table.values().next().and_then(|b| b["brokerAddrs"]["0"].as_str()).expect("one broker").to_string()
    }

    pub async fn call(&self, addr: &str, request: i32, ext: &[(&str, String)]) -> Response {
        Remoting::default().call(addr, request, ext, &[], Duration::from_secs(5)).await.expect("RocketMQ answers")
    }

    /// An operator's reset of `group`'s offset on one queue, as `mqadmin resetOffsetByTime` does
    /// it (INVOKE_BROKER_TO_RESET_OFFSET with a target offset). With the broker's server-side reset
    /// (on by default), the group's next PULL of the queue answers OFFSET_MOVED to `offset`.
    pub async fn reset_group_offset(&self, group: &str, topic: &str, queue: u32, offset: u64) {
        let ext = [
            ("topic", topic.to_string()),
            ("group", group.to_string()),
            ("queueId", queue.to_string()),
            ("offset", offset.to_string()),
            ("timestamp", "-1".to_string()),
            ("isForce", "true".to_string()),
        ];
        let r = self.call(&self.broker_addr().await, 222, &ext).await;
        assert_eq!(r.code, 0, "reset offset refused: {:?}", r.remark);
    }

    /// Writes `body` to `group`'s POP retry topic of `topic` (`%RETRY%{group}_{topic}`, created
    /// here) with `properties`, as the broker's revive service writes a revived copy. rocketmq-rust
    /// 1.0.0 diverts a send to a retry topic to a DLQ while the group it parses out of the topic's
    /// name (everything after `%RETRY%`) holds *no* queue lock: its `isLockAllExpired` test is
    /// inverted against Apache's, which diverts while a lock is held. So a queue lock is taken
    /// for that group first (LOCK_BATCH_MQ, held 60 s).
    /// `born`: the copy's born time (the revive service copies the original's).
    pub async fn write_revived_copy(&self, group: &str, topic: &str, original: &StoredMessage, born: u64) {
        let addr = self.broker_addr().await;
        let retry_topic = format!("%RETRY%{group}_{topic}");
        let client = ackgate::backend::rocketmq::Broker::new(self.namesrv(), Duration::from_secs(5));
        client.create_topic(&addr, &retry_topic, 1, false).await.unwrap();
        let lock = serde_json::json!({
            // The group the broker parses out of the retry topic's name (all after `%RETRY%`).
            "consumerGroup": format!("{group}_{topic}"),
            "clientId": "ackgate-test-locker",
            "onlyThisBroker": true,
            "mqSet": [{"topic": retry_topic, "brokerName": "ackgate-test-broker", "queueId": 0}],
        });
        let r = Remoting::default().call(&addr, 41, &[], lock.to_string().as_bytes(), Duration::from_secs(5)).await.expect("RocketMQ answers");
        assert_eq!(r.code, 0, "lock refused: {:?}", r.remark);
        let queue_end =
            async || self.call(&addr, code::GET_MAX_OFFSET, &[("topic", retry_topic.clone()), ("queueId", "0".to_string())]).await.number("offset").ok();
        let before = queue_end().await;
        // The original's properties, as the revive service copies them.
        let mut properties: Vec<(&str, &str)> = original.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        properties.push(("1ST_POP_TIME", "1"));
        self.send_raw(&retry_topic, 0, 0, born, &properties, &original.body).await;
        // The broker answers a send once the commit log holds it; its consume queue (what
        // GET_MAX_OFFSET reads) is built by a dispatch task a moment later, later still on a
        // loaded machine, so the queue end is awaited. A copy diverted to the DLQ never shows.
        let expected = before.map(|n| n + 1);
        crate::support::wait_for(&format!("the copy is in {retry_topic}, not diverted to the DLQ"), async || queue_end().await == expected).await;
    }

    /// SEND_MESSAGE of `body` zlib-compressed, with the compressed flag (sysFlag bit 0, type bits
    /// 0: zlib), to one queue of `topic`, as Apache's Java producer sends a body over 4 KiB.
    pub async fn send_compressed(&self, topic: &str, queue: u32, body: &[u8]) {
        use std::io::Write;
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(body).unwrap();
        let compressed = encoder.finish().unwrap();
        assert!(compressed.len() < body.len(), "the body compresses");
        self.send_raw(topic, queue, 1, 1, &[("UNIQ_KEY", "compressed-1")], &compressed).await;
    }

    /// SEND_MESSAGE as a raw producer writes it, with its own sysFlag and born time.
    async fn send_raw(&self, topic: &str, queue: u32, sys_flag: i32, born: u64, properties: &[(&str, &str)], body: &[u8]) {
        let properties = ackgate::backend::rocketmq::message::encode_properties(properties);
        let ext = [
            ("producerGroup", "outside".to_string()),
            ("topic", topic.to_string()),
            ("defaultTopic", "TBW102".to_string()),
            ("defaultTopicQueueNums", "4".to_string()),
            ("queueId", queue.to_string()),
            ("sysFlag", sys_flag.to_string()),
            ("bornTimestamp", born.to_string()),
            ("flag", "0".to_string()),
            ("properties", properties),
            ("reconsumeTimes", "0".to_string()),
            ("unitMode", "false".to_string()),
            ("batch", "false".to_string()),
        ];
        let r = Remoting::default().call(&self.broker_addr().await, code::SEND_MESSAGE, &ext, body, Duration::from_secs(5)).await.expect("RocketMQ answers");
        assert_eq!(r.code, 0, "send refused: {:?}", r.remark);
    }

    /// The consumer offset the broker holds for `group` on a queue (`None`: it holds none).
    pub async fn consumer_offset(&self, group: &str, topic: &str, queue: u32) -> Option<i64> {
        let ext =
            [("consumerGroup", group.to_string()), ("topic", topic.to_string()), ("queueId", queue.to_string()), ("setZeroIfNotFound", "false".to_string())];
        let r = self.call(&self.broker_addr().await, code::QUERY_CONSUMER_OFFSET, &ext).await;
        (r.code == 0).then(|| r.number("offset").unwrap())
    }
}

impl Drop for TestRocketMq {
    fn drop(&mut self) {
        self.run("stop", &[]);
    }
}
