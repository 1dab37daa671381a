//! PPO, readable top to bottom (CleanRL's `ppo.py` details, see `docs/policies.md`):
//!
//! 1. [`gae`]: generalised advantage estimation; a time-limit truncation bootstraps from
//!    `V(final observation)` and is not treated as terminal.
//! 2. [`normalize_advantages`]: per-minibatch advantage normalisation.
//! 3. [`ppo_losses`]: clipped surrogate, clipped value loss, entropy bonus, approx KL, clip
//!    fraction.
//! 4. [`PpoAgent::update`]: epochs of shuffled minibatches, global gradient-norm clipping,
//!    Adam (eps 1e-5) with a linearly annealed learning rate, optional target-KL early stop.
//! 5. [`PpoAgent::act`]: masked multi-discrete sampling from the actor-critic.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, CheckpointError};
use crate::dist::{DistError, MultiCategorical};
use crate::nets::{ActorCritic, ActorCriticConfig, NetError};
use crate::optim::{clip_grad_norm, Adam, AdamConfig, AdamState, LinearSchedule, OptimError};
use crate::rng::{self, Rng, RngState};
use crate::weight_init::{self, InitError};

/// Errors of PPO.
#[derive(Debug, thiserror::Error)]
pub enum PpoError {
    /// A configuration value is invalid.
    #[error("ppo config: `{field}` {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// An input has the wrong length or shape.
    #[error("ppo: `{tensor}` expected {expected}, got {got}")]
    Shape {
        /// The input name.
        tensor: &'static str,
        /// Expected size or shape.
        expected: String,
        /// Actual size or shape.
        got: String,
    },
    /// An input holds NaN or infinity.
    #[error("ppo: `{tensor}` has non-finite value {value} at row {row}, column {col}")]
    NonFiniteInput {
        /// The input name (`obs`, `rewards`, ...).
        tensor: &'static str,
        /// Row (batch element or environment).
        row: usize,
        /// Column (feature).
        col: usize,
        /// The value.
        value: f32,
    },
    /// A loss became NaN or infinite during an update; parameters were not touched.
    #[error(
        "ppo: `{loss}` loss is {value} at update {update}, epoch {epoch}, minibatch {minibatch}"
    )]
    NonFiniteLoss {
        /// Which loss.
        loss: &'static str,
        /// Its value.
        value: f32,
        /// Update index.
        update: u64,
        /// Epoch.
        epoch: usize,
        /// Minibatch.
        minibatch: usize,
    },
    /// The rollout buffer is not in the state the operation needs.
    #[error("ppo: rollout buffer {0}")]
    Buffer(String),
    /// A network error.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A distribution error.
    #[error(transparent)]
    Dist(#[from] DistError),
    /// An optimiser error.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// An initialisation error.
    #[error(transparent)]
    Init(#[from] InitError),
    /// A checkpoint error.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A candle error.
    #[error("ppo: candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Every PPO hyper-parameter (defaults: CleanRL's CartPole settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PpoConfig {
    /// Parallel environments.
    pub num_envs: usize,
    /// Steps per environment per rollout.
    pub num_steps: usize,
    /// Number of updates the learning rate is annealed over.
    pub total_updates: u64,
    /// Initial learning rate.
    pub learning_rate: f64,
    /// Anneal the learning rate linearly to 0 over `total_updates`.
    pub anneal_lr: bool,
    /// Adam epsilon.
    pub adam_eps: f64,
    /// Discount.
    pub gamma: f64,
    /// GAE lambda.
    pub gae_lambda: f64,
    /// Epochs over each rollout.
    pub update_epochs: usize,
    /// Minibatches per epoch (must divide `num_envs * num_steps`).
    pub num_minibatches: usize,
    /// Normalise advantages per minibatch.
    pub norm_adv: bool,
    /// Surrogate clipping coefficient (also the value clip range).
    pub clip_coef: f64,
    /// Clip the value loss.
    pub clip_vloss: bool,
    /// Entropy bonus coefficient.
    pub ent_coef: f64,
    /// Value loss coefficient.
    pub vf_coef: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Stop the update's epochs once approx KL exceeds this.
    pub target_kl: Option<f64>,
}

impl Default for PpoConfig {
    fn default() -> Self {
        Self {
            num_envs: 4,
            num_steps: 128,
            total_updates: 500_000 / 512,
            learning_rate: 2.5e-4,
            anneal_lr: true,
            adam_eps: 1e-5,
            gamma: 0.99,
            gae_lambda: 0.95,
            update_epochs: 4,
            num_minibatches: 4,
            norm_adv: true,
            clip_coef: 0.2,
            clip_vloss: true,
            ent_coef: 0.01,
            vf_coef: 0.5,
            max_grad_norm: 0.5,
            target_kl: None,
        }
    }
}

impl PpoConfig {
    /// Samples per rollout.
    pub fn batch_size(&self) -> usize {
        self.num_envs * self.num_steps
    }

    /// Samples per minibatch.
    pub fn minibatch_size(&self) -> usize {
        self.batch_size() / self.num_minibatches.max(1)
    }

    /// Check every field; the error names the field.
    pub fn validate(&self) -> Result<(), PpoError> {
        let bad = |field, reason: &str| {
            Err(PpoError::InvalidConfig {
                field,
                reason: reason.into(),
            })
        };
        if self.num_envs == 0 {
            return bad("num_envs", "must be > 0");
        }
        if self.num_steps == 0 {
            return bad("num_steps", "must be > 0");
        }
        if self.num_envs.checked_mul(self.num_steps).is_none() {
            return bad("num_steps", "num_envs * num_steps overflows");
        }
        if self.update_epochs == 0 {
            return bad("update_epochs", "must be > 0");
        }
        if self.num_minibatches == 0 || self.batch_size() % self.num_minibatches != 0 {
            return bad(
                "num_minibatches",
                "must be > 0 and divide num_envs * num_steps",
            );
        }
        for (field, v) in [
            ("learning_rate", self.learning_rate),
            ("adam_eps", self.adam_eps),
            ("clip_coef", self.clip_coef),
            ("ent_coef", self.ent_coef),
            ("vf_coef", self.vf_coef),
            ("max_grad_norm", self.max_grad_norm),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(PpoError::InvalidConfig {
                    field,
                    reason: format!("is {v}; must be finite and >= 0"),
                });
            }
        }
        if !(0.0..=1.0).contains(&self.gamma) {
            return bad("gamma", "must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.gae_lambda) {
            return bad("gae_lambda", "must be in [0, 1]");
        }
        if self.target_kl.is_some_and(|k| !(k.is_finite() && k > 0.0)) {
            return bad("target_kl", "must be finite and > 0");
        }
        Ok(())
    }
}

/// Tensors entering the PPO loss for one minibatch (all `[B]`).
#[derive(Debug, Clone, Copy)]
pub struct LossInputs<'a> {
    /// Log-probabilities of the taken actions under the current policy.
    pub new_logp: &'a Tensor,
    /// Log-probabilities at collection time.
    pub old_logp: &'a Tensor,
    /// (Normalised) advantages.
    pub advantages: &'a Tensor,
    /// Current value predictions.
    pub new_values: &'a Tensor,
    /// Value predictions at collection time.
    pub old_values: &'a Tensor,
    /// GAE returns.
    pub returns: &'a Tensor,
    /// Current entropy per sample.
    pub entropy: &'a Tensor,
}

