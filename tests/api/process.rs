//! The binary as an operator runs it: bad configuration, graceful shutdown on SIGTERM.

use std::process::Command;

use serde_json::json;

use crate::support::*;

#[test]
fn a_bad_config_stops_the_start_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[delivery]\nack_timeout = 5\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&config).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ack_timeout"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(dir.path().join("missing.toml")).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "an explicit config path must exist");
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&empty).env("ACKGATE_DELIVERY__RESET_POLICY", "sideways").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("reset_policy") && stderr.contains("sideways") && stderr.contains("earliest"), "environment overrides are validated too: {stderr}");
}

/// Issue 62, item 7: `ackgate check` says whether a config would start, without starting or
/// writing anything; an unknown key's error names the file and its own line (it named line 3 of
/// the re-written merged text for line 8 before), and an override's error says it came from the
/// environment.
#[test]
fn check_validates_a_config_without_starting_and_names_the_files_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = |config: &std::path::Path, env: &[(&str, &str)]| {
        let output = Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(config).arg("check").envs(env.iter().copied()).output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let good = dir.path().join("good.toml");
    std::fs::write(&good, format!("[storage]\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:1\"\n", data.display().to_string())).unwrap();
    let (code, out, err) = run(&good, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("is valid") && out.contains("127.0.0.1:1"), "{out}");
    assert!(!data.exists(), "check writes nothing, not even the data dir");

    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "# the gateway's settings\n\n[server]\nlisten = \"127.0.0.1:1\"\n\n[delivery]\nack_timeout_ms = 100\nmax_atempts = 3\n").unwrap();
    for args in [&["check"][..], &[][..]] {
        let output = Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&typo).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{err}");
        assert!(err.contains("typo.toml") && err.contains("line 8") && err.contains("max_atempts"), "the file's own line, {args:?}: {err}");
    }
    let (code, _, err) = run(&good, &[("ACKGATE_DELIVERY__ACK_TIMEOUT_MS", "soon")]);
    assert_eq!(code, Some(2));
    assert!(err.contains("ACKGATE_* environment override") && err.contains("soon"), "{err}");

    let tls = dir.path().join("tls.toml");
    std::fs::write(&tls, "[server]\nlisten = \"127.0.0.1:1\"\ntls_cert = \"/nonexistent/cert.pem\"\ntls_key = \"/nonexistent/key.pem\"\n").unwrap();
    let (code, _, err) = run(&tls, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("server.tls_cert") && err.contains("/nonexistent/cert.pem"), "{err}");

    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("FORMAT"), "ackgate data 9\n").unwrap();
    let (code, _, err) = run(&good, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("data format 9"), "{err}");

    let level = dir.path().join("level.toml");
    std::fs::write(&level, "[server]\nlisten = \"127.0.0.1:1\"\nlog_level = \"info,[[\"\n").unwrap();
    let (code, _, err) = run(&level, &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("server.log_level"), "{err}");
}

/// SIGTERM drains (issue 25): the session gets a `reconnect` frame and close 1012, then the
/// process checkpoints, flushes and exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_sessions_with_1012_and_checkpoints() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_OFFSETS__CHECKPOINT_INTERVAL_MS", "3600000")]);
    publish_numbered(&gw.base, "t", 1, 0, 3).await;
    let mut client = TestClient::connect(gw.addr, "c").await;
    client.subscribe("t", json!({})).await;
    for _ in 0..3 {
        let event = client.recv_type("event").await;
        client.send(json!({"op": "ack", "delivery_id": event["delivery_id"]})).await;
    }
    // An ack with a receipt proves the earlier acks were processed (frames are handled in order).
    client.send(json!({"op": "ping", "req": 1})).await;
    client.recv_type("pong").await;
    let logs = gw.logs.clone();
    let closing = tokio::spawn(async move {
        let reconnect = client.recv_type("reconnect").await;
        (reconnect, client.close_code().await)
    });
    let status = tokio::task::spawn_blocking(move || gw.terminate()).await.unwrap();
    let (reconnect, code) = closing.await.unwrap();
    assert_eq!(code, 1012, "draining, not final");
    assert!(reconnect["after_ms"].as_u64().is_some_and(|ms| ms <= 1000), "{reconnect}");
    assert!(status.success(), "{status:?}");
    let logs = logs.lock().unwrap().join("\n");
    assert!(logs.contains("session ended") && logs.contains("ackgate stopped"), "{logs}");
    assert!(logs.contains("draining"), "{logs}");
    assert!(logs.contains("broker_acks=3"), "every ack fired the deferred broker ACK: {logs}");
    // The checkpoint period is an hour: the file can only come from the shutdown.
    let checkpoint = std::fs::read_to_string(data.join("pull-offsets.properties")).unwrap();
    assert!(checkpoint.contains("t#0=3"), "{checkpoint}");
    // And the acks are durable: a new process reports them.
    let gw = Process::start(&data, &[]);
    assert_eq!(stored_offset(&gw.base, "t", "c", 0).await.unwrap()["committed"], 3);
}

