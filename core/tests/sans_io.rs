//! Keeps `sortie-core` sans-IO: its normal dependency tree must not contain an async runtime or
//! an event loop. That its code reads no clock and opens no file or socket is checked by clippy
//! (`core/clippy.toml`: `disallowed-methods` and `disallowed-types`, which see through `use`
//! and aliases).

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
