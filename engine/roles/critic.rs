//! `actors::roles::Critic` over `policies::discriminator`: the realism critic of self-play.
//! A level's plan (task dropped, as [`crate::realism`] measures generated instances) is
//! synthesized, started and fingerprinted; the classifier sees the same scaled features as
//! `engine fingerprint auc` and learns the shipped real set (label real) against the levels
//! the adversaries proposed (label generated). `realism` returns `log D` per level.
//!
//! A fixed fifth of the real set (drawn with [`HOLD_OUT_SEED`]) is never trained on. Each
//! `learn` first measures the critic as it stands on held-out data: the held-out real
//! systems against the newest levels, which it has not trained on yet (`auc_held_out` in
//! its statistics); then it trains with them.

use crate::instance::Plan;
use crate::realism::{self, Scaler};
use crate::roles::{FaultSpace, RolesError};
use crate::synth::Cache;
use actors::msg::{LearnStats, Level};
use actors::roles::{Critic, RoleError};
use policies::discriminator::{log_sigmoid, Discriminator, DiscriminatorConfig};
use sandbox::Runtime;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

const ROLE: &str = "critic";
/// Generated levels kept for learning at most (the newest).
const MAX_GENERATED: usize = 1024;
/// Measured levels remembered at most (a level's fingerprint does not change).
const MAX_MEMO: usize = 8192;
/// Seeds the split of the real set into trained and held-out systems.
pub const HOLD_OUT_SEED: u64 = 0x05ee_da0c;

/// `log D` of a logit, clamped at [`LOG_D_FLOOR`], where the label smoothing puts its optimum on
/// generated levels: a level unlike any the critic saw cannot cost more.
fn log_d(z: f32) -> f64 {
    f64::from(log_sigmoid(z)).max(LOG_D_FLOOR)
}

/// The lowest `log D` a level scores: `ln(0.05)` (about -3.0), the optimum of the smoothed loss
/// (smoothing 0.1) on generated levels. With `lambda` 0.1 realism costs at most about 0.3.
pub const LOG_D_FLOOR: f64 = -2.995_732_273_553_991;
/// Share of the real set held out from training, for the held-out AUC.
const HOLD_OUT_SHARE: f64 = 0.2;

/// How the critic trains.
#[derive(Debug, Clone, PartialEq)]
pub struct CriticSettings {
    pub hidden: Vec<usize>,
    pub learning_rate: f64,
    /// Passes over the real set and the kept generated levels at each `learn`.
    pub epochs: usize,
    pub batch: usize,
}

impl Default for CriticSettings {
    fn default() -> Self {
        Self {
            hidden: vec![32, 32],
            learning_rate: 1e-3,
            epochs: 20,
            batch: 16,
        }
    }
}

pub struct RealismCritic {
    rt: Runtime,
    cache: Cache,
    space: Arc<FaultSpace>,
    settings: CriticSettings,
    disc: Discriminator,
    /// Statistics of the real set (fixed, so scores stay comparable across updates).
    scaler: Scaler,
    /// The real set's trained part, scaled, row-major.
    real: Vec<f32>,
    /// The held-out real systems, scaled, one row each.
    held_out: Vec<Vec<f32>>,
    /// Scaled rows of the kept generated levels.
    generated: VecDeque<Vec<f32>>,
    /// Scaled row of each measured level; `None` when its plan does not apply.
    memo: HashMap<Level, Option<Vec<f32>>>,
}

/// The generated rows the critic keeps, in its checkpoint.
const GENERATED: &str = "generated.json";

impl RealismCritic {
    pub fn new(
        rt: Runtime,
        cache: Cache,
        space: Arc<FaultSpace>,
        settings: CriticSettings,
        seed: u64,
    ) -> Result<Self, RoleError> {
        let real_set = realism::real_set().map_err(|e| RoleError::wrap(ROLE, e))?;
        let rows: Vec<Vec<f32>> = real_set
            .iter()
            .map(|(_, f)| realism::realism_vector(f))
            .collect();
        let (train, held) = split(rows);
        let refs: Vec<&[f32]> = train.iter().map(|r| r.as_slice()).collect();
        let scaler = Scaler::fit(&refs);
        let mut real = Vec::new();
        for r in &train {
            scaler.apply(r, &mut real);
        }
        let held_out = held
            .iter()
            .map(|r| {
                let mut out = Vec::new();
                scaler.apply(r, &mut out);
                out
            })
            .collect();
        let cfg = DiscriminatorConfig {
            input_dim: realism::feature_names().len(),
            hidden: settings.hidden.clone(),
            learning_rate: settings.learning_rate,
            ..DiscriminatorConfig::default()
        };
        let disc = Discriminator::new(&cfg, seed).map_err(|e| RoleError::wrap(ROLE, e))?;
        Ok(Self {
            rt,
            cache,
            space,
            settings,
            disc,
            scaler,
            real,
            held_out,
            generated: VecDeque::new(),
            memo: HashMap::new(),
        })
    }

