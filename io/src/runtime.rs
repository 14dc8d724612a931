//! Thread per core: N pinned threads, each running its own monoio runtime (io_uring, with the
//! epoll driver as fallback) and owning its own `SO_REUSEPORT` listeners. A connection lives and
//! dies on the core that accepted it.
//!
//! Listeners are bound in the main thread so that bind errors surface at startup. A panic on a
//! core thread exits the process with status 70 (decision 041); `contain_panic` is its one
//! exception, for untrusted bytes handed to code we do not control (BoringSSL's certificate
//! decompressors). `MONOIO_FORCE_LEGACY_DRIVER=1` selects the epoll driver.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::JoinHandle;

use socket2::{Domain, Protocol, Socket, Type};

/// Backlog of every listener.
pub const LISTEN_BACKLOG: i32 = 4096;
/// io_uring submission queue entries per core.
const URING_ENTRIES: u32 = 4096;
/// Name prefix of the core threads; the panic policy recognises them by it.
const CORE_THREAD_PREFIX: &str = "sortie-core-";
/// Exit status of a process stopped by a panic on a core thread (`EX_SOFTWARE`, sysexits.h).
pub const CORE_PANIC_EXIT_CODE: i32 = 70;

/// Which monoio driver the cores run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// io_uring.
    IoUring,
    /// The epoll ("legacy") driver.
    Legacy,
}

impl Driver {
    /// The driver this process will use: io_uring when the kernel offers it and
    /// `MONOIO_FORCE_LEGACY_DRIVER` is not set, else epoll.
    pub fn detect() -> Driver {
        let forced = std::env::var_os("MONOIO_FORCE_LEGACY_DRIVER").is_some_and(|v| v != "0");
        if !forced && monoio::utils::detect_uring() {
            Driver::IoUring
        } else {
            Driver::Legacy
        }
    }

    /// A short name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::IoUring => "io_uring",
            Driver::Legacy => "epoll",
        }
    }
}

static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// How the process's allocator gives memory it holds free back to the system, if the binary
/// (which chooses the allocator) says: see [`set_release_free_memory`].
static RELEASE_FREE_MEMORY: OnceLock<fn()> = OnceLock::new();

/// Sets what a core calls to give the memory its allocator holds free back to the system: the
/// calling thread's part of it (mimalloc's `mi_collect`, for example). A core calls it when
/// its idle connections have settled after a busy period, so that memory a burst used does
/// not stay resident while nothing happens. The first call wins; without one, nothing is done.
pub fn set_release_free_memory(release: fn()) {
    let _ = RELEASE_FREE_MEMORY.set(release);
}

/// Runs the function given to [`set_release_free_memory`], if any, on this thread.
pub(crate) fn release_free_memory() {
    if let Some(release) = RELEASE_FREE_MEMORY.get() {
        release();
    }
}

/// The number of hot cores for `control.cores` (0 = every available CPU).
pub fn core_count(configured: u32) -> usize {
    match configured {
        0 => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n as usize,
    }
}

/// Binds `n` listening sockets to the same address with `SO_REUSEPORT`, so that the kernel
/// spreads connections over the cores. Port 0 is resolved once by the first socket and reused by
/// the others. Returns the sockets (non-blocking) and the bound address.
pub fn bind_reuseport(
    addr: SocketAddr,
    n: usize,
) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let mut out = Vec::with_capacity(n);
    let mut bound = addr;
    for _ in 0..n.max(1) {
        let sock = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        sock.set_reuse_address(true)?;
        sock.set_reuse_port(true)?;
        if bound.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        sock.set_nonblocking(true)?;
        sock.bind(&bound.into())?;
        sock.listen(LISTEN_BACKLOG)?;
        if bound.port() == 0 {
            bound = sock
                .local_addr()?
                .as_socket()
                .ok_or_else(|| io::Error::other("listener has no inet address"))?;
        }
        out.push(sock.into());
    }
    Ok((out, bound))
}

/// What each core's entry future receives.
pub struct CoreContext {
    /// Index of this core, 0-based.
    pub index: usize,
    /// Total number of cores.
    pub count: usize,
}

/// Starts `n` core threads named `sortie-core-<i>`, each pinned to a CPU (round robin) and
/// running `entry(ctx)` on a fresh monoio runtime until it completes.
pub fn spawn_cores<F, Fut>(n: usize, entry: F) -> io::Result<Vec<JoinHandle<()>>>
where
    F: Fn(CoreContext) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let driver = Driver::detect();
    if driver == Driver::Legacy && !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!("io_uring unavailable or disabled: using the epoll driver");
    }
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut handles = Vec::with_capacity(n);
    for index in 0..n {
        let entry = entry.clone();
        let h = std::thread::Builder::new()
            .name(format!("{CORE_THREAD_PREFIX}{index}"))
            .spawn(move || {
                if let Err(e) = monoio::utils::bind_to_cpu_set([index % cpus]) {
                    tracing::debug!(core = index, error = ?e, "could not pin core thread");
                }
                let ctx = CoreContext { index, count: n };
                run_on(driver, entry(ctx));
            })?;
        handles.push(h);
    }
    Ok(handles)
}

