//! The receipt API from a test client: digests, calls with the test deployment's token, and a
//! verified request receipt in two parts.

use super::gateway::{http, Gateway, Resp, DEPLOYMENT_TOKEN};

/// SHA-256 of `data`, lowercase hex, as the receipt API takes and answers it.
pub fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `/api/v1/receipts…` on the gateway's API listener with the test deployment's token.
pub fn receipts_call(gw: &Gateway, method: &str, path: &str, body: &[u8]) -> Resp {
    let auth = format!("Bearer {DEPLOYMENT_TOKEN}");
    let mut headers = vec![("Authorization", auth.as_str())];
    if method == "POST" && !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    http(gw.api, method, path, &headers, body)
}

/// Creates a request receipt for `body` and returns its id.
pub fn create_request_receipt(gw: &Gateway, body: &[u8]) -> String {
    let create = serde_json::json!({"direction": "request", "size_bytes": body.len(),
                                    "sha256_hex": sha256_hex(body)});
    let r = receipts_call(
        gw,
        "POST",
        "/api/v1/receipts",
        create.to_string().as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["receipt_id"].as_str().expect("id").to_string()
}

/// Uploads part `n` of receipt `id`.
pub fn put_part(gw: &Gateway, id: &str, n: u32, part: &[u8]) {
    let r = receipts_call(gw, "PUT", &format!("/api/v1/receipts/{id}/parts/{n}"), part);
    assert_eq!(r.status, 200, "part {n}: {}", r.text());
}

/// Completes receipt `id` (the gateway verifies size and SHA-256).
pub fn complete(gw: &Gateway, id: &str) {
    let r = receipts_call(gw, "POST", &format!("/api/v1/receipts/{id}/complete"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Creates a request receipt, uploads it in two parts and completes it.
pub fn verified_receipt(gw: &Gateway, body: &[u8]) -> String {
    let id = create_request_receipt(gw, body);
    let half = body.len() / 2;
    put_part(gw, &id, 1, &body[..half]);
    put_part(gw, &id, 2, &body[half..]);
    complete(gw, &id);
    id
}

/// The state of receipt `id` (empty when it cannot be read).
pub fn receipt_state(gw: &Gateway, id: &str) -> String {
    let r = receipts_call(gw, "GET", &format!("/api/v1/receipts/{id}"), b"");
    r.json()["state"].as_str().unwrap_or_default().to_string()
}
