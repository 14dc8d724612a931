//! The `s3` object backend: aws-sdk-s3 on the cold thread's tokio runtime, with the client
//! configuration built by hand (region, static credentials from the environment, endpoint,
//! path style) and rustls on ring.
//!
//! Bodies stream: an upload is one `PutObject` whose body is fed chunk by chunk from a channel
//! (exact `Content-Length`, so a body that ends early fails the request and stores nothing);
//! a download forwards the `GetObject` body chunk by chunk. Composition (decision 032) uses
//! server-side multipart copy when every part but the last is at least 5 MiB, and a streaming
//! concatenation (GET each part, one PUT of the whole) otherwise.

use std::pin::Pin;
use std::task::{Context, Poll};

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use sortie_core::config::ObjectStorageConfig;
use tokio::sync::mpsc;

use super::ObjectsConfigError;
use super::{Digested, Hasher, ObjectError, CHUNK_QUEUE};

/// S3's smallest multipart part (except the last): below it, parts cannot be copied into a
/// multipart upload and are concatenated by streaming instead.
pub const S3_MIN_PART_BYTES: u64 = 5 * 1024 * 1024;

/// Size of the pieces a body of unknown length is uploaded in (a multipart upload); the only
/// buffer of such an upload, held on the cold thread.
pub const S3_UNSIZED_PART_BYTES: usize = 8 * 1024 * 1024;

/// Region used when the config names none; S3-compatible services mostly ignore it.
const DEFAULT_REGION: &str = "us-east-1";

/// Objects in one bucket of an S3-compatible service.
pub struct S3Objects {
    client: Client,
    bucket: String,
}

fn backend<E: std::error::Error>(what: &str, e: E) -> ObjectError {
    ObjectError::Backend(format!("{what}: {}", DisplayErrorContext(e)))
}

fn env_value(key: &'static str, name: Option<&str>) -> Result<String, ObjectsConfigError> {
    let name = name.unwrap_or_default();
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ObjectsConfigError::EnvUnset {
            key,
            name: name.to_string(),
        })
}

