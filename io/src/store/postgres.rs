//! The PostgreSQL implementation of `RecordStore`: the store several controls share (decision
//! 091). Every compare-and-set is a conditional `UPDATE`/`INSERT` inside one transaction, so
//! two controls racing on the same revision get exactly one winner and one
//! [`StoreError::RevisionConflict`], as two writers on one SQLite file do.
//!
//! The synchronous `postgres` client drives its own small tokio runtime, which may not run
//! inside another runtime's context; the cold thread runs one. So the connection lives on a
//! thread of its own (`sortie-pg`), and each store call sends it one closure and waits for the
//! answer at most [`CALL_TIMEOUT`]: a stalled server blocks the cold thread for a bounded time,
//! never for ever. A broken connection is dropped and opened again on the next call.
//!
//! A call that gave up waiting must not take effect later (decision 096): each job carries the
//! caller's deadline and a small state shared with the caller. A job the caller abandoned is
//! skipped, every write commits only through [`commit`], which rolls back instead once the
//! caller gave up, and a caller that gives up while the `COMMIT` is under way answers
//! [`StoreError::OutcomeUnknown`] rather than a retryable [`StoreError::Busy`].
//!
//! The connection URL holds a password: it is never logged or put in an error message.

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::config::SslMode;
use postgres::error::SqlState;
use postgres::{Client, GenericClient, NoTls, Row};
use sortie_core::receipt::ReceiptState;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::migrations::POSTGRES_MIGRATIONS;
use super::{
    ConfigRecord, PartRecord, ReceiptRecord, RecordStore, StoreError, WorkerSettings,
    BOOTSTRAP_ACTION, BOOTSTRAP_ACTOR, HISTORY_LIMIT,
};

/// The channel on which a committed config revision is announced (payload: the revision).
/// Controls that follow the store `LISTEN` on it (decision 092).
pub const CONFIG_CHANNEL: &str = "sortie_config";

/// The channel on which a committed worker settings change is announced (payload: the worker
/// id).
pub const WORKERS_CHANNEL: &str = "sortie_workers";

/// How long one store call may take, connecting included, before the caller gets
/// [`StoreError::Busy`]. Longer than the statement timeout, so a slow statement ends with the
/// server's own error first.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How long opening a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection stays idle before the first keepalive probe.
const KEEPALIVES_IDLE: Duration = Duration::from_secs(30);

/// The client's own keepalive idle time when the URL gives none (`keepalives_idle`).
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// The server-side limit of one statement (`statement_timeout`).
const STATEMENT_TIMEOUT_MS: u32 = 10_000;

/// Key of the advisory lock that serialises schema migrations between controls starting at the
/// same moment ("sortie" in ASCII).
const MIGRATION_LOCK: i64 = 0x736f_7274_6965;

/// The connection settings, parsed from the URL and completed with our timeouts, and the TLS
/// connector when the URL asks for TLS.
#[derive(Clone)]
pub struct PostgresConfig {
    config: postgres::Config,
    tls: Option<MakeRustlsConnect>,
}

impl std::fmt::Debug for PostgresConfig {
    // The URL's password stays out of every debug print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("target", &self.target())
            .finish_non_exhaustive()
    }
}

impl PostgresConfig {
    /// Parses a `postgres://` URL or a `key=value` connection string, over plain TCP unless it
    /// says `sslmode=require` (then TLS with the server's certificate and name verified against
    /// the webpki roots plus `ca_file`). The error names what is wrong without repeating the
    /// string, which holds a password.
    pub fn parse(url: &str, ca_file: Option<&Path>) -> Result<Self, StoreError> {
        let mut config: postgres::Config = url.parse().map_err(|e: postgres::Error| {
            StoreError::Database(format!("the PostgreSQL URL is not valid: {e}"))
        })?;
        // Our timeouts fill in what the URL leaves out; a value it gives stands.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_tcp_user_timeout().is_none() {
            // A server that vanishes without closing the connection (a cut network, a frozen
            // host) is noticed within this time instead of the kernel's many minutes.
            config.tcp_user_timeout(CALL_TIMEOUT);
        }
        // Keepalives stay on unless the URL turns them off. Their idle time is ours unless the
        // URL gives one (a URL saying exactly the client's default, two hours, cannot be told
        // apart from one saying nothing).
        if config.get_keepalives_idle() == DEFAULT_KEEPALIVES_IDLE {
            config.keepalives_idle(KEEPALIVES_IDLE);
        }
        // Appended to what the URL's `options=` gives (a `search_path`, a `role`, a
        // `lock_timeout`): setting it alone would replace them.
        let timeout = format!("-c statement_timeout={STATEMENT_TIMEOUT_MS}");
        let options = match config.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{given} {timeout}"),
            _ => timeout,
        };
        config.options(&options);
        if config.get_application_name().is_none() {
            config.application_name("sortie");
        }
        let tls = match (config.get_ssl_mode(), ca_file) {
            (SslMode::Require, _) => Some(tls_connector(ca_file)?),
            // `prefer` (the default) and `disable` stay on plain TCP: trying TLS first would
            // make a server with a self-signed certificate fail where it worked before.
            (_, Some(_)) => {
                return Err(StoreError::Database(
                    "store.ca_file is set but the PostgreSQL URL does not ask for TLS \
                     (add sslmode=require)"
                        .into(),
                ))
            }
            (_, None) => None,
        };
        Ok(Self { config, tls })
    }

    /// Reads the URL from the environment variable `name` (`store.url_env`).
    pub fn from_env(name: &str, ca_file: Option<&Path>) -> Result<Self, StoreError> {
        match std::env::var(name) {
            Ok(url) if !url.is_empty() => Self::parse(&url, ca_file),
            Ok(_) => Err(StoreError::Database(format!(
                "store.url_env: the environment variable {name} is empty"
            ))),
            Err(_) => Err(StoreError::Database(format!(
                "store.url_env: the environment variable {name} is not set"
            ))),
        }
    }

    /// `host:port/database`, for messages: never the user's password.
    pub fn target(&self) -> String {
        let host = match self.config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) => h.clone(),
            Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        let db = self
            .config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or_default();
        format!("{host}:{port}/{db}")
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Opens one connection.
    pub fn connect(&self) -> Result<Client, StoreError> {
        let connected = match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(NoTls),
        };
        connected.map_err(|e| {
            StoreError::Database(format!(
                "cannot connect to PostgreSQL at {}: {}",
                self.target(),
                describe(&e)
            ))
        })
    }
}

