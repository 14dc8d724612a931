//! The receipt API against a real `sortie serve`, once on the `fs` backend and once on the `s3`
//! backend against a real S3-compatible server (`s3s-fs`) that the tests start themselves. The
//! same suite runs on both; every error row of the receipt table is exercised, and a real
//! `kill -9` during complete checks crash consistency.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use support::gateway::{
    http, parse_response, temp_dir, unb64, wait_until, Gateway, Resp, DEPLOYMENT_TOKEN,
};
use support::receipts::sha256_hex;
use support::s3::{S3Server, BUCKET};
use support::upstream::{self, Upstream};

const OTHER_TOKEN: &str = "other-deployment-token-0123456789";
const MIB: usize = 1024 * 1024;

/// Where the suite stores objects.
enum Backend {
    Fs,
    S3(S3Server),
}

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Fs => "fs",
            Backend::S3(_) => "s3",
        }
    }

    fn config(&self, extra: &str) -> String {
        match self {
            Backend::Fs => format!("[object_storage]\nenabled = true\nbackend = \"fs\"\n{extra}"),
            Backend::S3(s) => s.section(extra),
        }
    }

    /// The directory where a receipt's objects end up on disk (both backends keep files).
    fn receipt_dir(&self, gw_dir: &Path, id: &str) -> PathBuf {
        match self {
            Backend::Fs => gw_dir.join("data/objects/receipts").join(id),
            Backend::S3(s) => s.dir.join(BUCKET).join("receipts").join(id),
        }
    }

    /// Whether any file of the receipt's payload is left (s3s-fs keeps empty directories).
    fn has_payload(&self, gw_dir: &Path, id: &str) -> bool {
        fn any_file(p: &Path) -> bool {
            std::fs::read_dir(p).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_type().is_ok_and(|t| t.is_file()) || any_file(&e.path()))
            })
        }
        any_file(&self.receipt_dir(gw_dir, id))
    }

    fn gateway(&self, extra: &str, dir: Option<PathBuf>) -> Gateway {
        let mut b = Gateway::builder()
            .section(&self.config(extra))
            .section(&format!(
                "[[deployments]]\nid = \"dep_other\"\ntoken = \"{OTHER_TOKEN}\"\n"
            ))
            .env("TEST_S3_AK", "AKTEST")
            .env("TEST_S3_SK", "SKTEST");
        if let Some(d) = dir {
            b = b.dir(d);
        }
        b.start()
    }
}

/// Deterministic bytes that differ per seed.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

struct Client {
    addr: SocketAddr,
    auth: String,
}

impl Client {
    fn new(gw: &Gateway, token: &str) -> Client {
        Client {
            addr: gw.api,
            auth: format!("Bearer {token}"),
        }
    }

    fn req(&self, method: &str, path: &str, extra: &[(&str, &str)], body: &[u8]) -> Resp {
        let mut headers = vec![("Authorization", self.auth.as_str())];
        headers.extend_from_slice(extra);
        http(self.addr, method, path, &headers, body)
    }

    fn create(&self, direction: &str, body: &[u8], key: Option<&str>) -> Resp {
        let mut v = json!({"direction": direction, "size_bytes": body.len(), "sha256_hex": sha256_hex(body)});
        if let Some(k) = key {
            v["idempotency_key"] = json!(k);
        }
        self.req(
            "POST",
            "/api/v1/receipts",
            &[("Content-Type", "application/json")],
            v.to_string().as_bytes(),
        )
    }

    fn put(&self, id: &str, n: u32, part: &[u8]) -> Resp {
        self.req(
            "PUT",
            &format!("/api/v1/receipts/{id}/parts/{n}"),
            &[],
            part,
        )
    }

    fn complete(&self, id: &str) -> Resp {
        self.req("POST", &format!("/api/v1/receipts/{id}/complete"), &[], b"")
    }

    fn get(&self, id: &str) -> Resp {
        self.req("GET", &format!("/api/v1/receipts/{id}"), &[], b"")
    }

    fn state(&self, id: &str) -> String {
        let r = self.get(id);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["state"].as_str().unwrap_or_default().to_string()
    }

