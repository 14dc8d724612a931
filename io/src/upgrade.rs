//! Binary upgrade without a dropped connection (decision 115): the running process hands its
//! listening sockets to a successor, which then serves from the same sockets while the running
//! process drains and exits.
//!
//! The running process listens on a Unix socket in its data directory ([`SOCKET_FILE`], mode
//! 0600, peers of another user refused). A successor (`sortie serve|control --upgrade`, or the
//! one the running process starts itself on `SIGUSR2`) connects and receives duplicates of every
//! listening socket (`SCM_RIGHTS`) with a manifest that names them. It binds nothing: both
//! processes accept from the same sockets, so no connection waiting in a queue is lost. Once the
//! successor's cores run, it says `ready`; the running process hands the service manager the new
//! main pid, answers `ok`, stops accepting and drains.
//!
//! The exchange, in lines of text:
//!
//! ```text
//! successor:    sortie-upgrade 1
//! predecessor:  listener <name> <address> <count>    (with <count> descriptors), repeated
//! predecessor:  end                                  (or: error <reason>)
//! successor:    bus-ready                            (a control with a bus listener)
//! predecessor:  workers <id> <id> ...
//! successor:    ready
//! predecessor:  ok
//! ```
//!
//! `bus-ready` moves the remote workers first: the predecessor stops accepting on the bus and
//! says `GoAway` on its lanes, listing the workers it had; they dial again and reach the
//! successor, which opens its HTTP listeners once they registered (or a bound passed), while
//! the predecessor still serves requests on its own lanes.

use std::collections::VecDeque;
use std::io::{self, BufRead as _, BufReader, IoSlice, IoSliceMut, Read as _, Write as _};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The hand-over socket's file name in the data directory.
pub const SOCKET_FILE: &str = "upgrade.sock";
/// The successor's first line.
const GREETING: &str = "sortie-upgrade 1";
/// Descriptors per message: below the kernel's `SCM_MAX_FD` (253).
const MAX_FDS_PER_MESSAGE: usize = 200;
/// How long the successor may take from receiving the sockets to `ready`: its cores start, TLS
/// files and the store open before that.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Reads and writes of one step of the exchange.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest manifest a successor accepts.
const MAX_MANIFEST_BYTES: usize = 64 * 1024;

/// A failed hand-over, with what happened.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// No running process listens on the hand-over socket (for a worker, the socket named
    /// after its configuration file).
    #[error("no running process to upgrade at {path}: {source}")]
    NoPredecessor {
        /// The socket's path.
        path: PathBuf,
        /// Why the connection failed.
        source: io::Error,
    },
    /// The exchange failed.
    #[error("the hand-over failed: {0}")]
    Exchange(String),
}

/// Why one hand-over to a successor failed, on the side of the process that hands over; it
/// keeps serving and logs this.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// Reading, writing or passing descriptors on the connection failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer's credentials could not be read.
    #[error("peer credentials: {0}")]
    Credentials(#[from] rustix::io::Errno),
    /// The peer runs as another user.
    #[error("process {0} runs as another user")]
    OtherUser(u32),
    /// The peer's first line was not the greeting of this exchange.
    #[error("process {0} sent an unknown request")]
    UnknownRequest(u32),
    /// This process is stopping and has nothing to offer.
    #[error("process {0} asked while this process stops")]
    Stopping(u32),
    /// The peer answered something else than `ready`.
    #[error("process {pid} answered {line:?} instead of ready")]
    NotReady {
        /// The peer.
        pid: u32,
        /// What it said.
        line: String,
    },
    /// The peer closed the connection.
    #[error("the other process closed the connection")]
    Closed,
    /// The peer sent a line that is not UTF-8.
    #[error("a line that is not UTF-8")]
    NotUtf8,
}

fn exchange(what: impl std::fmt::Display) -> UpgradeError {
    UpgradeError::Exchange(what.to_string())
}

/// One listener's sockets: its name (`api`, `admin`, `proxy`, `bus`), its address, and one
/// socket per core of the process that bound it.
pub struct Offered {
    /// The listener's name.
    pub name: &'static str,
    /// Its bound address.
    pub addr: SocketAddr,
    /// Duplicates of its sockets.
    pub fds: Vec<OwnedFd>,
}

/// The running process's side: the hand-over socket and the duplicates it offers.
pub struct Handover {
    path: PathBuf,
    offer: Arc<Mutex<Option<Vec<Offered>>>>,
    successor: Arc<OnceLock<u32>>,
}

