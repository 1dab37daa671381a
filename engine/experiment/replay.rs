//! `engine replay RUN EPISODE`: an episode of a self-play run played again from what its
//! `episodes.jsonl` line recorded (the level's full plan and the catalogue actions), in a
//! fresh instance with the run's environment settings (`env.json` beside it), and its verdict
//! compared with the recorded one.

use super::ExperimentError;
use crate::agents::Script;
use crate::env::{Action, Env, EnvConfig};
use crate::episode::play;
use crate::instance::Plan;
use crate::synth::Cache;
use sandbox::Runtime;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What was recorded and what the replay gave.
#[derive(Debug, Clone, Serialize)]
pub struct Replayed {
    pub file: PathBuf,
    pub index: usize,
    pub level: String,
    pub faults: String,
    pub actions: Vec<usize>,
    pub recorded_success: bool,
    pub recorded_steps: u64,
    pub recorded_failure: Option<serde_json::Value>,
    pub success: bool,
    pub steps: u32,
    pub return_: f64,
    pub infra: bool,
    /// The verdicts agree (a recorded failure of the infrastructure agrees with anything).
    pub same_verdict: bool,
}

fn bad(file: &Path, reason: impl Into<String>) -> ExperimentError {
    ExperimentError::Replay {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// The episodes file and the 0-based line `episode` names: `N` in a seed's directory
/// (`out/rarl/seed-1`), or `SEED:N` in the run's (`out/rarl`).
fn locate(run: &Path, episode: &str) -> Result<(PathBuf, usize), ExperimentError> {
    let (dir, n) = match episode.split_once(':') {
        Some((seed, n)) => (run.join(format!("seed-{seed}")), n),
        None => (run.to_path_buf(), episode),
    };
    let file = dir.join("episodes.jsonl");
    if !file.is_file() {
        return Err(bad(
            &file,
            "no episodes file here: give a seed's directory and N, or the run's directory and SEED:N",
        ));
    }
    let n = n.parse::<usize>().map_err(|_| {
        bad(
            &file,
            format!("episode `{episode}`: N must be a line number from 0"),
        )
    })?;
    Ok((file, n))
}

/// Line `index` (0-based) of `file`, read line by line (episode files grow large).
fn nth_line(file: &Path, index: usize) -> Result<String, ExperimentError> {
    use std::io::BufRead;
    let f = std::fs::File::open(file).map_err(|e| bad(file, e.to_string()))?;
    let mut lines = 0;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| bad(file, format!("line {}: {e}", i + 1)))?;
        if i == index {
            return Ok(line);
        }
        lines += 1;
    }
    Err(bad(
        file,
        format!("episode {index}: the file has {lines} lines"),
    ))
}

pub fn replay(
    rt: &Runtime,
    cache: &Cache,
    run: &Path,
    episode: &str,
) -> Result<Replayed, ExperimentError> {
    let (file, index) = locate(run, episode)?;
    let line = nth_line(&file, index)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| bad(&file, format!("line {}: {e}", index + 1)))?;
    let plan: Plan = serde_json::from_value(v["plan"].clone())
        .map_err(|e| bad(&file, format!("line {}: `plan`: {e}", index + 1)))?;
    let actions: Vec<usize> = serde_json::from_value(v["actions"].clone())
        .map_err(|e| bad(&file, format!("line {}: `actions`: {e}", index + 1)))?;
    let env_file = file.with_file_name("env.json");
    // The run's settings decide the step limit and what may be played: without them a
    // verdict would be compared under other rules.
    let bytes = std::fs::read(&env_file).map_err(|e| bad(&env_file, e.to_string()))?;
    let cfg: EnvConfig =
        serde_json::from_slice(&bytes).map_err(|e| bad(&env_file, e.to_string()))?;
    let mut env = Env::new(rt.clone(), cache.clone(), cfg)?;
    let first = env.reset(&plan)?;
    let mut agent = Script::once(
        "replay",
        actions.iter().map(|&a| Action::Index(a)).collect(),
    );
    let p = play(&mut env, &first, &mut agent, &mut |_, _| {})
        .map_err(|e| bad(&file, format!("replaying episode {index}: {e}")))?;
    if p.infra {
        return Err(bad(
            &file,
            format!("replaying episode {index}: the environment failed; no verdict to compare"),
        ));
    }
    let recorded_success = v["success"].as_bool().unwrap_or(false);
    let recorded_failure = v.get("failure").filter(|f| !f.is_null()).cloned();
    let infra_recorded = recorded_failure
        .as_ref()
        .is_some_and(|f| f["kind"] != "unusable");
    Ok(Replayed {
        file,
        index,
        level: v["key"].as_str().unwrap_or_default().to_string(),
        faults: v["faults"].as_str().unwrap_or_default().to_string(),
        actions,
        recorded_success,
        recorded_steps: v["steps"].as_u64().unwrap_or(0),
        recorded_failure,
        success: p.success,
        steps: p.steps,
        return_: p.return_,
        infra: p.infra,
        same_verdict: infra_recorded || p.success == recorded_success,
    })
}
