//! The environment interface this crate trains against, a vectorised wrapper with
//! auto-reset, and the rollout collector for [`PpoAgent`].
//!
//! The crate knows no sandbox: the engine adapts its own environments to [`Env`].

use crate::ppo::{PpoAgent, PpoError, RolloutBuffer, StepRecord};

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
    /// Vector of environments is empty or inconsistent.
    #[error("vec env: {0}")]
    Config(String),
    /// A PPO error (acting, buffer checks).
    #[error(transparent)]
    Ppo(#[from] PpoError),
}

/// One environment transition.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The next observation (the final one if the episode ended).
    pub obs: Vec<f32>,
    /// Reward of the transition.
    pub reward: f32,
    /// The episode reached a terminal state.
    pub terminated: bool,
    /// The episode was cut by a time limit (not terminal: bootstrapped).
    pub truncated: bool,
}

/// A single-agent environment with a multi-discrete action space.
pub trait Env {
    /// Observation width.
    fn obs_dim(&self) -> usize;
    /// Choices per action dimension.
    fn action_dims(&self) -> Vec<usize>;
    /// Start a new episode; returns its first observation.
    fn reset(&mut self) -> Vec<f32>;
    /// Apply one action (one index per dimension).
    fn step(&mut self, action: &[u32]) -> Step;
    /// 0/1 mask of valid actions for the current observation (`None`: all valid).
    fn action_mask(&self) -> Option<Vec<f32>> {
        None
    }
}

/// A finished episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Environment index.
    pub env: usize,
    /// Undiscounted return.
    pub ret: f64,
    /// Length in steps.
    pub len: u64,
    /// Ended by the time limit.
    pub truncated: bool,
}

/// Result of stepping every environment once.
#[derive(Debug, Clone)]
pub struct VecStep {
    /// Rewards.
    pub rewards: Vec<f32>,
    /// Terminal flags.
    pub terminated: Vec<bool>,
    /// Truncation flags.
    pub truncated: Vec<bool>,
    /// The last observation of each episode that ended this step.
    pub final_obs: Vec<Option<Vec<f32>>>,
    /// Episodes finished this step.
    pub episodes: Vec<Episode>,
}

/// Several environments stepped in lock-step; an ended episode is reset at once and its
/// final observation handed back in [`VecStep::final_obs`].
#[derive(Debug, Clone)]
pub struct VecEnv<E: Env> {
    envs: Vec<E>,
    obs_dim: usize,
    action_dims: Vec<usize>,
    obs: Vec<f32>,
    ep_ret: Vec<f64>,
    ep_len: Vec<u64>,
}

impl<E: Env> VecEnv<E> {
    /// Wrap and reset `envs`; all must share observation and action shapes.
    pub fn new(mut envs: Vec<E>) -> Result<Self, RolloutError> {
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
        let mut obs = Vec::with_capacity(envs.len() * obs_dim);
        for (i, e) in envs.iter_mut().enumerate() {
            let o = e.reset();
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
            obs_dim,
            action_dims,
            obs,
            ep_ret: vec![0.0; n],
            ep_len: vec![0; n],
        })
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

    /// Step every environment with its slice of `actions` (`[N, num_action_dims]`).
    pub fn step(&mut self, actions: &[u32]) -> Result<VecStep, RolloutError> {
        let nd = self.action_dims.len();
        if actions.len() != self.envs.len() * nd {
            return Err(RolloutError::Config(format!(
                "{} actions for {} envs x {nd} dims",
                actions.len(),
                self.envs.len()
            )));
        }
        let n = self.envs.len();
        let mut out = VecStep {
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            final_obs: Vec::with_capacity(n),
            episodes: Vec::new(),
        };
        for (i, e) in self.envs.iter_mut().enumerate() {
            let s = e.step(&actions[i * nd..(i + 1) * nd]);
            if s.obs.len() != self.obs_dim {
                return Err(RolloutError::Env {
                    env: i,
                    reason: format!(
                        "step returned {} features, not {}",
                        s.obs.len(),
                        self.obs_dim
                    ),
                });
            }
            self.ep_ret[i] += f64::from(s.reward);
            self.ep_len[i] += 1;
            let next = if s.terminated || s.truncated {
                out.episodes.push(Episode {
                    env: i,
                    ret: self.ep_ret[i],
                    len: self.ep_len[i],
                    truncated: s.truncated && !s.terminated,
                });
                self.ep_ret[i] = 0.0;
                self.ep_len[i] = 0;
                out.final_obs.push(Some(s.obs));
                let o = e.reset();
                if o.len() != self.obs_dim {
                    return Err(RolloutError::Env {
                        env: i,
                        reason: format!("reset returned {} features", o.len()),
                    });
                }
                o
            } else {
                out.final_obs.push(None);
                s.obs
            };
            self.obs[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(&next);
            out.rewards.push(s.reward);
            // Terminal takes precedence: a step that is both is not bootstrapped.
            out.terminated.push(s.terminated);
            out.truncated.push(s.truncated && !s.terminated);
        }
        Ok(out)
    }
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
    let n = venv.len();
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
        let mut final_values = vec![0f32; n];
        let trunc_idx: Vec<usize> = (0..n).filter(|&i| s.truncated[i]).collect();
        if !trunc_idx.is_empty() {
            let mut fo = Vec::with_capacity(trunc_idx.len() * venv.obs_dim());
            for &i in &trunc_idx {
                if let Some(o) = &s.final_obs[i] {
                    fo.extend_from_slice(o);
                }
            }
            let v = agent.values(&fo)?;
            for (k, &i) in trunc_idx.iter().enumerate() {
                final_values[i] = v[k];
            }
        }
        buf.push(&StepRecord {
            obs: &obs,
            masks: masks.as_deref(),
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
