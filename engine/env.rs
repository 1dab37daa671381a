//! The environment API: `reset(plan) -> observation`, `step(action) -> (observation, reward,
//! terminated, truncated, info)`.
//!
//! A plan names the instance (base, perturbations, seed) and the task with its seed; the
//! instance is synthesized once (content-addressed cache) and runs in one sandbox that every
//! later episode of the same instance reuses through the sandbox's incremental reset. An action
//! is an index into the task's action catalogue or a free-text shell command. After every step
//! the task's verifier judges the state through trusted reads; the observation is structured
//! text (cwd, command, output, status, a listing of the cwd, disk usage, the instruction) plus
//! hashed features for small policies.
//!
//! Failures are told apart: an agent's command that hangs, floods its output or wrecks the
//! sandbox's files ends its step with a clear observation (`timeout`, truncated output, ...);
//! a failure of the sandbox itself ends the episode with `info.infra_failure` set and no reward,
//! so trainers can mask it, and the next `reset` starts from a fresh sandbox.

use crate::certify::Certificates;
use crate::features::{FeatureLayout, HistoryEntry};
use crate::instance::Plan;
use crate::instance::TaskSetup;
use crate::running::{RunningError, RunningInstance};
use crate::synth::Cache;
use crate::tasks::Verdict;
use sandbox::{Runtime, Termination};
use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("step called before reset")]
    NotReset,
    #[error("the episode is over (terminated or truncated): call reset")]
    EpisodeOver,
    #[error(
        "action index {index} is out of range: the task `{task}` has {count} catalogue actions"
    )]
    BadAction {
        index: usize,
        count: usize,
        task: String,
    },
    #[error("the plan has no task: an environment episode needs one")]
    NoTask,
    #[error("instance {id} is not certified solvable: {reason}")]
    Uncertified { id: String, reason: String },
    #[error("reward `{field}`: {reason}")]
    BadReward { field: &'static str, reason: String },
    #[error("dangerous-command pattern {pattern:?}: {source}")]
    BadPattern {
        pattern: String,
        source: regex::Error,
    },
    #[error(transparent)]
    Running(#[from] RunningError),
    #[error("verifier: {0}")]
    Probe(#[from] crate::probe::ProbeError),
    #[error("observation encoder: {0}")]
    Encoder(#[from] policies::encoder::EncoderError),
}

impl EnvError {
    /// True when the environment (sandbox, cache, verifier reads), not the agent, failed.
    pub fn is_infrastructure(&self) -> bool {
        match self {
            Self::Running(e) => e.is_infrastructure(),
            Self::Probe(e) => e.is_infrastructure(),
            _ => false,
        }
    }

    /// The level cannot be played (not certified, or a perturbation that cannot apply): it is
    /// skipped and counted, neither the agent's failure nor the infrastructure's.
    pub fn skips_level(&self) -> bool {
        matches!(self, Self::Uncertified { .. }) || self.not_applicable().is_some()
    }

    /// The perturbation of the plan that cannot take hold in its instance, and why: the plan
    /// is skipped, neither the agent's failure nor the infrastructure's.
    pub fn not_applicable(&self) -> Option<(&str, String)> {
        match self {
            Self::Running(e) => e.not_applicable(),
            _ => None,
        }
    }
}

/// How rewards are computed. Three modes:
///
/// - `potential` (the default): `goal` once when the goal is reached, `step` per step (times
///   one plus the action's declared extra cost), and the potential-based shaping
///   `gamma * Phi(s') - Phi(s)` with `Phi = potential * progress` (the verifier's checklist
///   fraction; 0 once terminated). Shaping of this form leaves the optimal policies unchanged
///   (Ng, Harada and Russell, 1999): no cycle of actions earns anything from it.
/// - `sparse`: `goal` and `step` only.
/// - `shaped`: the seed's demonstration shaping (`RewardConfig::shaped_demo`: +10 for a
///   command that exits 0, +50 for the goal, -1 per step, -20 for a failed command, -5 for an
///   irrelevant one). It pays more for repeating `pwd` than for solving: `engine task check
///   --rewards` shows it, and training refuses it.
///
/// In every mode `error` is added for a failed or refused command and `irrelevant` for a
/// command that mentions nothing of the task (both 0 by default); `success` (a reward for any
/// command that exits 0) is only allowed in `shaped` mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    pub mode: RewardMode,
    /// The goal reached (once per episode).
    pub goal: f64,
    /// Every step (a cost: at most 0).
    pub step: f64,
    /// A command that fails (non-zero exit, timeout) or is refused as dangerous (at most 0).
    pub error: f64,
    /// A command that mentions nothing the task is about (at most 0).
    pub irrelevant: f64,
    /// A command that exits 0 (`shaped` mode only).
    pub success: f64,
    /// Scale of the potential (`potential` mode).
    pub potential: f64,
    /// Discount of the potential-based shaping; must be the learner's discount.
    pub gamma: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardMode {
    Potential,
    Sparse,
    Shaped,
}

impl RewardMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Potential => "potential",
            Self::Sparse => "sparse",
            Self::Shaped => "shaped",
        }
    }
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            mode: RewardMode::Potential,
            goal: 1.0,
            step: -0.01,
            error: 0.0,
            irrelevant: 0.0,
            success: 0.0,
            potential: 1.0,
            gamma: 0.99,
        }
    }
}

