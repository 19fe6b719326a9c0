//! What the fault suite's nemesis acts on and how: the gateways (`Cluster`), the broker of the
//! run (tansu behind a proxy, rocketmq-rust through its script) and the faults themselves.

use super::*;

/// The log of the run's own: a tansu broker (Kafka) on a fixed port with its data in a temp dir,
/// or rocketmq-rust's name server and broker through `scripts/rocketmq-test-broker`.
pub(super) enum Broker {
    /// `port` is the proxy's (what clients use, and tansu advertises), `target` tansu's own port,
    /// a new one at every start.
    Tansu {
        binary: PathBuf,
        dir: tempfile::TempDir,
        port: u16,
        target: Arc<Mutex<u16>>,
        child: Option<std::process::Child>,
        link: Arc<Link>,
    },
    RocketMq {
        script: PathBuf,
        dir: tempfile::TempDir,
        port: u16,
        killed: bool,
    },
}

impl Broker {
    /// tansu behind a proxy of this process on a fixed port: a SIGKILLed tansu leaves its port in
    /// TIME_WAIT for a minute (it cannot listen there again sooner), so each start takes a new
    /// port and the proxy sends new connections there.
    pub(super) async fn tansu(binary: &Path) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(Mutex::new(0u16));
        let link = Arc::new(Link::new());
        tokio::spawn(proxy(listener, target.clone(), link.clone()));
        let mut broker = Self::Tansu { binary: binary.to_path_buf(), dir: tempfile::tempdir()?, port, target, child: None, link };
        tokio::task::block_in_place(|| broker.run())?;
        Ok(broker)
    }

    pub(super) fn rocketmq(script: &Path) -> anyhow::Result<Self> {
        let broker = Self::RocketMq { script: script.to_path_buf(), dir: tempfile::tempdir()?, port: free_port()?, killed: false };
        broker.rocketmq_script("start")?;
        Ok(broker)
    }

    /// The gateway's settings for this log.
    pub(super) fn gateway_env(&self) -> Vec<(String, String)> {
        match self {
            Self::Tansu { port, .. } => {
                vec![("ACKGATE_STORAGE__BACKEND".into(), "kafka".into()), ("ACKGATE_KAFKA__BOOTSTRAP_SERVERS".into(), format!("127.0.0.1:{port}"))]
            }
            Self::RocketMq { port, .. } => vec![
                ("ACKGATE_STORAGE__BACKEND".into(), "rocketmq".into()),
                ("ACKGATE_ROCKETMQ__NAMESRV_ADDR".into(), format!("127.0.0.1:{port}")),
                ("ACKGATE_ROCKETMQ__MODE".into(), "pop".into()),
            ],
        }
    }

    pub(super) fn rocketmq_script(&self, verb: &str) -> anyhow::Result<()> {
        let Self::RocketMq { script, dir, port, .. } = self else { bail!("not RocketMQ") };
        let mut command = std::process::Command::new("bash");
        command.arg(script).arg(verb).arg(port.to_string());
        if verb == "restart-broker" {
            command.arg("1");
        }
        let status = command.env("ACKGATE_DEV_ROCKETMQ_DATA", dir.path()).stdout(std::process::Stdio::null()).status()?;
        if !status.success() && verb != "stop" {
            bail!("rocketmq-test-broker {verb} failed (data in {})", dir.path().display());
        }
        Ok(())
    }

    pub(super) fn tansu_url(port: u16) -> String {
        format!("tcp://127.0.0.1:{port}")
    }

    /// Starts the broker again after `kill` (same data).
    pub(super) fn run(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Tansu { binary, dir, port, target, child, .. } => {
                let own = free_port()?;
                *target.lock().unwrap() = own;
                let url = Self::tansu_url(own);
                let started_child = std::process::Command::new(&*binary)
                    .args(["broker", "--listener-url", &url, "--advertised-listener-url", &Self::tansu_url(*port)])
                    .args(["--storage-engine", "sqlite://tansu.db"])
                    .current_dir(dir.path())
                    .env("RUST_LOG", "warn")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::fs::OpenOptions::new().create(true).append(true).open(dir.path().join("tansu.log"))?)
                    .spawn()
                    .with_context(|| format!("starting {}", binary.display()))?;
                *child = Some(started_child);
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(30) {
                    let listed = std::process::Command::new(&*binary)
                        .args(["topic", "list", "--broker", &url])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status();
                    if listed.is_ok_and(|s| s.success()) {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                bail!("tansu did not answer within 30 s (its log: {})", dir.path().join("tansu.log").display())
            }
            Self::RocketMq { killed, .. } => {
                if std::mem::take(killed) {
                    self.rocketmq_script("restart-broker")?;
                }
                Ok(())
            }
        }
    }

    /// The network between the gateways and the broker, where this run has one of its own
    /// (tansu's proxy).
    pub(super) fn link(&self) -> Option<&Arc<Link>> {
        match self {
            Self::Tansu { link, .. } => Some(link),
            Self::RocketMq { .. } => None,
        }
    }

    /// True while the broker is down after `kill`.
    pub(super) fn is_down(&self) -> bool {
        match self {
            Self::Tansu { child, .. } => child.is_none(),
            Self::RocketMq { killed, .. } => *killed,
        }
    }

    pub(super) fn kill(&mut self) {
        match self {
            Self::Tansu { child, .. } => {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            Self::RocketMq { .. } => {
                self.signal(libc::SIGKILL);
                if let Self::RocketMq { killed, .. } = self {
                    *killed = true;
                }
            }
        }
    }

    /// A signal to the broker (RocketMQ: its master, not the name server).
    pub(super) fn signal(&self, signal: libc::c_int) {
        let pid = match self {
            Self::Tansu { child, .. } => child.as_ref().map(|c| c.id() as libc::pid_t),
            // One master writes broker.pid (`rocketmq-test-broker start`), several broker-N.pid.
            Self::RocketMq { dir, .. } => {
                ["broker.pid", "broker-1.pid"].iter().find_map(|file| std::fs::read_to_string(dir.path().join(file)).ok()).and_then(|p| p.trim().parse().ok())
            }
        };
        if let Some(pid) = pid {
            // SAFETY: a signal to a process this run started.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        match self {
            Self::Tansu { .. } => self.kill(),
            Self::RocketMq { .. } => {
                let _ = self.rocketmq_script("stop");
            }
        }
    }
}