/// What the running process does at the steps of a hand-over.
pub struct Hooks {
    /// At `bus-ready`: stop accepting on the bus, say `GoAway` on every lane, and return the
    /// ids of the remote workers connected.
    pub move_workers: Box<dyn Fn() -> Vec<String> + Send>,
    /// Once a successor said `ready`, with its pid.
    pub handed_over: Box<dyn Fn(u32) + Send>,
}

impl Handover {
    /// Listens on `data_dir`'s hand-over socket (replacing a stale file) and serves successors
    /// on a thread of its own, calling `hooks` at their steps.
    pub fn listen(data_dir: &Path, offer: Vec<Offered>, hooks: Hooks) -> io::Result<Handover> {
        let path = data_dir.join(SOCKET_FILE);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let offer = Arc::new(Mutex::new(Some(offer)));
        let successor = Arc::new(OnceLock::new());
        let (o, s) = (offer.clone(), successor.clone());
        std::thread::Builder::new()
            .name("sortie-handover".into())
            .spawn(move || serve(&listener, &o, &s, &hooks))?;
        Ok(Handover {
            path,
            offer,
            successor,
        })
    }

    /// The successor's pid, once a hand-over completed.
    pub fn successor(&self) -> Option<u32> {
        self.successor.get().copied()
    }

    /// The process stops without a successor: the offered duplicates close (so that new
    /// connections are refused at once rather than queued for nobody) and the socket file goes.
    pub fn withdraw(&self) {
        let offer = self
            .offer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(offer);
        if self.successor.get().is_none() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Serves successors one at a time until one completes the hand-over.
fn serve(
    listener: &UnixListener,
    offer: &Mutex<Option<Vec<Offered>>>,
    successor: &OnceLock<u32>,
    hooks: &Hooks,
) {
    for conn in listener.incoming() {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "hand-over socket: accept failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match hand_over(&mut conn, offer, &*hooks.move_workers) {
            Ok(pid) => {
                let _ = successor.set(pid);
                crate::systemd::main_pid(pid);
                let _ = conn.write_all(b"ok\n");
                tracing::info!(
                    successor = pid,
                    "binary upgrade: handed over to process {pid}; draining"
                );
                (hooks.handed_over)(pid);
                return;
            }
            Err(e) => tracing::warn!(
                error = %e,
                "binary upgrade refused or failed; this process keeps serving"
            ),
        }
    }
}

/// One successor: checks who it is, sends the sockets, waits for `ready`; the successor's pid.
fn hand_over(
    conn: &mut UnixStream,
    offer: &Mutex<Option<Vec<Offered>>>,
    move_workers: &dyn Fn() -> Vec<String>,
) -> Result<u32, HandoverError> {
    let (pid, mut reader) = greeted(conn, GREETING)?;
    {
        let guard = offer.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(listeners) = guard.as_ref() else {
            let _ = conn.write_all(b"error stopping\n");
            return Err(HandoverError::Stopping(pid));
        };
        for l in listeners {
            for chunk in l.fds.chunks(MAX_FDS_PER_MESSAGE) {
                let line = format!("listener {} {} {}\n", l.name, l.addr, chunk.len());
                send_fds(conn, line.as_bytes(), chunk)?;
            }
        }
    }
    conn.write_all(b"end\n")?;
    conn.set_read_timeout(Some(READY_TIMEOUT))?;
    let mut has_moved_workers = false;
    loop {
        match read_line(&mut reader)?.as_str() {
            "ready" => return Ok(pid),
            "bus-ready" if !has_moved_workers => {
                has_moved_workers = true;
                let ids = move_workers();
                tracing::info!(
                    successor = pid,
                    workers = ids.len(),
                    "binary upgrade: the bus moves to the successor; its workers dial it"
                );
                let line = format!("workers {}\n", ids.join(" "));
                conn.write_all(line.as_bytes())?;
            }
            other => {
                return Err(HandoverError::NotReady {
                    pid,
                    line: other.to_string(),
                })
            }
        }
    }
}

/// The running process's first step with a successor: the step timeouts, the peer's user
/// (this process's), and its greeting; the peer's pid and a reader on the connection.
fn greeted(
    conn: &mut UnixStream,
    greeting: &str,
) -> Result<(u32, BufReader<UnixStream>), HandoverError> {
    conn.set_read_timeout(Some(STEP_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(STEP_TIMEOUT)))?;
    let peer = rustix::net::sockopt::socket_peercred(conn.as_fd())?;
    let pid = peer.pid.as_raw_nonzero().get().unsigned_abs();
    if peer.uid != rustix::process::getuid() {
        return Err(HandoverError::OtherUser(pid));
    }
    let mut reader = BufReader::new(conn.try_clone()?);
    if read_line(&mut reader)? != greeting {
        let _ = conn.write_all(b"error unknown request\n");
        return Err(HandoverError::UnknownRequest(pid));
    }
    Ok((pid, reader))
}

/// The successor's first step: the step timeouts, then its greeting.
fn greet(conn: &mut UnixStream, greeting: &str) -> Result<(), UpgradeError> {
    conn.set_read_timeout(Some(STEP_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(STEP_TIMEOUT)))
        .map_err(exchange)?;
    conn.write_all(format!("{greeting}\n").as_bytes())
        .map_err(exchange)
}

/// Reads one line of at most 256 bytes, without its end.
fn read_line(reader: &mut BufReader<UnixStream>) -> Result<String, HandoverError> {
    let mut line = Vec::new();
    let n = reader.by_ref().take(256).read_until(b'\n', &mut line)?;
    if n == 0 || line.pop() != Some(b'\n') {
        return Err(HandoverError::Closed);
    }
    String::from_utf8(line).map_err(|_| HandoverError::NotUtf8)
}

/// Sends `data` with the descriptors `fds` attached.
fn send_fds(conn: &UnixStream, data: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space =
        vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("the descriptors do not fit their buffer"));
    }
    let sent = rustix::net::sendmsg(
        conn.as_fd(),
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != data.len() {
        // Only the first byte carries the descriptors; the rest of the line follows.
        (&*conn).write_all(data.get(sent..).unwrap_or_default())?;
    }
    Ok(())
}

