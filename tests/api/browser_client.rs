//! The JavaScript client (issue 42) in a real headless Chromium: each test starts a gateway and
//! runs one script of tests/browser/ against it (playwright-core; the scripts serve this
//! checkout's clients/js/ackgate.js to the page as /static/ackgate.js), then checks the result
//! lines it prints. A script exits non-zero, with the page's log, on any failure.
//! - refresh.mjs: a token that expires mid-stream is refreshed in band (auth.jwt_secret,
//!   auth.refresh_before_secs): the same session delivers past the first token's exp.
//! - basics.mjs: events that arrive before `events()` is iterated wait for it; `from: {last: 3}`;
//!   a publish from the page over its session, written once.
//! - tabs.mjs: two tabs with one client id share one session; the leader tab closes and the
//!   other takes over with its resume token, nothing lost.
//! - blackhole.mjs: a connection that stops carrying bytes is noticed (request timeout, heartbeat)
//!   and replaced.
//! - react.mjs: ackgate-client/react through the React example, under StrictMode: a counter and
//!   a list on one topic share one subscription, render the events and ack each after render;
//!   paused, the last one unsubscribes; resumed, what came meanwhile comes, past the limit only
//!   the newest are kept and the dropped ones are acked too (React and esbuild from
//!   clients/js/node_modules: `npm ci` there).
//! - bfcache.mjs: with Chromium's back/forward cache on (Playwright turns it off by default), a
//!   page whose client is connected and subscribed is cached when it navigates away (no session,
//!   no Web Lock held meanwhile) and, restored by going back, reconnects and gets what was
//!   published while it was away.
//! - docs_react.mjs: docs/clients.md's "A React app" block, read from the guide and bundled as
//!   written (only the gateway's address changes): Status shows the state, Orders lists at most
//!   its limit and every event is acked, a takeover shows `failed: taken_over`.

use std::process::Command;

use crate::support::*;

/// Runs `node tests/browser/<script> args...`; panics with its output unless it succeeds, else
/// returns its stdout.
async fn run_script(script: &str, args: Vec<String>) -> String {
    let path = format!("{}/tests/browser/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::task::spawn_blocking(move || Command::new("node").arg(&path).args(&args).output().expect("node runs")).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{script} failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

const JWT_SECRET: &str = "browser-client-test-secret-of-32-bytes";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_expires_mid_stream_is_refreshed_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.jwt_secret = JWT_SECRET.into();
    // The page's first token lives 4 s: `refresh_needed` comes 2 s before its exp.
    config.auth.refresh_before_secs = 2;
    let gw = InProcess::start(config).await;
    let out = run_script("refresh.mjs", vec![gw.base.clone(), JWT_SECRET.to_string()]).await;
    assert!(out.contains("refreshed: session ") && out.contains("went on past its first token's exp, 6 of 6 events received and acked"), "{out}");
    gw.stop().await;
}

/// Issue 61 item 4: refused credentials are a final `failed` state with the code in a real
/// browser, on a WebSocket and on Server-Sent Events, and nothing is tried again (the page saw
/// "unavailable: WebSocket connection ... failed" and reconnected forever before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_fail_for_good_with_their_code_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.auth.jwt_secret = JWT_SECRET.into();
    let gw = InProcess::start(config).await;
    let out = run_script("refused.mjs", vec![gw.base.clone(), JWT_SECRET.to_string()]).await;
    for case in ["websocket unauthorized", "websocket forbidden", "sse unauthorized"] {
        assert!(out.contains(&format!("refused: {case}, failed with close 1008, one connection, no retry")), "{case}: {out}");
    }
    gw.stop().await;
}

