//! The JavaScript client package (`clients/js`) against three real gateways: node's test runner
//! runs `clients/js/test/`: `unit.test.mjs` on a fake socket (ack overloads, states, listeners,
//! iterators, gaps, timeouts, read-only sets, tabs on in-memory Web Locks, the minified build), and
//! `react.test.mjs` on the same fake socket (ackgate-client/react's per-topic store: one
//! subscription for every component, the limit, acks of rendered and dropped events), and
//! `client.test.mjs` against the gateways (plain acks with a confirmation per period, rejected requests when
//! disconnected, no token after 4002, a dropped subscription, a token kept across a reload, an
//! operator's reset over a kept token (fenced by its epoch), a drained instance followed to its peer; over SSE: acks, a dropped stream resumed with its
//! token, 4002, takeover both ways with a WebSocket client, `auto` falling back; docs/clients.md's quickstart, `failed` and
//! `state` listeners and ackgate-client page, run as written); `tsc --noEmit` checks `index.d.ts` against
//! `examples/typed.ts`; `npm pack --dry-run` packs it offline.

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;

fn package_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js"))
}

/// Runs `program args` in the package directory; panics with its output unless it succeeds.
async fn run(program: &'static str, args: &[&str], env: Vec<(&'static str, String)>) -> String {
    let owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output =
        tokio::task::spawn_blocking(move || Command::new(program).args(owned).envs(env).current_dir(package_dir()).output().expect("it runs")).await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    assert!(output.status.success(), "{program} {args:?} failed:\n{stdout}\n{stderr}");
    stdout + &stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_client_passes_its_tests_against_real_gateways() {
    let (_dir_a, data_a) = temp_dir();
    let (_dir_b, data_b) = temp_dir();
    // A serves most tests alone; B is drained by the last one and names A as its peer.
    // A and B share the resume token key (B names A as its peer): a client drained off B resumes
    // on A with the token B issued.
    let mut config = test_config(&data_a);
    config.cluster.token_key = CLUSTER_TOKEN_KEY.into();
    let a = InProcess::start(config).await;
    let mut config = test_config(&data_b);
    config.server.drain_ms = 500;
    config.cluster.peers = vec![a.base.clone()];
    config.cluster.token_key = CLUSTER_TOKEN_KEY.into();
    let b = InProcess::start(config).await;
    // C checks JWTs and warns 2 s before one expires.
    let (_dir_c, data_c) = temp_dir();
    let mut config = test_config(&data_c);
    config.auth.jwt_secret = "js-client-test-secret-of-32-bytes!".into();
    config.auth.refresh_before_secs = 2;
    let c = InProcess::start(config).await;
    let env = vec![
        ("ACKGATE_DEV_A", a.base.clone()),
        ("ACKGATE_DEV_B", b.base.clone()),
        ("ACKGATE_DEV_C", c.base.clone()),
        ("ACKGATE_DEV_C_SECRET", "js-client-test-secret-of-32-bytes!".to_string()),
    ];
    // A failed test may leave a stream open, which would keep node (and this test) waiting:
    // the runner exits when its tests are done, and no test runs longer than two minutes.
    let out = run("node", &["--experimental-websocket", "--test", "--test-force-exit", "--test-timeout=120000", "test/"], env).await;
    assert!(out.contains("# fail 0") && out.contains("# pass 81"), "{out}");
    a.stop().await;
    b.stop().await;
    c.stop().await;
}

/// Issue 61 item 8: every gateway serves the minified client beside the source, with a source
/// map that names the source it serves (`/static/ackgate.js`) and holds its text; the copy in
/// static/ (compiled into the binary) is the build of today's clients/js/ackgate.js.
#[tokio::test]
async fn the_gateway_serves_the_minified_client_built_from_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let script = format!("import('./build.mjs').then((m) => m.buildServed({out:?}))");
    run("node", &["-e", &script], vec![]).await;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for file in ["ackgate.min.js", "ackgate.min.js.map"] {
        let built = std::fs::read(dir.path().join(file)).unwrap();
        let committed = std::fs::read(repo.join("static").join(file)).unwrap();
        assert!(built == committed, "static/{file} is not the build of clients/js/ackgate.js: run `node clients/js/build.mjs --served`");
    }
    let (_dir, data) = temp_dir();
    let gw = InProcess::start(test_config(&data)).await;
    let get = async |file: &str| http().get(format!("{}/static/{file}", gw.base)).send().await.unwrap().text().await.unwrap();
    let (source, minified, map) = (get("ackgate.js").await, get("ackgate.min.js").await, get("ackgate.min.js.map").await);
    assert!(minified.len() * 2 < source.len(), "minified: {} bytes of {}", minified.len(), source.len());
    assert!(minified.trim_end().ends_with("//# sourceMappingURL=ackgate.min.js.map"));
    let map: serde_json::Value = serde_json::from_str(&map).unwrap();
    assert_eq!(map["sources"], serde_json::json!(["ackgate.js"]));
    assert_eq!(map["sourcesContent"][0].as_str(), Some(source.as_str()), "the map holds the source the gateway serves");
    gw.stop().await;
}

#[tokio::test]
async fn the_js_client_types_check_and_it_packs_offline() {
    run("node_modules/.bin/tsc", &["--noEmit", "-p", "."], vec![]).await;
    let packed = run("npm", &["pack", "--dry-run", "--offline"], vec![]).await;
    for file in ["ackgate.js", "index.d.ts", "react.js", "react.d.ts", "README.md", "LICENSE", "examples/minimal.html", "package.json"] {
        assert!(packed.contains(file), "{file} is in the package:\n{packed}");
    }
    assert!(!packed.contains("node_modules") && !packed.contains("test/"), "only what a user needs:\n{packed}");
}
