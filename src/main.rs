//! The `sortie` command line: parses arguments and hands over to the io crate. No logic lives
//! here beyond wiring.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sortie_core::config::Config;
use sortie_io::serve::LogSettingError;

/// mimalloc (through the io crate's `Allocator`): the per-request path allocates and frees many
/// small buffers across threads; glibc malloc spent about 7% of the gateway's CPU under load
/// (perf/README.md), mimalloc less.
#[global_allocator]
static GLOBAL: sortie_io::alloc::Allocator = sortie_io::alloc::Allocator;

/// Sortie: an egress gateway that routes outbound HTTP/HTTPS work to egress workers.
#[derive(Parser)]
#[command(name = "sortie", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway: control plane plus local workers, in one process. Without --config it
    /// runs on its embedded defaults (loopback listeners, ./sortie-data, generated tokens).
    Serve {
        /// The configuration file (TOML).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Take over from the process running on the same data directory: serve on its
        /// listening sockets, then let it drain and exit (a binary upgrade without a dropped
        /// connection). The running process does this itself on SIGUSR2.
        #[arg(long)]
        upgrade: bool,
    },
    /// Run the control plane only: remote workers attach over the worker bus
    /// (`control.bus_listen`); no local worker is implied.
    Control {
        /// The configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Take over from the control running on the same data directory (see `serve
        /// --upgrade`).
        #[arg(long)]
        upgrade: bool,
    },
    /// Run a remote egress worker that dials its controls over the worker bus.
    Worker {
        /// The worker's configuration file (TOML, `[worker]` and `[egress]`).
        #[arg(long, short)]
        config: PathBuf,
        /// Take over from the worker running with the same configuration file: open every
        /// lane as its standby, then let it step back and drain (the running worker does this
        /// itself on SIGUSR2).
        #[arg(long)]
        upgrade: bool,
    },
    /// List the built-in browser fingerprint profiles; with --verify, run their loopback
    /// self-test (a local TLS + HTTP/2 capture server) and exit non-zero unless every profile
    /// reproduces its expected JA4, JA4_r, JA3N and Akamai strings.
    Fingerprints {
        /// Run the self-test.
        #[arg(long)]
        verify: bool,
        /// Run the capture server alone and print what each connection to it showed, one JSON
        /// object per line (fingerprint strings, ClientHello and HTTP/2 parameters): how a
        /// profile is recorded from a real client (scripts/record-profiles.py).
        #[arg(long, conflicts_with = "verify", requires = "ca_out")]
        capture: bool,
        /// With --capture: write the capture server's CA certificate (PEM) to this file.
        #[arg(long, value_name = "FILE")]
        ca_out: Option<PathBuf>,
        /// With --capture: offer only HTTP/1.1 by ALPN, so request header names arrive in
        /// plain text and in order.
        #[arg(long, requires = "capture")]
        http1: bool,
        /// With --capture: stop after this many connections, or after 60 s without one.
        #[arg(long, default_value_t = 1000, requires = "capture")]
        count: usize,
    },
    /// Validate a static configuration file (TOML) and exit non-zero with the key and reason.
    CheckConfig {
        /// The configuration file.
        file: PathBuf,
    },
    /// Validate a runtime snapshot file (JSON) with the exact messages the admin API gives.
    CheckSnapshot {
        /// The snapshot file (the body of `PUT /api/v1/admin/config`).
        file: PathBuf,
    },
}

/// Gives the memory mimalloc holds free on the calling thread back to the system: the cores
/// call it once their idle connections have settled after a busy period.
fn release_free_memory() {
    // SAFETY: `mi_collect` has no preconditions; it works on the calling thread's heap, which
    // exists on any thread that allocated.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(false);
    }
}

fn main() -> ExitCode {
    sortie_io::runtime::set_release_free_memory(release_free_memory);
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, upgrade } => serve(config, upgrade),
        Command::Control { config, upgrade } => control(&config, upgrade),
        Command::Worker { config, upgrade } => worker(&config, upgrade),
        Command::Fingerprints {
            capture: true,
            ca_out,
            http1,
            count,
            ..
        } => capture(ca_out, http1, count),
        Command::Fingerprints { verify, .. } => fingerprints(verify),
        Command::CheckConfig { file } => check_config(&file),
        Command::CheckSnapshot { file } => check_snapshot(&file),
    }
}

fn read(file: &PathBuf) -> Result<String, ExitCode> {
    std::fs::read_to_string(file).map_err(|e| {
        eprintln!("{}: {e}", file.display());
        ExitCode::from(2)
    })
}