/// The PPO losses of one minibatch.
#[derive(Debug, Clone)]
pub struct Losses {
    /// `policy - ent_coef * entropy + vf_coef * value` (scalar, differentiable).
    pub total: Tensor,
    /// `mean(max(-A r, -A clip(r, 1-c, 1+c)))`.
    pub policy: f32,
    /// `0.5 * mean(max((V-R)^2, (V_old + clip(V-V_old, -c, c) - R)^2))` (or unclipped).
    pub value: f32,
    /// Mean entropy.
    pub entropy: f32,
    /// `mean((r - 1) - log r)` (Schulman's k3 estimator).
    pub approx_kl: f32,
    /// `mean(-log r)`.
    pub old_approx_kl: f32,
    /// Fraction of samples with `|r - 1| > c`.
    pub clip_fraction: f32,
}

/// The clipped-surrogate, clipped-value and entropy losses for one minibatch.
pub fn ppo_losses(inp: &LossInputs<'_>, cfg: &PpoConfig) -> Result<Losses, PpoError> {
    let c = cfg.clip_coef;
    let logratio = (inp.new_logp - inp.old_logp)?;
    let ratio = logratio.exp()?;
    let pg1 = (inp.advantages.neg()? * &ratio)?;
    let pg2 = (inp.advantages.neg()? * ratio.clamp(1.0 - c, 1.0 + c)?)?;
    let pg_loss = pg1.maximum(&pg2)?.mean_all()?;
    let v_unclipped = (inp.new_values - inp.returns)?.sqr()?;
    let v_loss = if cfg.clip_vloss {
        let v_clipped = (inp.old_values + (inp.new_values - inp.old_values)?.clamp(-c, c)?)?;
        let v_clipped = (v_clipped - inp.returns)?.sqr()?;
        (v_unclipped.maximum(&v_clipped)?.mean_all()? * 0.5)?
    } else {
        (v_unclipped.mean_all()? * 0.5)?
    };
    let ent = inp.entropy.mean_all()?;
    let total = ((&pg_loss - (&ent * cfg.ent_coef)?)? + (&v_loss * cfg.vf_coef)?)?;
    // Statistics, no gradient needed.
    let lr = logratio.detach();
    let r = ratio.detach();
    let approx_kl = ((&r - 1.0)? - &lr)?.mean_all()?.to_scalar::<f32>()?;
    let old_approx_kl = lr.neg()?.mean_all()?.to_scalar::<f32>()?;
    let clip_fraction = (&r - 1.0)?
        .abs()?
        .gt(c)?
        .to_dtype(DType::F32)?
        .mean_all()?
        .to_scalar::<f32>()?;
    Ok(Losses {
        total,
        policy: pg_loss.to_scalar()?,
        value: v_loss.to_scalar()?,
        entropy: ent.to_scalar()?,
        approx_kl,
        old_approx_kl,
        clip_fraction,
    })
}

