//! The documentation a user reads: README.md and docs/*.md. Every relative link names a file
//! of the repository, and every `#anchor` a heading of that file as GitHub renders it; README
//! stays short (the rest lives in docs/); README's five minutes with curl and a WebSocket client
//! run as written against a fresh gateway (tests/docs/readme.mjs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> =
        std::fs::read_dir(repo().join("docs")).expect("docs/ exists").map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect();
    docs.sort();
    files.extend(docs);
    // The JS package's own README is read on npm as well as here.
    files.push(repo().join("clients/js/README.md"));
    files
}

/// GitHub's anchor for a heading: lower case, spaces to '-', other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// Targets of inline links `[text](target)` outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Code spans may hold `](` that is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    found
}

#[test]
fn every_relative_link_of_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        for target in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved: PathBuf = if path.is_empty() { file.clone() } else { dir.join(path) };
            let name = format!("{}: {target}", file.strip_prefix(repo()).unwrap().display());
            if !normalize(&resolved).starts_with(repo()) {
                broken.push(format!("{name} (outside the repository)"));
            } else if !resolved.exists() {
                broken.push(format!("{name} (no such file)"));
            } else if let Some(fragment) = fragment.filter(|_| resolved.extension().is_some_and(|e| e == "md")) {
                if !anchors(&std::fs::read_to_string(&resolved).unwrap()).contains(fragment) {
                    broken.push(format!("{name} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c` (without touching the file system).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[test]
fn the_link_checker_finds_what_it_should() {
    assert_eq!(anchor("Takeover: several instances, one log"), "takeover-several-instances-one-log");
    assert_eq!(anchor(" `ack_ok` means durable "), "ack_ok-means-durable");
    assert_eq!(links("see [a](docs/a.md#x) and `[b](not-a-link)`\n```\n[c](code)\n```\n[d](#e)"), vec!["docs/a.md#x", "#e"]);
}

#[test]
fn readme_stays_short() {
    let lines = std::fs::read_to_string(repo().join("README.md")).unwrap().lines().count();
    assert!(lines <= 260, "README.md has {lines} lines: move subjects to docs/ (issue 23)");
}

/// docs/operations.md's metric table names every metric of `core::metrics::ALL` and `PROCESS`,
/// and no other.
#[test]
fn the_operations_guide_lists_every_metric_and_no_other() {
    let text = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let listed: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter(|rest| rest.starts_with("ackgate_") || rest.starts_with("process_"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_string)
        .collect();
    let exported: BTreeSet<String> = ackgate::core::metrics::ALL.iter().chain(&ackgate::core::metrics::PROCESS).map(|n| n.to_string()).collect();
    assert_eq!(listed, exported);
}

/// README's "Five minutes with curl and a WebSocket client" runs as written (issue 61):
/// tests/docs/readme.mjs runs each curl line with this gateway's address for `localhost:8080`
/// and checks its answer against what the block shows and says, and `scripts/client alice
/// orders` with the walkthrough's client of this build (the example `ws_client`, built beside
/// the tests by `cargo build --all-targets`, as scripts/test does), which must print the frames
/// the block shows and get an `ack_ok` for each event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_five_minutes_run_as_written() {
    let (_dir, data) = crate::support::temp_dir();
    let gw = crate::support::InProcess::start(crate::support::test_config(&data)).await;
    // The test binary is target/<profile>/deps/api-...; the examples are in target/<profile>/examples.
    let exe = std::env::current_exe().unwrap();
    let ws_client = exe.parent().and_then(|deps| deps.parent()).unwrap().join("examples/ws_client");
    assert!(ws_client.exists(), "{} missing: build the examples first (cargo build --workspace --all-targets)", ws_client.display());
    let script = repo().join("tests/docs/readme.mjs");
    let base = gw.base.clone();
    let output = tokio::task::spawn_blocking(move || std::process::Command::new("node").arg(&script).arg(&base).arg(&ws_client).output().expect("node runs"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "README's five minutes failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("readme: five minutes, 7 commands as written"), "{stdout}");
    assert!(stdout.contains("readme: scripts/client received 3 events and got an ack_ok for each, printing the 4 frames the block shows"), "{stdout}");
    gw.stop().await;
}
