//! The request API's streamed exchanges: a request body read from a verified request receipt,
//! and/or a response body stored as a new response receipt (spec, Request API; decision 035).
//! Bodies pass through in bounded chunks between the cold thread and the upstream connection.
//!
//! On the per-request path: no blocking, debug-level logs only.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use sortie_core::error::{ApiError, ErrorCode};
use sortie_core::receipt::ReceiptState;
use sortie_core::request::{RequestBody, ResponseBodyMode, ValidatedRequest};
use tokio::sync::mpsc;

use crate::control::receipts::Receipts;
use crate::egress::{BodyLength, BodySource, Egress, StreamRequest, Timeouts};
use crate::store::objects::{self, ObjectError, CHUNK_BYTES, CHUNK_QUEUE};
use crate::store::ReceiptRecord;

/// The body of a finished streamed exchange.
pub(crate) enum ExchangeBody {
    /// Read into memory (inline mode): `start` followed by `rest`, the start being the bytes
    /// that came with the response head, left in the head's buffer.
    Inline { start: Bytes, rest: Vec<u8> },
    /// Stored as a verified response receipt.
    Receipt {
        receipt_id: String,
        size_bytes: u64,
        sha256_hex: String,
    },
}

/// A finished exchange: what the envelope reports.
pub(crate) struct Exchange {
    pub(crate) status: u16,
    pub(crate) headers: crate::egress::ResponseFields,
    pub(crate) body: ExchangeBody,
    /// When a remote worker's `Accept` reached the control, the end of the hand-over (decision
    /// 128); `None` on a local worker, whose hand-over is the call itself.
    pub(crate) accepted_at: Option<Instant>,
}

/// Where the exchange runs.
pub(crate) struct Target<'a> {
    pub(crate) egress: &'a Egress,
    pub(crate) policy: &'a sortie_core::destination::DestinationPolicy,
    pub(crate) worker_id: &'a sortie_core::snapshot::ConfigId,
    pub(crate) bind_address: Option<std::net::IpAddr>,
    pub(crate) deadline: Instant,
    pub(crate) max_inline_response_body_bytes: usize,
    pub(crate) timeouts: Timeouts,
    /// The pool's upstream proxy, when it does not egress directly.
    pub(crate) via: Option<&'a crate::egress::ProxyRoute>,
    /// The deployment, for its share of the resolver (decision 045).
    pub(crate) tenant: crate::dns::Tenant,
    /// The browser profile, when the request named one.
    pub(crate) fingerprint: Option<&'static sortie_core::fingerprint::profile::Profile>,
}

fn unavailable(why: &str) -> ApiError {
    ApiError::new(ErrorCode::BodyRefUnavailable, why.to_string())
}

/// A release the store did not confirm is tried again after this pause, doubled per failure
/// up to [`RELEASE_RETRY_MAX`], for as long as the control runs: the release names its attempt
/// (decision 098), so a repeat never undoes a later assignment, however late it lands.
const RELEASE_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest pause between two tries of a release.
const RELEASE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// Failed tries of one release after which a warning says it is still pending.
const RELEASE_TRIES_BEFORE_WARNING: u32 = 5;

/// Holds a request receipt in `assigned` for the attempt. When the attempt ends the state is
/// written before the answer goes out ([`Hold::release`]), so a client that reads the receipt
/// after the answer sees `consumed` (or `verified` again after a failure). Dropped unreleased
/// (the caller left, the request was cancelled, the assignment's outcome is unknown) it goes
/// back to `verified` by a write queued to the cold thread without waiting. Every release
/// applies only while this attempt still holds the receipt.
pub(crate) struct Hold<'a> {
    receipts: &'a Receipts,
    deployment: String,
    id: String,
    /// The token of this attempt, recorded with the assignment.
    attempt: String,
    is_released: bool,
}