/// The network between the gateways and the broker, as the proxy carries it, with the faults a
/// Kafka cluster's network shows: connections cut, a path that black-holes every byte for a
/// while (TCP holds them, nothing arrives), a broker that answers slowly.
pub(super) struct Link {
    /// Bumped by a cut: every connection open then is reset.
    cuts: watch::Sender<u64>,
    black_holed: AtomicBool,
    /// Added before each chunk goes through, either way.
    delay_ms: AtomicU64,
}

impl Link {
    fn new() -> Self {
        Self { cuts: watch::channel(0).0, black_holed: AtomicBool::new(false), delay_ms: AtomicU64::new(0) }
    }

    /// Every connection between the gateways and the broker is reset at once.
    pub(super) fn cut(&self) {
        self.cuts.send_modify(|cuts| *cuts += 1);
    }

    pub(super) fn black_hole(&self, on: bool) {
        self.black_holed.store(on, Ordering::Relaxed);
    }

    pub(super) fn slow(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Carries what `from` reads to `to` until either side ends, through the link's faults.
    async fn pump(&self, mut from: impl tokio::io::AsyncRead + Unpin, mut to: impl tokio::io::AsyncWrite + Unpin) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            while self.black_holed.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let delay = self.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    }
}

/// Forwards each connection to `127.0.0.1:target` as it is when the connection comes, through
/// `link`.
pub(super) async fn proxy(listener: tokio::net::TcpListener, target: Arc<Mutex<u16>>, link: Arc<Link>) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        let port = *target.lock().unwrap();
        let link = link.clone();
        let mut cuts = link.cuts.subscribe();
        tokio::spawn(async move {
            let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return };
            let cut = {
                let ((from_client, to_client), (from_broker, to_broker)) = (inbound.split(), outbound.split());
                tokio::select! {
                    _ = link.pump(from_client, to_broker) => false,
                    _ = link.pump(from_broker, to_client) => false,
                    changed = cuts.changed() => changed.is_ok(),
                }
            };
            if cut {
                // A reset, not a goodbye: both ends see the connection fail.
                let _ = inbound.set_zero_linger();
                let _ = outbound.set_zero_linger();
            }
        });
    }
}