impl RewardConfig {
    /// The sparse reward: `goal` once, `step` per step.
    pub fn sparse() -> Self {
        Self {
            mode: RewardMode::Sparse,
            ..Self::default()
        }
    }

    /// The seed's shaping, kept as a demonstration of a gameable reward (training refuses it).
    pub fn shaped_demo() -> Self {
        Self {
            mode: RewardMode::Shaped,
            goal: 50.0,
            step: -1.0,
            error: -20.0,
            irrelevant: -5.0,
            success: 10.0,
            potential: 0.0,
            gamma: 0.99,
        }
    }

    /// Check the values: finite, costs not positive, `success` only in `shaped` mode, `gamma`
    /// in (0, 1]. The error names the field.
    pub fn validate(&self) -> Result<(), EnvError> {
        let bad = |field: &'static str, reason: String| EnvError::BadReward { field, reason };
        for (field, v) in [
            ("goal", self.goal),
            ("step", self.step),
            ("error", self.error),
            ("irrelevant", self.irrelevant),
            ("success", self.success),
            ("potential", self.potential),
            ("gamma", self.gamma),
        ] {
            if !v.is_finite() {
                return Err(bad(field, format!("{v} is not a finite number")));
            }
        }
        for (field, v) in [
            ("step", self.step),
            ("error", self.error),
            ("irrelevant", self.irrelevant),
        ] {
            if v > 0.0 {
                return Err(bad(
                    field,
                    format!("{v} is a bonus; it must be a cost (at most 0)"),
                ));
            }
        }
        if self.goal <= 0.0 {
            return Err(bad("goal", format!("{} must be above 0", self.goal)));
        }
        if self.mode != RewardMode::Shaped && self.success != 0.0 {
            return Err(bad(
                "success",
                format!(
                    "a reward for every command that exits 0 is the gameable `shaped` mode's only; {} mode takes 0",
                    self.mode.name()
                ),
            ));
        }
        if self.potential < 0.0 {
            return Err(bad(
                "potential",
                format!("{} must be at least 0", self.potential),
            ));
        }
        if !(self.gamma > 0.0 && self.gamma <= 1.0) {
            return Err(bad("gamma", format!("{} must be in (0, 1]", self.gamma)));
        }
        Ok(())
    }

    /// The potential of a state of progress `p` (0 once terminated).
    fn phi(&self, progress: f64, terminated: bool) -> f64 {
        if self.mode != RewardMode::Potential || terminated {
            0.0
        } else {
            self.potential * progress
        }
    }
}

/// How many entries of the cwd an observation lists.
const LISTING_ENTRIES: u32 = 64;

/// Commands refused by default (regular expressions): they destroy the sandbox's purpose or
/// would be catastrophic on a real machine, so an agent learns not to issue them.
pub const DEFAULT_DANGEROUS: &[&str] = &[
    // rm -rf / (and /*, --no-preserve-root)
    r"\brm\s+(-[A-Za-z-]+\s+)*(--no-preserve-root\s+)?(-[A-Za-z-]+\s+)*/\*?(\s|;|&|$)",
    // the classic fork bomb and renamed variants: f(){ f|f& };f
    r"(\w+|:)\s*\(\)\s*\{\s*(\w+|:)\s*\|\s*(\w+|:)\s*&\s*\}\s*;",
    // kernel tunables and the magic SysRq trigger
    r">\s*/proc/(sys/|sysrq-trigger)",
    // writing or formatting block devices
    r"\bmkfs(\.\w+)?\b",
    r"\bdd\b[^|;&]*\bof=/dev/(sd|vd|hd|xvd|nvme|mmcblk)",
    // taking the machine down
    r"\b(shutdown|reboot|halt|poweroff)\b",
    // signalling every process
    r"\bkill\s+(-\w+\s+)*-1\b",
    // recursive permission or ownership changes of the root
    r"\bch(mod|own)\s+(-\w+\s+)*-R\s+\S+\s+/(\s|$)",
];