/// Issue 61 items 1, 2, 3 and 7 in a real browser, on the minified client: a subscribe before
/// connect() to a topic that does not exist yet, autoAck acking and a throwing handler's event
/// coming again, `stalled` on a full window (3 events here), and offline / online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_minutes_of_a_page_work_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let mut config = test_config(&data);
    config.delivery.max_in_flight = 3;
    let gw = InProcess::start(config).await;
    let out = run_script("lifecycle.mjs", vec![gw.base.clone()]).await;
    assert!(out.contains("the throwing handler's 1 came again as attempt 2 and was acked (committed 3)"), "{out}");
    assert!(out.contains("filled the window of 3 and stalled was emitted once"), "{out}");
    assert!(out.contains("online reconnected at once: 2 events published meanwhile arrived"), "{out}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_events_from_last_and_publish_work_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let out = run_script("basics.mjs", vec![gw.base.clone()]).await;
    assert!(out.contains("early: 5 events before the loop, attempts 1,1,1,1,1"), "{out}");
    assert!(out.contains("last: from 7, offsets 7,8,9"), "{out}");
    assert!(out.contains("published: offsets 0,1,2,3, written once (log_end 4), received and acked"), "{out}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tabs_of_one_client_id_share_a_session_and_hand_it_over_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let out = run_script("tabs.mjs", vec![gw.base.clone()]).await;
    assert!(out.contains("shared: one session ") && out.contains("for two tabs, each got its own 5 events, both tabs' acks landed"), "{out}");
    assert!(out.contains("handover: tab 2 leads session ") && out.contains(" 0..9, none lost, none acked before it again"), "{out}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_connection_is_noticed_and_replaced_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let out = run_script("blackhole.mjs", vec![gw.base.clone()]).await;
    assert!(
        out.contains("black hole: a ping rejected with timeout") && out.contains("the connection abandoned (1006)") && out.contains("at offset 2"),
        "{out}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_react_example_acks_what_it_rendered_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let out = run_script("react.mjs", vec![gw.base.clone()]).await;
    assert!(out.contains("react: 5 events rendered by both components and acked after render (committed 5), one subscription for both"), "{out}");
    assert!(
        out.contains("react: paused (one unsubscribe), resumed under StrictMode (one subscribe): limit 10 of 25 events, the list kept 15..24, the dropped acked too (committed 25)"),
        "{out}"
    );
    gw.stop().await;
}

/// docs/clients.md's walk-through, "A minimal browser app", its steps as written: the minimal app
/// on its own origin (step 3's `python3 -m http.server`, listed in `server.allowed_origins` as
/// step 1 says) imports the client from the gateway, lists the event step 4's curl publishes and
/// acks it. Step 1 is read here: the gateway gets the origins of its
/// `ACKGATE_SERVER__ALLOWED_ORIGINS`, the app's port 9000 made the one reserved for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_app_on_its_own_origin_receives_and_acks_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let app_port = free_port();
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/clients.md")).unwrap();
    let origins = guide
        .lines()
        .find_map(|line| line.trim().strip_prefix("ACKGATE_SERVER__ALLOWED_ORIGINS='"))
        .and_then(|rest| rest.split('\'').next())
        .expect("step 1 of \"A minimal browser app\" sets ACKGATE_SERVER__ALLOWED_ORIGINS");
    let mut config = test_config(&data);
    config.server.allowed_origins = serde_json::from_str(&origins.replace("9000", &app_port.to_string())).expect("step 1's origins are a JSON list");
    let gw = InProcess::start(config).await;
    let out = run_script("own_origin.mjs", vec![gw.base.clone(), app_port.to_string()]).await;
    assert!(out.contains("own origin: the guide's steps: a page of http://localhost:") && out.contains("and acked it (committed 0 -> 1)"), "{out}");
    gw.stop().await;
}

/// docs/clients.md's "A React app" runs as written (issue 61): the block, read from the guide, is
/// bundled with React and runs against a fresh gateway, whose topic its subscribe makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_react_app_runs_as_written_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let out = run_script("docs_react.mjs", vec![gw.base.clone()]).await;
    assert!(
        out.contains("docs react: the guide's app listed 50 of 60 events (limit 50) and acked all of them (committed 60 of 60); Status showed connected, then failed: taken_over"),
        "{out}"
    );
    gw.stop().await;
}

/// Issue 61 item 7 in a real browser: the back/forward cache. The page (its own origin, listed in
/// `server.allowed_origins`) is cached when it navigates away: its client closed the connection
/// and released its Web Lock at `pagehide`. Going back restores it (`pageshow` persisted, no new
/// load), and its client reconnects and gets the events published meanwhile, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_in_the_back_forward_cache_lets_its_session_go_and_resumes_when_restored_in_a_real_browser() {
    let (_dir, data) = temp_dir();
    let app_port = free_port();
    let mut config = test_config(&data);
    config.server.allowed_origins = vec![format!("http://127.0.0.1:{app_port}")];
    let gw = InProcess::start(config).await;
    let out = run_script("bfcache.mjs", vec![gw.base.clone(), app_port.to_string()]).await;
    assert!(out.contains("bfcache: restored from the back/forward cache (pageshow persisted, one load); away, no session and no lock ackgate:"), "{out}");
    assert!(out.contains("the 3 events published meanwhile received: every offset 0..5") && out.contains("all acked (committed 6)"), "{out}");
    gw.stop().await;
}
