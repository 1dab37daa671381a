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

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

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

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> OciError + 'a {
    move |source| OciError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Largest JSON document (index, manifest, config) accepted.
const MAX_JSON_BYTES: u64 = 16 << 20;
/// Longest entry path accepted (Linux `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// Depth limit for nested indexes and symlink chains inside archives.
const MAX_DEPTH: usize = 8;

// ---------------------------------------------------------------------------
// Public entry point
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Digests
// ---------------------------------------------------------------------------

/// A validated `sha256:<64 lowercase hex>` digest; only the hex is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sha256Digest(String);

impl Sha256Digest {
    fn parse(s: &str, blob: &str) -> Result<Self, OciError> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| OciError::InvalidImage {
                blob: blob.to_string(),
                reason: format!("unsupported digest {s:?} (only sha256 is supported)"),
            })?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(OciError::InvalidImage {
                blob: blob.to_string(),
                reason: format!("malformed sha256 digest {s:?}"),
            });
        }
        Ok(Self(hex.to_string()))
    }
    fn from_hasher(h: Sha256) -> Self {
        Self(hex::encode(h.finalize()))
    }
    fn display(&self) -> String {
        format!("sha256:{}", self.0)
    }
    fn layer_id(&self) -> String {
        format!("sha256-{}", self.0)
    }
    fn blob_path(&self) -> String {
        format!("blobs/sha256/{}", self.0)
    }
}

// ---------------------------------------------------------------------------
// Image sources
// ---------------------------------------------------------------------------

/// Where the image's files live.
enum Source {
    /// A directory (OCI layout, or an unpacked `docker save`).
    Dir { path: PathBuf, root: OwnedFd },
    /// A tar archive, indexed by member path; data read with `pread`.
    Tar {
        path: PathBuf,
        file: File,
        members: HashMap<String, Member>,
    },
}

#[derive(Debug, Clone)]
enum Member {
    Data {
        offset: u64,
        size: u64,
    },
    /// Symlink or hard link to another member (archive-rooted, normalised).
    Link(Option<String>),
}

/// Lexically normalises a slash-separated path: drops empty and `.` parts,
/// resolves `..` against earlier parts. Fails when `..` would climb above the
/// root or the path contains a NUL byte.
fn normalize(raw: &[u8]) -> Result<Vec<&[u8]>, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".into());
    }
    let mut out: Vec<&[u8]> = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err("`..` climbs above the layer root".into());
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn join(comps: &[&[u8]]) -> String {
    let parts: Vec<String> = comps
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    parts.join("/")
}

impl Source {
    fn open(path: &Path, store: &Path, limits: &ImportLimits) -> Result<Self, OciError> {
        let meta = std::fs::metadata(path).map_err(io_err(path, "stat image source"))?;
        if meta.is_dir() {
            let root = open_dir_path(path, true).map_err(io_err(path, "open image directory"))?;
            return Ok(Source::Dir {
                path: path.to_path_buf(),
                root,
            });
        }
        if !meta.is_file() {
            return Err(OciError::UnrecognizedSource {
                path: path.to_path_buf(),
                reason: "neither a directory nor a regular file".into(),
            });
        }
        let mut file = File::open(path).map_err(io_err(path, "open image archive"))?;
        let mut magic = [0u8; 4];
        let n = read_up_to(&mut file, &mut magic).map_err(io_err(path, "read image archive"))?;
        let file = match &magic[..n] {
            [0x1f, 0x8b, ..] => gunzip_to_temp(path, file, store, limits)?,
            [0x28, 0xb5, 0x2f, 0xfd] => {
                return Err(OciError::UnrecognizedSource {
                    path: path.to_path_buf(),
                    reason: "zstd-compressed archives are not supported".into(),
                })
            }
            _ => file,
        };
        let members = index_tar(path, &file, limits)?;
        Ok(Source::Tar {
            path: path.to_path_buf(),
            file,
            members,
        })
    }

    fn exists(&self, rel: &str) -> bool {
        matches!(self.open_member(rel), Ok(Some(_)))
    }