/// The rustls connector (ring, as everywhere else): the egress roots (webpki plus `ca_file`)
/// and ALPN `postgresql`, which servers that check ALPN require.
fn tls_connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, StoreError> {
    let base = crate::egress::client_config(ca_file)
        .map_err(|e| StoreError::Database(format!("store.ca_file: {e}")))?;
    let mut config = rustls::ClientConfig::clone(&base);
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

/// One unit of work for the connection thread, with the caller's deadline and the state it
/// shares with the caller.
struct Job {
    run: Box<dyn FnOnce(&mut Connection) + Send>,
    deadline: Instant,
    state: Arc<AtomicU8>,
}

/// Where a job is, as the caller and the connection thread agree on it with compare-and-swaps:
/// queued or running until either the thread reaches its `COMMIT` or the caller gives up,
/// whichever is first.
const JOB_PENDING: u8 = 0;
/// The thread sent `COMMIT` (or finished a job that writes nothing): the caller waits for the
/// answer or, past its deadline, cannot know whether the write took effect.
const JOB_COMMITTING: u8 = 1;
/// The caller gave up: the job is skipped, or rolled back at its `COMMIT`.
const JOB_ABANDONED: u8 = 2;

thread_local! {
    /// The job the connection thread is running: [`commit`] reads it.
    static CURRENT: RefCell<Option<(Instant, Arc<AtomicU8>)>> = const { RefCell::new(None) };
}

/// Commits `tx` unless the caller of the running job gave up (its deadline passed or it
/// answered already): then the transaction is rolled back and the answer is
/// [`StoreError::Busy`], which the caller has already given. Every write of this store ends
/// here, so a write that was answered `Busy` never takes effect.
fn commit(tx: postgres::Transaction<'_>) -> Outcome<()> {
    let may_commit = CURRENT.with(|current| match &*current.borrow() {
        Some((deadline, state)) => {
            Instant::now() < *deadline
                && state
                    .compare_exchange(
                        JOB_PENDING,
                        JOB_COMMITTING,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
        }
        // Not on the connection thread (migrations at open): nobody waits with a deadline.
        None => true,
    });
    if !may_commit {
        tx.rollback()?;
        return Ok(Err(StoreError::Busy));
    }
    tx.commit()?;
    Ok(Ok(()))
}

/// The connection thread's loop: runs each job in turn until the queue closes. A job that
/// panics fails alone (its caller sees the store unavailable for that call) and its connection
/// is dropped, so that a transaction it left open rolls back; the next job reconnects. Before,
/// one panic ended the thread and every later call failed until a restart.
fn run_jobs(rx: mpsc::Receiver<Job>, conn: &mut Connection) {
    for job in rx {
        // A job whose caller gave up (or whose deadline passed while it was queued behind a
        // slow one) is dropped unrun; its caller answered `Busy`.
        if Instant::now() >= job.deadline || job.state.load(Ordering::Acquire) != JOB_PENDING {
            continue;
        }
        CURRENT.with(|c| *c.borrow_mut() = Some((job.deadline, job.state.clone())));
        let run = job.run;
        if let Err(e) = crate::runtime::contain_panic("a PostgreSQL store job", || run(conn)) {
            tracing::error!(error = %e, "PostgreSQL store job failed; reconnecting for the next");
            conn.client = None;
        }
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

/// The connection thread's state: the settings and the open connection, if any.
struct Connection {
    config: PostgresConfig,
    client: Option<Client>,
}

impl Connection {
    /// The open connection, reopened when the last one broke.
    fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let client = self.config.connect()?;
            tracing::debug!(target = %self.config.target(), "connected to PostgreSQL");
            self.client = Some(client);
        }
        self.client
            .as_mut()
            .ok_or_else(|| StoreError::Database("no PostgreSQL connection".into()))
    }

    /// Runs `f` on the connection; a failure that closed the connection drops it so that the
    /// next call reconnects.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        let client = self.client()?;
        let result = f(client);
        if client.is_closed() {
            self.client = None;
        }
        result.map_err(|e| map_error(&e))
    }
}

/// A [`RecordStore`] on a PostgreSQL database, shared by every control configured with it.
pub struct PostgresStore {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    target: String,
    /// This control's id in the `controls` table and in `receipts.holder` (decision 094).
    control_id: String,
    /// How long a call waits for its job ([`CALL_TIMEOUT`]).
    call_timeout: Duration,
    /// Set by [`RecordStore::control_leave`]: heartbeats no longer write the row back.
    has_left: Arc<AtomicBool>,
    /// The heartbeat's own connection (decision 104).
    presence: PresenceLane,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects (failing fast with a one-line reason when the server does not answer), applies
    /// pending schema migrations and refuses a database written by a newer schema.
    pub fn open(config: &PostgresConfig) -> Result<Self, StoreError> {
        // Connect on the caller's thread first: a wrong URL or a server that is down fails the
        // start at once, with the reason.
        let mut client = config.connect()?;
        migrate(&mut client)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let mut conn = Connection {
            config: config.clone(),
            client: Some(client),
        };
        let thread = std::thread::Builder::new()
            .name("sortie-pg".into())
            .spawn(move || run_jobs(rx, &mut conn))
            .map_err(|e| StoreError::Io(format!("cannot start the PostgreSQL thread: {e}")))?;
        // The heartbeat's connection opens at its first beat; its thread ends when the last
        // handle to it is gone.
        let (beat_tx, beat_rx) = mpsc::channel::<Job>();
        let mut beat_conn = Connection {
            config: config.clone(),
            client: None,
        };
        std::thread::Builder::new()
            .name("sortie-pg-beat".into())
            .spawn(move || run_jobs(beat_rx, &mut beat_conn))
            .map_err(|e| StoreError::Io(format!("cannot start the PostgreSQL thread: {e}")))?;
        let control_id = mint_control_id()?;
        let has_left = Arc::new(AtomicBool::new(false));
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
            target: config.target(),
            presence: PresenceLane {
                jobs: beat_tx,
                control_id: control_id.clone(),
                has_left: has_left.clone(),
            },
            control_id,
            call_timeout: CALL_TIMEOUT,
            has_left,
        })
    }

    /// Sets how long a call waits before giving up ([`CALL_TIMEOUT`] by default). Tests shorten
    /// it to reach the give-up paths quickly.
    pub fn set_call_timeout(&mut self, timeout: Duration) {
        self.call_timeout = timeout;
    }

    /// `host:port/database` of the server.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Runs `f` on the connection thread and waits for it at most the call timeout
    /// ([`CALL_TIMEOUT`]). Past it the answer is `Busy` when the job is certain to write
    /// nothing (not started, or stopped before its `COMMIT`), and `OutcomeUnknown` when its
    /// `COMMIT` was already under way.
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error> + Send + 'static,
    ) -> Result<T, StoreError> {
        call_on(self.jobs.as_ref(), self.call_timeout, f)
    }
}

