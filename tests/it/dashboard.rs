//! The operator dashboard at `/admin/` (decision 050): its files are served without a token
//! while the API behind it still needs one, and a real headless Chromium drives every admin
//! action through the page against a real gateway (`tests/browser/dashboard.py`).

use crate::support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::gate::Gate;
use support::gateway::{http, Gateway, ADMIN_TOKEN, DEPLOYMENT_TOKEN};
use support::upstream::{self, Upstream};

const WORKERS: &str = r#"
[[workers]]
id = "w-a"
capacity = 4
tags = ["fast"]

[[workers]]
id = "w-b"
capacity = 2
"#;

#[test]
fn dashboard_files_need_no_token_and_the_api_still_does() {
    let gw = Gateway::builder().workers(WORKERS).start();
    let admin = gw.admin.expect("admin listener");
    let page = http(admin, "GET", "/admin/", &[], b"");
    assert_eq!(page.status, 200, "{}", page.text());
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(page
        .text()
        .contains("<script type=\"module\" src=\"app.js\">"));
    let csp = page.header("content-security-policy").expect("CSP");
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let tag = page.header("etag").expect("etag").to_string();

    let again = http(
        admin,
        "GET",
        "/admin/index.html",
        &[("If-None-Match", &tag)],
        b"",
    );
    assert_eq!(again.status, 304);
    assert!(again.body.is_empty());

    let js = http(admin, "GET", "/admin/app.js", &[], b"");
    assert_eq!(js.status, 200);
    assert_eq!(
        js.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    let head = http(admin, "HEAD", "/admin/style.css", &[], b"");
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());

    let moved = http(admin, "GET", "/admin", &[], b"");
    assert_eq!(moved.status, 308);
    assert_eq!(moved.header("location"), Some("/admin/"));
    assert_eq!(
        http(admin, "GET", "/admin/secret.json", &[], b"").status,
        404
    );
    assert_eq!(http(admin, "POST", "/admin/", &[], b"").status, 405);

    // The files are public; the API the page calls is not.
    for path in ["/api/v1/admin/config", "/api/v1/admin/workers", "/metrics"] {
        let r = http(admin, "GET", path, &[], b"");
        assert_eq!(r.status, 401, "{path}: {}", r.text());
        assert_eq!(r.json()["error"], "admin_auth_required");
    }
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let r = http(
        admin,
        "GET",
        "/api/v1/admin/config",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The dashboard is served by the admin listener only.
    assert_eq!(http(gw.api, "GET", "/admin/", &[], b"").status, 404);
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Chromium and Playwright for Python, or a failure that says how to install them.
fn browser_or_fail() -> PathBuf {
    let chromium = PathBuf::from(
        std::env::var("SORTIE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_string()),
    );
    let playwright = Command::new(python())
        .args(["-c", "import playwright.sync_api"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        chromium.exists() && playwright,
        "the dashboard browser tests need Chromium at {} ({}) and Playwright for Python ({}); \
         run scripts/ci-deps.sh, or: apt-get install chromium && pip install playwright",
        chromium.display(),
        if chromium.exists() {
            "found"
        } else {
            "missing"
        },
        if playwright { "found" } else { "missing" },
    );
    chromium
}

/// A loopback port with nothing listening: connections to it are refused.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn dashboard_in_headless_chromium() {
    let chromium = browser_or_fail();
    let fast = Upstream::start(upstream::fixed(upstream::response(200, &[], b"ok")));
    // The slow upstream holds each request until the test ends (the gate opens on drop), so
    // one request stays active until the page cancels it.
    let gate = Gate::new();
    let slow = Upstream::start(gate.script(upstream::fixed(upstream::response(200, &[], b"late"))));
    let gw = Gateway::builder().workers(WORKERS).start();
    let admin = gw.admin.expect("admin listener");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.py");
    let status = Command::new(python())
        .arg(&script)
        .env("SORTIE_ADMIN_URL", format!("http://{admin}"))
        .env("SORTIE_API_URL", format!("http://{}", gw.api))
        .env("SORTIE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("SORTIE_DEPLOYMENT_TOKEN", DEPLOYMENT_TOKEN)
        .env("SORTIE_FAST_URL", fast.url("/fast"))
        .env("SORTIE_SLOW_URL", slow.url("/slow"))
        .env(
            "SORTIE_REFUSED_URL",
            format!("http://127.0.0.1:{}/refused", closed_port()),
        )
        .env("SORTIE_WORKER", "w-a")
        .env("SORTIE_SCREENSHOTS", &shots)
        .env("SORTIE_CHROMIUM", &chromium)
        .status()
        .expect("run python");
    drop(gate);
    assert!(
        status.success(),
        "browser tests failed ({status}); screenshots in {}",
        shots.display()
    );
}
