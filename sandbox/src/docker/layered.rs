//! An image plus overlay layer directories as a new Docker image, for the Docker backend
//! (a synthesized instance is a layer above its base): the base is exported (`docker save`),
//! each layer directory becomes a layer tar (overlay whiteouts and opaque directories turned
//! back into `.wh.` entries), the config gets their diff ids, and the archive is loaded
//! (`POST /images/load`) under a tag derived from the base's id and the layers' names (which
//! are content hashes): built once, found by its tag afterwards.

use super::{Client, DockerError};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The repository of the images built here.
pub const REPOSITORY: &str = "envfactory-layered";

/// The tag of `base_id` with `layers` (topmost first) stacked on it.
pub(crate) fn tag_of(base_id: &str, layers: &[PathBuf]) -> String {
    let mut h = Sha256::new();
    h.update(base_id.as_bytes());
    for l in layers {
        h.update(b"\n");
        h.update(l.file_name().map(|n| n.as_encoded_bytes()).unwrap_or(b""));
    }
    format!("{REPOSITORY}:{}", &hex::encode(h.finalize())[..32])
}

/// The image of `base_id` with `layers` (topmost first) on top, built if missing; its id.
pub(crate) fn ensure(
    client: &Client,
    base_id: &str,
    layers: &[PathBuf],
    work: &Path,
) -> Result<String, DockerError> {
    let tag = tag_of(base_id, layers);
    if let Ok(id) = super::image::image_id(client, &tag) {
        return Ok(id);
    }
    let started = std::time::Instant::now();
    std::fs::create_dir_all(work).map_err(|source| DockerError::Io {
        what: "creating",
        path: work.to_path_buf(),
        source,
    })?;
    let dir = tempfile_dir(work)?;
    let result = build(client, base_id, layers, &tag, &dir.0);
    drop(dir);
    result?;
    let id = super::image::image_id(client, &tag)?;
    tracing::info!(
        tag,
        layers = layers.len(),
        ms = started.elapsed().as_millis() as u64,
        "layered docker image built"
    );
    Ok(id)
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir(work: &Path) -> Result<TempDir, DockerError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let p = work.join(format!(".layered-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&p).map_err(|source| DockerError::Io {
        what: "creating",
        path: p.clone(),
        source,
    })?;
    Ok(TempDir(p))
}

fn io_at<'a>(what: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> DockerError + 'a {
    move |source| DockerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn build(
    client: &Client,
    base_id: &str,
    layers: &[PathBuf],
    tag: &str,
    dir: &Path,
) -> Result<(), DockerError> {
    // The base as `docker save` writes it.
    let saved = dir.join("base.tar");
    {
        let mut f = std::fs::File::create(&saved).map_err(io_at("creating", &saved))?;
        client.block_on(async {
            let mut s = client.docker().export_image(base_id);
            while let Some(chunk) = s.next().await {
                let chunk =
                    chunk.map_err(|e| DockerError::api(format!("export of {base_id}"), e))?;
                f.write_all(&chunk).map_err(io_at("writing", &saved))?;
            }
            Ok::<_, DockerError>(())
        })?;
    }
    let out_path = dir.join("layered.tar");
    let out = std::fs::File::create(&out_path).map_err(io_at("creating", &out_path))?;
    let mut out = tar::Builder::new(out);
    // Every entry of the base but its manifest (rewritten below); its config is kept aside.
    let mut manifest: Option<Vec<u8>> = None;
    let mut jsons: std::collections::HashMap<String, Vec<u8>> = Default::default();
    {
        let f = std::fs::File::open(&saved).map_err(io_at("reading", &saved))?;
        let mut ar = tar::Archive::new(f);
        for e in ar.entries().map_err(io_at("reading", &saved))? {
            let mut e = e.map_err(io_at("reading", &saved))?;
            let name = e
                .path()
                .map_err(io_at("reading", &saved))?
                .to_string_lossy()
                .into_owned();
            if name == "manifest.json" || name == "repositories" {
                let mut b = Vec::new();
                e.read_to_end(&mut b).map_err(io_at("reading", &saved))?;
                if name == "manifest.json" {
                    manifest = Some(b);
                }
                continue;
            }
            if !name.contains('/') && name.ends_with(".json") {
                let mut b = Vec::new();
                e.read_to_end(&mut b).map_err(io_at("reading", &saved))?;
                let mut h = e.header().clone();
                out.append_data(&mut h, &name, b.as_slice())
                    .map_err(io_at("writing", &out_path))?;
                jsons.insert(name, b);
                continue;
            }
            let mut h = e.header().clone();
            out.append_data(&mut h, &name, &mut e)
                .map_err(io_at("writing", &out_path))?;
        }
    }
    let bad = |reason: String| DockerError::Container {
        id: base_id.to_string(),
        reason,
    };
    let manifest = manifest.ok_or_else(|| bad("its export has no manifest.json".into()))?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&manifest).map_err(|e| bad(format!("its manifest.json: {e}")))?;
    let entry = manifest
        .get(0)
        .ok_or_else(|| bad("an empty manifest.json".into()))?;
    let config_name = entry["Config"]
        .as_str()
        .ok_or_else(|| bad("no Config in manifest.json".into()))?;
    let mut layer_names: Vec<serde_json::Value> =
        entry["Layers"].as_array().cloned().unwrap_or_default();
    let config = jsons
        .get(config_name)
        .ok_or_else(|| bad(format!("no {config_name} in its export")))?;
    let mut config: serde_json::Value =
        serde_json::from_slice(config).map_err(|e| bad(format!("its config: {e}")))?;
    // The layers, bottom first.
    for layer in layers.iter().rev() {
        let tar_path = dir.join("layer.tar");
        let diff = layer_tar(layer, &tar_path)?;
        let name = format!("{diff}/layer.tar");
        let mut f = std::fs::File::open(&tar_path).map_err(io_at("reading", &tar_path))?;
        let len = f
            .seek(std::io::SeekFrom::End(0))
            .map_err(io_at("reading", &tar_path))?;
        f.rewind().map_err(io_at("reading", &tar_path))?;
        let mut h = tar::Header::new_gnu();
        h.set_size(len);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        out.append_data(&mut h, &name, f)
            .map_err(io_at("writing", &out_path))?;
        layer_names.push(name.into());
        config["rootfs"]["diff_ids"]
            .as_array_mut()
            .ok_or_else(|| bad("no rootfs.diff_ids in its config".into()))?
            .push(format!("sha256:{diff}").into());
        if let Some(history) = config["history"].as_array_mut() {
            history.push(serde_json::json!({
                "created_by": format!("envfactory layer {}", layer.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
            }));
        }
        let _ = std::fs::remove_file(&tar_path);
    }
    let config = serde_json::to_vec(&config).map_err(|e| bad(e.to_string()))?;
    let config_name = format!("{}.json", hex::encode(Sha256::digest(&config)));
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": layer_names,
    }]))
    .map_err(|e| bad(e.to_string()))?;
    for (name, data) in [
        (config_name.as_str(), &config),
        ("manifest.json", &manifest),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        out.append_data(&mut h, name, data.as_slice())
            .map_err(io_at("writing", &out_path))?;
    }
    out.into_inner().map_err(io_at("writing", &out_path))?;
    let _ = std::fs::remove_file(&saved);
    load(client, &out_path)
}

