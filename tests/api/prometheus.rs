//! The alerts and the dashboard ackgate ships (deploy/, issue 45 item 1), against Debian's
//! `prometheus` and `promtool` (scripts/prereqs) and a real gateway: the rules are valid, name only
//! metrics ackgate exports, and the lag alert fires when a client stops acknowledging; every panel
//! of the dashboard has data.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `ackgate_...` metric names in `text`, histogram series (`_bucket`, `_sum`, `_count`) by
/// their histogram's name.
fn metric_names(text: &str) -> BTreeSet<String> {
    text.match_indices("ackgate_")
        .map(|(at, _)| text[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect::<String>())
        .map(|name| ["_bucket", "_sum", "_count"].iter().find_map(|suffix| name.strip_suffix(suffix)).map_or(name.clone(), str::to_string))
        .collect()
}

/// The dashboard's queries, with every instance picked (as Grafana sends them with "All").
/// Each series selector filters by the `instance` variable (issue 62: an operator looks at one
/// instance of a cluster).
fn panel_queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/ackgate.json")).unwrap();
    let variable = dashboard["templating"]["list"].as_array().unwrap().iter().find(|v| v["name"] == "instance").expect("an instance variable");
    assert_eq!((variable["includeAll"].as_bool(), variable["allValue"].as_str()), (Some(true), Some(".+")), "{variable}");
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect();
    assert!(queries.len() >= 8, "{queries:?}");
    for query in &queries {
        let selectors = query.matches("ackgate_").count() + query.matches("process_").count();
        assert_eq!(query.matches(r#"instance=~"$instance""#).count(), selectors, "every series of {query} is filtered by instance");
    }
    queries.into_iter().map(|q| q.replace("$instance", ".+")).collect()
}

#[test]
fn the_rules_pass_promtool_and_name_only_metrics_ackgate_exports() {
    let checked = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(repo_file("deploy/prometheus/alerts.yml"))
        .output()
        .expect("promtool (Debian's prometheus package) runs");
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stdout));
    let exported = metric_names(&read("src/core/metrics.rs"));
    let named: BTreeSet<String> =
        metric_names(&read("deploy/prometheus/alerts.yml")).into_iter().chain(panel_queries().iter().flat_map(|q| metric_names(q))).collect();
    assert!(named.len() >= 10, "{named:?}");
    let unknown: Vec<&String> = named.difference(&exported).collect();
    assert!(unknown.is_empty(), "named but not exported by core/metrics.rs: {unknown:?}");
}

/// `promtool test rules` on the shipped unit tests: each alert fires on the failure it names and
/// stays quiet on a healthy series (issue 62, item 1).
#[test]
fn every_alert_fires_on_its_failure_and_stays_quiet_without_it() {
    let tested = Command::new("promtool")
        .arg("test")
        .arg("rules")
        .arg(repo_file("deploy/prometheus/alerts_test.yml"))
        .output()
        .expect("promtool (Debian's prometheus package) runs");
    assert!(tested.status.success(), "{}{}", String::from_utf8_lossy(&tested.stdout), String::from_utf8_lossy(&tested.stderr));
    // Every alert has a group of its own in the tests.
    let rules = read("deploy/prometheus/alerts.yml");
    let tests = read("deploy/prometheus/alerts_test.yml");
    // And a runbook row in docs/operations.md (issue 62: what to do when it fires).
    let runbook = read("docs/operations.md");
    for alert in rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")) {
        assert!(tests.contains(&format!("alertname: {alert}\n        exp_alerts:")), "no test in alerts_test.yml sees {alert} fire");
        assert!(runbook.contains(&format!("| `{alert}` |")), "no runbook row for {alert} in docs/operations.md");
    }
}

