//! sortie-fixedrate: open-loop HTTP/1.1 load at a fixed request rate, for latency at a known load.
//!
//! Requests are scheduled at evenly spaced instants (rate R for T seconds) whether or not earlier
//! ones have finished, and sent over a fixed set of keep-alive connections, one request in flight
//! per connection (no pipelining), by one or a few event-loop threads that share the slots and
//! the connections. A request whose instant comes while every connection of its loop is busy
//! waits in a queue; that wait is reported as scheduler lag, so a run in which this client could
//! not keep the rate says so instead of reporting flattering numbers.
//!
//! Two latencies are kept per request: service latency (request written -> response complete),
//! which is the headline, and open-loop latency (scheduled instant -> response complete), which
//! adds any queueing in this client. Only loopback targets are accepted.
//!
//! The last line printed is machine-readable:
//! `FIXEDRATE_RESULT label=... rate=... sent=... ok=... errors=... achieved_rps=... p50_us=... ...`

mod args;
mod report;
mod response;
mod schedule;
mod sys;
mod worker;

use std::ffi::OsString;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use args::{Command, Host, Options, Target, USAGE};
use report::Summary;
use schedule::{Schedule, Share};
use worker::{Loop, Shared};

/// Time between the last thread's start and the first slot, so that the first slots do not
/// find threads still starting.
const START_DELAY: Duration = Duration::from_millis(50);
/// Reconnects allowed per connection over the run.
const RECONNECTS_PER_CONNECTION: usize = 10;
/// An event-loop thread needs little stack: its buffers are on the heap.
const THREAD_STACK_BYTES: usize = 256 * 1024;
/// The timer slack of the event loops. Measured at 27,000 req/s against nginx on a 2-core
/// machine, 5 s runs: 1 ns gave a scheduler lag p99 of 25-30 us for 3.05 s of CPU, 10 us gave
/// about 32 us for 2.74 s, and the default 50 us about 60 us for 2.43 s. Below 10 us the waits
/// end no sooner in practice (waking takes some microseconds anyway), while each exact deadline
/// costs a timer interrupt of its own.
const TIMER_SLACK_NS: u32 = 10_000;
/// The exit status of a usage error or of a target that cannot be reached.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let options = match parse_args(std::env::args_os().skip(1)) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(options)) => options,
        Err(message) => {
            eprintln!("{USAGE}\n\nsortie-fixedrate: error: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match run(&options) {
        Ok(summary) => {
            if let Some(line) = summary.errors_line() {
                eprintln!("{line}");
            }
            if let Some(line) = summary.warning_line() {
                eprintln!("{line}");
            }
            println!("{}", summary.result_line());
            if summary.ok > 0 && summary.error_count() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("fixedrate: {message}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn parse_args(args: impl Iterator<Item = OsString>) -> Result<Command, String> {
    let args = args
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| format!("argument {arg:?} is not UTF-8"))
        })
        .collect::<Result<Vec<String>, String>>()?;
    args::parse(args)
}

