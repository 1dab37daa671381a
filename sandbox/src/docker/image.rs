//! `docker:IMAGE` as a root filesystem of the native backend: the image is exported from the
//! daemon (`GET /images/{name}/get`, a `docker save` archive) into a private temporary file,
//! imported by [`crate::oci::import`] into the content-addressed layer store (every hostile
//! entry refused there), and the result is remembered under the image's id, so the next
//! resolution of the same image costs one `inspect`.

use super::{Client, DockerError};
use crate::oci::{import, ImportLimits, ImportedImage};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An image resolved into the layer store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLayers {
    /// The image's id (`sha256:<hex>`, the digest of its config): the cache key.
    pub id: String,
    /// Layer ids in the store, bottom first.
    pub layers: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub cmd: Vec<String>,
}

/// The image's id as the daemon knows it (`sha256:<hex>`).
pub(crate) fn image_id(client: &Client, image: &str) -> Result<String, DockerError> {
    let info = client
        .block_on(client.docker().inspect_image(image))
        .map_err(|e| DockerError::NoImage {
            image: image.to_string(),
            reason: e.to_string(),
        })?;
    info.id.ok_or_else(|| DockerError::NoImage {
        image: image.to_string(),
        reason: "the daemon reported no id".into(),
    })
}

/// Resolve `image` (a name, tag or id known to the daemon) into layers of `store`, exporting
/// it only when `cache_dir` has no record of its id whose layers are all still in the store.
pub fn import_image(
    client: &Client,
    image: &str,
    store: &Path,
    cache_dir: &Path,
    limits: &ImportLimits,
) -> Result<ImageLayers, DockerError> {
    let id = image_id(client, image)?;
    let hex = id.strip_prefix("sha256:").unwrap_or(&id);
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(DockerError::NoImage {
            image: image.to_string(),
            reason: format!("unexpected image id `{}`", crate::text_pos::cut(&id)),
        });
    }
    let record = cache_dir.join(format!("{hex}.json"));
    if let Some(hit) = read_record(&record, &id, store) {
        tracing::debug!(image, id = %id, "docker image already in the layer store");
        return Ok(hit);
    }
    std::fs::create_dir_all(cache_dir).map_err(|source| DockerError::Io {
        what: "creating",
        path: cache_dir.to_path_buf(),
        source,
    })?;
    let started = std::time::Instant::now();
    let archive = tempfile_in(cache_dir, hex)?;
    let result = export_to(client, &id, &archive.0).and_then(|()| {
        import(&archive.0, store, limits).map_err(|source| DockerError::Import {
            image: image.to_string(),
            source,
        })
    });
    drop(archive);
    let ImportedImage {
        layers,
        env,
        working_dir,
        cmd,
    } = result?;
    let out = ImageLayers {
        id,
        layers,
        env,
        working_dir,
        cmd,
    };
    write_record(&record, &out)?;
    tracing::info!(image, id = %out.id, layers = out.layers.len(), ms = started.elapsed().as_millis() as u64, "docker image imported");
    Ok(out)
}

/// A cache record, trusted only when it names this id and every layer it lists is finished.
fn read_record(path: &Path, id: &str, store: &Path) -> Option<ImageLayers> {
    let text = std::fs::read_to_string(path).ok()?;
    let rec: ImageLayers = serde_json::from_str(&text).ok()?;
    let complete = rec.id == id
        && !rec.layers.is_empty()
        && rec
            .layers
            .iter()
            .all(|l| !l.contains('/') && !l.starts_with('.') && store.join(l).is_dir());
    complete.then_some(rec)
}

/// Written to a temporary name, then renamed: a reader sees a whole record or none.
fn write_record(path: &Path, rec: &ImageLayers) -> Result<(), DockerError> {
    let io = |source| DockerError::Io {
        what: "writing",
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    let text = serde_json::to_vec(rec).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// A file that is removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn tempfile_in(dir: &Path, hex: &str) -> Result<TempFile, DockerError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let short = &hex[..hex.len().min(16)];
    Ok(TempFile(dir.join(format!(
        ".export-{short}-{}-{nanos}.tar",
        std::process::id()
    ))))
}

/// Stream `docker save` of the image into `path` (created exclusively, mode 0600).
fn export_to(client: &Client, id: &str, path: &Path) -> Result<(), DockerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| DockerError::Io {
        what: "writing the export",
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    client.block_on(async {
        let mut stream = client.docker().export_image(id);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| DockerError::api(format!("export of {id}"), e))?;
            file.write_all(&chunk).map_err(io)?;
        }
        Ok::<_, DockerError>(())
    })?;
    file.sync_all().map_err(io)
}