/// Configuration of an [`Env`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    pub reward: RewardConfig,
    /// Overrides the task's step limit.
    pub max_steps: Option<u32>,
    /// Wall-clock limit of one command; its process tree is killed when it passes.
    pub step_timeout_ms: u64,
    /// Bytes of each output stream kept from a command (the rest is counted and dropped).
    pub output_cap: u64,
    /// Bytes of each stream shown in the observation text.
    pub observation_bytes: usize,
    /// Regular expressions of refused commands.
    pub dangerous: Vec<String>,
    /// Refuse instances whose certificate says the oracle cannot solve them (certifying on
    /// first use).
    pub require_certified: bool,
    /// Also refuse certified instances that the task's catalogue oracle cannot solve (what a
    /// policy acting through the catalogue could never learn).
    pub require_catalogue: bool,
    /// Width of the hashed text features (split over the text blocks, [`crate::features`]).
    pub feature_dim: usize,
    /// Past actions in the features (the last `history`).
    pub history: usize,
    /// Slots of a past action's one-hot (catalogue indices past the last slot, and free text,
    /// take the last).
    pub history_slots: usize,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            reward: RewardConfig::default(),
            max_steps: None,
            step_timeout_ms: crate::running::AGENT_STEP_TIMEOUT_MS,
            output_cap: crate::running::AGENT_OUTPUT_CAP,
            observation_bytes: crate::running::OBSERVATION_BYTES,
            dangerous: DEFAULT_DANGEROUS.iter().map(|s| s.to_string()).collect(),
            require_certified: false,
            require_catalogue: false,
            feature_dim: 512,
            history: 4,
            history_slots: 32,
        }
    }
}

/// An action: a catalogue index or a free-text shell command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Action {
    Index(usize),
    Command(String),
}

/// Disk usage of the writable layer (what `df /` shows inside).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Disk {
    pub used_bytes: u64,
    pub size_bytes: u64,
}

/// What the agent sees.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub instruction: String,
    pub cwd: String,
    pub last_command: Option<String>,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Entries of the cwd (directories end with `/`).
    pub listing: Vec<String>,
    pub disk: Disk,
    pub step: u32,
    pub max_steps: u32,
    /// The structured text of all the above (what a language agent reads).
    pub text: String,
    /// Hashed features of the text plus numeric features (what a small policy reads).
    #[serde(skip)]
    pub features: Vec<f32>,
}

/// Everything else a trainer needs to know about a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Info {
    /// The sandbox failed, not the agent: mask this episode from learning.
    pub infra_failure: bool,
    pub error: Option<String>,
    /// The command ran past the step timeout (its process tree was killed).
    pub timeout: bool,
    /// The command was refused as dangerous (pattern given).
    pub dangerous: Option<String>,
    pub irrelevant: bool,
    pub goal_reached: bool,
    pub success: bool,
    /// The verifier's progress: the fraction of `checks` passed.
    pub progress: f64,
    /// The verifier's checklist in this state.
    pub checks: Vec<crate::tasks::Check>,
    pub duration_us: u64,
    pub instance: String,
}

/// One step's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub observation: Observation,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    pub info: Info,
}

/// One agent's environment.
pub struct Env {
    rt: Runtime,
    /// Where episodes run when not on `rt` itself (the Docker backend); synthesis and
    /// certification always use `rt`.
    backend: Option<std::sync::Arc<dyn sandbox::DynBackend>>,
    cache: Cache,
    cfg: EnvConfig,
    dangerous: Vec<(String, regex::Regex)>,
    /// The dangerous pattern (its index in `dangerous`) each catalogue action of the current
    /// instance matches, found when a reset starts the instance: an action's text and the
    /// patterns never change while the instance does not.
    action_danger: Vec<Option<usize>>,
    layout: FeatureLayout,
    certificates: Certificates,
    running: Option<RunningInstance>,
    /// The current instance's task, shared with whoever plays it ([`Env::task_shared`]); kept
    /// across the episodes of the same instance.
    setup: Option<std::sync::Arc<TaskSetup>>,
    step: u32,
    max_steps: u32,
    goal_reached: bool,
    done: bool,
    episode_return: f64,
    /// The verifier's progress in the current state (the potential's argument).
    progress: f64,
    history: Vec<HistoryEntry>,
    last: Observation,
}

