//! `engine run --resume`: a self-play run's identity (`run.json`: the experiment and its
//! template as they were parsed, every default filled in), checked key by key before a run
//! directory is resumed, and reading back what a run wrote.

use super::{Experiment, ExperimentError};
use actors::runtime::checkpoint;
use std::path::{Path, PathBuf};

/// The file of a run's identity in its directory.
pub const RUN_FILE: &str = "run.json";

/// What identifies a run: the parsed experiment's tables, and its template as `template`.
fn identity(exp: &Experiment) -> Result<serde_json::Value, ExperimentError> {
    let mut v = serde_json::to_value(exp).map_err(|e| ExperimentError::SelfPlay(e.to_string()))?;
    if let Some(o) = v.as_object_mut() {
        let mut t = serde_json::to_value(&exp.template)
            .map_err(|e| ExperimentError::SelfPlay(e.to_string()))?;
        // Where the template is does not matter (a project moved elsewhere), what it says does.
        if let Some(t) = t.as_object_mut() {
            t.remove("file");
        }
        o.insert("template".into(), t);
    }
    Ok(v)
}

fn resume_err(dir: &Path, reason: impl Into<String>) -> ExperimentError {
    ExperimentError::Resume {
        dir: dir.to_path_buf(),
        reason: reason.into(),
    }
}

/// Write `dir/run.json` for a new run.
pub fn record(dir: &Path, exp: &Experiment) -> Result<(), ExperimentError> {
    let file = dir.join(RUN_FILE);
    let text = serde_json::to_vec_pretty(&identity(exp)?).map_err(|e| ExperimentError::Write {
        file: file.clone(),
        source: std::io::Error::other(e),
    })?;
    super::study::write(&file, &text)
}

/// Check that `dir` holds a run of `exp` (its `run.json` matches key by key); the error
/// names the first key that differs.
pub fn check(dir: &Path, exp: &Experiment) -> Result<(), ExperimentError> {
    let file = dir.join(RUN_FILE);
    let text = match std::fs::read(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(resume_err(
                dir,
                format!("nothing to resume: no {RUN_FILE} (not the directory of a self-play run)"),
            ))
        }
        Err(e) => return Err(resume_err(dir, format!("{}: {e}", file.display()))),
    };
    let then: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| resume_err(dir, format!("{}: {e}", file.display())))?;
    let now = identity(exp)?;
    match first_difference(&then, &now, String::new()) {
        None => Ok(()),
        Some((key, a, b)) => Err(resume_err(
            dir,
            format!(
                "{} was written by another configuration: key `{key}` is {a} there, {b} now; nothing was changed",
                file.display()
            ),
        )),
    }
}

/// The first key (dotted path) where `a` and `b` differ, with both values.
pub(super) fn first_difference(
    a: &serde_json::Value,
    b: &serde_json::Value,
    at: String,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    let key = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, key(k)),
                (p, q) => Some((key(k), show(p), show(q))),
            })
        }
        _ if a == b => None,
        _ => Some((
            if at.is_empty() { "(all)".into() } else { at },
            a.to_string(),
            b.to_string(),
        )),
    }
}

fn show(v: Option<&serde_json::Value>) -> String {
    v.map_or_else(|| "absent".into(), |v| v.to_string())
}

/// Read back a JSON file the run wrote.
pub fn read_json<T: serde::de::DeserializeOwned>(file: &Path) -> Result<T, ExperimentError> {
    let dir = file.parent().unwrap_or(file);
    let text =
        std::fs::read(file).map_err(|e| resume_err(dir, format!("{}: {e}", file.display())))?;
    serde_json::from_slice(&text).map_err(|e| resume_err(dir, format!("{}: {e}", file.display())))
}

/// Remove what an earlier run left in `dir` that could be taken for a new run's: every
/// seed's checkpoints and result ([`forget_seed`]) and the report (`report.json`,
/// `report.md`: a run that fails before its first seed must not leave an old one behind).
pub fn forget_run(dir: &Path, seeds: &[u64]) -> Result<(), ExperimentError> {
    for &seed in seeds {
        forget_seed(&dir.join(format!("seed-{seed}")))?;
    }
    for f in ["report.json", "report.md"] {
        let file = dir.join(f);
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ExperimentError::Output {
                    dir: file,
                    source: e,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// Remove what a finished or checkpointed earlier run left in `seed_dir` (its checkpoints,
/// with what a save cut short left beside them, and its result), before a new run.
pub fn forget_seed(seed_dir: &Path) -> Result<(), ExperimentError> {
    let gone = |p: &Path, r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ExperimentError::Output {
            dir: p.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    };
    for d in checkpoint_dirs(seed_dir) {
        checkpoint::remove_all(&d).map_err(actors::runtime::RuntimeError::from)?;
    }
    let result = seed_dir.join("result.json");
    gone(&result, std::fs::remove_file(&result))
}

/// The checkpoint directories of a seed, where [`actors::runtime::checkpoint::latest`]
/// looks.
pub fn checkpoint_dirs(seed_dir: &Path) -> Vec<PathBuf> {
    vec![seed_dir.join("checkpoint"), seed_dir.join("final")]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_forgets_what_an_earlier_one_left() {
        let tmp = tempfile::tempdir().unwrap();
        let seed = tmp.path().join("seed-1");
        for d in ["checkpoint", "checkpoint.tmp", "final", "final.old"] {
            std::fs::create_dir_all(seed.join(d).join("protagonist")).unwrap();
        }
        std::fs::write(seed.join("result.json"), "{}").unwrap();
        std::fs::write(seed.join("metrics.jsonl"), "kept\n").unwrap();
        forget_seed(&seed).unwrap();
        let left: Vec<_> = std::fs::read_dir(&seed)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["metrics.jsonl"]);
        forget_seed(&tmp.path().join("seed-2")).unwrap();
        // The whole run: the seeds and the report go, the rest stays.
        std::fs::write(seed.join("result.json"), "{}").unwrap();
        for f in ["report.json", "report.md", "run.json"] {
            std::fs::write(tmp.path().join(f), "{}").unwrap();
        }
        forget_run(tmp.path(), &[1, 2]).unwrap();
        assert!(!seed.join("result.json").exists());
        assert!(!tmp.path().join("report.json").exists() && !tmp.path().join("report.md").exists());
        assert!(tmp.path().join("run.json").is_file());
    }

    #[test]
    fn the_first_differing_key_is_named() {
        let a = serde_json::json!({"selfplay": {"population": 2, "lambda": 0.0}, "x": [1, 2]});
        let b = serde_json::json!({"selfplay": {"population": 4, "lambda": 0.0}, "x": [1, 2]});
        let (k, x, y) = first_difference(&a, &b, String::new()).unwrap();
        assert_eq!(
            (k.as_str(), x.as_str(), y.as_str()),
            ("selfplay.population", "2", "4")
        );
        assert!(first_difference(&a, &a, String::new()).is_none());
        let c = serde_json::json!({"selfplay": {"population": 2}, "x": [1, 2]});
        let (k, x, y) = first_difference(&a, &c, String::new()).unwrap();
        assert_eq!(
            (k.as_str(), x.as_str(), y.as_str()),
            ("selfplay.lambda", "0.0", "absent")
        );
    }
}