/// The successor's side: the sockets received, until each is taken by its listener, and the
/// connection on which it says `ready`.
pub struct Successor {
    conn: UnixStream,
    listeners: Vec<(String, SocketAddr, Vec<TcpListener>)>,
}

impl Successor {
    /// Asks the process running on `data_dir` for its listening sockets.
    pub fn connect(data_dir: &Path) -> Result<Successor, UpgradeError> {
        let path = data_dir.join(SOCKET_FILE);
        let mut conn = UnixStream::connect(&path)
            .map_err(|source| UpgradeError::NoPredecessor { path, source })?;
        greet(&mut conn, GREETING)?;
        let (text, fds) = receive_manifest(&conn)?;
        let listeners = parse_manifest(&text, fds)?;
        Ok(Successor { conn, listeners })
    }

    /// The sockets received for the listener `name`, with their address.
    pub fn take(&mut self, name: &str) -> Option<(Vec<TcpListener>, SocketAddr)> {
        let i = self.listeners.iter().position(|(n, _, _)| n == name)?;
        let (_, addr, socks) = self.listeners.swap_remove(i);
        Some((socks, addr))
    }

    /// Asks the predecessor to move its remote workers to this process's bus (it stops
    /// accepting there and says `GoAway` on its lanes); the ids of the workers it had.
    pub fn move_workers(&mut self) -> Result<Vec<String>, UpgradeError> {
        self.conn.write_all(b"bus-ready\n").map_err(exchange)?;
        let mut reader = BufReader::new(&self.conn);
        let mut line = String::new();
        (&mut reader)
            .take(MAX_MANIFEST_BYTES as u64)
            .read_line(&mut line)
            .map_err(exchange)?;
        let ids = line.trim_end().strip_prefix("workers").ok_or_else(|| {
            exchange(format!(
                "the running process answered {line:?} to bus-ready"
            ))
        })?;
        Ok(ids.split_whitespace().map(str::to_owned).collect())
    }

    /// Says `ready` and waits for the predecessor's `ok`: from then on it drains and this
    /// process is the service. Sockets no listener took are logged and closed here (the
    /// predecessor's copies close when it exits).
    pub fn ready(mut self) -> Result<(), UpgradeError> {
        for (name, addr, _) in self.listeners.drain(..) {
            tracing::warn!(
                name,
                %addr,
                "the running process's listener is not in this configuration: it closes when that process exits"
            );
        }
        self.conn.write_all(b"ready\n").map_err(exchange)?;
        self.conn
            .set_read_timeout(Some(STEP_TIMEOUT))
            .map_err(exchange)?;
        let mut reader = BufReader::new(&self.conn);
        let mut line = String::new();
        (&mut reader)
            .take(256)
            .read_line(&mut line)
            .map_err(exchange)?;
        if line.trim_end() != "ok" {
            return Err(exchange(format!(
                "the running process answered {:?} to ready",
                line.trim_end()
            )));
        }
        Ok(())
    }
}