/// The processes under test and the file system under them: what the nemesis acts on.
pub(super) struct Cluster {
    pub(super) launches: Vec<Launch>,
    pub(super) data: Vec<PathBuf>,
    pub(super) gateways: Vec<Option<Gateway>>,
    pub(super) mount: PowerLossMount,
    pub(super) broker: Option<Broker>,
    /// Per instance, libfaketime's offset file and the offset it holds, in seconds.
    pub(super) clocks: Vec<(PathBuf, i64)>,
    /// Gateway log lines of stopped instances, kept for `--gateway-log`.
    pub(super) logs: Vec<String>,
}

impl Cluster {
    pub(super) fn start(&mut self, i: usize) -> anyhow::Result<()> {
        let gateway = Gateway::start_in(&self.launches[i], &self.data[i]).with_context(|| format!("starting instance {i}"))?;
        self.gateways[i] = Some(gateway);
        Ok(())
    }

    /// Starts instance `i` after a fault; a start that fails (the broker slow to answer a start's
    /// alignment, say: the gateway exits with the reason) is left to the supervisor's next round,
    /// as systemd's `Restart=on-failure` would, and counted.
    pub(super) fn start_after_fault(&mut self, i: usize, log: &mut FaultLog) {
        if let Err(e) = self.start(i) {
            log.failed_starts += 1;
            eprintln!("chaos: {e:#}; the supervisor tries again");
        }
    }

    pub(super) fn keep_logs(&mut self, gateway: &Gateway) {
        self.logs.extend(gateway.logs.lock().unwrap().iter().cloned());
    }

    pub(super) fn kill(&mut self, i: usize) {
        if let Some(mut gateway) = self.gateways[i].take() {
            gateway.kill9();
            self.keep_logs(&gateway);
        }
    }

