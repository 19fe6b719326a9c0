//! Power loss (issue 43): the real binary on a file system that forgets, when the power is cut,
//! every write no fsync covered (tests/powerloss/powerloss_fs.py, FUSE, as LazyFS does). With the
//! default `storage.durability = "power"`, every publish answered 200 and every offset an `ack_ok`
//! reported is there after the power comes back; with `"crash"` they are not, which shows the
//! harness can fail. The same file system fills up on command: a full disk stops the gateway
//! for its supervisor to start it again, with nothing answered lost.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::support::*;

// The mount of loadtest chaos (which uses all of it).
#[path = "../../loadtest/src/powerloss.rs"]
#[allow(dead_code)]
mod powerloss;
use powerloss::PowerLossMount;

fn mount(backing: &Path, mountpoint: &Path) -> PowerLossMount {
    mount_with(backing, mountpoint, None)
}

/// `mount`, full while `full_flag` exists.
fn mount_with(backing: &Path, mountpoint: &Path, full_flag: Option<&Path>) -> PowerLossMount {
    let script = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/powerloss/powerloss_fs.py"));
    PowerLossMount::mount(script, backing, mountpoint, full_flag).expect("the power-loss file system mounts")
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
    let mut fs = mount(&backing, &mountpoint);
    let data = mountpoint.join("data");
    let gw = Process::start(&data, env);
    publish_and_ack(&gw.base, gw.addr).await;
    gw.kill9();
    fs.cut_power();
    fs.power_on().expect("the power-loss file system mounts again");
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

/// The harness (issue 60, item 4): directory entries are volatile until their directory is
/// fsynced, as on ext4 without `dirsync`. A new file fsynced in a directory that was not, a new
/// directory whose parent was not, a rename and a removal not synced are all undone by a power
/// cut; synced, they stay. Before, every entry reached "disk" at once, and the gateway's data dir
/// (made by `create_dir_all`, its parent never fsynced) vanished with all it held on this file
/// system: `what_was_answered_survives_a_power_loss_by_default` found 0 events of 20.
#[test]
fn the_power_loss_file_system_forgets_directory_entries_no_fsyncdir_covered() {
    use std::io::Write as _;
    fn write_synced(path: &Path, bytes: &[u8]) {
        let mut file = std::fs::File::create(path).unwrap();
        file.write_all(bytes).unwrap();
        file.sync_all().unwrap();
    }
    let sync_dir = |dir: &Path| std::fs::File::open(dir).unwrap().sync_all().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (backing, m) = (dir.path().join("backing"), dir.path().join("mnt"));
    let mut fs = mount(&backing, &m);
    std::fs::create_dir(m.join("kept")).unwrap();
    write_synced(&m.join("kept/file"), b"kept");
    write_synced(&m.join("replaced"), b"old");
    write_synced(&m.join("removed"), b"removed");
    sync_dir(&m.join("kept"));
    sync_dir(&m);
    std::fs::create_dir(m.join("new_dir")).unwrap();
    write_synced(&m.join("new_dir/file"), b"in a new directory");
    sync_dir(&m.join("new_dir")); // the directory's own entry in the root is not synced
    write_synced(&m.join("new_file"), b"fsynced, its entry not");
    write_synced(&m.join("replaced.tmp"), b"new");
    std::fs::rename(m.join("replaced.tmp"), m.join("replaced")).unwrap();
    std::fs::remove_file(m.join("removed")).unwrap();
    write_synced(&m.join("kept/synced"), b"synced");
    sync_dir(&m.join("kept"));
    fs.cut_power();
    fs.power_on().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&m).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["kept", "removed", "replaced"], "only entries whose directory was fsynced are there");
    assert_eq!(std::fs::read(m.join("replaced")).unwrap(), b"old", "the unsynced rename over it is undone");
    assert_eq!(std::fs::read(m.join("removed")).unwrap(), b"removed", "the unsynced removal is undone");
    assert_eq!(std::fs::read(m.join("kept/synced")).unwrap(), b"synced", "a file in a synced directory stays");
    // Synced, the same operations stay.
    std::fs::rename(m.join("replaced"), m.join("renamed")).unwrap();
    std::fs::remove_file(m.join("removed")).unwrap();
    sync_dir(&m);
    fs.cut_power();
    fs.power_on().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&m).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["kept", "renamed"]);
    assert_eq!(std::fs::read(m.join("renamed")).unwrap(), b"old");
}

