//! The environment interface this crate trains against, a vectorised wrapper with
//! auto-reset, and the rollout collector for [`PpoAgent`].
//!
//! The crate knows no sandbox: the engine adapts its own environments to [`Env`].

use crate::ppo::{PpoAgent, PpoError, RolloutBuffer, StepRecord};
use crate::rng::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The agent could not act on an environment's observation.
    #[error("acting on env {env}'s observation: {source}")]
    Act {
        /// Environment index.
        env: usize,
        /// The agent's error.
        source: PpoError,
    },
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
    /// Wall time spent in [`VecEnv::step`] and [`VecEnv::reset_all`], and the environments'
    /// share of [`VecEnv::segments`]' (the rest is the agent's).
    busy: Duration,
}

/// What a chooser picked for one environment at one step of [`VecEnv::segments`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choice {
    /// One index per action dimension.
    pub actions: Vec<u32>,
    /// Its joint log-probability (0 for a chooser that keeps none).
    pub log_prob: f32,
    /// The value estimate of the observation (0 for a chooser that keeps none).
    pub value: f32,
}

/// One step of one environment in a [`Segment`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SegmentStep {
    /// The observation the choice was made on.
    pub obs: Vec<f32>,
    /// Its action mask (when the segments were run with masks).
    pub mask: Option<Vec<f32>>,
    /// What was chosen.
    pub choice: Choice,
    /// Reward of the transition.
    pub reward: f32,
    /// Terminal (never together with `truncated`; a masked step is neither).
    pub terminated: bool,
    /// Cut by the time limit.
    pub truncated: bool,
    /// A sample to learn from (false: the environment failed).
    pub valid: bool,
    /// The last observation of the episode that ended at this step.
    pub final_obs: Option<Vec<f32>>,
}

/// The steps one environment ran in [`VecEnv::segments`], and the episodes that ended among
/// them (with the index of the step each ended at).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Segment {
    /// In order.
    pub steps: Vec<SegmentStep>,
    /// `(step index, episode)`.
    pub episodes: Vec<(usize, Episode)>,
}

/// One environment of a [`VecEnv`] and its slice of the vector's state.
struct Lane<'a, E> {
    env: &'a mut E,
    obs: &'a mut [f32],
    ret: &'a mut f64,
    len: &'a mut u64,
}

/// One environment's transition, merged into the vector's state.
struct Advanced {
    reward: f32,
    terminated: bool,
    truncated: bool,
    valid: bool,
    final_obs: Option<Vec<f32>>,
    episode: Option<Episode>,
}

impl<E: Env> Lane<'_, E> {
    /// Step the environment with `actions`, reset it when its episode ended, and move the
    /// lane's observation, return and length on.
    fn advance(&mut self, i: usize, actions: &[u32]) -> Result<Advanced, RolloutError> {
        let fail = |e: E::Error| RolloutError::Failed {
            env: i,
            source: Box::new(e),
        };
        let s = self.env.step(actions).map_err(fail)?;
        check_width(i, "step", &s.obs, self.obs.len())?;
        let ended = s.terminated || s.truncated || s.masked;
        *self.ret += f64::from(s.reward);
        *self.len += 1;
        let (final_obs, episode) = if ended {
            let next = self.env.reset().map_err(fail)?;
            check_width(i, "reset", &next, self.obs.len())?;
            self.obs.copy_from_slice(&next);
            let episode = Episode {
                env: i,
                ret: *self.ret,
                len: *self.len,
                truncated: s.truncated && !s.terminated && !s.masked,
                masked: s.masked,
                info: s.info,
            };
            (*self.ret, *self.len) = (0.0, 0);
            (Some(s.obs), Some(episode))
        } else {
            self.obs.copy_from_slice(&s.obs);
            (None, None)
        };
        Ok(Advanced {
            reward: s.reward,
            // Terminal takes precedence: a step that is both is not bootstrapped. A masked
            // step is neither (it is dropped from learning, and cuts the advantage's carry).
            terminated: s.terminated && !s.masked,
            truncated: s.truncated && !s.terminated && !s.masked,
            valid: !s.masked,
            final_obs,
            episode,
        })
    }
}