    pub(super) fn signal(&self, i: usize, signal: libc::c_int) {
        if let Some(pid) = self.gateways[i].as_ref().and_then(Gateway::pid) {
            // SAFETY: a signal to a child process of ours.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        }
    }

    /// Ready (`/readyz`) and taking writes: a probe event on a topic of its own is answered 200.
    pub(super) fn writable(&self, i: usize) -> bool {
        let Some(gateway) = &self.gateways[i] else { return false };
        let curl =
            |args: &[&str]| std::process::Command::new("curl").args(["-sf", "-m", "2", "-o", "/dev/null"]).args(args).status().is_ok_and(|s| s.success());
        curl(&[&format!("{}/readyz", gateway.base)])
            && curl(&["-H", "content-type: application/json", "-d", r#"{"payload":{"probe":true}}"#, &format!("{}/topics/{TOPIC}-probe/events", gateway.base)])
    }

    /// Waits until instance `i` takes writes, doing what a supervisor (systemd's
    /// `Restart=on-failure`) does meanwhile: an instance that exited is started again.
    pub(super) fn wait_writable(&mut self, i: usize, within: Duration, log: &mut FaultLog) -> bool {
        let started = Instant::now();
        while started.elapsed() < within {
            self.supervise(log);
            if self.writable(i) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// A supervisor's round: every instance that exited by itself is started again (a start that
    /// fails is tried again at the next round).
    pub(super) fn supervise(&mut self, log: &mut FaultLog) {
        for i in 0..self.gateways.len() {
            let exited = self.gateways[i].as_mut().is_some_and(Gateway::has_exited);
            if exited {
                if let Some(gateway) = self.gateways[i].take() {
                    self.keep_logs(&gateway);
                }
                log.exited += 1;
            }
            if self.gateways[i].is_none() && self.start(i).is_ok() && exited {
                eprintln!("chaos: instance {i} exited by itself; started again");
            }
        }
    }
}

/// What the nemesis did, per fault kind, and what it saw.
#[derive(Default, serde::Serialize)]
pub(super) struct FaultLog {
    pub(super) injected: BTreeMap<String, u64>,
    /// Starts after a fault that failed (the gateway exited with the reason) and were left to
    /// the supervisor.
    pub(super) failed_starts: u64,
    /// Instances that exited by themselves (and were started again, as a supervisor would).
    pub(super) exited: u64,
    /// Instances that did not take writes again within 60 s of a fault's end: each is an
    /// anomaly (the run fails).
    pub(super) not_writable_after_fault: u64,
    /// fsyncs that reached the power-loss disk, of the offset stores and of everything: how
    /// much the run's durability cost.
    pub(super) offset_store_fsyncs: usize,
    pub(super) fsyncs: usize,
}

/// Injects faults until `stop`, then heals everything (every instance running and ready, room on
/// the disk, the broker up).
pub(super) fn nemesis(cluster: &mut Cluster, faults: &[Fault], mean_every: Duration, stop: &AtomicBool, mut rng: Rng) -> anyhow::Result<FaultLog> {
    let mut log = FaultLog::default();
    let instances = cluster.gateways.len();
    let started = Instant::now();
    let mut deck = FaultDeck::new(faults);
    while !stop.load(Ordering::Relaxed) {
        let wait = rng.millis(mean_every.as_millis() as u64 / 2, mean_every.as_millis() as u64 * 3 / 2);
        let until = Instant::now() + wait;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            cluster.supervise(&mut log);
            std::thread::sleep(Duration::from_millis(50));
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let fault = deck.draw(&mut rng);
        let i = rng.below(instances as u64) as usize;
        *log.injected.entry(fault.name()).or_default() += 1;
        eprintln!("chaos: {:>4.0} s: {} (instance {i})", started.elapsed().as_secs_f64(), fault.name());
        match fault {
            Fault::Kill => {
                cluster.kill(i);
                std::thread::sleep(rng.millis(100, 1500));
                cluster.start_after_fault(i, &mut log);
            }
            Fault::Pause => {
                cluster.signal(i, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(PONG_TIMEOUT_MS) + rng.millis(1000, 4000));
                cluster.signal(i, libc::SIGCONT);
            }
            Fault::Restart => {
                if let Some(mut gateway) = cluster.gateways[i].take() {
                    gateway.stop();
                    cluster.keep_logs(&gateway);
                }
                cluster.start_after_fault(i, &mut log);
            }
            Fault::Power => {
                for i in 0..instances {
                    cluster.kill(i);
                }
                cluster.mount.cut_power();
                std::thread::sleep(rng.millis(100, 1000));
                cluster.mount.power_on()?;
                for i in 0..instances {
                    cluster.start_after_fault(i, &mut log);
                }
            }
            Fault::DiskFull => {
                cluster.mount.set_full(true)?;
                let until = Instant::now() + rng.millis(1000, 4000);
                while Instant::now() < until {
                    // An instance that stops on the full disk is started again (and fails to
                    // start while the disk is full), as its supervisor would.
                    cluster.supervise(&mut log);
                    std::thread::sleep(Duration::from_millis(200));
                }
                cluster.mount.set_full(false)?;
                for i in 0..instances {
                    if !cluster.wait_writable(i, Duration::from_secs(60), &mut log) {
                        log.not_writable_after_fault += 1;
                        eprintln!("chaos: instance {i} takes no writes 60 s after the disk got room");
                    }
                }
            }
            Fault::Clock => {
                // An NTP step: the wall clock jumps 30 s back to 45 s ahead of where it is, but
                // stays within half a minute of the true time (a stepped clock is being corrected, and
                // the identity provider's clock that sets the tokens' `exp` is the true one).
                let (file, offset) = &mut cluster.clocks[i];
                *offset = (*offset + rng.below(76) as i64 - 30).clamp(-MAX_CLOCK_SKEW_SECS, MAX_CLOCK_SKEW_SECS);
                std::fs::write(&*file, format!("{offset:+}s"))?;
            }
            Fault::BrokerKill => {
                if let Some(broker) = cluster.broker.as_mut() {
                    broker.kill();
                    std::thread::sleep(rng.millis(500, 3000));
                    broker.run()?;
                }
            }
            Fault::BrokerCut => {
                if let Some(link) = cluster.broker.as_ref().and_then(Broker::link) {
                    link.cut();
                }
            }
            Fault::BrokerBlackHole => {
                if let Some(link) = cluster.broker.as_ref().and_then(Broker::link) {
                    link.black_hole(true);
                    std::thread::sleep(rng.millis(2000, 8000));
                    link.black_hole(false);
                }
            }
            Fault::BrokerSlow => {
                if let Some(link) = cluster.broker.as_ref().and_then(Broker::link) {
                    link.slow(rng.millis(50, 500));
                    std::thread::sleep(rng.millis(3000, 10_000));
                    link.slow(Duration::ZERO);
                }
            }
            Fault::BrokerPause => {
                if let Some(broker) = cluster.broker.as_ref() {
                    broker.signal(libc::SIGSTOP);
                    std::thread::sleep(rng.millis(1000, 5000));
                    broker.signal(libc::SIGCONT);
                }
            }
        }
    }
    Ok(log)
}
