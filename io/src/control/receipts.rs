//! The receipt API (spec, Receipt API): create, read, cancel, upload parts, complete, download,
//! and the signed worker route. Records live in the record store and payloads in the object
//! store, both on the cold thread; bodies cross to it in bounded chunks.
//!
//! Consistency across a crash (decision 034): a part's row is written only after its payload is
//! durable; `verifying` is written before composing and `verified` only after the composed
//! object is durable and matched the declared size and SHA-256; startup turns `verifying` back
//! into `uploading` and `assigned` back into `verified`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ring::hmac;
use sortie_core::error::{receipt_error_json, ReceiptErrorKind as Kind};
use sortie_core::receipt::{
    check_parts, decode_new_receipt, parse_part_number, ReceiptEvent, ReceiptState,
};
use tokio::sync::mpsc;

use crate::http::{Body, Response, ResponseBody, StreamBody};
use crate::store::objects::{self, hex, ObjectError, CHUNK_BYTES, CHUNK_QUEUE};
use crate::store::{ColdHandle, PartRecord, ReceiptRecord, StoreError};

/// Prefix of the client routes.
pub const RECEIPTS_PATH: &str = "/api/v1/receipts";
/// Prefix of the worker route.
pub const RECEIPT_OBJECTS_PATH: &str = "/api/v1/receipt-objects";
pub use sortie_core::limits::{
    MAX_RECEIPT_METADATA_BYTES as MAX_METADATA_BYTES, MAX_RECEIPT_PART_BYTES as MAX_PART_BYTES,
    MAX_SIGNED_URL_SECONDS,
};
/// Lifetime of the signed worker URLs this gateway issues (decision 033).
pub const SIGNED_URL_SECONDS: u64 = 300;
/// Name of the signing key file in the data directory.
pub const SIGNING_KEY_FILE: &str = "receipt-signing.key";
/// Receipts the sweep expires per round.
const SWEEP_BATCH: usize = 256;

/// What the receipt routes need; one per process, shared by every core.
pub struct Receipts {
    cold: ColdHandle,
    max_object_bytes: u64,
    ttl: Duration,
    signing_key: hmac::Key,
}

/// The answer of a receipt route that failed with `kind`: its status, and `message` in the
/// receipt error body.
pub(crate) fn error(kind: Kind, message: &str) -> Response {
    Response::json(kind.http_status(), receipt_error_json(message))
}

/// The answer to a refused state transition.
fn transition_error(e: &sortie_core::receipt::TransitionError) -> Response {
    error(e.kind(), &e.to_string())
}

fn storage_error(e: &StoreError) -> Response {
    tracing::warn!(error = %e, "receipt store failure");
    error(Kind::StorageFailure, "unexpected storage failure")
}

fn object_error(e: &ObjectError) -> Response {
    tracing::warn!(error = %e, "object store failure");
    error(Kind::StorageFailure, "unexpected storage failure")
}

fn not_found() -> Response {
    error(Kind::NotFound, "unknown receipt")
}

/// The `{id}` of a path is a receipt id or it names nothing.
fn valid_id(id: &str) -> bool {
    sortie_core::ids::is_receipt_id(id)
}