/// One time step of `num_envs` environments, as pushed into a [`RolloutBuffer`].
#[derive(Debug, Clone, Copy)]
pub struct StepRecord<'a> {
    /// Observations `[num_envs, obs_dim]` the actions were chosen on.
    pub obs: &'a [f32],
    /// Masks `[num_envs, sum(action_dims)]` (required iff the buffer is masked).
    pub masks: Option<&'a [f32]>,
    /// Per sample: learn from it (`None`: every sample). A sample after which the environment
    /// failed is `false`: no gradient, no bootstrap target.
    pub valid: Option<&'a [bool]>,
    /// Actions `[num_envs, num_action_dims]`.
    pub actions: &'a [u32],
    /// Joint log-probabilities `[num_envs]`.
    pub log_probs: &'a [f32],
    /// Value estimates `[num_envs]`.
    pub values: &'a [f32],
    /// Rewards `[num_envs]`.
    pub rewards: &'a [f32],
    /// Terminal flags.
    pub terminated: &'a [bool],
    /// Time-limit flags.
    pub truncated: &'a [bool],
    /// `V(final obs)` where truncated (anything elsewhere).
    pub final_values: &'a [f32],
}

/// Fixed-size storage of one rollout, time-major.
#[derive(Debug, Clone)]
pub struct RolloutBuffer {
    num_steps: usize,
    num_envs: usize,
    obs_dim: usize,
    num_dims: usize,
    mask_width: usize,
    masked: bool,
    len: usize,
    obs: Vec<f32>,
    masks: Vec<f32>,
    actions: Vec<u32>,
    log_probs: Vec<f32>,
    values: Vec<f32>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    final_values: Vec<f32>,
    valid: Vec<bool>,
    last_values: Option<Vec<f32>>,
}

fn check_finite(tensor: &'static str, xs: &[f32], width: usize) -> Result<(), PpoError> {
    match xs.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(PpoError::NonFiniteInput {
            tensor,
            row: i / width.max(1),
            col: i % width.max(1),
            value: xs[i],
        }),
    }
}

fn check_len<T>(tensor: &'static str, xs: &[T], want: usize) -> Result<(), PpoError> {
    if xs.len() != want {
        return Err(PpoError::Shape {
            tensor,
            expected: format!("{want} entries"),
            got: format!("{}", xs.len()),
        });
    }
    Ok(())
}

impl RolloutBuffer {
    /// An empty buffer for `num_steps x num_envs` samples of an actor-critic's shapes.
    pub fn new(num_steps: usize, num_envs: usize, net: &ActorCriticConfig, masked: bool) -> Self {
        let n = num_steps * num_envs;
        let mask_width = net.num_logits();
        Self {
            num_steps,
            num_envs,
            obs_dim: net.obs_dim,
            num_dims: net.action_dims.len(),
            mask_width,
            masked,
            len: 0,
            obs: Vec::with_capacity(n * net.obs_dim),
            masks: Vec::with_capacity(if masked { n * mask_width } else { 0 }),
            actions: Vec::with_capacity(n * net.action_dims.len()),
            log_probs: Vec::with_capacity(n),
            values: Vec::with_capacity(n),
            rewards: Vec::with_capacity(n),
            terminated: Vec::with_capacity(n),
            truncated: Vec::with_capacity(n),
            final_values: Vec::with_capacity(n),
            valid: Vec::with_capacity(n),
            last_values: None,
        }
    }

    /// Forget the stored rollout.
    pub fn clear(&mut self) {
        self.len = 0;
        self.obs.clear();
        self.masks.clear();
        self.actions.clear();
        self.log_probs.clear();
        self.values.clear();
        self.rewards.clear();
        self.terminated.clear();
        self.truncated.clear();
        self.final_values.clear();
        self.valid.clear();
        self.last_values = None;
    }

