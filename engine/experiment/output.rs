//! The files of `engine run`, written as the run goes: the output directory is made and
//! checked before the first episode, each finished episode is appended to
//! `.episodes.jsonl.partial` as it finishes (flushed: a `kill -9` loses at most the episode
//! being written), and at the end, or when a signal stops the run, `episodes.jsonl` (in
//! seed and episode order) and `report.json` replace the partial file, each through a
//! temporary file and a rename (an earlier report is never left half-overwritten).

use super::{EpisodeRecord, Experiment, ExperimentError, Report};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The output of one run: `<out_dir>/<name>/`.
pub struct Output {
    dir: PathBuf,
    partial: PathBuf,
    episodes: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl Output {
    /// Make `<out_dir>/<name>` and open the partial episode file: an output directory that
    /// cannot be written fails here, before any episode runs.
    pub fn open(exp: &Experiment) -> Result<Self, ExperimentError> {
        let dir = exp.experiment.out_dir.join(&exp.experiment.name);
        let output = |source| ExperimentError::Output {
            dir: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(output)?;
        let partial = dir.join(".episodes.jsonl.partial");
        let file = std::fs::File::create(&partial).map_err(output)?;
        Ok(Self {
            dir,
            partial,
            episodes: Mutex::new(std::io::BufWriter::new(file)),
        })
    }

    /// Where the episodes will be once the run ends.
    pub fn episodes_file(&self) -> PathBuf {
        self.dir.join("episodes.jsonl")
    }

    /// Append one finished episode (a JSON line), flushed.
    pub fn episode(&self, rec: &EpisodeRecord) -> Result<(), ExperimentError> {
        let write = |source| ExperimentError::Write {
            file: self.partial.clone(),
            source,
        };
        let mut line = serde_json::to_vec(rec).map_err(|e| write(std::io::Error::other(e)))?;
        line.push(b'\n');
        // A worker that panicked while holding the lock left at most a partial line; the
        // file is still the one to append to.
        let mut f = self.episodes.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line).and_then(|()| f.flush()).map_err(write)
    }

    /// Write the episodes (in order) and the report, drop the partial file; the report's path.
    pub fn finish(
        self,
        records: &[EpisodeRecord],
        report: &Report,
    ) -> Result<PathBuf, ExperimentError> {
        let mut lines = Vec::new();
        for r in records {
            let line = serde_json::to_vec(r).map_err(|e| ExperimentError::Write {
                file: self.episodes_file(),
                source: std::io::Error::other(e),
            })?;
            lines.extend_from_slice(&line);
            lines.push(b'\n');
        }
        write_atomic(&self.dir, "episodes.jsonl", &lines)?;
        drop(self.episodes);
        let _ = std::fs::remove_file(&self.partial);
        let json = serde_json::to_vec_pretty(report).map_err(|e| ExperimentError::Write {
            file: self.dir.join("report.json"),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&self.dir, "report.json", &json)
    }
}

/// Write `bytes` to `dir/name` through a temporary file and a rename.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, ExperimentError> {
    let path = dir.join(name);
    let write = |source| ExperimentError::Write {
        file: path.clone(),
        source,
    };
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)?;
    Ok(path)
}
