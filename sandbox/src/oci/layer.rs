//! Layer import: decode (gzip or plain), hash and count one layer's stream,
//! unpack it into a private temp dir, verify its digests, and publish it in the
//! store with `RENAME_NOREPLACE` (a concurrent import of the same layer wins or
//! loses cleanly) beside its metadata.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use sha2::{Digest as _, Sha256};

use super::digest::Sha256Digest;
use super::extract::Extractor;
use super::manifest::LayerSpec;
use super::paths::open_dir_path;
use super::source::Source;
use super::{io_err, ImportLimits, OciError};

#[derive(Debug, Default)]
pub(super) struct Budget {
    pub(super) entries: u64,
    pub(super) bytes: u64,
}

/// Bound on decompressed tar stream bytes: file data plus generous room for
/// headers, so that padding or zero-block bombs cannot run forever.
pub(super) fn stream_cap(limits: &ImportLimits, used_bytes: u64) -> u64 {
    limits
        .max_total_bytes
        .saturating_sub(used_bytes)
        .saturating_add(limits.max_entries.saturating_mul(2048))
        .saturating_add(1 << 20)
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub(super) fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}-{:x}-{:x}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes a temp directory on drop unless disarmed.
struct TempDirGuard {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempDirGuard {
    fn drop(&mut self) {
        if self.armed {
            // remove_dir_all does not follow symlinks, so hostile content
            // cannot redirect the cleanup.
            if let Err(e) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove temp dir");
            }
        }
    }
}

fn is_dir_nofollow(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}

pub(super) fn import_layer(
    src: &Source,
    spec: &LayerSpec,
    store: &Path,
    limits: &ImportLimits,
    budget: &mut Budget,
) -> Result<String, OciError> {
    if let Some(mt) = &spec.media_type {
        if mt.contains("zstd") {
            return Err(OciError::UnsupportedCompression {
                blob: spec.blob.clone(),
                reason: format!("media type {mt} (zstd layers are not supported)"),
            });
        }
    }
    if let Some(diff) = &spec.diff_id {
        let id = diff.layer_id();
        if is_dir_nofollow(&store.join(&id)) {
            tracing::debug!(layer = %id, blob = %spec.blob, "layer cached, not unpacked");
            return Ok(id);
        }
    }

    let reader = src
        .open_member(&spec.member)?
        .ok_or_else(|| OciError::MissingBlob {
            blob: spec.blob.clone(),
        })?;

    // Private temp dir, removed on any error (or panic).
    let tmp_name = format!(
        ".tmp-{}-{}",
        spec.diff_id
            .as_ref()
            .map_or_else(|| "unknown".to_string(), |d| d.layer_id()),
        unique_suffix()
    );
    let tmp_path = store.join(&tmp_name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp_path)
        .map_err(io_err(&tmp_path, "create temp layer dir"))?;
    let guard = TempDirGuard {
        path: tmp_path.clone(),
        armed: true,
    };
    let root = open_dir_path(&tmp_path, false).map_err(io_err(&tmp_path, "open temp layer dir"))?;

    let sync_fd = root
        .try_clone()
        .map_err(io_err(&tmp_path, "dup temp layer dir"))?;
    let stats = unpack_layer(reader, spec, root, limits, budget)?;

    let id = stats.diff_id.layer_id();
    if let Some(expected) = &spec.digest {
        if &stats.digest != expected {
            return Err(OciError::DigestMismatch {
                blob: spec.blob.clone(),
                expected: expected.display(),
                actual: stats.digest.display(),
            });
        }
    }
    if let Some(size) = spec.size {
        if size != stats.compressed_bytes {
            return Err(OciError::SizeMismatch {
                blob: spec.blob.clone(),
                expected: size,
                actual: stats.compressed_bytes,
            });
        }
    }
    if let Some(expected) = &spec.diff_id {
        if &stats.diff_id != expected {
            return Err(OciError::DiffIdMismatch {
                blob: spec.blob.clone(),
                expected: expected.display(),
                actual: stats.diff_id.display(),
            });
        }
    }

    // Flush the layer before publishing it: once renamed, a layer is trusted
    // forever, so it must not be left with empty files by a crash.
    nix::unistd::syncfs(sync_fd.as_raw_fd()).map_err(io_err(&tmp_path, "syncfs"))?;
    drop(sync_fd);
    let final_path = store.join(&id);
    // RENAME_NOREPLACE: fails with EEXIST instead of replacing a published layer.
    match crate::sys::rename_noreplace(&tmp_path, &final_path) {
        Ok(()) => {
            let mut guard = guard;
            guard.armed = false;
            tracing::debug!(
                layer = %id,
                blob = %spec.blob,
                entries = stats.entries,
                bytes = stats.bytes,
                compression = stats.compression,
                "layer unpacked"
            );
        }
        Err(Errno::EEXIST | Errno::ENOTEMPTY) => {
            // Another import won the race; ours is discarded by the guard.
            tracing::debug!(layer = %id, "layer appeared concurrently, discarding our copy");
            drop(guard);
        }
        Err(e) => return Err(io_err(&final_path, "rename layer into place")(e)),
    }

    let meta_path = store.join(format!("{id}.json"));
    if !meta_path.exists() {
        let meta = serde_json::json!({
            "id": id,
            "diff_id": stats.diff_id.display(),
            "size": stats.bytes,
            "entries": stats.entries,
            "source_digest": stats.digest.display(),
            "source": spec.blob,
            "compression": stats.compression,
        });
        let tmp_meta = store.join(format!(".tmp-{id}.json-{}", unique_suffix()));
        let write = || -> io::Result<()> {
            let mut f = File::create(&tmp_meta)?;
            f.write_all(meta.to_string().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp_meta, &meta_path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp_meta);
            return Err(io_err(&meta_path, "write layer metadata")(e));
        }
    }
    Ok(id)
}