    /// Steps stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No step stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All `num_steps` stored and the bootstrap values set.
    pub fn is_ready(&self) -> bool {
        self.len == self.num_steps && self.last_values.is_some()
    }

    /// Whether pushes carry masks.
    pub fn is_masked(&self) -> bool {
        self.masked
    }

    /// Append one time step; every input is checked for length and finiteness.
    pub fn push(&mut self, s: &StepRecord<'_>) -> Result<(), PpoError> {
        if self.len == self.num_steps {
            return Err(PpoError::Buffer(format!(
                "is full ({} steps); clear it first",
                self.num_steps
            )));
        }
        let ne = self.num_envs;
        check_len("obs", s.obs, ne * self.obs_dim)?;
        check_len("actions", s.actions, ne * self.num_dims)?;
        check_len("log_probs", s.log_probs, ne)?;
        check_len("values", s.values, ne)?;
        check_len("rewards", s.rewards, ne)?;
        check_len("terminated", s.terminated, ne)?;
        check_len("truncated", s.truncated, ne)?;
        check_len("final_values", s.final_values, ne)?;
        if let Some(v) = s.valid {
            check_len("valid", v, ne)?;
        }
        check_finite("obs", s.obs, self.obs_dim)?;
        // The reward of a sample the environment failed on is never read.
        match s.valid {
            Some(v) => {
                for e in (0..ne).filter(|&e| v[e]) {
                    check_finite("rewards", &s.rewards[e..=e], 1)?;
                }
            }
            None => check_finite("rewards", s.rewards, 1)?,
        }
        check_finite("values", s.values, 1)?;
        check_finite("log_probs", s.log_probs, 1)?;
        for e in 0..ne {
            if s.truncated[e] && !s.final_values[e].is_finite() {
                return Err(PpoError::NonFiniteInput {
                    tensor: "final_values",
                    row: e,
                    col: 0,
                    value: s.final_values[e],
                });
            }
        }
        match (self.masked, s.masks) {
            (true, Some(m)) => {
                check_len("masks", m, ne * self.mask_width)?;
                self.masks.extend_from_slice(m);
            }
            (true, None) => {
                return Err(PpoError::Buffer(
                    "is masked but the step has no masks".into(),
                ))
            }
            (false, Some(_)) => {
                return Err(PpoError::Buffer(
                    "is unmasked but the step has masks".into(),
                ))
            }
            (false, None) => {}
        }
        self.obs.extend_from_slice(s.obs);
        self.actions.extend_from_slice(s.actions);
        self.log_probs.extend_from_slice(s.log_probs);
        self.values.extend_from_slice(s.values);
        self.rewards.extend_from_slice(s.rewards);
        self.terminated.extend_from_slice(s.terminated);
        self.truncated.extend_from_slice(s.truncated);
        match s.valid {
            Some(v) => self.valid.extend_from_slice(v),
            None => self.valid.extend(std::iter::repeat_n(true, ne)),
        }
        // Only truncated entries are read; zero the rest so the buffer holds no garbage.
        self.final_values
            .extend(
                s.final_values
                    .iter()
                    .zip(s.truncated)
                    .map(|(&v, &t)| if t { v } else { 0.0 }),
            );
        self.len += 1;
        Ok(())
    }

    /// Set `V(s_T)` per environment (the observation after the last stored step).
    pub fn set_last_values(&mut self, v: &[f32]) -> Result<(), PpoError> {
        check_len("last_values", v, self.num_envs)?;
        check_finite("last_values", v, 1)?;
        self.last_values = Some(v.to_vec());
        Ok(())
    }

    /// Rewards stored so far (time-major).
    pub fn rewards(&self) -> &[f32] {
        &self.rewards
    }

    /// Truncation flags stored so far (time-major).
    pub fn truncated(&self) -> &[bool] {
        &self.truncated
    }

    /// Terminal flags stored so far (time-major).
    pub fn terminated(&self) -> &[bool] {
        &self.terminated
    }

    /// Which samples are learned from (time-major).
    pub fn valid(&self) -> &[bool] {
        &self.valid
    }

    /// `V(final obs)` at truncated steps, 0 elsewhere (time-major).
    pub fn final_values(&self) -> &[f32] {
        &self.final_values
    }

    /// The GAE inputs of a full buffer.
    pub fn gae_input(&self) -> Result<GaeInput<'_>, PpoError> {
        let last = match (&self.last_values, self.len == self.num_steps) {
            (Some(l), true) => l,
            _ => {
                return Err(PpoError::Buffer(format!(
                    "is not ready: {} of {} steps, last values {}",
                    self.len,
                    self.num_steps,
                    if self.last_values.is_some() {
                        "set"
                    } else {
                        "not set"
                    }
                )))
            }
        };
        Ok(GaeInput {
            num_steps: self.num_steps,
            num_envs: self.num_envs,
            rewards: &self.rewards,
            values: &self.values,
            terminated: &self.terminated,
            truncated: &self.truncated,
            final_values: &self.final_values,
            last_values: last,
            valid: Some(&self.valid),
        })
    }
}