    /// Opens `rel` (slash-separated, relative to the image root). `Ok(None)`
    /// when absent.
    fn open_member(&self, rel: &str) -> Result<Option<Box<dyn Read + '_>>, OciError> {
        let comps = match normalize(rel.as_bytes()) {
            Ok(c) if !c.is_empty() => c,
            _ => return Ok(None),
        };
        match self {
            Source::Dir { path, root } => {
                let (name, parents) = match comps.split_last() {
                    Some(x) => x,
                    None => return Ok(None),
                };
                let parent = match walk(root.as_fd(), parents, None) {
                    Ok(fd) => fd,
                    Err(_) => return Ok(None),
                };
                let cname = match cstring(name) {
                    Ok(c) => c,
                    Err(_) => return Ok(None),
                };
                let fd = match sys::openat(
                    parent.as_fd(),
                    &cname,
                    // O_NONBLOCK: a FIFO planted as a blob must not hang us.
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    0,
                ) {
                    Ok(fd) => fd,
                    Err(e) if is_absent(&e) => return Ok(None),
                    Err(e) => return Err(io_err(&path.join(rel), "open blob")(e)),
                };
                let file = File::from(fd);
                let meta = file
                    .metadata()
                    .map_err(io_err(&path.join(rel), "stat blob"))?;
                if !meta.is_file() {
                    return Ok(None);
                }
                Ok(Some(Box::new(file)))
            }
            Source::Tar { file, members, .. } => {
                let mut key = join(&comps);
                for _ in 0..MAX_DEPTH {
                    match members.get(&key) {
                        None | Some(Member::Link(None)) => return Ok(None),
                        Some(Member::Link(Some(target))) => key = target.clone(),
                        Some(Member::Data { offset, size }) => {
                            let r = SectionReader {
                                file,
                                pos: *offset,
                                end: offset.saturating_add(*size),
                            };
                            return Ok(Some(Box::new(r)));
                        }
                    }
                }
                Ok(None)
            }
        }
    }

    fn label(&self) -> &Path {
        match self {
            Source::Dir { path, .. } | Source::Tar { path, .. } => path,
        }
    }

    /// Reads a JSON member, verifying its digest (and size) when given.
    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        rel: &str,
        blob: &str,
        expected: Option<(&Sha256Digest, Option<u64>)>,
    ) -> Result<T, OciError> {
        let reader = self
            .open_member(rel)?
            .ok_or_else(|| OciError::MissingBlob {
                blob: blob.to_string(),
            })?;
        let mut buf = Vec::new();
        reader
            .take(MAX_JSON_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(io_err(&self.label().join(rel), "read blob"))?;
        if buf.len() as u64 > MAX_JSON_BYTES {
            return Err(OciError::LimitExceeded {
                blob: blob.to_string(),
                entry: rel.to_string(),
                reason: format!("JSON document larger than {MAX_JSON_BYTES} bytes"),
            });
        }
        if let Some((digest, size)) = expected {
            let actual = Sha256Digest(hex::encode(Sha256::digest(&buf)));
            if &actual != digest {
                return Err(OciError::DigestMismatch {
                    blob: blob.to_string(),
                    expected: digest.display(),
                    actual: actual.display(),
                });
            }
            if let Some(size) = size {
                if size != buf.len() as u64 {
                    return Err(OciError::SizeMismatch {
                        blob: blob.to_string(),
                        expected: size,
                        actual: buf.len() as u64,
                    });
                }
            }
        }
        serde_json::from_slice(&buf).map_err(|e| OciError::InvalidImage {
            blob: blob.to_string(),
            reason: e.to_string(),
        })
    }
}

fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Decompresses a gzip-compressed outer archive into an unlinked temp file in
/// the store (so members can be read at random offsets).
fn gunzip_to_temp(
    path: &Path,
    mut file: File,
    store: &Path,
    limits: &ImportLimits,
) -> Result<File, OciError> {
    use std::io::Seek;
    file.seek(io::SeekFrom::Start(0))
        .map_err(io_err(path, "rewind image archive"))?;
    let tmp_path = store.join(format!(".tmp-src-{}", unique_suffix()));
    let mut out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp_path)
        .map_err(io_err(&tmp_path, "create temp file"))?;
    // Unlink at once: the open handle keeps the data, nothing is left behind.
    std::fs::remove_file(&tmp_path).map_err(io_err(&tmp_path, "unlink temp file"))?;
    let cap = stream_cap(limits, 0);
    let mut dec =
        flate2::read::MultiGzDecoder::new(BufReader::new(file)).take(cap.saturating_add(1));
    let n = io::copy(&mut dec, &mut out).map_err(|e| OciError::UnrecognizedSource {
        path: path.to_path_buf(),
        reason: format!("corrupt gzip stream: {e}"),
    })?;
    if n > cap {
        return Err(OciError::LimitExceeded {
            blob: path.display().to_string(),
            entry: String::new(),
            reason: format!("decompressed archive larger than {cap} bytes"),
        });
    }
    Ok(out)
}

/// Indexes the members of an outer tar archive.
fn index_tar(
    path: &Path,
    file: &File,
    limits: &ImportLimits,
) -> Result<HashMap<String, Member>, OciError> {
    let bad = |reason: String| OciError::UnrecognizedSource {
        path: path.to_path_buf(),
        reason,
    };
    let len = file.metadata().map_err(io_err(path, "stat archive"))?.len();
    let mut reader = SectionReader {
        file,
        pos: 0,
        end: len,
    };
    let mut archive = tar::Archive::new(&mut reader);
    let mut members = HashMap::new();
    let entries = archive
        .entries_with_seek()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    let mut count = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| bad(format!("not a valid tar archive: {e}")))?;
        count += 1;
        if count > limits.max_entries {
            return Err(OciError::LimitExceeded {
                blob: path.display().to_string(),
                entry: String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
                reason: format!("archive has more than {} entries", limits.max_entries),
            });
        }
        let raw = entry.path_bytes().into_owned();
        let Ok(comps) = normalize(&raw) else { continue };
        if comps.is_empty() {
            continue;
        }
        let key = join(&comps);
        let kind = entry.header().entry_type();
        let member = if kind.is_file() || kind == tar::EntryType::Continuous {
            Member::Data {
                offset: entry.raw_file_position(),
                size: entry.size(),
            }
        } else if kind.is_symlink() || kind.is_hard_link() {
            let target = entry.link_name_bytes().map(|t| t.into_owned());
            let resolved = target.and_then(|t| {
                let full = if kind.is_symlink() && !t.starts_with(b"/") {
                    let mut base = comps[..comps.len() - 1].join(&b'/');
                    base.push(b'/');
                    base.extend_from_slice(&t);
                    base
                } else {
                    t
                };
                normalize(&full).ok().map(|c| join(&c))
            });
            Member::Link(resolved)
        } else {
            continue;
        };
        members.insert(key, member);
    }
    if members.is_empty() {
        return Err(bad("not a tar archive, or an empty one".into()));
    }
    Ok(members)
}

