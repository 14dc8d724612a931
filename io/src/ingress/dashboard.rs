//! The operator dashboard: static files embedded in the binary and served by the admin listener
//! under `/admin/` (decision 050).
//!
//! The page is an ordinary client of the admin API and adds no security boundary: its files are
//! public and served without a token (the page itself asks the operator for the admin token),
//! while every API call it makes carries the bearer token and is checked by `admin.rs`.

use std::sync::LazyLock;

use crate::http::Response;
use sortie_core::error::AdminErrorKind;

/// Prefix of every dashboard path.
pub const PREFIX: &str = "/admin";

/// Content-Security-Policy of every dashboard answer: only this origin's scripts, styles and
/// API; no inline code, no framing, no plugins, no forms posting anywhere.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; font-src 'none'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Cache policy: the names carry no content hash, so browsers revalidate every time and the
/// `ETag` (a hash of the content) turns an unchanged file into a bodyless 304.
const CACHE_CONTROL: &str = "no-cache";

/// One embedded file.
struct Asset {
    /// Name under `/admin/`.
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $ct:expr) => {
        Asset {
            name: $name,
            content_type: $ct,
            bytes: include_bytes!(concat!("dashboard/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: [Asset; 10] = [
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("diff.js", JS),
    asset!("metrics.js", JS),
    asset!("plot.js", JS),
    asset!("views.js", JS),
];

/// Quoted strong ETags, one per asset, from the first 128 bits of the content's SHA-256.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let d = ring::digest::digest(&ring::digest::SHA256, a.bytes);
            let hex: String = d
                .as_ref()
                .iter()
                .take(16)
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("\"{hex}\"")
        })
        .collect()
});

/// Whether `path` belongs to the dashboard (and so needs no admin token).
pub fn is_dashboard_path(path: &str) -> bool {
    path == PREFIX || path.starts_with("/admin/")
}

/// Headers every dashboard answer carries, 404s included.
fn hardened(r: Response) -> Response {
    r.with_header("content-security-policy", CSP)
        .with_header("x-content-type-options", "nosniff")
        .with_header("x-frame-options", "DENY")
        .with_header("referrer-policy", "no-referrer")
        .with_header("cross-origin-opener-policy", "same-origin")
        .with_header("cross-origin-resource-policy", "same-origin")
}

/// Whether an `If-None-Match` value names `tag` (a list of tags, or `*`).
fn matches_tag(if_none_match: &[u8], tag: &str) -> bool {
    if_none_match.split(|&b| b == b',').any(|t| {
        let t = t.trim_ascii();
        let t = t.strip_prefix(b"W/").unwrap_or(t);
        t == b"*" || t == tag.as_bytes()
    })
}