/// The record as JSON (spec, Receipt record).
pub fn record_json(r: &ReceiptRecord) -> Vec<u8> {
    let base = format!("{RECEIPTS_PATH}/{}", r.receipt_id);
    let parts: Vec<serde_json::Value> = r
        .parts
        .iter()
        .map(|p| {
            serde_json::json!({
                "number": p.number,
                "size_bytes": p.size_bytes,
                "sha256_hex": p.sha256_hex,
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "receipt_id": r.receipt_id,
        "direction": r.direction,
        "state": r.state.as_str(),
        "size_bytes": r.size_bytes,
        "sha256_hex": r.sha256_hex,
        "parts": parts,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "expires_at": r.expires_at,
        "status_url": base,
    });
    if let Some(obj) = v.as_object_mut() {
        if r.state.exposes_upload_urls() {
            obj.insert(
                "part_upload_template".into(),
                format!("{base}/parts/{{part}}").into(),
            );
            obj.insert("complete_url".into(), format!("{base}/complete").into());
        }
        if r.direction == "response" && r.state.exposes_download_url() {
            obj.insert("download_url".into(), format!("{base}/content").into());
        }
        if let Some(f) = &r.failure {
            obj.insert("failure".into(), f.clone().into());
        }
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

fn record_response(status: u16, r: &ReceiptRecord) -> Response {
    Response::json(status, record_json(r))
}

/// A route of the client API, parsed from method and path.
enum Route<'a> {
    Create,
    Get(&'a str),
    Cancel(&'a str),
    Part(&'a str, &'a str),
    Complete(&'a str),
    Content(&'a str),
}

fn route<'a>(method: &str, path: &'a str) -> Option<Route<'a>> {
    let rest = path.strip_prefix(RECEIPTS_PATH)?;
    if rest.is_empty() {
        return (method == "POST").then_some(Route::Create);
    }
    let rest = rest.strip_prefix('/')?;
    let mut it = rest.split('/');
    let id = it.next()?;
    match (method, it.next(), it.next(), it.next()) {
        ("GET" | "HEAD", None, _, _) => Some(Route::Get(id)),
        ("DELETE", None, _, _) => Some(Route::Cancel(id)),
        ("PUT", Some("parts"), Some(n), None) => Some(Route::Part(id, n)),
        ("POST", Some("complete"), None, _) => Some(Route::Complete(id)),
        ("GET" | "HEAD", Some("content"), None, _) => Some(Route::Content(id)),
        _ => None,
    }
}

/// How a client request is admitted from its head: its body limit, or an answer.
pub fn admit(
    method: &str,
    path: &str,
    content_length: Option<u64>,
    is_chunked: bool,
) -> Result<u64, Response> {
    match route(method, path) {
        Some(Route::Create) => {
            if content_length.is_some_and(|n| n > MAX_METADATA_BYTES as u64) {
                return Err(error(
                    Kind::TooLarge,
                    "receipt metadata is larger than 64 KiB",
                ));
            }
            Ok(MAX_METADATA_BYTES as u64 + 1)
        }
        Some(Route::Part(..)) => match content_length {
            _ if is_chunked => Err(error(
                Kind::LengthRequired,
                "a part needs an exact Content-Length, not chunked",
            )),
            None => Err(error(
                Kind::LengthRequired,
                "a part needs an exact Content-Length header",
            )),
            Some(n) if n > MAX_PART_BYTES => Err(error(
                Kind::TooLarge,
                &format!("a part is at most {MAX_PART_BYTES} bytes"),
            )),
            Some(n) => Ok(n),
        },
        Some(_) => Ok(0),
        None => Err(error(Kind::NotFound, "unknown receipt route")),
    }
}

impl Receipts {
    /// The receipt service over the cold thread, with the signing key from
    /// `object_storage.signing_key_env` when set (shared by several controls, decision 093),
    /// else read (or created) in `data_dir`.
    pub fn new(
        cold: ColdHandle,
        config: &sortie_core::config::ObjectStorageConfig,
        data_dir: &Path,
    ) -> Result<Receipts, SigningKeyError> {
        let key = match &config.signing_key_env {
            Some(name) => signing_key_from_env(name)?,
            None => load_signing_key(data_dir)?,
        };
        Ok(Receipts {
            cold,
            max_object_bytes: config.max_object_bytes,
            ttl: Duration::from_secs(config.receipt_ttl_seconds),
            signing_key: hmac::Key::new(hmac::HMAC_SHA256, &key),
        })
    }

    /// The cold-thread handle.
    pub fn cold(&self) -> &ColdHandle {
        &self.cold
    }

    /// `object_storage.max_object_bytes`.
    pub fn max_object_bytes(&self) -> u64 {
        self.max_object_bytes
    }

    /// Answers one client route of an authenticated deployment.
    pub async fn handle(
        &self,
        deployment: &str,
        method: &str,
        path: &str,
        part_sha256: Option<&[u8]>,
        body: &mut Body<'_>,
    ) -> Response {
        let Some(route) = route(method, path) else {
            return error(Kind::NotFound, "unknown receipt route");
        };
        match route {
            Route::Create => self.create(deployment, body).await,
            Route::Get(id) if valid_id(id) => match self.load(deployment, id).await {
                Ok(Some(r)) => record_response(200, &r),
                Ok(None) => not_found(),
                Err(e) => storage_error(&e),
            },
            Route::Cancel(id) if valid_id(id) => self.cancel(deployment, id).await,
            Route::Part(id, n) if valid_id(id) => {
                self.put_part(deployment, id, n, part_sha256, body).await
            }
            Route::Complete(id) if valid_id(id) => self.complete(deployment, id).await,
            Route::Content(id) if valid_id(id) => self.content(deployment, id).await,
            _ => not_found(),
        }
    }

    /// The receipt `id` of `deployment`.
    pub async fn load(
        &self,
        deployment: &str,
        id: &str,
    ) -> Result<Option<ReceiptRecord>, StoreError> {
        let (d, i) = (deployment.to_owned(), id.to_owned());
        self.cold.call(move |s| s.receipt(&d, &i)).await
    }

    /// Compare-and-set of a receipt's state.
    pub async fn set_state(
        &self,
        deployment: &str,
        id: &str,
        from: ReceiptState,
        to: ReceiptState,
        failure: Option<String>,
    ) -> Result<bool, StoreError> {
        let (d, i) = (deployment.to_owned(), id.to_owned());
        let now = crate::clock::now_rfc3339();
        self.cold
            .call(move |s| s.set_receipt_state(&d, &i, from, to, &now, failure.as_deref()))
            .await
    }

    /// Assigns a verified receipt to the attempt `attempt` (decision 098).
    pub async fn assign(
        &self,
        deployment: &str,
        id: &str,
        attempt: &str,
    ) -> Result<bool, StoreError> {
        let (d, i, a) = (deployment.to_owned(), id.to_owned(), attempt.to_owned());
        let now = crate::clock::now_rfc3339();
        self.cold
            .call(move |s| s.assign_receipt(&d, &i, &a, &now))
            .await
    }

    async fn create(&self, deployment: &str, body: &mut Body<'_>) -> Response {
        let mut bytes = match body.read_to_end(MAX_METADATA_BYTES as u64).await {
            Ok(b) => b,
            Err(crate::http::BodyError::TooLarge) => {
                return error(Kind::TooLarge, "receipt metadata is larger than 64 KiB").closing()
            }
            Err(e) => {
                return error(Kind::Malformed, &format!("request body: {}", e.reason())).closing()
            }
        };
        let req = match decode_new_receipt(&mut bytes, self.max_object_bytes) {
            Ok(r) => r,
            Err(why) => return error(Kind::Malformed, &why),
        };
        let record = self.new_record(
            deployment,
            &req.direction,
            req.size_bytes,
            req.sha256_hex,
            req.idempotency_key,
        );
        let id = record.receipt_id.clone();
        let want = record.clone();
        match self.cold.call(move |s| s.create_receipt(&record)).await {
            Ok(stored) if stored.receipt_id == id => record_response(201, &stored),
            // Same idempotency key: the same identity is a safe retry with the same answer.
            Ok(stored)
                if stored.direction == want.direction
                    && stored.size_bytes == want.size_bytes
                    && stored.sha256_hex == want.sha256_hex =>
            {
                record_response(201, &stored)
            }
            Ok(_) => error(
                Kind::IllegalTransition,
                "idempotency_key was used for a receipt with another direction, size or checksum",
            ),
            Err(e) => storage_error(&e),
        }
    }

    /// A fresh `uploading` record.
    pub fn new_record(
        &self,
        deployment: &str,
        direction: &str,
        size_bytes: u64,
        sha256_hex: String,
        idempotency_key: Option<String>,
    ) -> ReceiptRecord {
        let now_ms = crate::clock::unix_ms();
        let now = crate::clock::rfc3339(now_ms);
        let expires_ms =
            now_ms.saturating_add(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX));
        ReceiptRecord {
            receipt_id: sortie_core::ids::receipt_id(crate::tokens::random_bytes()),
            deployment_id: deployment.to_owned(),
            direction: direction.to_owned(),
            state: ReceiptState::INITIAL,
            size_bytes,
            sha256_hex,
            idempotency_key,
            parts: Vec::new(),
            created_at: now.clone(),
            updated_at: now,
            expires_at: crate::clock::rfc3339(expires_ms),
            expires_unix_ms: expires_ms,
            failure: None,
        }
    }

    async fn cancel(&self, deployment: &str, id: &str) -> Response {
        // A concurrent change can beat the compare-and-set; re-read and apply again.
        for _ in 0..4 {
            let r = match self.load(deployment, id).await {
                Ok(Some(r)) => r,
                Ok(None) => return not_found(),
                Err(e) => return storage_error(&e),
            };
            let t = match r.state.apply(ReceiptEvent::Cancel) {
                Ok(t) => t,
                Err(e) => return transition_error(&e),
            };
            if !t.is_unchanged() {
                match self.set_state(deployment, id, t.from, t.to, None).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => return storage_error(&e),
                }
            }
            if let Err(e) = self.remove_payload(id).await {
                return object_error(&e);
            }
            return match self.load(deployment, id).await {
                Ok(Some(r)) => record_response(200, &r),
                Ok(None) => not_found(),
                Err(e) => storage_error(&e),
            };
        }
        error(
            Kind::IllegalTransition,
            "the receipt changed while being cancelled; retry",
        )
    }

    /// Removes every object of a receipt (idempotent).
    pub async fn remove_payload(&self, id: &str) -> Result<(), ObjectError> {
        let prefix = objects::receipt_prefix(id);
        self.cold
            .run_task(move |ctx| async move {
                match ctx.objects() {
                    Some(o) => Ok(o.delete_prefix(&prefix).await),
                    None => Ok(Ok(())),
                }
            })
            .await
            .unwrap_or_else(|e| Err(ObjectError::Backend(e.to_string())))
    }

    /// Streams `len` bytes of `body` into a new object at `key` on the cold thread, in chunks
    /// of up to [`CHUNK_BYTES`]. Returns the stored size and SHA-256.
    async fn upload(
        &self,
        key: String,
        len: u64,
        body: &mut Body<'_>,
    ) -> Result<objects::Digested, UploadError> {
        let (tx, mut rx) = mpsc::channel::<Bytes>(CHUNK_QUEUE);
        let store = self.cold.run_task(move |ctx| async move {
            match ctx.objects() {
                Some(o) => Ok(o.put(&key, len, &mut rx).await),
                None => Ok(Err(ObjectError::Backend(
                    "object storage is disabled".into(),
                ))),
            }
        });
        let feed = async move {
            let mut pending = BytesMut::new();
            loop {
                match body.read_chunk().await {
                    Ok(Some(chunk)) => {
                        pending.extend_from_slice(&chunk);
                        if pending.len() >= CHUNK_BYTES
                            && tx.send(pending.split().freeze()).await.is_err()
                        {
                            return Ok(());
                        }
                    }
                    Ok(None) => {
                        if !pending.is_empty() {
                            let _ = tx.send(pending.split().freeze()).await;
                        }
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let (stored, fed) = futures_util::future::join(store, feed).await;
        fed.map_err(UploadError::Body)?;
        match stored {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(UploadError::Object(e)),
            Err(e) => Err(UploadError::Store(e)),
        }
    }

    async fn put_part(
        &self,
        deployment: &str,
        id: &str,
        number: &str,
        part_sha256: Option<&[u8]>,
        body: &mut Body<'_>,
    ) -> Response {
        let number = match parse_part_number(number) {
            Ok(n) => n,
            Err(e) => return error(Kind::Malformed, &e.to_string()),
        };
        let want_sha = match part_sha256 {
            None => None,
            Some(v) => match std::str::from_utf8(v)
                .ok()
                .map(str::trim)
                .filter(|s| sortie_core::receipt::is_sha256_hex(s))
            {
                Some(s) => Some(s.to_ascii_lowercase()),
                None => {
                    return error(
                        Kind::Malformed,
                        "X-Service-Part-SHA256 must be 64 hexadecimal characters",
                    )
                }
            },
        };
        let r = match self.load(deployment, id).await {
            Ok(Some(r)) => r,
            Ok(None) => return not_found(),
            Err(e) => return storage_error(&e),
        };
        if let Err(e) = r.state.apply(ReceiptEvent::UploadPart) {
            return transition_error(&e);
        }
        let len = match body.framing() {
            sortie_core::h1::BodyFraming::ContentLength(n) => n,
            _ => 0,
        };
        let others: u64 = r
            .parts
            .iter()
            .filter(|p| p.number != number)
            .map(|p| p.size_bytes)
            .sum();
        if others.saturating_add(len) > self.max_object_bytes.max(r.size_bytes) {
            return error(
                Kind::TooLarge,
                "the parts would exceed object_storage.max_object_bytes",
            )
            .closing();
        }
        let key = objects::part_key(id, number);
        let digest = match self.upload(key.clone(), len, body).await {
            Ok(d) => d,
            Err(UploadError::Body(e)) => {
                return error(Kind::Malformed, &format!("part body: {}", e.reason())).closing()
            }
            Err(UploadError::Object(e)) => return object_error(&e),
            Err(UploadError::Store(e)) => return storage_error(&e),
        };
        let sha = digest.sha256_hex();
        if want_sha.as_deref().is_some_and(|w| w != sha) {
            self.delete_object(key).await;
            return error(
                Kind::Malformed,
                "part SHA-256 does not match X-Service-Part-SHA256",
            );
        }
        let part = PartRecord {
            number,
            size_bytes: digest.size,
            sha256_hex: sha,
            object_key: key.clone(),
        };
        let replaced = r
            .parts
            .iter()
            .find(|p| p.number == number)
            .map(|p| p.object_key.clone());
        let (d, i) = (deployment.to_owned(), id.to_owned());
        let now = crate::clock::now_rfc3339();
        let stored = self
            .cold
            .call(move |s| {
                let ok = s.put_receipt_part(&d, &i, &part, &now)?;
                Ok((ok, s.receipt(&d, &i)?))
            })
            .await;
        match stored {
            Ok((true, Some(r))) => {
                if let Some(old) = replaced.filter(|k| *k != key) {
                    self.delete_object(old).await;
                }
                record_response(200, &r)
            }
            Ok((_, r)) => {
                self.delete_object(key).await;
                match r {
                    Some(r) => error(
                        Kind::IllegalTransition,
                        &format!("cannot upload a part to a receipt in state {}", r.state),
                    ),
                    None => not_found(),
                }
            }
            Err(e) => storage_error(&e),
        }
    }

    /// Removes one object, best effort: an object left behind is removed with its receipt's
    /// prefix at cancel or expiry.
    async fn delete_object(&self, key: String) {
        let _ = self
            .cold
            .run_task(move |ctx| async move {
                if let Some(o) = ctx.objects() {
                    let _ = o.delete(&key).await;
                }
                Ok(())
            })
            .await;
    }

    /// Back from verifying to uploading, best effort, so the client can retry a complete that
    /// verified nothing.
    async fn reopen(&self, deployment: &str, id: &str) {
        let _ = self
            .set_state(
                deployment,
                id,
                ReceiptState::Verifying,
                ReceiptState::Uploading,
                None,
            )
            .await;
    }

    async fn complete(&self, deployment: &str, id: &str) -> Response {
        let r = match self.load(deployment, id).await {
            Ok(Some(r)) => r,
            Ok(None) => return not_found(),
            Err(e) => return storage_error(&e),
        };
        let numbers: Vec<u32> = r.parts.iter().map(|p| p.number).collect();
        let t = match r.state.apply(ReceiptEvent::Complete(check_parts(&numbers))) {
            Ok(t) => t,
            Err(e) => return transition_error(&e),
        };
        if t.is_unchanged() {
            // A repeated complete of a verified receipt: the same answer again.
            return record_response(200, &r);
        }
        match self.set_state(deployment, id, t.from, t.to, None).await {
            Ok(true) => {}
            Ok(false) => {
                return error(
                    Kind::IllegalTransition,
                    "the receipt changed during complete; retry",
                )
            }
            Err(e) => return storage_error(&e),
        }
        // The parts read above may be stale: a part committed between that read and the
        // change to verifying (by another control, or a concurrent request) is stored too.
        // None can be added now (a part write requires `uploading`), so the parts read again
        // are the ones to compose.
        let reread = match self.load(deployment, id).await {
            Ok(Some(r)) if r.state == ReceiptState::Verifying => Ok(r),
            Ok(_) => Err(error(
                Kind::IllegalTransition,
                "the receipt changed during complete; retry",
            )),
            Err(e) => Err(storage_error(&e)),
        };
        let r = match reread.and_then(|r| {
            let numbers: Vec<u32> = r.parts.iter().map(|p| p.number).collect();
            match ReceiptState::Uploading.apply(ReceiptEvent::Complete(check_parts(&numbers))) {
                Ok(_) => Ok(r),
                Err(e) => Err(transition_error(&e)),
            }
        }) {
            Ok(r) => r,
            Err(answer) => {
                self.reopen(deployment, id).await;
                return answer;
            }
        };
        let parts: Vec<(String, u64)> = r
            .parts
            .iter()
            .map(|p| (p.object_key.clone(), p.size_bytes))
            .collect();
        let dest = objects::object_key(id);
        let composed = self
            .cold
            .run_task(move |ctx| async move {
                match ctx.objects() {
                    Some(o) => Ok(o.compose(&parts, &dest).await),
                    None => Ok(Err(ObjectError::Backend(
                        "object storage is disabled".into(),
                    ))),
                }
            })
            .await;
        let composed = match composed {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(object_error(&e)),
            Err(e) => Err(storage_error(&e)),
        };
        let digest = match composed {
            Ok(d) => d,
            Err(answer) => {
                self.reopen(deployment, id).await;
                return answer;
            }
        };
        let sha = digest.sha256_hex();
        let (to, failure) = if digest.size != r.size_bytes {
            (
                ReceiptState::Rejected,
                Some(format!(
                    "size mismatch: declared {} bytes, parts hold {}",
                    r.size_bytes, digest.size
                )),
            )
        } else if sha != r.sha256_hex {
            (
                ReceiptState::Rejected,
                Some(format!(
                    "SHA-256 mismatch: declared {}, parts hash to {sha}",
                    r.sha256_hex
                )),
            )
        } else {
            (ReceiptState::Verified, None)
        };
        match self
            .set_state(deployment, id, ReceiptState::Verifying, to, failure.clone())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return error(
                    Kind::IllegalTransition,
                    "the receipt changed during complete",
                )
            }
            Err(e) => return storage_error(&e),
        }
        if to == ReceiptState::Verified {
            // The composed object holds every byte; the parts are no longer needed.
            for p in &r.parts {
                self.delete_object(p.object_key.clone()).await;
            }
        }
        let r = match self.load(deployment, id).await {
            Ok(Some(r)) => r,
            Ok(None) => return not_found(),
            Err(e) => return storage_error(&e),
        };
        // A mismatch is an outcome, not a failed request: the record says `rejected` and
        // carries `failure` (the published OpenAPI document answers 200 either way).
        record_response(200, &r)
    }

    /// Starts streaming a verified receipt's object; the receiver yields its bytes in order.
    pub fn open_object(&self, id: &str, len: u64) -> Result<mpsc::Receiver<Bytes>, StoreError> {
        let (tx, rx) = mpsc::channel(CHUNK_QUEUE);
        let key = objects::object_key(id);
        self.cold.spawn(move |ctx| async move {
            if let Some(o) = ctx.objects() {
                if let Err(e) = o.read(&key, len, &tx).await {
                    tracing::warn!(error = %e, "receipt download failed");
                }
            }
        })?;
        Ok(rx)
    }

    fn stream_response(&self, r: &ReceiptRecord) -> Response {
        let rx = match self.open_object(&r.receipt_id, r.size_bytes) {
            Ok(rx) => rx,
            Err(e) => return storage_error(&e),
        };
        let mut resp = Response::new(200)
            .with_content_type("application/octet-stream")
            .with_header("x-service-sha256", r.sha256_hex.clone());
        resp.body = ResponseBody::Stream(Box::new(ObjectBody {
            left: r.size_bytes,
            rx,
        }));
        resp
    }

    async fn content(&self, deployment: &str, id: &str) -> Response {
        let r = match self.load(deployment, id).await {
            Ok(Some(r)) => r,
            Ok(None) => return not_found(),
            Err(e) => return storage_error(&e),
        };
        if r.direction != "response" {
            return error(
                Kind::IllegalTransition,
                "only response receipts are downloaded here",
            );
        }
        if !matches!(r.state, ReceiptState::Verified | ReceiptState::Consumed) {
            return error(
                Kind::IllegalTransition,
                &format!("cannot download a receipt in state {}", r.state),
            );
        }
        if r.expires_unix_ms <= crate::clock::unix_ms() {
            return error(Kind::IllegalTransition, "the receipt has expired");
        }
        self.stream_response(&r)
    }

    /// `GET /api/v1/receipt-objects/{id}?deployment_id&request_id&expires&signature`.
    pub async fn worker_object(&self, path: &str, query: Option<&str>) -> Response {
        let Some(id) = path
            .strip_prefix(RECEIPT_OBJECTS_PATH)
            .and_then(|r| r.strip_prefix('/'))
            .filter(|id| valid_id(id))
        else {
            return not_found();
        };
        let Some(q) = SignedQuery::parse(query.unwrap_or("")) else {
            return error(Kind::InvalidSignature, "invalid assignment signature");
        };
        let now = crate::clock::unix_ms() / 1000;
        if q.expires <= now || q.expires > now.saturating_add(MAX_SIGNED_URL_SECONDS) {
            return error(Kind::InvalidSignature, "invalid assignment signature");
        }
        let message = signed_message(q.deployment_id, q.request_id, id, q.expires);
        let Some(sig) = decode_hex(q.signature) else {
            return error(Kind::InvalidSignature, "invalid assignment signature");
        };
        if hmac::verify(&self.signing_key, message.as_bytes(), &sig).is_err() {
            return error(Kind::InvalidSignature, "invalid assignment signature");
        }
        let r = match self.load(q.deployment_id, id).await {
            Ok(Some(r)) => r,
            Ok(None) => return not_found(),
            Err(e) => return storage_error(&e),
        };
        if !matches!(
            r.state,
            ReceiptState::Verified | ReceiptState::Assigned | ReceiptState::Consumed
        ) {
            return error(
                Kind::IllegalTransition,
                &format!("cannot read a receipt in state {}", r.state),
            );
        }
        self.stream_response(&r)
    }

    /// The signed worker URL (path and query) for `receipt_id` of `deployment`, valid for
    /// [`SIGNED_URL_SECONDS`]. A bearer credential: never log it.
    pub fn signed_object_path(
        &self,
        deployment: &str,
        request_id: &str,
        receipt_id: &str,
    ) -> String {
        let expires = crate::clock::unix_ms() / 1000 + SIGNED_URL_SECONDS;
        signed_object_path(
            &self.signing_key,
            deployment,
            request_id,
            receipt_id,
            expires,
        )
    }

    /// Starts the periodic expiry sweep on the cold thread (decision 031).
    pub fn start_sweep(&self) -> Result<(), StoreError> {
        let every = (self.ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        self.cold.spawn(move |ctx| async move {
            loop {
                sweep_once(&ctx).await;
                tokio::time::sleep(every).await;
            }
        })
    }
}

/// One round of the sweep: every due receipt moves to `expired` and loses its payload.
async fn sweep_once(ctx: &crate::store::ColdContext) {
    let now_ms = crate::clock::unix_ms();
    let due = match ctx.store(|s| s.due_receipts(now_ms, SWEEP_BATCH)) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "receipt sweep cannot list due receipts");
            return;
        }
    };
    let now = crate::clock::rfc3339(now_ms);
    for (deployment, id) in due {
        let Ok(Some(r)) = ctx.store(|s| s.receipt(&deployment, &id)) else {
            continue;
        };
        let Ok(t) = r.state.apply(ReceiptEvent::Expire) else {
            continue;
        };
        match ctx.store(|s| s.set_receipt_state(&deployment, &id, t.from, t.to, &now, None)) {
            Ok(true) => {}
            _ => continue,
        }
        if let Some(o) = ctx.objects() {
            if let Err(e) = o.delete_prefix(&objects::receipt_prefix(&id)).await {
                tracing::warn!(error = %e, "receipt sweep cannot remove a payload");
            }
        }
    }
}

/// A receipt payload on its way from the cold thread to a client: exactly `left` more bytes, in
/// the chunks the cold thread sends. A source that ends early fails the body, which closes the
/// connection (the client sees a short body, never a wrong one).
pub struct ObjectBody {
    left: u64,
    rx: mpsc::Receiver<Bytes>,
}

impl ObjectBody {
    /// A body of `len` bytes from `rx`.
    pub fn new(len: u64, rx: mpsc::Receiver<Bytes>) -> ObjectBody {
        ObjectBody { left: len, rx }
    }
}

impl StreamBody for ObjectBody {
    fn length(&self) -> Option<u64> {
        Some(self.left)
    }

    fn read_into<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<bool>> + 'a>> {
        Box::pin(async move {
            if self.left == 0 {
                return Ok(false);
            }
            match self.rx.recv().await {
                Some(chunk) => {
                    let n = usize::try_from(self.left)
                        .unwrap_or(usize::MAX)
                        .min(chunk.len());
                    out.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    self.left -= n as u64;
                    Ok(true)
                }
                None => Err(std::io::Error::other("the stored object ended early")),
            }
        })
    }
}

/// Why streaming a part failed.
enum UploadError {
    Body(crate::http::BodyError),
    Object(ObjectError),
    Store(StoreError),
}

/// The message the worker URL signature covers (decision 033).
fn signed_message(deployment: &str, request: &str, receipt: &str, expires: u64) -> String {
    format!("sortie-receipt-object-v1\n{deployment}\n{request}\n{receipt}\n{expires}")
}

/// The worker route path with its signed query.
pub fn signed_object_path(
    key: &hmac::Key,
    deployment: &str,
    request_id: &str,
    receipt_id: &str,
    expires: u64,
) -> String {
    let tag = hmac::sign(
        key,
        signed_message(deployment, request_id, receipt_id, expires).as_bytes(),
    );
    format!(
        "{RECEIPT_OBJECTS_PATH}/{receipt_id}?deployment_id={deployment}&request_id={request_id}&expires={expires}&signature={}",
        hex(tag.as_ref())
    )
}

/// The worker URL's query; values are taken verbatim (ids and hex need no escaping).
struct SignedQuery<'a> {
    deployment_id: &'a str,
    request_id: &'a str,
    expires: u64,
    signature: &'a str,
}

impl<'a> SignedQuery<'a> {
    fn parse(q: &'a str) -> Option<SignedQuery<'a>> {
        let (mut d, mut r, mut e, mut s) = (None, None, None, None);
        for pair in q.split('&') {
            let (k, v) = pair.split_once('=')?;
            let slot = match k {
                "deployment_id" => &mut d,
                "request_id" => &mut r,
                "expires" => &mut e,
                "signature" => &mut s,
                _ => return None,
            };
            if slot.replace(v).is_some() {
                return None;
            }
        }
        Some(SignedQuery {
            deployment_id: d.filter(|v| !v.is_empty())?,
            request_id: r.filter(|v| !v.is_empty())?,
            expires: e?.parse().ok()?,
            signature: s?,
        })
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.as_bytes()
        .chunks(2)
        .map(|p| {
            let h = std::str::from_utf8(p).ok()?;
            u8::from_str_radix(h, 16).ok()
        })
        .collect()
}

/// Why the key that signs worker URLs could not be had. The environment variable's value is
/// never part of the message.
#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    /// The key file does not hold 64 hex digits.
    #[error("{}: expected 64 hex digits", path.display())]
    Malformed {
        /// The key file.
        path: std::path::PathBuf,
    },
    /// The key file could not be read or created.
    #[error("{}: {source}", path.display())]
    File {
        /// The key file.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `object_storage.signing_key_env` names a variable that is not set.
    #[error("object_storage.signing_key_env: the environment variable {name} is not set")]
    EnvUnset {
        /// The variable's name.
        name: String,
    },
    /// The variable does not hold 64 hex digits.
    #[error(
        "object_storage.signing_key_env: the environment variable {name} must hold 64 hex digits (32 bytes)"
    )]
    EnvMalformed {
        /// The variable's name.
        name: String,
    },
}

/// Reads the HMAC key from `<data_dir>/receipt-signing.key` (64 hex digits), creating it with
/// mode 0600 from the OS's randomness when missing. Controls that share a data directory (or
/// are given the same file) accept each other's worker URLs.
pub fn load_signing_key(data_dir: &Path) -> Result<[u8; 32], SigningKeyError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = data_dir.join(SIGNING_KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => decode_hex(text.trim())
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or(SigningKeyError::Malformed { path }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key: [u8; 32] = crate::tokens::random_bytes();
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .and_then(|mut f| {
                    f.write_all(format!("{}\n", hex(&key)).as_bytes())?;
                    f.sync_all()
                });
            match written {
                Ok(()) => Ok(key),
                Err(source) => Err(SigningKeyError::File { path, source }),
            }
        }
        Err(source) => Err(SigningKeyError::File { path, source }),
    }
}

