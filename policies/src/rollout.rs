//! The environment interface this crate trains against, a vectorised wrapper with
//! auto-reset, and the rollout collector for [`PpoAgent`].
//!
//! The crate knows no sandbox: the engine adapts its own environments to [`Env`].

use crate::ppo::{PpoAgent, PpoError, RolloutBuffer, StepRecord};
use std::time::{Duration, Instant};

/// Errors of rollout collection.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// An environment broke its contract.
    #[error("env {env}: {reason}")]
    Env {
        /// Environment index.
        env: usize,
        /// What went wrong.
        reason: String,
    },
    /// An environment failed in a way it cannot recover from.
    #[error("env {env} failed: {source}")]
    Failed {
        /// Environment index.
        env: usize,
        /// Its error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Vector of environments is empty or inconsistent.
    #[error("vec env: {0}")]
    Config(String),
    /// A PPO error (acting, buffer checks).
    #[error(transparent)]
    Ppo(#[from] PpoError),
}

/// One environment transition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// The next observation (the final one if the episode ended).
    pub obs: Vec<f32>,
    /// Reward of the transition.
    pub reward: f32,
    /// The episode reached a terminal state.
    pub terminated: bool,
    /// The episode was cut by a time limit (not terminal: bootstrapped).
    pub truncated: bool,
    /// The environment failed, not the agent (a sandbox that died): the episode ends here, and
    /// this sample gives no gradient and is no bootstrap target. Never a time limit.
    pub masked: bool,
    /// What the learner may want to know beyond the reward.
    pub info: StepInfo,
}

/// The level and the task's own judgement of a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepInfo {
    /// The level (instance) the episode runs on.
    pub level: Option<String>,
    /// The task's goal holds.
    pub success: bool,
    /// The task's progress (0..=1).
    pub progress: f64,
}

/// A single-agent environment with a multi-discrete action space. Errors are failures the
/// environment cannot recover from; recoverable failures are [`Step::masked`] steps.
pub trait Env: Send {
    /// Why the environment failed.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Observation width.
    fn obs_dim(&self) -> usize;
    /// Choices per action dimension.
    fn action_dims(&self) -> Vec<usize>;
    /// Start a new episode; returns its first observation.
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error>;
    /// Apply one action (one index per dimension).
    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error>;
    /// 0/1 mask of valid actions for the current observation (`None`: all valid).
    fn action_mask(&self) -> Option<Vec<f32>> {
        None
    }
}

/// A finished episode.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Episode {
    /// Environment index.
    pub env: usize,
    /// Undiscounted return.
    pub ret: f64,
    /// Length in steps.
    pub len: u64,
    /// Ended by the time limit.
    pub truncated: bool,
    /// Ended by a failure of the environment (its samples are masked from learning).
    pub masked: bool,
    /// The last step's info (level, success, progress).
    pub info: StepInfo,
}

/// Result of stepping every environment once.
#[derive(Debug, Clone)]
pub struct VecStep {
    /// Rewards.
    pub rewards: Vec<f32>,
    /// Terminal flags.
    pub terminated: Vec<bool>,
    /// Truncation flags (time limits only).
    pub truncated: Vec<bool>,
    /// Samples to learn from (false: the environment failed).
    pub valid: Vec<bool>,
    /// The last observation of each episode that ended this step.
    pub final_obs: Vec<Option<Vec<f32>>>,
    /// Episodes finished this step.
    pub episodes: Vec<Episode>,
}

/// Several environments stepped together, on up to `workers` threads; an ended episode is
/// reset at once and its final observation handed back in [`VecStep::final_obs`].
#[derive(Debug, Clone)]
pub struct VecEnv<E: Env> {
    envs: Vec<E>,
    workers: usize,
    obs_dim: usize,
    action_dims: Vec<usize>,
    obs: Vec<f32>,
    ep_ret: Vec<f64>,
    ep_len: Vec<u64>,
    /// Wall time spent in [`VecEnv::step`] and [`VecEnv::reset_all`] (the environments'
    /// share of a rollout; the rest is the agent's).
    busy: Duration,
}

/// What one environment's step gave, before it is merged into a [`VecStep`].
struct One {
    step: Step,
    next: Vec<f32>,
    ended: bool,
}

impl<E: Env> VecEnv<E> {
    /// Wrap and reset `envs` (stepped on one thread); all must share observation and action
    /// shapes.
    pub fn new(envs: Vec<E>) -> Result<Self, RolloutError> {
        Self::with_workers(envs, 1)
    }

