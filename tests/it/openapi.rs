//! The OpenAPI documents in `docs/openapi/`: served unchanged by both listeners, valid OpenAPI
//! 3.1 by an independent validator, and conformed to by a real `sortie serve` under
//! schemathesis's property-based and stateful tests (every check, bounded in time).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::gateway::{http, Gateway, ADMIN_TOKEN, DEPLOYMENT_TOKEN};

/// Time budget of one schemathesis run.
const SCHEMATHESIS_SECONDS: u32 = 45;
/// The checks of the conformance runs.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_schema_conformance,response_headers_conformance";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn document(name: &str) -> PathBuf {
    repo().join("docs/openapi").join(name)
}

/// A Python tool of the tests, or a failure that says how to get it.
fn tool(name: &str) -> Command {
    let found = Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "`{name}` is missing: install it with `pip install schemathesis openapi-spec-validator` \
         (scripts/ci-deps.sh does)"
    );
    Command::new(name)
}

#[test]
fn both_listeners_serve_the_documents_in_docs() {
    let gw = Gateway::start();
    for (addr, file) in [
        (gw.api, "api.json"),
        (gw.admin.expect("admin listener"), "admin.json"),
    ] {
        // No token: a client needs the document before it has one.
        let r = http(addr, "GET", "/api/v1/openapi.json", &[], b"");
        assert_eq!(r.status, 200, "{addr}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let want = std::fs::read(document(file)).expect("document");
        assert!(
            r.body == want,
            "{addr} serves a document that differs from docs/openapi/{file}"
        );
        let r = http(addr, "POST", "/api/v1/openapi.json", &[], b"");
        assert_eq!(r.status, 405);
    }
}

#[test]
fn documents_pass_an_independent_openapi_validator() {
    let out = tool("openapi-spec-validator")
        .arg(document("api.json"))
        .arg(document("admin.json"))
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs schemathesis against one listener and fails on any finding, printing its report.
fn schemathesis(doc: &Path, base: &str, token: &str) {
    let config = repo().join("tests/openapi/schemathesis.toml");
    let out = tool("st")
        .arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .arg("run")
        .arg(doc)
        .args(["--url", base])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["--checks", CHECKS])
        .args(["--max-time", &SCHEMATHESIS_SECONDS.to_string()])
        .args(["--request-timeout", "20"])
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    let summary = report
        .lines()
        .rev()
        .find(|l| l.contains("generated"))
        .unwrap_or("no summary");
    eprintln!("schemathesis {}: {summary}", doc.display());
    assert!(
        out.status.success(),
        "schemathesis found problems with {}:\n{report}\n{}",
        doc.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn schemathesis_finds_nothing_on_the_admin_api() {
    let gw = Gateway::start();
    let admin = gw.admin.expect("admin listener");
    schemathesis(
        &document("admin.json"),
        &format!("http://{admin}"),
        ADMIN_TOKEN,
    );
}

/// The request API with object storage on, so that the receipt operations are live too.
#[test]
fn schemathesis_finds_nothing_on_the_request_api() {
    let gw = Gateway::builder()
        .section("[object_storage]\nenabled = true\nbackend = \"fs\"\n")
        .start();
    schemathesis(
        &document("api.json"),
        &format!("http://{}", gw.api),
        DEPLOYMENT_TOKEN,
    );
}
