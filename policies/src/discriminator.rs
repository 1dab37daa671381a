//! The realism discriminator: an MLP classifier of environment fingerprint vectors, real
//! (label 1) versus synthesized (label 0), trained with binary cross-entropy on logits and
//! label smoothing (`y' = y (1 - eps) + eps / 2`). [`Discriminator::log_d`] returns
//! `log D(x) = log sigmoid(logit)` (computed stably), the realism term of the adversary's
//! reward.

use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, CheckpointError};
use crate::nets::{Activation, InitLinear, Mlp, MlpConfig, NetError, VALUE_HEAD_GAIN};
use crate::optim::{clip_grad_norm, Adam, AdamConfig, AdamState, OptimError};
use crate::rng::{self, Rng, RngState};
use crate::weight_init::{self, InitError};

/// Errors of the discriminator.
#[derive(Debug, thiserror::Error)]
pub enum DiscriminatorError {
    /// A configuration value is invalid.
    #[error("discriminator config: `{field}` {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// An input has the wrong size.
    #[error(
        "discriminator: `{tensor}` has {got} values, not a non-empty multiple of input_dim {dim}"
    )]
    Shape {
        /// The input.
        tensor: &'static str,
        /// `input_dim`.
        dim: usize,
        /// Length received.
        got: usize,
    },
    /// An input is NaN or infinite.
    #[error("discriminator: `{tensor}` row {row} feature {col} is {value} (non-finite)")]
    NonFinite {
        /// The input.
        tensor: &'static str,
        /// Row.
        row: usize,
        /// Feature.
        col: usize,
        /// Value.
        value: f32,
    },
    /// The loss became non-finite; parameters untouched.
    #[error("discriminator: loss is {0} (non-finite)")]
    NonFiniteLoss(f32),
    /// A network error.
    #[error(transparent)]
    Net(#[from] NetError),
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
    #[error("discriminator: candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Configuration of a [`Discriminator`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscriminatorConfig {
    /// Fingerprint width.
    pub input_dim: usize,
    /// Hidden widths.
    pub hidden: Vec<usize>,
    /// Non-linearity.
    pub activation: Activation,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Label smoothing `eps` in `[0, 1)`: targets `1 - eps/2` (real) and `eps/2` (fake).
    pub label_smoothing: f64,
    /// Global gradient-norm clip.
    pub max_grad_norm: f64,
}

impl DiscriminatorConfig {
    fn mlp(&self) -> MlpConfig {
        MlpConfig {
            input_dim: self.input_dim,
            hidden: self.hidden.clone(),
            activation: self.activation,
        }
    }

    /// Number of scalar parameters (`None` on overflow).
    pub fn num_params(&self) -> Option<usize> {
        let m = self.mlp();
        m.num_params()?
            .checked_add(crate::nets::linear_params(m.output_dim(), 1)?)
    }
}

impl Default for DiscriminatorConfig {
    fn default() -> Self {
        Self {
            input_dim: 1,
            hidden: vec![64, 64],
            activation: Activation::Relu,
            learning_rate: 1e-3,
            label_smoothing: 0.1,
            max_grad_norm: 1.0,
        }
    }
}

/// Statistics of one training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscriminatorStats {
    /// Smoothed BCE.
    pub loss: f32,
    /// Fraction of real samples with `D > 0.5`.
    pub acc_real: f32,
    /// Fraction of fake samples with `D < 0.5`.
    pub acc_fake: f32,
}

/// Checkpoint state of a discriminator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscriminatorState {
    /// Configuration.
    pub config: DiscriminatorConfig,
    /// Creation seed.
    pub seed: u64,
    /// Steps done.
    pub steps: u64,
    /// Generator position.
    pub rng: RngState,
    /// Adam state.
    pub adam: AdamState,
}

/// Checkpoint kind tag.
pub const DISCRIMINATOR_CHECKPOINT_KIND: &str = "discriminator";

/// Real-vs-synthesized classifier.
pub struct Discriminator {
    cfg: DiscriminatorConfig,
    seed: u64,
    varmap: VarMap,
    trunk: Mlp,
    head: InitLinear,
    adam: Adam,
    rng: Rng,
    steps: u64,
}