    /// Creates, uploads in `part_size` parts and completes a receipt; returns its id.
    fn verified(&self, direction: &str, body: &[u8], part_size: usize) -> String {
        let r = self.create(direction, body, None);
        assert_eq!(r.status, 201, "{}", r.text());
        let id = r.json()["receipt_id"].as_str().expect("id").to_string();
        let mut chunks: Vec<&[u8]> = body.chunks(part_size).collect();
        if chunks.is_empty() {
            chunks.push(b"");
        }
        for (i, c) in chunks.iter().enumerate() {
            let r = self.put(&id, i as u32 + 1, c);
            assert_eq!(r.status, 200, "part {}: {}", i + 1, r.text());
        }
        let r = self.complete(&id);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["state"], "verified");
        id
    }
}

/// Sends raw bytes as one request and reads the answer.
fn raw(addr: SocketAddr, request: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    s.write_all(request).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse_response(&out)
}

fn assert_receipt_error(r: &Resp, status: u16, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let v = r.json();
    assert_eq!(v["code"], "receipt_error", "{what}: {v}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {v}"
    );
}

fn signing_key(gw: &Gateway) -> ring::hmac::Key {
    let text = std::fs::read_to_string(gw.dir.join("data/receipt-signing.key")).expect("key file");
    let text = text.trim();
    let bytes: Vec<u8> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect();
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes)
}