/// Installs the process's panic policy (decision 041): a panic on a core thread stops the
/// whole process at once with [`CORE_PANIC_EXIT_CODE`], after the standard panic message and
/// an error log line. A core that died would leave its listeners' accept queues, its pooled
/// connections and its share of the requests to nobody while the process looked alive; a
/// supervisor (systemd, Kubernetes) restarts a process that exits. Panics on other threads
/// are left to their owners (the cold thread catches a store operation's panic and fails
/// that call). Call once, before the cores start.
pub fn exit_on_core_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if CONTAINING.with(Cell::get) > 0 {
            // Inside `contain_panic`: that call fails, the process goes on.
            return;
        }
        let thread = std::thread::current();
        let Some(name) = thread.name().filter(|n| n.starts_with(CORE_THREAD_PREFIX)) else {
            return;
        };
        tracing::error!(
            thread = name,
            exit_code = CORE_PANIC_EXIT_CODE,
            "a core thread panicked: stopping the process"
        );
        std::process::exit(CORE_PANIC_EXIT_CODE);
    }));
}

thread_local! {
    /// How many `contain_panic` calls this thread is inside.
    static CONTAINING: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`, turning a panic inside it into an error naming `what`: for untrusted input handed
/// to a library we do not control, called from C (BoringSSL's certificate decompression
/// callbacks, where unwinding must not cross the boundary) or on a thread that must outlive
/// one bad job. The panic is reported as usual, but the panic policy does not stop the
/// process for it (decision 041).
pub fn contain_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    CONTAINING.with(|c| c.set(c.get() + 1));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(c.get().saturating_sub(1)));
    r.map_err(|_| format!("{what} panicked"))
}

type UringRuntime = monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>>;

/// A core's io_uring runtime with the ring made by `urb`.
fn uring_runtime(urb: io_uring::Builder) -> std::io::Result<UringRuntime> {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(URING_ENTRIES)
        .uring_builder(urb)
        .enable_timer()
        .build()
}

/// `make()`'s future, pinned in a new box. The box is allocated first and the future built
/// straight into it (`Box::new(make())` builds it on the stack and then copies it, which for
/// the few-kilobyte future of a request is a large share of the request's user time).
#[inline(always)]
pub(crate) fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// Runs a future to completion on a new runtime of the given driver, on this thread.
pub fn run_on<Fut: Future<Output = ()>>(driver: Driver, fut: Fut) {
    // The coarse timers of a runtime that ran on this thread before are not this one's.
    crate::timer::reset();
    match driver {
        Driver::IoUring => {
            // Completions are delivered without interrupting the thread (decision 120); a kernel
            // before 5.19 refuses the flag, and the ring is made without it.
            let mut coop = io_uring::IoUring::builder();
            coop.setup_coop_taskrun();
            let built = uring_runtime(coop).or_else(|e| {
                tracing::warn!(error = %e, "io_uring refused COOP_TASKRUN: completions will interrupt the core thread");
                uring_runtime(io_uring::IoUring::builder())
            });
            match built {
                Ok(mut rt) => rt.block_on(fut),
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring runtime failed to start: using epoll");
                    run_on(Driver::Legacy, fut)
                }
            }
        }
        Driver::Legacy => {
            match monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
            {
                Ok(mut rt) => rt.block_on(fut),
                Err(e) => tracing::error!(error = %e, "epoll runtime failed to start"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic inside `contain_panic` on a core thread fails that call and leaves the thread
    /// (and the process, under the panic policy) running; outside it the policy would exit.
    #[test]
    fn a_contained_panic_on_a_core_thread_fails_only_its_call() {
        exit_on_core_panic();
        let t = std::thread::Builder::new()
            .name(format!("{CORE_THREAD_PREFIX}-test"))
            .spawn(|| {
                let r: Result<(), String> =
                    contain_panic("the decoder", || panic!("a decoder bug on hostile input"));
                let after = contain_panic("the decoder", || 7);
                (r, after)
            })
            .unwrap();
        let (r, after) = t.join().expect("the thread survived");
        assert_eq!(r, Err("the decoder panicked".to_string()));
        assert_eq!(after, Ok(7));
    }

    /// Decision 120: this kernel makes rings with `COOP_TASKRUN`, and on such a ring a wake from
    /// another thread reaches a sleeping core and a receive that had to wait completes.
    #[test]
    fn cooperative_ring_wakes_a_sleeping_core_and_completes_waiting_receives() {
        use monoio::io::AsyncReadRent;
        use std::io::Write;
        let mut coop = io_uring::IoUring::builder();
        coop.setup_coop_taskrun();
        let mut rt = uring_runtime(coop)
            .expect("a kernel with io_uring 5.19 or later makes a ring with COOP_TASKRUN");
        rt.block_on(async {
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, rx) = futures_channel::oneshot::channel::<()>();
            // The pauses make the case under test, they wait for nothing: the core is asleep
            // when the wake arrives, and its receive is posted before the bytes. Shorter ones
            // would only test less.
            let client = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                tx.send(()).unwrap();
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                s.write_all(b"ping").unwrap();
                s
            });
            rx.await.expect("the other thread's wake arrives");
            let (mut conn, _) = listener.accept().await.unwrap();
            let (n, buf) = conn.read(vec![0u8; 16]).await;
            assert_eq!(&buf[..n.unwrap()], b"ping");
            drop(client.join().unwrap());
        });
    }

    #[test]
    fn reuseport_binds_one_port_for_all_cores() {
        let (ls, addr) = bind_reuseport("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(ls.len(), 3);
        assert_ne!(addr.port(), 0);
        for l in &ls {
            assert_eq!(l.local_addr().unwrap(), addr);
        }
    }

    #[test]
    fn cores_run_and_finish() {
        let (tx, rx) = std::sync::mpsc::channel();
        let hs = spawn_cores(2, move |ctx| {
            let tx = tx.clone();
            async move {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                let _ = tx.send(ctx.index);
            }
        })
        .unwrap();
        for h in hs {
            h.join().unwrap();
        }
        let mut got: Vec<usize> = rx.try_iter().collect();
        got.sort();
        assert_eq!(got, vec![0, 1]);
    }
}
