//! The adversary: a policy over perturbation parameters, conditioned on a context vector
//! (task features and protagonist statistics), trained by REINFORCE with a learned baseline
//! and an entropy bonus on a scalar reward (e.g. regret, or minus the protagonist's return,
//! plus `lambda * log D(x)` from the realism discriminator).
//!
//! Each perturbation parameter is one categorical dimension whose choice 0 means "off".
//! The strength cap (at most `max_active` non-off choices) is enforced by masks: the
//! dimensions are visited in a random order and, once `max_active` are on, the remaining
//! dimensions are masked to "off". The masks used are recorded with the sample, so the
//! log-probability the update differentiates is exactly that of the sampling distribution.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use rand::seq::SliceRandom;
use rand::Rng as _;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, CheckpointError};
use crate::dist::{DistError, MultiCategorical};
use crate::nets::{Activation, ActorCritic, ActorCriticConfig, NetError};
use crate::optim::{clip_grad_norm, Adam, AdamConfig, AdamState, OptimError};
use crate::ppo::normalize_advantages;
use crate::rng::{self, Rng, RngState};
use crate::weight_init::{self, InitError};

/// Errors of the adversary.
#[derive(Debug, thiserror::Error)]
pub enum AdversaryError {
    /// A configuration value is invalid.
    #[error("adversary config: `{field}` {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// An input has the wrong size.
    #[error("adversary: `{tensor}` expected {expected} entries, got {got}")]
    Shape {
        /// The input.
        tensor: &'static str,
        /// Expected.
        expected: usize,
        /// Got.
        got: usize,
    },
    /// An input is NaN or infinite.
    #[error("adversary: `{tensor}` has non-finite value {value} at index {index}")]
    NonFinite {
        /// The input.
        tensor: &'static str,
        /// Flat index.
        index: usize,
        /// Value.
        value: f32,
    },
    /// The loss became non-finite; parameters untouched.
    #[error("adversary: loss is {0} (non-finite)")]
    NonFiniteLoss(f32),
    /// A network error.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A distribution error.
    #[error(transparent)]
    Dist(#[from] DistError),
    /// An optimiser error.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// An init error.
    #[error(transparent)]
    Init(#[from] InitError),
    /// A checkpoint error.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A candle error.
    #[error("adversary: candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Configuration of an [`Adversary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdversaryConfig {
    /// Width of the context vector.
    pub context_dim: usize,
    /// Choices per perturbation parameter; choice 0 is "off".
    pub choices: Vec<usize>,
    /// Strength cap: at most this many parameters not "off".
    pub max_active: usize,
    /// Hidden widths of the policy and baseline trunks.
    pub hidden: Vec<usize>,
    /// Trunk non-linearity.
    pub activation: Activation,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Entropy bonus coefficient.
    pub ent_coef: f64,
    /// Baseline (value) loss coefficient.
    pub vf_coef: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
    /// Normalise `reward - baseline` over each batch.
    pub norm_adv: bool,
}

impl Default for AdversaryConfig {
    fn default() -> Self {
        Self {
            context_dim: 1,
            choices: vec![2],
            max_active: 1,
            hidden: vec![64, 64],
            activation: Activation::Tanh,
            learning_rate: 3e-3,
            ent_coef: 0.01,
            vf_coef: 0.5,
            max_grad_norm: 0.5,
            norm_adv: true,
        }
    }
}

impl AdversaryConfig {
    fn validate(&self) -> Result<(), AdversaryError> {
        if let Some(i) = self.choices.iter().position(|&c| c < 2) {
            return Err(AdversaryError::InvalidConfig {
                field: "choices",
                reason: format!("parameter {i} needs at least 2 choices (\"off\" and one setting)"),
            });
        }
        for (field, v) in [
            ("learning_rate", self.learning_rate),
            ("ent_coef", self.ent_coef),
            ("vf_coef", self.vf_coef),
            ("max_grad_norm", self.max_grad_norm),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(AdversaryError::InvalidConfig {
                    field,
                    reason: format!("is {v}; must be finite and >= 0"),
                });
            }
        }
        Ok(())
    }

    fn net(&self) -> ActorCriticConfig {
        ActorCriticConfig {
            obs_dim: self.context_dim,
            action_dims: self.choices.clone(),
            hidden: self.hidden.clone(),
            activation: self.activation,
            shared_trunk: false,
        }
    }
}

/// One sampled perturbation plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdversarySample {
    /// The context it was sampled for.
    pub context: Vec<f32>,
    /// Choice per parameter (0 = off).
    pub choices: Vec<u32>,
    /// The mask used (`sum(choices)` entries, 0/1).
    pub mask: Vec<f32>,
    /// Joint log-probability under the masks.
    pub log_prob: f32,
    /// Baseline value at sampling time.
    pub baseline: f32,
}

