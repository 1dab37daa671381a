//! `actors::roles::Synthesizer` over the learned adversary of `policies`: one categorical
//! per fault family ("off" and the template's settings), sampled under the level space's
//! masks and budget (the masks used are recorded, so REINFORCE differentiates exactly the
//! sampling distribution), conditioned on a context ([`AdversaryRole::context`]): the task (one
//! of the factory's tasks, one-hot), the budget it proposes under (a share of the space's, as
//! the budget schedule sets it), and the protagonist's recent success overall and on levels
//! with each family switched on (exponential moving averages).

use super::{read_state, write_state, RolesError};
use actors::msg::{EpisodeOutcome, LearnStats, Level, Proposal};
use actors::roles::{RoleError, Synthesizer};
use actors::space::LevelSpace;
use policies::adversary::{Adversary, AdversaryConfig, AdversarySample};
use rand::SeedableRng;
use std::collections::HashMap;
use std::path::Path;

const ROLE: &str = "adversary";
/// Proposals kept for learning at most (the newest).
const MAX_PENDING: usize = 4096;
/// Weight of a new episode in the success averages.
const EMA: f32 = 0.05;

/// The adversary's own settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdversarySettings {
    pub hidden: Vec<usize>,
    pub learning_rate: f64,
    pub ent_coef: f64,
    /// At most this many faults at once (besides the budget).
    pub max_active: usize,
    /// The task the levels are of (its one-hot is part of the context).
    pub task: String,
}

/// The task's features in the context: one-hot over the factory's tasks.
fn task_features(task: &str) -> Vec<f32> {
    crate::tasks::names()
        .iter()
        .map(|n| f32::from(u8::from(*n == task)))
        .collect()
}

/// The context's length over `space`: bias, task one-hot, budget share, success overall and
/// per dimension.
fn context_dim(space: &LevelSpace) -> usize {
    3 + crate::tasks::names().len() + space.dims.len()
}

/// The role's own state beside the adversary's weights (`role.json`).
#[derive(serde::Serialize, serde::Deserialize)]
struct RoleState {
    rng: rand_chacha::ChaCha8Rng,
    token: u64,
    success: Vec<f32>,
}

const ROLE_STATE: &str = "role.json";

pub struct AdversaryRole {
    adv: Adversary,
    space: LevelSpace,
    mask: Vec<f32>,
    costs: Vec<f32>,
    rng: rand_chacha::ChaCha8Rng,
    token: u64,
    pending: HashMap<u64, AdversarySample>,
    /// Recent success overall, then per dimension.
    success: Vec<f32>,
    task: Vec<f32>,
}

impl AdversaryRole {
    pub fn new(space: &LevelSpace, s: &AdversarySettings, seed: u64) -> Result<Self, RolesError> {
        let cfg = AdversaryConfig {
            context_dim: context_dim(space),
            choices: space.choices(),
            max_active: s.max_active,
            hidden: s.hidden.clone(),
            learning_rate: s.learning_rate,
            ent_coef: s.ent_coef,
            ..AdversaryConfig::default()
        };
        let st = RoleState {
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xad7e),
            token: 0,
            success: vec![0.5; 1 + space.dims.len()],
        };
        Ok(Self::with(Adversary::new(&cfg, seed)?, space, st, &s.task))
    }

    fn with(adv: Adversary, space: &LevelSpace, st: RoleState, task: &str) -> Self {
        Self {
            adv,
            space: space.clone(),
            mask: space.mask(),
            costs: space
                .dims
                .iter()
                .flat_map(|d| d.cost.iter().map(|&c| c as f32))
                .collect(),
            rng: st.rng,
            token: st.token,
            pending: HashMap::new(),
            success: st.success,
            task: task_features(task),
        }
    }

    /// The adversary saved under `dir` (by [`Synthesizer::save`]) over `space`; a
    /// checkpoint of another level space or other settings is refused.
    pub fn load(dir: &Path, space: &LevelSpace, s: &AdversarySettings) -> Result<Self, RolesError> {
        let adv = Adversary::load(&dir.join("adversary"))?;
        let c = adv.config();
        if c.choices != space.choices() || c.context_dim != context_dim(space) {
            return Err(RolesError::checkpoint(
                dir,
                format!(
                    "the adversary chooses among {:?} from a context of {} there, this run's \
                     level space has {:?} and a context of {}",
                    c.choices,
                    c.context_dim,
                    space.choices(),
                    context_dim(space)
                ),
            ));
        }
        if c.hidden != s.hidden || c.max_active != s.max_active {
            return Err(RolesError::checkpoint(
                dir,
                "the adversary's settings differ from this run's",
            ));
        }
        let st: RoleState = read_state(dir, ROLE_STATE)?;
        if st.success.len() != 1 + space.dims.len() {
            return Err(RolesError::checkpoint(
                dir,
                format!(
                    "{ROLE_STATE}: {} success averages for {} dimensions",
                    st.success.len(),
                    space.dims.len()
                ),
            ));
        }
        Ok(Self::with(adv, space, st, &s.task))
    }

    /// What the adversary conditions on when it proposes under `budget`: a bias, the task
    /// (one-hot), the budget's share of the space's own, and the protagonist's recent success
    /// overall and per dimension.
    fn context(&self, budget: f32) -> Vec<f32> {
        let mut c = Vec::with_capacity(2 + self.task.len() + self.success.len());
        c.push(1.0);
        c.extend_from_slice(&self.task);
        c.push(budget / (self.space.budget as f32).max(f32::MIN_POSITIVE));
        c.extend_from_slice(&self.success);
        c
    }
}