/// What [`PpoAgent::act`] returns for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct ActOutput {
    /// Actions `[B, num_action_dims]`.
    pub actions: Vec<u32>,
    /// Joint log-probabilities `[B]`.
    pub log_probs: Vec<f32>,
    /// Values `[B]`.
    pub values: Vec<f32>,
}

/// Statistics of one update (means over the minibatches run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateStats {
    /// 0-based index of this update.
    pub update: u64,
    /// Learning rate used.
    pub learning_rate: f64,
    /// Clipped-surrogate loss.
    pub policy_loss: f32,
    /// Value loss.
    pub value_loss: f32,
    /// Entropy.
    pub entropy: f32,
    /// Approximate KL (k3).
    pub approx_kl: f32,
    /// `mean(-log r)`.
    pub old_approx_kl: f32,
    /// Fraction of clipped ratios.
    pub clip_fraction: f32,
    /// Explained variance of the rollout's values for its returns (`None`: constant returns).
    pub explained_variance: Option<f64>,
    /// Mean global gradient norm before clipping.
    pub grad_norm: f64,
    /// Epochs run (fewer than configured after a target-KL stop).
    pub epochs: usize,
    /// Minibatch steps taken.
    pub minibatches: usize,
    /// Whether the target KL stopped the update early.
    pub early_stopped: bool,
}

/// What a PPO checkpoint's state file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PpoState {
    /// Network architecture.
    pub net: ActorCriticConfig,
    /// Hyper-parameters.
    pub ppo: PpoConfig,
    /// The seed the agent was created with.
    pub seed: u64,
    /// Updates done.
    pub updates: u64,
    /// Position of the agent's generator.
    pub rng: RngState,
    /// Adam counter and moments.
    pub adam: AdamState,
}

/// Host copies of one forward pass.
struct HostForward {
    /// Probabilities `[B, total]`.
    probs: Vec<f32>,
    /// Log-probabilities per dimension, per row.
    lp_host: Vec<Vec<Vec<f32>>>,
    /// Values `[B]`.
    values: Vec<f32>,
    /// Batch size.
    batch: usize,
}

/// Checkpoint kind tag of PPO agents.
pub const PPO_CHECKPOINT_KIND: &str = "ppo_agent";

/// An actor-critic trained by PPO, with its optimiser and generator.
pub struct PpoAgent {
    net_cfg: ActorCriticConfig,
    cfg: PpoConfig,
    seed: u64,
    varmap: VarMap,
    net: ActorCritic,
    space: MultiCategorical,
    adam: Adam,
    rng: Rng,
    updates: u64,
}

impl std::fmt::Debug for PpoAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PpoAgent")
            .field("net", &self.net_cfg)
            .field("config", &self.cfg)
            .field("seed", &self.seed)
            .field("updates", &self.updates)
            .finish_non_exhaustive()
    }
}

impl PpoAgent {
    /// A freshly initialised agent; `seed` fixes initialisation, sampling and shuffling.
    pub fn new(net_cfg: &ActorCriticConfig, cfg: &PpoConfig, seed: u64) -> Result<Self, PpoError> {
        cfg.validate()?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let net = ActorCritic::new(net_cfg, vb)?;
        let mut rng = rng::seeded(seed);
        weight_init::apply(&varmap, &net.init_plan(), &mut rng)?;
        let space = MultiCategorical::new(&net_cfg.action_dims)?;
        let adam = Adam::new(
            &varmap,
            AdamConfig {
                lr: cfg.learning_rate,
                beta1: 0.9,
                beta2: 0.999,
                eps: cfg.adam_eps,
            },
        )?;
        Ok(Self {
            net_cfg: net_cfg.clone(),
            cfg: cfg.clone(),
            seed,
            varmap,
            net,
            space,
            adam,
            rng,
            updates: 0,
        })
    }

    /// Network configuration.
    pub fn net_config(&self) -> &ActorCriticConfig {
        &self.net_cfg
    }

    /// PPO configuration.
    pub fn config(&self) -> &PpoConfig {
        &self.cfg
    }

    /// Updates done.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The variables (for inspection and checkpoints).
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The action space.
    pub fn space(&self) -> &MultiCategorical {
        &self.space
    }