/// `POST /images/load` of an archive, streamed from its file.
fn load(client: &Client, path: &Path) -> Result<(), DockerError> {
    let f = std::fs::File::open(path).map_err(io_at("reading", path))?;
    let chunks = futures_util::stream::unfold(f, |mut f| async move {
        let mut buf = vec![0u8; 1 << 20];
        match f.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes_of(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    client.block_on(async {
        let mut s = client.docker().import_image_stream(
            bollard::query_parameters::ImportImageOptions {
                quiet: true,
                ..Default::default()
            },
            chunks,
            None,
        );
        while let Some(msg) = s.next().await {
            let msg = msg.map_err(|e| DockerError::api("image load", e))?;
            if let Some(err) = msg.error_detail.and_then(|d| d.message) {
                return Err(DockerError::api("image load", err));
            }
        }
        Ok(())
    })
}

fn bytes_of(v: Vec<u8>) -> bytes::Bytes {
    v.into()
}

/// Write the layer directory `dir` as a layer tar at `out`; its diff id (hex sha256).
fn layer_tar(dir: &Path, out: &Path) -> Result<String, DockerError> {
    struct Hashing<W> {
        w: W,
        h: Sha256,
    }
    impl<W: Write> Write for Hashing<W> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let n = self.w.write(b)?;
            self.h.update(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.w.flush()
        }
    }
    let f = std::fs::File::create(out).map_err(io_at("creating", out))?;
    let mut b = tar::Builder::new(Hashing {
        w: f,
        h: Sha256::new(),
    });
    b.follow_symlinks(false);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&here)
            .map_err(io_at("reading", &here))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let name = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(&path).map_err(io_at("reading", &path))?;
            let ft = m.file_type();
            if ft.is_char_device() && m.rdev() == 0 {
                // An overlay whiteout: the name is deleted in this layer.
                let wh = rel.join(format!(".wh.{}", e.file_name().to_string_lossy()));
                let mut h = tar::Header::new_gnu();
                h.set_size(0);
                h.set_mode(0o600);
                b.append_data(&mut h, &wh, std::io::empty())
                    .map_err(io_at("writing", out))?;
                continue;
            }
            if ft.is_char_device() || ft.is_block_device() || ft.is_socket() {
                continue; // never in an instance layer (the builder makes none)
            }
            b.append_path_with_name(&path, &name)
                .map_err(io_at("writing", out))?;
            if ft.is_dir() {
                let opaque = crate::sys::get_xattr(&path, "trusted.overlay.opaque")
                    .ok()
                    .flatten()
                    .is_some_and(|v| v == b"y");
                if opaque {
                    let mut h = tar::Header::new_gnu();
                    h.set_size(0);
                    h.set_mode(0o600);
                    b.append_data(&mut h, name.join(".wh..wh..opq"), std::io::empty())
                        .map_err(io_at("writing", out))?;
                }
                stack.push(name);
            }
        }
    }
    let hashing = b.into_inner().map_err(io_at("writing", out))?;
    Ok(hex::encode(hashing.h.finalize()))
}