/// Reads `[pos, end)` of a file with `pread`, never moving a shared offset.
struct SectionReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

/// Seeking lets the archive index skip member data instead of reading it.
impl io::Seek for SectionReader<'_> {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        let new = match pos {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            io::SeekFrom::End(d) => self.end.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| io::Error::other("seek out of range"))?;
        Ok(self.pos)
    }
}

impl Read for SectionReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.pos);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------
// Image resolution (OCI and docker save)
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    digest: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
}

#[derive(Debug, Deserialize)]
struct IndexOrManifest {
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

#[derive(Debug, Default, Deserialize)]
struct ImageConfigFile {
    #[serde(default)]
    config: Option<ContainerConfig>,
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Debug, Default, Deserialize)]
struct ContainerConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct DockerManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// One layer to import.
struct LayerSpec {
    /// Name used in errors and metadata (digest or archive path).
    blob: String,
    /// Member path inside the source.
    member: String,
    media_type: Option<String>,
    digest: Option<Sha256Digest>,
    size: Option<u64>,
    diff_id: Option<Sha256Digest>,
}

struct Plan {
    config: ContainerConfig,
    layers: Vec<LayerSpec>,
}

fn plan_oci(src: &Source) -> Result<Plan, OciError> {
    let mut doc: IndexOrManifest = src.read_json("index.json", "index.json", None)?;
    let mut label = "index.json".to_string();
    for _ in 0..MAX_DEPTH {
        if let Some(manifests) = doc.manifests.take() {
            let chosen = choose_manifest(manifests, &label)?;
            let digest = Sha256Digest::parse(&chosen.digest, &label)?;
            label = digest.display();
            tracing::debug!(manifest = %label, media_type = ?chosen.media_type, "following descriptor");
            doc = src.read_json(&digest.blob_path(), &label, Some((&digest, chosen.size)))?;
            continue;
        }
        let (Some(config), Some(layers)) = (doc.config.take(), doc.layers.take()) else {
            return Err(OciError::InvalidImage {
                blob: label,
                reason: "neither an image index (manifests) nor a manifest (config, layers)".into(),
            });
        };
        let cdigest = Sha256Digest::parse(&config.digest, &label)?;
        let clabel = cdigest.display();
        let cfg: ImageConfigFile =
            src.read_json(&cdigest.blob_path(), &clabel, Some((&cdigest, config.size)))?;
        let diff_ids = diff_ids(&cfg, &clabel, layers.len())?;
        let mut specs = Vec::with_capacity(layers.len());
        for (i, l) in layers.into_iter().enumerate() {
            let d = Sha256Digest::parse(&l.digest, &label)?;
            specs.push(LayerSpec {
                blob: d.display(),
                member: d.blob_path(),
                media_type: l.media_type,
                digest: Some(d),
                size: l.size,
                diff_id: diff_ids.as_ref().map(|v| v[i].clone()),
            });
        }
        return Ok(Plan {
            config: cfg.config.unwrap_or_default(),
            layers: specs,
        });
    }
    Err(OciError::InvalidImage {
        blob: label,
        reason: format!("image indexes nested deeper than {MAX_DEPTH}"),
    })
}

/// Picks one manifest of an index: the only one, else the first linux/amd64.
/// Attestation manifests (platform `unknown/unknown`) are ignored.
fn choose_manifest(manifests: Vec<Descriptor>, label: &str) -> Result<Descriptor, OciError> {
    let total = manifests.len();
    let mut candidates: Vec<Descriptor> = manifests
        .into_iter()
        .filter(|d| d.platform.as_ref().is_none_or(|p| p.os != "unknown"))
        .collect();
    if candidates.len() == 1 {
        return Ok(candidates.remove(0));
    }
    if let Some(pos) = candidates.iter().position(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    }) {
        return Ok(candidates.remove(pos));
    }
    Err(OciError::InvalidImage {
        blob: label.to_string(),
        reason: format!("index lists {total} manifests and none is the single or linux/amd64 one"),
    })
}