    /// Wrap and reset `envs`, stepped in parallel on up to `workers` threads.
    pub fn with_workers(mut envs: Vec<E>, workers: usize) -> Result<Self, RolloutError> {
        let first = envs
            .first()
            .ok_or_else(|| RolloutError::Config("no environments".into()))?;
        let obs_dim = first.obs_dim();
        let action_dims = first.action_dims();
        for (i, e) in envs.iter().enumerate() {
            if e.obs_dim() != obs_dim || e.action_dims() != action_dims {
                return Err(RolloutError::Env {
                    env: i,
                    reason: "shapes differ from env 0".into(),
                });
            }
        }
        let workers = workers.clamp(1, envs.len());
        let firsts = par_map(&mut envs, workers, |_, e| e.reset())?;
        let mut obs = Vec::with_capacity(firsts.len() * obs_dim);
        for (i, o) in firsts.into_iter().enumerate() {
            if o.len() != obs_dim {
                return Err(RolloutError::Env {
                    env: i,
                    reason: format!("reset returned {} features, not {obs_dim}", o.len()),
                });
            }
            obs.extend(o);
        }
        let n = envs.len();
        Ok(Self {
            envs,
            workers,
            obs_dim,
            action_dims,
            obs,
            ep_ret: vec![0.0; n],
            ep_len: vec![0; n],
            busy: Duration::ZERO,
        })
    }

    /// Seconds of wall time spent stepping and resetting the environments so far (the
    /// construction's resets excluded): the difference of two readings is the environments'
    /// part of whatever ran in between.
    pub fn env_seconds(&self) -> f64 {
        self.busy.as_secs_f64()
    }

    /// Number of environments.
    pub fn len(&self) -> usize {
        self.envs.len()
    }