/// Receives the manifest's text up to its `end` line, and every descriptor that came with it.
fn receive_manifest(conn: &UnixStream) -> Result<(String, VecDeque<OwnedFd>), UpgradeError> {
    let mut text = Vec::new();
    let mut fds = VecDeque::new();
    let mut buf = [0u8; 4096];
    let mut space =
        vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_MESSAGE))];
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = rustix::net::recvmsg(
            conn.as_fd(),
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(exchange)?;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            return Err(exchange("descriptors were cut off in transit"));
        }
        if msg.bytes == 0 {
            return Err(exchange("the running process closed the connection"));
        }
        text.extend_from_slice(buf.get(..msg.bytes).unwrap_or_default());
        if text.len() > MAX_MANIFEST_BYTES {
            return Err(exchange("the manifest is too long"));
        }
        let s = std::str::from_utf8(&text).map_err(|_| exchange("the manifest is not UTF-8"))?;
        if let Some(reason) = s.lines().find_map(|l| l.strip_prefix("error ")) {
            return Err(exchange(format!("the running process refused: {reason}")));
        }
        if s.ends_with("end\n") && s.lines().last() == Some("end") {
            return Ok((s.to_owned(), fds));
        }
    }
}

/// The listeners of a manifest, each with the descriptors its lines announce, in order.
fn parse_manifest(
    text: &str,
    mut fds: VecDeque<OwnedFd>,
) -> Result<Vec<(String, SocketAddr, Vec<TcpListener>)>, UpgradeError> {
    let mut out: Vec<(String, SocketAddr, Vec<TcpListener>)> = Vec::new();
    for line in text.lines() {
        if line == "end" {
            break;
        }
        let mut parts = line.split(' ');
        let (Some("listener"), Some(name), Some(addr), Some(count), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(exchange(format!(
                "a manifest line is not understood: {line:?}"
            )));
        };
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| exchange(format!("a listener address is not valid: {addr:?}")))?;
        let count: usize = count
            .parse()
            .map_err(|_| exchange(format!("a descriptor count is not valid: {count:?}")))?;
        let mut socks = Vec::with_capacity(count);
        for _ in 0..count {
            let fd = fds
                .pop_front()
                .ok_or_else(|| exchange("fewer descriptors than the manifest announces"))?;
            socks.push(crate::fd::listener_from_owned(fd).map_err(exchange)?);
        }
        match out.iter_mut().find(|(n, _, _)| n == name) {
            Some((_, _, v)) => v.append(&mut socks),
            None => out.push((name.to_owned(), addr, socks)),
        }
    }
    if !fds.is_empty() {
        return Err(exchange("more descriptors than the manifest announces"));
    }
    Ok(out)
}

/// Spreads a listener's received sockets over `n` cores: each core accepts from at least one
/// (a duplicate when there are fewer sockets than cores: those cores share its queue), and none
/// is closed (when there are more, some cores accept from several), since closing one of a
/// `SO_REUSEPORT` group would reset the connections waiting in its queue.
pub fn spread(socks: Vec<TcpListener>, n: usize) -> io::Result<Vec<Vec<TcpListener>>> {
    let n = n.max(1);
    let k = socks.len();
    let mut per_core: Vec<Vec<TcpListener>> = (0..n).map(|_| Vec::new()).collect();
    for s in &socks {
        s.set_nonblocking(true)?;
    }
    if k == 0 {
        return Ok(per_core);
    }
    for i in k..n {
        let dup = socks.get(i % k).map(TcpListener::try_clone).transpose()?;
        if let (Some(d), Some(slot)) = (dup, per_core.get_mut(i)) {
            slot.push(d);
        }
    }
    for (i, s) in socks.into_iter().enumerate() {
        if let Some(slot) = per_core.get_mut(i % n) {
            slot.push(s);
        }
    }
    Ok(per_core)
}

