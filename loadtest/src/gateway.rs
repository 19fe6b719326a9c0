//! The gateway under test: the real `ackgate` binary started in a temp data dir (embedded log,
//! Kafka with `--brokers`, or RocketMQ with `--rocketmq`), or one already running at `--url`.
//! Also reads its RSS and CPU time from /proc.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub struct Gateway {
    pub base: String,
    pub ws: String,
    /// The gateway's info log lines (`ackgate::gateway` only, see `start_in`).
    pub logs: Arc<Mutex<Vec<String>>>,
    child: Option<Child>,
    log_file: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    _temp: Option<tempfile::TempDir>,
}

/// How the loadtest starts a gateway of its own.
#[derive(Clone)]
pub struct Launch {
    pub binary: PathBuf,
    pub brokers: Option<String>,
    /// Extra environment (`ACKGATE_*` overrides, `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Where the gateway's log lines are written when it stops.
    pub log_file: Option<PathBuf>,
}

impl Launch {
    /// `ackgate` next to this executable (both are built into the same target dir).
    pub fn default_binary() -> PathBuf {
        std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("ackgate"))).unwrap_or_else(|| PathBuf::from("ackgate"))
    }
}

impl Gateway {
    pub fn at_url(url: &str) -> Self {
        let base = url.trim_end_matches('/').to_string();
        let ws = format!("{}/ws", base.replacen("http", "ws", 1));
        Self { base, ws, logs: Default::default(), child: None, log_file: None, data_dir: None, _temp: None }
    }

    /// Starts the binary in a new temp data dir.
    pub fn start(launch: &Launch) -> anyhow::Result<Self> {
        let temp = tempfile::tempdir()?;
        let data = temp.path().join("data");
        let mut gateway = Self::start_in(launch, &data)?;
        gateway._temp = Some(temp);
        Ok(gateway)
    }

    /// Starts the binary on an existing data dir (restarts).
    pub fn start_in(launch: &Launch, data: &Path) -> anyhow::Result<Self> {
        if !launch.binary.exists() {
            bail!("gateway binary {} not found: build it (cargo build --release) or pass --gateway-bin", launch.binary.display());
        }
        let config = data.with_extension("toml");
        std::fs::write(&config, format!("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\ndata_dir = {:?}\n", data.display().to_string()))?;
        let mut command = Command::new(&launch.binary);
        command.arg("--config").arg(&config).env("RUST_LOG", "warn,ackgate::gateway=info").stdout(Stdio::null()).stderr(Stdio::piped());
        if let Some(brokers) = &launch.brokers {
            command.env("ACKGATE_STORAGE__BACKEND", "kafka").env("ACKGATE_KAFKA__BOOTSTRAP_SERVERS", brokers);
        }
        for (k, v) in &launch.env {
            command.env(k, v);
        }
        let mut child = command.spawn().with_context(|| format!("starting {}", launch.binary.display()))?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let logs: Arc<Mutex<Vec<String>>> = Default::default();
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
                if let Some(rest) = line.split("local_addr").nth(1) {
                    let addr: String = rest.chars().skip_while(|c| !c.is_ascii_digit()).take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
                    let _ = tx.send(Ok(addr));
                } else if line.contains("ERROR") {
                    eprintln!("gateway: {line}");
                    let _ = tx.send(Err(line));
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(line)) => bail!("gateway failed to start: {line}"),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let tail: Vec<String> = logs.lock().unwrap().iter().rev().take(10).rev().cloned().collect();
                bail!("gateway did not report its address within 120 s; its last log lines:\n{}", tail.join("\n"))
            }
        };
        Ok(Self {
            base: format!("http://{addr}"),
            ws: format!("ws://{addr}/ws"),
            logs,
            child: Some(child),
            log_file: launch.log_file.clone(),
            data_dir: Some(data.to_path_buf()),
            _temp: None,
        })
    }

    /// Stops the gateway gracefully and starts the binary again on the same data dir.
    pub fn restart(&mut self, launch: &Launch) -> anyhow::Result<()> {
        let data = self.data_dir.clone().context("only a gateway this loadtest started can be restarted")?;
        self.stop();
        let mut restarted = Self::start_in(launch, &data)?;
        restarted._temp = self._temp.take();
        *self = restarted;
        Ok(())
    }

    /// True once a log line containing `needle` was printed.
    pub fn logged(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// True once the process this loadtest started has exited by itself.
    pub fn has_exited(&mut self) -> bool {
        let exited = self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if exited {
            // Reaped: nothing left to stop.
            self.child = None;
        }
        exited
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL: a crash, nothing flushed.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for the exit (graceful: offsets flushed, checkpoint written).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            struct WriteLogs<'a>(&'a Gateway);
            impl Drop for WriteLogs<'_> {
                fn drop(&mut self) {
                    if let Some(path) = &self.0.log_file {
                        // Appended: a restarted gateway adds its lines after the first one's.
                        let lines = self.0.logs.lock().unwrap().join("\n") + "\n";
                        let appended = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .and_then(|mut f| std::io::Write::write_all(&mut f, lines.as_bytes()));
                        if let Err(e) = appended {
                            eprintln!("loadtest: writing the gateway log to {}: {e}", path.display());
                        }
                    }
                }
            }
            let _logs = WriteLogs(self);
            let _ = Command::new("sh").arg("-c").arg(format!("kill -TERM {}", child.id())).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Resident memory in bytes, when this loadtest started the gateway.
    pub fn rss_bytes(&self) -> Option<u64> {
        process_rss_bytes(self.pid()?)
    }

    /// User + system CPU seconds used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        process_cpu_seconds(self.pid()?)
    }
}

/// A process's resident memory in bytes (`VmRSS`).
pub fn process_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A process's user + system CPU seconds so far.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}
