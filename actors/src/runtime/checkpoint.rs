//! Checkpoints on disk: every role, the schedule's state, the run's counts and what the
//! observer keeps, written into a fresh directory and swapped in whole. A run killed at any
//! moment, even with `kill -9` in the middle of a save, leaves a complete checkpoint behind:
//! the new one, or the one before it.
//!
//! A checkpoint directory `D` holds `protagonist/`, `antagonist/`, `adversary-K/`,
//! `critic/`, `curriculum/` (each role's own files), `schedule.json`
//! ([`ScheduleState`]), `progress.json` ([`Progress`]), the observer's files, and
//! `COMPLETE`, written last. It is written as `D.tmp`, then `D` becomes `D.old`, `D.tmp`
//! becomes `D`, and `D.old` is removed; [`latest`] looks at all three.

use super::coordinator::save_roles;
use super::Summary;
use crate::roles::RoleError;
use crate::schedule::{Roles, Schedule, ScheduleState};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The marker of a complete checkpoint (written last).
pub const COMPLETE: &str = "COMPLETE";
const SCHEDULE: &str = "schedule.json";
const PROGRESS: &str = "progress.json";

/// Errors of checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {}: {source}", dir.display())]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {}: {file}: {source}", dir.display())]
    Format {
        dir: PathBuf,
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint {}: not complete (no {COMPLETE} marker: a save was cut short)", dir.display())]
    Incomplete { dir: PathBuf },
    #[error("checkpoint {}: {source}", dir.display())]
    Role {
        dir: PathBuf,
        #[source]
        source: RoleError,
    },
}

/// The run's counts at a checkpoint (a resumed run goes on counting from them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub iterations: u64,
    pub updates: u64,
    pub steps: u64,
    pub episodes: u64,
    pub failed_episodes: u64,
}

impl Progress {
    pub(super) fn of(s: &Summary, updates: u64) -> Self {
        Self {
            iterations: s.iterations,
            updates,
            steps: s.steps,
            episodes: s.episodes,
            failed_episodes: s.failed_episodes,
        }
    }
}

/// A complete checkpoint read back: where it is, the schedule's state and the counts. The
/// roles' own files are under `dir` (the caller rebuilds its roles from them).
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub schedule: ScheduleState,
    pub progress: Progress,
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

fn io(dir: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        dir: dir.to_path_buf(),
        source,
    }
}

fn remove(dir: &Path) -> Result<(), CheckpointError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(dir)(e)),
        _ => Ok(()),
    }
}

fn write_json<T: Serialize>(dir: &Path, file: &'static str, v: &T) -> Result<(), CheckpointError> {
    let text = serde_json::to_vec_pretty(v).map_err(|source| CheckpointError::Format {
        dir: dir.to_path_buf(),
        file,
        source,
    })?;
    std::fs::write(dir.join(file), text).map_err(io(dir))
}

/// Write a checkpoint of `roles`, `schedule` and `progress` as `dir`; `extra` writes the
/// observer's own files into the new directory before it is marked complete.
pub fn write(
    dir: &Path,
    roles: &Roles,
    schedule: &dyn Schedule,
    progress: &Progress,
    extra: &mut dyn FnMut(&Path) -> Result<(), RoleError>,
) -> Result<(), CheckpointError> {
    let tmp = sibling(dir, "tmp");
    remove(&tmp)?;
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let role = |source| CheckpointError::Role {
        dir: dir.to_path_buf(),
        source,
    };
    save_roles(roles, &tmp).map_err(role)?;
    write_json(&tmp, SCHEDULE, &schedule.state())?;
    write_json(&tmp, PROGRESS, progress)?;
    extra(&tmp).map_err(role)?;
    std::fs::write(tmp.join(COMPLETE), b"").map_err(io(&tmp))?;
    let old = sibling(dir, "old");
    remove(&old)?;
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(io(dir))?;
    remove(&old)?;
    tracing::debug!(dir = %dir.display(), updates = progress.updates, "checkpoint written");
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(
    dir: &Path,
    file: &'static str,
) -> Result<T, CheckpointError> {
    let text = std::fs::read(dir.join(file)).map_err(io(dir))?;
    serde_json::from_slice(&text).map_err(|source| CheckpointError::Format {
        dir: dir.to_path_buf(),
        file,
        source,
    })
}

/// Read the complete checkpoint at `dir`.
pub fn read(dir: &Path) -> Result<Checkpoint, CheckpointError> {
    if !dir.join(COMPLETE).is_file() {
        return Err(CheckpointError::Incomplete {
            dir: dir.to_path_buf(),
        });
    }
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        schedule: read_json(dir, SCHEDULE)?,
        progress: read_json(dir, PROGRESS)?,
    })
}

/// The newest complete checkpoint among `dirs` (and what a save cut short left beside each:
/// its `.tmp` and `.old`), by updates and then iterations; `None` when there is none.
pub fn latest(dirs: &[PathBuf]) -> Option<Checkpoint> {
    dirs.iter()
        .flat_map(|d| [d.clone(), sibling(d, "old"), sibling(d, "tmp")])
        .filter_map(|d| read(&d).ok())
        .max_by_key(|c| (c.progress.updates, c.progress.iterations))
}

/// Remove the checkpoint `dir` and what a save cut short left beside it (`.tmp`, `.old`).
pub fn remove_all(dir: &Path) -> Result<(), CheckpointError> {
    for d in [dir.to_path_buf(), sibling(dir, "old"), sibling(dir, "tmp")] {
        remove(&d)?;
    }
    Ok(())
}

/// `cp` under its own name: a checkpoint found as `D.tmp` or `D.old` (a save cut short)
/// becomes `D` again, replacing what `D` held (incomplete, or older).
pub fn promote(cp: Checkpoint) -> Result<Checkpoint, CheckpointError> {
    let name = cp
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(stem) = name
        .strip_suffix(".tmp")
        .or_else(|| name.strip_suffix(".old"))
    else {
        return Ok(cp);
    };
    let canonical = cp.dir.with_file_name(stem);
    remove(&canonical)?;
    std::fs::rename(&cp.dir, &canonical).map_err(io(&canonical))?;
    tracing::info!(from = %cp.dir.display(), to = %canonical.display(), "a checkpoint cut short was completed");
    Ok(Checkpoint {
        dir: canonical,
        ..cp
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_keep_the_parent() {
        let d = Path::new("/x/seed-1/checkpoint");
        assert_eq!(sibling(d, "tmp"), Path::new("/x/seed-1/checkpoint.tmp"));
        assert_eq!(sibling(d, "old"), Path::new("/x/seed-1/checkpoint.old"));
    }
}