fn check_width(env: usize, what: &str, o: &[f32], want: usize) -> Result<(), RolloutError> {
    if o.len() != want {
        return Err(RolloutError::Env {
            env,
            reason: format!("{what} returned {} features, not {want}", o.len()),
        });
    }
    Ok(())
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
        if obs_dim == 0 {
            return Err(RolloutError::Config("observations of width 0".into()));
        }
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
            check_width(i, "reset", &o, obs_dim)?;
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
    /// construction's resets excluded; of a [`VecEnv::segments`] call, its wall time times
    /// the lanes' share of time spent in the environments): the difference of two readings
    /// is the environments' part of whatever ran in between.
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
            check_width(i, "reset", &o, self.obs_dim)?;
            self.obs[i * self.obs_dim..(i + 1) * self.obs_dim].copy_from_slice(&o);
            self.ep_ret[i] = 0.0;
            self.ep_len[i] = 0;
        }
        Ok(())
    }

    /// Every environment with its slice of the vector's state.
    fn lanes(&mut self) -> Vec<Lane<'_, E>> {
        self.envs
            .iter_mut()
            .zip(self.obs.chunks_mut(self.obs_dim))
            .zip(self.ep_ret.iter_mut().zip(self.ep_len.iter_mut()))
            .map(|((env, obs), (ret, len))| Lane { env, obs, ret, len })
            .collect()
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
        let workers = self.workers;
        let mut lanes = self.lanes();
        let moved = par_each(&mut lanes, workers, |i, lane, _| {
            lane.advance(i, &actions[i * nd..(i + 1) * nd])
        });
        drop(lanes);
        self.busy += t.elapsed();
        let moved = moved?;
        let n = self.envs.len();
        let mut out = VecStep {
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            valid: Vec::with_capacity(n),
            final_obs: Vec::with_capacity(n),
            episodes: Vec::new(),
        };
        for a in moved {
            out.rewards.push(a.reward);
            out.terminated.push(a.terminated);
            out.truncated.push(a.truncated);
            out.valid.push(a.valid);
            out.final_obs.push(a.final_obs);
            out.episodes.extend(a.episode);
        }
        Ok(out)
    }

    /// `steps` steps of every environment, each environment's steps run one after another on
    /// its worker without waiting for the others' (with as many workers as environments, a
    /// slow step of one, a service's start or a confirmation, holds up no other; with fewer,
    /// each worker runs its environments' segments one after another). A failure stops every
    /// lane at its next step. `choose(env, obs, mask, rng)` picks an
    /// environment's actions from its current observation (and its mask, with `with_masks`)
    /// with that environment's own generator `rngs[env]`, so what is chosen depends neither
    /// on how the environments are spread over the workers nor on their timing. An ended
    /// episode is reset at once, as in [`VecEnv::step`]. The wall time counted as the
    /// environments' ([`VecEnv::env_seconds`]) is the run's wall time times the share of the
    /// lanes' time spent stepping and resetting (the rest was choosing).
    pub fn segments<C>(
        &mut self,
        steps: usize,
        with_masks: bool,
        rngs: &mut [Rng],
        choose: &C,
    ) -> Result<Vec<Segment>, RolloutError>
    where
        C: Fn(usize, &[f32], Option<&[f32]>, &mut Rng) -> Result<Choice, RolloutError> + Sync,
    {
        let n = self.envs.len();
        if rngs.len() != n {
            return Err(RolloutError::Config(format!(
                "{} generators for {n} envs",
                rngs.len()
            )));
        }
        let nd = self.action_dims.len();
        let t = Instant::now();
        let workers = self.workers;
        let mut lanes: Vec<(Lane<'_, E>, &mut Rng)> = self.lanes().into_iter().zip(rngs).collect();
        let runs = par_each(&mut lanes, workers, |i, (lane, rng), abort| {
            let mut seg = Segment {
                steps: Vec::with_capacity(steps),
                episodes: Vec::new(),
            };
            let (mut env_time, mut choose_time) = (Duration::ZERO, Duration::ZERO);
            for k in 0..steps {
                if abort.load(Ordering::Relaxed) {
                    break;
                }
                let obs = lane.obs.to_vec();
                let mask = if with_masks {
                    Some(lane.env.action_mask().ok_or_else(|| RolloutError::Env {
                        env: i,
                        reason: "masks are asked for but the environment gives none".into(),
                    })?)
                } else {
                    None
                };
                let c = Instant::now();
                let choice = choose(i, &obs, mask.as_deref(), rng)?;
                choose_time += c.elapsed();
                if choice.actions.len() != nd {
                    return Err(RolloutError::Config(format!(
                        "{} actions chosen for env {i}, not {nd}",
                        choice.actions.len()
                    )));
                }
                let e = Instant::now();
                let a = lane.advance(i, &choice.actions)?;
                env_time += e.elapsed();
                if let Some(ep) = a.episode {
                    seg.episodes.push((k, ep));
                }
                seg.steps.push(SegmentStep {
                    obs,
                    mask,
                    choice,
                    reward: a.reward,
                    terminated: a.terminated,
                    truncated: a.truncated,
                    valid: a.valid,
                    final_obs: a.final_obs,
                });
            }
            Ok((seg, env_time, choose_time))
        });
        drop(lanes);
        let wall = t.elapsed();
        let runs = runs?;
        let (env_time, choose_time) = runs.iter().fold((0.0, 0.0), |(a, b), (_, e, c)| {
            (a + e.as_secs_f64(), b + c.as_secs_f64())
        });
        if env_time + choose_time > 0.0 {
            self.busy += wall.mul_f64(env_time / (env_time + choose_time));
        }
        Ok(runs.into_iter().map(|(seg, _, _)| seg).collect())
    }

    /// [`VecEnv::segments`] for `steps` steps of every environment, in rounds of at most
    /// `round` steps each (every round waits for its slowest environment, as a training
    /// run's rollouts do), keeping nothing of what was played: a throughput baseline.
    pub fn play_rounds<C>(
        &mut self,
        steps: usize,
        round: usize,
        with_masks: bool,
        rngs: &mut [Rng],
        choose: &C,
    ) -> Result<(), RolloutError>
    where
        C: Fn(usize, &[f32], Option<&[f32]>, &mut Rng) -> Result<Choice, RolloutError> + Sync,
    {
        let mut left = steps;
        while left > 0 {
            let k = left.min(round.max(1));
            self.segments(k, with_masks, rngs, choose)?;
            left -= k;
        }
        Ok(())
    }
}