/// Runs `f` on the connection thread behind `jobs`, waiting at most `timeout`: `Busy` when it
/// gave up before the job ran (it then never runs), `OutcomeUnknown` when the job was running.
fn call_on<T: Send + 'static>(
    jobs: Option<&mpsc::Sender<Job>>,
    timeout: Duration,
    f: impl FnOnce(&mut Client) -> Result<T, postgres::Error> + Send + 'static,
) -> Result<T, StoreError> {
    let (reply, answer) = mpsc::sync_channel(1);
    let state = Arc::new(AtomicU8::new(JOB_PENDING));
    let deadline = Instant::now() + timeout;
    let job = Job {
        run: Box::new(move |conn| {
            let _ = reply.send(conn.run(f));
        }),
        deadline,
        state: state.clone(),
    };
    jobs.ok_or(StoreError::Unavailable)?
        .send(job)
        .map_err(|_| StoreError::Unavailable)?;
    match answer.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            match state.compare_exchange(
                JOB_PENDING,
                JOB_ABANDONED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // The job will be skipped or roll back: nothing is written.
                Ok(_) => Err(StoreError::Busy),
                // The answer may have arrived just now.
                Err(_) => match answer.try_recv() {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::OutcomeUnknown),
                },
            }
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(StoreError::Unavailable),
    }
}

/// This control's heartbeat on its own connection and thread (decision 104): the beat (its
/// row refreshed, then the receipts of controls not seen within their expiry recovered) never
/// waits behind the store calls of requests and admin, each of which may wait up to
/// [`CALL_TIMEOUT`]; one slow call used to make a live control miss its beats and be declared
/// dead while it still sent the receipts it held.
#[derive(Clone)]
pub struct PresenceLane {
    jobs: mpsc::Sender<Job>,
    control_id: String,
    has_left: Arc<AtomicBool>,
}

impl std::fmt::Debug for PresenceLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PresenceLane")
            .field("control_id", &self.control_id)
            .finish_non_exhaustive()
    }
}

impl PresenceLane {
    /// One beat: this control's row refreshed (never written back once it left), then the
    /// receipts of dead controls recovered. Waits at most a third of `expiry`, so a beat that
    /// gives up leaves two more before the others may count this control dead. Returns how
    /// many receipts were recovered.
    pub fn beat(
        &self,
        address: &str,
        started_at: &str,
        expiry: Duration,
        updated_at: &str,
    ) -> Result<usize, StoreError> {
        let (id, address, started_at, updated_at) = (
            self.control_id.clone(),
            address.to_owned(),
            started_at.to_owned(),
            updated_at.to_owned(),
        );
        let has_left = self.has_left.clone();
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        let timeout = (expiry / 3).clamp(Duration::from_millis(100), CALL_TIMEOUT);
        // Two calls: a job commits one transaction (the commit claims the job, decision 096).
        let beat_id = id.clone();
        flat(call_on(Some(&self.jobs), timeout, move |c| {
            if has_left.load(Ordering::Acquire) {
                return Ok(Ok(()));
            }
            heartbeat_tx(c, &beat_id, &address, &started_at, expiry_ms)
        }))?;
        flat(call_on(Some(&self.jobs), timeout, move |c| {
            recover_dead_tx(c, &id, &updated_at, expiry_ms)
        }))
    }
}

/// Registers or refreshes the row of control `id`, by the store's clock.
fn heartbeat_tx(
    c: &mut Client,
    id: &str,
    address: &str,
    started_at: &str,
    expiry_ms: i64,
) -> Result<Result<(), StoreError>, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.execute(
        &format!(
            "INSERT INTO controls \
             (control_id, address, started_at, last_seen_unix_ms, expiry_ms) \
             VALUES ($1, $2, $3, {DB_NOW_MS}, $4) ON CONFLICT (control_id) DO UPDATE \
             SET address = excluded.address, \
             last_seen_unix_ms = excluded.last_seen_unix_ms, \
             expiry_ms = excluded.expiry_ms"
        ),
        &[&id, &address, &started_at, &expiry_ms],
    )?;
    commit(tx)
}

/// Recovers the receipts held by controls other than `id` not seen within their expiry, and
/// removes those controls' rows; returns how many receipts moved.
fn recover_dead_tx(
    c: &mut Client,
    id: &str,
    updated_at: &str,
    expiry_ms: i64,
) -> Result<Result<usize, StoreError>, postgres::Error> {
    let mut tx = c.transaction()?;
    // A holder counts as alive only while its row is fresh: a row removed as dead does not
    // come back to life for receipts already recovered.
    let moved = tx.execute(
        &format!(
            "UPDATE receipts SET \
             state = CASE state WHEN 'verifying' THEN 'uploading' ELSE 'verified' END, \
             holder = NULL, attempt = NULL, updated_at = $1 \
             WHERE state IN ('verifying', 'assigned') AND holder IS NOT NULL \
             AND holder <> $2 AND NOT EXISTS (SELECT 1 FROM controls \
             WHERE controls.control_id = receipts.holder \
             AND controls.last_seen_unix_ms >= \
             {DB_NOW_MS} - COALESCE(controls.expiry_ms, $3))"
        ),
        &[&updated_at, &id, &expiry_ms],
    )?;
    tx.execute(
        &format!(
            "DELETE FROM controls WHERE control_id <> $1 \
             AND last_seen_unix_ms < {DB_NOW_MS} - COALESCE(expiry_ms, $2)"
        ),
        &[&id, &expiry_ms],
    )?;
    Ok(commit(tx)?.map(|()| usize::try_from(moved).unwrap_or(usize::MAX)))
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has finished its current job; a thread
        // stuck on a dead server is left to finish on its own rather than blocking the caller.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// A fresh control id: 16 random bytes in hex, so that a restarted control is a new one and
/// never inherits the row (or the receipts) of the process it replaces.
fn mint_control_id() -> Result<String, StoreError> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| {
            StoreError::Io("cannot draw a control id from the system's random source".into())
        })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// SQL that is true while the control whose id is the parameter `param` holds a live lease:
