//! Keeps `sortie-core` sans-IO: its normal dependency tree must not contain an async runtime or
//! an event loop, and its sources must open no socket or file (`core/clippy.toml` refuses clock
//! reads).

use std::process::Command;

#[test]
fn core_depends_on_no_runtime() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "sortie-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    for line in tree.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        assert!(
            !["monoio", "tokio", "mio", "io-uring", "async-std", "smol"].contains(&name),
            "sortie-core depends on the runtime crate {name}"
        );
    }
}

#[test]
fn core_opens_no_socket_and_no_file() {
    // Clock reads are refused by clippy (`core/clippy.toml`, `disallowed-methods`).
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut stack = vec![std::path::PathBuf::from(root)];
    let forbidden = [
        "std::net::TcpStream",
        "std::net::UdpSocket",
        "TcpListener",
        "std::fs::",
        "to_socket_addrs",
    ];
    while let Some(p) = stack.pop() {
        for entry in std::fs::read_dir(&p).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read file");
                // Test modules may write fixtures (the error-code document is rendered by one).
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                for f in forbidden {
                    assert!(!code.contains(f), "{} uses {f}", path.display());
                }
            }
        }
    }
}