/// Starts this program again with the same arguments and `--upgrade` (on `SIGUSR2`): the new
/// binary at the path this one was started from, so that an installed upgrade takes over. The
/// service manager's per-process variables are not passed on (the successor is not the process
/// they name); its exit is logged if it fails.
pub fn spawn_successor() -> io::Result<u32> {
    let exe = successor_program()?;
    let args: Vec<_> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--upgrade")
        .collect();
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(args)
        .arg("--upgrade")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_FDNAMES")
        .env_remove("WATCHDOG_PID")
        .stdin(std::process::Stdio::null());
    // The successor gets the listeners over the upgrade socket; it must not inherit this
    // process's connections, which it would hold open for their clients after this process
    // closed them.
    let open_max = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX));
    crate::fd::inherit_only_stdio(&mut cmd, open_max);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    tracing::info!(successor = pid, program = %exe.display(), "binary upgrade: started the successor");
    std::thread::Builder::new()
        .name("sortie-successor".into())
        .spawn(move || match child.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => tracing::warn!(successor = pid, status = %s, "binary upgrade: the successor exited"),
            Err(e) => tracing::warn!(successor = pid, error = %e, "binary upgrade: cannot wait for the successor"),
        })?;
    Ok(pid)
}

/// The program to start as the successor: the path this process was started from when it
/// still names a file (a package upgrade replaces the file there), else this process's own.
fn successor_program() -> io::Result<PathBuf> {
    if let Some(arg0) = std::env::args_os().next().map(PathBuf::from) {
        if arg0.components().count() > 1 && arg0.is_file() {
            return Ok(arg0);
        }
    }
    let exe = std::env::current_exe()?;
    let s = exe.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => exe,
    })
}

/// A worker's first line to its predecessor.
const WORKER_GREETING: &str = "sortie-worker-upgrade 1";

/// The abstract Unix socket on which a worker offers to hand over: named after its
/// configuration file (a worker has no data directory), so that the successor started with the
/// same file finds it, and two workers with other files never meet.
fn worker_socket(config: &Path) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::ffi::OsStrExt as _;
    let canonical = std::fs::canonicalize(config)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical.as_os_str().as_bytes());
    let short: String = digest
        .as_ref()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    std::os::unix::net::SocketAddr::from_abstract_name(format!("sortie-worker-upgrade/{short}"))
}

/// A running worker's offer to hand over to a successor (decision 115): there are no
/// listening sockets to pass, only the moment to step back. The successor opens its lanes as
/// a standby of this worker's session; once they are all admitted it says `ready`, and
/// `handed_over` runs (this worker says `GoAway` on its lanes, the controls switch to the
/// successor's lanes, and this process drains).
pub fn offer_worker(
    config: &Path,
    session: &str,
    handed_over: impl Fn(u32) + Send + 'static,
) -> io::Result<()> {
    let addr = worker_socket(config)?;
    // The predecessor releases the name just before it answers `ok`; a moment's retry covers
    // the successor binding it right after.
    let mut tries = 0;
    let listener = loop {
        match UnixListener::bind_addr(&addr) {
            Ok(l) => break l,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 40 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    };
    let session = session.to_owned();
    std::thread::Builder::new()
        .name("sortie-handover".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                match worker_hand_over(&mut conn, &session) {
                    Ok(pid) => {
                        crate::systemd::main_pid(pid);
                        handed_over(pid);
                        drop(listener);
                        let _ = conn.write_all(b"ok\n");
                        tracing::info!(
                            successor = pid,
                            "binary upgrade: handed over to process {pid}; draining"
                        );
                        return;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "binary upgrade refused or failed; this worker keeps serving"
                    ),
                }
            }
        })?;
    Ok(())
}

/// One successor of a worker: who it is, this worker's session, then its `ready`.
fn worker_hand_over(conn: &mut UnixStream, session: &str) -> Result<u32, HandoverError> {
    let (pid, mut reader) = greeted(conn, WORKER_GREETING)?;
    conn.write_all(format!("session {session}\n").as_bytes())?;
    conn.set_read_timeout(Some(READY_TIMEOUT))?;
    match read_line(&mut reader)?.as_str() {
        "ready" => Ok(pid),
        other => Err(HandoverError::NotReady {
            pid,
            line: other.to_string(),
        }),
    }
}

/// A worker started with `--upgrade`: its link to the worker it replaces.
pub struct WorkerSuccessor {
    conn: UnixStream,
    /// The predecessor's session, for the log.
    pub predecessor_session: String,
}

impl WorkerSuccessor {
    /// Finds the worker running with the configuration file `config`.
    pub fn connect(config: &Path) -> Result<WorkerSuccessor, UpgradeError> {
        let addr = worker_socket(config).map_err(exchange)?;
        let mut conn =
            UnixStream::connect_addr(&addr).map_err(|source| UpgradeError::NoPredecessor {
                path: config.to_path_buf(),
                source,
            })?;
        greet(&mut conn, WORKER_GREETING)?;
        let mut reader = BufReader::new(conn.try_clone().map_err(exchange)?);
        let line = read_line(&mut reader).map_err(exchange)?;
        let predecessor_session = line
            .strip_prefix("session ")
            .ok_or_else(|| exchange(format!("the running worker answered {line:?}")))?
            .to_owned();
        Ok(WorkerSuccessor {
            conn,
            predecessor_session,
        })
    }