/// its row exists and was refreshed within the expiry it recorded, by the store's clock. The
/// same test recovery applies to holders (`recover_dead_tx`), so a control takes a receipt
/// only while the others would leave it alone (decision 110).
fn lease_is_live(param: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM controls WHERE controls.control_id = {param} \
         AND controls.last_seen_unix_ms >= {DB_NOW_MS} - COALESCE(controls.expiry_ms, 0))"
    )
}

/// The store's clock in Unix milliseconds, as SQL: heartbeats and their expiry read one clock,
/// the database's, so controls on hosts whose clocks differ still agree on who is alive.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

/// Brings the schema to the newest version in one transaction under an advisory lock, so two
/// controls starting together migrate once, and a failure leaves the old version intact.
fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let supported = super::migrations::POSTGRES_SCHEMA_VERSION;
    let run = |client: &mut Client| -> Result<Result<(), StoreError>, postgres::Error> {
        let mut tx = client.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS sortie_schema (
                 id      SMALLINT PRIMARY KEY CHECK (id = 1),
                 version INTEGER NOT NULL CHECK (version >= 0)
             )",
        )?;
        let found: i32 = tx
            .query_opt("SELECT version FROM sortie_schema WHERE id = 1", &[])?
            .map_or(0, |r| r.get(0));
        let Ok(found) = u32::try_from(found) else {
            return Ok(Err(StoreError::Corrupt(format!(
                "negative schema version {found} in the database"
            ))));
        };
        if found > supported {
            return Ok(Err(StoreError::NewerSchema { found, supported }));
        }
        if found == supported {
            return Ok(Ok(()));
        }
        // `found < supported == POSTGRES_MIGRATIONS.len()`, so the range is in bounds.
        for sql in POSTGRES_MIGRATIONS
            .get(found as usize..)
            .unwrap_or_default()
        {
            tx.batch_execute(sql)?;
        }
        let version = i32::try_from(supported).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO sortie_schema (id, version) VALUES (1, $1) \
             ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            &[&version],
        )?;
        tx.commit()?;
        Ok(Ok(()))
    };
    run(client).map_err(|e| map_error(&e))?
}

/// The server's message and code, without the connection string.
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            // Walk to the root cause: "error connecting to server: Connection refused".
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            text
        }
    }
}

/// Maps a PostgreSQL failure to the store's error, keeping the distinctions a caller acts on.
fn map_error(e: &postgres::Error) -> StoreError {
    match e.code() {
        Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => StoreError::ReadOnly,
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::LOCK_NOT_AVAILABLE
                || *c == SqlState::QUERY_CANCELED
                || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            StoreError::Busy
        }
        Some(c) if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
            StoreError::Corrupt(describe(e))
        }
        _ => StoreError::Database(describe(e)),
    }
}

/// What a closure on the connection thread returns: the database's own failure (outer) or a
/// store-level outcome such as a conflict (inner).
type Outcome<T> = Result<Result<T, StoreError>, postgres::Error>;

/// Flattens an [`Outcome`] answered by [`PostgresStore::call`].
fn flat<T>(r: Result<Result<T, StoreError>, StoreError>) -> Result<T, StoreError> {
    r?
}

fn revision_from_db(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Corrupt(format!("negative revision {value} in the database")))
}

fn u64_from_db(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what} {value}")))
}

fn i64_to_db(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

const CONFIG_COLUMNS: &str = "revision, snapshot, actor, action, created_at";

fn config_record(row: &Row) -> Result<ConfigRecord, StoreError> {
    Ok(ConfigRecord {
        revision: revision_from_db(row.get(0))?,
        snapshot_json: row.get(1),
        actor: row.get(2),
        action: row.get(3),
        created_at: row.get(4),
    })
}

const WORKER_COLUMNS: &str = "worker_id, enabled, draining, revision, updated_at, actor";

fn worker_settings(row: &Row) -> Result<WorkerSettings, StoreError> {
    Ok(WorkerSettings {
        worker_id: row.get(0),
        is_enabled: row.get(1),
        is_draining: row.get(2),
        revision: revision_from_db(row.get(3))?,
        updated_at: row.get(4),
        actor: row.get(5),
    })
}

const RECEIPT_COLUMNS: &str = "receipt_id, deployment_id, direction, state, size_bytes, \
     sha256_hex, idempotency_key, created_at, updated_at, expires_at, expires_unix_ms, failure";

/// Reads a receipt and its parts.
fn receipt_in(
    c: &mut impl GenericClient,
    deployment_id: &str,
    receipt_id: &str,
) -> Result<Result<Option<ReceiptRecord>, StoreError>, postgres::Error> {
    let Some(row) = c.query_opt(
        &format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE receipt_id = $1 AND deployment_id = $2"
        ),
        &[&receipt_id, &deployment_id],
    )?
    else {
        return Ok(Ok(None));
    };
    let parts = c.query(
        "SELECT number, size_bytes, sha256_hex, object_key FROM receipt_parts \
         WHERE receipt_id = $1 ORDER BY number",
        &[&receipt_id],
    )?;
    Ok(receipt_record(&row, &parts).map(Some))
}

