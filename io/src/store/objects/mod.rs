//! The object store: where receipt payloads live, on the local filesystem or in an S3-compatible
//! service. Runs on the cold thread only (see `cold.rs`); bodies pass through it in chunks of at
//! most [`CHUNK_BYTES`] over channels of [`CHUNK_QUEUE`] entries, so memory never grows with
//! the size of a body.
//!
//! Every write is all-or-nothing: an object is visible under its key only once all of its bytes
//! are stored (filesystem: temp file, fsync, rename; S3: a single PUT or a completed multipart
//! upload). A write that fails or is dropped half-way leaves nothing under the key.

mod fs;
mod s3;

use std::path::Path;

use bytes::Bytes;
use ring::digest;
use sortie_core::config::{ObjectBackend, ObjectStorageConfig};
use tokio::sync::mpsc;

pub use fs::FsObjects;
pub use s3::{S3Objects, S3_MIN_PART_BYTES, S3_UNSIZED_PART_BYTES};

/// Largest chunk that crosses a channel between a hot core and the cold thread.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// Chunks that may wait in one body's channel: with [`CHUNK_BYTES`], at most 1 MiB per body in
/// flight, whatever its size.
pub const CHUNK_QUEUE: usize = 4;

/// Name of the directory under the data directory that holds the `fs` backend's objects.
pub const FS_DIRECTORY: &str = "objects";

/// The size and SHA-256 of bytes that were stored or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digested {
    /// Bytes counted.
    pub size: u64,
    /// SHA-256 of those bytes.
    pub sha256: [u8; 32],
}