    fn obs_tensor(&self, obs: &[f32]) -> Result<(Tensor, usize), PpoError> {
        let d = self.net_cfg.obs_dim;
        if obs.is_empty() || obs.len() % d != 0 {
            return Err(PpoError::Shape {
                tensor: "obs",
                expected: format!("a multiple of obs_dim {d} entries"),
                got: format!("{}", obs.len()),
            });
        }
        check_finite("obs", obs, d)?;
        let b = obs.len() / d;
        Ok((Tensor::from_slice(obs, (b, d), &Device::Cpu)?, b))
    }

    fn forward_host(&self, obs: &[f32], mask: Option<&[f32]>) -> Result<HostForward, PpoError> {
        let (x, b) = self.obs_tensor(obs)?;
        let mask_t = match mask {
            Some(m) => {
                self.space.check_mask(m, b)?;
                Some(Tensor::from_slice(
                    m,
                    (b, self.space.total()),
                    &Device::Cpu,
                )?)
            }
            None => None,
        };
        let (logits, values) = self.net.forward(&x)?;
        let lp = self.space.log_probs(&logits, mask_t.as_ref())?;
        let probs = self.space.probs_host(&lp)?;
        let lp_host = lp
            .per_dim
            .iter()
            .map(|t| t.to_vec2::<f32>())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HostForward {
            probs,
            lp_host,
            values: values.to_vec1()?,
            batch: b,
        })
    }

    fn joint_logp(&self, lp_host: &[Vec<Vec<f32>>], actions: &[u32], b: usize) -> Vec<f32> {
        let nd = self.space.dims().len();
        (0..b)
            .map(|row| {
                (0..nd)
                    .map(|d| lp_host[d][row][actions[row * nd + d] as usize])
                    .sum()
            })
            .collect()
    }

    /// Sample actions for a batch of observations (`[B, obs_dim]` row-major) with optional
    /// masks (`[B, sum(action_dims)]`, 0/1). Advances the agent's generator.
    pub fn act(&mut self, obs: &[f32], mask: Option<&[f32]>) -> Result<ActOutput, PpoError> {
        let mut rng = self.rng.clone();
        let out = self.act_with(obs, mask, &mut rng);
        self.rng = rng;
        out
    }

    /// `n` generators drawn from the agent's own (one per environment of a rollout, so
    /// that what each samples does not depend on the others' timing); the agent's generator
    /// moves on, so a checkpoint taken after still resumes exactly.
    pub fn fork_rngs(&mut self, n: usize) -> Vec<Rng> {
        use rand::RngCore as _;
        (0..n).map(|_| rng::seeded(self.rng.next_u64())).collect()
    }

    /// Sample actions like [`PpoAgent::act`], from the caller's generator (evaluation
    /// agents that share one set of weights, each with its own seeded generator).
    pub fn act_with(
        &self,
        obs: &[f32],
        mask: Option<&[f32]>,
        rng: &mut Rng,
    ) -> Result<ActOutput, PpoError> {
        self.choose(obs, mask, |probs| self.space.sample(probs, mask, rng))
    }

    /// The most probable valid actions (evaluation); does not touch the generator.
    pub fn act_greedy(&self, obs: &[f32], mask: Option<&[f32]>) -> Result<ActOutput, PpoError> {
        self.choose(obs, mask, |probs| self.space.mode(probs, mask))
    }

    /// One forward pass, the actions `pick` chooses from its probabilities, their log-probs.
    fn choose(
        &self,
        obs: &[f32],
        mask: Option<&[f32]>,
        pick: impl FnOnce(&[f32]) -> Vec<u32>,
    ) -> Result<ActOutput, PpoError> {
        let HostForward {
            probs,
            lp_host,
            values,
            batch: b,
        } = self.forward_host(obs, mask)?;
        let actions = pick(&probs);
        let log_probs = self.joint_logp(&lp_host, &actions, b);
        Ok(ActOutput {
            actions,
            log_probs,
            values,
        })
    }

    /// Value estimates for a batch of observations.
    pub fn values(&self, obs: &[f32]) -> Result<Vec<f32>, PpoError> {
        let (x, _) = self.obs_tensor(obs)?;
        Ok(self.net.value(&x)?.to_vec1()?)
    }

    /// `V(final observation)` of the environments whose episode was cut by its time limit
    /// (`truncated[i]` with `final_obs[i]` given), 0 elsewhere: the bootstrap a
    /// [`StepRecord`] takes as `final_values`.
    pub fn truncation_values(
        &self,
        truncated: &[bool],
        final_obs: &[Option<Vec<f32>>],
    ) -> Result<Vec<f32>, PpoError> {
        let mut out = vec![0f32; truncated.len()];
        let idx: Vec<usize> = (0..truncated.len())
            .filter(|&i| truncated[i] && final_obs.get(i).is_some_and(Option::is_some))
            .collect();
        if idx.is_empty() {
            return Ok(out);
        }
        let fo: Vec<f32> = idx
            .iter()
            .filter_map(|&i| final_obs[i].as_deref())
            .flatten()
            .copied()
            .collect();
        let v = self.values(&fo)?;
        for (k, &i) in idx.iter().enumerate() {
            out[i] = v[k];
        }
        Ok(out)
    }

    /// Action probabilities `[B, sum(action_dims)]` (masked entries are exactly 0).
    pub fn probs(&self, obs: &[f32], mask: Option<&[f32]>) -> Result<Vec<f32>, PpoError> {
        Ok(self.forward_host(obs, mask)?.probs)
    }

    /// One PPO update on a full rollout buffer.
    pub fn update(&mut self, buf: &RolloutBuffer) -> Result<UpdateStats, PpoError> {
        let gi = buf.gae_input()?;
        if buf.num_envs != self.cfg.num_envs || buf.num_steps != self.cfg.num_steps {
            return Err(PpoError::Shape {
                tensor: "rollout buffer",
                expected: format!("{} steps x {} envs", self.cfg.num_steps, self.cfg.num_envs),
                got: format!("{} steps x {} envs", buf.num_steps, buf.num_envs),
            });
        }
        if buf.obs_dim != self.net_cfg.obs_dim
            || buf.num_dims != self.net_cfg.action_dims.len()
            || buf.mask_width != self.space.total()
        {
            return Err(PpoError::Shape {
                tensor: "rollout buffer",
                expected: format!(
                    "obs_dim {}, {} action dims, {} logits",
                    self.net_cfg.obs_dim,
                    self.net_cfg.action_dims.len(),
                    self.space.total()
                ),
                got: format!(
                    "obs_dim {}, {} action dims, {} logits",
                    buf.obs_dim, buf.num_dims, buf.mask_width
                ),
            });
        }
        if buf.masked {
            self.space.check_mask(&buf.masks, self.cfg.batch_size())?;
        }
        self.space
            .check_actions(&buf.actions, buf.masked.then_some(buf.masks.as_slice()))?;
        let (advantages, returns) = gae(&gi, self.cfg.gamma, self.cfg.gae_lambda)?;
        let lr = if self.cfg.anneal_lr {
            LinearSchedule {
                initial: self.cfg.learning_rate,
                total_updates: self.cfg.total_updates,
            }
            .at(self.updates)
        } else {
            self.cfg.learning_rate
        };
        let batch = self.cfg.batch_size();
        let mb = self.cfg.minibatch_size();
        let (od, nd, mw) = (buf.obs_dim, buf.num_dims, buf.mask_width);
        // Only the samples the environment did not fail on enter the loss.
        let mut inds: Vec<usize> = (0..batch).filter(|&i| buf.valid[i]).collect();
        let mut sums = [0f64; 6];
        let mut grad_norm_sum = 0f64;
        let mut count = 0usize;
        let mut epochs = 0usize;
        let mut early_stopped = false;
        let dev = Device::Cpu;
        'epochs: for epoch in 0..self.cfg.update_epochs {
            inds.shuffle(&mut self.rng);
            epochs += 1;
            for (k, chunk) in inds.chunks(mb).enumerate() {
                let m = chunk.len();
                let mut obs = Vec::with_capacity(m * od);
                let mut acts = Vec::with_capacity(m * nd);
                let mut masks = Vec::with_capacity(if buf.masked { m * mw } else { 0 });
                let mut old_logp = Vec::with_capacity(m);
                let mut old_v = Vec::with_capacity(m);
                let mut adv = Vec::with_capacity(m);
                let mut ret = Vec::with_capacity(m);
                for &i in chunk {
                    obs.extend_from_slice(&buf.obs[i * od..(i + 1) * od]);
                    acts.extend_from_slice(&buf.actions[i * nd..(i + 1) * nd]);
                    if buf.masked {
                        masks.extend_from_slice(&buf.masks[i * mw..(i + 1) * mw]);
                    }
                    old_logp.push(buf.log_probs[i]);
                    old_v.push(buf.values[i]);
                    adv.push(advantages[i]);
                    ret.push(returns[i]);
                }
                if self.cfg.norm_adv {
                    normalize_advantages(&mut adv);
                }
                let obs_t = Tensor::from_vec(obs, (m, od), &dev)?;
                let acts_t = Tensor::from_vec(acts, (m, nd), &dev)?;
                let mask_t = if buf.masked {
                    Some(Tensor::from_vec(masks, (m, mw), &dev)?)
                } else {
                    None
                };
                let (logits, new_v) = self.net.forward(&obs_t)?;
                let lp = self.space.log_probs(&logits, mask_t.as_ref())?;
                let new_logp = self.space.log_prob(&lp, &acts_t)?;
                let entropy = self.space.entropy(&lp)?;
                let losses = ppo_losses(
                    &LossInputs {
                        new_logp: &new_logp,
                        old_logp: &Tensor::from_vec(old_logp, m, &dev)?,
                        advantages: &Tensor::from_vec(adv, m, &dev)?,
                        new_values: &new_v,
                        old_values: &Tensor::from_vec(old_v, m, &dev)?,
                        returns: &Tensor::from_vec(ret, m, &dev)?,
                        entropy: &entropy,
                    },
                    &self.cfg,
                )?;
                for (loss, value) in [
                    ("policy", losses.policy),
                    ("value", losses.value),
                    ("entropy", losses.entropy),
                ] {
                    if !value.is_finite() {
                        return Err(PpoError::NonFiniteLoss {
                            loss,
                            value,
                            update: self.updates,
                            epoch,
                            minibatch: k,
                        });
                    }
                }
                let mut grads = losses.total.backward()?;
                let norm = clip_grad_norm(&mut grads, self.adam.params(), self.cfg.max_grad_norm)?;
                self.adam.step(&grads, lr)?;
                grad_norm_sum += norm;
                count += 1;
                for (s, v) in sums.iter_mut().zip([
                    losses.policy,
                    losses.value,
                    losses.entropy,
                    losses.approx_kl,
                    losses.old_approx_kl,
                    losses.clip_fraction,
                ]) {
                    *s += f64::from(v);
                }
                if let Some(t) = self.cfg.target_kl {
                    if f64::from(losses.approx_kl) > t {
                        early_stopped = true;
                        break 'epochs;
                    }
                }
            }
        }
        let n = count.max(1) as f64;
        let stats = UpdateStats {
            update: self.updates,
            learning_rate: lr,
            policy_loss: (sums[0] / n) as f32,
            value_loss: (sums[1] / n) as f32,
            entropy: (sums[2] / n) as f32,
            approx_kl: (sums[3] / n) as f32,
            old_approx_kl: (sums[4] / n) as f32,
            clip_fraction: (sums[5] / n) as f32,
            explained_variance: {
                let (v, r): (Vec<f32>, Vec<f32>) = (0..buf.values.len())
                    .filter(|&i| buf.valid[i])
                    .map(|i| (buf.values[i], returns[i]))
                    .unzip();
                explained_variance(&v, &r)
            },
            grad_norm: grad_norm_sum / n,
            epochs,
            minibatches: count,
            early_stopped,
        };
        self.updates += 1;
        tracing::debug!(
            update = stats.update,
            lr = stats.learning_rate,
            policy_loss = stats.policy_loss,
            value_loss = stats.value_loss,
            entropy = stats.entropy,
            approx_kl = stats.approx_kl,
            clip_fraction = stats.clip_fraction,
            explained_variance = stats.explained_variance,
            grad_norm = stats.grad_norm,
            early_stopped = stats.early_stopped,
            "ppo update"
        );
        Ok(stats)
    }

    /// The full state (for checkpoints).
    pub fn state(&self) -> Result<PpoState, PpoError> {
        Ok(PpoState {
            net: self.net_cfg.clone(),
            ppo: self.cfg.clone(),
            seed: self.seed,
            updates: self.updates,
            rng: RngState::capture(&self.rng),
            adam: self.adam.state()?,
        })
    }

    /// Write `<prefix>.safetensors` (weights) and `<prefix>.state` (msgpack state).
    pub fn save(&self, prefix: &Path) -> Result<(), PpoError> {
        checkpoint::save(prefix, PPO_CHECKPOINT_KIND, &self.varmap, &self.state()?)?;
        Ok(())
    }

    /// Rebuild an agent from [`Self::save`]'s files; the architecture comes from the state
    /// file and every tensor must match it by name and shape.
    pub fn load(prefix: &Path) -> Result<Self, PpoError> {
        let st: PpoState = checkpoint::load_state(prefix, PPO_CHECKPOINT_KIND)?;
        checkpoint::check_numel(prefix, st.net.num_params())?;
        let mut agent = Self::new(&st.net, &st.ppo, st.seed)?;
        checkpoint::load_weights(prefix, &agent.varmap)?;
        agent.adam.load_state(&st.adam)?;
        agent.rng = st.rng.restore();
        agent.updates = st.updates;
        Ok(agent)
    }

    /// Load weights only, into this agent's architecture (errors name the mismatching
    /// tensor).
    pub fn load_weights(&mut self, prefix: &Path) -> Result<(), PpoError> {
        checkpoint::load_weights(prefix, &self.varmap)?;
        Ok(())
    }
}

mod advantages;
#[cfg(test)]
mod tests;

pub use advantages::{explained_variance, gae, normalize_advantages, GaeInput};