/// With `server.drain_ms = 0`, SIGTERM closes every session at once with 1001.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_a_drain_window_closes_sessions_with_1001() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_SERVER__DRAIN_MS", "0")]);
    let mut client = TestClient::connect(gw.addr, "c").await;
    let closing = tokio::spawn(async move { client.close_code().await });
    let status = tokio::task::spawn_blocking(move || gw.terminate()).await.unwrap();
    assert_eq!(closing.await.unwrap(), 1001);
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[("ACKGATE_SERVER__LOG_FORMAT", "json")]);
    let client = TestClient::connect(gw.addr, "json-logs").await;
    client.close().await;
    publish(&gw.base, "logged", json!({"payload": 1})).await;
    let reset = http().put(format!("{}/admin/offsets/logged/nobody/0", gw.base)).json(&json!({"time": 1})).send().await.unwrap();
    assert_eq!(reset.status(), 200, "{:?}", reset.text().await);
    let logs = gw.logs.clone();
    let status = gw.terminate();
    assert!(status.success(), "{status:?}; logs:\n{}", logs.lock().unwrap().join("\n"));
    let lines = logs.lock().unwrap().clone();
    assert!(lines.len() >= 4, "{lines:?}");
    for line in &lines {
        let parsed: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(parsed["fields"]["message"].is_string(), "{line}");
    }
    assert!(lines.iter().any(|l| l.contains("session ended") && l.contains("json-logs")));
    // Issue 62, item 7: fields carry values, not Rust's `Some(...)`.
    let started = lines.iter().find(|l| l.contains("session started")).expect("a session started line");
    let started: serde_json::Value = serde_json::from_str(started).unwrap();
    assert!(started["fields"]["remote"].as_str().is_some_and(|r| r.starts_with("127.0.0.1:")), "{started}");
    let reset = lines.iter().find(|l| l.contains("offset reset by an operator")).expect("a reset line");
    assert!(reset.contains(r#""by_time":1"#), "{reset}");
    for line in &lines {
        assert!(!line.contains("Some("), "{line}");
    }
}

/// A SIGTERM while the gateway starts (here: waiting on a Kafka broker that takes connections
/// and never answers) stops it at once with exit 0. The handler used to be installed only when
/// the running gateway first polled it: a SIGTERM before that killed the process with the
/// signal's default action (CI saw one land right after the listening line:
/// `json_logs_are_one_object_per_line` failed on the exit status).
#[test]
fn a_sigterm_while_starting_stops_it_at_once_and_cleanly() {
    use std::io::{BufRead, BufReader};
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (_dir, data) = temp_dir();
    let config = data.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[storage]\ndata_dir = {:?}\nbackend = \"kafka\"\n[kafka]\nbootstrap_servers = \"{}\"\n",
            data.display().to_string(),
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_ackgate")).arg("--config").arg(&config).env("RUST_LOG", "info").stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        seen.push(line);
        if seen.last().unwrap().contains("ackgate starting") {
            break;
        }
    }
    assert!(seen.last().is_some_and(|l| l.contains("ackgate starting")), "{seen:?}");
    let term = Command::new("sh").arg("-c").arg(format!("kill -TERM {}", child.id())).status().unwrap();
    assert!(term.success());
    // The rest of stderr ends when the process does.
    seen.extend(lines);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {seen:#?}");
    assert!(seen.iter().any(|l| l.contains("stopped while starting")), "{seen:#?}");
}
