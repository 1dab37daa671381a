//! The factory's perturbations on a task folder's built image: the faults are synthesized on
//! a view of the image's layers (as for any base), their layer is stacked on top, and what a
//! layer cannot hold (environment, read-only paths, limits, steps at every episode start)
//! goes with the image. Network fault proxies are unsupported here.

use super::{HarborError, Image};
use crate::instance::{BaseView, PerturbationChoice, Plan, Resources};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// `img` with `choices` applied (seeded by `seed`); the image itself when there are none.
pub fn perturb_image(
    rt: &sandbox::Runtime,
    store: &super::LayerStore,
    img: &Image,
    choices: &[PerturbationChoice],
    seed: u64,
) -> Result<Image, HarborError> {
    if choices.is_empty() {
        return Ok(img.clone());
    }
    let plan = Plan {
        base: img.rootfs.to_string(),
        task: None,
        perturbations: choices.to_vec(),
        seed,
        resources: Resources::default(),
        tools: Vec::new(),
    };
    let resolved = rt
        .resolve(&img.rootfs)
        .map_err(super::sbx_err(format!("rootfs {}", img.rootfs)))?;
    let mut lowers = img.layers.clone();
    lowers.extend(resolved.lowers.iter().map(PathBuf::from));
    let base = BaseView::from_dirs(lowers);
    let (layer, runtime, _, applied) =
        crate::synth::build(&plan, &base).map_err(|e| HarborError::Perturb(Box::new(e)))?;
    if !runtime.proxies.is_empty() {
        return Err(HarborError::Unsupported {
            file: PathBuf::from("--perturb"),
            what: "network fault proxies on task folders".into(),
        });
    }
    let mut h = Sha256::new();
    h.update(resolved.digest.as_bytes());
    for l in &img.layers {
        h.update(l.as_os_str().as_encoded_bytes());
    }
    h.update(serde_json::to_string(&plan).unwrap_or_default().as_bytes());
    let key = format!("p-{}", hex::encode(h.finalize()));
    let dir = store.dir().join(&key);
    if !dir.is_dir() {
        let tmp = store
            .dir()
            .join(format!(".tmp-{key}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        if let Err(e) = layer.materialize(&tmp, &base) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(HarborError::Perturb(Box::new(e.into())));
        }
        if let Err(source) = std::fs::rename(&tmp, &dir) {
            let _ = std::fs::remove_dir_all(&tmp);
            if !dir.is_dir() {
                return Err(HarborError::Io { path: dir, source });
            }
        }
    }
    let mut out = img.clone();
    out.layers.insert(0, dir);
    out.runtime = runtime;
    out.applied = applied;
    Ok(out)
}
