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
