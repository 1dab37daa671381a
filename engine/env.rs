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
use crate::instance::Plan;
use crate::instance::TaskSetup;
use crate::running::{RunningError, RunningInstance};
use crate::synth::Cache;
use crate::tasks::Verdict;
use policies::encoder::{Encoder, HashedTextConfig, HashedTextEncoder, Observation as EncObs};
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

    /// The perturbation of the plan that cannot take hold in its instance, and why: the plan
    /// is skipped, neither the agent's failure nor the infrastructure's.
    pub fn not_applicable(&self) -> Option<(&str, String)> {
        match self {
            Self::Running(e) => e.not_applicable(),
            _ => None,
        }
    }
}

/// How rewards are computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// `shaped` (the design's default) or `sparse` (only `goal` when the goal is reached).
    pub mode: RewardMode,
    /// A command that exits 0.
    pub success: f64,
    /// The goal reached (once per episode).
    pub goal: f64,
    /// Every step.
    pub step: f64,
    /// A command that fails (non-zero exit, timeout) or is refused as dangerous.
    pub error: f64,
    /// A command that mentions nothing the task is about.
    pub irrelevant: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardMode {
    Shaped,
    Sparse,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            mode: RewardMode::Shaped,
            success: 10.0,
            goal: 50.0,
            step: -1.0,
            error: -20.0,
            irrelevant: -5.0,
        }
    }
}

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
    /// Width of the hashed text features.
    pub feature_dim: usize,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            reward: RewardConfig::default(),
            max_steps: None,
            step_timeout_ms: 10_000,
            output_cap: 256 << 10,
            observation_bytes: 2048,
            dangerous: DEFAULT_DANGEROUS.iter().map(|s| s.to_string()).collect(),
            require_certified: false,
            feature_dim: 512,
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
    pub progress: f64,
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

/// Numeric features appended to the hashed text: exit ok, exit failed, timeout, truncated
/// output, step fraction, disk fraction, stdout size (log), listing size (log).
pub const NUMERIC_FEATURES: usize = 8;

/// Marker that ends a command's stderr with its final working directory.
const CWD_MARK: &str = "\u{1e}envfactory-cwd:";

/// One agent's environment.
pub struct Env {
    rt: Runtime,
    cache: Cache,
    cfg: EnvConfig,
    dangerous: Vec<(String, regex::Regex)>,
    encoder: HashedTextEncoder,
    certificates: Certificates,
    running: Option<RunningInstance>,
    setup: Option<TaskSetup>,
    step: u32,
    max_steps: u32,
    goal_reached: bool,
    done: bool,
    episode_return: f64,
    last: Observation,
}