impl AdversarySample {
    /// Number of parameters not "off".
    pub fn active(&self) -> usize {
        self.choices.iter().filter(|&&c| c != 0).count()
    }
}

/// Statistics of one adversary update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdversaryStats {
    /// `-mean(adv * log p)`.
    pub policy_loss: f32,
    /// `0.5 * mean((b - R)^2)`.
    pub value_loss: f32,
    /// Mean entropy under the recorded masks.
    pub entropy: f32,
    /// Mean reward of the batch.
    pub mean_reward: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
}

/// Checkpoint state of an adversary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdversaryState {
    /// Configuration.
    pub config: AdversaryConfig,
    /// Creation seed.
    pub seed: u64,
    /// Updates done.
    pub updates: u64,
    /// Generator position.
    pub rng: RngState,
    /// Adam state.
    pub adam: AdamState,
}

/// Checkpoint kind tag.
pub const ADVERSARY_CHECKPOINT_KIND: &str = "adversary";

/// The adversary policy with its baseline, optimiser and generator.
pub struct Adversary {
    cfg: AdversaryConfig,
    seed: u64,
    varmap: VarMap,
    net: ActorCritic,
    space: MultiCategorical,
    adam: Adam,
    rng: Rng,
    updates: u64,
}

fn host_log_softmax(logits: &[f32], mask: &[f32]) -> Vec<f32> {
    let max = logits
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m != 0.0)
        .map(|(&l, _)| l)
        .fold(f32::NEG_INFINITY, f32::max);
    let lse = logits
        .iter()
        .zip(mask)
        .filter(|(_, &m)| m != 0.0)
        .map(|(&l, _)| (l - max).exp())
        .sum::<f32>()
        .ln()
        + max;
    logits
        .iter()
        .zip(mask)
        .map(|(&l, &m)| if m != 0.0 { l - lse } else { f32::NEG_INFINITY })
        .collect()
}

impl std::fmt::Debug for Adversary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adversary")
            .field("config", &self.cfg)
            .field("seed", &self.seed)
            .field("updates", &self.updates)
            .finish_non_exhaustive()
    }
}

