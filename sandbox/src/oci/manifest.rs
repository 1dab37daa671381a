//! Image resolution: from `index.json` (OCI layout) or `manifest.json`
//! (`docker save`) through nested indexes and the manifest to the image config,
//! into a [`Plan`] of the layers to import, bottom first.

use serde::Deserialize;

use super::digest::Sha256Digest;
use super::source::Source;
use super::{OciError, MAX_DEPTH};

#[derive(Debug, Deserialize)]
pub(super) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub(super) media_type: Option<String>,
    pub(super) digest: String,
    #[serde(default)]
    pub(super) size: Option<u64>,
    #[serde(default)]
    pub(super) platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Platform {
    #[serde(default)]
    pub(super) os: String,
    #[serde(default)]
    pub(super) architecture: String,
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
pub(super) struct ContainerConfig {
    #[serde(rename = "Env", default)]
    pub(super) env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub(super) working_dir: Option<String>,
    #[serde(rename = "Cmd", default)]
    pub(super) cmd: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    pub(super) entrypoint: Option<Vec<String>>,
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
pub(super) struct LayerSpec {
    /// Name used in errors and metadata (digest or archive path).
    pub(super) blob: String,
    /// Member path inside the source.
    pub(super) member: String,
    pub(super) media_type: Option<String>,
    pub(super) digest: Option<Sha256Digest>,
    pub(super) size: Option<u64>,
    pub(super) diff_id: Option<Sha256Digest>,
}

pub(super) struct Plan {
    pub(super) config: ContainerConfig,
    pub(super) layers: Vec<LayerSpec>,
}

pub(super) fn plan_oci(src: &Source) -> Result<Plan, OciError> {
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
pub(super) fn choose_manifest(
    manifests: Vec<Descriptor>,
    label: &str,
) -> Result<Descriptor, OciError> {
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
pub(super) fn digest_from_blob_path(path: &str) -> Option<Sha256Digest> {
    let hex = path.strip_prefix("blobs/sha256/")?;
    Sha256Digest::parse(&format!("sha256:{hex}"), path).ok()
}

pub(super) fn plan_docker(src: &Source) -> Result<Plan, OciError> {
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
