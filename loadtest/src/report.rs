//! The summary of a run: printed as text or as one JSON object, and a progress line on stderr.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

#[derive(Default)]
pub struct Summary {
    pub shape: String,
    /// Named figures, in print order.
    pub figures: Vec<(String, Value)>,
    pub complete: bool,
    pub problems: Vec<String>,
}

impl Summary {
    pub fn new(shape: impl Into<String>) -> Self {
        Self { shape: shape.into(), complete: true, ..Default::default() }
    }

    pub fn add(&mut self, name: &str, value: impl Into<Value>) {
        self.figures.push((name.to_string(), value.into()));
    }

    /// A figure added before, by name.
    pub fn figure(&self, name: &str) -> Option<&Value> {
        self.figures.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    pub fn add_latency(&mut self, name: &str, histogram: &Histogram<u64>) {
        if histogram.is_empty() {
            return;
        }
        let q = |q: f64| histogram.value_at_quantile(q);
        self.add(
            name,
            json!({"count": histogram.len(), "p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99), "p999_us": q(0.999), "max_us": histogram.max()}),
        );
    }

    /// The figures of a timed delivery run, in the order every throughput shape prints them.
    pub fn add_deliveries(&mut self, elapsed: Duration, deliveries: u64, acks: u64, redeliveries: u64) {
        let seconds = elapsed.as_secs_f64();
        self.add("elapsed_s", (seconds * 1000.0).round() / 1000.0);
        self.add("deliveries", deliveries);
        self.add("delivered_per_s", (deliveries as f64 / seconds).round());
        self.add("acked_per_s", (acks as f64 / seconds).round());
        self.add("redeliveries", redeliveries);
    }

    pub fn problem(&mut self, problem: String) {
        self.complete = false;
        self.problems.push(problem);
    }

    pub fn print(&self, as_json: bool) {
        let mut figures = self.figures.clone();
        let retries = crate::client::SUBSCRIBE_RETRIES.load(Ordering::Relaxed);
        if retries > 0 {
            figures.push(("subscribe_retries".into(), retries.into()));
        }
        if as_json {
            let mut object = Map::new();
            object.insert("shape".into(), self.shape.clone().into());
            for (k, v) in &figures {
                object.insert(k.clone(), v.clone());
            }
            object.insert("complete".into(), self.complete.into());
            object.insert("problems".into(), self.problems.clone().into());
            println!("{}", Value::Object(object));
            return;
        }
        println!("loadtest {}", self.shape);
        for (k, v) in &figures {
            println!("  {k:<28} {v}");
        }
        println!("  {:<28} {}", "complete", if self.complete { "yes: every client got every event, committed = log end" } else { "NO" });
        for p in &self.problems {
            println!("  problem: {p}");
        }
    }
}

/// Prints `label done/total rate` to stderr every second until dropped.
pub struct Progress {
    stop: Arc<AtomicU64>,
}

impl Progress {
    pub fn start(label: &'static str, done: Arc<AtomicU64>, total: u64) -> Self {
        let stop = Arc::new(AtomicU64::new(0));
        let stopped = stop.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if stopped.load(Ordering::Relaxed) == 1 {
                    return;
                }
                let n = done.load(Ordering::Relaxed);
                let width = 30;
                let filled = ((n as f64 / total.max(1) as f64) * width as f64).min(width as f64) as usize;
                eprintln!("{label} [{}{}] {n}/{total} {:.0}/s", "#".repeat(filled), ".".repeat(width - filled), n as f64 / started.elapsed().as_secs_f64());
            }
        });
        Self { stop }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(1, Ordering::Relaxed);
    }
}