    /// Go on from what [`Critic::save`] wrote under `dir` (a resumed run): the
    /// discriminator with its optimiser, and the generated levels it keeps learning from.
    pub fn resume_from(&mut self, dir: &Path) -> Result<(), RolesError> {
        let disc = Discriminator::load(&dir.join("critic"))
            .map_err(|e| RolesError::checkpoint(dir, e.to_string()))?;
        if disc.config().input_dim != realism::feature_names().len() {
            return Err(RolesError::checkpoint(
                dir,
                "the critic was trained on another feature set",
            ));
        }
        self.generated = super::read_state(dir, GENERATED)?;
        self.disc = disc;
        Ok(())
    }

    /// The plan the critic measures for a level: the level's, without its task.
    fn plan(&self, level: &Level) -> Plan {
        let mut plan = self.space.plan(level);
        plan.task = None;
        plan
    }

    fn row(&mut self, level: &Level) -> Result<Option<Vec<f32>>, RoleError> {
        if let Some(r) = self.memo.get(level) {
            return Ok(r.clone());
        }
        let plan = self.plan(level);
        let fp = realism::measure_plan(&self.rt, &self.cache, &plan)
            .map_err(|e| RoleError::wrap(ROLE, e))?;
        let row = fp.map(|fp| {
            let mut out = Vec::new();
            self.scaler.apply(&realism::realism_vector(&fp), &mut out);
            out
        });
        if self.memo.len() >= MAX_MEMO {
            self.memo.clear();
        }
        self.memo.insert(level.clone(), row.clone());
        Ok(row)
    }
}

impl RealismCritic {
    /// The AUC of the critic's `D` (real = positive) on the held-out real systems against
    /// `generated` rows; NaN when there are none.
    fn auc(&self, generated: &[Vec<f32>]) -> Result<f64, RoleError> {
        let score = |rows: &[Vec<f32>]| -> Result<Vec<f32>, RoleError> {
            rows.iter()
                .map(|r| {
                    self.disc
                        .logits(r)
                        .map(|z| z[0])
                        .map_err(|e| RoleError::wrap(ROLE, e))
                })
                .collect()
        };
        let (pos, neg) = (score(&self.held_out)?, score(generated)?);
        Ok(policies::discriminator::auc(&pos, &neg).unwrap_or(f64::NAN))
    }
}

/// The real set's rows split into `(trained, held out)`: a fixed shuffle, a fifth held out
/// (at least one when there are two or more).
fn split(mut rows: Vec<Vec<f32>>) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    rows.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(HOLD_OUT_SEED));
    let n = if rows.len() >= 2 {
        ((rows.len() as f64 * HOLD_OUT_SHARE).round() as usize).max(1)
    } else {
        0
    };
    let held = rows.split_off(rows.len() - n);
    (rows, held)
}

impl Critic for RealismCritic {
    /// `log D` per level; 0 for a level whose plan does not apply (it scores as unusable in
    /// the adversary's reward anyway).
    fn realism(&mut self, levels: &[Level]) -> Result<Vec<f64>, RoleError> {
        let mut out = Vec::with_capacity(levels.len());
        for l in levels {
            let v = match self.row(l)? {
                Some(row) => {
                    let z = self
                        .disc
                        .logits(&row)
                        .map_err(|e| RoleError::wrap(ROLE, e))?;
                    log_d(z[0])
                }
                None => 0.0,
            };
            out.push(v);
        }
        Ok(out)
    }

    fn learn(&mut self, generated: &[Level]) -> Result<LearnStats, RoleError> {
        let mut newest = Vec::new();
        for l in generated {
            if let Some(row) = self.row(l)? {
                newest.push(row);
            }
        }
        // Before training on them: held-out real systems against the newest levels.
        let auc_held_out = self.auc(&newest)?;
        for row in newest {
            self.generated.push_back(row);
            if self.generated.len() > MAX_GENERATED {
                self.generated.pop_front();
            }
        }
        if self.generated.is_empty() {
            return Ok(LearnStats {
                values: vec![("auc_held_out".into(), auc_held_out)],
            });
        }
        let fake: Vec<f32> = self.generated.iter().flatten().copied().collect();
        let st = self
            .disc
            .fit(&self.real, &fake, self.settings.epochs, self.settings.batch)
            .map_err(|e| RoleError::wrap(ROLE, e))?;
        tracing::debug!(
            loss = st.loss,
            kept = self.generated.len(),
            auc_held_out,
            "critic learned"
        );
        Ok(LearnStats {
            values: vec![
                ("loss".into(), f64::from(st.loss)),
                ("acc_real".into(), f64::from(st.acc_real)),
                ("acc_fake".into(), f64::from(st.acc_fake)),
                ("generated".into(), self.generated.len() as f64),
                ("auc_held_out".into(), auc_held_out),
            ],
        })
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        self.disc
            .save(&dir.join("critic"))
            .map_err(|e| RoleError::wrap(ROLE, e))?;
        super::write_state(ROLE, dir, GENERATED, &self.generated)
    }
}

#[cfg(test)]
mod log_d_tests {
    use super::*;

    #[test]
    fn log_d_is_floored_where_the_smoothed_loss_settles() {
        assert!((log_d(0.0) - 0.5f64.ln()).abs() < 1e-6);
        assert_eq!(log_d(-100.0), LOG_D_FLOOR);
        assert!((LOG_D_FLOOR - 0.05f64.ln()).abs() < 1e-12);
        assert!(log_d(5.0) > -0.01);
    }
}
