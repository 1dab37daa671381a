//! Experiment configs (`experiments/*.toml`) and `engine run`.
//!
//! Today an experiment drives the environment factory the way training will: for every seed,
//! `episodes` real [`Env`] episodes on `workers` threads (each thread with its own `Env`), the
//! instances drawn from a template's perturbation space (domain randomisation) or the
//! unperturbed task, acted in by a built-in agent (`random` or `oracle`). Uncertified instances
//! are skipped and counted, never run; infrastructure failures are counted and masked. It
//! reports per-seed throughput, success rate, return and reset latency with a 95% Student-t
//! confidence interval over seeds, and one JSON line per episode. The learning stages
//! (protagonist, adversary, discriminator, curriculum) plug into the same loop with their issue.
//!
//! Plans: episode `e` of seed `s` uses the instance of plan seed `s * 1_000_003 + e / k`, where
//! `k` is `episodes_per_instance` (default 1: every episode a new instance); consecutive
//! episodes of one instance run on the same worker, so they reuse its sandbox through the
//! incremental reset.

use crate::certify;
use crate::env::{Action, Env, EnvConfig, EnvError, RewardConfig};
use crate::instance::Plan;
use crate::synth::Cache;
use crate::template::{Template, TemplateError};
use rand::Rng;
use sandbox::Runtime;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Plan seeds of seed `s` start at `s * SEED_STRIDE`.
pub const SEED_STRIDE: u64 = 1_000_003;

/// Errors of loading or running an experiment.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("{file}: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}:{line}:{column}: key `{key}`: {reason}")]
    Invalid {
        file: PathBuf,
        line: usize,
        column: usize,
        key: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Running(#[from] crate::running::RunningError),
    #[error("worker {worker} of seed {seed} panicked")]
    Worker { seed: u64, worker: usize },
    #[error("writing {file}: {source}")]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub experiment: Meta,
    pub environment: Environment,
    /// Reward shaping (`engine::env::RewardConfig`); the design's shaped reward by default.
    #[serde(default)]
    pub reward: RewardConfig,
    /// The loaded template, when `environment.template` is given (path resolved).
    #[serde(skip)]
    pub template: Option<Template>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub name: String,
    pub seeds: Vec<u64>,
    /// Where the report goes (relative to the working directory).
    #[serde(default = "default_out")]
    pub out_dir: PathBuf,
}

fn default_out() -> PathBuf {
    PathBuf::from("out")
}

/// Who acts in the episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Agent {
    /// Uniformly random actions of the task's catalogue (seeded per episode).
    Random,
    /// The task's oracle solution.
    Oracle,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// A template file (TOML or YAML); a relative path is resolved against the parent of the
    /// experiment file's directory (the project root for `experiments/*.toml`).
    pub template: Option<PathBuf>,
    /// A task family: the unperturbed task, or the task of a template that names none.
    pub task: Option<String>,
    /// Episodes per seed.
    pub episodes: usize,
    /// Consecutive episodes that share one instance (and its sandbox, reset incrementally).
    #[serde(default = "one")]
    pub episodes_per_instance: usize,
    /// Threads, each with its own `Env`.
    #[serde(default = "two")]
    pub workers: usize,
    #[serde(default = "random")]
    pub agent: Agent,
    /// Skip (and count) instances whose oracle certificate says they are not solvable.
    #[serde(default = "yes")]
    pub require_certified: bool,
    /// Overrides the task's step limit.
    pub max_steps: Option<u32>,
    /// Wall-clock limit of one command, e.g. "10s".
    pub step_timeout: Option<String>,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn random() -> Agent {
    Agent::Random
}
fn yes() -> bool {
    true
}

/// (line, column), 1-based, of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// Where `key` is set in `[table]` (or where the table starts when the key is absent).
fn locate(text: &str, table: &str, key: &str) -> (usize, usize) {
    let mut current = String::new();
    let mut header = None;
    for (i, raw) in text.lines().enumerate() {
        let l = raw.trim_start();
        if l.starts_with('[') {
            current = l
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            if current == table {
                header = Some((i + 1, raw.len() - l.len() + 1));
            }
            continue;
        }
        if current == table {
            if let Some(rest) = l.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return (i + 1, raw.len() - l.len() + 1);
                }
            }
        }
    }
    header.unwrap_or((1, 1))
}