fn check_config(file: &PathBuf) -> ExitCode {
    let text = match read(file) {
        Ok(t) => t,
        Err(code) => return code,
    };
    match Config::from_toml(&text) {
        Ok(c) => {
            println!(
                "{}: ok ({} deployment(s), {} worker(s), admin {}, object storage {}, store {})",
                file.display(),
                c.deployments.len(),
                c.workers.len(),
                if c.control.admin_listen.is_some() {
                    "enabled"
                } else {
                    "disabled"
                },
                if c.object_storage.enabled {
                    "enabled"
                } else {
                    "disabled"
                },
                match c.store.backend {
                    sortie_core::config::StoreBackend::Sqlite => "sqlite",
                    sortie_core::config::StoreBackend::Postgres => "postgres",
                },
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            ExitCode::from(1)
        }
    }
}

fn check_snapshot(file: &PathBuf) -> ExitCode {
    let mut bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    match sortie_core::snapshot::decode_snapshot(&mut bytes) {
        Ok(s) => {
            println!(
                "{}: ok ({} rule(s), {} pool(s), default_timeout_ms {})",
                file.display(),
                s.rules().len(),
                s.pools().len(),
                s.default_timeout_ms()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {} ({})", file.display(), e, e.http_status());
            ExitCode::from(1)
        }
    }
}

fn serve(path: Option<PathBuf>, upgrade: bool) -> ExitCode {
    let config = match &path {
        None => Config::embedded_default(),
        Some(p) => {
            let text = match read(p) {
                Ok(t) => t,
                Err(code) => return code,
            };
            match Config::from_toml(&text) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{}: {e}", p.display());
                    return ExitCode::from(1);
                }
            }
        }
    };
    run_control(config, path, Config::from_toml, upgrade)
}

fn control(path: &PathBuf, upgrade: bool) -> ExitCode {
    let text = match read(path) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let config = match Config::from_toml_control(&text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    run_control(
        config,
        Some(path.clone()),
        Config::from_toml_control,
        upgrade,
    )
}

/// `sortie serve` and `sortie control` once their configuration is read.
fn run_control(
    config: Config,
    path: Option<PathBuf>,
    parse: sortie_io::serve::ParseConfig,
    upgrade: bool,
) -> ExitCode {
    let log = match init_logging(&config.log) {
        Ok(reload) => reload,
        Err(e) => {
            eprintln!("sortie: {e}");
            return ExitCode::from(1);
        }
    };
    let start = sortie_io::serve::Start {
        config_path: path,
        parse,
        upgrade,
        log: Some(log),
    };
    match sortie_io::serve::run(config, start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sortie: {e}");
            ExitCode::from(1)
        }
    }
}

fn worker(path: &PathBuf, upgrade: bool) -> ExitCode {
    let text = match read(path) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let file = match sortie_core::config::WorkerFile::from_toml(&text) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    if let Err(e) = init_logging(&file.log) {
        eprintln!("sortie: {e}");
        return ExitCode::from(1);
    }
    // The profiles this worker may advertise are the ones its own self-test verifies.
    if sortie_io::egress::fingerprint::IS_BUILT {
        let ca = file.egress.ca_file.as_deref().map(std::path::Path::new);
        if let Err(e) = sortie_io::egress::fingerprint::verify_at_startup(ca) {
            eprintln!("sortie: fingerprint self-test could not run: {e}");
        }
    }
    let start = sortie_io::worker::Start {
        config_path: path.clone(),
        upgrade,
    };
    match sortie_io::worker::run(file, start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sortie: {e}");
            ExitCode::from(1)
        }
    }
}