/// `f` on every environment, in parallel on up to `workers` scoped threads (contiguous
/// chunks), results in environment order; the first failure is returned.
fn par_map<E: Env, T: Send>(
    envs: &mut [E],
    workers: usize,
    f: impl Fn(usize, &mut E) -> Result<T, E::Error> + Sync,
) -> Result<Vec<T>, RolloutError> {
    par_each(envs, workers, |i, e, _| {
        f(i, e).map_err(|x| RolloutError::Failed {
            env: i,
            source: Box::new(x),
        })
    })
}

/// `f` on every item (one per environment), in parallel on up to `workers` scoped threads
/// (contiguous chunks), results in order; the first failure is returned. After a failure the
/// abort flag given to `f` is set and no chunk starts another item (a long `f` may watch the
/// flag to stop early).
fn par_each<T: Send, R: Send>(
    items: &mut [T],
    workers: usize,
    f: impl Fn(usize, &mut T, &AtomicBool) -> Result<R, RolloutError> + Sync,
) -> Result<Vec<R>, RolloutError> {
    let abort = AtomicBool::new(false);
    let (f, abort) = (&f, &abort);
    // The results of `part` (items from `first`) until its first failure.
    let run = move |first: usize, part: &mut [T]| {
        let mut out = Vec::with_capacity(part.len());
        for (k, e) in part.iter_mut().enumerate() {
            if abort.load(Ordering::Relaxed) {
                break;
            }
            // A panic is this environment's failure: it stops the others as an error does.
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(first + k, e, abort)))
                    .unwrap_or_else(|payload| {
                        let what = payload
                            .downcast_ref::<&str>()
                            .map(|m| m.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Err(RolloutError::Env {
                            env: first + k,
                            reason: format!("it (or acting on it) panicked: {what}"),
                        })
                    });
            let failed = r.is_err();
            out.push(r);
            if failed {
                abort.store(true, Ordering::Relaxed);
                break;
            }
        }
        out
    };
    // Each chunk's results, up to and including its first failure (panics are caught per
    // item, so a thread never ends in one).
    let parts: Vec<Vec<Result<R, RolloutError>>> = if workers <= 1 || items.len() <= 1 {
        vec![run(0, items)]
    } else {
        let chunk = items.len().div_ceil(workers);
        std::thread::scope(|s| {
            let handles: Vec<_> = items
                .chunks_mut(chunk)
                .enumerate()
                .map(|(c, part)| s.spawn(move || run(c * chunk, part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };
    // In order: the first failure by environment index, else every result (no chunk stops
    // early unless some chunk failed).
    parts.into_iter().flatten().collect()
}

/// `agent`'s sampled choice for environment `env`'s observation (one row); an error names
/// the environment.
pub fn act_one(
    agent: &PpoAgent,
    env: usize,
    obs: &[f32],
    mask: Option<&[f32]>,
    rng: &mut Rng,
) -> Result<Choice, RolloutError> {
    let out = agent
        .act_with(obs, mask, rng)
        .map_err(|source| RolloutError::Act { env, source })?;
    match (out.log_probs.as_slice(), out.values.as_slice()) {
        ([log_prob], [value]) => Ok(Choice {
            log_prob: *log_prob,
            value: *value,
            actions: out.actions,
        }),
        _ => Err(RolloutError::Env {
            env,
            reason: format!(
                "the agent answered {} log-probabilities and {} values for one observation",
                out.log_probs.len(),
                out.values.len()
            ),
        }),
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
    let steps = cfg.num_steps;
    let masked = buf.is_masked();
    if masked && venv.masks().is_none() {
        return Err(RolloutError::Config(
            "buffer is masked but envs give no masks".into(),
        ));
    }
    // Each environment runs its whole rollout on its worker with a generator of its own
    // (drawn from the agent's, so a checkpoint still resumes exactly); the policy does not
    // change during a rollout, so this is the same rollout as one stepped in lock-step.
    let mut rngs = agent.fork_rngs(venv.len());
    let policy = &*agent;
    let segs = venv.segments(steps, masked, &mut rngs, &|i, obs, mask, rng| {
        act_one(policy, i, obs, mask, rng)
    })?;
    let mut episodes: Vec<(usize, Episode)> = Vec::new();
    for seg in &segs {
        episodes.extend(seg.episodes.iter().cloned());
    }
    // Time-major, and within a step in environment order, as a lock-step rollout lists them.
    episodes.sort_by_key(|(k, e)| (*k, e.env));
    for k in 0..steps {
        let at: Vec<&SegmentStep> = segs.iter().map(|s| &s.steps[k]).collect();
        let obs: Vec<f32> = at.iter().flat_map(|s| s.obs.iter().copied()).collect();
        let masks: Option<Vec<f32>> = masked.then(|| {
            at.iter()
                .flat_map(|s| s.mask.iter().flatten().copied())
                .collect()
        });
        let actions: Vec<u32> = at
            .iter()
            .flat_map(|s| s.choice.actions.iter().copied())
            .collect();
        let log_probs: Vec<f32> = at.iter().map(|s| s.choice.log_prob).collect();
        let values: Vec<f32> = at.iter().map(|s| s.choice.value).collect();
        let rewards: Vec<f32> = at.iter().map(|s| s.reward).collect();
        let terminated: Vec<bool> = at.iter().map(|s| s.terminated).collect();
        let truncated: Vec<bool> = at.iter().map(|s| s.truncated).collect();
        let valid: Vec<bool> = at.iter().map(|s| s.valid).collect();
        let final_obs: Vec<Option<Vec<f32>>> = at.iter().map(|s| s.final_obs.clone()).collect();
        let final_values = agent.truncation_values(&truncated, &final_obs)?;
        // A sample after which the environment failed bootstraps nothing from it.
        buf.push(&StepRecord {
            obs: &obs,
            masks: masks.as_deref(),
            valid: Some(&valid),
            actions: &actions,
            log_probs: &log_probs,
            values: &values,
            rewards: &rewards,
            terminated: &terminated,
            truncated: &truncated,
            final_values: &final_values,
        })?;
    }
    let last = agent.values(venv.obs())?;
    buf.set_last_values(&last)?;
    let episodes = episodes.into_iter().map(|(_, e)| e).collect();
    Ok(episodes)
}