fn diff_ids(
    cfg: &ImageConfigFile,
    label: &str,
    layers: usize,
) -> Result<Option<Vec<Sha256Digest>>, OciError> {
    let Some(ids) = cfg.rootfs.as_ref().and_then(|r| r.diff_ids.as_ref()) else {
        return Ok(None);
    };
    if ids.len() != layers {
        return Err(OciError::InvalidImage {
            blob: label.to_string(),
            reason: format!("config lists {} diff ids for {layers} layers", ids.len()),
        });
    }
    ids.iter()
        .map(|s| Sha256Digest::parse(s, label))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// If `path` is `blobs/sha256/<hex>`, the digest it implies.
fn digest_from_blob_path(path: &str) -> Option<Sha256Digest> {
    let hex = path.strip_prefix("blobs/sha256/")?;
    Sha256Digest::parse(&format!("sha256:{hex}"), path).ok()
}

fn plan_docker(src: &Source) -> Result<Plan, OciError> {
    let mut entries: Vec<DockerManifestEntry> =
        src.read_json("manifest.json", "manifest.json", None)?;
    if entries.len() != 1 {
        return Err(OciError::InvalidImage {
            blob: "manifest.json".into(),
            reason: format!(
                "archive holds {} images, expected exactly one",
                entries.len()
            ),
        });
    }
    let entry = entries.remove(0);
    let cdigest = digest_from_blob_path(&entry.config);
    let cfg: ImageConfigFile = src.read_json(
        &entry.config,
        &entry.config,
        cdigest.as_ref().map(|d| (d, None)),
    )?;
    let diff_ids = diff_ids(&cfg, &entry.config, entry.layers.len())?;
    let layers = entry
        .layers
        .into_iter()
        .enumerate()
        .map(|(i, path)| LayerSpec {
            digest: digest_from_blob_path(&path),
            blob: path.clone(),
            member: path,
            media_type: None,
            size: None,
            diff_id: diff_ids.as_ref().map(|v| v[i].clone()),
        })
        .collect();
    Ok(Plan {
        config: cfg.config.unwrap_or_default(),
        layers,
    })
}

// ---------------------------------------------------------------------------
// Layer import
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Budget {
    entries: u64,
    bytes: u64,
}

/// Bound on decompressed tar stream bytes: file data plus generous room for
/// headers, so that padding or zero-block bombs cannot run forever.
fn stream_cap(limits: &ImportLimits, used_bytes: u64) -> u64 {
    limits
        .max_total_bytes
        .saturating_sub(used_bytes)
        .saturating_add(limits.max_entries.saturating_mul(2048))
        .saturating_add(1 << 20)
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique_suffix() -> String {
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

fn import_layer(
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
    sys::syncfs(sync_fd.as_fd()).map_err(io_err(&tmp_path, "syncfs"))?;
    drop(sync_fd);
    let final_path = store.join(&id);
    match sys::rename_noreplace(&tmp_path, &final_path) {
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
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST) | Some(libc::ENOTEMPTY)) => {
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

    let mut ex = Extractor {
        root,
        blob,
        limits,
        budget,
        extracted: HashSet::new(),
        dir_times: Vec::new(),
        root_seen: false,
        entries: 0,
        bytes: 0,
        buf: vec![0u8; 128 << 10],
        parent_cache: None,
    };
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

// ---------------------------------------------------------------------------
// Safe extraction
// ---------------------------------------------------------------------------

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

struct Extractor<'a> {
    root: OwnedFd,
    blob: &'a str,
    limits: &'a ImportLimits,
    budget: &'a mut Budget,
    /// Non-directory paths extracted so far in this layer (hard-link targets).
    extracted: HashSet<String>,
    /// Directory mtimes, applied once all entries are written.
    dir_times: Vec<(Vec<Vec<u8>>, i64)>,
    root_seen: bool,
    entries: u64,
    bytes: u64,
    /// Copy buffer, reused for every file.
    buf: Vec<u8>,
    /// Last parent directory opened, by path components.
    parent_cache: Option<(Vec<Vec<u8>>, Rc<OwnedFd>)>,
}

/// Metadata of one entry, from its header.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
}

impl Extractor<'_> {
    fn unsafe_entry(&self, entry: &str, reason: impl Into<String>) -> OciError {
        OciError::UnsafeEntry {
            blob: self.blob.to_string(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    fn fs_err(&self, entry: &str, op: &'static str) -> impl FnOnce(io::Error) -> OciError {
        let blob = self.blob.to_string();
        let entry = entry.to_string();
        move |source| OciError::Extract {
            blob,
            entry,
            op,
            source,
        }
    }

    fn limit(&self, entry: &str, reason: String) -> OciError {
        OciError::LimitExceeded {
            blob: self.blob.to_string(),
            entry: entry.to_string(),
            reason,
        }
    }

    fn entry<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        stream_err: &dyn Fn(io::Error, &str) -> OciError,
    ) -> Result<(), OciError> {
        let raw_path = e.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw_path).into_owned();
        self.budget.entries += 1;
        self.entries += 1;
        if self.budget.entries > self.limits.max_entries {
            return Err(self.limit(
                &name,
                format!("more than {} entries", self.limits.max_entries),
            ));
        }
        let kind = e.header().entry_type();
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        if raw_path.len() > MAX_PATH_BYTES {
            return Err(
                self.unsafe_entry(&name, format!("path longer than {MAX_PATH_BYTES} bytes"))
            );
        }
        let comps = normalize(&raw_path).map_err(|r| self.unsafe_entry(&name, r))?;
        let meta = self.meta(e.header(), &name)?;

        let Some((&last, parents)) = comps.split_last() else {
            if kind.is_dir() {
                // `./`: metadata of the layer root itself.
                let root = self
                    .root
                    .try_clone()
                    .map_err(self.fs_err(&name, "dup root"))?;
                self.set_owner_mode(&root, &meta, &name)?;
                self.dir_times.push((Vec::new(), meta.mtime));
                self.root_seen = true;
                return Ok(());
            }
            return Err(self.unsafe_entry(&name, "non-directory entry for the layer root"));
        };

        // Whiteouts are recognised by name, whatever the entry type.
        if last == OPAQUE_MARKER {
            let dir = self.parent(parents, &name)?;
            sys::fsetxattr(dir.as_fd(), c"trusted.overlay.opaque", b"y")
                .map_err(self.fs_err(&name, "set trusted.overlay.opaque"))?;
            tracing::trace!(entry = %name, "opaque directory");
            return Ok(());
        }
        if let Some(target) = last.strip_prefix(WHITEOUT_PREFIX) {
            if target.starts_with(WHITEOUT_PREFIX) {
                // Other `.wh..wh.*` entries are aufs metadata: skipped.
                tracing::debug!(entry = %name, "skipping aufs metadata entry");
                return Ok(());
            }
            if target.is_empty() || target == b"." || target == b".." {
                return Err(self.unsafe_entry(&name, "whiteout without a valid target name"));
            }
            let dir = self.parent(parents, &name)?;
            let mut tcomps = parents.to_vec();
            tcomps.push(target);
            self.clear_slot(&dir, target, &join(&tcomps), &name)?;
            self.whiteout(&dir, target, &name)?;
            return Ok(());
        }

        let key = join(&comps);
        let cname = cstring(last).map_err(|_| self.unsafe_entry(&name, "NUL in name"))?;
        let dir = self.parent(parents, &name)?;
        use tar::EntryType as T;
        match kind {
            T::Directory => {
                match sys::fstatat(dir.as_fd(), &cname) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                    Ok(_) => {
                        self.clear_slot(&dir, last, &key, &name)?;
                        sys::mkdirat(dir.as_fd(), &cname, 0o700)
                            .map_err(self.fs_err(&name, "create directory"))?;
                    }
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                        sys::mkdirat(dir.as_fd(), &cname, 0o700)
                            .map_err(self.fs_err(&name, "create directory"))?;
                    }
                    Err(err) => return Err(self.fs_err(&name, "stat")(err)),
                }
                let fd = sys::openat(
                    dir.as_fd(),
                    &cname,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    0,
                )
                .map_err(self.fs_err(&name, "open directory"))?;
                self.set_owner_mode(&fd, &meta, &name)?;
                self.dir_times
                    .push((comps.iter().map(|c| c.to_vec()).collect(), meta.mtime));
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                let size = e.size();
                if size > self.limits.max_file_bytes {
                    return Err(self.limit(
                        &name,
                        format!(
                            "file of {size} bytes exceeds max_file_bytes {}",
                            self.limits.max_file_bytes
                        ),
                    ));
                }
                if self.budget.bytes.saturating_add(size) > self.limits.max_total_bytes {
                    return Err(self.limit(
                        &name,
                        format!(
                            "image content exceeds max_total_bytes {}",
                            self.limits.max_total_bytes
                        ),
                    ));
                }
                let create = |dir: &OwnedFd| {
                    sys::openat(
                        dir.as_fd(),
                        &cname,
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o600,
                    )
                };
                // O_EXCL: never opens an existing file or follows a symlink.
                // Only when something is in the way is it removed first.
                let fd = match create(&dir) {
                    Err(err) if err.raw_os_error() == Some(libc::EEXIST) => {
                        self.clear_slot(&dir, last, &key, &name)?;
                        create(&dir)
                    }
                    other => other,
                }
                .map_err(self.fs_err(&name, "create file"))?;
                let mut file = File::from(fd);
                let mut written = 0u64;
                loop {
                    let n = match e.read(&mut self.buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                        Err(err) => return Err(stream_err(err, &name)),
                    };
                    written += n as u64;
                    if written > size || written > self.limits.max_file_bytes {
                        return Err(self.limit(&name, "file data exceeds its declared size".into()));
                    }
                    file.write_all(&self.buf[..n])
                        .map_err(self.fs_err(&name, "write file"))?;
                }
                if written != size {
                    return Err(stream_err(
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("entry {name:?} truncated: {written} of {size} bytes"),
                        ),
                        &name,
                    ));
                }
                self.budget.bytes += size;
                self.bytes += size;
                let fd = OwnedFd::from(file);
                self.set_owner_mode(&fd, &meta, &name)?;
                sys::futimens(fd.as_fd(), meta.mtime).map_err(self.fs_err(&name, "set mtime"))?;
                self.extracted.insert(key);
            }
            T::Symlink => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| self.unsafe_entry(&name, "symlink without a target"))?;
                if target.is_empty() {
                    return Err(self.unsafe_entry(&name, "symlink with an empty target"));
                }
                let ctarget =
                    cstring(&target).map_err(|_| self.unsafe_entry(&name, "NUL in link target"))?;
                self.clear_slot(&dir, last, &key, &name)?;
                sys::symlinkat(&ctarget, dir.as_fd(), &cname)
                    .map_err(self.fs_err(&name, "create symlink"))?;
                sys::fchownat_nofollow(dir.as_fd(), &cname, meta.uid, meta.gid)
                    .map_err(self.fs_err(&name, "chown symlink"))?;
                sys::utimensat_nofollow(dir.as_fd(), &cname, meta.mtime)
                    .map_err(self.fs_err(&name, "set symlink mtime"))?;
                self.extracted.insert(key);
            }
            T::Link => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| self.unsafe_entry(&name, "hard link without a target"))?
                    .into_owned();
                let tname = String::from_utf8_lossy(&target).into_owned();
                let tcomps = normalize(&target).map_err(|r| {
                    self.unsafe_entry(
                        &name,
                        format!("hard link target {tname:?} escapes the layer: {r}"),
                    )
                })?;
                let tkey = join(&tcomps);
                let Some((&tlast, tparents)) = tcomps.split_last() else {
                    return Err(self.unsafe_entry(&name, "hard link to the layer root"));
                };
                if !self.extracted.contains(&tkey) {
                    return Err(self.unsafe_entry(
                        &name,
                        format!(
                            "hard link target {tname:?} is not an entry extracted earlier in this layer"
                        ),
                    ));
                }
                if tkey == key {
                    return Err(self.unsafe_entry(&name, "hard link to itself"));
                }
                let tdir = walk(self.root.as_fd(), tparents, None)
                    .map_err(|r| self.unsafe_entry(&name, format!("hard link target: {r}")))?;
                let ctname =
                    cstring(tlast).map_err(|_| self.unsafe_entry(&name, "NUL in link target"))?;
                self.clear_slot(&dir, last, &key, &name)?;
                sys::linkat(tdir.as_fd(), &ctname, dir.as_fd(), &cname)
                    .map_err(self.fs_err(&name, "create hard link"))?;
                self.extracted.insert(key);
            }
            T::Char if is_zero_device(e.header()) => {
                // An overlay-format whiteout stored as-is.
                self.clear_slot(&dir, last, &key, &name)?;
                self.whiteout(&dir, last, &name)?;
            }
            T::Char | T::Block => {
                return Err(self.unsafe_entry(&name, "device nodes are not allowed in layers"));
            }
            T::Fifo => {
                self.clear_slot(&dir, last, &key, &name)?;
                sys::mknodat(dir.as_fd(), &cname, libc::S_IFIFO | 0o600, 0)
                    .map_err(self.fs_err(&name, "create fifo"))?;
                sys::fchownat_nofollow(dir.as_fd(), &cname, meta.uid, meta.gid)
                    .map_err(self.fs_err(&name, "chown fifo"))?;
                sys::fchmodat(dir.as_fd(), &cname, meta.mode)
                    .map_err(self.fs_err(&name, "chmod fifo"))?;
                sys::utimensat_nofollow(dir.as_fd(), &cname, meta.mtime)
                    .map_err(self.fs_err(&name, "set fifo mtime"))?;
                self.extracted.insert(key);
            }
            other => {
                return Err(OciError::UnsupportedEntry {
                    blob: self.blob.to_string(),
                    entry: name,
                    kind: format!("{other:?}"),
                });
            }
        }
        Ok(())
    }

    fn meta(&self, h: &tar::Header, name: &str) -> Result<Meta, OciError> {
        let bad = |what: &str, e: io::Error| OciError::CorruptLayer {
            blob: self.blob.to_string(),
            reason: format!("entry {name:?}: bad {what} field: {e}"),
        };
        let id = |v: u64, what: &str| {
            u32::try_from(v).map_err(|_| OciError::CorruptLayer {
                blob: self.blob.to_string(),
                reason: format!("entry {name:?}: {what} {v} out of range"),
            })
        };
        Ok(Meta {
            mode: h.mode().map_err(|e| bad("mode", e))? & 0o7777,
            uid: id(h.uid().map_err(|e| bad("uid", e))?, "uid")?,
            gid: id(h.gid().map_err(|e| bad("gid", e))?, "gid")?,
            mtime: i64::try_from(h.mtime().map_err(|e| bad("mtime", e))?).unwrap_or(i64::MAX),
        })
    }

    /// Opens (creating missing directories) the parent directory of an entry,
    /// refusing symlinks and non-directories on the way. The last parent is
    /// cached: tar entries of one directory are usually consecutive. A cached
    /// directory could only stop being the one at its path by being removed;
    /// the entry removing it has another parent, which replaces the cache
    /// first, and the cache is also dropped on every directory removal.
    fn parent(&mut self, parents: &[&[u8]], name: &str) -> Result<Rc<OwnedFd>, OciError> {
        if let Some((key, fd)) = &self.parent_cache {
            if key.len() == parents.len() && key.iter().zip(parents).all(|(a, b)| a == b) {
                return Ok(fd.clone());
            }
        }
        let mut created = 0u64;
        let fd = walk(self.root.as_fd(), parents, Some(&mut created));
        // Implicitly created directories count as entries, so that one deep
        // path cannot create unbounded numbers of inodes.
        self.budget.entries += created;
        if self.budget.entries > self.limits.max_entries {
            return Err(self.limit(
                name,
                format!(
                    "more than {} entries (with implicit parent directories)",
                    self.limits.max_entries
                ),
            ));
        }
        let fd = Rc::new(fd.map_err(|r| self.unsafe_entry(name, r))?);
        self.parent_cache = Some((parents.iter().map(|c| c.to_vec()).collect(), fd.clone()));
        Ok(fd)
    }

    /// chown then chmod (chown clears setuid bits) through an open fd.
    fn set_owner_mode(&self, fd: &OwnedFd, meta: &Meta, name: &str) -> Result<(), OciError> {
        sys::fchown(fd.as_fd(), meta.uid, meta.gid).map_err(self.fs_err(name, "chown"))?;
        sys::fchmod(fd.as_fd(), meta.mode).map_err(self.fs_err(name, "chmod"))
    }

    /// Makes room for a new entry `last` in `dir`: unlinks an existing
    /// non-directory, or an empty directory.
    fn clear_slot(
        &mut self,
        dir: &OwnedFd,
        last: &[u8],
        key: &str,
        name: &str,
    ) -> Result<(), OciError> {
        let cname = cstring(last).map_err(|_| self.unsafe_entry(name, "NUL in name"))?;
        match sys::fstatat(dir.as_fd(), &cname) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(self.fs_err(name, "stat")(e)),
            Ok(st) => {
                let flags = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    libc::AT_REMOVEDIR
                } else {
                    0
                };
                if flags == libc::AT_REMOVEDIR {
                    self.parent_cache = None;
                }
                sys::unlinkat(dir.as_fd(), &cname, flags)
                    .map_err(self.fs_err(name, "replace existing path"))?;
                self.extracted.remove(key);
                Ok(())
            }
        }
    }

    fn whiteout(&self, dir: &OwnedFd, target: &[u8], name: &str) -> Result<(), OciError> {
        let ctarget = cstring(target).map_err(|_| self.unsafe_entry(name, "NUL in name"))?;
        // Device number 0:0 (makedev(0, 0) == 0) is the overlayfs whiteout.
        sys::mknodat(dir.as_fd(), &ctarget, libc::S_IFCHR, 0)
            .map_err(self.fs_err(name, "create whiteout device"))?;
        tracing::trace!(entry = %name, "whiteout");
        Ok(())
    }

    /// Applies deferred directory mtimes and the default root mode.
    fn finish(&mut self) -> Result<(), OciError> {
        if !self.root_seen {
            sys::fchmod(self.root.as_fd(), 0o755).map_err(self.fs_err(".", "chmod root"))?;
        }
        for (comps, mtime) in self.dir_times.iter().rev() {
            let name = comps
                .iter()
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let Some((last, parents)) = comps.split_last() else {
                sys::futimens(self.root.as_fd(), *mtime).map_err(self.fs_err(".", "set mtime"))?;
                continue;
            };
            let parents: Vec<&[u8]> = parents.iter().map(|c| c.as_slice()).collect();
            // A directory may have been replaced later in the layer: skip
            // quietly when it is gone, never follow anything.
            let Ok(dir) = walk(self.root.as_fd(), &parents, None) else {
                continue;
            };
            let Ok(cname) = cstring(last) else { continue };
            match sys::fstatat(dir.as_fd(), &cname) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    sys::utimensat_nofollow(dir.as_fd(), &cname, *mtime)
                        .map_err(self.fs_err(&name, "set directory mtime"))?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn is_zero_device(h: &tar::Header) -> bool {
    matches!(h.device_major(), Ok(Some(0)) | Ok(None))
        && matches!(h.device_minor(), Ok(Some(0)) | Ok(None))
}

fn cstring(b: &[u8]) -> Result<CString, std::ffi::NulError> {
    CString::new(b)
}

/// Opens a directory by path; `follow` decides whether a final symlink is
/// followed (yes for the caller-given source, no for our temp dirs).
fn open_dir_path(p: &Path, follow: bool) -> io::Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_bytes())?;
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    // SAFETY: `c` is a valid NUL-terminated string; the returned fd is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | nofollow | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Walks `comps` below `root` one component at a time with
/// `O_NOFOLLOW | O_DIRECTORY`, creating missing directories (0755, counted
/// in `*create`) if `create` is given.
/// Errors (as a reason string) on symlinks and non-directories.
fn walk(
    root: BorrowedFd<'_>,
    comps: &[&[u8]],
    mut create: Option<&mut u64>,
) -> Result<OwnedFd, String> {
    let mut cur = root
        .try_clone_to_owned()
        .map_err(|e| format!("cannot dup layer root: {e}"))?;
    for (i, comp) in comps.iter().enumerate() {
        let shown = || join(&comps[..=i]);
        let c = cstring(comp).map_err(|_| "NUL in path".to_string())?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let next = match sys::openat(cur.as_fd(), &c, flags, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create.is_some() => {
                sys::mkdirat(cur.as_fd(), &c, 0o755)
                    .map_err(|e| format!("cannot create parent {:?}: {e}", shown()))?;
                if let Some(created) = create.as_deref_mut() {
                    *created += 1;
                }
                let fd = sys::openat(cur.as_fd(), &c, flags, 0)
                    .map_err(|e| format!("cannot open parent {:?}: {e}", shown()))?;
                // mkdirat honours the umask: set the mode explicitly.
                sys::fchmod(fd.as_fd(), 0o755)
                    .map_err(|e| format!("cannot chmod parent {:?}: {e}", shown()))?;
                fd
            }
            Err(e) => {
                let what = match sys::fstatat(cur.as_fd(), &c) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                        "is a symlink (refusing to write through it)".to_string()
                    }
                    Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                        "is not a directory".to_string()
                    }
                    _ => format!("cannot be opened: {e}"),
                };
                return Err(format!("parent {:?} {what}", shown()));
            }
        };
        cur = next;
    }
    Ok(cur)
}