impl Env {
    /// The step limit of the episodes from the next reset on (`None`: each task's own); the
    /// rest of the configuration stays.
    pub fn set_max_steps(&mut self, max_steps: Option<u32>) {
        self.cfg.max_steps = max_steps;
    }

    pub fn new(rt: Runtime, cache: Cache, cfg: EnvConfig) -> Result<Self, EnvError> {
        let dangerous = cfg
            .dangerous
            .iter()
            .map(|p| {
                regex::Regex::new(p)
                    .map(|r| (p.clone(), r))
                    .map_err(|source| EnvError::BadPattern {
                        pattern: p.clone(),
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        cfg.reward.validate()?;
        let layout = FeatureLayout::new(cfg.feature_dim, cfg.history, cfg.history_slots)?;
        let certificates = Certificates::new(cache.clone());
        Ok(Self {
            rt,
            backend: None,
            cache,
            cfg,
            dangerous,
            action_danger: Vec::new(),
            layout,
            certificates,
            running: None,
            setup: None,
            step: 0,
            max_steps: 0,
            goal_reached: false,
            done: true,
            episode_return: 0.0,
            progress: 0.0,
            history: Vec::new(),
            last: Observation::default(),
        })
    }

    /// Run episodes on `backend` (e.g. `sandbox::docker::DockerBackend`) instead of the native
    /// runtime; instances are still synthesized, and certified, natively.
    pub fn with_backend(mut self, backend: std::sync::Arc<dyn sandbox::DynBackend>) -> Self {
        self.running = None;
        self.backend = Some(backend);
        self
    }

    /// The name of the backend episodes run on (`native`, `docker`).
    pub fn backend_name(&self) -> &'static str {
        self.backend
            .as_deref()
            .map_or("native", sandbox::DynBackend::name)
    }

    /// Width of [`Observation::features`].
    pub fn obs_dim(&self) -> usize {
        self.layout.dim()
    }

    /// The verifier's progress in the current state.
    pub fn progress(&self) -> f64 {
        self.progress
    }

    pub fn config(&self) -> &EnvConfig {
        &self.cfg
    }

    /// The running instance, if any.
    pub fn running(&mut self) -> Option<&mut RunningInstance> {
        self.running.as_mut()
    }

    /// The task of the current episode.
    pub fn task(&self) -> Option<&TaskSetup> {
        self.setup.as_deref()
    }

    /// The task of the current episode, shared (no copy): for a caller that holds it while it
    /// steps the Env.
    pub fn task_shared(&self) -> Option<std::sync::Arc<TaskSetup>> {
        self.setup.clone()
    }

    /// Whether a reset of `plan` would reuse the running sandbox (an incremental reset):
    /// it runs that plan's instance and is alive.
    pub fn runs(&self, plan: &Plan) -> bool {
        self.running
            .as_ref()
            .is_some_and(|l| l.sandbox().is_alive() && l.instance.plan == *plan)
    }

    /// The id of the current instance.
    pub fn instance_id(&self) -> Option<&str> {
        self.running.as_ref().map(|l| l.instance.id.as_str())
    }

    pub fn episode_return(&self) -> f64 {
        self.episode_return
    }

    pub fn steps(&self) -> u32 {
        self.step
    }

    /// Start an episode of a plan: synthesize (or find) its instance, reuse its sandbox with an
    /// incremental reset when it is the current one, else create it.
    pub fn reset(&mut self, plan: &Plan) -> Result<Observation, EnvError> {
        if plan.task.is_none() {
            return Err(EnvError::NoTask);
        }
        self.done = true;
        let t0 = Instant::now();
        let reuse = self.runs(plan);
        let mut restarted = false;
        if reuse {
            if let Some(running) = self.running.as_mut() {
                match running.restart() {
                    Ok(()) => restarted = true,
                    Err(e) => {
                        tracing::warn!(error = %e, "episode reset failed; starting a fresh sandbox");
                    }
                }
            }
        }
        if !restarted {
            self.running = None; // the old sandbox goes first (its limits, its memory)
            let held = crate::running::synthesize(&self.rt, &self.cache, plan)?;
            if self.cfg.require_certified || self.cfg.require_catalogue {
                let cert = self.certificates.get_or_check(&self.rt, &held.instance)?;
                if !cert.solvable {
                    return Err(EnvError::Uncertified {
                        id: held.instance.id.clone(),
                        reason: cert.reason,
                    });
                }
                let catalogue = cert.catalogue.as_ref();
                if self.cfg.require_catalogue && !catalogue.is_some_and(|c| c.solvable) {
                    return Err(EnvError::Uncertified {
                        id: held.instance.id.clone(),
                        reason: format!(
                            "not solvable through the catalogue: {}",
                            catalogue.map_or("not checked", |c| c.reason.as_str())
                        ),
                    });
                }
            }
            let backend: &dyn sandbox::DynBackend = match &self.backend {
                Some(b) => b.as_ref(),
                None => &self.rt,
            };
            self.running = Some(RunningInstance::start_on(backend, held)?);
        }
        let started_us = t0.elapsed().as_micros() as u64;
        let Some(running) = self.running.as_mut() else {
            return Err(EnvError::NotReset);
        };
        // The agent starts in the task's directory (`restart` and `start_on` set it). The
        // same instance has the same task: copied only when the instance is new.
        let setup = match self.setup.take() {
            Some(setup) if restarted => setup,
            _ => {
                let setup = running.instance.task.clone().ok_or(EnvError::NoTask)?;
                self.action_danger = setup
                    .actions
                    .iter()
                    .map(|a| danger_index(&self.dangerous, a))
                    .collect();
                std::sync::Arc::new(setup)
            }
        };
        self.max_steps = self.cfg.max_steps.unwrap_or(setup.max_steps).max(1);
        self.setup = Some(setup);
        self.step = 0;
        self.goal_reached = false;
        self.done = false;
        self.episode_return = 0.0;
        self.history.clear();
        // The potential of the start state (a trivially solved start gives progress 1).
        let t_verify = Instant::now();
        self.progress = match self.verify() {
            Ok(v) => v.progress,
            Err(e) if e.is_infrastructure() => {
                self.running = None;
                return Err(e);
            }
            Err(_) => 0.0,
        };
        let verify_us = t_verify.elapsed().as_micros() as u64;
        let t_observe = Instant::now();
        let mut obs = Observation::default();
        self.observe(&mut obs)?;
        tracing::debug!(
            incremental = restarted,
            started_us,
            verify_us,
            observe_us = t_observe.elapsed().as_micros() as u64,
            total_us = t0.elapsed().as_micros() as u64,
            "env reset"
        );
        self.last = obs.clone();
        Ok(obs)
    }

    /// Judge the current state: the task's verifier, confirmed by the system's own entry
    /// points once it passes ([`RunningInstance::judge`]).
    pub fn verify(&mut self) -> Result<Verdict, EnvError> {
        let (Some(running), Some(_)) = (self.running.as_mut(), self.setup.as_ref()) else {
            return Err(EnvError::NotReset);
        };
        Ok(running.judge()?)
    }

    /// Resolve an action to its command text.
    pub fn command_of(&self, action: &Action) -> Result<String, EnvError> {
        let setup = self.setup.as_ref().ok_or(EnvError::NotReset)?;
        match action {
            Action::Command(c) => Ok(c.clone()),
            Action::Index(i) => setup
                .actions
                .get(*i)
                .cloned()
                .ok_or_else(|| EnvError::BadAction {
                    index: *i,
                    count: setup.actions.len(),
                    task: setup.task.clone(),
                }),
        }
    }

    /// Take one action.
    pub fn step(&mut self, action: &Action) -> Result<Step, EnvError> {
        if self.running.is_none() || self.setup.is_none() {
            return Err(EnvError::NotReset);
        }
        if self.done {
            return Err(EnvError::EpisodeOver);
        }
        let cmd = self.command_of(action)?;
        self.step += 1;
        let t0 = Instant::now();
        let mut info = Info {
            instance: self.instance_id().unwrap_or_default().to_string(),
            ..Info::default()
        };
        let mut obs = Observation {
            last_command: Some(cmd.clone()),
            ..Observation::default()
        };
        let r = self.cfg.reward.clone();
        let cost = match action {
            Action::Index(i) => 1.0 + self.setup.as_ref().map_or(0.0, |t| t.action_cost(*i)),
            Action::Command(_) => 1.0,
        };
        let mut reward = r.step * cost;
        let mut command_ok = false;
        if cmd.trim().is_empty() {
            obs.stderr = "empty command".into();
            obs.exit_code = Some(2);
            info.error = Some("empty command".into());
        } else if cmd.contains('\0') {
            // No shell command holds a NUL; refused before the engine wraps it.
            obs.stderr = "refused: a NUL byte in the command".into();
            obs.exit_code = Some(2);
            info.error = Some(obs.stderr.clone());
        } else if let Some(p) = self.danger_of(action, &cmd) {
            obs.stderr = format!("refused: dangerous command (matches `{p}`)");
            obs.exit_code = Some(126);
            info.dangerous = Some(p);
        } else {
            match self.run(&cmd, &mut obs) {
                Ok(result) => {
                    command_ok = result == Termination::Exited(0);
                    info.timeout = result == Termination::TimedOut;
                }
                Err(e) if e.is_infrastructure() => return Ok(self.infra_step(e, obs, info, t0)),
                Err(e) => {
                    // The command could not start (its working directory is gone, a NUL byte
                    // in it, ...): the agent's failed step, not the environment's.
                    obs.exit_code = Some(127);
                    obs.stderr = format!("the command could not start: {e}");
                    if let Some(running) = self.running.as_mut() {
                        let cwd = running.cwd.clone();
                        if running.sandbox_mut().stat(&cwd).is_err() {
                            obs.stderr.push_str(&format!(
                                "\n[{} is gone; the working directory is / again]",
                                running.cwd
                            ));
                            running.cwd = "/".into();
                        }
                    }
                    info.error = Some(e.to_string());
                }
            }
        }
        info.irrelevant = !self.relevant(&cmd);
        let t_verify = Instant::now();
        // The command's exchange, with the reads that came with it (`looks.rs`).
        let exec_us = t0.elapsed().as_micros() as u64;
        let verdict = match self.verify() {
            Ok(v) => v,
            Err(e) if e.is_infrastructure() => return Ok(self.infra_step(e, obs, info, t0)),
            // A read the agent's state refused (not the sandbox failing): not solved.
            Err(e) => Verdict::failed(
                "state readable",
                format!("the verifier could not read the state: {e}"),
            ),
        };
        info.success = verdict.success;
        info.progress = verdict.progress;
        info.checks = verdict.checks.clone();
        let newly = verdict.success && !self.goal_reached;
        self.goal_reached |= verdict.success;
        info.goal_reached = self.goal_reached;
        let terminated = verdict.success;
        reward += if command_ok { r.success } else { r.error };
        if info.irrelevant {
            reward += r.irrelevant;
        }
        if newly {
            reward += r.goal;
        }
        reward += r.gamma * r.phi(verdict.progress, terminated) - r.phi(self.progress, false);
        self.progress = verdict.progress;
        self.history.push(HistoryEntry {
            slot: self.layout.slot(match action {
                Action::Index(i) => Some(*i),
                Action::Command(_) => None,
            }),
            ok: command_ok,
        });
        let truncated = !terminated && self.step >= self.max_steps;
        self.done = terminated || truncated;
        let verify_us = t_verify.elapsed().as_micros() as u64;
        let t_observe = Instant::now();
        if let Err(e) = self.observe(&mut obs) {
            return Ok(self.infra_step(e, obs, info, t0));
        }
        info.duration_us = t0.elapsed().as_micros() as u64;
        tracing::debug!(
            step = self.step,
            action = ?action,
            exec_us,
            verify_us,
            observe_us = t_observe.elapsed().as_micros() as u64,
            total_us = info.duration_us,
            "env step"
        );
        self.episode_return += reward;
        self.last = obs.clone();
        Ok(Step {
            observation: obs,
            reward,
            terminated,
            truncated,
            info,
        })
    }

    /// End the episode on an infrastructure failure: no reward, flagged, the sandbox dropped so
    /// the next reset starts clean.
    fn infra_step(
        &mut self,
        e: EnvError,
        mut obs: Observation,
        mut info: Info,
        t0: Instant,
    ) -> Step {
        tracing::warn!(error = %e, instance = %info.instance, "infrastructure failure during a step");
        info.infra_failure = true;
        info.error = Some(e.to_string());
        info.duration_us = t0.elapsed().as_micros() as u64;
        self.done = true;
        self.running = None;
        obs.stderr = format!("environment failure (not the agent's): {e}");
        obs.step = self.step;
        obs.max_steps = self.max_steps;
        obs.instruction = self
            .setup
            .as_ref()
            .map(|s| s.instruction.clone())
            .unwrap_or_default();
        obs.text = render(&obs);
        Step {
            observation: obs,
            reward: 0.0,
            terminated: false,
            truncated: true,
            info,
        }
    }

    /// The dangerous pattern `cmd` (the text of `action`) matches; a catalogue action's as
    /// found when its instance started ([`Env::action_danger`]).
    fn danger_of(&self, action: &Action, cmd: &str) -> Option<String> {
        let known = match *action {
            Action::Index(i) => self.action_danger.get(i).copied(),
            Action::Command(_) => None,
        };
        known
            .unwrap_or_else(|| danger_index(&self.dangerous, cmd))
            .map(|k| self.dangerous[k].0.clone())
    }

    fn relevant(&self, cmd: &str) -> bool {
        let Some(setup) = &self.setup else {
            return true;
        };
        if setup.actions.iter().any(|a| a == cmd) || setup.keywords.is_empty() {
            return true;
        }
        let lower = cmd.to_lowercase();
        let words: Vec<&str> = lower
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        // Whole words or word prefixes (`log` matches `logs`), never inside a word (`ls` is
        // not in `false`).
        setup.keywords.iter().any(|k| {
            let k = k.to_lowercase();
            words.iter().any(|w| w.starts_with(k.as_str()))
                || (!k.chars().all(char::is_alphanumeric) && lower.contains(k.as_str()))
        })
    }

    /// Run an agent command in the current cwd; the cwd it ends in becomes the next one.
    fn run(&mut self, cmd: &str, obs: &mut Observation) -> Result<Termination, EnvError> {
        let Some(running) = self.running.as_mut() else {
            return Err(EnvError::NotReset);
        };
        let res = running.run_agent(cmd, self.cfg.step_timeout_ms, self.cfg.output_cap)?;
        let shown =
            crate::running::Shown::of(&res, self.cfg.step_timeout_ms, self.cfg.observation_bytes);
        obs.exit_code = Some(res.exit_code());
        obs.stdout = shown.stdout;
        obs.stderr = shown.stderr;
        obs.stdout_truncated = shown.stdout_truncated;
        obs.stderr_truncated = shown.stderr_truncated;
        Ok(res.termination)
    }

    /// Fill the rest of an observation from trusted reads.
    fn observe(&mut self, obs: &mut Observation) -> Result<(), EnvError> {
        let (Some(running), Some(setup)) = (self.running.as_mut(), self.setup.as_ref()) else {
            return Err(EnvError::NotReset);
        };
        obs.instruction = setup.instruction.clone();
        obs.cwd = running.cwd.clone();
        obs.step = self.step;
        obs.max_steps = self.max_steps;
        // The listing and the disk usage in one request ([`sandbox::protocol::Overview`]),
        // usually answered along with the command (`looks.rs`).
        let cwd = running.cwd.clone();
        let seen = running.overview(&cwd, LISTING_ENTRIES)?;
        // A cwd the agent removed (or made unreadable): an empty listing says so.
        obs.listing = listing(seen.entries.unwrap_or_default());
        obs.disk = Disk {
            used_bytes: seen.upper_bytes,
            size_bytes: running
                .instance
                .runtime
                .disk_bytes
                .unwrap_or(running.instance.plan.resources.disk_bytes),
        };
        obs.text = render(obs);
        let numeric = [
            f32::from(u8::from(obs.exit_code == Some(0))),
            f32::from(u8::from(obs.exit_code.is_some_and(|c| c != 0))),
            f32::from(u8::from(obs.exit_code == Some(124))),
            f32::from(u8::from(obs.stdout_truncated || obs.stderr_truncated)),
            obs.step as f32 / obs.max_steps.max(1) as f32,
            obs.disk.used_bytes as f32 / obs.disk.size_bytes.max(1) as f32,
            (1.0 + obs.stdout.len() as f32).ln() / 10.0,
            (1.0 + obs.listing.len() as f32).ln() / 5.0,
        ];
        let listing = obs.listing.join(" ");
        let keep = self.history.len().saturating_sub(self.layout.history_len());
        self.history.drain(..keep);
        obs.features = self.layout.encode(
            [
                &obs.instruction,
                obs.last_command.as_deref().unwrap_or(""),
                &obs.stdout,
                &obs.stderr,
                &listing,
            ],
            &numeric,
            &self.history,
        )?;
        Ok(())
    }

    /// The last observation.
    pub fn last_observation(&self) -> &Observation {
        &self.last
    }
}

/// The first of `patterns` that `cmd` matches, by its index.
fn danger_index(patterns: &[(String, regex::Regex)], cmd: &str) -> Option<usize> {
    patterns.iter().position(|(_, r)| r.is_match(cmd))
}

/// The names an observation lists, directories marked with a trailing `/`.
pub fn listing(entries: Vec<sandbox::protocol::ShownEntry>) -> Vec<String> {
    entries
        .into_iter()
        .map(|e| {
            if e.is_dir {
                format!("{}/", e.name)
            } else {
                e.name
            }
        })
        .collect()
}

/// The structured text an agent reads.
pub fn render(o: &Observation) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(512 + o.stdout.len() + o.stderr.len());
    let _ = writeln!(s, "task: {}", o.instruction);
    let _ = writeln!(s, "step: {}/{}", o.step, o.max_steps);
    let _ = writeln!(s, "cwd: {}", o.cwd);
    if let Some(c) = &o.last_command {
        let _ = writeln!(s, "$ {}", crate::text::escape_control(c));
        if let Some(code) = o.exit_code {
            let _ = writeln!(s, "exit status: {code}");
        }
        let _ = writeln!(
            s,
            "stdout{}:\n{}",
            if o.stdout_truncated {
                " (truncated)"
            } else {
                ""
            },
            o.stdout.trim_end()
        );
        let _ = writeln!(
            s,
            "stderr{}:\n{}",
            if o.stderr_truncated {
                " (truncated)"
            } else {
                ""
            },
            o.stderr.trim_end()
        );
    }
    let _ = writeln!(s, "ls {}: {}", o.cwd, o.listing.join("  "));
    let _ = writeln!(
        s,
        "disk /: {} of {} used ({:.0}%)",
        crate::units::format_size(o.disk.used_bytes),
        crate::units::format_size(o.disk.size_bytes),
        100.0 * o.disk.used_bytes as f64 / o.disk.size_bytes.max(1) as f64
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns() -> Vec<regex::Regex> {
        DEFAULT_DANGEROUS
            .iter()
            .map(|p| regex::Regex::new(p).unwrap())
            .collect()
    }

    fn dangerous(cmd: &str) -> bool {
        patterns().iter().any(|r| r.is_match(cmd))
    }

    #[test]
    fn dangerous_commands_are_recognised() {
        for c in [
            "rm -rf /",
            "rm -rf /*",
            "rm -fr / ",
            "rm -r -f --no-preserve-root /",
            "sudo rm -rf / && echo",
            ":(){ :|:& };:",
            "bomb(){ bomb|bomb& };bomb",
            "echo 1 > /proc/sys/kernel/panic",
            "echo b >/proc/sysrq-trigger",
            "mkfs.ext4 /dev/vda",
            "dd if=/dev/zero of=/dev/sda bs=1M",
            "shutdown -h now",
            "kill -9 -1",
            "chmod -R 777 /",
        ] {
            assert!(dangerous(c), "{c} should be refused");
        }
    }

    #[test]
    fn ordinary_commands_are_not_dangerous() {
        for c in [
            "rm -rf /tmp/build",
            "rm -rf ./logs",
            "rm /var/log/app.log.1",
            "tar czf /logs.tar.gz /srv",
            "cat /proc/sys/kernel/hostname",
            "kill -9 1234",
            "kill 42",
            "chmod -R 755 /srv/app",
            "dd if=/dev/zero of=/tmp/x bs=1M count=1",
            "ls /",
        ] {
            assert!(!dangerous(c), "{c} should be allowed");
        }
    }

    #[test]
    fn rendered_text_has_every_part() {
        let o = Observation {
            instruction: "archive".into(),
            cwd: "/srv".into(),
            last_command: Some("ls".into()),
            exit_code: Some(0),
            stdout: "a\n".into(),
            listing: vec!["a".into(), "d/".into()],
            disk: Disk {
                used_bytes: 1 << 20,
                size_bytes: 64 << 20,
            },
            step: 1,
            max_steps: 30,
            ..Observation::default()
        };
        let t = render(&o);
        for part in [
            "task: archive",
            "cwd: /srv",
            "$ ls",
            "exit status: 0",
            "ls /srv: a  d/",
            "step: 1/30",
            "disk /:",
        ] {
            assert!(t.contains(part), "{part} missing in {t}");
        }
    }
}