    /// Always false (construction needs one environment).
    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
    }

    /// Observation width.
    pub fn obs_dim(&self) -> usize {
        self.obs_dim
    }

    /// The wrapped environments.
    pub fn envs(&self) -> &[E] {
        &self.envs
    }

    /// The wrapped environments, mutably.
    pub fn envs_mut(&mut self) -> &mut [E] {
        &mut self.envs
    }

    /// Choices per action dimension.
    pub fn action_dims(&self) -> &[usize] {
        &self.action_dims
    }

    /// Current observations `[N, obs_dim]`.
    pub fn obs(&self) -> &[f32] {
        &self.obs
    }

    /// Current masks `[N, sum(action_dims)]`, if the environments provide them.
    pub fn masks(&self) -> Option<Vec<f32>> {
        let mut out = Vec::new();
        for e in &self.envs {
            out.extend(e.action_mask()?);
        }
        Some(out)
    }

    /// Reset every environment (a new episode everywhere; unfinished ones are dropped).
    pub fn reset_all(&mut self) -> Result<(), RolloutError> {
        let t = Instant::now();
        let firsts = par_map(&mut self.envs, self.workers, |_, e| e.reset());
        self.busy += t.elapsed();
        let firsts = firsts?;
        for (i, o) in firsts.into_iter().enumerate() {
            self.check_width(i, "reset", &o)?;
            self.obs[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(&o);
            self.ep_ret[i] = 0.0;
            self.ep_len[i] = 0;
        }
        Ok(())
    }

    fn check_width(&self, env: usize, what: &str, o: &[f32]) -> Result<(), RolloutError> {
        if o.len() != self.obs_dim {
            return Err(RolloutError::Env {
                env,
                reason: format!("{what} returned {} features, not {}", o.len(), self.obs_dim),
            });
        }
        Ok(())
    }

    /// Step every environment with its slice of `actions` (`[N, num_action_dims]`), in
    /// parallel; an environment whose episode ended is reset in the same pass.
    pub fn step(&mut self, actions: &[u32]) -> Result<VecStep, RolloutError> {
        let nd = self.action_dims.len();
        if actions.len() != self.envs.len() * nd {
            return Err(RolloutError::Config(format!(
                "{} actions for {} envs x {nd} dims",
                actions.len(),
                self.envs.len()
            )));
        }
        let t = Instant::now();
        let ones = par_map(&mut self.envs, self.workers, |i, e| {
            let step = e.step(&actions[i * nd..(i + 1) * nd])?;
            let ended = step.terminated || step.truncated || step.masked;
            let next = if ended { e.reset()? } else { Vec::new() };
            Ok(One { step, next, ended })
        });
        self.busy += t.elapsed();
        let ones = ones?;
        let n = self.envs.len();
        let mut out = VecStep {
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            valid: Vec::with_capacity(n),
            final_obs: Vec::with_capacity(n),
            episodes: Vec::new(),
        };
        for (i, one) in ones.into_iter().enumerate() {
            let One {
                step: s,
                next,
                ended,
            } = one;
            self.check_width(i, "step", &s.obs)?;
            self.ep_ret[i] += f64::from(s.reward);
            self.ep_len[i] += 1;
            let next = if ended {
                self.check_width(i, "reset", &next)?;
                out.episodes.push(Episode {
                    env: i,
                    ret: self.ep_ret[i],
                    len: self.ep_len[i],
                    truncated: s.truncated && !s.terminated && !s.masked,
                    masked: s.masked,
                    info: s.info.clone(),
                });
                self.ep_ret[i] = 0.0;
                self.ep_len[i] = 0;
                out.final_obs.push(Some(s.obs));
                next
            } else {
                out.final_obs.push(None);
                s.obs
            };
            self.obs[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(&next);
            out.rewards.push(s.reward);
            // Terminal takes precedence: a step that is both is not bootstrapped. A masked
            // step is neither (it is dropped from learning, and cuts the advantage's carry).
            out.terminated.push(s.terminated && !s.masked);
            out.truncated
                .push(s.truncated && !s.terminated && !s.masked);
            out.valid.push(!s.masked);
        }
        Ok(out)
    }
}

/// `f` on every environment, in parallel on up to `workers` scoped threads (contiguous
/// chunks), results in environment order; the first failure is returned.
fn par_map<E: Env, T: Send>(
    envs: &mut [E],
    workers: usize,
    f: impl Fn(usize, &mut E) -> Result<T, E::Error> + Sync,
) -> Result<Vec<T>, RolloutError> {
    let fail = |env: usize, e: E::Error| RolloutError::Failed {
        env,
        source: Box::new(e),
    };
    if workers <= 1 || envs.len() <= 1 {
        return envs
            .iter_mut()
            .enumerate()
            .map(|(i, e)| f(i, e).map_err(|x| fail(i, x)))
            .collect();
    }
    let chunk = envs.len().div_ceil(workers);
    let f = &f;
    // One entry per chunk; `None` when its thread panicked.
    type Chunk<T, X> = Option<Vec<Result<T, X>>>;
    let parts: Vec<Chunk<T, E::Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = envs
            .chunks_mut(chunk)
            .enumerate()
            .map(|(c, part)| {
                s.spawn(move || {
                    part.iter_mut()
                        .enumerate()
                        .map(|(k, e)| f(c * chunk + k, e))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect()
    });
    let mut out = Vec::with_capacity(envs.len());
    for (c, part) in parts.into_iter().enumerate() {
        let part = part.ok_or_else(|| RolloutError::Env {
            env: c * chunk,
            reason: "its worker thread panicked while stepping".into(),
        })?;
        for (k, r) in part.into_iter().enumerate() {
            out.push(r.map_err(|x| fail(c * chunk + k, x))?);
        }
    }
    Ok(out)
}

/// Fill `buf` with one rollout of `agent` in `venv` (clearing it first) and set the
/// bootstrap values. Truncated episodes get `V(final observation)`. Returns the episodes
/// that finished.
pub fn collect<E: Env>(
    agent: &mut PpoAgent,
    venv: &mut VecEnv<E>,
    buf: &mut RolloutBuffer,
) -> Result<Vec<Episode>, RolloutError> {
    let (net, cfg) = (agent.net_config(), agent.config());
    if venv.obs_dim() != net.obs_dim
        || venv.action_dims() != net.action_dims.as_slice()
        || venv.len() != cfg.num_envs
    {
        return Err(RolloutError::Config(format!(
            "envs give {} x obs_dim {} with action dims {:?}; the agent expects {} x obs_dim {} with action dims {:?}",
            venv.len(),
            venv.obs_dim(),
            venv.action_dims(),
            cfg.num_envs,
            net.obs_dim,
            net.action_dims
        )));
    }
    buf.clear();
    let mut episodes = Vec::new();
    let steps = agent.config().num_steps;
    for _ in 0..steps {
        let obs = venv.obs().to_vec();
        let masks = if buf.is_masked() {
            Some(venv.masks().ok_or_else(|| {
                RolloutError::Config("buffer is masked but envs give no masks".into())
            })?)
        } else {
            None
        };
        let out = agent.act(&obs, masks.as_deref())?;
        let s = venv.step(&out.actions)?;
        let final_values = agent.truncation_values(&s.truncated, &s.final_obs)?;
        // A sample after which the environment failed bootstraps nothing from it.
        buf.push(&StepRecord {
            obs: &obs,
            masks: masks.as_deref(),
            valid: Some(&s.valid),
            actions: &out.actions,
            log_probs: &out.log_probs,
            values: &out.values,
            rewards: &s.rewards,
            terminated: &s.terminated,
            truncated: &s.truncated,
            final_values: &final_values,
        })?;
        episodes.extend(s.episodes);
    }
    let last = agent.values(venv.obs())?;
    buf.set_last_values(&last)?;
    Ok(episodes)
}
