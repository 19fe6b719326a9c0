//! Power loss (issue 43): the real binary on a file system that forgets, when the power is cut,
//! every write no fsync covered (tests/powerloss/powerloss_fs.py, FUSE, as LazyFS does). With the
//! default `storage.durability = "power"`, every publish answered 200 and every offset an `ack_ok`
//! reported is there after the power comes back; with `"crash"` they are not, which shows the
//! harness can fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

/// A mount of `tests/powerloss/powerloss_fs.py`: files live in `backing`, writes reach it only
/// when fsynced.
struct PowerLossMount {
    backing: PathBuf,
    mountpoint: PathBuf,
    fs: Option<Child>,
}

impl PowerLossMount {
    fn mount(backing: &Path, mountpoint: &Path) -> Self {
        std::fs::create_dir_all(backing).unwrap();
        std::fs::create_dir_all(mountpoint).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/powerloss/powerloss_fs.py");
        // Debian's python3, which holds Debian's fusepy (scripts/prereqs), whatever `python3` the
        // PATH names first.
        let fs =
            Command::new("/usr/bin/python3").arg(script).arg(backing).arg(mountpoint).stdout(Stdio::null()).spawn().expect("the power-loss file system starts");
        let mount = Self { backing: backing.to_path_buf(), mountpoint: mountpoint.to_path_buf(), fs: Some(fs) };
        let started = Instant::now();
        while !mount.is_mounted() {
            assert!(started.elapsed() < Duration::from_secs(20), "{} was not mounted (are `fuse` and `python3-fusepy` installed?)", mountpoint.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        mount
    }

    fn is_mounted(&self) -> bool {
        let wanted = self.mountpoint.display().to_string();
        std::fs::read_to_string("/proc/self/mounts").unwrap().lines().any(|line| line.split(' ').nth(1) == Some(wanted.as_str()))
    }

    /// The power goes: the file system dies with every write no fsync covered, and the mount goes
    /// with it. Returns the backing directory, to be mounted again.
    fn cut_power(mut self) -> PathBuf {
        self.unmount();
        self.backing.clone()
    }

    fn unmount(&mut self) {
        if let Some(mut fs) = self.fs.take() {
            let _ = fs.kill();
            let _ = fs.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

impl Drop for PowerLossMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// The log end of partition 0 of `topic` (`GET /topics`), 0 when the topic is unknown.
async fn log_end(base: &str, topic: &str) -> u64 {
    let (status, body) = get_json(&format!("{base}/topics")).await;
    assert_eq!(status, 200, "{body}");
    let listed = body["topics"].as_array().unwrap().iter().find(|t| t["name"] == topic);
    listed.map_or(0, |t| t["partitions"][0]["log_end"].as_u64().unwrap_or_else(|| panic!("{body}")))
}

/// Publishes 20 numbered events to a new one-partition topic `p` in four requests, then client
/// `c` takes twelve and acks the first eight with a receipt.
async fn publish_and_ack(base: &str, addr: std::net::SocketAddr) {
    let created = http().post(format!("{base}/topics")).json(&json!({"name": "p", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    for first in (0..20).step_by(5) {
        let events: Vec<Value> = (first..first + 5).map(|n| json!({"payload": {"n": n}})).collect();
        publish(base, "p", json!({"events": events})).await;
    }
    let mut client = TestClient::connect(addr, "c").await;
    client.subscribe("p", json!({})).await;
    let events = client.recv_events(12).await;
    let ack = client.ack_confirmed(&ids(&events[..8]), "eight").await;
    assert_eq!(ack["committed"], json!({"p": {"0": 8}}), "{ack}");
    client.close().await;
}

/// A gateway with `env` on a fresh power-loss mount: twenty events published and eight acked
/// (`publish_and_ack`), SIGKILL, the power cut; then the mount again and the gateway started
/// again on it. The temp dir and the mount must outlive the gateway.
async fn restarted_after_a_power_cut(env: &[(&str, &str)]) -> (tempfile::TempDir, PowerLossMount, Process) {
    let dir = tempfile::tempdir().unwrap();
    let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mnt"));
    let fs = PowerLossMount::mount(&backing, &mountpoint);
    let data = mountpoint.join("data");
    let gw = Process::start(&data, env);
    publish_and_ack(&gw.base, gw.addr).await;
    gw.kill9();
    let backing = fs.cut_power();
    let fs = PowerLossMount::mount(&backing, &mountpoint);
    let gw = Process::start(&data, env);
    (dir, fs, gw)
}

/// Issue 43, item 4: a power loss right after the answers. Everything answered is there: the
/// twenty events (answered 200) and the offset the `ack_ok` reported; the client resumes at 8
/// and gets the rest, each event as it was published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_answered_survives_a_power_loss_by_default() {
    let (_dir, _fs, gw) = restarted_after_a_power_cut(&[]).await;
    assert_eq!(log_end(&gw.base, "p").await, 20, "every event answered 200 is there");
    assert_eq!(stored_offset(&gw.base, "p", "c", 0).await.map(|row| row["committed"].clone()), Some(json!(8)), "the offset ack_ok reported is there");
    let mut client = TestClient::connect(gw.addr, "c").await;
    assert_eq!(client.subscribe("p", json!({})).await["partitions"][0]["from"], 8);
    let events = client.recv_events(12).await;
    let got: Vec<(u64, u64)> = events.iter().map(|e| (e["offset"].as_u64().unwrap(), e["payload"]["n"].as_u64().unwrap())).collect();
    assert_eq!(got, (8..20).map(|n| (n, n)).collect::<Vec<_>>());
    gw.kill9();
}

/// The harness itself: with `storage.durability = "crash"` (no fsync), the same power loss takes
/// what was answered, as it would on a real machine. If this passed with everything intact, the
/// test above would prove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fsync_a_power_loss_takes_what_was_answered() {
    let (_dir, _fs, gw) = restarted_after_a_power_cut(&[("ACKGATE_STORAGE__DURABILITY", "crash")]).await;
    let (events, committed) = (log_end(&gw.base, "p").await, stored_offset(&gw.base, "p", "c", 0).await);
    assert!(events < 20 && committed.is_none(), "nothing was fsynced, yet {events} events and the offset {committed:?} survived");
    gw.kill9();
}