/// Thin, checked wrappers over the `*at` system calls used by the extractor.
mod sys {
    use std::ffi::CStr;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn check(rc: libc::c_int) -> io::Result<()> {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    fn ts(mtime: i64) -> [libc::timespec; 2] {
        let t = libc::timespec {
            tv_sec: mtime as libc::time_t,
            tv_nsec: 0,
        };
        [t, t]
    }

    pub(super) fn openat(
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: libc::c_int,
        mode: libc::mode_t,
    ) -> io::Result<OwnedFd> {
        // SAFETY: `dir` is a live fd, `name` is NUL-terminated; the result is checked.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by openat and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name; no memory is retained.
        check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })
    }

    pub(super) fn mknodat(
        dir: BorrowedFd<'_>,
        name: &CStr,
        mode: libc::mode_t,
        dev: libc::dev_t,
    ) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name; no memory is retained.
        check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) })
    }

    pub(super) fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        // SAFETY: both strings are NUL-terminated and `dir` is a live fd.
        check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
    }

    pub(super) fn linkat(
        odir: BorrowedFd<'_>,
        oname: &CStr,
        ndir: BorrowedFd<'_>,
        nname: &CStr,
    ) -> io::Result<()> {
        // SAFETY: live fds and NUL-terminated names. Flags 0: a symlink target
        // is linked itself, never followed.
        check(unsafe {
            libc::linkat(
                odir.as_raw_fd(),
                oname.as_ptr(),
                ndir.as_raw_fd(),
                nname.as_ptr(),
                0,
            )
        })
    }

    pub(super) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })
    }

    pub(super) fn fstatat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `st` points to writable memory of the right size; the name
        // is NUL-terminated; AT_SYMLINK_NOFOLLOW stats links themselves.
        let rc = unsafe {
            libc::fstatat(
                dir.as_raw_fd(),
                name.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        check(rc)?;
        // SAFETY: fstatat succeeded, so it initialised `st`.
        Ok(unsafe { st.assume_init() })
    }

    pub(super) fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: plain syscall on a live fd.
        check(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })
    }

    pub(super) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
        // SAFETY: plain syscall on a live fd.
        check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })
    }

    pub(super) fn fchmodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name. Only used on a FIFO just
        // created by us in our private temp dir.
        check(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, 0) })
    }

    pub(super) fn fchownat_nofollow(
        dir: BorrowedFd<'_>,
        name: &CStr,
        uid: u32,
        gid: u32,
    ) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name; does not follow symlinks.
        check(unsafe {
            libc::fchownat(
                dir.as_raw_fd(),
                name.as_ptr(),
                uid,
                gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    pub(super) fn futimens(fd: BorrowedFd<'_>, mtime: i64) -> io::Result<()> {
        let t = ts(mtime);
        // SAFETY: `t` is an array of two timespecs as futimens requires.
        check(unsafe { libc::futimens(fd.as_raw_fd(), t.as_ptr()) })
    }

    pub(super) fn utimensat_nofollow(
        dir: BorrowedFd<'_>,
        name: &CStr,
        mtime: i64,
    ) -> io::Result<()> {
        let t = ts(mtime);
        // SAFETY: valid fd, NUL-terminated name, two timespecs; no follow.
        check(unsafe {
            libc::utimensat(
                dir.as_raw_fd(),
                name.as_ptr(),
                t.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    pub(super) fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
        // SAFETY: `name` is NUL-terminated, `value` is valid for its length.
        check(unsafe {
            libc::fsetxattr(
                fd.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        })
    }

    pub(super) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: plain syscall on a live fd.
        check(unsafe { libc::syncfs(fd.as_raw_fd()) })
    }

    pub(super) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        let f = std::ffi::CString::new(from.as_os_str().as_bytes())?;
        let t = std::ffi::CString::new(to.as_os_str().as_bytes())?;
        // SAFETY: both paths are NUL-terminated; RENAME_NOREPLACE makes the
        // rename fail with EEXIST instead of replacing an existing layer.
        check(unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> Result<String, String> {
        normalize(s.as_bytes()).map(|c| join(&c))
    }

    #[test]
    fn normalize_is_lexical_and_rooted() {
        assert_eq!(norm("/etc/passwd").unwrap(), "etc/passwd");
        assert_eq!(norm("./a//b/./c/").unwrap(), "a/b/c");
        assert_eq!(norm("a/b/../c").unwrap(), "a/c");
        assert_eq!(norm("link/../x").unwrap(), "x");
        assert_eq!(norm("./").unwrap(), "");
        assert!(norm("../x").unwrap_err().contains("climbs above"));
        assert!(norm("a/../../x").is_err());
        assert!(norm("/..").is_err());
        assert!(normalize(b"a\0b").is_err());
    }

    #[test]
    fn digests_are_strictly_validated() {
        let hex = "ab".repeat(32);
        let d = Sha256Digest::parse(&format!("sha256:{hex}"), "b").unwrap();
        assert_eq!(d.layer_id(), format!("sha256-{hex}"));
        assert_eq!(d.blob_path(), format!("blobs/sha256/{hex}"));
        for bad in [
            format!("sha512:{hex}"),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha256:{}", &hex[1..]),
            "sha256:../../../../etc/passwd".to_string(),
            format!("sha256:{}/x", &hex[2..]),
        ] {
            assert!(
                matches!(
                    Sha256Digest::parse(&bad, "b"),
                    Err(OciError::InvalidImage { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(
            digest_from_blob_path(&format!("blobs/sha256/{hex}")),
            Some(d)
        );
        assert_eq!(digest_from_blob_path("abc/layer.tar"), None);
    }

    fn desc(digest: &str, platform: Option<(&str, &str)>) -> Descriptor {
        Descriptor {
            media_type: None,
            digest: digest.into(),
            size: None,
            platform: platform.map(|(os, arch)| Platform {
                os: os.into(),
                architecture: arch.into(),
            }),
        }
    }

    #[test]
    fn manifest_choice() {
        let one = choose_manifest(vec![desc("a", None)], "i").unwrap();
        assert_eq!(one.digest, "a");
        let with_attestation = choose_manifest(
            vec![
                desc("img", Some(("linux", "arm64"))),
                desc("att", Some(("unknown", "unknown"))),
            ],
            "i",
        )
        .unwrap();
        assert_eq!(with_attestation.digest, "img");
        let multi = choose_manifest(
            vec![
                desc("arm", Some(("linux", "arm64"))),
                desc("amd", Some(("linux", "amd64"))),
                desc("win", Some(("windows", "amd64"))),
            ],
            "i",
        )
        .unwrap();
        assert_eq!(multi.digest, "amd");
        assert!(choose_manifest(vec![], "i").is_err());
        assert!(choose_manifest(vec![desc("a", None), desc("b", None)], "i").is_err());
    }

    #[test]
    fn default_limits() {
        let l = ImportLimits::default();
        assert_eq!(l.max_total_bytes, 8 << 30);
        assert_eq!(l.max_file_bytes, 4 << 30);
        assert_eq!(l.max_entries, 1_000_000);
        assert!(stream_cap(&l, 0) > l.max_total_bytes);
        assert!(stream_cap(&l, u64::MAX) < l.max_total_bytes);
    }
}
