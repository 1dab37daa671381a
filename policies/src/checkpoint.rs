//! Checkpoints: `<prefix>.safetensors` (every variable, f32, sorted by name, with the
//! checkpoint kind in the metadata) and `<prefix>.state` (msgpack: format tag, version,
//! kind, then the model's own state: configs, optimiser moments, counters, RNG position).
//!
//! Loading validates before it writes anything: a missing, extra, mis-shaped or
//! non-finite tensor, a truncated file or a checkpoint of another kind is an error naming
//! the file and the tensor. Files are written to a temporary name and renamed into place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use candle_nn::VarMap;
use safetensors::{Dtype, SafeTensors};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Tag at the start of every state file.
pub const FORMAT: &str = "envfactory-policies-checkpoint";
/// Version of the state-file layout.
pub const VERSION: u32 = 1;

/// Errors of saving and loading checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing a file failed.
    #[error("checkpoint {file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file cannot be parsed (truncated, not a checkpoint, corrupted).
    #[error("checkpoint {file}: corrupt or truncated: {reason}")]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// Parser message.
        reason: String,
    },
    /// The checkpoint belongs to another kind of model.
    #[error("checkpoint {file}: holds a `{found}` checkpoint, expected `{expected}`")]
    KindMismatch {
        /// The file.
        file: PathBuf,
        /// Expected kind.
        expected: String,
        /// Found kind.
        found: String,
    },
    /// Unsupported state-file version.
    #[error("checkpoint {file}: version {found} is not supported (this build reads {VERSION})")]
    Version {
        /// The file.
        file: PathBuf,
        /// Found version.
        found: u32,
    },
    /// The model has a tensor the file lacks.
    #[error(
        "checkpoint {file}: tensor `{tensor}` is missing (checkpoint of another architecture?)"
    )]
    MissingTensor {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// The file has a tensor the model lacks.
    #[error("checkpoint {file}: tensor `{tensor}` is not part of this model (checkpoint of another architecture?)")]
    UnexpectedTensor {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// The state file describes a model of another size than the weights file holds.
    #[error(
        "checkpoint {file}: holds {found} parameters, the state file's architecture has {expected}"
    )]
    Architecture {
        /// The weights file.
        file: PathBuf,
        /// Parameters implied by the state file (`None`: overflow, a corrupted config).
        expected: String,
        /// Parameters in the weights file.
        found: usize,
    },
    /// A tensor's shape differs.
    #[error(
        "checkpoint {file}: tensor `{tensor}` has shape {found:?}, the model expects {expected:?}"
    )]
    ShapeMismatch {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Model's shape.
        expected: Vec<usize>,
        /// File's shape.
        found: Vec<usize>,
    },
    /// A tensor is not f32.
    #[error("checkpoint {file}: tensor `{tensor}` has dtype {found}, expected F32")]
    DType {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Found dtype.
        found: String,
    },
    /// A tensor holds NaN or infinity.
    #[error("checkpoint {file}: tensor `{tensor}` has non-finite value at flat index {index}")]
    NonFinite {
        /// The file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Flat index.
        index: usize,
    },
    /// A candle error while reading or writing variables.
    #[error("checkpoint: candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The VarMap lock was poisoned by a panic elsewhere.
    #[error("checkpoint: VarMap lock poisoned")]
    Poisoned,
}

/// `<prefix>.safetensors`.
pub fn weights_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".safetensors")
}

/// `<prefix>.state`.
pub fn state_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".state")
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn write_atomic(file: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = with_suffix(file, ".tmp");
    let io = |source| CheckpointError::Io {
        file: file.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, file).map_err(io)
}

fn read(file: &Path) -> Result<Vec<u8>, CheckpointError> {
    std::fs::read(file).map_err(|source| CheckpointError::Io {
        file: file.to_path_buf(),
        source,
    })
}

#[derive(Serialize)]
struct Envelope<'a, S> {
    format: &'a str,
    version: u32,
    kind: &'a str,
    state: &'a S,
}

#[derive(Deserialize)]
struct Header {
    format: String,
    version: u32,
    kind: String,
}

#[derive(Deserialize)]
struct Body<S> {
    state: S,
}

/// A host copy of one variable: name, shape, row-major values.
pub type HostTensor = (String, Vec<usize>, Vec<f32>);