fn signed_path(
    key: &ring::hmac::Key,
    deployment: &str,
    request: &str,
    receipt: &str,
    expires: u64,
) -> String {
    let msg = format!("sortie-receipt-object-v1\n{deployment}\n{request}\n{receipt}\n{expires}");
    let sig: String = ring::hmac::sign(key, msg.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("/api/v1/receipt-objects/{receipt}?deployment_id={deployment}&request_id={request}&expires={expires}&signature={sig}")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn suite(backend: &Backend) {
    let name = backend.name();
    let gw = backend.gateway("max_object_bytes = 67108864\n", None);
    let c = Client::new(&gw, DEPLOYMENT_TOKEN);
    let other = Client::new(&gw, OTHER_TOKEN);

    // 401: missing and wrong deployment tokens, on every client route.
    for (m, p) in [
        ("POST", "/api/v1/receipts"),
        (
            "GET",
            "/api/v1/receipts/rcpt_0123456789abcdef0123456789abcdef",
        ),
        (
            "PUT",
            "/api/v1/receipts/rcpt_0123456789abcdef0123456789abcdef/parts/1",
        ),
    ] {
        assert_receipt_error(&http(gw.api, m, p, &[], b"{}"), 401, "no token");
        assert_receipt_error(
            &http(gw.api, m, p, &[("Authorization", "Bearer wrong")], b"{}"),
            401,
            "bad token",
        );
    }

    // 400: malformed metadata.
    let good_sha = sha256_hex(b"x");
    for (what, body) in [
        ("not JSON", "{".to_string()),
        ("unknown field", json!({"direction":"request","size_bytes":1,"sha256_hex":good_sha,"x":1}).to_string()),
        ("bad direction", json!({"direction":"up","size_bytes":1,"sha256_hex":good_sha}).to_string()),
        ("negative size", json!({"direction":"request","size_bytes":-1,"sha256_hex":good_sha}).to_string()),
        ("short sha", json!({"direction":"request","size_bytes":1,"sha256_hex":"abc"}).to_string()),
        ("too big", json!({"direction":"request","size_bytes":67108865u64,"sha256_hex":good_sha}).to_string()),
        ("empty key", json!({"direction":"request","size_bytes":1,"sha256_hex":good_sha,"idempotency_key":""}).to_string()),
    ] {
        let r = c.req("POST", "/api/v1/receipts", &[("Content-Type", "application/json")], body.as_bytes());
        assert_receipt_error(&r, 400, what);
    }

    // 413: metadata over 64 KiB, refused from its declared length.
    let big_meta = json!({"direction":"request","size_bytes":1,"sha256_hex":good_sha,"idempotency_key":"k".repeat(70_000)}).to_string();
    let r = c.req(
        "POST",
        "/api/v1/receipts",
        &[("Content-Type", "application/json")],
        big_meta.as_bytes(),
    );
    assert_receipt_error(&r, 413, "metadata over 64 KiB");

    // 201 and the record's fields.
    let body = data(3 * MIB + 12_345, 1);
    let r = c.create("response", &body, Some("key-1"));
    assert_eq!(r.status, 201, "{}", r.text());
    let rec = r.json();
    let id = rec["receipt_id"].as_str().expect("id").to_string();
    assert!(id.starts_with("rcpt_"), "{rec}");
    assert_eq!(rec["state"], "uploading");
    assert_eq!(rec["direction"], "response");
    assert_eq!(rec["size_bytes"], body.len());
    assert_eq!(rec["sha256_hex"], sha256_hex(&body));
    assert_eq!(rec["parts"], json!([]));
    assert_eq!(rec["status_url"], format!("/api/v1/receipts/{id}"));
    assert_eq!(
        rec["part_upload_template"],
        format!("/api/v1/receipts/{id}/parts/{{part}}")
    );
    assert_eq!(
        rec["complete_url"],
        format!("/api/v1/receipts/{id}/complete")
    );
    for f in ["created_at", "updated_at", "expires_at"] {
        assert!(rec[f].is_string(), "{f}: {rec}");
    }
    assert!(rec.get("download_url").is_none());

    // Idempotent create: same identity, same answer; another identity, 409.
    let again = c.create("response", &body, Some("key-1"));
    assert_eq!(again.status, 201);
    assert_eq!(again.json()["receipt_id"], id);
    assert_receipt_error(
        &c.create("response", &body[1..], Some("key-1")),
        409,
        "key reuse",
    );
    // The key is the deployment's own: another deployment gets a receipt of its own.
    let theirs = other.create("response", &body, Some("key-1"));
    assert_eq!(theirs.status, 201);
    assert_ne!(theirs.json()["receipt_id"], id);

    // 404: unknown, malformed and another deployment's ids.
    assert_receipt_error(
        &c.get("rcpt_0123456789abcdef0123456789abcdef"),
        404,
        "unknown id",
    );
    assert_receipt_error(&c.get("nope"), 404, "malformed id");
    assert_receipt_error(&other.get(&id), 404, "other deployment");
    assert_receipt_error(&other.put(&id, 1, b"x"), 404, "other deployment's part");
    assert_receipt_error(&other.complete(&id), 404, "other deployment's complete");
    assert_receipt_error(
        &other.req("DELETE", &format!("/api/v1/receipts/{id}"), &[], b""),
        404,
        "other deployment's cancel",
    );

    // Parts: any order, replaceable, checked against X-Service-Part-SHA256.
    let (p1, rest) = body.split_at(2 * MIB);
    let (p2, p3) = rest.split_at(MIB);
    assert_eq!(c.put(&id, 3, p3).status, 200);
    assert_eq!(c.put(&id, 1, b"wrong bytes, replaced below").status, 200);
    let r = c.put(&id, 1, p1);
    assert_eq!(r.status, 200, "{}", r.text());
    let parts = r.json()["parts"].clone();
    assert_eq!(parts.as_array().map(Vec::len), Some(2), "{parts}");
    assert_eq!(parts[0]["number"], 1);
    assert_eq!(parts[0]["size_bytes"], p1.len());
    assert_eq!(parts[0]["sha256_hex"], sha256_hex(p1));
    let bad = c.req(
        "PUT",
        &format!("/api/v1/receipts/{id}/parts/2"),
        &[("X-Service-Part-SHA256", &sha256_hex(b"other"))],
        p2,
    );
    assert_receipt_error(&bad, 400, "part checksum mismatch");
    assert_eq!(c.get(&id).json()["parts"].as_array().map(Vec::len), Some(2));
    // Gap: parts 1 and 3 only.
    assert_receipt_error(&c.complete(&id), 400, "parts not 1..N");
    assert_eq!(c.state(&id), "uploading");
    let r = c.req(
        "PUT",
        &format!("/api/v1/receipts/{id}/parts/2"),
        &[("X-Service-Part-SHA256", &sha256_hex(p2).to_uppercase())],
        p2,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for bad_number in ["0", "01", "x", "10001", "-1"] {
        let r = c.req(
            "PUT",
            &format!("/api/v1/receipts/{id}/parts/{bad_number}"),
            &[],
            b"x",
        );
        assert_receipt_error(&r, 400, "bad part number");
    }
    // Exact Content-Length: missing or chunked is refused, also for an empty part.
    let head = format!("PUT /api/v1/receipts/{id}/parts/4 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEPLOYMENT_TOKEN}\r\nConnection: close\r\n");
    assert_receipt_error(
        &raw(gw.api, format!("{head}\r\n").as_bytes()),
        411,
        "no Content-Length",
    );
    assert_receipt_error(
        &raw(
            gw.api,
            format!("{head}Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n").as_bytes(),
        ),
        411,
        "chunked part",
    );
    let too_big = format!("{head}Content-Length: {}\r\n\r\n", 129 * MIB);
    assert_receipt_error(&raw(gw.api, too_big.as_bytes()), 413, "part over the limit");

    // Complete: composes and verifies; a repeat is the same answer.
    let r = c.complete(&id);
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = r.json();
    assert_eq!(rec["state"], "verified");
    assert_eq!(
        rec["download_url"],
        format!("/api/v1/receipts/{id}/content")
    );
    assert!(rec.get("part_upload_template").is_none() && rec.get("complete_url").is_none());
    assert_eq!(c.complete(&id).json()["state"], "verified");
    // 409: no more parts after completion.
    assert_receipt_error(&c.put(&id, 4, b"late"), 409, "part after verified");

    // Content: exact length, octet-stream, checksum header, the bytes.
    let r = c.req("GET", &format!("/api/v1/receipts/{id}/content"), &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(
        r.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(
        r.header("x-service-sha256"),
        Some(sha256_hex(&body).as_str())
    );
    assert!(r.body == body, "{name}: downloaded bytes differ");
    assert_receipt_error(
        &other.req("GET", &format!("/api/v1/receipts/{id}/content"), &[], b""),
        404,
        "other deployment's content",
    );

    // Worker route: signed, short-lived, deployment-bound.
    let key = signing_key(&gw);
    let exp = unix_now() + 120;
    let ok = http(
        gw.api,
        "GET",
        &signed_path(&key, "dep_test", "req_1", &id, exp),
        &[],
        b"",
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(ok.body == body);
    assert_eq!(
        ok.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    let tampered = signed_path(&key, "dep_test", "req_1", &id, exp).replace("req_1", "req_2");
    assert_receipt_error(
        &http(gw.api, "GET", &tampered, &[], b""),
        403,
        "tampered signature",
    );
    let expired = signed_path(&key, "dep_test", "req_1", &id, unix_now() - 1);
    assert_receipt_error(
        &http(gw.api, "GET", &expired, &[], b""),
        403,
        "expired signature",
    );
    let wrong_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[1; 32]);
    assert_receipt_error(
        &http(
            gw.api,
            "GET",
            &signed_path(&wrong_key, "dep_test", "req_1", &id, exp),
            &[],
            b"",
        ),
        403,
        "wrong key",
    );
    assert_receipt_error(
        &http(
            gw.api,
            "GET",
            &format!("/api/v1/receipt-objects/{id}"),
            &[],
            b"",
        ),
        403,
        "unsigned",
    );
    let elsewhere = signed_path(&key, "dep_other", "req_1", &id, exp);
    assert_receipt_error(
        &http(gw.api, "GET", &elsewhere, &[], b""),
        404,
        "signed for another deployment",
    );

    // A request receipt is not downloadable by the client; an uploading one neither.
    let req_body = data(1000, 2);
    let req_id = c.verified("request", &req_body, 300);
    assert_receipt_error(
        &c.req(
            "GET",
            &format!("/api/v1/receipts/{req_id}/content"),
            &[],
            b"",
        ),
        409,
        "request receipt content",
    );
    let up = c.create("response", b"abc", None).json()["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    assert_receipt_error(
        &c.req("GET", &format!("/api/v1/receipts/{up}/content"), &[], b""),
        409,
        "uploading content",
    );
    assert_receipt_error(&c.complete(&up), 400, "complete without parts");

    // A zero-byte receipt: one empty part with Content-Length: 0.
    let empty = c.verified("response", b"", 1);
    let r = c.req(
        "GET",
        &format!("/api/v1/receipts/{empty}/content"),
        &[],
        b"",
    );
    assert_eq!((r.status, r.header("content-length")), (200, Some("0")));

    // Mismatch at completion: rejected, never verified; complete again is 409.
    let declared = data(2000, 3);
    let bad_id = c.create("request", &declared, None).json()["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    assert_eq!(c.put(&bad_id, 1, &data(2000, 4)).status, 200);
    // A mismatch is an outcome: 200 with the record, which says rejected and why.
    let r = c.complete(&bad_id);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "rejected");
    let rec = c.get(&bad_id).json();
    assert_eq!(rec["state"], "rejected");
    assert!(
        rec["failure"]
            .as_str()
            .is_some_and(|f| f.contains("SHA-256")),
        "{rec}"
    );
    assert_receipt_error(&c.complete(&bad_id), 409, "complete of rejected");
    let short_id = c.create("request", &declared, None).json()["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    assert_eq!(c.put(&short_id, 1, &declared[..1999]).status, 200);
    let r = c.complete(&short_id);
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (200, json!("rejected"))
    );
    assert!(r.json()["failure"]
        .as_str()
        .is_some_and(|f| f.contains("size")));

    // Cancel: payload removed, repeat safe, then nothing works on it.
    let cancel_id = c.verified("response", &data(5000, 5), 2000);
    assert!(
        backend.has_payload(&gw.dir, &cancel_id),
        "{name}: payload on disk"
    );
    let r = c.req("DELETE", &format!("/api/v1/receipts/{cancel_id}"), &[], b"");
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (200, json!("cancelled"))
    );
    let r = c.req("DELETE", &format!("/api/v1/receipts/{cancel_id}"), &[], b"");
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (200, json!("cancelled"))
    );
    assert!(
        !backend.has_payload(&gw.dir, &cancel_id),
        "{name}: payload removed"
    );
    assert_receipt_error(
        &c.req(
            "GET",
            &format!("/api/v1/receipts/{cancel_id}/content"),
            &[],
            b"",
        ),
        409,
        "content of cancelled",
    );
    assert_receipt_error(&c.complete(&cancel_id), 409, "complete of cancelled");
    assert_receipt_error(&c.put(&cancel_id, 1, b"x"), 409, "part of cancelled");
    let r = c.req("DELETE", &format!("/api/v1/receipts/{bad_id}"), &[], b"");
    assert_eq!(r.json()["state"], "cancelled", "rejected receipts cancel");

    // S3 composition: parts of at least 5 MiB are copied server-side; smaller ones streamed.
    let big = data(11 * MIB + 7, 6);
    let big_id = c.verified("response", &big, 5 * MIB);
    let r = c.req(
        "GET",
        &format!("/api/v1/receipts/{big_id}/content"),
        &[],
        b"",
    );
    assert!(
        r.status == 200 && r.body == big,
        "{name}: large receipt round trip"
    );

    // A response body of unknown length larger than one 8 MiB upload piece (S3: a multipart
    // upload of its own) goes into a receipt whole.
    let chunked_up = Upstream::start(upstream::large_chunked(12 * MIB + 3));
    let r = support::gateway::request_api(
        &gw,
        &json!({"method":"GET","url":chunked_up.url("/"),"response_body_mode":"receipt"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let want = upstream::pattern(12 * MIB + 3);
    assert_eq!(r.json()["body"]["sha256_hex"], sha256_hex(&want));
    let rid = r.json()["body"]["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    let got = c.req("GET", &format!("/api/v1/receipts/{rid}/content"), &[], b"");
    assert!(
        got.status == 200 && got.body == want,
        "{name}: chunked response receipt"
    );

    // 500: the object store fails under the gateway.
    let broken = c.create("request", b"abc", None).json()["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    match backend {
        Backend::Fs => {
            let objects = gw.dir.join("data/objects");
            std::fs::remove_dir_all(&objects).expect("remove objects");
            std::fs::write(&objects, b"not a directory").expect("block objects");
        }
        Backend::S3(s) => {
            // The S3 service goes away (SIGKILL); its Drop reaps it.
            let pid = s.child.id().to_string();
            let killed = Command::new("kill").args(["-KILL", &pid]).status();
            assert!(killed.is_ok_and(|st| st.success()), "kill s3s-fs");
            wait_until(Duration::from_secs(10), "s3s-fs stops listening", || {
                TcpStream::connect(("127.0.0.1", s.port)).is_err()
            });
        }
    }
    assert_receipt_error(&c.put(&broken, 1, b"abc"), 500, "storage failure");
    assert_eq!(
        c.get(&broken).json()["parts"],
        json!([]),
        "a failed part is not recorded"
    );
}

fn expiry(backend: &Backend) {
    let gw = backend.gateway("receipt_ttl_seconds = 2\n", None);
    let c = Client::new(&gw, DEPLOYMENT_TOKEN);
    let id = c.verified("response", &data(4000, 7), 1000);
    let uploading = c.create("request", b"abc", None).json()["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    assert!(backend.has_payload(&gw.dir, &id));
    wait_until(
        Duration::from_secs(20),
        "the sweep expires the receipts",
        || c.state(&id) == "expired" && c.state(&uploading) == "expired",
    );
    wait_until(
        Duration::from_secs(10),
        "the expired payload is removed",
        || !backend.has_payload(&gw.dir, &id),
    );
    assert_receipt_error(
        &c.req("GET", &format!("/api/v1/receipts/{id}/content"), &[], b""),
        409,
        "expired content",
    );
    assert_receipt_error(&c.complete(&uploading), 409, "complete of expired");
    // DELETE of an expired receipt is allowed (decision 004).
    let r = c.req("DELETE", &format!("/api/v1/receipts/{id}"), &[], b"");
    assert_eq!(r.json()["state"], "cancelled");
}

/// Kills the gateway with SIGKILL while `complete` composes, restarts it on the same data, and
/// checks that the receipt is never `verified` without its complete payload and recovers.
fn crash_during_complete(backend: &Backend) {
    let dir = temp_dir("crash");
    let body = data(48 * MIB, 8);
    let sha = sha256_hex(&body);
    let mut killed_while_verifying = false;
    for _attempt in 0..6 {
        let mut gw = backend.gateway("", Some(dir.clone()));
        let c = Client::new(&gw, DEPLOYMENT_TOKEN);
        let r = c.create("response", &body, None);
        let id = r.json()["receipt_id"].as_str().expect("id").to_string();
        for (i, part) in body.chunks(12 * MIB).enumerate() {
            assert_eq!(c.put(&id, i as u32 + 1, part).status, 200);
        }
        let addr = gw.api;
        let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
        let path = format!("/api/v1/receipts/{id}/complete");
        let completer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).expect("connect");
            let req = format!("POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = s.write_all(req.as_bytes());
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = String::new();
        while Instant::now() < deadline {
            seen = c.state(&id);
            if seen != "uploading" {
                break;
            }
        }
        if seen == "verifying" {
            let _ = gw.child.kill(); // SIGKILL
            killed_while_verifying = true;
        } else {
            let _ = gw.child.kill();
        }
        let _ = gw.child.wait();
        let _ = completer.join();
        drop(gw);

        let gw = backend.gateway("", Some(dir.clone()));
        let c = Client::new(&gw, DEPLOYMENT_TOKEN);
        let state = c.state(&id);
        match state.as_str() {
            "verified" => {
                let r = c.req("GET", &format!("/api/v1/receipts/{id}/content"), &[], b"");
                assert_eq!(r.status, 200);
                assert_eq!(
                    sha256_hex(&r.body),
                    sha,
                    "verified implies the whole payload"
                );
            }
            "uploading" => {
                if let Backend::Fs = backend {
                    let leftovers: Vec<_> = std::fs::read_dir(backend.receipt_dir(&gw.dir, &id))
                        .expect("receipt dir")
                        .flatten()
                        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
                        .collect();
                    assert!(leftovers.is_empty(), "temp files survive the restart");
                }
                let r = c.complete(&id);
                assert_eq!(r.status, 200, "complete after recovery: {}", r.text());
                assert_eq!(r.json()["state"], "verified");
                let r = c.req("GET", &format!("/api/v1/receipts/{id}/content"), &[], b"");
                assert_eq!(sha256_hex(&r.body), sha);
            }
            other => panic!("state after kill -9 during complete: {other}"),
        }
        if killed_while_verifying {
            assert_eq!(
                state, "uploading",
                "a receipt killed in verifying recovers to uploading"
            );
            return;
        }
    }
    panic!("never caught complete in the verifying state in 6 attempts");
}

/// The upstream of the request API tests, by path: `/hash` answers with the size and SHA-256 of
/// the body it received, `/slow` does the same after a pause, `/big` sends 5 MiB and `/small`
/// 1 MiB with a `Content-Length`, `/chunked` 3 MiB chunked, `/reset` part of a body then a reset, `/refuse`
/// a reset before any answer.
fn upstream() -> Upstream {
    let big = upstream::response(200, &[], &upstream::pattern(5 * MIB));
    let small = upstream::response(200, &[], &upstream::pattern(MIB));
    let chunked = upstream::large_chunked(3 * MIB);
    let mid = upstream::reset_mid_body();
    Upstream::start(std::sync::Arc::new(move |r: &upstream::Request| {
        let hashed = || {
            let text = format!("{} {}", r.body.len(), sha256_hex(&r.body));
            upstream::Step::Write(upstream::response(200, &[], text.as_bytes()))
        };
        match r.target.as_str() {
            "/hash" => vec![hashed()],
            "/slow" => vec![upstream::Step::Pause(Duration::from_millis(1500)), hashed()],
            "/big" => vec![upstream::Step::Write(big.clone())],
            "/small" => vec![upstream::Step::Write(small.clone())],
            "/chunked" => chunked(r),
            "/reset" => mid(r),
            _ => vec![upstream::Step::Reset],
        }
    }))
}

fn send(gw: &Gateway, envelope: serde_json::Value) -> Resp {
    support::gateway::request_api(gw, &envelope)
}

fn assert_api_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "{code}: {}", r.text());
    assert_eq!(r.json()["code"], code, "{}", r.text());
}

fn inline_body(r: &Resp) -> String {
    String::from_utf8(unb64(&r.json()["body"]["data_base64"])).expect("utf-8")
}

/// The request API's receipt modes on this backend.
fn request_api(backend: &Backend) {
    let up = upstream();
    let gw = backend.gateway("max_object_bytes = 4194304\n", None);
    let c = Client::new(&gw, DEPLOYMENT_TOKEN);
    let other = Client::new(&gw, OTHER_TOKEN);
    let body = data(3 * MIB + 5, 9);
    let id = c.verified("request", &body, MIB);

    // A request body from a receipt: streamed to the upstream, then consumed.
    let r = send(
        &gw,
        json!({"method":"POST","url":up.url("/hash"),"body":{"mode":"receipt","receipt_id":id}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        inline_body(&r),
        format!("{} {}", body.len(), sha256_hex(&body))
    );
    assert_eq!(c.state(&id), "consumed");
    assert_receipt_error(
        &c.req("DELETE", &format!("/api/v1/receipts/{id}"), &[], b""),
        409,
        "cancel consumed",
    );
    let again = send(
        &gw,
        json!({"method":"POST","url":up.url("/hash"),"body":{"mode":"receipt","receipt_id":id}}),
    );
    assert_api_error(&again, 409, "body_ref_unavailable");

    // Unknown, another deployment's, not verified, or a response receipt: unavailable.
    let theirs = other.verified("request", b"theirs", 6);
    let uploading = c.create("request", b"abc", None).json()["receipt_id"]
        .as_str()
        .expect("id")
        .to_string();
    let response_kind = c.verified("response", b"resp", 4);
    for rid in [
        "rcpt_0123456789abcdef0123456789abcdef",
        &theirs,
        &uploading,
        &response_kind,
    ] {
        let r = send(
            &gw,
            json!({"method":"POST","url":up.url("/hash"),"body":{"mode":"receipt","receipt_id":rid}}),
        );
        assert_api_error(&r, 409, "body_ref_unavailable");
    }

    // A failed attempt gives the receipt back (verified); while assigned it cannot be cancelled.
    let id2 = c.verified("request", &body[..1000], 1000);
    let r = send(
        &gw,
        json!({"method":"POST","url":up.url("/refuse"),"body":{"mode":"receipt","receipt_id":id2}}),
    );
    assert!(r.status >= 500, "{}", r.text());
    wait_until(
        Duration::from_secs(10),
        "the failed assignment is released",
        || c.state(&id2) == "verified",
    );
    let gw_api = gw.api;
    let slow_url = up.url("/slow");
    let id2c = id2.clone();
    let slow = std::thread::spawn(move || {
        let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
        let env =
            json!({"method":"POST","url":slow_url,"body":{"mode":"receipt","receipt_id":id2c}});
        http(
            gw_api,
            "POST",
            "/api/v1/requests",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            env.to_string().as_bytes(),
        )
    });
    wait_until(Duration::from_secs(10), "the receipt is assigned", || {
        c.state(&id2) == "assigned"
    });
    assert_receipt_error(
        &c.req("DELETE", &format!("/api/v1/receipts/{id2}"), &[], b""),
        409,
        "cancel assigned",
    );
    let r = slow.join().expect("slow request");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(c.state(&id2), "consumed");

    // A stored body that cannot be read: stream_upload_aborted, and the receipt is released.
    let id3 = c.verified("request", &body[..2000], 2000);
    for f in std::fs::read_dir(backend.receipt_dir(&gw.dir, &id3))
        .expect("payload dir")
        .flatten()
    {
        std::fs::remove_file(f.path()).expect("remove payload");
    }
    let r = send(
        &gw,
        json!({"method":"POST","url":up.url("/hash"),"body":{"mode":"receipt","receipt_id":id3}}),
    );
    assert_api_error(&r, 502, "stream_upload_aborted");

    // Response bodies into receipts: Content-Length and chunked, hashed on the way.
    for (path, want) in [
        ("/small", upstream::pattern(MIB)),
        ("/chunked", upstream::pattern(3 * MIB)),
    ] {
        let r = send(
            &gw,
            json!({"method":"GET","url":up.url(path),"response_body_mode":"receipt"}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let b = &r.json()["body"];
        assert_eq!(b["mode"], "receipt");
        assert_eq!(b["size_bytes"], want.len());
        assert_eq!(b["sha256_hex"], sha256_hex(&want));
        let rid = b["receipt_id"].as_str().expect("id").to_string();
        assert_eq!(c.state(&rid), "verified");
        let got = c.req("GET", &format!("/api/v1/receipts/{rid}/content"), &[], b"");
        assert!(
            got.status == 200 && got.body == want,
            "{path}: downloaded body differs"
        );
        assert_receipt_error(
            &other.get(&rid),
            404,
            "response receipt of another deployment",
        );
    }

    // Over object_storage.max_object_bytes (4 MiB): body_too_large, no object left behind.
    let before = object_files(backend, &gw.dir);
    assert!(
        before.len() >= 2,
        "the receipts stored above are not where the check looks: {before:?}"
    );
    let r = send(
        &gw,
        json!({"method":"GET","url":up.url("/big"),"response_body_mode":"receipt"}),
    );
    assert_api_error(&r, 413, "body_too_large");
    // A broken upstream body: stream_download_aborted, nothing stored.
    let r = send(
        &gw,
        json!({"method":"GET","url":up.url("/reset"),"response_body_mode":"receipt"}),
    );
    assert_api_error(&r, 502, "stream_download_aborted");
    assert_eq!(
        object_files(backend, &gw.dir),
        before,
        "no partial object is stored"
    );
}

/// Every file under the backend's whole store (objects, and the parts and temporary files a
/// partial upload would leave: s3s-fs keeps multipart parts beside the buckets).
fn object_files(backend: &Backend, gw_dir: &Path) -> Vec<PathBuf> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for e in entries {
            let e = e.unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            } else {
                out.push(e.path());
            }
        }
    }
    let root = match backend {
        Backend::Fs => gw_dir.join("data/objects"),
        Backend::S3(s) => s.dir.clone(),
    };
    let mut out = Vec::new();
    walk(&root, &mut out);
    out.sort();
    out
}

#[test]
fn request_api_with_receipts_on_fs() {
    request_api(&Backend::Fs);
}

#[test]
fn request_api_with_receipts_on_s3() {
    request_api(&Backend::S3(S3Server::start()));
}

#[test]
fn receipts_on_fs() {
    suite(&Backend::Fs);
}

#[test]
fn receipts_on_s3() {
    suite(&Backend::S3(S3Server::start()));
}

#[test]
fn receipts_expire_on_fs() {
    expiry(&Backend::Fs);
}

#[test]
fn receipts_expire_on_s3() {
    expiry(&Backend::S3(S3Server::start()));
}

#[test]
fn kill_during_complete_on_fs() {
    crash_during_complete(&Backend::Fs);
}

#[test]
fn kill_during_complete_on_s3() {
    crash_during_complete(&Backend::S3(S3Server::start()));
}