impl Hold<'_> {
    /// Writes the receipt's state at the end of the attempt (`consumed` after success,
    /// `verified` after a failure).
    pub(crate) async fn release(mut self, to: ReceiptState) {
        self.is_released = true;
        let (d, i, a) = (
            self.deployment.clone(),
            self.id.clone(),
            self.attempt.clone(),
        );
        let now = crate::clock::now_rfc3339();
        let written = self
            .receipts
            .cold()
            .call(move |s| s.release_receipt(&d, &i, &a, to, &now))
            .await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot release a receipt assignment now; retrying");
            self.release_later(to);
        }
    }

    /// Queues the release to the cold thread, tried again while the store does not answer.
    fn release_later(&self, to: ReceiptState) {
        let (d, i, a) = (
            self.deployment.clone(),
            self.id.clone(),
            self.attempt.clone(),
        );
        // Ends with the cold thread at the latest, whose shutdown drops its tasks; by then the
        // control's leave (or the others' recovery) turns the receipt back.
        let queued = self.receipts.cold().spawn(move |ctx| async move {
            let mut pause = RELEASE_RETRY_FIRST;
            let mut failed = 0u32;
            loop {
                let now = crate::clock::now_rfc3339();
                if ctx
                    .store(|s| s.release_receipt(&d, &i, &a, to, &now))
                    .is_ok()
                {
                    return;
                }
                failed = failed.saturating_add(1);
                if failed == RELEASE_TRIES_BEFORE_WARNING {
                    tracing::warn!(
                        "cannot release a receipt assignment yet; still trying, every {} s at most",
                        RELEASE_RETRY_MAX.as_secs()
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RELEASE_RETRY_MAX);
            }
        });
        if queued.is_err() {
            // Once this control stops, its leave or the others' heartbeat recovery (shared
            // store, decisions 094 and 098) or the next start's recovery (decision 034) turns
            // it back.
            tracing::warn!(
                "cannot release a receipt assignment now; recovery will once this control stops"
            );
        }
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        if !self.is_released {
            self.release_later(ReceiptState::Verified);
        }
    }
}

/// A request body read from a stored object.
struct ObjectSource {
    rx: mpsc::Receiver<Bytes>,
    left: u64,
    len: u64,
}

impl BodySource for ObjectSource {
    fn length(&self) -> BodyLength {
        if self.len == 0 {
            BodyLength::None
        } else {
            BodyLength::Known(self.len)
        }
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        if self.left == 0 {
            return Ok(None);
        }
        match self.rx.recv().await {
            Some(chunk) => {
                self.left = self.left.saturating_sub(chunk.len() as u64);
                Ok(Some(chunk))
            }
            None => Err(ApiError::new(
                ErrorCode::StreamUploadAborted,
                "the stored request body could not be read to its end",
            )),
        }
    }
}

/// Either body source of a streamed exchange.
enum Source {
    Memory(Bytes),
    Object(ObjectSource),
}