impl Experiment {
    /// Load and validate; errors name the file, line, column, key and reason.
    pub fn load(file: &Path) -> Result<Self, ExperimentError> {
        let text = std::fs::read_to_string(file).map_err(|source| ExperimentError::Read {
            file: file.into(),
            source,
        })?;
        Self::parse(&text, file)
    }

    /// Parse and validate the text of `file` (which locates the template and names errors).
    pub fn parse(text: &str, file: &Path) -> Result<Self, ExperimentError> {
        let mut exp: Experiment = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
            ExperimentError::Parse {
                file: file.into(),
                line,
                column,
                message: e.message().to_string(),
            }
        })?;
        let invalid = |key: &'static str, reason: String| {
            let (table, k) = key.split_once('.').unwrap_or(("", key));
            let (line, column) = locate(text, table, k);
            ExperimentError::Invalid {
                file: file.into(),
                line,
                column,
                key,
                reason,
            }
        };
        if exp.experiment.seeds.is_empty() {
            return Err(invalid("experiment.seeds", "at least one seed".into()));
        }
        if exp.experiment.name.is_empty()
            || exp.experiment.name.contains('/')
            || exp.experiment.name.starts_with('.')
        {
            return Err(invalid(
                "experiment.name",
                "a non-empty name without `/` that does not start with `.` (it names the report's directory)".into(),
            ));
        }
        let env = &exp.environment;
        if env.episodes == 0 {
            return Err(invalid(
                "environment.episodes",
                "at least one episode".into(),
            ));
        }
        if env.episodes_per_instance == 0 {
            return Err(invalid(
                "environment.episodes_per_instance",
                "at least 1".into(),
            ));
        }
        if !(1..=64).contains(&env.workers) {
            return Err(invalid(
                "environment.workers",
                format!("between 1 and 64, not {}", env.workers),
            ));
        }
        if env.max_steps == Some(0) {
            return Err(invalid("environment.max_steps", "at least 1".into()));
        }
        if let Some(t) = &env.step_timeout {
            let d = crate::units::parse_duration(t)
                .map_err(|e| invalid("environment.step_timeout", e.to_string()))?;
            if d.is_zero() {
                return Err(invalid(
                    "environment.step_timeout",
                    "must be positive".into(),
                ));
            }
        }
        if let Some(task) = &env.task {
            if crate::tasks::get(task).is_none() {
                return Err(invalid(
                    "environment.task",
                    format!(
                        "unknown task `{task}` (known: {})",
                        crate::tasks::names().join(", ")
                    ),
                ));
            }
        }
        match (&env.template, &env.task) {
            (None, None) => {
                return Err(invalid(
                    "environment.template",
                    "give a `template` (a file) or a `task` (the unperturbed task)".into(),
                ))
            }
            (Some(t), task) => {
                let path = resolve_template(file, t);
                if !path.is_file() {
                    return Err(invalid(
                        "environment.template",
                        format!(
                            "no template file at {} (a relative path is resolved against the parent of the experiment file's directory)",
                            path.display()
                        ),
                    ));
                }
                let tpl = Template::load(&path)
                    .map_err(|e| invalid("environment.template", e.to_string()))?;
                match (&tpl.task, task) {
                    (None, None) => {
                        return Err(invalid(
                            "environment.template",
                            format!(
                                "the template {} names no task: give `environment.task`",
                                path.display()
                            ),
                        ))
                    }
                    (Some(a), Some(b)) if a != b => {
                        return Err(invalid(
                            "environment.task",
                            format!("`{b}` conflicts with the template's task `{a}`"),
                        ))
                    }
                    _ => {}
                }
                exp.template = Some(tpl);
            }
            (None, Some(_)) => {}
        }
        exp.env_config()
            .map_err(|e| invalid("reward", e.to_string()))?;
        Ok(exp)
    }

    /// The task of the episodes.
    pub fn task(&self) -> &str {
        self.environment
            .task
            .as_deref()
            .or_else(|| self.template.as_ref().and_then(|t| t.task.as_deref()))
            .unwrap_or_default()
    }

    /// The plan of episode `episode` of seed `seed`.
    pub fn plan(&self, seed: u64, episode: usize) -> Plan {
        let k = self.environment.episodes_per_instance.max(1);
        let s = seed
            .wrapping_mul(SEED_STRIDE)
            .wrapping_add((episode / k) as u64);
        match &self.template {
            Some(t) => {
                let mut p = t.sample(s);
                if p.task.is_none() {
                    p.task = Some(crate::instance::TaskRef {
                        name: self.task().to_string(),
                        seed: s,
                    });
                }
                p
            }
            None => Plan::for_task(self.task(), s, vec![]),
        }
    }

    /// The configuration of every worker's `Env`.
    pub fn env_config(&self) -> Result<EnvConfig, EnvError> {
        let e = &self.environment;
        let mut c = EnvConfig {
            reward: self.reward.clone(),
            max_steps: e.max_steps,
            require_certified: e.require_certified,
            ..EnvConfig::default()
        };
        if let Some(t) = &e.step_timeout {
            // Checked at parse; the default stays if an unchecked config slips through.
            if let Ok(d) = crate::units::parse_duration(t) {
                c.step_timeout_ms = d.as_millis().max(1) as u64;
            }
        }
        // Reject what Env would reject (bad dangerous-command patterns cannot occur today).
        for p in &c.dangerous {
            regex::Regex::new(p).map_err(|source| EnvError::BadPattern {
                pattern: p.clone(),
                source,
            })?;
        }
        Ok(c)
    }
}

