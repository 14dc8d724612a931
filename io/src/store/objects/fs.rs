//! The `fs` object backend: one file per object under `<data_dir>/objects`, written to a temp
//! file in the same directory, fsynced, renamed over the key and the directory fsynced, so an
//! object is either wholly there or absent after a crash.
//!
//! The file calls block the cold thread for one chunk at a time; long loops yield between
//! chunks so that other cold-thread work goes on.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Digested, Hasher, ObjectError, CHUNK_BYTES};

/// Marker in the names of temp files; no key contains it.
const TEMP_MARKER: &str = ".tmp-";

/// Objects as files under a root directory.
#[derive(Debug)]
pub struct FsObjects {
    root: PathBuf,
}

fn backend(what: &str, path: &Path, e: io::Error) -> ObjectError {
    ObjectError::Backend(format!("{what} {}: {e}", path.display()))
}

/// Removes a temp file unless it was renamed into place: a write that fails, or whose task is
/// dropped at shutdown, leaves nothing behind.
struct TempFile {
    path: PathBuf,
    is_kept: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.is_kept {
            let _ = fs::remove_file(&self.path);
        }
    }
}

impl FsObjects {
    /// Objects under `root` (created on first write).
    pub fn new(root: PathBuf) -> FsObjects {
        FsObjects { root }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Removes temp files a crash left behind.
    pub(super) fn startup(&self) -> Result<(), ObjectError> {
        fs::create_dir_all(&self.root).map_err(|e| backend("create", &self.root, e))?;
        let receipts = self.root.join("receipts");
        let Ok(dirs) = fs::read_dir(&receipts) else {
            return Ok(());
        };
        for dir in dirs.flatten() {
            let Ok(files) = fs::read_dir(dir.path()) else {
                continue;
            };
            for f in files.flatten() {
                if f.file_name().to_string_lossy().contains(TEMP_MARKER) {
                    let _ = fs::remove_file(f.path());
                }
            }
        }
        Ok(())
    }

    /// Creates a temp file next to `dest`.
    fn temp_for(&self, dest: &Path) -> Result<(File, TempFile), ObjectError> {
        let dir = dest
            .parent()
            .ok_or_else(|| ObjectError::Backend("object key without a directory".into()))?;
        fs::create_dir_all(dir).map_err(|e| backend("create", dir, e))?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let suffix = super::hex(&crate::tokens::random_bytes::<8>());
        let path = dir.join(format!(".{name}{TEMP_MARKER}{suffix}"));
        let file = File::create(&path).map_err(|e| backend("create", &path, e))?;
        Ok((
            file,
            TempFile {
                path,
                is_kept: false,
            },
        ))
    }

    /// Makes the temp file durable and moves it over `dest`.
    fn commit(file: File, mut temp: TempFile, dest: &Path) -> Result<(), ObjectError> {
        file.sync_all()
            .map_err(|e| backend("fsync", &temp.path, e))?;
        drop(file);
        fs::rename(&temp.path, dest).map_err(|e| backend("rename", dest, e))?;
        temp.is_kept = true;
        // The rename is durable only once the directory entry is.
        if let Some(dir) = dest.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| backend("fsync", dir, e))?;
        }
        Ok(())
    }

    pub(super) async fn put(
        &self,
        key: &str,
        len: u64,
        rx: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Digested, ObjectError> {
        let dest = self.path(key);
        let (mut file, temp) = self.temp_for(&dest)?;
        let mut hasher = Hasher::new();
        while let Some(chunk) = rx.recv().await {
            if hasher.size().saturating_add(chunk.len() as u64) > len {
                return Err(ObjectError::Long(len));
            }
            file.write_all(&chunk)
                .map_err(|e| backend("write", &temp.path, e))?;
            hasher.update(&chunk);
        }
        if hasher.size() != len {
            return Err(ObjectError::Short {
                got: hasher.size(),
                want: len,
            });
        }
        Self::commit(file, temp, &dest)?;
        Ok(hasher.finish())
    }

    pub(super) async fn put_unsized(
        &self,
        key: &str,
        max: u64,
        rx: &mut mpsc::Receiver<Bytes>,
    ) -> Result<Digested, ObjectError> {
        let dest = self.path(key);
        let (mut file, temp) = self.temp_for(&dest)?;
        let mut hasher = Hasher::new();
        loop {
            let Some(chunk) = rx.recv().await else {
                return Err(ObjectError::Aborted);
            };
            if chunk.is_empty() {
                break;
            }
            if hasher.size().saturating_add(chunk.len() as u64) > max {
                return Err(ObjectError::Long(max));
            }
            file.write_all(&chunk)
                .map_err(|e| backend("write", &temp.path, e))?;
            hasher.update(&chunk);
        }
        Self::commit(file, temp, &dest)?;
        Ok(hasher.finish())
    }

    pub(super) async fn compose(
        &self,
        parts: &[(String, u64)],
        dest: &str,
    ) -> Result<Digested, ObjectError> {
        let dest = self.path(dest);
        let (mut out, temp) = self.temp_for(&dest)?;
        let mut hasher = Hasher::new();
        let mut buf = vec![0u8; CHUNK_BYTES];
        for (key, len) in parts {
            let path = self.path(key);
            let mut input = File::open(&path).map_err(|_| ObjectError::Missing(key.clone()))?;
            let mut copied = 0u64;
            loop {
                let n = input
                    .read(&mut buf)
                    .map_err(|e| backend("read", &path, e))?;
                let Some(data) = buf.get(..n).filter(|d| !d.is_empty()) else {
                    break;
                };
                out.write_all(data)
                    .map_err(|e| backend("write", &temp.path, e))?;
                hasher.update(data);
                copied = copied.saturating_add(n as u64);
                tokio::task::yield_now().await;
            }
            if copied != *len {
                return Err(ObjectError::Missing(key.clone()));
            }
        }
        Self::commit(out, temp, &dest)?;
        Ok(hasher.finish())
    }

    pub(super) async fn read(
        &self,
        key: &str,
        len: u64,
        tx: &mpsc::Sender<Bytes>,
    ) -> Result<(), ObjectError> {
        let path = self.path(key);
        let mut file = File::open(&path).map_err(|_| ObjectError::Missing(key.to_owned()))?;
        let size = file
            .metadata()
            .map_err(|e| backend("stat", &path, e))?
            .len();
        if size != len {
            return Err(ObjectError::Missing(key.to_owned()));
        }
        let mut sent = 0u64;
        while sent < len {
            let want = usize::try_from(len - sent)
                .unwrap_or(CHUNK_BYTES)
                .min(CHUNK_BYTES);
            let mut buf = vec![0u8; want];
            file.read_exact(&mut buf)
                .map_err(|e| backend("read", &path, e))?;
            sent += want as u64;
            if tx.send(Bytes::from(buf)).await.is_err() {
                // The reader left; nothing more to do.
                return Ok(());
            }
        }
        Ok(())
    }

    pub(super) fn delete(&self, key: &str) -> Result<(), ObjectError> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(backend("remove", &path, e)),
        }
    }

    pub(super) fn delete_prefix(&self, prefix: &str) -> Result<(), ObjectError> {
        let path = self.path(prefix.trim_end_matches('/'));
        match fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(backend("remove", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    async fn put(
        o: &FsObjects,
        key: &str,
        len: u64,
        chunks: &[&[u8]],
    ) -> Result<Digested, ObjectError> {
        let (tx, mut rx) = mpsc::channel(chunks.len().max(1));
        for c in chunks {
            tx.send(Bytes::copy_from_slice(c)).await.expect("queued");
        }
        drop(tx);
        o.put(key, len, &mut rx).await
    }

    #[test]
    fn put_compose_read_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = FsObjects::new(dir.path().join("objects"));
        run(async {
            o.startup().expect("startup");
            put(&o, "receipts/r/part-00001", 3, &[b"ab", b"c"])
                .await
                .expect("part 1");
            put(&o, "receipts/r/part-00002", 0, &[])
                .await
                .expect("empty part 2");
            assert_eq!(
                put(&o, "receipts/r/part-00003", 4, &[b"ab"]).await,
                Err(ObjectError::Short { got: 2, want: 4 })
            );
            assert_eq!(
                put(&o, "receipts/r/part-00003", 1, &[b"ab"]).await,
                Err(ObjectError::Long(1))
            );
            // Failed writes leave neither the key nor a temp file.
            let names: Vec<_> = fs::read_dir(dir.path().join("objects/receipts/r"))
                .expect("dir")
                .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
                .collect();
            assert_eq!(names.len(), 2, "{names:?}");
            let d = o
                .compose(
                    &[
                        ("receipts/r/part-00001".into(), 3),
                        ("receipts/r/part-00002".into(), 0),
                    ],
                    "receipts/r/object",
                )
                .await
                .expect("compose");
            assert_eq!(d.size, 3);
            assert_eq!(
                o.compose(&[("receipts/r/part-00001".into(), 4)], "receipts/r/x")
                    .await,
                Err(ObjectError::Missing("receipts/r/part-00001".into()))
            );
            let (tx, mut rx) = mpsc::channel(4);
            o.read("receipts/r/object", 3, &tx).await.expect("read");
            drop(tx);
            assert_eq!(rx.recv().await.as_deref(), Some(&b"abc"[..]));
            o.delete_prefix("receipts/r/").expect("delete");
            o.delete_prefix("receipts/r/").expect("delete again");
            assert!(!dir.path().join("objects/receipts/r").exists());
        });
    }
}