impl Adversary {
    /// A fresh adversary (orthogonal init; policy head gain 0.01 so it starts uniform).
    pub fn new(cfg: &AdversaryConfig, seed: u64) -> Result<Self, AdversaryError> {
        cfg.validate()?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let net = ActorCritic::new(&cfg.net(), vb)?;
        let mut rng = rng::seeded(seed);
        weight_init::apply(&varmap, &net.init_plan(), &mut rng)?;
        let space = MultiCategorical::new(&cfg.choices)?;
        let adam = Adam::new(
            &varmap,
            AdamConfig {
                lr: cfg.learning_rate,
                ..AdamConfig::default()
            },
        )?;
        Ok(Self {
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

    /// Configuration.
    pub fn config(&self) -> &AdversaryConfig {
        &self.cfg
    }

    fn check_context(&self, ctx: &[f32]) -> Result<(), AdversaryError> {
        if ctx.len() != self.cfg.context_dim {
            return Err(AdversaryError::Shape {
                tensor: "context",
                expected: self.cfg.context_dim,
                got: ctx.len(),
            });
        }
        if let Some(index) = ctx.iter().position(|x| !x.is_finite()) {
            return Err(AdversaryError::NonFinite {
                tensor: "context",
                index,
                value: ctx[index],
            });
        }
        Ok(())
    }

    fn logits_host(&self, ctx: &[f32]) -> Result<(Vec<f32>, f32), AdversaryError> {
        self.check_context(ctx)?;
        let x = Tensor::from_slice(ctx, (1, ctx.len()), &Device::Cpu)?;
        let (l, v) = self.net.forward(&x)?;
        Ok((l.squeeze(0)?.to_vec1()?, v.to_vec1::<f32>()?[0]))
    }

    /// Sample a perturbation plan for `context` under the strength cap.
    pub fn sample(&mut self, context: &[f32]) -> Result<AdversarySample, AdversaryError> {
        let width = self.space.total();
        self.sample_within(context, &vec![1.0; width], &vec![0.0; width], f32::INFINITY)
    }

    /// Sample under the strength cap, a mask of allowed choices and a budget: the
    /// dimensions are visited in a random order and each one's choices are masked to those
    /// `allowed` (flattened like the logits; "off" is always allowed) whose `costs` fit what
    /// is left of `budget`. The masks used are recorded, so the update differentiates the
    /// sampling distribution exactly.
    pub fn sample_within(
        &mut self,
        context: &[f32],
        allowed: &[f32],
        costs: &[f32],
        budget: f32,
    ) -> Result<AdversarySample, AdversaryError> {
        let (logits, baseline) = self.logits_host(context)?;
        let dims = self.space.dims().to_vec();
        let total = self.space.total();
        for (tensor, v) in [("allowed", allowed), ("costs", costs)] {
            if v.len() != total {
                return Err(AdversaryError::Shape {
                    tensor,
                    expected: total,
                    got: v.len(),
                });
            }
        }
        let mut offsets = Vec::with_capacity(dims.len());
        let mut o = 0;
        for &n in &dims {
            offsets.push(o);
            o += n;
        }
        let mut order: Vec<usize> = (0..dims.len()).collect();
        order.shuffle(&mut self.rng);
        let mut mask = vec![1f32; o];
        let mut choices = vec![0u32; dims.len()];
        let mut active = 0;
        let mut left = budget;
        let mut log_prob = 0f32;
        for d in order {
            let (off, n) = (offsets[d], dims[d]);
            for j in 1..n {
                let fits = allowed[off + j] > 0.0 && costs[off + j] <= left + 1e-6;
                if active >= self.cfg.max_active || !fits {
                    mask[off + j] = 0.0;
                }
            }
            let lp = host_log_softmax(&logits[off..off + n], &mask[off..off + n]);
            let u: f32 = self.rng.gen();
            let mut cum = 0f32;
            let mut pick = 0;
            for (j, &l) in lp.iter().enumerate() {
                if mask[off + j] == 0.0 {
                    continue;
                }
                pick = j;
                cum += l.exp();
                if u < cum {
                    break;
                }
            }
            choices[d] = pick as u32;
            log_prob += lp[pick];
            if pick != 0 {
                active += 1;
                left -= costs[off + pick];
            }
        }
        Ok(AdversarySample {
            context: context.to_vec(),
            choices,
            mask,
            log_prob,
            baseline,
        })
    }

    /// The most probable plan within the cap: each parameter's most probable choice, then
    /// only the `max_active` most confident non-off choices are kept on.
    pub fn mode(&self, context: &[f32]) -> Result<Vec<u32>, AdversaryError> {
        let (logits, _) = self.logits_host(context)?;
        let mut o = 0;
        let mut picks = Vec::with_capacity(self.space.dims().len());
        for &n in self.space.dims() {
            let lp = host_log_softmax(&logits[o..o + n], &vec![1.0; n]);
            let (j, l) = lp
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (j, &l)| if l > b.1 { (j, l) } else { b },
                );
            picks.push((j as u32, l));
            o += n;
        }
        let mut on: Vec<(usize, f32)> = picks
            .iter()
            .enumerate()
            .filter(|(_, p)| p.0 != 0)
            .map(|(d, p)| (d, p.1))
            .collect();
        on.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut out: Vec<u32> = vec![0; picks.len()];
        for &(d, _) in on.iter().take(self.cfg.max_active) {
            out[d] = picks[d].0;
        }
        Ok(out)
    }

    /// One policy-gradient step on `(sample, reward)` pairs:
    /// `loss = -mean(A * log p) - ent_coef * mean(H) + vf_coef * 0.5 * mean((b - R)^2)`,
    /// `A = R - b` (baseline detached; optionally normalised).
    pub fn update(
        &mut self,
        batch: &[(AdversarySample, f32)],
    ) -> Result<AdversaryStats, AdversaryError> {
        let b = batch.len();
        let cd = self.cfg.context_dim;
        let nd = self.space.dims().len();
        let tw = self.space.total();
        let mut ctx = Vec::with_capacity(b * cd);
        let mut acts = Vec::with_capacity(b * nd);
        let mut masks = Vec::with_capacity(b * tw);
        let mut rewards = Vec::with_capacity(b);
        for (i, (s, r)) in batch.iter().enumerate() {
            self.check_context(&s.context)?;
            if s.choices.len() != nd || s.mask.len() != tw {
                return Err(AdversaryError::Shape {
                    tensor: "sample",
                    expected: nd + tw,
                    got: s.choices.len() + s.mask.len(),
                });
            }
            if !r.is_finite() {
                return Err(AdversaryError::NonFinite {
                    tensor: "reward",
                    index: i,
                    value: *r,
                });
            }
            ctx.extend_from_slice(&s.context);
            acts.extend_from_slice(&s.choices);
            masks.extend_from_slice(&s.mask);
            rewards.push(*r);
        }
        self.space.check_mask(&masks, b)?;
        self.space.check_actions(&acts, Some(&masks))?;
        let dev = Device::Cpu;
        let x = Tensor::from_vec(ctx, (b, cd), &dev)?;
        let (logits, values) = self.net.forward(&x)?;
        let mask_t = Tensor::from_vec(masks, (b, tw), &dev)?;
        let lp = self.space.log_probs(&logits, Some(&mask_t))?;
        let logp = self
            .space
            .log_prob(&lp, &Tensor::from_vec(acts, (b, nd), &dev)?)?;
        let ent = self.space.entropy(&lp)?.mean_all()?;
        let vals: Vec<f32> = values.to_vec1()?;
        let mut adv: Vec<f32> = rewards.iter().zip(&vals).map(|(r, v)| r - v).collect();
        if self.cfg.norm_adv {
            normalize_advantages(&mut adv);
        }
        let adv_t = Tensor::from_vec(adv, b, &dev)?;
        let r_t = Tensor::from_slice(&rewards, b, &dev)?;
        let pg = (adv_t * &logp)?.mean_all()?.neg()?;
        let vl = ((&values - &r_t)?.sqr()?.mean_all()? * 0.5)?;
        let loss = ((&pg - (&ent * self.cfg.ent_coef)?)? + (&vl * self.cfg.vf_coef)?)?;
        let lv = loss.to_scalar::<f32>()?;
        if !lv.is_finite() {
            return Err(AdversaryError::NonFiniteLoss(lv));
        }
        let mut grads = loss.backward()?;
        let grad_norm = clip_grad_norm(&mut grads, self.adam.params(), self.cfg.max_grad_norm)?;
        self.adam.step(&grads, self.cfg.learning_rate)?;
        self.updates += 1;
        let stats = AdversaryStats {
            policy_loss: pg.to_scalar()?,
            value_loss: vl.to_scalar()?,
            entropy: ent.to_scalar()?,
            mean_reward: rewards.iter().sum::<f32>() / b.max(1) as f32,
            grad_norm,
        };
        tracing::debug!(
            update = self.updates,
            policy_loss = stats.policy_loss,
            value_loss = stats.value_loss,
            entropy = stats.entropy,
            mean_reward = stats.mean_reward,
            "adversary update"
        );
        Ok(stats)
    }

    /// Full state for checkpoints.
    pub fn state(&self) -> Result<AdversaryState, AdversaryError> {
        Ok(AdversaryState {
            config: self.cfg.clone(),
            seed: self.seed,
            updates: self.updates,
            rng: RngState::capture(&self.rng),
            adam: self.adam.state()?,
        })
    }

    /// Write `<prefix>.safetensors` and `<prefix>.state`.
    pub fn save(&self, prefix: &Path) -> Result<(), AdversaryError> {
        checkpoint::save(
            prefix,
            ADVERSARY_CHECKPOINT_KIND,
            &self.varmap,
            &self.state()?,
        )?;
        Ok(())
    }

    /// Rebuild from [`Self::save`]'s files.
    pub fn load(prefix: &Path) -> Result<Self, AdversaryError> {
        let st: AdversaryState = checkpoint::load_state(prefix, ADVERSARY_CHECKPOINT_KIND)?;
        checkpoint::check_numel(prefix, st.config.net().num_params())?;
        let mut a = Self::new(&st.config, st.seed)?;
        checkpoint::load_weights(prefix, &a.varmap)?;
        a.adam.load_state(&st.adam)?;
        a.rng = st.rng.restore();
        a.updates = st.updates;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AdversaryConfig {
        AdversaryConfig {
            context_dim: 2,
            choices: vec![3, 3, 3, 2],
            max_active: 2,
            hidden: vec![16],
            ..Default::default()
        }
    }

    #[test]
    fn cap_is_never_exceeded_and_masks_match_choices() {
        // Near-uniform start: without the cap, 3 or 4 of the 4 parameters would be on in
        // about 60% of the samples.
        let mut a = Adversary::new(&cfg(), 0).unwrap();
        let mut capped = 0;
        for _ in 0..300 {
            let s = a.sample(&[1.0, 0.0]).unwrap();
            assert!(s.active() <= 2, "{:?}", s.choices);
            let mut o = 0;
            for (d, &n) in [3usize, 3, 3, 2].iter().enumerate() {
                // The chosen index is allowed by the recorded mask; "off" always is.
                assert_eq!(s.mask[o + s.choices[d] as usize], 1.0);
                assert_eq!(s.mask[o], 1.0);
                // A parameter is either fully open or, visited after the cap, off-only.
                let settings = &s.mask[o + 1..o + n];
                let off_only = settings.iter().all(|&m| m == 0.0);
                assert!(off_only || settings.iter().all(|&m| m == 1.0));
                if off_only {
                    assert_eq!(s.choices[d], 0);
                    capped += 1;
                }
                o += n;
            }
        }
        assert!(capped > 100, "the cap was hit only {capped} times");
    }

    #[test]
    fn sampled_log_prob_matches_the_update_distribution() {
        let mut a = Adversary::new(&cfg(), 1).unwrap();
        let s = a.sample(&[0.3, -0.2]).unwrap();
        let x = Tensor::from_slice(&s.context, (1, 2), &Device::Cpu).unwrap();
        let (l, _) = a.net.forward(&x).unwrap();
        let m = Tensor::from_slice(&s.mask, (1, 11), &Device::Cpu).unwrap();
        let lp = a.space.log_probs(&l, Some(&m)).unwrap();
        let acts = Tensor::from_slice(&s.choices, (1, 4), &Device::Cpu).unwrap();
        let want = a
            .space
            .log_prob(&lp, &acts)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0];
        assert!((want - s.log_prob).abs() < 1e-5, "{want} vs {}", s.log_prob);
    }

    #[test]
    fn bad_inputs_are_named() {
        let mut a = Adversary::new(&cfg(), 2).unwrap();
        let e = a.sample(&[1.0]).unwrap_err().to_string();
        assert!(e.contains("`context`"), "{e}");
        let s = a.sample(&[1.0, 0.0]).unwrap();
        let e = a.update(&[(s, f32::NAN)]).unwrap_err().to_string();
        assert!(e.contains("`reward`"), "{e}");
        let bad = AdversaryConfig {
            choices: vec![3, 1],
            ..cfg()
        };
        assert!(Adversary::new(&bad, 0)
            .unwrap_err()
            .to_string()
            .contains("parameter 1"));
    }
}
