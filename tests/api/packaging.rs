//! What an operator installs (issue 45, item 7): the systemd unit passes `systemd-analyze verify`
//! and gives a drain the time it takes, the Dockerfile passes hadolint (no container engine runs
//! here to build it), and a binary that meets a data dir of a newer format refuses to start with
//! a message that says so (a rollback after an upgrade).

use std::path::PathBuf;
use std::process::Command;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn the_systemd_unit_verifies_and_waits_out_a_drain() {
    let unit = std::fs::read_to_string(repo_file("deploy/systemd/ackgate.service")).unwrap();
    // `verify` checks that the command exists: the unit as shipped, with this build's binary.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ackgate.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/ackgate", env!("CARGO_BIN_EXE_ackgate"))).unwrap();
    let verified = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze runs");
    let said = String::from_utf8_lossy(&verified.stderr).into_owned() + &String::from_utf8_lossy(&verified.stdout);
    assert!(verified.status.success() && !said.contains("ackgate.service:"), "{said}");

    let stop_secs: u64 = unit.lines().find_map(|l| l.strip_prefix("TimeoutStopSec=")).expect("TimeoutStopSec").parse().unwrap();
    let server = ackgate::config::Config::default().server;
    let drain_ms = server.drain_ms + server.drain_settle_ms + server.shutdown_grace_ms;
    assert!(stop_secs * 1000 > drain_ms, "TimeoutStopSec={stop_secs} cuts a drain of {drain_ms} ms short");
    for line in ["LimitNOFILE=", "KillSignal=SIGTERM", "NoNewPrivileges=yes", "ProtectSystem=strict", "StateDirectory=ackgate"] {
        assert!(unit.contains(line), "{line} missing");
    }
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let hadolint = Command::new(repo_file("scripts/hadolint")).arg("path").output().unwrap();
    let hadolint = String::from_utf8(hadolint.stdout).unwrap().trim().to_string();
    assert!(std::path::Path::new(&hadolint).exists(), "{hadolint} missing: run scripts/hadolint install (scripts/test does)");
    let linted = Command::new(&hadolint).arg("--no-color").arg(repo_file("Dockerfile")).output().unwrap();
    assert!(linted.status.success(), "{}", String::from_utf8_lossy(&linted.stdout));
    let dockerfile = std::fs::read_to_string(repo_file("Dockerfile")).unwrap();
    for line in ["USER ackgate", "HEALTHCHECK", "/healthz", "STOPSIGNAL SIGTERM", "cargo build --release --locked"] {
        assert!(dockerfile.contains(line), "{line} missing");
    }
}

/// A rollback: the data dir says a format this binary does not read. It refuses to start, says
/// why, names the file, and leaves the data dir as it was.
#[test]
fn a_data_dir_of_a_newer_format_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("FORMAT"), "ackgate data 99\n").unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:0\"\n", data.display().to_string())).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "started on a newer data dir: {said}");
    assert!(said.contains("data format 99") && said.contains("FORMAT"), "{said}");
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 1, "nothing was written beside FORMAT");
    assert_eq!(std::fs::read_to_string(data.join("FORMAT")).unwrap(), "ackgate data 99\n");
}
