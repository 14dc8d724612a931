//! A private, throw-away PostgreSQL server for tests: `initdb` in a temporary directory and
//! `postgres` on a loopback port, started once per test process, each test on a database of its
//! own ([`PgCluster::fresh_database`]).
//!
//! The server runs under a small shell that holds a pipe from the test process: when the test
//! process ends (however it ends) the pipe closes, the shell stops the server and removes the
//! directory. PostgreSQL refuses to run as root, so a test running as root runs `initdb`, the
//! shell and the server as the `postgres` user. Missing binaries fail the test with what to
//! install; nothing is skipped.

#![allow(dead_code, unreachable_pub)]

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::proxies::free_port;

/// What to install when the server binaries are missing.
pub const INSTALL: &str =
    "install the Debian package `postgresql` (scripts/ci-deps.sh does), or set SORTIE_PG_BIN to \
     the directory holding initdb and postgres";

/// The role every test connects as (trust authentication on loopback).
pub const USER: &str = "sortie";

/// A running server.
pub struct PgCluster {
    /// The loopback port the server listens on.
    pub port: u16,
    /// The CA that signed the server's certificate (for `localhost` and `127.0.0.1`): the
    /// server takes TLS (`sslmode=require`) as well as plain connections.
    pub ca: PathBuf,
    dir: PathBuf,
    /// The write end of the keeper's pipe; dropped only when the process ends.
    _keeper: Mutex<(Child, ChildStdin)>,
}

/// The server of this test process, started on first use.
pub fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(PgCluster::start)
}

/// The directory holding `initdb` and `postgres`: `SORTIE_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout, not on PATH), else PATH.
fn bin_dir() -> PathBuf {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(d) = std::env::var_os("SORTIE_PG_BIN").map(PathBuf::from) {
        assert!(
            has_both(&d),
            "SORTIE_PG_BIN={} holds no initdb and postgres",
            d.display()
        );
        return d;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return d;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|d| has_both(d))
        .unwrap_or_else(|| {
            panic!("the PostgreSQL server binaries (initdb, postgres) are missing: {INSTALL}")
        })
}

/// The uid and gid of the `postgres` user, from /etc/passwd.
fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres"))
                .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
                .flatten()
        })
        .unwrap_or_else(|| {
            panic!(
                "the tests run as root and PostgreSQL refuses to: a `postgres` user is needed to \
                 run it ({INSTALL}), or run the tests as another user"
            )
        })
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A port the kernel just handed out on loopback (free a moment ago).
/// Writes a test CA (`ca.pem`) and a server certificate and key signed by it into `dir`,
/// readable by the server's user only, and returns the CA's path.
fn write_certificates(dir: &Path, user: Option<(u32, u32)>) -> PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    use std::os::unix::fs::PermissionsExt as _;
    let ca_key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params
        .distinguished_name
        .push(DnType::CommonName, "sortie test PostgreSQL CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).expect("CA");
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params")
        .signed_by(&key, &ca, &ca_key)
        .expect("server certificate");
    let files = [
        ("ca.pem", ca.pem()),
        ("server.crt", cert.pem()),
        ("server.key", key.serialize_pem()),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write certificate");
        // PostgreSQL refuses a key file others may read.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .expect("chmod certificate");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown certificate");
        }
    }
    dir.join("ca.pem")
}

impl PgCluster {
    fn start() -> PgCluster {
        let bin = bin_dir();
        let dir = std::env::temp_dir().join(format!(
            "sortie-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        std::fs::create_dir_all(&dir).expect("PostgreSQL temp dir");
        let user = is_root().then(postgres_user);
        let as_user = |cmd: &mut Command| {
            if let Some((uid, gid)) = user {
                cmd.uid(uid).gid(gid);
            }
        };
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the temp dir");
        }
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                USER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .current_dir(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        as_user(&mut initdb);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed in {} (as root the tests run it as the postgres user, who must be able \
             to reach that directory: set TMPDIR to a directory it can): {}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ca = write_certificates(&dir, user);
        let port = free_port();
        // The keeper: starts the server, waits for the test process's pipe to close, then stops
        // the server and removes everything.
        let script = r#"
"$1/postgres" -D "$2/data" -p "$3" -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories= -c fsync=off -c synchronous_commit=off \
  -c full_page_writes=off -c max_connections=300 -c ssl=on \
  -c ssl_cert_file="$2/server.crt" -c ssl_key_file="$2/server.key" >"$2/server.log" 2>&1 &
server=$!
read -r _
kill -INT "$server" 2>/dev/null
wait "$server"
rm -rf "$2"
"#;
        let mut keeper = Command::new("sh");
        keeper
            .args(["-c", script, "sortie-pg-keeper"])
            .arg(&bin)
            .arg(&dir)
            .arg(port.to_string())
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_user(&mut keeper);
        let mut child = keeper.spawn().expect("start the PostgreSQL keeper shell");
        let stdin = child.stdin.take().expect("keeper stdin");
        let cluster = PgCluster {
            port,
            ca,
            dir,
            _keeper: Mutex::new((child, stdin)),
        };
        cluster.wait_ready();
        cluster
    }

    fn log(&self) -> String {
        let mut text = String::new();
        let _ = std::fs::File::open(self.dir.join("server.log"))
            .and_then(|mut f| f.read_to_string(&mut text));
        text
    }

    fn wait_ready(&self) {
        super::wait::poll(Duration::from_secs(60), || {
            let e = match postgres::Client::connect(&self.url("postgres"), postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let mut keeper = self._keeper.lock().unwrap_or_else(|p| p.into_inner());
            if let Ok(Some(status)) = keeper.0.try_wait() {
                panic!("PostgreSQL exited ({status}); server log:\n{}", self.log());
            }
            Err(format!(
                "PostgreSQL did not accept connections on port {} ({e}); server log:\n{}",
                self.port,
                self.log()
            ))
        })
    }

    /// The URL of database `db` (trust authentication, no password).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// A connection to the maintenance database.
    pub fn admin(&self) -> postgres::Client {
        postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .expect("connect to the test PostgreSQL")
    }

    /// Creates an empty database for one test and returns its URL.
    pub fn fresh_database(&self, tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let clean: String = tag
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let name = format!("t_{clean}_{}", N.fetch_add(1, Ordering::Relaxed));
        self.admin()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create the test database");
        self.url(&name)
    }
}