/// Area under the ROC curve: the probability that a random positive scores above a random
/// negative (ties count one half). `None` if either side is empty.
pub fn auc(pos: &[f32], neg: &[f32]) -> Option<f64> {
    if pos.is_empty() || neg.is_empty() {
        return None;
    }
    let mut all: Vec<(f32, bool)> = pos
        .iter()
        .map(|&s| (s, true))
        .chain(neg.iter().map(|&s| (s, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Mann-Whitney U with mid-ranks for ties.
    let mut rank_sum = 0f64;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let mid = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += mid * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let (np, nn) = (pos.len() as f64, neg.len() as f64);
    Some((rank_sum - np * (np + 1.0) / 2.0) / (np * nn))
}

impl std::fmt::Debug for Discriminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discriminator")
            .field("config", &self.cfg)
            .field("seed", &self.seed)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Discriminator {
    /// A fresh classifier.
    pub fn new(cfg: &DiscriminatorConfig, seed: u64) -> Result<Self, DiscriminatorError> {
        if !(0.0..1.0).contains(&cfg.label_smoothing) {
            return Err(DiscriminatorError::InvalidConfig {
                field: "label_smoothing",
                reason: "must be in [0, 1)".into(),
            });
        }
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let mcfg = cfg.mlp();
        let trunk = Mlp::new(&mcfg, vb.pp("trunk"))?;
        let head = InitLinear::new(mcfg.output_dim(), 1, VALUE_HEAD_GAIN, vb.pp("head"))?;
        let mut rng = rng::seeded(seed);
        let mut plan = trunk.init_plan();
        plan.extend(head.init_plan());
        weight_init::apply(&varmap, &plan, &mut rng)?;
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
            trunk,
            head,
            adam,
            rng,
            steps: 0,
        })
    }

    /// Configuration.
    pub fn config(&self) -> &DiscriminatorConfig {
        &self.cfg
    }

    fn input(&self, tensor: &'static str, x: &[f32]) -> Result<Tensor, DiscriminatorError> {
        let d = self.cfg.input_dim;
        if x.is_empty() || x.len() % d != 0 {
            return Err(DiscriminatorError::Shape {
                tensor,
                dim: d,
                got: x.len(),
            });
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(DiscriminatorError::NonFinite {
                tensor,
                row: i / d,
                col: i % d,
                value: x[i],
            });
        }
        Ok(Tensor::from_slice(x, (x.len() / d, d), &Device::Cpu)?)
    }

    fn logits_t(&self, x: &Tensor) -> Result<Tensor, DiscriminatorError> {
        Ok(self.head.forward(&self.trunk.forward(x)?)?.squeeze(1)?)
    }

    /// Logits (`[B]`) for row-major fingerprints `[B, input_dim]`.
    pub fn logits(&self, x: &[f32]) -> Result<Vec<f32>, DiscriminatorError> {
        let t = self.input("fingerprints", x)?;
        Ok(self.logits_t(&t)?.to_vec1()?)
    }

    /// `log D(x)` per row, `D` = probability of "real": `-softplus(-logit)`, stable for
    /// any logit.
    pub fn log_d(&self, x: &[f32]) -> Result<Vec<f32>, DiscriminatorError> {
        Ok(self.logits(x)?.into_iter().map(log_sigmoid).collect())
    }

    /// One Adam step on a batch of real and fake fingerprints (row-major).
    pub fn train_step(
        &mut self,
        real: &[f32],
        fake: &[f32],
    ) -> Result<DiscriminatorStats, DiscriminatorError> {
        let xr = self.input("real", real)?;
        let xf = self.input("fake", fake)?;
        let (nr, nf) = (xr.dims()[0], xf.dims()[0]);
        let x = Tensor::cat(&[&xr, &xf], 0)?;
        let eps = self.cfg.label_smoothing;
        let mut y = vec![(1.0 - eps / 2.0) as f32; nr];
        y.extend(std::iter::repeat_n((eps / 2.0) as f32, nf));
        let y = Tensor::from_vec(y, nr + nf, &Device::Cpu)?;
        let z = self.logits_t(&x)?;
        let loss = bce_with_logits(&z, &y)?;
        let lv = loss.to_scalar::<f32>()?;
        if !lv.is_finite() {
            return Err(DiscriminatorError::NonFiniteLoss(lv));
        }
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, self.adam.params(), self.cfg.max_grad_norm)?;
        self.adam.step(&grads, self.cfg.learning_rate)?;
        self.steps += 1;
        let zs: Vec<f32> = z.to_vec1()?;
        let acc_real = zs[..nr].iter().filter(|&&v| v > 0.0).count() as f32 / nr as f32;
        let acc_fake = zs[nr..].iter().filter(|&&v| v < 0.0).count() as f32 / nf as f32;
        tracing::trace!(
            step = self.steps,
            loss = lv,
            acc_real,
            acc_fake,
            "discriminator step"
        );
        Ok(DiscriminatorStats {
            loss: lv,
            acc_real,
            acc_fake,
        })
    }

    /// `epochs` passes over shuffled minibatches of `batch` real and `batch` fake rows.
    pub fn fit(
        &mut self,
        real: &[f32],
        fake: &[f32],
        epochs: usize,
        batch: usize,
    ) -> Result<DiscriminatorStats, DiscriminatorError> {
        if epochs == 0 || batch == 0 {
            return Err(DiscriminatorError::InvalidConfig {
                field: "epochs/batch",
                reason: "fit needs at least one epoch and a batch of at least one row".into(),
            });
        }
        let d = self.cfg.input_dim;
        self.input("real", real)?;
        self.input("fake", fake)?;
        let mut ri: Vec<usize> = (0..real.len() / d).collect();
        let mut fi: Vec<usize> = (0..fake.len() / d).collect();
        let mut last = DiscriminatorStats {
            loss: f32::NAN,
            acc_real: 0.0,
            acc_fake: 0.0,
        };
        for _ in 0..epochs {
            ri.shuffle(&mut self.rng);
            fi.shuffle(&mut self.rng);
            let steps = ri.len().max(fi.len()).div_ceil(batch);
            for s in 0..steps {
                let rows = |idx: &[usize], src: &[f32]| -> Vec<f32> {
                    (0..batch)
                        .flat_map(|k| {
                            let i = idx[(s * batch + k) % idx.len()];
                            src[i * d..(i + 1) * d].iter().copied()
                        })
                        .collect()
                };
                last = self.train_step(&rows(&ri, real), &rows(&fi, fake))?;
            }
        }
        Ok(last)
    }

    /// Full state for checkpoints.
    pub fn state(&self) -> Result<DiscriminatorState, DiscriminatorError> {
        Ok(DiscriminatorState {
            config: self.cfg.clone(),
            seed: self.seed,
            steps: self.steps,
            rng: RngState::capture(&self.rng),
            adam: self.adam.state()?,
        })
    }

    /// Write `<prefix>.safetensors` and `<prefix>.state`.
    pub fn save(&self, prefix: &Path) -> Result<(), DiscriminatorError> {
        checkpoint::save(
            prefix,
            DISCRIMINATOR_CHECKPOINT_KIND,
            &self.varmap,
            &self.state()?,
        )?;
        Ok(())
    }

    /// Rebuild from [`Self::save`]'s files.
    pub fn load(prefix: &Path) -> Result<Self, DiscriminatorError> {
        let st: DiscriminatorState = checkpoint::load_state(prefix, DISCRIMINATOR_CHECKPOINT_KIND)?;
        checkpoint::check_numel(prefix, st.config.num_params())?;
        let mut d = Self::new(&st.config, st.seed)?;
        checkpoint::load_weights(prefix, &d.varmap)?;
        d.adam.load_state(&st.adam)?;
        d.rng = st.rng.restore();
        d.steps = st.steps;
        Ok(d)
    }
}