impl S3Objects {
    /// Builds the client from the `[object_storage]` section.
    pub fn from_config(config: &ObjectStorageConfig) -> Result<S3Objects, ObjectsConfigError> {
        let access_key = env_value(
            "object_storage.access_key_env",
            config.access_key_env.as_deref(),
        )?;
        let secret_key = env_value(
            "object_storage.secret_key_env",
            config.secret_key_env.as_deref(),
        )?;
        let bucket = config
            .bucket
            .clone()
            .ok_or(ObjectsConfigError::Required("object_storage.bucket"))?;
        let endpoint = config
            .endpoint
            .clone()
            .ok_or(ObjectsConfigError::Required("object_storage.endpoint"))?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let conf = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(
                config
                    .region
                    .clone()
                    .unwrap_or_else(|| DEFAULT_REGION.to_owned()),
            ))
            .credentials_provider(Credentials::new(
                access_key,
                secret_key,
                None,
                None,
                "sortie-config",
            ))
            .endpoint_url(endpoint)
            .force_path_style(config.force_path_style)
            .http_client(http)
            // Checksums of our own (SHA-256 per part and per object) cover integrity; the
            // SDK's default CRC trailers would need aws-chunked bodies that not every
            // S3-compatible service accepts.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        Ok(S3Objects {
            client: Client::from_conf(conf),
            bucket,
        })
    }

    pub(super) async fn startup(&self) -> Result<(), ObjectError> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| backend(&format!("bucket {}", self.bucket), e))
    }

    /// One `PutObject` of exactly `len` bytes whose body is whatever arrives on `body`.
    async fn put_stream(
        &self,
        key: &str,
        len: u64,
        body: mpsc::Receiver<Bytes>,
    ) -> Result<(), ObjectError> {
        let body = ChannelBody {
            rx: body,
            remaining: len,
        };
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_length(i64::try_from(len).unwrap_or(i64::MAX))
            .body(ByteStream::from_body_1_x(body))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| backend(&format!("put {key}"), e))
    }

    pub(super) async fn put(
        &self,
        key: &str,
        len: u64,
        rx: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Digested, ObjectError> {
        let relay = |tx: mpsc::Sender<Bytes>| async move {
            let mut hasher = Hasher::new();
            while let Some(chunk) = rx.recv().await {
                if hasher.size().saturating_add(chunk.len() as u64) > len {
                    return Err(ObjectError::Long(len));
                }
                hasher.update(&chunk);
                if tx.send(chunk).await.is_err() {
                    break;
                }
            }
            if hasher.size() != len {
                return Err(ObjectError::Short {
                    got: hasher.size(),
                    want: len,
                });
            }
            Ok(hasher.finish())
        };
        self.put_relayed(key, len, relay).await
    }

    /// One `PutObject` of `len` bytes fed by `relay`, which gets the body's sender and returns
    /// the digest of what it sent.
    async fn put_relayed<R, Fut>(
        &self,
        key: &str,
        len: u64,
        relay: R,
    ) -> Result<Digested, ObjectError>
    where
        R: FnOnce(mpsc::Sender<Bytes>) -> Fut,
        Fut: std::future::Future<Output = Result<Digested, ObjectError>>,
    {
        let (tx, body) = mpsc::channel(CHUNK_QUEUE);
        let (stored, relayed) =
            futures_util::future::join(self.put_stream(key, len, body), relay(tx)).await;
        // The relay's error says why the body was cut; the PUT's only that it was.
        let digest = relayed?;
        stored?;
        Ok(digest)
    }

    pub(super) async fn put_unsized(
        &self,
        key: &str,
        max: u64,
        rx: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Digested, ObjectError> {
        let mut hasher = Hasher::new();
        let mut buf = bytes::BytesMut::new();
        let mut upload: Option<(String, Vec<CompletedPart>)> = None;
        let result = async {
            loop {
                let Some(chunk) = rx.recv().await else {
                    return Err(ObjectError::Aborted);
                };
                let is_end = chunk.is_empty();
                if hasher.size().saturating_add(chunk.len() as u64) > max {
                    return Err(ObjectError::Long(max));
                }
                hasher.update(&chunk);
                buf.extend_from_slice(&chunk);
                if is_end && upload.is_none() {
                    // Small enough for one PUT.
                    let len = buf.len() as u64;
                    self.client
                        .put_object()
                        .bucket(&self.bucket)
                        .key(key)
                        .content_length(i64::try_from(len).unwrap_or(i64::MAX))
                        .body(ByteStream::from(buf.split().freeze()))
                        .send()
                        .await
                        .map_err(|e| backend(&format!("put {key}"), e))?;
                    return Ok(());
                }
                if buf.len() >= S3_UNSIZED_PART_BYTES || (is_end && !buf.is_empty()) {
                    if upload.is_none() {
                        upload = Some((self.create_multipart(key).await?, Vec::new()));
                    }
                    if let Some((id, parts)) = upload.as_mut() {
                        let number = i32::try_from(parts.len() + 1).unwrap_or(i32::MAX);
                        let out = self
                            .client
                            .upload_part()
                            .bucket(&self.bucket)
                            .key(key)
                            .upload_id(id.as_str())
                            .part_number(number)
                            .body(ByteStream::from(buf.split().freeze()))
                            .send()
                            .await
                            .map_err(|e| backend(&format!("upload part of {key}"), e))?;
                        parts.push(
                            CompletedPart::builder()
                                .set_e_tag(out.e_tag().map(str::to_owned))
                                .part_number(number)
                                .build(),
                        );
                    }
                }
                if is_end {
                    if let Some((id, parts)) = upload.as_mut() {
                        // `upload` stays set, so a failed completion is aborted below.
                        self.complete_multipart(key, id, std::mem::take(parts))
                            .await?;
                    }
                    return Ok(());
                }
            }
        }
        .await;
        if let (Err(_), Some((id, _))) = (&result, &upload) {
            self.abort_multipart(key, id).await;
        }
        result.map(|()| hasher.finish())
    }

    /// Sends the body of `key` to `tx`, hashing it when `hasher` is given; returns the bytes
    /// forwarded, or `None` when the receiver left.
    async fn forward(
        &self,
        key: &str,
        tx: &mpsc::Sender<Bytes>,
        mut hasher: Option<&mut Hasher>,
    ) -> Result<Option<u64>, ObjectError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| match e.as_service_error() {
                Some(s) if s.is_no_such_key() => ObjectError::Missing(key.to_owned()),
                _ => backend(&format!("get {key}"), e),
            })?;
        let mut body = out.body;
        let mut sent = 0u64;
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| backend(&format!("get {key}"), e))?
        {
            sent = sent.saturating_add(chunk.len() as u64);
            if let Some(h) = hasher.as_deref_mut() {
                h.update(&chunk);
            }
            if tx.send(chunk).await.is_err() {
                return Ok(None);
            }
        }
        Ok(Some(sent))
    }

    pub(super) async fn compose(
        &self,
        parts: &[(String, u64)],
        dest: &str,
    ) -> Result<Digested, ObjectError> {
        let copyable = parts.len() >= 2
            && parts
                .split_last()
                .is_some_and(|(_, init)| init.iter().all(|(_, n)| *n >= S3_MIN_PART_BYTES));
        if copyable {
            self.multipart_copy(parts, dest).await?;
            return self.digest_of(dest).await;
        }
        let total = parts
            .iter()
            .map(|(_, n)| *n)
            .fold(0u64, u64::saturating_add);
        let relay = |tx: mpsc::Sender<Bytes>| async move {
            let mut hasher = Hasher::new();
            for (key, len) in parts {
                match self.forward(key, &tx, Some(&mut hasher)).await? {
                    Some(n) if n == *len => {}
                    Some(_) => return Err(ObjectError::Missing(key.clone())),
                    None => break,
                }
            }
            Ok(hasher.finish())
        };
        self.put_relayed(dest, total, relay).await
    }

    /// Composes `parts` into `dest` inside S3 (`UploadPartCopy`), aborting the upload on any
    /// failure so that nothing appears under `dest`.
    async fn multipart_copy(&self, parts: &[(String, u64)], dest: &str) -> Result<(), ObjectError> {
        let upload_id = self.create_multipart(dest).await?;
        let result = async {
            let mut completed = Vec::with_capacity(parts.len());
            for (i, (key, _)) in parts.iter().enumerate() {
                let number = i32::try_from(i + 1).unwrap_or(i32::MAX);
                let copied = self
                    .client
                    .upload_part_copy()
                    .bucket(&self.bucket)
                    .key(dest)
                    .upload_id(&upload_id)
                    .part_number(number)
                    .copy_source(format!("{}/{key}", self.bucket))
                    .send()
                    .await
                    .map_err(|e| backend(&format!("copy {key}"), e))?;
                let etag = copied
                    .copy_part_result()
                    .and_then(|r| r.e_tag())
                    .map(str::to_owned);
                completed.push(
                    CompletedPart::builder()
                        .set_e_tag(etag)
                        .part_number(number)
                        .build(),
                );
            }
            self.complete_multipart(dest, &upload_id, completed).await
        }
        .await;
        if result.is_err() {
            self.abort_multipart(dest, &upload_id).await;
        }
        result
    }

    /// Starts a multipart upload of `key`; returns its upload id.
    async fn create_multipart(&self, key: &str) -> Result<String, ObjectError> {
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| backend(&format!("create multipart {key}"), e))?;
        created
            .upload_id()
            .map(str::to_owned)
            .ok_or_else(|| ObjectError::Backend("multipart upload without an id".into()))
    }

    /// Completes the multipart upload `id` of `key` from its `parts`, in order.
    async fn complete_multipart(
        &self,
        key: &str,
        id: &str,
        parts: Vec<CompletedPart>,
    ) -> Result<(), ObjectError> {
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| backend(&format!("complete multipart {key}"), e))?;
        Ok(())
    }

    /// Aborts the multipart upload `id` of `key`, so that nothing appears under `key`; a
    /// failure here leaves only an incomplete upload, which the bucket's lifecycle removes.
    async fn abort_multipart(&self, key: &str, id: &str) {
        let _ = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(id)
            .send()
            .await;
    }

    /// Size and SHA-256 of a stored object, read through in chunks.
    async fn digest_of(&self, key: &str) -> Result<Digested, ObjectError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| backend(&format!("get {key}"), e))?;
        let mut body = out.body;
        let mut hasher = Hasher::new();
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| backend(&format!("get {key}"), e))?
        {
            hasher.update(&chunk);
        }
        Ok(hasher.finish())
    }

    pub(super) async fn read(
        &self,
        key: &str,
        len: u64,
        tx: &mpsc::Sender<Bytes>,
    ) -> Result<(), ObjectError> {
        match self.forward(key, tx, None).await? {
            Some(n) if n != len => Err(ObjectError::Missing(key.to_owned())),
            _ => Ok(()),
        }
    }

    pub(super) async fn delete(&self, key: &str) -> Result<(), ObjectError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| backend(&format!("delete {key}"), e))
    }

    pub(super) async fn delete_prefix(&self, prefix: &str) -> Result<(), ObjectError> {
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token)
                .send()
                .await
                .map_err(|e| backend(&format!("list {prefix}"), e))?;
            for object in page.contents() {
                if let Some(key) = object.key() {
                    self.client
                        .delete_object()
                        .bucket(&self.bucket)
                        .key(key)
                        .send()
                        .await
                        .map_err(|e| backend(&format!("delete {key}"), e))?;
                }
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_owned()),
                _ => return Ok(()),
            }
        }
    }
}

/// An HTTP body of exactly `remaining` bytes fed from a channel; it fails when the channel
/// closes early, so the PUT is cut and S3 stores nothing.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
    remaining: u64,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(None) => Poll::Ready(Some(Err("the body ended early".into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
