//! The `[selfplay]` table: which schedule trains the protagonist (`method`), the adversary
//! population, the level space's budget and costs, the curriculum, checkpoints. The
//! protagonist's PPO settings, its step budget, the training task seeds and the held-out
//! levels are `[training]`'s (`total_steps`, `num_envs`, `num_steps`, `train_levels`,
//! `eval_levels`, ...); the level space is `environment.template`'s perturbation space.

use super::config::{Experiment, Training};
use super::ExperimentError;
use actors::schedule::{Method, ScheduleConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelfPlay {
    /// clean | dr | rarl | paired | plr | accel | sfl
    pub method: String,
    /// Adversaries in the population (RARL, PAIRED).
    pub population: usize,
    /// RARL: protagonist updates per protagonist phase.
    pub protagonist_updates: u32,
    /// Levels each adversary proposes per adversary phase (RARL) or update (PAIRED).
    pub adversary_batch: usize,
    /// Share of domain-randomised levels mixed into the protagonist's (RARL, PAIRED, SFL).
    pub dr_share: f64,
    /// Weight of the realism critic's `log D` in the adversaries' reward.
    pub lambda: f64,
    /// The most a level's faults may cost together.
    pub budget: f64,
    /// At most this many faults at once.
    pub max_faults: usize,
    /// Cost per fault (`"disk-fill" = 1.5`) or setting (`"disk-fill(free_pct=5)" = 2`); 1
    /// when not given.
    pub costs: BTreeMap<String, f64>,
    /// Faults kept out of training: they are evaluated as held-out families.
    pub held_out_faults: Vec<String>,
    /// Mask the settings the catalogue oracle cannot recover from (checked once per seed on
    /// a clean instance with that one fault).
    pub mask_unrecoverable: bool,
    pub adversary_hidden: Vec<usize>,
    pub adversary_learning_rate: f64,
    pub adversary_ent_coef: f64,
    /// The level buffer (PLR, ACCEL): robust PLR's defaults scaled to short runs.
    pub buffer_capacity: usize,
    pub replay_prob: f64,
    pub min_fill: usize,
    pub temperature: f64,
    pub staleness: f64,
    /// `pvl` (positive value loss) or `maxmc`.
    pub score: String,
    pub sfl_candidates: usize,
    pub sfl_rollouts: usize,
    pub sfl_keep: usize,
    pub sfl_every: u32,
    /// Save every role every this many protagonist updates (0: only at the end).
    pub checkpoint_every: u64,
}

impl Default for SelfPlay {
    fn default() -> Self {
        Self {
            method: "rarl".into(),
            population: 2,
            protagonist_updates: 4,
            adversary_batch: 8,
            dr_share: 0.2,
            lambda: 0.0,
            budget: 2.0,
            max_faults: 2,
            costs: BTreeMap::new(),
            held_out_faults: Vec::new(),
            mask_unrecoverable: true,
            adversary_hidden: vec![32],
            adversary_learning_rate: 3e-3,
            adversary_ent_coef: 0.01,
            buffer_capacity: 256,
            replay_prob: 0.5,
            min_fill: 16,
            temperature: 0.3,
            staleness: 0.3,
            score: "pvl".into(),
            sfl_candidates: 32,
            sfl_rollouts: 2,
            sfl_keep: 8,
            sfl_every: 8,
            checkpoint_every: 1,
        }
    }
}

impl SelfPlay {
    pub fn method(&self) -> Option<Method> {
        Method::parse(&self.method)
    }

    /// The schedule's settings over `space` for experiment seed `seed`.
    pub fn schedule(&self, space: actors::space::LevelSpace, seed: u64) -> Option<ScheduleConfig> {
        let mut c = ScheduleConfig::new(self.method()?, space, seed);
        c.dr_share = self.dr_share;
        c.protagonist_updates = self.protagonist_updates;
        c.adversary_batch = self.adversary_batch;
        c.lambda = self.lambda;
        c.sfl_candidates = self.sfl_candidates;
        c.sfl_rollouts = self.sfl_rollouts;
        c.sfl_keep = self.sfl_keep;
        c.sfl_every = self.sfl_every;
        Some(c)
    }

    /// Protagonist updates of the budget: `training.total_steps` over the rollout size.
    pub fn updates(&self, t: &Training) -> u64 {
        let per = (t.num_envs * t.num_steps).max(1) as u64;
        t.total_steps.div_ceil(per).max(1)
    }
}

/// Validate `[selfplay]` against the rest of the experiment.
pub(super) fn check(
    exp: &Experiment,
    s: &SelfPlay,
    invalid: &dyn Fn(&'static str, String) -> ExperimentError,
) -> Result<(), ExperimentError> {
    let Some(method) = s.method() else {
        return Err(invalid(
            "selfplay.method",
            format!(
                "unknown method `{}`; one of: {}",
                s.method,
                Method::ALL.map(Method::name).join(", ")
            ),
        ));
    };
    let Some(tpl) = &exp.template else {
        return Err(invalid(
            "environment.template",
            "self-play needs a template: its perturbation space is the level space".into(),
        ));
    };
    if tpl.task.is_none() {
        return Err(invalid(
            "environment.template",
            format!("{} names no task", tpl.file.display()),
        ));
    }
    if method.needs().adversaries && !(1..=64).contains(&s.population) {
        return Err(invalid(
            "selfplay.population",
            format!(
                "between 1 and 64 adversaries for `{}`, not {}",
                method.name(),
                s.population
            ),
        ));
    }
    if !s.lambda.is_finite() {
        return Err(invalid(
            "selfplay.lambda",
            format!("must be finite, not {}", s.lambda),
        ));
    }
    if !(s.budget.is_finite() && s.budget > 0.0) {
        return Err(invalid(
            "selfplay.budget",
            format!("a finite number > 0, not {}", s.budget),
        ));
    }
    if !(1..=16).contains(&s.max_faults) {
        return Err(invalid(
            "selfplay.max_faults",
            format!("between 1 and 16, not {}", s.max_faults),
        ));
    }
    let names: Vec<&str> = tpl.space.iter().map(|e| e.name.as_str()).collect();
    for f in &s.held_out_faults {
        if !names.contains(&f.as_str()) {
            return Err(invalid(
                "selfplay.held_out_faults",
                format!(
                    "`{f}` is not in {}'s space ({})",
                    tpl.file.display(),
                    names.join(", ")
                ),
            ));
        }
    }
    if !matches!(s.score.as_str(), "pvl" | "maxmc") {
        return Err(invalid(
            "selfplay.score",
            format!("`pvl` or `maxmc`, not `{}`", s.score),
        ));
    }
    for (key, ok, what) in [
        (
            "selfplay.adversary_hidden",
            (1..=8).contains(&s.adversary_hidden.len())
                && s.adversary_hidden.iter().all(|h| (1..=4096).contains(h)),
            "1 to 8 widths in 1..=4096",
        ),
        (
            "selfplay.adversary_learning_rate",
            s.adversary_learning_rate.is_finite() && s.adversary_learning_rate > 0.0,
            "a finite number > 0",
        ),
        (
            "selfplay.adversary_ent_coef",
            s.adversary_ent_coef.is_finite() && s.adversary_ent_coef >= 0.0,
            "a finite number >= 0",
        ),
        (
            "selfplay.buffer_capacity",
            (1..=1_000_000).contains(&s.buffer_capacity),
            "between 1 and 1000000",
        ),
        (
            "selfplay.temperature",
            s.temperature.is_finite() && s.temperature > 0.0,
            "a finite number > 0",
        ),
        (
            "selfplay.replay_prob",
            (0.0..=1.0).contains(&s.replay_prob),
            "in [0, 1]",
        ),
        (
            "selfplay.staleness",
            (0.0..=1.0).contains(&s.staleness),
            "in [0, 1]",
        ),
    ] {
        if !ok {
            return Err(invalid(key, what.into()));
        }
    }
    let space = actors::space::LevelSpace::new(Vec::new(), s.budget, 0, 1)
        .map_err(|e| invalid("selfplay.budget", e.to_string()))?;
    let cfg = s
        .schedule(space, 0)
        .ok_or_else(|| invalid("selfplay.method", "unknown".into()))?;
    cfg.validate().map_err(|e| match e {
        actors::schedule::ScheduleError::Config { key, reason } => {
            let key: &'static str = match key {
                "dr_share" => "selfplay.dr_share",
                "protagonist_updates" => "selfplay.protagonist_updates",
                "adversary_batch" => "selfplay.adversary_batch",
                "sfl_candidates" => "selfplay.sfl_candidates",
                "sfl_rollouts" => "selfplay.sfl_rollouts",
                "sfl_keep" => "selfplay.sfl_keep",
                "sfl_every" => "selfplay.sfl_every",
                _ => "selfplay",
            };
            invalid(key, reason)
        }
        other => invalid("selfplay", other.to_string()),
    })?;
    Ok(())
}
