//! A real S3-compatible server (`s3s-fs`) for black-box tests, on a kernel-chosen loopback
//! port with its data in a temp dir; credentials `AKTEST` / `SKTEST`, one bucket [`BUCKET`].

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::gateway::{temp_dir, wait_until};

const S3_INSTALL: &str = "cargo install s3s-fs@0.14.1 --features binary --locked";

/// The bucket the server is started with.
pub const BUCKET: &str = "receipts";

impl S3Server {
    /// The `[object_storage]` section of a gateway storing receipts in this server (the
    /// credentials come from `TEST_S3_AK` and `TEST_S3_SK`), followed by `extra` keys.
    pub fn section(&self, extra: &str) -> String {
        format!(
            "[object_storage]\nenabled = true\nbackend = \"s3\"\nbucket = \"{BUCKET}\"\n\
             endpoint = \"http://127.0.0.1:{}\"\nregion = \"us-east-1\"\nforce_path_style = true\n\
             access_key_env = \"TEST_S3_AK\"\nsecret_key_env = \"TEST_S3_SK\"\n{extra}",
            self.port
        )
    }
}

/// A real S3-compatible server on a kernel-chosen loopback port, its data in a temp dir.
pub struct S3Server {
    /// The server process (tests stop it to simulate an outage).
    pub child: Child,
    /// The loopback port it listens on.
    pub port: u16,
    /// Its data directory: each bucket is a directory, each object a file.
    pub dir: PathBuf,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn s3s_fs_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("s3s-fs"))
            .find(|p| p.is_file())
    });
    let in_cargo = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cargo/bin/s3s-fs"))
        .filter(|p| p.is_file());
    on_path.or(in_cargo).unwrap_or_else(|| {
        panic!("s3s-fs is missing: install it with `{S3_INSTALL}` (scripts/ci-deps.sh does)")
    })
}

impl S3Server {
    pub fn start() -> S3Server {
        let bin = s3s_fs_binary();
        let dir = temp_dir("s3");
        std::fs::create_dir_all(dir.join(BUCKET)).expect("bucket dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "AKTEST", "--secret-key", "SKTEST"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn s3s-fs");
        let server = S3Server { child, port, dir };
        wait_until(Duration::from_secs(20), "s3s-fs listens", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        server
    }
}