impl BodySource for Source {
    fn length(&self) -> BodyLength {
        match self {
            Source::Memory(b) => b.length(),
            Source::Object(o) => o.length(),
        }
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, ApiError> {
        match self {
            Source::Memory(b) => b.next_chunk().await,
            Source::Object(o) => o.next_chunk().await,
        }
    }
}

/// Takes a verified request receipt of `deployment` for this attempt.
pub(crate) async fn take_receipt<'a>(
    receipts: &'a Receipts,
    deployment: &str,
    id: &str,
) -> Result<(ReceiptRecord, Hold<'a>), ApiError> {
    let r = match receipts.load(deployment, id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(unavailable("receipt not found")),
        Err(e) => {
            return Err(ApiError::new(
                ErrorCode::ControlInternalError,
                format!("receipt store: {e}"),
            ))
        }
    };
    if r.direction != "request" {
        return Err(unavailable("the receipt is not a request receipt"));
    }
    if r.expires_unix_ms <= crate::clock::unix_ms() {
        return Err(unavailable("the receipt has expired"));
    }
    if r.state != ReceiptState::Verified {
        return Err(unavailable(&format!(
            "the receipt is {}, not verified",
            r.state
        )));
    }
    let attempt: String = crate::tokens::random_bytes::<16>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let hold = |attempt: String| Hold {
        receipts,
        deployment: deployment.to_owned(),
        id: id.to_owned(),
        attempt,
        is_released: false,
    };
    match receipts.assign(deployment, id, &attempt).await {
        Ok(true) => Ok((r, hold(attempt))),
        Ok(false) => Err(unavailable("the receipt is in use or no longer verified")),
        Err(e) => {
            // The assignment may have committed (`OutcomeUnknown`, or a connection lost during
            // `COMMIT`): dropping a hold queues its revert, which applies only while this
            // attempt holds the receipt (decision 098); after `Busy` it finds nothing to do.
            drop(hold(attempt));
            Err(ApiError::new(
                ErrorCode::ControlInternalError,
                format!("receipt store: {e}"),
            ))
        }
    }
}

/// Runs one exchange whose request body comes from a receipt or whose response body goes to
/// one.
pub(crate) async fn execute(
    receipts: &Receipts,
    deployment: &str,
    req: ValidatedRequest,
    target: &Target<'_>,
) -> Result<Exchange, ApiError> {
    let mut hold = None;
    let result = attempt(receipts, deployment, req, target, &mut hold).await;
    if let Some(h) = hold {
        let to = if result.is_ok() {
            ReceiptState::Consumed
        } else {
            ReceiptState::Verified
        };
        h.release(to).await;
    }
    result
}

async fn attempt<'a>(
    receipts: &'a Receipts,
    deployment: &str,
    req: ValidatedRequest,
    target: &Target<'_>,
    hold: &mut Option<Hold<'a>>,
) -> Result<Exchange, ApiError> {
    let mut source = match req.body {
        RequestBody::None => Source::Memory(Bytes::new()),
        RequestBody::Inline(b) => Source::Memory(Bytes::from(b)),
        RequestBody::Receipt(ref id) => {
            let (r, h) = take_receipt(receipts, deployment, id).await?;
            *hold = Some(h);
            let rx = receipts
                .open_object(&r.receipt_id, r.size_bytes)
                .map_err(|e| {
                    ApiError::new(
                        ErrorCode::ControlInternalError,
                        format!("receipt store: {e}"),
                    )
                })?;
            Source::Object(ObjectSource {
                rx,
                left: r.size_bytes,
                len: r.size_bytes,
            })
        }
    };
    let headers: Vec<(&str, &[u8])> = req.headers.iter().map(|h| (h.name(), h.value())).collect();
    let stream_req = StreamRequest {
        method: req.method,
        url: &req.url,
        headers: &headers,
        deadline: target.deadline,
        timeouts: target.timeouts,
        policy: target.policy,
        worker_id: target.worker_id,
        bind_address: target.bind_address,
        is_replayable: req.is_replayable,
        via: target.via,
        tenant: target.tenant,
        may_splice: false,
    };
    let mut resp = target
        .egress
        .open_fingerprinted(&stream_req, target.fingerprint, &mut source)
        .await?;
    resp.body.set_deadline(target.deadline);
    let body = match req.response_body_mode {
        ResponseBodyMode::InlineBase64 => {
            let limit = target.max_inline_response_body_bytes;
            let mut out = Vec::new();
            while resp.body.read_into(&mut out).await? {
                if out.len() > limit {
                    return Err(ApiError::new(
                        ErrorCode::BodyTooLarge,
                        format!("the response body exceeds {limit} bytes"),
                    ));
                }
            }
            ExchangeBody::Inline {
                start: Bytes::new(),
                rest: out,
            }
        }
        ResponseBodyMode::Receipt => store_response(receipts, deployment, &mut *resp.body).await?,
    };
    Ok(Exchange {
        status: resp.status,
        headers: resp.headers,
        body,
        accepted_at: None,
    })
}