/// Host copies of every variable, sorted by name.
pub fn snapshot(varmap: &VarMap) -> Result<Vec<HostTensor>, CheckpointError> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| CheckpointError::Poisoned)?;
    let mut out = Vec::with_capacity(data.len());
    for (name, var) in data.iter() {
        out.push((
            name.clone(),
            var.dims().to_vec(),
            var.as_tensor().flatten_all()?.to_vec1::<f32>()?,
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Write the weights of `varmap` and a state file for a model of `kind`.
pub fn save<S: Serialize>(
    prefix: &Path,
    kind: &str,
    varmap: &VarMap,
    state: &S,
) -> Result<(), CheckpointError> {
    save_weights(prefix, kind, varmap)?;
    let file = state_path(prefix);
    let bytes = rmp_serde::to_vec_named(&Envelope {
        format: FORMAT,
        version: VERSION,
        kind,
        state,
    })
    .map_err(|e| CheckpointError::Corrupt {
        file: file.clone(),
        reason: format!("cannot encode state: {e}"),
    })?;
    write_atomic(&file, &bytes)
}

/// Write `<prefix>.safetensors` only.
pub fn save_weights(prefix: &Path, kind: &str, varmap: &VarMap) -> Result<(), CheckpointError> {
    let file = weights_path(prefix);
    let snap = snapshot(varmap)?;
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = snap
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let corrupt = |e: safetensors::SafeTensorError| CheckpointError::Corrupt {
        file: file.clone(),
        reason: e.to_string(),
    };
    let mut views = Vec::with_capacity(bytes.len());
    for (n, s, b) in &bytes {
        views.push((
            n.as_str(),
            safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).map_err(corrupt)?,
        ));
    }
    let meta: HashMap<String, String> = [
        ("kind".to_string(), kind.to_string()),
        ("format".to_string(), FORMAT.to_string()),
    ]
    .into();
    let out = safetensors::tensor::serialize(views, &Some(meta)).map_err(corrupt)?;
    write_atomic(&file, &out)
}

/// Read a state file written by [`save`] for a model of `kind`.
pub fn load_state<S: DeserializeOwned>(prefix: &Path, kind: &str) -> Result<S, CheckpointError> {
    let file = state_path(prefix);
    let bytes = read(&file)?;
    let corrupt = |e: rmp_serde::decode::Error| CheckpointError::Corrupt {
        file: file.clone(),
        reason: e.to_string(),
    };
    let h: Header = rmp_serde::from_slice(&bytes).map_err(corrupt)?;
    if h.format != FORMAT {
        return Err(CheckpointError::Corrupt {
            file,
            reason: format!("format tag `{}` is not `{FORMAT}`", h.format),
        });
    }
    if h.version != VERSION {
        return Err(CheckpointError::Version {
            file,
            found: h.version,
        });
    }
    if h.kind != kind {
        return Err(CheckpointError::KindMismatch {
            file,
            expected: kind.into(),
            found: h.kind,
        });
    }
    let b: Body<S> = rmp_serde::from_slice(&bytes).map_err(corrupt)?;
    Ok(b.state)
}

/// Check, before any model is built from a state file, that `<prefix>.safetensors` holds
/// exactly `expected` f32 values: a corrupted or mismatched config can then not make the
/// loader allocate an arbitrary amount of memory.
pub fn check_numel(prefix: &Path, expected: Option<usize>) -> Result<(), CheckpointError> {
    let file = weights_path(prefix);
    let bytes = read(&file)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| CheckpointError::Corrupt {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let found: usize = st
        .tensors()
        .iter()
        .map(|(_, v)| v.shape().iter().product::<usize>())
        .sum();
    if expected != Some(found) {
        let expected =
            expected.map_or_else(|| "an overflowing number of".to_string(), |e| e.to_string());
        return Err(CheckpointError::Architecture {
            file,
            expected,
            found,
        });
    }
    Ok(())
}

/// Read `<prefix>.safetensors` and set every variable of `varmap` from it. Every tensor is
/// validated (present, no extra, shape, dtype, finite) before any variable is written.
pub fn load_weights(prefix: &Path, varmap: &VarMap) -> Result<(), CheckpointError> {
    let file = weights_path(prefix);
    let bytes = read(&file)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| CheckpointError::Corrupt {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let data = varmap
        .data()
        .lock()
        .map_err(|_| CheckpointError::Poisoned)?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let in_file: HashMap<String, safetensors::tensor::TensorView<'_>> =
        st.tensors().into_iter().collect();
    let mut extra: Vec<&String> = in_file.keys().filter(|k| !data.contains_key(*k)).collect();
    extra.sort();
    if let Some(t) = extra.first() {
        return Err(CheckpointError::UnexpectedTensor {
            file,
            tensor: (*t).clone(),
        });
    }
    let mut staged = Vec::with_capacity(names.len());
    for name in names {
        let var = &data[name];
        let view = in_file
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                file: file.clone(),
                tensor: name.clone(),
            })?;
        if view.dtype() != Dtype::F32 {
            return Err(CheckpointError::DType {
                file,
                tensor: name.clone(),
                found: format!("{:?}", view.dtype()),
            });
        }
        if view.shape() != var.dims() {
            return Err(CheckpointError::ShapeMismatch {
                file,
                tensor: name.clone(),
                expected: var.dims().to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let vals: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(index) = vals.iter().position(|x| !x.is_finite()) {
            return Err(CheckpointError::NonFinite {
                file,
                tensor: name.clone(),
                index,
            });
        }
        staged.push((
            var.clone(),
            Tensor::from_vec(vals, var.dims(), var.device())?,
        ));
    }
    for (var, t) in staged {
        var.set(&t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::{Init, VarBuilder};

    fn vm(shapes: &[(&str, usize)], fill: f64) -> VarMap {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        for (n, s) in shapes {
            vb.get_with_hints(*s, n, Init::Const(fill)).unwrap();
        }
        vm
    }

    #[test]
    fn roundtrip_and_architecture_mismatch_errors_name_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        let a = vm(&[("x.w", 3), ("y.b", 2)], 1.5);
        save(&p, "toy", &a, &42u32).unwrap();
        let b = vm(&[("x.w", 3), ("y.b", 2)], 0.0);
        load_weights(&p, &b).unwrap();
        assert_eq!(snapshot(&a).unwrap(), snapshot(&b).unwrap());
        assert_eq!(load_state::<u32>(&p, "toy").unwrap(), 42);
        let e = load_state::<u32>(&p, "other").unwrap_err().to_string();
        assert!(e.contains("`toy`") && e.contains("`other`"), "{e}");
        let c = vm(&[("x.w", 4), ("y.b", 2)], 0.0);
        let e = load_weights(&p, &c).unwrap_err().to_string();
        assert!(
            e.contains("`x.w`") && e.contains("[3]") && e.contains("[4]"),
            "{e}"
        );
        let d = vm(&[("x.w", 3), ("z", 2)], 0.0);
        let e = load_weights(&p, &d).unwrap_err().to_string();
        assert!(
            e.contains("`y.b`") && e.contains("not part of this model"),
            "{e}"
        );
        let f = vm(&[("x.w", 3), ("y.b", 2), ("z", 1)], 7.0);
        let e = load_weights(&p, &f).unwrap_err().to_string();
        assert!(e.contains("`z`") && e.contains("missing"), "{e}");
        // A failed load leaves the model untouched.
        let untouched = snapshot(&f).unwrap();
        assert!(untouched
            .iter()
            .all(|(_, _, v)| v.iter().all(|&x| x == 7.0)));
    }

    #[test]
    fn truncated_files_are_reported_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ck");
        let a = vm(&[("w", 16)], 0.25);
        save(&p, "toy", &a, &vec![1u64, 2, 3]).unwrap();
        for file in [weights_path(&p), state_path(&p)] {
            let bytes = std::fs::read(&file).unwrap();
            std::fs::write(&file, &bytes[..bytes.len() - 5]).unwrap();
        }
        let e = load_weights(&p, &a).unwrap_err().to_string();
        assert!(
            e.contains("ck.safetensors") && e.contains("truncated"),
            "{e}"
        );
        let e = load_state::<Vec<u64>>(&p, "toy").unwrap_err().to_string();
        assert!(e.contains("ck.state") && e.contains("truncated"), "{e}");
        let e = load_state::<u32>(&dir.path().join("nope"), "toy")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.state"), "{e}");
    }
}