impl Env {
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
        let encoder = HashedTextEncoder::new(HashedTextConfig {
            text_dim: cfg.feature_dim.max(1),
            numeric_dim: NUMERIC_FEATURES,
            ..HashedTextConfig::default()
        })?;
        let certificates = Certificates::new(cache.clone());
        Ok(Self {
            rt,
            cache,
            cfg,
            dangerous,
            encoder,
            certificates,
            running: None,
            setup: None,
            step: 0,
            max_steps: 0,
            goal_reached: false,
            done: true,
            episode_return: 0.0,
            last: Observation::default(),
        })
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
        self.setup.as_ref()
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
        let reuse = self
            .running
            .as_ref()
            .is_some_and(|l| !l.sandbox.is_dead() && l.instance.plan == *plan);
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
            if self.cfg.require_certified {
                let cert = self.certificates.get_or_check(&self.rt, &held.instance)?;
                if !cert.solvable {
                    return Err(EnvError::Uncertified {
                        id: held.instance.id.clone(),
                        reason: cert.reason,
                    });
                }
            }
            self.running = Some(RunningInstance::start(&self.rt, held)?);
        }
        let Some(running) = self.running.as_mut() else {
            return Err(EnvError::NotReset);
        };
        let setup = running.instance.task.clone().ok_or(EnvError::NoTask)?;
        running.cwd = setup.cwd.clone();
        self.max_steps = self.cfg.max_steps.unwrap_or(setup.max_steps).max(1);
        self.setup = Some(setup);
        self.step = 0;
        self.goal_reached = false;
        self.done = false;
        self.episode_return = 0.0;
        let mut obs = Observation::default();
        self.observe(&mut obs)?;
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
        let mut reward = r.step;
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
        } else if let Some(p) = self.dangerous_match(&cmd) {
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
                        if running.sandbox.stat(&running.cwd).is_err() {
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
        let exec_us = t0.elapsed().as_micros() as u64;
        let verdict = match self.verify() {
            Ok(v) => v,
            Err(e) if e.is_infrastructure() => return Ok(self.infra_step(e, obs, info, t0)),
            // A read the agent's state refused (not the sandbox failing): not solved.
            Err(e) => Verdict {
                success: false,
                progress: 0.0,
                reasons: vec![format!("the verifier could not read the state: {e}")],
            },
        };
        info.success = verdict.success;
        info.progress = verdict.progress;
        let newly = verdict.success && !self.goal_reached;
        self.goal_reached |= verdict.success;
        info.goal_reached = self.goal_reached;
        match r.mode {
            RewardMode::Shaped => {
                reward += if command_ok { r.success } else { r.error };
                if info.irrelevant {
                    reward += r.irrelevant;
                }
                if newly {
                    reward += r.goal;
                }
            }
            RewardMode::Sparse => reward = if newly { r.goal } else { 0.0 },
        }
        let terminated = verdict.success;
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

    fn dangerous_match(&self, cmd: &str) -> Option<String> {
        self.dangerous
            .iter()
            .find(|(_, r)| r.is_match(cmd))
            .map(|(p, _)| p.clone())
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
        // The command runs as written (its own line, so a trailing comment cannot swallow the
        // epilogue); the epilogue reports the final directory on stderr and keeps the status.
        let wrapped =
            format!("{cmd}\n__ef_rc=$?; printf '{CWD_MARK}%s' \"$PWD\" >&2; exit $__ef_rc");
        let mut req = sandbox::ExecRequest::shell(wrapped);
        req.cwd = running.cwd.clone();
        req.env = Some(running.env.clone());
        req.timeout_ms = self.cfg.step_timeout_ms;
        req.output_cap = self.cfg.output_cap;
        let res = running.sandbox.exec(&req).map_err(RunningError::from)?;
        let mut stderr = res.stderr.clone();
        if let Some(pos) = find_last(&stderr, CWD_MARK.as_bytes()) {
            // The directory runs to the end of the line: a background process may write to
            // stderr after the epilogue.
            let rest = &stderr[pos + CWD_MARK.len()..];
            let end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
            let dir = String::from_utf8_lossy(&rest[..end]).into_owned();
            if dir.starts_with('/') && !dir.chars().any(char::is_control) {
                running.cwd = dir;
            }
            let tail = rest[end..].to_vec();
            stderr.truncate(pos);
            stderr.extend_from_slice(&tail);
        }
        obs.exit_code = Some(res.exit_code());
        obs.stdout = clip(&res.stdout, self.cfg.observation_bytes);
        obs.stderr = clip(&stderr, self.cfg.observation_bytes);
        obs.stdout_truncated =
            res.stdout_truncated || res.stdout.len() > self.cfg.observation_bytes;
        obs.stderr_truncated = res.stderr_truncated || stderr.len() > self.cfg.observation_bytes;
        if res.termination == Termination::TimedOut {
            obs.stderr.push_str(&format!(
                "\n[timed out after {} ms; its processes were killed]",
                self.cfg.step_timeout_ms
            ));
        }
        if res.oom_killed {
            obs.stderr.push_str("\n[killed: out of memory]");
        }
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
        obs.listing = match running.sandbox.list_dir(&running.cwd) {
            Ok(entries) => {
                let mut v: Vec<String> = entries
                    .into_iter()
                    .map(|e| {
                        if e.stat.kind == sandbox::protocol::FileKind::Dir {
                            format!("{}/", e.name)
                        } else {
                            e.name
                        }
                    })
                    .collect();
                v.sort();
                v.truncate(64);
                v
            }
            Err(e) if e.is_infrastructure() => return Err(RunningError::from(e).into()),
            Err(_) => Vec::new(), // the agent removed its cwd: an empty listing says so
        };
        let h = running.sandbox.health().map_err(RunningError::from)?;
        obs.disk = Disk {
            used_bytes: h.upper_bytes,
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
        obs.features = self.encoder.encode(&EncObs {
            text: &obs.text,
            numeric: &numeric,
        })?;
        Ok(())
    }

    /// The last observation.
    pub fn last_observation(&self) -> &Observation {
        &self.last
    }
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

fn clip(b: &[u8], max: usize) -> String {
    let b = &b[..b.len().min(max)];
    crate::text::escape_control(&String::from_utf8_lossy(b)).into_owned()
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| &hay[i..i + needle.len()] == needle)
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
    fn last_marker_wins() {
        let s = b"a\x1eenvfactory-cwd:/x b \x1eenvfactory-cwd:/y";
        let p = find_last(s, CWD_MARK.as_bytes()).unwrap();
        assert_eq!(&s[p + CWD_MARK.len()..], b"/y");
        assert_eq!(find_last(b"ab", b"abc"), None);
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