/// Reader that hashes and counts what passes through it, failing (and setting
/// a flag) once more than `limit` bytes have been read.
struct Counted<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
    limit: u64,
    exceeded: Rc<Cell<bool>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.bytes > self.limit {
            self.exceeded.set(true);
            return Err(io::Error::other(
                "decompressed stream exceeds the size limit",
            ));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

enum Decoder<R: BufRead> {
    Plain(R),
    Gzip(flate2::bufread::MultiGzDecoder<R>),
}

impl<R: BufRead> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(r) => r.read(buf),
        }
    }
}

impl<R: BufRead> Decoder<R> {
    fn into_inner(self) -> R {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(r) => r.into_inner(),
        }
    }
}

struct LayerStats {
    digest: Sha256Digest,
    compressed_bytes: u64,
    diff_id: Sha256Digest,
    entries: u64,
    bytes: u64,
    compression: &'static str,
}

fn unpack_layer(
    reader: Box<dyn Read + '_>,
    spec: &LayerSpec,
    root: OwnedFd,
    limits: &ImportLimits,
    budget: &mut Budget,
) -> Result<LayerStats, OciError> {
    let blob = spec.blob.as_str();
    let corrupt = |reason: String| OciError::CorruptLayer {
        blob: blob.to_string(),
        reason,
    };
    let exceeded = Rc::new(Cell::new(false));
    let mut raw = BufReader::with_capacity(
        256 << 10,
        Counted {
            inner: reader,
            hasher: Sha256::new(),
            bytes: 0,
            limit: u64::MAX,
            exceeded: exceeded.clone(),
        },
    );
    let head = raw
        .fill_buf()
        .map_err(|e| corrupt(format!("cannot read blob: {e}")))?;
    let (decoder, compression) = match head {
        [0x1f, 0x8b, ..] => (
            Decoder::Gzip(flate2::bufread::MultiGzDecoder::new(raw)),
            "gzip",
        ),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            return Err(OciError::UnsupportedCompression {
                blob: blob.to_string(),
                reason: "zstd-compressed layers are not supported".into(),
            })
        }
        _ => (Decoder::Plain(raw), "none"),
    };
    let diff = Counted {
        inner: decoder,
        hasher: Sha256::new(),
        bytes: 0,
        limit: stream_cap(limits, budget.bytes),
        exceeded: exceeded.clone(),
    };
    let stream_err = |e: io::Error, entry: &str| -> OciError {
        if exceeded.get() {
            OciError::LimitExceeded {
                blob: blob.to_string(),
                entry: entry.to_string(),
                reason: "decompressed layer stream exceeds the size limit".into(),
            }
        } else {
            corrupt(format!("bad gzip/tar stream: {e}"))
        }
    };

    let mut ex = Extractor::new(root, blob, limits, budget);
    let mut archive = tar::Archive::new(diff);
    {
        let entries = archive.entries().map_err(|e| stream_err(e, ""))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| stream_err(e, ""))?;
            ex.entry(&mut entry, &stream_err)?;
        }
    }
    ex.finish()?;

    // Hash the rest of the uncompressed stream (end-of-archive blocks), then
    // the rest of the compressed blob.
    let mut diff = archive.into_inner();
    io::copy(&mut diff, &mut io::sink()).map_err(|e| stream_err(e, ""))?;
    let Counted {
        inner: decoder,
        hasher: diff_hasher,
        ..
    } = diff;
    let mut raw = decoder.into_inner();
    io::copy(&mut raw, &mut io::sink()).map_err(|e| corrupt(format!("cannot read blob: {e}")))?;
    let raw = raw.into_inner();
    Ok(LayerStats {
        digest: Sha256Digest::from_hasher(raw.hasher),
        compressed_bytes: raw.bytes,
        diff_id: Sha256Digest::from_hasher(diff_hasher),
        entries: ex.entries,
        bytes: ex.bytes,
        compression,
    })
}
