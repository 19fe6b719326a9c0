//! The fault suite in README's test command (issue 43): `loadtest chaos` for two minutes with a
//! fixed seed against the embedded log (every fault it has: kill, pause, restart, power loss, a
//! full disk, clock jumps), and its history checker's verdict. docs/reliability.md has the long
//! runs; the checker's own unit tests (loadtest/src/history.rs) show it finds each anomaly class.

use std::process::Command;

use serde_json::Value;

#[test]
fn two_minutes_of_faults_on_the_embedded_log_lose_nothing_and_never_move_a_committed_offset_back() {
    let exe = std::env::current_exe().unwrap();
    let loadtest = exe.parent().and_then(|deps| deps.parent()).unwrap().join("loadtest");
    let output = Command::new(&loadtest).args(["chaos", "--minutes", "2", "--seed", "1", "--json"]).output().expect("loadtest chaos runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
    assert!(output.status.success(), "chaos found anomalies or failed: {report:#}\n{stderr}");
    let checked = &report["report"];
    for class in [
        "lost_prefix",
        "lost_middle",
        "lost_suffix",
        "unexpected",
        "non_monotonic",
        "skips",
        "committed_went_back",
        "divergence",
        "tokens_refused",
        "duplicates_over_bound",
        "closed_with_valid_token",
        "time_replay_skips",
        "time_replay_too_early",
    ] {
        assert_eq!(checked[class], 0, "{class}: {report:#}");
    }
    assert!(checked["published"].as_u64().unwrap() > 1000, "the workload published: {report:#}");
    assert!(checked["time_replays"].as_u64().unwrap() >= 10, "the workload replayed by time: {report:#}");
    assert!(checked["first_deliveries"].as_u64() >= checked["published"].as_u64(), "every client received: {report:#}");
    for fault in ["kill", "pause", "restart", "power", "disk-full", "clock"] {
        assert!(report["faults"]["injected"][fault].as_u64().unwrap_or(0) >= 1, "fault {fault} never injected: {report:#}");
    }
}