fn receipt_record(row: &Row, parts: &[Row]) -> Result<ReceiptRecord, StoreError> {
    let state: String = row.get(3);
    let state = ReceiptState::from_wire(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown receipt state {state:?}")))?;
    let parts = parts
        .iter()
        .map(|p| {
            let n: i32 = p.get(0);
            Ok(PartRecord {
                number: u32::try_from(n)
                    .map_err(|_| StoreError::Corrupt(format!("part number {n}")))?,
                size_bytes: u64_from_db(p.get(1), "part size")?,
                sha256_hex: p.get(2),
                object_key: p.get(3),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(ReceiptRecord {
        receipt_id: row.get(0),
        deployment_id: row.get(1),
        direction: row.get(2),
        state,
        size_bytes: u64_from_db(row.get(4), "receipt size")?,
        sha256_hex: row.get(5),
        idempotency_key: row.get(6),
        parts,
        created_at: row.get(7),
        updated_at: row.get(8),
        expires_at: row.get(9),
        expires_unix_ms: u64_from_db(row.get(10), "expiry")?,
        failure: row.get(11),
    })
}

/// The newest config revision, 0 before the first record (the counter row survives pruning).
fn head_revision(c: &mut impl GenericClient) -> Result<Result<u64, StoreError>, postgres::Error> {
    let head: Option<i64> = c
        .query_opt("SELECT revision FROM config_head WHERE id = 1", &[])?
        .map(|r| r.get(0));
    Ok(head.map_or(Ok(0), revision_from_db))
}

/// The conditional append: moves the head from `expected` to `expected + 1` with a conditional
/// `UPDATE` (the compare-and-set; a concurrent writer waits on the row lock and then finds the
/// condition false), inserts the record, prunes and announces the revision, all in one
/// transaction.
fn append_in(
    client: &mut Client,
    expected: u64,
    snapshot: &str,
    actor: &str,
    action: &str,
    created_at: &str,
) -> Outcome<ConfigRecord> {
    let Some(next) = expected.checked_add(1).and_then(|n| i64::try_from(n).ok()) else {
        let mut tx = client.transaction()?;
        return Ok(head_revision(&mut tx)?
            .and_then(|current| Err(StoreError::RevisionConflict { current })));
    };
    let expected_db = next - 1;
    let mut tx = client.transaction()?;
    let moved = tx.execute(
        "UPDATE config_head SET revision = $1 WHERE id = 1 AND revision = $2",
        &[&next, &expected_db],
    )?;
    if moved == 0 {
        return Ok(head_revision(&mut tx)?
            .and_then(|current| Err(StoreError::RevisionConflict { current })));
    }
    tx.execute(
        &format!("INSERT INTO config_records ({CONFIG_COLUMNS}) VALUES ($1, $2, $3, $4, $5)"),
        &[&next, &snapshot, &actor, &action, &created_at],
    )?;
    let keep = i64::try_from(HISTORY_LIMIT).unwrap_or(i64::MAX);
    // Revisions are dense (each append is head + 1), so the newest `keep` are the ones above
    // `next - keep`.
    tx.execute(
        "DELETE FROM config_records WHERE revision <= $1",
        &[&next.saturating_sub(keep)],
    )?;
    // Delivered to every listener when the transaction commits, never before.
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CONFIG_CHANNEL, &next.to_string()],
    )?;
    if let Err(e) = commit(tx)? {
        return Ok(Err(e));
    }
    Ok(Ok(ConfigRecord {
        revision: expected + 1,
        snapshot_json: snapshot.to_owned(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        created_at: created_at.to_owned(),
    }))
}

impl RecordStore for PostgresStore {
    fn latest_config(&mut self) -> Result<Option<ConfigRecord>, StoreError> {
        flat(self.call(|c| {
            let row = c.query_opt(
                &format!(
                    "SELECT {CONFIG_COLUMNS} FROM config_records ORDER BY revision DESC LIMIT 1"
                ),
                &[],
            )?;
            Ok(row.as_ref().map(config_record).transpose())
        }))
    }

    fn latest_revision(&mut self) -> Result<u64, StoreError> {
        flat(self.call(head_revision))
    }

    fn probe(&mut self) -> Result<bool, StoreError> {
        self.call(|c| {
            let row = c.query_one("SELECT EXISTS(SELECT 1 FROM config_records)", &[])?;
            Ok(row.get::<_, bool>(0))
        })
    }

    fn config_at(&mut self, revision: u64) -> Result<Option<ConfigRecord>, StoreError> {
        let Ok(revision) = i64::try_from(revision) else {
            return Ok(None);
        };
        flat(self.call(move |c| {
            let row = c.query_opt(
                &format!("SELECT {CONFIG_COLUMNS} FROM config_records WHERE revision = $1"),
                &[&revision],
            )?;
            Ok(row.as_ref().map(config_record).transpose())
        }))
    }

    fn append_config(
        &mut self,
        expected_revision: u64,
        snapshot_json: &str,
        actor: &str,
        action: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError> {
        let (snapshot, actor, action, created_at) = (
            snapshot_json.to_owned(),
            actor.to_owned(),
            action.to_owned(),
            created_at.to_owned(),
        );
        flat(self.call(move |c| {
            append_in(
                c,
                expected_revision,
                &snapshot,
                &actor,
                &action,
                &created_at,
            )
        }))
    }

    fn history(&mut self, limit: usize) -> Result<Vec<ConfigRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        flat(self.call(move |c| {
            let rows = c.query(
                &format!(
                    "SELECT {CONFIG_COLUMNS} FROM config_records ORDER BY revision DESC LIMIT $1"
                ),
                &[&limit],
            )?;
            Ok(rows.iter().map(config_record).collect())
        }))
    }

    fn bootstrap(
        &mut self,
        default_snapshot_json: &str,
        created_at: &str,
    ) -> Result<ConfigRecord, StoreError> {
        let (snapshot, created_at) = (default_snapshot_json.to_owned(), created_at.to_owned());
        flat(self.call(move |c| {
            match append_in(
                c,
                0,
                &snapshot,
                BOOTSTRAP_ACTOR,
                BOOTSTRAP_ACTION,
                &created_at,
            )? {
                // Another control (or an earlier start) wrote first: the newest record stands.
                Err(StoreError::RevisionConflict { .. }) => {
                    let row = c.query_opt(
                        &format!(
                            "SELECT {CONFIG_COLUMNS} FROM config_records \
                             ORDER BY revision DESC LIMIT 1"
                        ),
                        &[],
                    )?;
                    Ok(match row.as_ref().map(config_record).transpose() {
                        Ok(Some(r)) => Ok(r),
                        Ok(None) => Err(StoreError::Corrupt(
                            "the config history is empty but its revision counter is not".into(),
                        )),
                        Err(e) => Err(e),
                    })
                }
                other => Ok(other),
            }
        }))
    }

    fn worker_settings(&mut self, worker_id: &str) -> Result<Option<WorkerSettings>, StoreError> {
        let worker_id = worker_id.to_owned();
        flat(self.call(move |c| {
            let row = c.query_opt(
                &format!("SELECT {WORKER_COLUMNS} FROM worker_settings WHERE worker_id = $1"),
                &[&worker_id],
            )?;
            Ok(row.as_ref().map(worker_settings).transpose())
        }))
    }

    fn all_worker_settings(&mut self) -> Result<Vec<WorkerSettings>, StoreError> {
        flat(self.call(|c| {
            // The "C" collation orders by bytes, as SQLite's BINARY does and Rust's `str` does.
            let rows = c.query(
                &format!(
                    "SELECT {WORKER_COLUMNS} FROM worker_settings ORDER BY worker_id COLLATE \"C\""
                ),
                &[],
            )?;
            Ok(rows.iter().map(worker_settings).collect())
        }))
    }

    fn update_worker_settings(
        &mut self,
        worker_id: &str,
        expected_revision: u64,
        is_enabled: bool,
        is_draining: bool,
        actor: &str,
        updated_at: &str,
    ) -> Result<WorkerSettings, StoreError> {
        let (worker_id, actor, updated_at) = (
            worker_id.to_owned(),
            actor.to_owned(),
            updated_at.to_owned(),
        );
        flat(self.call(move |c| {
            let current = |c: &mut postgres::Transaction<'_>| -> Outcome<u64> {
                let row = c.query_opt(
                    "SELECT revision FROM worker_settings WHERE worker_id = $1",
                    &[&worker_id],
                )?;
                Ok(row.map_or(Ok(0), |r| revision_from_db(r.get(0))))
            };
            let mut tx = c.transaction()?;
            let Some(next) = expected_revision
                .checked_add(1)
                .and_then(|n| i64::try_from(n).ok())
            else {
                return Ok(current(&mut tx)?
                    .and_then(|current| Err(StoreError::RevisionConflict { current })));
            };
            // The compare-and-set: a first record is an insert that loses to an existing row; a
            // later one an update conditional on the revision read.
            let written = if expected_revision == 0 {
                tx.execute(
                    &format!(
                        "INSERT INTO worker_settings ({WORKER_COLUMNS}) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (worker_id) DO NOTHING"
                    ),
                    &[
                        &worker_id,
                        &is_enabled,
                        &is_draining,
                        &next,
                        &updated_at,
                        &actor,
                    ],
                )?
            } else {
                tx.execute(
                    "UPDATE worker_settings SET enabled = $2, draining = $3, revision = $4, \
                     updated_at = $5, actor = $6 WHERE worker_id = $1 AND revision = $7",
                    &[
                        &worker_id,
                        &is_enabled,
                        &is_draining,
                        &next,
                        &updated_at,
                        &actor,
                        &(next - 1),
                    ],
                )?
            };
            if written == 0 {
                return Ok(current(&mut tx)?
                    .and_then(|current| Err(StoreError::RevisionConflict { current })));
            }
            tx.execute("SELECT pg_notify($1, $2)", &[&WORKERS_CHANNEL, &worker_id])?;
            if let Err(e) = commit(tx)? {
                return Ok(Err(e));
            }
            Ok(Ok(WorkerSettings {
                worker_id,
                is_enabled,
                is_draining,
                revision: expected_revision + 1,
                updated_at,
                actor,
            }))
        }))
    }

    fn create_receipt(&mut self, r: &ReceiptRecord) -> Result<ReceiptRecord, StoreError> {
        let r = r.clone();
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            // A unique violation on the idempotency index (another control created the same
            // key first) inserts nothing; the stored receipt is then the answer.
            let inserted = tx.execute(
                &format!(
                    "INSERT INTO receipts ({RECEIPT_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                     ON CONFLICT DO NOTHING"
                ),
                &[
                    &r.receipt_id,
                    &r.deployment_id,
                    &r.direction,
                    &r.state.as_str(),
                    &i64_to_db(r.size_bytes),
                    &r.sha256_hex,
                    &r.idempotency_key,
                    &r.created_at,
                    &r.updated_at,
                    &r.expires_at,
                    &i64_to_db(r.expires_unix_ms),
                    &r.failure,
                ],
            )?;
            if inserted == 1 {
                return Ok(commit(tx)?.map(|()| r));
            }
            let Some(key) = &r.idempotency_key else {
                return Ok(Err(StoreError::Database(format!(
                    "receipt id {} already exists",
                    r.receipt_id
                ))));
            };
            let existing = tx.query_opt(
                "SELECT receipt_id FROM receipts WHERE deployment_id = $1 \
                 AND idempotency_key = $2",
                &[&r.deployment_id, key],
            )?;
            let Some(existing) = existing else {
                return Ok(Err(StoreError::Database(format!(
                    "receipt id {} already exists",
                    r.receipt_id
                ))));
            };
            let id: String = existing.get(0);
            Ok(receipt_in(&mut tx, &r.deployment_id, &id)?
                .and_then(|o| o.ok_or_else(|| StoreError::Corrupt("receipt vanished".into()))))
        }))
    }

    fn receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
    ) -> Result<Option<ReceiptRecord>, StoreError> {
        let (deployment_id, receipt_id) = (deployment_id.to_owned(), receipt_id.to_owned());
        flat(self.call(move |c| {
            // One snapshot for the receipt and its parts.
            let mut tx = c
                .build_transaction()
                .isolation_level(postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let r = receipt_in(&mut tx, &deployment_id, &receipt_id)?;
            tx.commit()?;
            Ok(r)
        }))
    }

    fn put_receipt_part(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        part: &PartRecord,
        updated_at: &str,
    ) -> Result<bool, StoreError> {
        let (deployment_id, receipt_id, part, updated_at) = (
            deployment_id.to_owned(),
            receipt_id.to_owned(),
            part.clone(),
            updated_at.to_owned(),
        );
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            // The conditional update locks the receipt row until commit, so a concurrent
            // `complete` (uploading -> verifying) waits for this part or sees it refused.
            let touched = tx.execute(
                "UPDATE receipts SET updated_at = $1 WHERE receipt_id = $2 \
                 AND deployment_id = $3 AND state = $4",
                &[
                    &updated_at,
                    &receipt_id,
                    &deployment_id,
                    &ReceiptState::Uploading.as_str(),
                ],
            )?;
            if touched == 0 {
                return Ok(Ok(false));
            }
            let number = i32::try_from(part.number).unwrap_or(i32::MAX);
            tx.execute(
                "INSERT INTO receipt_parts (receipt_id, number, size_bytes, sha256_hex, \
                 object_key) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (receipt_id, number) \
                 DO UPDATE SET size_bytes = excluded.size_bytes, \
                 sha256_hex = excluded.sha256_hex, object_key = excluded.object_key",
                &[
                    &receipt_id,
                    &number,
                    &i64_to_db(part.size_bytes),
                    &part.sha256_hex,
                    &part.object_key,
                ],
            )?;
            Ok(commit(tx)?.map(|()| true))
        }))
    }

    fn set_receipt_state(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        from: ReceiptState,
        to: ReceiptState,
        updated_at: &str,
        failure: Option<&str>,
    ) -> Result<bool, StoreError> {
        let (deployment_id, receipt_id, updated_at, failure) = (
            deployment_id.to_owned(),
            receipt_id.to_owned(),
            updated_at.to_owned(),
            failure.map(str::to_owned),
        );
        // The control that moves a receipt into a state only a running process leaves holds
        // it, so that its receipts can be recovered once it is known dead (decision 094), and
        // takes it only while its lease is live; what it holds it moves on only while it is
        // still the holder, which recovery ends (decision 110). Cancel and expiry are anyone's.
        let is_taking = matches!(to, ReceiptState::Verifying | ReceiptState::Assigned);
        let is_held = matches!(from, ReceiptState::Verifying | ReceiptState::Assigned)
            && !matches!(to, ReceiptState::Cancelled | ReceiptState::Expired);
        let holder = is_taking.then(|| self.control_id.clone());
        let me = self.control_id.clone();
        let sql = format!(
            "UPDATE receipts SET state = $1, updated_at = $2, \
             failure = COALESCE($3, failure), holder = $7, attempt = NULL \
             WHERE receipt_id = $4 AND deployment_id = $5 AND state = $6{}{}",
            if is_held { " AND holder = $8" } else { "" },
            if is_taking {
                format!(" AND {}", lease_is_live("$8"))
            } else {
                String::new()
            },
        );
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            let (to, from) = (to.as_str(), from.as_str());
            let params: [&(dyn postgres::types::ToSql + Sync); 8] = [
                &to,
                &updated_at,
                &failure,
                &receipt_id,
                &deployment_id,
                &from,
                &holder,
                &me,
            ];
            // `$8` appears only with one of the two conditions.
            let used = if is_held || is_taking { 8 } else { 7 };
            let n = tx.execute(&sql, params.get(..used).unwrap_or(&params))?;
            Ok(commit(tx)?.map(|()| n > 0))
        }))
    }

    fn assign_receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        attempt: &str,
        updated_at: &str,
    ) -> Result<bool, StoreError> {
        let (deployment_id, receipt_id, attempt, updated_at, holder) = (
            deployment_id.to_owned(),
            receipt_id.to_owned(),
            attempt.to_owned(),
            updated_at.to_owned(),
            self.control_id.clone(),
        );
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            // Taken only under a live lease (decision 110).
            let n = tx.execute(
                &format!(
                    "UPDATE receipts SET state = 'assigned', updated_at = $1, holder = $2, \
                     attempt = $3 WHERE receipt_id = $4 AND deployment_id = $5 \
                     AND state = 'verified' AND {}",
                    lease_is_live("$2")
                ),
                &[&updated_at, &holder, &attempt, &receipt_id, &deployment_id],
            )?;
            Ok(commit(tx)?.map(|()| n > 0))
        }))
    }

    fn release_receipt(
        &mut self,
        deployment_id: &str,
        receipt_id: &str,
        attempt: &str,
        to: ReceiptState,
        updated_at: &str,
    ) -> Result<bool, StoreError> {
        let (deployment_id, receipt_id, attempt, updated_at, holder) = (
            deployment_id.to_owned(),
            receipt_id.to_owned(),
            attempt.to_owned(),
            updated_at.to_owned(),
            self.control_id.clone(),
        );
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            let n = tx.execute(
                "UPDATE receipts SET state = $1, updated_at = $2, holder = NULL, \
                 attempt = NULL WHERE receipt_id = $3 AND deployment_id = $4 \
                 AND state = 'assigned' AND holder = $5 AND attempt = $6",
                &[
                    &to.as_str(),
                    &updated_at,
                    &receipt_id,
                    &deployment_id,
                    &holder,
                    &attempt,
                ],
            )?;
            Ok(commit(tx)?.map(|()| n > 0))
        }))
    }

    fn due_receipts(
        &mut self,
        now_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let now = i64_to_db(now_unix_ms);
        self.call(move |c| {
            let rows = c.query(
                "SELECT deployment_id, receipt_id FROM receipts WHERE expires_unix_ms <= $1 \
                 AND state NOT IN ('assigned', 'cancelled', 'expired') LIMIT $2",
                &[&now, &limit],
            )?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    fn recover_receipts(
        &mut self,
        updated_at: &str,
        untouched_since: Option<&str>,
    ) -> Result<usize, StoreError> {
        let (updated_at, untouched_since) =
            (updated_at.to_owned(), untouched_since.map(str::to_owned));
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            let mut moved = 0;
            for (from, to) in [
                (ReceiptState::Verifying, ReceiptState::Uploading),
                (ReceiptState::Assigned, ReceiptState::Verified),
            ] {
                moved += tx.execute(
                    "UPDATE receipts SET state = $1, updated_at = $2, holder = NULL, \
                     attempt = NULL WHERE state = $3 AND ($4::TEXT IS NULL OR updated_at <= $4)",
                    &[&to.as_str(), &updated_at, &from.as_str(), &untouched_since],
                )?;
            }
            Ok(commit(tx)?.map(|()| usize::try_from(moved).unwrap_or(usize::MAX)))
        }))
    }

    fn control_id(&self) -> Option<&str> {
        Some(&self.control_id)
    }

    fn control_heartbeat(
        &mut self,
        address: &str,
        started_at: &str,
        expiry: Duration,
    ) -> Result<(), StoreError> {
        if self.has_left.load(Ordering::Acquire) {
            return Ok(());
        }
        let (id, address, started_at) = (
            self.control_id.clone(),
            address.to_owned(),
            started_at.to_owned(),
        );
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        flat(self.call(move |c| heartbeat_tx(c, &id, &address, &started_at, expiry_ms)))
    }

    fn control_leave(&mut self, updated_at: &str) -> Result<usize, StoreError> {
        // Even when the call fails: a stopping control must not write its row back, and the
        // row then expires as after a crash.
        self.has_left.store(true, Ordering::Release);
        let (id, updated_at) = (self.control_id.clone(), updated_at.to_owned());
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            let moved = tx.execute(
                "UPDATE receipts SET \
                 state = CASE state WHEN 'verifying' THEN 'uploading' ELSE 'verified' END, \
                 holder = NULL, attempt = NULL, updated_at = $1 \
                 WHERE state IN ('verifying', 'assigned') AND holder = $2",
                &[&updated_at, &id],
            )?;
            tx.execute("DELETE FROM controls WHERE control_id = $1", &[&id])?;
            Ok(commit(tx)?.map(|()| usize::try_from(moved).unwrap_or(usize::MAX)))
        }))
    }

    fn recover_dead_controls(
        &mut self,
        expiry: Duration,
        updated_at: &str,
    ) -> Result<usize, StoreError> {
        let (id, updated_at) = (self.control_id.clone(), updated_at.to_owned());
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        flat(self.call(move |c| recover_dead_tx(c, &id, &updated_at, expiry_ms)))
    }

    fn presence_lane(&self) -> Option<PresenceLane> {
        Some(self.presence.clone())
    }

    fn request_cancel(&mut self, request_id: &str) -> Result<bool, StoreError> {
        let request_id = request_id.to_owned();
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            tx.execute(
                &format!(
                    "INSERT INTO cancel_intents (request_id, created_unix_ms, done_by) \
                     VALUES ($1, {DB_NOW_MS}, NULL) ON CONFLICT (request_id) DO UPDATE \
                     SET created_unix_ms = excluded.created_unix_ms, done_by = NULL"
                ),
                &[&request_id],
            )?;
            Ok(commit(tx)?.map(|()| true))
        }))
    }

    fn pending_cancels(&mut self, expiry: Duration) -> Result<Vec<String>, StoreError> {
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            tx.execute(
                &format!("DELETE FROM cancel_intents WHERE created_unix_ms < {DB_NOW_MS} - $1"),
                &[&expiry_ms],
            )?;
            let rows = tx.query(
                "SELECT request_id FROM cancel_intents WHERE done_by IS NULL",
                &[],
            )?;
            let pending = rows.iter().map(|r| r.get(0)).collect();
            Ok(commit(tx)?.map(|()| pending))
        }))
    }

    fn cancel_done(&mut self, request_id: &str) -> Result<(), StoreError> {
        let (id, request_id) = (self.control_id.clone(), request_id.to_owned());
        flat(self.call(move |c| {
            let mut tx = c.transaction()?;
            tx.execute(
                "UPDATE cancel_intents SET done_by = $1 WHERE request_id = $2",
                &[&id, &request_id],
            )?;
            commit(tx)
        }))
    }

    fn cancel_carried_out(&mut self, request_id: &str) -> Result<bool, StoreError> {
        let request_id = request_id.to_owned();
        self.call(move |c| {
            let row = c.query_opt(
                "SELECT done_by IS NOT NULL FROM cancel_intents WHERE request_id = $1",
                &[&request_id],
            )?;
            Ok(row.is_some_and(|r| r.get(0)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that panics fails alone: the next job on the same thread runs, and the
    /// connection the panicking one used is dropped (no server is needed: these jobs do not
    /// touch it).
    #[test]
    fn a_panicking_job_does_not_end_the_connection_thread() {
        let config = PostgresConfig::parse("postgres://sortie@127.0.0.1:9/none", None).unwrap();
        let (tx, rx) = mpsc::channel::<Job>();
        let (done_tx, done) = mpsc::channel::<&'static str>();
        let job = |run: Box<dyn FnOnce(&mut Connection) + Send>| Job {
            run,
            deadline: Instant::now() + Duration::from_secs(30),
            state: Arc::new(AtomicU8::new(JOB_PENDING)),
        };
        let first = done_tx.clone();
        tx.send(job(Box::new(move |_| {
            let _keep = first;
            panic!("a bug in one store operation")
        })))
        .unwrap();
        tx.send(job(Box::new(move |_| {
            let _ = done_tx.send("the next job ran");
        })))
        .unwrap();
        drop(tx);
        let t = std::thread::spawn(move || {
            let mut conn = Connection {
                config,
                client: None,
            };
            run_jobs(rx, &mut conn);
        });
        assert_eq!(
            done.recv_timeout(Duration::from_secs(10)),
            Ok("the next job ran")
        );
        t.join().expect("the connection thread ended normally");
    }

    #[test]
    fn the_url_is_parsed_and_its_password_never_printed() {
        let c = PostgresConfig::parse("postgres://sortie:hunter2@db.internal:6543/gateway", None)
            .expect("valid URL");
        assert_eq!(c.target(), "db.internal:6543/gateway");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn the_urls_own_settings_stand_and_ours_fill_in_the_rest() {
        let c = PostgresConfig::parse(
            "postgres://u@h/db?options=-c%20search_path%3Dgw&connect_timeout=2&keepalives_idle=60",
            None,
        )
        .expect("valid URL");
        assert_eq!(
            c.config.get_options(),
            Some("-c search_path=gw -c statement_timeout=10000")
        );
        assert_eq!(
            c.config.get_connect_timeout(),
            Some(&Duration::from_secs(2))
        );
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(c.config.get_tcp_user_timeout(), Some(&CALL_TIMEOUT));
        let plain = PostgresConfig::parse("postgres://u@h/db", None).expect("valid URL");
        assert_eq!(
            plain.config.get_options(),
            Some("-c statement_timeout=10000")
        );
        assert_eq!(plain.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(plain.config.get_keepalives_idle(), KEEPALIVES_IDLE);
        assert!(plain.config.get_keepalives());
    }

    #[test]
    fn a_bad_url_is_refused_without_repeating_it() {
        let err = PostgresConfig::parse("postgres://u:hunter2@host:notaport/db", None)
            .expect_err("bad port");
        let text = err.to_string();
        assert!(text.contains("not valid"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn tls_is_used_only_when_the_url_requires_it() {
        let plain = PostgresConfig::parse("postgres://u@h/db", None).expect("plain");
        assert!(!plain.is_tls());
        let prefer = PostgresConfig::parse("postgres://u@h/db?sslmode=prefer", None).expect("ok");
        assert!(!prefer.is_tls());
        let tls = PostgresConfig::parse("postgres://u@h/db?sslmode=require", None).expect("tls");
        assert!(tls.is_tls());
        let err = PostgresConfig::parse("postgres://u@h/db", Some(Path::new("/ca.pem")))
            .expect_err("a CA without TLS");
        assert!(err.to_string().contains("sslmode=require"), "{err}");
    }

    #[test]
    fn a_missing_or_empty_variable_is_named() {
        let name = "SORTIE_TEST_PG_URL_SURELY_UNSET";
        let err = PostgresConfig::from_env(name, None).expect_err("unset");
        assert!(err.to_string().contains(name), "{err}");
        assert!(err.to_string().contains("not set"), "{err}");
    }
}