/// Streams the upstream body into a new object and records it as a verified response receipt.
/// The record is written only after the whole object is stored, so no partial object is ever
/// visible; an object left by a failure in between has no record and is removed.
pub(crate) async fn store_response<R: BodySource>(
    receipts: &Receipts,
    deployment: &str,
    body: &mut R,
) -> Result<ExchangeBody, ApiError> {
    let max = receipts.max_object_bytes();
    if matches!(body.length(), BodyLength::Known(n) if n > max) {
        return Err(too_large(max));
    }
    let mut record = receipts.new_record(deployment, "response", 0, String::new(), None);
    let key = objects::object_key(&record.receipt_id);
    let (tx, mut rx) = mpsc::channel::<Bytes>(CHUNK_QUEUE);
    let store_key = key.clone();
    let stored = receipts.cold().run_task(move |ctx| async move {
        match ctx.objects() {
            Some(o) => Ok(o.put_unsized(&store_key, max, &mut rx).await),
            None => Ok(Err(ObjectError::Backend(
                "object storage is disabled".into(),
            ))),
        }
    });
    let feed = async move {
        let mut pending = BytesMut::new();
        loop {
            let piece = body.next_chunk().await.map_err(download_error)?;
            let more = piece.is_some();
            if let Some(piece) = piece {
                pending.extend_from_slice(&piece);
            }
            let is_due = pending.len() >= CHUNK_BYTES || (!more && !pending.is_empty());
            if is_due && tx.send(pending.split().freeze()).await.is_err() {
                // The store stopped taking bytes (too large, or failed): it says why.
                return Ok::<(), ApiError>(());
            }
            if !more {
                // The end marker: only now may the store commit the object.
                let _ = tx.send(Bytes::new()).await;
                return Ok(());
            }
        }
    };
    let (stored, fed) = futures_util::future::join(stored, feed).await;
    fed?;
    let digest = match stored {
        Ok(Ok(d)) => d,
        Ok(Err(ObjectError::Long(_))) => return Err(too_large(max)),
        Ok(Err(e)) => {
            return Err(ApiError::new(
                ErrorCode::ControlInternalError,
                format!("object storage: {e}"),
            ))
        }
        Err(e) => {
            return Err(ApiError::new(
                ErrorCode::ControlInternalError,
                format!("receipt store: {e}"),
            ))
        }
    };
    record.state = ReceiptState::Verified;
    record.size_bytes = digest.size;
    record.sha256_hex = digest.sha256_hex();
    let stored_record = record.clone();
    match receipts
        .cold()
        .call(move |s| s.create_receipt(&stored_record))
        .await
    {
        Ok(_) => Ok(ExchangeBody::Receipt {
            receipt_id: record.receipt_id,
            size_bytes: record.size_bytes,
            sha256_hex: record.sha256_hex,
        }),
        Err(e) => {
            let _ = receipts.remove_payload(&record.receipt_id).await;
            Err(ApiError::new(
                ErrorCode::ControlInternalError,
                format!("receipt store: {e}"),
            ))
        }
    }
}

fn too_large(max: u64) -> ApiError {
    ApiError::new(
        ErrorCode::BodyTooLarge,
        format!("the response body exceeds object_storage.max_object_bytes ({max})"),
    )
    .with_detail("direction", "response")
    .with_detail("limit_bytes", max.to_string())
}

/// A broken upstream body while it is being stored is `stream_download_aborted`; timeouts keep
/// their own code.
fn download_error(e: ApiError) -> ApiError {
    match e.code {
        ErrorCode::UpstreamReset | ErrorCode::ProtocolError => ApiError::new(
            ErrorCode::StreamDownloadAborted,
            format!("the response body broke off: {}", e.message),
        ),
        _ => e,
    }
}