fn fingerprints(verify: bool) -> ExitCode {
    use sortie_io::egress::fingerprint;
    if !fingerprint::IS_BUILT {
        println!("no built-in profiles: {}", fingerprint::UNAVAILABLE_REASON);
        return if verify {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        };
    }
    if !verify {
        // A long list, often piped into `head` or `grep`: a closed pipe ends it quietly.
        let _ = list_profiles(&mut std::io::stdout().lock());
        return ExitCode::SUCCESS;
    }
    let results = match fingerprint::self_test() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sortie: the self-test could not run: {e}");
            return ExitCode::from(1);
        }
    };
    let mut failed = 0;
    let mut unsupported = 0;
    for r in &results {
        if let Some(why) = r.unsupported() {
            println!("{}\tnot available: {why}", r.profile.name);
            unsupported += 1;
            continue;
        }
        let verdict = if r.is_pass() { "pass" } else { "FAIL" };
        println!("{}\t{verdict}", r.profile.name);
        if let Some(c) = &r.capture {
            // The strings as compared: a profile whose padding extension comes and goes
            // between connections is stated, and printed, without it.
            let tls = fingerprint::tls_strings(r.profile, c);
            println!("  JA4     {}", tls.ja4);
            println!("  JA4_r   {}", tls.ja4_r);
            println!("  JA3N    {}", tls.ja3n);
            if r.profile.tls.padding_varies {
                println!("  (TLS strings without the padding extension: it comes and goes)");
            }
            println!(
                "  Akamai  {}",
                c.akamai().unwrap_or_else(|| "no HTTP/2".into())
            );
        }
        for p in &r.problems {
            println!("  problem: {p}");
        }
        if !r.is_pass() {
            failed += 1;
        }
    }
    println!(
        "{} passed, {failed} failed",
        results.len() - failed - unsupported
    );
    if unsupported > 0 {
        println!("{unsupported} not available in this build (listed above with the reason)");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Every built-in profile with its aliases and expected strings.
fn list_profiles(out: &mut impl std::io::Write) -> std::io::Result<()> {
    use sortie_core::fingerprint::profile::PROFILES;
    for p in PROFILES {
        writeln!(out, "{}\t{}", p.name, p.browser)?;
        let aliases: Vec<&str> = p.all_aliases().collect();
        if !aliases.is_empty() {
            writeln!(out, "  aliases {}", aliases.join(", "))?;
        }
        if let Some(why) = p.unsupported {
            writeln!(out, "  not available in this build: {why}")?;
        }
        writeln!(out, "  JA4     {}", p.expected.ja4)?;
        writeln!(out, "  JA4_r   {}", p.expected.ja4_r)?;
        writeln!(out, "  JA3N    {}", p.expected.ja3n)?;
        writeln!(out, "  Akamai  {}", p.expected.akamai)?;
    }
    out.flush()
}

/// `sortie fingerprints --capture`: the capture server on loopback, one JSON line per
/// connection on stdout.
fn capture(ca_out: Option<PathBuf>, http1: bool, count: usize) -> ExitCode {
    use sortie_io::egress::fingerprint::capture::CaptureServer;
    use std::io::Write as _;
    let server = if http1 {
        CaptureServer::start_http1()
    } else {
        CaptureServer::start()
    };
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sortie: capture server: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(path) = &ca_out {
        if let Err(e) = std::fs::write(path, server.ca_pem()) {
            eprintln!("sortie: {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening {}", server.addr());
    let _ = out.flush();
    for _ in 0..count {
        match server.next(std::time::Duration::from_secs(60)) {
            Ok(c) => {
                let _ = writeln!(out, "{}", c.to_json());
            }
            Err(e) => {
                let _ = writeln!(out, "{}", serde_json::json!({ "error": e }));
                if e.starts_with("no connection") {
                    break;
                }
            }
        }
        let _ = out.flush();
    }
    ExitCode::SUCCESS
}

/// Logs go to stderr, as text or one JSON object per line (`log.format`, decision 107);
/// `RUST_LOG` filters them (default `info`; per-request lines are `sortie::request=debug`).
/// Errors in reading the configuration come before it, as plain lines.
/// The subscriber the log layers sit on: the registry under the reloadable filter.
type Filtered = tracing_subscriber::layer::Layered<
    tracing_subscriber::reload::Layer<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
    tracing_subscriber::Registry,
>;

/// The writer of log lines on stderr in `format`.
fn log_layer(
    format: sortie_core::config::LogFormat,
) -> Box<dyn tracing_subscriber::Layer<Filtered> + Send + Sync> {
    use tracing_subscriber::Layer as _;
    let base = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        sortie_core::config::LogFormat::Text => base
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        sortie_core::config::LogFormat::Json => base
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .boxed(),
    }
}

/// The filter of `log.level`, unless `RUST_LOG` is set (and valid), which takes precedence.
fn log_filter(level: &str) -> Result<tracing_subscriber::EnvFilter, LogSettingError> {
    if let Ok(f) = tracing_subscriber::EnvFilter::try_from_default_env() {
        return Ok(f);
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map_err(LogSettingError::refused(format!("log.level {level:?}")))
}

/// Sets up the process's log on stderr; the function a SIGHUP reload calls to change its level
/// and format (decision 114).
fn init_logging(
    log: &sortie_core::config::LogConfig,
) -> Result<sortie_io::serve::LogReload, LogSettingError> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let (filter, filter_handle) = tracing_subscriber::reload::Layer::new(log_filter(&log.level)?);
    let (layer, layer_handle) = tracing_subscriber::reload::Layer::new(log_layer(log.format));
    // A subscriber set already (never in this binary) keeps its place.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
    let format = std::sync::Mutex::new(log.format);
    Ok(Box::new(move |new: &sortie_core::config::LogConfig| {
        let filter = log_filter(&new.level)?;
        filter_handle
            .reload(filter)
            .map_err(LogSettingError::refused("log.level"))?;
        let mut current = format.lock().unwrap_or_else(|p| p.into_inner());
        if *current != new.format {
            layer_handle
                .reload(log_layer(new.format))
                .map_err(LogSettingError::refused("log.format"))?;
            *current = new.format;
        }
        Ok(())
    }))
}
