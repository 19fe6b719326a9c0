//! `ackgate [--config PATH]`: run the gateway until SIGINT or SIGTERM.
//! `ackgate openapi`: print the OpenAPI document (the content of `openapi/openapi.json`).
//! `ackgate config-template [--markdown]`: print `config.toml` (or `docs/configuration.md`).
//! `ackgate [--config PATH] check`: check a config as a start would, without starting.

use std::path::{Path, PathBuf};

use ackgate::config::LogFormat;
use clap::Parser;

// The gateway allocates a little per frame and per event; mimalloc halves what glibc's malloc
// costs on that path (malloc/free were ~17% of a profile at full load). The `system-allocator`
// feature keeps glibc's malloc, so that heap profilers which hook malloc (heaptrack) see every
// allocation: README, Performance, "Where the memory goes".
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's defaults kept one busy client's freed memory resident. With its arena committed up
/// front (its default on Linux), one client's 200,000 events peaked at 149 MiB of RSS and left
/// 117 MiB a second later; with the arena committed as it is used, 90 and 87 MiB; and with freed
/// pages purged after 100 ms (mimalloc's default: 1 s), 89 and 75 MiB (docs/performance.md,
/// "Memory of one busy client, bounded": measured, not traced in mimalloc's source). These are
/// defaults: `MIMALLOC_ARENA_EAGER_COMMIT` and `MIMALLOC_PURGE_DELAY` in the environment win.
#[cfg(all(not(feature = "system-allocator"), target_os = "linux"))]
mod allocator_defaults {
    use std::os::raw::{c_int, c_long};

    /// Indices into `mi_option_e` of mimalloc 3.3 (libmimalloc-sys 0.1.49, pinned by Cargo.lock;
    /// `tests::the_allocator_option_indices_are_of_the_pinned_mimalloc` trips on another version).
    pub(super) const ARENA_EAGER_COMMIT: c_int = 4;
    pub(super) const PURGE_DELAY: c_int = 15;

    extern "C" {
        /// Sets an option's value unless the environment set it.
        fn mi_option_set_default(option: c_int, value: c_long);
        #[cfg(test)]
        pub(super) fn mi_option_get(option: c_int) -> c_long;
    }

    extern "C" fn set() {
        // SAFETY: plain stores into mimalloc's static option table, valid indices (above).
        unsafe {
            mi_option_set_default(ARENA_EAGER_COMMIT, 0);
            mi_option_set_default(PURGE_DELAY, 100);
        }
    }

    /// Runs before `main` and before the Rust runtime's first allocation: an arena's commit is
    /// chosen when the arena is reserved, at the first allocation.
    #[used]
    #[link_section = ".init_array"]
    static SET_BEFORE_THE_FIRST_ALLOCATION: extern "C" fn() = set;
}

#[derive(Parser)]
#[command(version, about = "HTTP/WebSocket gateway: acknowledged push delivery from a durable log")]
struct Cli {
    /// Configuration file; keys may be overridden as ACKGATE_<SECTION>__<KEY>.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print the OpenAPI document and exit (`ackgate openapi > openapi/openapi.json`).
    Openapi,
    /// Print every config key with its default and description, as TOML (the repository's
    /// `config.toml`) or, with --markdown, as `docs/configuration.md`.
    ConfigTemplate {
        #[arg(long)]
        markdown: bool,
    },
    /// Check the config file (with ACKGATE_* overrides) as a start and a reload would, and the
    /// files it names (TLS certificate and key, the data dir's format), without starting or
    /// writing anything: exit 0 when it is valid, 2 with the problem when not.
    Check,
}