/// A template path of an experiment file: absolute as given, else relative to the parent of
/// the experiment file's directory (`experiments/rarl.toml` -> the project root).
pub fn resolve_template(experiment_file: &Path, template: &Path) -> PathBuf {
    if template.is_absolute() {
        return template.to_path_buf();
    }
    let file = std::path::absolute(experiment_file).unwrap_or_else(|_| experiment_file.into());
    let root = file
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    root.join(template)
}

/// One episode, as written to `episodes.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpisodeRecord {
    pub seed: u64,
    pub worker: usize,
    pub episode: usize,
    /// The plan's seed (instance and task generation).
    pub plan_seed: u64,
    pub instance: Option<String>,
    pub perturbations: Vec<String>,
    pub success: bool,
    #[serde(rename = "return")]
    pub return_: f64,
    pub steps: u32,
    /// The environment, not the agent, failed: masked from success rate and return.
    pub infra: bool,
    /// The instance is not certified solvable: never run.
    pub skipped_uncertified: bool,
    /// The plan cannot be built (a sampled perturbation does not apply, e.g. it shadows a tool
    /// another one removed): never run.
    pub skipped_not_applicable: bool,
    /// Wall time of `Env::reset` (synthesis, certification and sandbox start when the instance
    /// is new; the incremental reset and start steps otherwise).
    pub reset_ms: Option<f64>,
    pub error: Option<String>,
}

/// Per-seed result.
#[derive(Debug, Clone, Serialize)]
pub struct SeedResult {
    pub seed: u64,
    pub episodes: usize,
    pub skipped_uncertified: usize,
    pub skipped_not_applicable: usize,
    pub infra_failures: usize,
    pub successes: usize,
    pub steps: u64,
    pub seconds: f64,
    /// Env steps over the seed's wall time (resets and certification included).
    pub steps_per_s: f64,
    /// Over the episodes that ran (not skipped) without infrastructure failure (null when
    /// none did).
    pub success_rate: f64,
    pub mean_return: f64,
    pub reset_ms_median: f64,
}

/// Mean and 95% confidence half-width (Student t) over seeds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Interval {
    pub mean: f64,
    pub ci95: f64,
}