/// Issue 43, a full disk (found by `loadtest chaos`): RocksDB takes no more writes once one
/// failed with ENOSPC, until the database is opened again. The gateway used to go on serving,
/// ready, with every publish answered 503 and every ack failing long after the disk had room
/// again. Now it stops with an error (exit 1) for its supervisor (systemd's `Restart=on-failure`)
/// to start it again, and started again it takes writes, with everything answered before there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_gateway_for_its_supervisor_and_nothing_answered_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (backing, mountpoint, flag) = (dir.path().join("backing"), dir.path().join("mnt"), dir.path().join("full"));
    let fs = mount_with(&backing, &mountpoint, Some(&flag));
    let data = mountpoint.join("data");
    let gw = Process::start(&data, &[]);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "d", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let events: Vec<Value> = (0..5).map(|n| json!({"payload": {"n": n}})).collect();
    publish(&gw.base, "d", json!({"events": events})).await;
    fs.set_full(true).unwrap();
    let refused = http().post(format!("{}/topics/d/events", gw.base)).json(&json!({"payload": {"n": 5}})).send().await.unwrap();
    assert_eq!(refused.status(), 503, "a publish on a full disk: {}", refused.text().await.unwrap());
    let logs = gw.logs.clone();
    let exited = tokio::task::spawn_blocking(move || gw.wait_exit(std::time::Duration::from_secs(30))).await.unwrap();
    let logs = logs.lock().unwrap().join("\n");
    assert!(exited.is_some_and(|status| status.code() == Some(1)), "the gateway went on after its data dir stopped taking writes ({exited:?}):\n{logs}");
    assert!(logs.contains("takes no more writes"), "{logs}");
    fs.set_full(false).unwrap();
    let gw = Process::start(&data, &[]);
    publish(&gw.base, "d", json!({"payload": {"n": 5}})).await;
    assert_eq!(log_end(&gw.base, "d").await, 6, "the five events answered before are there, and the sixth after");
    gw.kill9();
}

/// Issue 41, the reconnect storm: a returning client's subscribe refreshes its stored offsets'
/// times (so that a retention sweep does not take them), and that refresh used to fsync on its
/// own, one subscribe after another under the offset store's write lock. It now shares the
/// offset writer's fsyncs. Counted on the power-loss file system; the refreshed times are still
/// there after a power cut right after the last `subscribed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_returning_clients_shares_fsyncs_and_their_refreshed_times_survive_a_power_loss() {
    const CLIENTS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mnt"));
    let mut fs = mount(&backing, &mountpoint);
    let data = mountpoint.join("data");
    let gw = Process::start(&data, &[]);
    let created = http().post(format!("{}/topics", gw.base)).json(&json!({"name": "s", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    publish(&gw.base, "s", json!({"events": [{"payload": 1}]})).await;
    for i in 0..CLIENTS {
        let mut client = TestClient::connect(gw.addr, &format!("c{i}")).await;
        client.subscribe("s", json!({})).await;
        let events = client.recv_events(1).await;
        client.ack_confirmed(&ids(&events), "one").await;
        client.close().await;
    }
    wait_for("every session to end", async || get_json(&format!("{}/admin/sessions", gw.base)).await.1["sessions"] == json!([])).await;
    let left_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let before = fs.fsyncs("/data/offsets/");

    // Every client connected first, then every subscribe sent before any answer is read: they
    // reach the gateway together, as a storm's do.
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        clients.push(TestClient::connect(gw.addr, &format!("c{i}")).await);
    }
    for client in &mut clients {
        client.send(json!({"op": "subscribe", "topic": "s"})).await;
    }
    for client in &mut clients {
        let answer = client.recv().await;
        assert_eq!(answer["partitions"][0]["from"], 1, "{answer}");
    }
    let fsyncs = fs.fsyncs("/data/offsets/") - before;
    assert!(before > 0, "the file system logs fsyncs: the acks' fsyncs are there");
    // One each before (exactly CLIENTS: serialized by the store's write lock); 15-19 in five runs
    // of the shared ones here, where a FUSE fsync also holds up the WAL's writes meanwhile.
    assert!(fsyncs > 0, "the refreshes were made durable by some fsync");
    assert!(fsyncs < CLIENTS, "{CLIENTS} subscribes at once made {fsyncs} fsyncs of the offset store: one each");

    gw.kill9();
    drop(clients);
    fs.cut_power();
    fs.power_on().expect("the power-loss file system mounts again");
    let gw = Process::start(&data, &[]);
    for i in 0..CLIENTS {
        let row = stored_offset(&gw.base, "s", &format!("c{i}"), 0).await.expect("the record is there");
        assert_eq!(row["committed"], 1, "{row}");
        assert!(row["updated_at"].as_u64().unwrap() > left_at, "c{i}'s refresh at its subscribe was lost: {row}");
    }
    gw.kill9();
}