/// Sets up the log lines: the filter is RUST_LOG when it is set and not empty, else
/// `server.log_level`; in the second case a reload may replace it (the setter returned).
fn init_logs(format: LogFormat, log_level: &str) -> Result<Option<ackgate::reload::SetLogFilter>, String> {
    use tracing_subscriber::EnvFilter;
    let from_env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let filter = match &from_env {
        Some(text) => EnvFilter::try_new(text).map_err(|e| format!("RUST_LOG: {e}"))?,
        None => EnvFilter::try_new(log_level).map_err(|e| format!("server.log_level: {e}"))?,
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_ansi(ansi).with_writer(std::io::stderr);
    // The two formats are two subscriber types, so two handles: each becomes the same setter.
    macro_rules! setter {
        ($handle:expr) => {{
            let handle = $handle;
            Box::new(move |text: &str| {
                let filter = EnvFilter::try_new(text).map_err(|e| e.to_string())?;
                handle.reload(filter).map_err(|e| e.to_string())
            }) as ackgate::reload::SetLogFilter
        }};
    }
    let set = if format == LogFormat::Json {
        let builder = builder.json().with_env_filter(filter).with_filter_reloading();
        let set = setter!(builder.reload_handle());
        builder.init();
        set
    } else {
        let builder = builder.with_env_filter(filter).with_filter_reloading();
        let set = setter!(builder.reload_handle());
        builder.init();
        set
    };
    Ok(from_env.is_none().then_some(set))
}

/// `ackgate check`: the config is loaded and valid; the files it names are checked as a start
/// checks them. Says what it checked on stdout, a problem on stderr (exit 2).
fn check(path: &Path, config: &ackgate::config::Config) -> std::process::ExitCode {
    // As `init_logs` reads it at a start (RUST_LOG, when set, wins there and is not checked).
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&config.server.log_level) {
        eprintln!("ackgate: {}: server.log_level: {e}", path.display());
        return std::process::ExitCode::from(2);
    }
    match ackgate::gateway::check_start(config) {
        Ok(_) => {
            let file = if path.exists() { path.display().to_string() } else { format!("{} (absent: all defaults)", path.display()) };
            println!(
                "ackgate check: {file} is valid (listen {}, backend {:?}, data_dir {})",
                config.server.listen,
                config.storage.backend,
                config.storage.data_dir.display()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ackgate: {}: {e:#}", path.display());
            std::process::ExitCode::from(2)
        }
    }
}

/// Installs the SIGINT and SIGTERM handlers at once and returns the future that resolves on
/// either. Installed before the gateway is built, not when the future is first polled: a SIGTERM
/// that arrived before that first poll (during the start, or between the listener being ready
/// and the poll) killed the process with the signal's default action.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    }
}

/// The fault suite's clock fault on Kafka (`loadtest chaos`): the gateway's wall clock steps by
/// the offset the file `ACKGATE_DEV_CLOCK_STEP_FILE` holds (`+30s`, `-12s`: libfaketime's
/// form), read every 200 ms, as an NTP step would move it. Not a setting: unset, nothing runs.
fn follow_clock_step_file() {
    let Some(path) = std::env::var_os("ACKGATE_DEV_CLOCK_STEP_FILE") else { return };
    tracing::warn!(file = %Path::new(&path).display(), "the wall clock follows a fault-injection step file (ACKGATE_DEV_CLOCK_STEP_FILE)");
    let step = move || {
        if let Some(secs) = std::fs::read_to_string(&path).ok().and_then(|text| ackgate::core::clock::parse_step_secs(&text)) {
            ackgate::core::clock::step_wall_clock(secs.saturating_mul(1000));
        }
    };
    step();
    let _ = std::thread::Builder::new().name("clock-step".into()).spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        step();
    });
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Openapi) => {
            print!("{}", ackgate::http::openapi::document());
            return std::process::ExitCode::SUCCESS;
        }
        Some(Command::ConfigTemplate { markdown }) => {
            print!("{}", if markdown { ackgate::config::template::markdown() } else { ackgate::config::template::toml() });
            return std::process::ExitCode::SUCCESS;
        }
        Some(Command::Check) | None => {}
    }
    // The default path may be absent (all defaults); an explicit one must exist.
    let required = cli.config != Path::new("config.toml");
    let config = match ackgate::config::Config::load(&cli.config, required, std::env::vars()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ackgate: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    if matches!(cli.command, Some(Command::Check)) {
        return check(&cli.config, &config);
    }
    let set_log_filter = match init_logs(config.server.log_format, &config.server.log_level) {
        Ok(set) => set,
        Err(e) => {
            eprintln!("ackgate: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    follow_clock_step_file();
    let config_file = ackgate::reload::ConfigFile { path: cli.config.clone(), required, set_log_filter };
    let mut stop = Box::pin(stop_signal());
    // SIGHUP reloads once the gateway serves; until then (a start can take long) it must not
    // end the process, as its default action would: a handler installed now keeps it from that.
    let _hangup_before_serving = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %cli.config.display(), backend = ?config.storage.backend, "ackgate starting");
    // A start can take long (a broker that does not answer, a large store to align): a signal
    // meanwhile stops it at once instead of after it.
    let built = tokio::select! {
        biased;
        _ = &mut stop => {
            tracing::info!("stopped while starting");
            return std::process::ExitCode::SUCCESS;
        }
        built = ackgate::Gateway::build(config) => built,
    };
    let gateway = match built {
        Ok(gateway) => gateway.reload_from(config_file),
        Err(e) => {
            tracing::error!("cannot start: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match gateway.run(stop).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("stopped with an error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// `allocator_defaults` names mimalloc's options by index; another mimalloc may number them
    /// differently, and a wrong index would set some other option without a word.
    #[test]
    fn the_allocator_option_indices_are_of_the_pinned_mimalloc() {
        let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).unwrap();
        assert!(
            lock.contains("name = \"libmimalloc-sys\"\nversion = \"0.1.49\"\n"),
            "libmimalloc-sys changed: check ARENA_EAGER_COMMIT and PURGE_DELAY in src/main.rs against its mimalloc.h, then this version"
        );
    }

    /// The constructor ran before this test (the test binary links it as the gateway does), and
    /// the values are mimalloc's: unless the environment sets them for this run.
    #[cfg(all(not(feature = "system-allocator"), target_os = "linux"))]
    #[test]
    fn the_allocator_defaults_are_set_before_main() {
        use super::allocator_defaults::{mi_option_get, ARENA_EAGER_COMMIT, PURGE_DELAY};
        for (option, env, value) in [(ARENA_EAGER_COMMIT, "MIMALLOC_ARENA_EAGER_COMMIT", 0), (PURGE_DELAY, "MIMALLOC_PURGE_DELAY", 100)] {
            if std::env::var_os(env).is_none() {
                // SAFETY: reads mimalloc's option table; a valid index.
                assert_eq!(unsafe { mi_option_get(option) }, value, "{env}");
            }
        }
    }
}