impl Digested {
    /// The SHA-256 as 64 lowercase hex digits.
    pub fn sha256_hex(&self) -> String {
        hex(&self.sha256)
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

/// Counts and hashes bytes as they pass.
pub(crate) struct Hasher {
    ctx: digest::Context,
    size: u64,
}

impl Hasher {
    pub(crate) fn new() -> Hasher {
        Hasher {
            ctx: digest::Context::new(&digest::SHA256),
            size: 0,
        }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.ctx.update(data);
        self.size = self.size.saturating_add(data.len() as u64);
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn finish(self) -> Digested {
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(self.ctx.finish().as_ref());
        Digested {
            size: self.size,
            sha256,
        }
    }
}

/// Why the object storage section cannot be used. Credentials' values are never part of the
/// message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectsConfigError {
    /// A setting the S3 backend needs is missing.
    #[error("{0} is required")]
    Required(&'static str),
    /// A credential's environment variable is not set, or is empty.
    #[error("{key}: environment variable {name} is not set")]
    EnvUnset {
        /// The setting naming the variable.
        key: &'static str,
        /// The variable's name.
        name: String,
    },
}

/// Why an object operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The body ended (its sender was dropped) before the declared length.
    #[error("the body ended after {got} of {want} bytes")]
    Short {
        /// Bytes received.
        got: u64,
        /// Bytes declared.
        want: u64,
    },
    /// The body went past the declared length.
    #[error("the body is longer than {0} bytes")]
    Long(u64),
    /// The sender went away without the end marker of [`Objects::put_unsized`].
    #[error("the body was abandoned before its end")]
    Aborted,
    /// No object under the key, or one of a different size than recorded.
    #[error("object {0} is missing or has the wrong size")]
    Missing(String),
    /// The backend failed (disk, network, S3 error), with its message.
    #[error("object storage failure: {0}")]
    Backend(String),
}

/// A fresh key for an upload of part `number` of a receipt: every upload gets its own, so a
/// refused or replaced upload never touches the bytes a recorded part points to.
pub fn part_key(receipt_id: &str, number: u32) -> String {
    let nonce = hex(&crate::tokens::random_bytes::<8>());
    format!("receipts/{receipt_id}/part-{number:05}-{nonce}")
}

/// The key of a receipt's composed object.
pub fn object_key(receipt_id: &str) -> String {
    format!("receipts/{receipt_id}/object")
}

/// The prefix under which all of a receipt's objects live.
pub fn receipt_prefix(receipt_id: &str) -> String {
    format!("receipts/{receipt_id}/")
}

/// The configured backend.
pub enum Objects {
    /// Files under the data directory.
    Fs(FsObjects),
    /// An S3-compatible service.
    S3(S3Objects),
}

impl Objects {
    /// Builds the backend `config` names. S3 credentials are read here from the environment
    /// variables the config names; their values are never logged.
    pub fn from_config(
        config: &ObjectStorageConfig,
        data_dir: &Path,
    ) -> Result<Objects, ObjectsConfigError> {
        match config.backend {
            ObjectBackend::Fs => Ok(Objects::Fs(FsObjects::new(data_dir.join(FS_DIRECTORY)))),
            ObjectBackend::S3 => S3Objects::from_config(config).map(Objects::S3),
        }
    }

    /// Checks the backend at startup and clears what a crash left behind (filesystem temp
    /// files; S3 writes leave nothing).
    pub async fn startup(&self) -> Result<(), ObjectError> {
        match self {
            Objects::Fs(o) => o.startup(),
            Objects::S3(o) => o.startup().await,
        }
    }

    /// Stores exactly `len` bytes received from `rx` under `key`, replacing any object there.
    /// Fails with [`ObjectError::Short`] when `rx` closes early and [`ObjectError::Long`]
    /// when it delivers more; nothing is stored then.
    pub async fn put(
        &self,
        key: &str,
        len: u64,
        rx: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Digested, ObjectError> {
        match self {
            Objects::Fs(o) => o.put(key, len, rx).await,
            Objects::S3(o) => o.put(key, len, rx).await,
        }
    }

    /// Stores a body of unknown length from `rx` under `key`: chunks until an empty chunk, the
    /// end marker. Without the marker (the sender dropped: the source broke) nothing is stored
    /// ([`ObjectError::Aborted`]); past `max` bytes nothing is stored ([`ObjectError::Long`]).
    pub async fn put_unsized(
        &self,
        key: &str,
        max: u64,
        rx: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Digested, ObjectError> {
        match self {
            Objects::Fs(o) => o.put_unsized(key, max, rx).await,
            Objects::S3(o) => o.put_unsized(key, max, rx).await,
        }
    }

    /// Concatenates `parts` (key, recorded size) into `dest`, returning the size and SHA-256
    /// of the bytes as they were composed.
    pub async fn compose(
        &self,
        parts: &[(String, u64)],
        dest: &str,
    ) -> Result<Digested, ObjectError> {
        match self {
            Objects::Fs(o) => o.compose(parts, dest).await,
            Objects::S3(o) => o.compose(parts, dest).await,
        }
    }

    /// Sends the `len` bytes of `key` to `tx` in chunks. Stops quietly when the receiver is
    /// gone; fails with [`ObjectError::Missing`] when the object is absent or of another size.
    pub async fn read(
        &self,
        key: &str,
        len: u64,
        tx: &mpsc::Sender<Bytes>,
    ) -> Result<(), ObjectError> {
        match self {
            Objects::Fs(o) => o.read(key, len, tx).await,
            Objects::S3(o) => o.read(key, len, tx).await,
        }
    }

    /// Removes one object. Removing nothing is a success.
    pub async fn delete(&self, key: &str) -> Result<(), ObjectError> {
        match self {
            Objects::Fs(o) => o.delete(key),
            Objects::S3(o) => o.delete(key).await,
        }
    }

    /// Removes every object under `prefix`. Removing nothing is a success.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<(), ObjectError> {
        match self {
            Objects::Fs(o) => o.delete_prefix(prefix),
            Objects::S3(o) => o.delete_prefix(prefix).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_hex() {
        assert!(part_key("rcpt_x", 7).starts_with("receipts/rcpt_x/part-00007-"));
        assert_ne!(part_key("rcpt_x", 7), part_key("rcpt_x", 7));
        assert_eq!(object_key("rcpt_x"), "receipts/rcpt_x/object");
        assert!(part_key("rcpt_x", 1).starts_with(&receipt_prefix("rcpt_x")));
        let mut h = Hasher::new();
        h.update(b"abc");
        let d = h.finish();
        assert_eq!(d.size, 3);
        assert_eq!(
            d.sha256_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