    /// Says `ready` (every lane of the successor is admitted) and waits for `ok`: the
    /// predecessor then steps back.
    pub fn ready(self) -> Result<(), UpgradeError> {
        (&self.conn).write_all(b"ready\n").map_err(exchange)?;
        let mut reader = BufReader::new(self.conn);
        match read_line(&mut reader).map_err(exchange)?.as_str() {
            "ok" => Ok(()),
            other => Err(exchange(format!(
                "the running worker answered {other:?} to ready"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_keeps_every_socket_and_gives_each_core_one() {
        let bind = || TcpListener::bind("127.0.0.1:0").expect("bind");
        // Fewer sockets than cores: duplicates.
        let per_core = spread(vec![bind()], 3).expect("spread");
        assert_eq!(per_core.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
        // More: nothing closed.
        let per_core = spread(vec![bind(), bind(), bind()], 2).expect("spread");
        assert_eq!(per_core.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);
    }

    /// The side that hands over names what went wrong: an unknown greeting, a peer that
    /// hangs up, a peer that answers something else than `ready`.
    #[test]
    fn a_hand_over_says_why_it_failed() {
        let (mut ours, mut theirs) = UnixStream::pair().expect("pair");
        theirs.write_all(b"hello\n").expect("write");
        let e = greeted(&mut ours, GREETING).expect_err("refused");
        assert!(matches!(e, HandoverError::UnknownRequest(_)), "{e}");

        let (mut ours, theirs) = UnixStream::pair().expect("pair");
        drop(theirs);
        let e = greeted(&mut ours, GREETING).expect_err("refused");
        assert!(matches!(e, HandoverError::Closed), "{e}");

        let (mut ours, mut theirs) = UnixStream::pair().expect("pair");
        theirs
            .write_all(format!("{WORKER_GREETING}\nnope\n").as_bytes())
            .expect("write");
        let e = worker_hand_over(&mut ours, "s1").expect_err("refused");
        assert!(
            matches!(&e, HandoverError::NotReady { line, .. } if line == "nope"),
            "{e}"
        );
    }

    #[test]
    fn a_manifest_that_announces_more_descriptors_than_came_is_refused() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let fd = OwnedFd::from(l);
        let text = format!("listener api {addr} 2\nend\n");
        let e = parse_manifest(&text, VecDeque::from([fd])).expect_err("refused");
        assert!(e.to_string().contains("fewer descriptors"), "{e}");
        let e =
            parse_manifest("listener api nowhere 0\nend\n", VecDeque::new()).expect_err("refused");
        assert!(e.to_string().contains("address"), "{e}");
    }

    #[test]
    fn sockets_and_names_cross_the_handover_socket() {
        let dir = tempfile::tempdir().expect("dir");
        let api = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = api.local_addr().expect("addr");
        let offer = vec![Offered {
            name: "api",
            addr,
            fds: vec![
                OwnedFd::from(api.try_clone().expect("dup")),
                OwnedFd::from(api.try_clone().expect("dup")),
            ],
        }];
        let (tx, rx) = std::sync::mpsc::channel();
        let hooks = Hooks {
            move_workers: Box::new(|| vec!["w-1".to_owned(), "w-2".to_owned()]),
            handed_over: Box::new(move |pid| {
                let _ = tx.send(pid);
            }),
        };
        let handover = Handover::listen(dir.path(), offer, hooks).expect("listen");
        let mut s = Successor::connect(dir.path()).expect("connect");
        let (socks, got) = s.take("api").expect("api");
        assert_eq!((socks.len(), got), (2, addr));
        assert!(s.take("admin").is_none());
        assert_eq!(s.move_workers().expect("workers"), ["w-1", "w-2"]);
        s.ready().expect("ready");
        let pid = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("handed over");
        assert_eq!(pid, std::process::id());
        assert_eq!(handover.successor(), Some(pid));
        // A received socket is the same socket: a connection to the address is accepted from it.
        let _c = std::net::TcpStream::connect(addr).expect("connect");
        drop(api);
        let first = socks.first().expect("a socket");
        first.set_nonblocking(false).expect("blocking");
        first.accept().expect("accepted from the received socket");
    }
}
