//! What a service manager (systemd) gives and expects: listening sockets it passes (socket
//! activation, `LISTEN_FDS`), and the notifications it waits for (`READY=1` once every
//! listener is bound and the cores serve, `STOPPING=1` when the drain begins, `WATCHDOG=1`
//! while every core keeps turning). Each part does nothing when the process was not started
//! that way (decision 112).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

/// The listening sockets passed to this process, until each is taken by the listener it
/// stands for.
#[derive(Default)]
pub struct Activated {
    sockets: Vec<(String, std::net::TcpListener, SocketAddr)>,
}

impl Activated {
    /// The sockets passed by the service manager (none without socket activation). A passed
    /// descriptor that is not a listening TCP socket is logged and left alone.
    pub fn from_env() -> Activated {
        let fds = match sd_notify::listen_fds_with_names() {
            Ok(fds) => fds,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the sockets passed by the service manager");
                return Activated::default();
            }
        };
        let mut sockets = Vec::new();
        for (fd, name) in fds {
            match crate::fd::adopt_listener(fd).and_then(|l| {
                let addr = l.local_addr()?;
                Ok((l, addr))
            }) {
                Ok((l, addr)) => sockets.push((name, l, addr)),
                Err(e) => tracing::warn!(fd, name, error = %e, "a passed socket is not used"),
            }
        }
        Activated { sockets }
    }

    /// The passed socket for the listener `name` (`api`, `admin`, `proxy`, `bus`): the one of
    /// that name (`FileDescriptorName=`), else an unnamed one bound to `addr`.
    pub fn take(
        &mut self,
        name: &str,
        addr: SocketAddr,
    ) -> Option<(std::net::TcpListener, SocketAddr)> {
        let i = self
            .sockets
            .iter()
            .position(|(n, _, _)| n == name)
            .or_else(|| {
                self.sockets
                    .iter()
                    .position(|(n, _, a)| (n.is_empty() || n == "unknown") && *a == addr)
            })?;
        let (_, l, a) = self.sockets.swap_remove(i);
        Some((l, a))
    }

    /// Logs the passed sockets no listener took; they are closed.
    pub fn finish(self) {
        for (name, _, addr) in self.sockets {
            tracing::warn!(
                name,
                %addr,
                "a socket passed by the service manager matches no listener; it is closed"
            );
        }
    }
}

/// One passed listening socket for each of `n` cores: the socket and `n - 1` duplicates of
/// it, non-blocking. The cores accept from one queue (the socket is not `SO_REUSEPORT`-split).
pub fn per_core(
    listener: std::net::TcpListener,
    n: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    listener.set_nonblocking(true)?;
    let mut out = Vec::with_capacity(n.max(1));
    for _ in 1..n.max(1) {
        out.push(listener.try_clone()?);
    }
    out.push(listener);
    Ok(out)
}

/// Tells the service manager the process serves; `status` is shown by `systemctl status`.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager that process `pid` is the service's main process from now on (a
/// binary upgrade's successor, decision 115). Sent by the current main process, which the
/// manager listens to under the default `NotifyAccess=main`.
pub fn main_pid(pid: u32) {
    notify(&[NotifyState::MainPid(pid)]);
}

/// Tells the service manager the process is reloading its configuration (`ready` follows).
pub fn reloading() {
    notify(&[NotifyState::Reloading]);
}

/// Tells the service manager the process is stopping (the drain began).
pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// The turns of each core: a task on every core stamps its slot every [`BEAT`], and the
/// watchdog pings the service manager only while every slot is fresh, so a core stuck in a
/// loop or a blocking call gets the process restarted.
pub struct CoreBeats {
    started: Instant,
    slots: Box<[AtomicU64]>,
}

/// How often each core stamps its slot.
pub const BEAT: Duration = Duration::from_millis(500);

impl CoreBeats {
    /// Slots for `n` cores, all fresh.
    pub fn new(n: usize) -> Arc<CoreBeats> {
        Arc::new(CoreBeats {
            started: Instant::now(),
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Stamps core `i`'s slot.
    pub fn beat(&self, i: usize) {
        if let Some(s) = self.slots.get(i) {
            s.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Whether every core stamped its slot within `within`.
    fn all_within(&self, within: Duration) -> bool {
        let now = self.now_ms();
        let bound = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        self.slots
            .iter()
            .all(|s| now.saturating_sub(s.load(Ordering::Relaxed)) <= bound)
    }

    /// The task core `i` runs: stamps its slot every [`BEAT`] while the core turns.
    pub async fn run(self: Arc<Self>, i: usize) {
        loop {
            self.beat(i);
            monoio::time::sleep(BEAT).await;
        }
    }
}

/// The watchdog's thread, when the service manager asked for one (`WatchdogSec=`).
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts pinging at half the interval the service manager set, while every core's slot in
    /// `beats` is fresher than that interval; `None` without a watchdog.
    pub fn start(beats: Arc<CoreBeats>) -> Option<Watchdog> {
        let interval = sd_notify::watchdog_enabled()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let every = (interval / 2).max(Duration::from_millis(10));
        // A core may miss a beat or two under load; one that missed the whole interval is
        // stuck.
        let fresh = interval.max(BEAT * 3);
        let thread = std::thread::Builder::new()
            .name("sortie-watchdog".into())
            .spawn(move || {
                let mut was_stuck = false;
                while !stopping.load(Ordering::Acquire) {
                    if beats.all_within(fresh) {
                        notify(&[NotifyState::Watchdog]);
                        was_stuck = false;
                    } else if !was_stuck {
                        tracing::error!(
                            "a core has not turned for {} ms: the watchdog is not fed",
                            fresh.as_millis()
                        );
                        was_stuck = true;
                    }
                    std::thread::park_timeout(every);
                }
            })
            .ok()?;
        Some(Watchdog {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops pinging (the process is stopping; the manager's stop timeout applies now).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_is_fed_only_while_every_core_beats() {
        let beats = CoreBeats::new(2);
        beats.beat(0);
        beats.beat(1);
        assert!(beats.all_within(Duration::from_millis(20)));
        std::thread::sleep(Duration::from_millis(60));
        beats.beat(0);
        assert!(
            !beats.all_within(Duration::from_millis(20)),
            "core 1 is stuck"
        );
        beats.beat(1);
        assert!(beats.all_within(Duration::from_millis(20)));
        // A core index out of range changes nothing.
        beats.beat(7);
    }
}