impl Interval {
    pub fn of(v: &[f64]) -> Self {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        if v.len() < 2 {
            return Self {
                mean,
                ci95: f64::NAN,
            };
        }
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom.
        const T: [f64; 30] = [
            12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
            2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
            2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
        ];
        let t = T.get(v.len() - 2).copied().unwrap_or(1.96);
        Self {
            mean,
            ci95: t * (var / n).sqrt(),
        }
    }

    /// Over the finite values only (a seed without a valid episode has no success rate).
    pub fn of_finite(v: &[f64]) -> Self {
        let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        Self::of(&f)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    pub template: Option<PathBuf>,
    pub task: String,
    pub agent: Agent,
    pub workers: usize,
    pub episodes_per_seed: usize,
    pub episodes_per_instance: usize,
    pub require_certified: bool,
    pub reward: RewardConfig,
    pub seeds: Vec<SeedResult>,
    pub steps_per_s: Interval,
    pub success_rate: Interval,
    pub mean_return: Interval,
    pub reset_ms: Interval,
    pub episodes_file: PathBuf,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Run one episode of `plan` in `env`.
fn episode(
    env: &mut Env,
    exp: &Experiment,
    seed: u64,
    worker: usize,
    index: usize,
) -> EpisodeRecord {
    let plan = exp.plan(seed, index);
    let mut rec = EpisodeRecord {
        seed,
        worker,
        episode: index,
        plan_seed: plan.seed,
        instance: None,
        perturbations: plan.perturbations.iter().map(certify::describe).collect(),
        success: false,
        return_: 0.0,
        steps: 0,
        infra: false,
        skipped_uncertified: false,
        skipped_not_applicable: false,
        reset_ms: None,
        error: None,
    };
    let t = Instant::now();
    match env.reset(&plan) {
        Ok(_) => rec.reset_ms = Some(t.elapsed().as_secs_f64() * 1e3),
        Err(EnvError::Uncertified { id, reason }) => {
            tracing::debug!(seed, episode = index, instance = %id, %reason, "skipped: not certified");
            rec.instance = Some(id);
            rec.skipped_uncertified = true;
            rec.error = Some(reason);
            return rec;
        }
        Err(e) if e.not_applicable().is_some() => {
            if let Some((name, why)) = e.not_applicable() {
                tracing::debug!(seed, episode = index, perturbation = %name, reason = %why, "skipped: not applicable");
                rec.error = Some(format!("perturbation `{name}`: {why}"));
            }
            rec.skipped_not_applicable = true;
            return rec;
        }
        Err(e) => {
            // The agent never acted: whatever failed (sandbox, cache, synthesis, certification)
            // is the environment's, so the episode is masked.
            tracing::warn!(seed, episode = index, error = %e, infrastructure = e.is_infrastructure(), "episode reset failed");
            rec.infra = true;
            rec.error = Some(e.to_string());
            return rec;
        }
    }
    rec.instance = env.instance_id().map(str::to_string);
    let Some(setup) = env.task().cloned() else {
        rec.infra = true;
        rec.error = Some("the instance has no task".into());
        return rec;
    };
    let mut oracle = match exp.environment.agent {
        Agent::Oracle => crate::tasks::get(&setup.task)
            .map(|t| t.oracle(&setup))
            .unwrap_or_default(),
        Agent::Random => Vec::new(),
    }
    .into_iter();
    let mut rng = crate::instance::rng_for(plan.seed, &format!("experiment/agent/{index}"));
    loop {
        let action = match exp.environment.agent {
            Agent::Random if setup.actions.is_empty() => break,
            Agent::Random => Action::Index(rng.gen_range(0..setup.actions.len())),
            Agent::Oracle => match oracle.next() {
                Some(c) => Action::Command(c),
                None => break,
            },
        };
        match env.step(&action) {
            Ok(st) => {
                rec.steps += 1;
                if st.info.infra_failure {
                    rec.infra = true;
                    rec.error = st.info.error.clone();
                    break;
                }
                if st.terminated || st.truncated {
                    rec.success = st.terminated && st.info.goal_reached;
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(seed, episode = index, error = %e, "step failed");
                rec.infra = true;
                rec.error = Some(e.to_string());
                break;
            }
        }
    }
    rec.return_ = env.episode_return();
    rec
}

/// The episodes of one seed on `workers` threads.
fn run_seed(
    exp: &Experiment,
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    seed: u64,
) -> Result<Vec<EpisodeRecord>, ExperimentError> {
    let e = &exp.environment;
    let k = e.episodes_per_instance.max(1);
    let groups = e.episodes.div_ceil(k);
    let next = AtomicUsize::new(0);
    let results: Vec<Result<Vec<EpisodeRecord>, ExperimentError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..e.workers)
            .map(|w| {
                let next = &next;
                s.spawn(move || -> Result<Vec<EpisodeRecord>, ExperimentError> {
                    let mut env = Env::new(rt.clone(), cache.clone(), cfg.clone())?;
                    let mut out = Vec::new();
                    loop {
                        let g = next.fetch_add(1, Ordering::Relaxed);
                        if g >= groups {
                            break;
                        }
                        for i in g * k..((g + 1) * k).min(e.episodes) {
                            out.push(episode(&mut env, exp, seed, w, i));
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(w, h)| {
                h.join()
                    .unwrap_or(Err(ExperimentError::Worker { seed, worker: w }))
            })
            .collect()
    });
    let mut all = Vec::with_capacity(e.episodes);
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|r| r.episode);
    Ok(all)
}

/// Per-seed figures of its episodes.
pub fn summarize(seed: u64, records: &[EpisodeRecord], seconds: f64) -> SeedResult {
    let valid: Vec<&EpisodeRecord> = records
        .iter()
        .filter(|r| !r.infra && !r.skipped_uncertified && !r.skipped_not_applicable)
        .collect();
    let steps: u64 = records.iter().map(|r| u64::from(r.steps)).sum();
    let successes = valid.iter().filter(|r| r.success).count();
    let n = valid.len() as f64;
    SeedResult {
        seed,
        episodes: records.len(),
        skipped_uncertified: records.iter().filter(|r| r.skipped_uncertified).count(),
        skipped_not_applicable: records.iter().filter(|r| r.skipped_not_applicable).count(),
        infra_failures: records.iter().filter(|r| r.infra).count(),
        successes,
        steps,
        seconds,
        steps_per_s: if seconds > 0.0 {
            steps as f64 / seconds
        } else {
            f64::NAN
        },
        success_rate: successes as f64 / n,
        mean_return: valid.iter().map(|r| r.return_).sum::<f64>() / n,
        reset_ms_median: median(records.iter().filter_map(|r| r.reset_ms).collect()),
    }
}

/// Write `bytes` to `dir/name` through a temporary file and a rename: an earlier file is never
/// left half-overwritten.
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

/// Run the experiment; write `<out_dir>/<name>/report.json` and `episodes.jsonl`.
pub fn run(
    exp: &Experiment,
    rt: &Runtime,
    cache: &Cache,
) -> Result<(Report, PathBuf), ExperimentError> {
    let cfg = exp.env_config()?;
    if let Some(t) = &exp.template {
        // The template's tools must exist in its base before any instance is built.
        let spec = crate::running::base_spec(&t.base.rootfs)?;
        let rootfs = rt
            .resolve(&spec)
            .map_err(crate::running::RunningError::from)?;
        t.check_tools(&crate::instance::BaseView::new(&rootfs))?;
    }
    let mut seeds = Vec::new();
    let mut records = Vec::new();
    for &seed in &exp.experiment.seeds {
        let started = Instant::now();
        let r = run_seed(exp, rt, cache, &cfg, seed)?;
        let res = summarize(seed, &r, started.elapsed().as_secs_f64());
        tracing::info!(
            seed,
            steps = res.steps,
            steps_per_s = res.steps_per_s,
            success_rate = res.success_rate,
            skipped = res.skipped_uncertified,
            infra = res.infra_failures,
            "seed done"
        );
        seeds.push(res);
        records.extend(r);
    }
    let dir = exp.experiment.out_dir.join(&exp.experiment.name);
    std::fs::create_dir_all(&dir).map_err(|source| ExperimentError::Write {
        file: dir.clone(),
        source,
    })?;
    let mut lines = Vec::new();
    for r in &records {
        let line = serde_json::to_vec(r).map_err(|e| ExperimentError::Write {
            file: dir.join("episodes.jsonl"),
            source: std::io::Error::other(e),
        })?;
        lines.extend_from_slice(&line);
        lines.push(b'\n');
    }
    let episodes_file = write_atomic(&dir, "episodes.jsonl", &lines)?;
    let col = |f: fn(&SeedResult) -> f64| seeds.iter().map(f).collect::<Vec<_>>();
    let report = Report {
        name: exp.experiment.name.clone(),
        template: exp.template.as_ref().map(|t| t.file.clone()),
        task: exp.task().to_string(),
        agent: exp.environment.agent,
        workers: exp.environment.workers,
        episodes_per_seed: exp.environment.episodes,
        episodes_per_instance: exp.environment.episodes_per_instance,
        require_certified: exp.environment.require_certified,
        reward: exp.reward.clone(),
        steps_per_s: Interval::of_finite(&col(|s| s.steps_per_s)),
        success_rate: Interval::of_finite(&col(|s| s.success_rate)),
        mean_return: Interval::of_finite(&col(|s| s.mean_return)),
        reset_ms: Interval::of_finite(&col(|s| s.reset_ms_median)),
        seeds,
        episodes_file,
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| ExperimentError::Write {
        file: dir.join("report.json"),
        source: std::io::Error::other(e),
    })?;
    let path = write_atomic(&dir, "report.json", &json)?;
    Ok((report, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
[experiment]
name = "t"
seeds = [1, 2]

[environment]
task = "archive-logs"
episodes = 2
"#;

    fn err(text: &str) -> String {
        Experiment::parse(text, Path::new("exp.toml"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_valid_config_parses_with_defaults() {
        let e = Experiment::parse(OK, Path::new("x.toml")).unwrap();
        assert_eq!(e.environment.workers, 2);
        assert_eq!(e.environment.agent, Agent::Random);
        assert!(e.environment.require_certified);
        assert_eq!(e.environment.episodes_per_instance, 1);
        assert_eq!(e.reward, RewardConfig::default());
        assert_eq!(e.task(), "archive-logs");
        let c = e.env_config().unwrap();
        assert!(c.require_certified);
        assert_eq!(c.max_steps, None);
    }

    #[test]
    fn options_reach_the_env_config() {
        let text = OK.replace(
            "episodes = 2",
            "episodes = 2\nmax_steps = 7\nstep_timeout = \"3s\"\nagent = \"oracle\"\nrequire_certified = false\n[reward]\nmode = \"sparse\"\ngoal = 5.0",
        );
        let e = Experiment::parse(&text, Path::new("x.toml")).unwrap();
        let c = e.env_config().unwrap();
        assert_eq!(c.max_steps, Some(7));
        assert_eq!(c.step_timeout_ms, 3000);
        assert!(!c.require_certified);
        assert_eq!(c.reward.mode, crate::env::RewardMode::Sparse);
        assert_eq!(c.reward.goal, 5.0);
        assert_eq!(e.environment.agent, Agent::Oracle);
    }

    #[test]
    fn errors_name_file_line_key_and_reason() {
        let e = err(&OK.replace("episodes = 2", "episodes = 2\ncuont = 3"));
        assert!(e.starts_with("exp.toml:9:1: unknown field `cuont`"), "{e}");
        let e = err(&OK.replace("seeds = [1, 2]", "seeds = []"));
        assert_eq!(e, "exp.toml:4:1: key `experiment.seeds`: at least one seed");
        let e = err(&OK.replace("episodes = 2", "episodes = 0"));
        assert_eq!(
            e,
            "exp.toml:8:1: key `environment.episodes`: at least one episode"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\nworkers = 65"));
        assert_eq!(
            e,
            "exp.toml:9:1: key `environment.workers`: between 1 and 64, not 65"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\n  workers = 0"));
        assert!(
            e.starts_with("exp.toml:9:3: key `environment.workers`"),
            "{e}"
        );
        let e = err(&OK.replace("archive-logs", "archive-log"));
        assert!(
            e.starts_with("exp.toml:7:1: key `environment.task`: unknown task `archive-log`")
                && e.contains("archive-logs"),
            "{e}"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\nagent = \"smart\""));
        assert!(
            e.starts_with("exp.toml:9:9: unknown variant `smart`") && e.contains("oracle"),
            "{e}"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\nstep_timeout = \"soon\""));
        assert!(
            e.starts_with("exp.toml:9:1: key `environment.step_timeout`"),
            "{e}"
        );
        let e = err(&format!("{OK}[reward]\nmode = \"dense\"\n"));
        assert!(
            e.starts_with("exp.toml:10:8: unknown variant `dense`"),
            "{e}"
        );
        let e = err(&format!("{OK}[reward]\nbonus = 1.0\n"));
        assert!(e.starts_with("exp.toml:10:1: unknown field `bonus`"), "{e}");
        let e = err(&OK.replace("task = \"archive-logs\"\n", ""));
        assert!(
            e.starts_with("exp.toml:6:1: key `environment.template`: give a `template`"),
            "{e}"
        );
        let e = err(&OK.replace("[environment]", "[environment]\nepisodes_per_instance = 0"));
        assert!(
            e.starts_with("exp.toml:7:1: key `environment.episodes_per_instance`"),
            "{e}"
        );
    }

    const TEMPLATE: &str = r#"
[template]
name = "tpl"
task = "archive-logs"
[base_environment]
rootfs = "host"
[[perturbation_space]]
name = "noisy-env"
probability = 0.5
[perturbation_space.params]
count = [1, 3]
"#;

    /// `root/experiments/exp.toml` and `root/templates/t.toml`.
    fn project(template: &str, env: &str) -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("experiments")).unwrap();
        std::fs::create_dir_all(root.path().join("templates")).unwrap();
        std::fs::write(root.path().join("templates/t.toml"), template).unwrap();
        let file = root.path().join("experiments/exp.toml");
        std::fs::write(
            &file,
            format!("[experiment]\nname = \"t\"\nseeds = [3]\n[environment]\n{env}episodes = 4\n"),
        )
        .unwrap();
        (root, file)
    }

    #[test]
    fn templates_resolve_against_the_experiment_directory_parent() {
        let (root, file) = project(TEMPLATE, "template = \"templates/t.toml\"\n");
        let e = Experiment::load(&file).unwrap();
        let t = e.template.as_ref().unwrap();
        assert_eq!(t.file, root.path().join("templates/t.toml"));
        assert_eq!(e.task(), "archive-logs");
        // Plans are the template's samples at seed * 1_000_003 + episode.
        for ep in 0..4 {
            let p = e.plan(3, ep);
            assert_eq!(p, t.sample(3 * SEED_STRIDE + ep as u64));
            assert_eq!(p.task.as_ref().unwrap().name, "archive-logs");
        }
        assert_ne!(e.plan(3, 0).seed, e.plan(3, 1).seed);
        // The same relative path from the experiment's own directory is not found.
        let (_r, file) = project(TEMPLATE, "template = \"t.toml\"\n");
        let err = Experiment::load(&file).unwrap_err().to_string();
        assert!(
            err.contains("exp.toml:5:1: key `environment.template`: no template file at")
                && err.contains("t.toml"),
            "{err}"
        );
    }

    #[test]
    fn template_errors_name_both_files_and_tasks_must_agree() {
        let bad = TEMPLATE.replace("count = [1, 3]", "cuont = [1, 3]");
        let (_r, file) = project(&bad, "template = \"templates/t.toml\"\n");
        let err = Experiment::load(&file).unwrap_err().to_string();
        assert!(
            err.contains("exp.toml:5:1: key `environment.template`: ")
                && err.contains("t.toml:11:1:")
                && err.contains("cuont"),
            "{err}"
        );
        let (_r, file) = project(
            TEMPLATE,
            "template = \"templates/t.toml\"\ntask = \"free-disk\"\n",
        );
        let err = Experiment::load(&file).unwrap_err().to_string();
        assert!(
            err.contains("key `environment.task`: `free-disk` conflicts"),
            "{err}"
        );
        // A template without a task needs `environment.task`.
        let no_task = TEMPLATE.replace("task = \"archive-logs\"\n", "");
        let (_r, file) = project(&no_task, "template = \"templates/t.toml\"\n");
        let err = Experiment::load(&file).unwrap_err().to_string();
        assert!(err.contains("names no task"), "{err}");
        let (_r, file) = project(
            &no_task,
            "template = \"templates/t.toml\"\ntask = \"free-disk\"\n",
        );
        let e = Experiment::load(&file).unwrap();
        assert_eq!(e.plan(1, 0).task.unwrap().name, "free-disk");
    }

    #[test]
    fn episodes_per_instance_groups_plans() {
        let text = OK.replace("episodes = 2", "episodes = 5\nepisodes_per_instance = 2");
        let e = Experiment::parse(&text, Path::new("x.toml")).unwrap();
        assert_eq!(e.plan(1, 0), e.plan(1, 1));
        assert_ne!(e.plan(1, 1), e.plan(1, 2));
        assert_eq!(e.plan(1, 4).seed, SEED_STRIDE + 2);
        assert_eq!(
            e.plan(2, 0),
            Plan::for_task("archive-logs", 2 * SEED_STRIDE, vec![])
        );
    }

    fn rec(success: bool, ret: f64, steps: u32, infra: bool, skipped: bool) -> EpisodeRecord {
        EpisodeRecord {
            seed: 1,
            worker: 0,
            episode: 0,
            plan_seed: 1,
            instance: None,
            perturbations: vec![],
            success,
            return_: ret,
            steps,
            infra,
            skipped_uncertified: skipped,
            skipped_not_applicable: false,
            reset_ms: (!skipped).then_some(2.0),
            error: None,
        }
    }

    #[test]
    fn infra_failures_and_skips_are_masked() {
        let r = summarize(
            1,
            &[
                rec(true, 30.0, 3, false, false),
                rec(false, -10.0, 5, false, false),
                rec(false, 0.0, 2, true, false),
                rec(false, 0.0, 0, false, true),
                EpisodeRecord {
                    skipped_not_applicable: true,
                    reset_ms: None,
                    ..rec(false, 0.0, 0, false, false)
                },
            ],
            2.0,
        );
        assert_eq!(r.episodes, 5);
        assert_eq!(r.skipped_not_applicable, 1);
        assert_eq!(r.infra_failures, 1);
        assert_eq!(r.skipped_uncertified, 1);
        assert_eq!(r.steps, 10);
        assert_eq!(r.steps_per_s, 5.0);
        assert_eq!(r.success_rate, 0.5);
        assert_eq!(r.mean_return, 10.0);
        assert_eq!(r.reset_ms_median, 2.0);
        let none = summarize(1, &[rec(false, 0.0, 0, false, true)], 1.0);
        assert!(none.success_rate.is_nan());
        let i = Interval::of_finite(&[0.5, f64::NAN, 0.7]);
        assert!((i.mean - 0.6).abs() < 1e-12);
    }

    #[test]
    fn the_shipped_experiment_loads_from_the_project_root() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/rarl.toml");
        let e = Experiment::load(&file).unwrap();
        assert_eq!(e.experiment.name, "rarl");
        assert_eq!(e.task(), "archive-logs");
        assert!(e.template.is_some());
        assert!(e.environment.require_certified);
        assert_eq!(e.reward, RewardConfig::default());
    }

    #[test]
    fn intervals_use_student_t() {
        let i = Interval::of(&[1.0, 2.0, 3.0]);
        assert_eq!(i.mean, 2.0);
        assert!((i.ci95 - 4.303 * (1.0f64 / 3.0).sqrt()).abs() < 1e-9);
        assert!(Interval::of(&[5.0]).ci95.is_nan());
    }
}