/// Reads the HMAC key from the environment variable `name` (64 hex digits, the format of the
/// key file). The error names the variable, never its value.
pub fn signing_key_from_env(name: &str) -> Result<[u8; 32], SigningKeyError> {
    let text = std::env::var(name).map_err(|_| SigningKeyError::EnvUnset {
        name: name.to_string(),
    })?;
    decode_hex(text.trim())
        .and_then(|v| <[u8; 32]>::try_from(v).ok())
        .ok_or_else(|| SigningKeyError::EnvMalformed {
            name: name.to_string(),
        })
}

/// Wraps a signing key for tests and tools that sign worker URLs themselves.
pub fn signing_key(bytes: &[u8; 32]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, bytes)
}

impl Receipts {
    /// Shared handle for every core.
    pub fn shared(self) -> Arc<Receipts> {
        Arc::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(
            route("POST", "/api/v1/receipts"),
            Some(Route::Create)
        ));
        assert!(route("GET", "/api/v1/receipts").is_none());
        assert!(matches!(
            route("GET", "/api/v1/receipts/x"),
            Some(Route::Get("x"))
        ));
        assert!(matches!(
            route("DELETE", "/api/v1/receipts/x"),
            Some(Route::Cancel("x"))
        ));
        assert!(matches!(
            route("PUT", "/api/v1/receipts/x/parts/3"),
            Some(Route::Part("x", "3"))
        ));
        assert!(matches!(
            route("POST", "/api/v1/receipts/x/complete"),
            Some(Route::Complete("x"))
        ));
        assert!(matches!(
            route("GET", "/api/v1/receipts/x/content"),
            Some(Route::Content("x"))
        ));
        assert!(route("PUT", "/api/v1/receipts/x/parts/3/4").is_none());
        assert!(route("POST", "/api/v1/receiptsx").is_none());
    }

    #[test]
    fn part_admission_needs_an_exact_length() {
        let p = "/api/v1/receipts/x/parts/1";
        assert_eq!(admit("PUT", p, Some(0), false).ok(), Some(0));
        assert_eq!(
            admit("PUT", p, None, false).map_err(|r| r.status).err(),
            Some(411)
        );
        assert_eq!(
            admit("PUT", p, None, true).map_err(|r| r.status).err(),
            Some(411)
        );
        assert_eq!(
            admit("PUT", p, Some(MAX_PART_BYTES + 1), false)
                .map_err(|r| r.status)
                .err(),
            Some(413)
        );
        assert_eq!(
            admit("POST", "/api/v1/receipts", Some(64 * 1024 + 1), false)
                .map_err(|r| r.status)
                .err(),
            Some(413)
        );
    }

    #[test]
    fn signatures() {
        let key = signing_key(&[7; 32]);
        let path = signed_object_path(&key, "dep", "req_1", "rcpt_1", 1_900_000_000);
        let (p, q) = path.split_once('?').expect("query");
        assert_eq!(p, "/api/v1/receipt-objects/rcpt_1");
        let q = SignedQuery::parse(q).expect("parses");
        assert_eq!(
            (q.deployment_id, q.request_id, q.expires),
            ("dep", "req_1", 1_900_000_000)
        );
        let sig = decode_hex(q.signature).expect("hex");
        let msg = signed_message("dep", "req_1", "rcpt_1", 1_900_000_000);
        assert!(hmac::verify(&key, msg.as_bytes(), &sig).is_ok());
        let other = signed_message("dep", "req_1", "rcpt_2", 1_900_000_000);
        assert!(hmac::verify(&key, other.as_bytes(), &sig).is_err());
        assert!(SignedQuery::parse(
            "deployment_id=a&deployment_id=b&request_id=r&expires=1&signature="
        )
        .is_none());
        assert!(SignedQuery::parse("x=1").is_none());
    }

    /// The key file is created once with mode 0600 and read back the same; a file that is not
    /// 64 hex digits and a variable that holds something else are refused with what to fix,
    /// never with the variable's value.
    #[test]
    fn signing_keys_load_or_fail_with_what_to_fix() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        let key = load_signing_key(dir.path()).expect("created");
        let path = dir.path().join(SIGNING_KEY_FILE);
        let mode = std::fs::metadata(&path)
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_signing_key(dir.path()).expect("read back"), key);

        std::fs::write(&path, "not hex\n").expect("overwritten");
        let e = load_signing_key(dir.path()).expect_err("malformed file");
        assert!(matches!(e, SigningKeyError::Malformed { .. }), "{e:?}");
        assert!(
            e.to_string()
                .ends_with("receipt-signing.key: expected 64 hex digits"),
            "{e}"
        );

        let e = load_signing_key(&dir.path().join("missing-dir")).expect_err("no directory");
        assert!(matches!(e, SigningKeyError::File { .. }), "{e:?}");

        let e = signing_key_from_env("SORTIE_TEST_UNSET_SIGNING_KEY").expect_err("unset");
        assert!(matches!(e, SigningKeyError::EnvUnset { .. }), "{e:?}");
        // PATH is set in every test environment and is never 64 hex digits.
        let e = signing_key_from_env("PATH").expect_err("not a key");
        assert!(matches!(e, SigningKeyError::EnvMalformed { .. }), "{e:?}");
        let path_value = std::env::var("PATH").expect("PATH set");
        assert!(!e.to_string().contains(&path_value), "{e}");
    }
}
