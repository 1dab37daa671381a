//! Content-addressed importer of OCI image layouts and `docker save` archives.
//!
//! [`import`] reads an image from an OCI image layout directory, or from a tar
//! archive (optionally gzip-compressed) holding either a `docker save` export or
//! an OCI layout, and unpacks each layer into a read-only layer store:
//!
//! ```text
//! <store>/sha256-<diffid>/        finished layer, usable as an overlayfs lowerdir
//! <store>/sha256-<diffid>.json    metadata (size, entries, source digest)
//! <store>/.tmp-<id>-<random>/     layer being unpacked (removed on error)
//! ```
//!
//! Layers are identified by the sha256 of their *uncompressed* tar stream (the
//! "diff id"). Unpacking happens in a private temp dir that is renamed into place
//! with `RENAME_NOREPLACE`, so concurrent imports of the same layer are safe: the
//! loser discards its copy.
//!
//! Every tar entry is treated as hostile: paths are resolved lexically and
//! written with an `openat(O_NOFOLLOW)` walk from the layer root, so nothing is
//! ever written through a symlink or outside the temp dir. See
//! `docs/sandbox-oci.md` for the rules.
//!
//! The steps, one file each: `source.rs` reads the image's files (a layout
//! directory or an indexed outer archive), `manifest.rs` resolves its index,
//! manifest and config into a plan of layers, `layer.rs` decodes, verifies and
//! publishes each layer in the store, and `extract.rs` writes a layer's entries
//! safely; `digest.rs` and `paths.rs` hold the digests and the hostile-path
//! rules they share.

mod digest;
mod extract;
mod layer;
mod manifest;
mod paths;
mod source;
#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};

use layer::{import_layer, Budget};
use manifest::{plan_docker, plan_oci};
use source::Source;

/// Resource limits applied to one [`import`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportLimits {
    /// Maximum number of file-content bytes unpacked over all layers.
    pub max_total_bytes: u64,
    /// Maximum size of a single regular file.
    pub max_file_bytes: u64,
    /// Maximum number of tar entries over all layers (and in an outer archive).
    pub max_entries: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        Self {
            max_total_bytes: 8 << 30,
            max_file_bytes: 4 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// Result of a successful [`import`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedImage {
    /// Layer ids (`sha256-<hex>`, the diff id), bottom layer first. Each is a
    /// directory `<store>/<id>`.
    pub layers: Vec<String>,
    /// `Env` of the image config (`KEY=value`).
    pub env: Vec<String>,
    /// `WorkingDir` of the image config, if set and non-empty.
    pub working_dir: Option<String>,
    /// Effective command: the config's `Entrypoint` followed by its `Cmd`.
    pub cmd: Vec<String>,
}

/// Errors of the OCI importer. Every variant names the file, blob or entry at
/// fault and the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OciError {
    /// An I/O error on the source or the store, outside layer extraction.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The source is neither an OCI layout directory nor a (gzip) tar archive
    /// holding a `docker save` export or an OCI layout.
    #[error("{}: unrecognised image source: {reason}", path.display())]
    UnrecognizedSource { path: PathBuf, reason: String },
    /// A blob referenced by the image is absent.
    #[error("blob {blob} is missing from the image")]
    MissingBlob { blob: String },
    /// A JSON document (index, manifest, config) or a reference in it is invalid.
    #[error("{blob}: invalid image metadata: {reason}")]
    InvalidImage { blob: String, reason: String },
    /// The blob's sha256 does not match the digest that references it.
    #[error("blob {blob}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        blob: String,
        expected: String,
        actual: String,
    },
    /// The blob's size does not match its descriptor.
    #[error("blob {blob}: size mismatch: descriptor says {expected} bytes, blob has {actual}")]
    SizeMismatch {
        blob: String,
        expected: u64,
        actual: u64,
    },
    /// The uncompressed layer's sha256 does not match the config's diff id.
    #[error("layer {blob}: diff id mismatch: config says {expected}, content is {actual}")]
    DiffIdMismatch {
        blob: String,
        expected: String,
        actual: String,
    },
    /// The layer uses a compression this importer does not handle (zstd).
    #[error("layer {blob}: unsupported compression: {reason}")]
    UnsupportedCompression { blob: String, reason: String },
    /// The layer's gzip or tar stream is corrupt or truncated.
    #[error("layer {blob}: corrupt archive: {reason}")]
    CorruptLayer { blob: String, reason: String },
    /// A tar entry was refused as unsafe (path escape, write through a symlink,
    /// hard link outside the layer, device node...).
    #[error("layer {blob}: entry {entry:?} refused: {reason}")]
    UnsafeEntry {
        blob: String,
        entry: String,
        reason: String,
    },
    /// A tar entry has a type the importer does not support.
    #[error("layer {blob}: entry {entry:?} has unsupported type {kind}")]
    UnsupportedEntry {
        blob: String,
        entry: String,
        kind: String,
    },
    /// A size or count limit of [`ImportLimits`] was exceeded.
    #[error("{blob}: entry {entry:?}: limit exceeded: {reason}")]
    LimitExceeded {
        blob: String,
        entry: String,
        reason: String,
    },
    /// A filesystem operation failed while extracting an entry.
    #[error("layer {blob}: entry {entry:?}: cannot {op}: {source}")]
    Extract {
        blob: String,
        entry: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a, E: Into<io::Error>>(
    path: &'a Path,
    op: &'static str,
) -> impl FnOnce(E) -> OciError + 'a {
    move |source| OciError::Io {
        path: path.to_path_buf(),
        op,
        source: source.into(),
    }
}

/// Largest JSON document (index, manifest, config) accepted.
const MAX_JSON_BYTES: u64 = 16 << 20;
/// Longest entry path accepted (Linux `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// Depth limit for nested indexes and symlink chains inside archives.
const MAX_DEPTH: usize = 8;

/// Imports the image at `source` into the layer store `store`.
///
/// `source` is an OCI image layout directory, or a tar file (optionally gzip)
/// holding a `docker save` archive or an OCI layout; the kind is detected from
/// content. Layers already present in the store are not unpacked again.
pub fn import(
    source: &Path,
    store: &Path,
    limits: &ImportLimits,
) -> Result<ImportedImage, OciError> {
    std::fs::create_dir_all(store).map_err(io_err(store, "create store directory"))?;
    let src = Source::open(source, store, limits)?;
    let plan = if src.exists("index.json") {
        plan_oci(&src)?
    } else if src.exists("manifest.json") {
        plan_docker(&src)?
    } else {
        return Err(OciError::UnrecognizedSource {
            path: source.to_path_buf(),
            reason: "neither index.json (OCI layout) nor manifest.json (docker save) found".into(),
        });
    };
    tracing::debug!(source = %source.display(), layers = plan.layers.len(), "image resolved");

    let mut budget = Budget::default();
    let mut ids = Vec::with_capacity(plan.layers.len());
    for layer in &plan.layers {
        ids.push(import_layer(&src, layer, store, limits, &mut budget)?);
    }
    tracing::info!(
        source = %source.display(),
        layers = ids.len(),
        entries = budget.entries,
        bytes = budget.bytes,
        "image imported"
    );
    let cfg = plan.config;
    let mut cmd = cfg.entrypoint.unwrap_or_default();
    cmd.extend(cfg.cmd.unwrap_or_default());
    Ok(ImportedImage {
        layers: ids,
        env: cfg.env.unwrap_or_default(),
        working_dir: cfg.working_dir.filter(|w| !w.is_empty()),
        cmd,
    })
}