/// Connects, runs the schedule and merges what the event loops saw. An error means the run
/// could not start.
fn run(options: &Options) -> Result<Summary, String> {
    let target = options.proxy.as_ref().unwrap_or(&options.target);
    let addr = resolve(target)?;
    let describe = |e: std::io::Error| {
        format!(
            "cannot connect to {}:{}: {e}",
            target.host_text(),
            target.port
        )
    };
    let streams = (0..options.connections)
        .map(|_| worker::connect(addr).map_err(describe))
        .collect::<Result<Vec<TcpStream>, String>>()?;

    if let Err(e) = lower_timer_slack() {
        eprintln!(
            "fixedrate {}: cannot lower the timer slack ({e}); waits may end some 50 us late",
            options.label
        );
    }

    // The float-to-integer cast saturates; the bounds on rate and seconds keep it far below.
    let total = (options.rate * options.seconds) as u64;
    let shared = Arc::new(Shared {
        addr,
        request: options.request(),
        expect: options.expect.as_ref().map(|text| text.as_bytes().to_vec()),
        is_head: options.is_head(),
        max_reconnects: options.connections * RECONNECTS_PER_CONNECTION,
        reconnects: AtomicUsize::new(0),
        schedule: OnceLock::new(),
        ready: Barrier::new(options.threads + 1),
    });

    // Loop t gets connections t, t + n, t + 2n, ... and the slots of the same pattern, so that
    // every loop has the same share of both (the arguments allow no more loops than
    // connections).
    let mut shares: Vec<Vec<TcpStream>> = (0..options.threads).map(|_| Vec::new()).collect();
    for (i, stream) in streams.into_iter().enumerate() {
        if let Some(mine) = shares.get_mut(i % options.threads) {
            mine.push(stream);
        }
    }
    let loops = u64::try_from(options.threads).unwrap_or(1);
    let mut loops_built = Vec::with_capacity(options.threads);
    for (t, mine) in (0u64..).zip(shares) {
        let built = Loop::new(Arc::clone(&shared), Share::new(t, loops, total), mine)
            .map_err(|e| format!("cannot set up event loop {t}: {e}"))?;
        loops_built.push(built);
    }

    let mut threads = Vec::with_capacity(loops_built.len());
    for (i, event_loop) in loops_built.into_iter().enumerate() {
        let spawned = thread::Builder::new()
            .name(format!("loop-{i}"))
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || event_loop.run());
        match spawned {
            Ok(handle) => threads.push(handle),
            Err(e) => {
                // The threads already started wait at the barrier for ever; ending the
                // process ends them.
                eprintln!("fixedrate: cannot start event-loop thread {i}: {e}");
                std::process::exit(i32::from(EXIT_USAGE));
            }
        }
    }
    let schedule = Schedule::new(Instant::now() + START_DELAY, options.rate, total);
    let start = schedule.start();
    // The schedule is set once, here, before the barrier releases anyone to read it.
    let _ = shared.schedule.set(schedule);
    shared.ready.wait();

    let mut tallies = Vec::with_capacity(threads.len());
    let mut panicked = 0;
    for handle in threads {
        match handle.join() {
            Ok(tally) => tallies.push(tally),
            Err(_) => panicked += 1,
        }
    }
    let elapsed = Instant::now().saturating_duration_since(start);

    let mut summary = Summary::merge(tallies, total);
    if panicked > 0 {
        *summary
            .errors
            .entry("event-loop thread panicked".to_owned())
            .or_default() += panicked;
    }
    summary.label.clone_from(&options.label);
    summary.rate = options.rate;
    summary.seconds = options.seconds;
    summary.connections = options.connections;
    summary.elapsed = elapsed;
    summary.reconnects = shared.reconnects.load(Ordering::Relaxed);
    Ok(summary)
}

/// The address to connect to; every address `localhost` resolves to must be loopback.
fn resolve(target: &Target) -> Result<SocketAddr, String> {
    match target.host {
        Host::Loopback(ip) => Ok(SocketAddr::new(ip, target.port)),
        Host::Localhost => {
            let addrs: Vec<SocketAddr> = ("localhost", target.port)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve localhost: {e}"))?
                .collect();
            if let Some(other) = addrs.iter().find(|addr| !addr.ip().is_loopback()) {
                return Err(format!("refusing localhost: it resolves to {}", other.ip()));
            }
            addrs
                .first()
                .copied()
                .ok_or_else(|| "localhost resolves to nothing".to_owned())
        }
    }
}

/// Lowers this thread's timer slack to `TIMER_SLACK_NS`; threads started afterwards inherit it.
/// Linux lets a timed wait end up to the slack (50 us by default) after its deadline so that it
/// can batch wakeups; at tens of thousands of requests per second that would be most of the gap
/// between two slots. `/proc/self` is the thread-group leader, which is this (the main) thread.
fn lower_timer_slack() -> std::io::Result<()> {
    std::fs::write("/proc/self/timerslack_ns", TIMER_SLACK_NS.to_string())
}