/// `log sigmoid(z) = -(max(-z, 0) + ln(1 + exp(-|z|)))`.
pub fn log_sigmoid(z: f32) -> f32 {
    -((-z).max(0.0) + (-z.abs()).exp().ln_1p())
}

/// Mean of `max(z, 0) - z y + ln(1 + exp(-|z|))` (BCE on logits, stable).
pub fn bce_with_logits(z: &Tensor, y: &Tensor) -> Result<Tensor, candle_core::Error> {
    let softplus_neg_abs = (z.abs()?.neg()?.exp()? + 1.0)?.log()?;
    ((z.relu()? - (z * y)?)? + softplus_neg_abs)?.mean_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_hand_values() {
        assert_eq!(auc(&[3.0, 4.0], &[1.0, 2.0]), Some(1.0));
        assert_eq!(auc(&[1.0, 2.0], &[3.0, 4.0]), Some(0.0));
        // pairs: (2 vs 1) win, (2 vs 3) loss, (4 vs 1) win, (4 vs 3) win -> 3/4
        assert_eq!(auc(&[2.0, 4.0], &[1.0, 3.0]), Some(0.75));
        assert_eq!(auc(&[1.0], &[1.0]), Some(0.5));
        assert_eq!(auc(&[], &[1.0]), None);
    }

    #[test]
    fn bce_and_log_sigmoid_hand_values() {
        let z = Tensor::from_slice(&[0.0f32, 2.0], 2, &Device::Cpu).unwrap();
        let y = Tensor::from_slice(&[1.0f32, 0.0], 2, &Device::Cpu).unwrap();
        // -ln(0.5) = ln 2; -ln(1 - sigmoid(2)) = 2 + ln(1 + e^-2) = 2.126928
        let l = bce_with_logits(&z, &y).unwrap().to_scalar::<f32>().unwrap();
        assert!(
            (l - (std::f32::consts::LN_2 + 2.126_928) / 2.0).abs() < 1e-5,
            "{l}"
        );
        assert!((log_sigmoid(0.0) - 0.5f32.ln()).abs() < 1e-7);
        assert!((log_sigmoid(-100.0) + 100.0).abs() < 1e-4);
        assert!(log_sigmoid(100.0) <= 0.0 && log_sigmoid(100.0) > -1e-6);
    }

    #[test]
    fn nan_fingerprint_is_named() {
        let d = Discriminator::new(
            &DiscriminatorConfig {
                input_dim: 2,
                hidden: vec![4],
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let e = d.log_d(&[0.0, 1.0, f32::NAN, 0.0]).unwrap_err().to_string();
        assert!(e.contains("row 1") && e.contains("feature 0"), "{e}");
        let e = d.log_d(&[0.0, 1.0, 2.0]).unwrap_err().to_string();
        assert!(e.contains("input_dim 2"), "{e}");
    }
}
