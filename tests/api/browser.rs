//! The browser console in a real headless Chromium (tests/browser/console.mjs with
//! playwright-core): it loads from the gateway, subscribes, receives an event published from the
//! page, and its "ack" button moves the client's committed offset (checked here, through the
//! admin route); a termed event's "redrive" button in the dead-letter list delivers it again,
//! and acking it removes the dead letter. The screenshot's path is printed.

use std::process::Command;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_subscribes_receives_and_acks_in_a_real_browser() {
    let (dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let created = http().post(format!("{}/topics", gw.base)).json(&serde_json::json!({"name": "web", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let screenshot = std::env::temp_dir().join(format!("ackgate-console-{}.png", std::process::id()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console.mjs");
    let base = gw.base.clone();
    let shot = screenshot.clone();
    let output = tokio::task::spawn_blocking(move || Command::new("node").arg(script).arg(&base).arg(&shot).output().expect("node runs")).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "browser test failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("acked: ") && stdout.contains("redriven: "), "{stdout}");
    // Written to the process's stderr directly: the test harness captures println!/eprintln!.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "console screenshot: {}", screenshot.display());
    let png = std::fs::read(&screenshot).expect("the screenshot was written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    let row = stored_offset(&gw.base, "web", "browser-1", 0).await.expect("the console's client has an offset");
    assert_eq!(row["committed"], 2, "clicking ack, then term, moved the committed offset");
    assert_eq!(row["last_acked"], 1, "the termed event counts as settled");
    let (_, dead) = get_json(&format!("{}/admin/dead-letters?client_id=browser-1", gw.base)).await;
    assert_eq!(dead["dead_letters"], serde_json::json!([]), "acking the redriven event removed its dead letter");
    gw.stop().await;
    drop(dir);
}

/// Issue 62 item 5: the console as an operator's tool, in a real Chromium
/// (tests/browser/console_admin.mjs), against a gateway with `auth.admin_token` set. With no token
/// entered the banner at the top says one is needed and the admin tables say so; once saved, the
/// sessions table shows the page's session with its last ack time, the search by client id narrows
/// it and paging turns through two sessions; a dead letter's Redrive delivers only that one and its
/// Delete removes only that one; Disconnect ends a session (4002); Reset answers 409 while the
/// client is live and sets the offset once it is not. The three screenshots' paths are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_an_operators_tool_in_a_real_browser() {
    const ADMIN_TOKEN: &str = "console-test-admin-token-of-32-bytes!!";
    let (dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.admin_token = ADMIN_TOKEN.into();
    let gw = InProcess::start(config).await;
    let shots: Vec<std::path::PathBuf> = ["token-needed", "admin", "narrow"]
        .iter()
        .map(|name| std::env::temp_dir().join(format!("ackgate-console-{name}-{}.png", std::process::id())))
        .collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console_admin.mjs");
    let base = gw.base.clone();
    let args = shots.clone();
    let output = tokio::task::spawn_blocking(move || Command::new("node").arg(script).arg(&base).arg(ADMIN_TOKEN).args(&args).output().expect("node runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "browser test failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("console admin: ok"), "{stdout}");
    use std::io::Write as _;
    for shot in &shots {
        let _ = writeln!(std::io::stderr(), "console screenshot: {}", shot.display());
        let png = std::fs::read(shot).expect("the screenshot was written");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }

    let offsets = admin_get(&gw.base, "/admin/offsets?topic=ops&client_id=ops-1&partition=0", ADMIN_TOKEN).await;
    assert_eq!(offsets["offsets"][0]["committed"], 1, "the console's reset set the offset: {offsets}");
    let dead = admin_get(&gw.base, "/admin/dead-letters?topic=ops&client_id=ops-1", ADMIN_TOKEN).await;
    let left: Vec<u64> = dead["dead_letters"].as_array().unwrap().iter().map(|d| d["offset"].as_u64().unwrap()).collect();
    assert_eq!(left, [1], "offset 2 redriven (and acked), offset 3 deleted, offset 1 left alone: {dead}");
    let (status, _) = get_json(&format!("{}/admin/sessions", gw.base)).await;
    assert_eq!(status, 401, "the admin routes need the token");
    gw.stop().await;
    drop(dir);
}

/// `GET {base}{path}` with the admin token; asserts 200 and returns the JSON.
async fn admin_get(base: &str, path: &str, token: &str) -> serde_json::Value {
    let response = http().get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap();
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.unwrap()
}

/// Issue 24: the JS client on `transport: "sse"` in headless Chromium, on the browser's own
/// EventSource (tests/browser/sse.mjs): it receives and acks events, the console lists its
/// session as `sse`, and after the gateway is killed (SIGKILL) and started again at the same
/// address the page reconnects by itself with `resume=`, receives what was published next, and
/// nothing it acknowledged before comes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_client_over_sse_survives_a_gateway_restart_in_a_real_browser() {
    use std::io::BufRead as _;
    let (_dir, data) = temp_dir();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let gw = Process::start_at(&data, &listen, &[]);
    let created = http().post(format!("{}/topics", gw.base)).json(&serde_json::json!({"name": "web-sse", "partitions": 1})).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/sse.mjs");
    let mut node = Command::new("node")
        .arg(script)
        .arg(&gw.base)
        .env("ACKGATE_DEV_SSE_RESTART", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = node.stdout.take().unwrap();
    std::thread::spawn(move || std::io::BufReader::new(stdout).lines().map_while(Result::ok).for_each(|l| drop(lines_tx.send(l))));
    let mut seen = Vec::new();
    let mut gw = Some(gw);
    let mut restarted = None;
    while let Some(line) = tokio::time::timeout(std::time::Duration::from_secs(120), lines.recv()).await.expect("the browser test goes on") {
        if line == "ready for restart" {
            gw.take().unwrap().kill9();
            restarted = Some(Process::start_at(&data, &listen, &[]));
        }
        seen.push(line);
    }
    let output = tokio::task::spawn_blocking(move || node.wait_with_output().expect("node ends")).await.unwrap();
    let out = seen.join("\n");
    assert!(output.status.success(), "browser SSE test failed:\n{out}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(out.contains("(sse)") && out.contains("acked: 5 events") && out.contains("received after the restart: 5,6,7"), "{out}");
    let restarted = restarted.expect("the gateway was restarted");
    let row = stored_offset(&restarted.base, "web-sse", "browser-sse", 0).await.expect("the page's client has an offset");
    assert_eq!(row["committed"], 8, "every event acked, across the restart");
}

/// Issue 40, item 1, in a real browser (tests/browser/blind.mjs): a page on another origin
/// points an `<img>`, an `<iframe>`, a `<script>` and a no-cors `fetch` at
/// `/sse?client_id=alice&topics=orders&from=latest`. Before the fix Chromium sent them without
/// `Origin`, each opened a session as alice and her committed offset moved from 5 to 20 (15 unread
/// events skipped). Now each is refused (403) before a session exists, even though the page's
/// origin is allowed, while the same page's own EventSource and WebSocket are welcomed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_cannot_move_offsets_with_requests_it_makes_blind_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let app_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut config = test_config(&data);
    config.server.allowed_origins = vec![format!("http://localhost:{app_port}")];
    let gw = InProcess::start(config).await;
    publish_numbered(&gw.base, "orders", 1, 0, 20).await;
    let mut alice = TestClient::connect(gw.addr(), "alice").await;
    alice.subscribe("orders", serde_json::json!({})).await;
    let events = alice.recv_events(5).await;
    alice.ack_confirmed(&ids(&events), "a").await;
    alice.close().await;

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/blind.mjs");
    let base = gw.base.clone();
    let output =
        tokio::task::spawn_blocking(move || Command::new("node").args([script, &base, &app_port.to_string(), "alice", "orders"]).output().expect("node runs"))
            .await
            .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "browser test failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for kind in ["image", "document", "script", "fetch"] {
        // Chromium keeps the 403's JSON from an <img> or a <script> (Opaque Response Blocking):
        // then it reports that block, which comes only after the answer.
        let seen = stdout.lines().find_map(|l| l.strip_prefix(&format!("blind {kind}: "))).unwrap_or("missing");
        assert!(seen == "403" || seen == "net::ERR_BLOCKED_BY_ORB", "blind {kind} answered {seen}:\n{stdout}");
    }
    assert!(stdout.contains("eventsource: welcome") && stdout.contains("websocket: welcome"), "the page's own clients:\n{stdout}");
    assert!(!stdout.contains("problem:"), "{stdout}");
    assert_eq!(stored_offset(&gw.base, "orders", "alice", 0).await.unwrap()["committed"], 5, "the page skipped alice's backlog:\n{stdout}");
    gw.stop().await;
}