/// Every counter an alert watches with `increase()` has its series on a gateway that has not
/// counted anything yet, at 0, with the labels the alert matches: a series that appears at its
/// first event reads as no increase, so `AckgateLogTruncated`, `AckgateReaderRestarts` and
/// `AckgateConnectionsRefused` never fired on the failure they name (issue 62, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_an_alert_watches_is_exported_at_zero_from_the_start() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    let text = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    let series: Vec<&str> = text.lines().filter(|l| l.starts_with("ackgate_")).collect();
    let rules = read("deploy/prometheus/alerts.yml");
    // An expression that also sees series new in its window (`x unless x offset ...`: counters
    // labelled by topic or route, which cannot be made at 0) needs no series at the start.
    let watched: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .filter(|expr| !expr.contains(" unless "))
        .flat_map(|expr| expr.match_indices("increase(").map(move |(at, _)| expr[at + "increase(".len()..].split('[').next().unwrap()))
        .collect();
    assert!(watched.len() >= 6, "{watched:?}");
    for selector in watched {
        let (name, matchers) = selector.split_once('{').map_or((selector, ""), |(n, m)| (n, m.trim_end_matches('}')));
        let found = series.iter().any(|line| {
            let (series_name, rest) = line.split_at(line.find(['{', ' ']).unwrap_or(line.len()));
            series_name == name && matchers.split(',').filter(|m| !m.is_empty()).all(|m| rest.contains(m)) && rest.ends_with(" 0")
        });
        assert!(found, "{selector}: no series at 0 on a fresh gateway; its alert cannot fire on the first event.\n{}", series.join("\n"));
    }
    // Each reason a connection is refused for has its own series, so the first of either pages.
    for reason in ackgate::core::metrics::CONNECTION_REFUSALS {
        assert!(text.contains(&format!("ackgate_connections_refused_total{{reason=\"{reason}\"}} 0")), "{reason}");
    }
}

/// `promtool check metrics` finds nothing in `/metrics` after an exchange (issue 62: a gauge named
/// `process_cpu_seconds_total` and a metric without help text were reported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_check_metrics_finds_nothing_in_a_scrape() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "m", 1, 0, 2).await;
    let mut client = TestClient::connect(gw.addr, "c").await;
    client.subscribe("m", json!({})).await;
    let events = client.recv_events(2).await;
    client.ack_confirmed(&ids(&events), "a").await;
    let text = http().get(format!("{}/metrics", gw.base)).send().await.unwrap().text().await.unwrap();
    let mut check =
        Command::new("promtool").args(["check", "metrics"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("promtool runs");
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(checked.status.success() && said.trim().is_empty(), "promtool check metrics: {said}");
    assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"), "{text}");
    gw.kill9();
}

/// Debian's Prometheus, scraping `target` every second and evaluating `rules` every second.
struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: std::net::SocketAddr, rules: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("alerts.yml"), rules).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [alerts.yml]\nscrape_configs:\n  - job_name: ackgate\n    static_configs:\n      - targets: ['{target}']\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian's package) starts");
        Self { child, base: format!("http://127.0.0.1:{port}"), _dir: dir }
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let response = http().get(format!("{}{path}", self.base)).query(query).send().await.ok()?;
        let body: Value = response.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that stops acknowledging while events keep coming: its topic's committed lag grows,
/// and `AckgateCommittedLagGrowing` fires through Prometheus. The shipped rules run with their
/// windows shortened to seconds (`[5m]` to `[20s]`, `for: 5m` to `for: 5s`); nothing else of them
/// changes. Then every panel of the dashboard answers with data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_acking_fires_the_lag_alert_and_every_panel_has_data() {
    let (_dir, data) = temp_dir();
    let gw = Process::start(&data, &[]);
    publish_numbered(&gw.base, "orders", 1, 0, 10).await;
    let acking = consume_and_ack(gw.addr, "acking", "orders", 10).await;
    let mut silent = TestClient::connect(gw.addr, "silent").await;
    silent.subscribe("orders", json!({})).await;
    silent.recv_events(10).await;
    let rules = read("deploy/prometheus/alerts.yml").replace("[5m]", "[20s]").replace("for: 5m", "for: 5s");
    let prometheus = Prometheus::start(gw.addr, &rules);

    let started = Instant::now();
    let mut n = 0u64;
    loop {
        publish(&gw.base, "orders", json!({"events": [{"partition": 0, "payload": {"n": n}}]})).await;
        n += 1;
        let alerts = prometheus.api("/api/v1/alerts", &[]).await.map(|d| d["alerts"].clone()).unwrap_or(Value::Null);
        let firing = alerts
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a["labels"]["alertname"] == "AckgateCommittedLagGrowing" && a["labels"]["topic"] == "orders" && a["state"] == "firing");
        if firing {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the lag alert did not fire; alerts: {alerts}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every panel has data (a rate needs two scrapes in its window: there were many by now).
    for query in panel_queries() {
        let answered = prometheus.api("/api/v1/query", &[("query", query.as_str())]).await.unwrap_or_else(|| panic!("{query} was not answered"));
        let series = answered["result"].as_array().map_or(0, Vec::len);
        assert!(series > 0, "no data for the panel query {query}: {answered}");
    }
    drop(acking);
    gw.kill9();
}