impl Synthesizer for AdversaryRole {
    fn propose(&mut self, n: usize, budget: f64) -> Result<Vec<Proposal>, RoleError> {
        // The budget schedule's value, never above the space's own.
        let budget = budget.min(self.space.budget) as f32;
        let ctx = self.context(budget);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let s = self
                .adv
                .sample_within(&ctx, &self.mask, &self.costs, budget)
                .map_err(|e| RoleError::wrap(ROLE, e))?;
            let level = Level {
                seed: self.space.seed(&mut self.rng),
                choices: s.choices.clone(),
            };
            self.token += 1;
            self.pending.insert(self.token, s);
            if self.pending.len() > MAX_PENDING {
                // Proposals never scored (a phase whose episodes all failed) are forgotten.
                let oldest = self.token.saturating_sub(MAX_PENDING as u64);
                self.pending.retain(|&t, _| t > oldest);
            }
            out.push(Proposal {
                level,
                token: self.token,
            });
        }
        Ok(out)
    }

    fn observe(&mut self, outcomes: &[EpisodeOutcome]) -> Result<(), RoleError> {
        for o in outcomes
            .iter()
            .filter(|o| o.counted() && o.agent == "protagonist")
        {
            let y = if o.success { 1.0 } else { 0.0 };
            self.success[0] += EMA * (y - self.success[0]);
            for (d, &c) in o.level.choices.iter().enumerate() {
                if c != 0 {
                    if let Some(s) = self.success.get_mut(1 + d) {
                        *s += EMA * (y - *s);
                    }
                }
            }
        }
        Ok(())
    }

    fn learn(&mut self, scored: &[(Proposal, f64)]) -> Result<LearnStats, RoleError> {
        let batch: Vec<(AdversarySample, f32)> = scored
            .iter()
            .filter_map(|(p, r)| self.pending.remove(&p.token).map(|s| (s, *r as f32)))
            .collect();
        // Proposals that were never scored (an infrastructure failure) are forgotten.
        self.pending.clear();
        if batch.is_empty() {
            return Ok(LearnStats::default());
        }
        let st = self
            .adv
            .update(&batch)
            .map_err(|e| RoleError::wrap(ROLE, e))?;
        Ok(LearnStats {
            values: vec![
                ("mean_reward".into(), f64::from(st.mean_reward)),
                ("policy_loss".into(), f64::from(st.policy_loss)),
                ("entropy".into(), f64::from(st.entropy)),
                ("batch".into(), batch.len() as f64),
            ],
        })
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        self.adv
            .save(&dir.join("adversary"))
            .map_err(|e| RoleError::wrap(ROLE, e))?;
        let st = RoleState {
            rng: self.rng.clone(),
            token: self.token,
            success: self.success.clone(),
        };
        write_state(ROLE, dir, ROLE_STATE, &st)
    }
}