/// Answers a request for a dashboard path (see [`is_dashboard_path`]).
pub fn serve(method: &str, path: &str, if_none_match: Option<&[u8]>) -> Response {
    if method != "GET" && method != "HEAD" {
        return hardened(super::web::admin_error(AdminErrorKind::MethodNotAllowed))
            .with_header("allow", "GET, HEAD");
    }
    let name = match path.strip_prefix(PREFIX) {
        // The page's relative URLs resolve against `/admin/`, so the bare prefix moves there.
        Some("") => {
            return hardened(Response::new(308))
                .with_header("location", "/admin/")
                .with_header("cache-control", CACHE_CONTROL)
        }
        Some("/") => "index.html",
        Some(rest) => rest.trim_start_matches('/'),
        None => "",
    };
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        return hardened(super::web::admin_error(AdminErrorKind::NotFound));
    };
    let (asset, tag) = (&ASSETS[i], &ETAGS[i]);
    let base = if if_none_match.is_some_and(|v| matches_tag(v, tag)) {
        Response::new(304)
    } else {
        Response::new(200)
            .with_content_type(asset.content_type)
            .with_body(asset.bytes)
    };
    hardened(base)
        .with_header("etag", tag.clone())
        .with_header("cache-control", CACHE_CONTROL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ResponseBody;

    fn header<'a>(r: &'a Response, name: &str) -> &'a str {
        std::str::from_utf8(r.header(name).unwrap_or_else(|| panic!("no {name}"))).unwrap()
    }

    #[test]
    fn paths_under_the_prefix_belong_to_the_dashboard() {
        for p in ["/admin", "/admin/", "/admin/app.js", "/admin/x/y"] {
            assert!(is_dashboard_path(p), "{p}");
        }
        for p in [
            "/",
            "/administrator",
            "/api/v1/admin/config",
            "/metrics",
            "/adminx",
        ] {
            assert!(!is_dashboard_path(p), "{p}");
        }
    }

    #[test]
    fn files_have_their_content_types() {
        for (path, ct) in [
            ("/admin/", "text/html; charset=utf-8"),
            ("/admin/index.html", "text/html; charset=utf-8"),
            ("/admin/app.js", JS),
            ("/admin/views.js", JS),
            ("/admin/style.css", "text/css; charset=utf-8"),
            ("/admin/favicon.svg", "image/svg+xml"),
        ] {
            let r = serve("GET", path, None);
            assert_eq!(r.status, 200, "{path}");
            assert_eq!(header(&r, "content-type"), ct, "{path}");
            assert!(!r.body.is_empty(), "{path}");
        }
    }

    #[test]
    fn every_answer_is_hardened() {
        for (method, path) in [
            ("GET", "/admin/"),
            ("GET", "/admin/app.js"),
            ("GET", "/admin/nope.js"),
            ("POST", "/admin/"),
            ("GET", "/admin"),
        ] {
            let r = serve(method, path, None);
            let csp = header(&r, "content-security-policy");
            assert!(csp.contains("default-src 'self'"), "{csp}");
            assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
            assert!(!csp.contains("unsafe"), "{csp}");
            assert_eq!(header(&r, "x-content-type-options"), "nosniff");
            assert_eq!(header(&r, "x-frame-options"), "DENY");
        }
    }

    #[test]
    fn unknown_files_and_traversal_are_404() {
        for p in [
            "/admin/nope.js",
            "/admin/../Cargo.toml",
            "/admin/dashboard.rs",
            "/admin/index.html/",
            "/admin/x/index.html",
        ] {
            assert_eq!(serve("GET", p, None).status, 404, "{p}");
        }
    }

    #[test]
    fn bare_prefix_redirects_and_other_methods_are_405() {
        let r = serve("GET", "/admin", None);
        assert_eq!(r.status, 308);
        assert_eq!(header(&r, "location"), "/admin/");
        let r = serve("PUT", "/admin/app.js", None);
        assert_eq!(r.status, 405);
        assert_eq!(header(&r, "allow"), "GET, HEAD");
    }

    #[test]
    fn etags_follow_the_content_and_revalidate() {
        let a = serve("GET", "/admin/app.js", None);
        let b = serve("GET", "/admin/style.css", None);
        let tag = header(&a, "etag").to_string();
        assert_eq!(tag.len(), 34, "{tag}");
        assert_ne!(tag, header(&b, "etag"));
        assert_eq!(header(&a, "cache-control"), "no-cache");

        let r = serve("GET", "/admin/app.js", Some(tag.as_bytes()));
        assert_eq!(r.status, 304);
        assert_eq!(r.body, ResponseBody::Empty);
        assert_eq!(header(&r, "etag"), tag);
        let list = format!("\"other\", W/{tag}");
        assert_eq!(
            serve("GET", "/admin/app.js", Some(list.as_bytes())).status,
            304
        );
        assert_eq!(
            serve("GET", "/admin/app.js", Some(b"\"other\"")).status,
            200
        );
    }

    #[test]
    fn scripts_import_only_embedded_modules_and_never_write_markup() {
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            let js = std::str::from_utf8(a.bytes).unwrap();
            for banned in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ] {
                assert!(!js.contains(banned), "{} uses {banned}", a.name);
            }
            for line in js.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .rsplit(['\'', '"'])
                    .nth(1)
                    .and_then(|t| t.strip_prefix("./"))
                    .unwrap_or_else(|| panic!("{}: {line}", a.name));
                assert!(
                    ASSETS.iter().any(|x| x.name == target),
                    "{}: {target}",
                    a.name
                );
            }
        }
    }

    #[test]
    fn html_loads_nothing_inline() {
        let html = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        assert!(!html.contains("<script>"), "inline script");
        assert!(!html.contains("style="), "inline style");
        assert!(!html.contains("<style"), "inline style");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "absolute URL"
        );
        // Every local script and stylesheet the page names is one of the embedded files.
        for piece in html.split(['"', '\'']) {
            if piece.ends_with(".js") || piece.ends_with(".css") || piece.ends_with(".svg") {
                assert!(ASSETS.iter().any(|a| a.name == piece), "{piece}");
            }
        }
    }
}
