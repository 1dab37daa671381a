//! The `[selfplay]` table: which schedule trains the protagonist (`method`), the adversary
//! population, the level space's budget and costs, the curriculum, checkpoints. The
//! protagonist's PPO settings, its step budget, the training task seeds and the held-out
//! levels are `[training]`'s (`total_steps`, `num_envs`, `num_steps`, `train_levels`,
//! `eval_levels`, ...); the level space is `environment.template`'s perturbation space.

use super::config::{Experiment, Training};
use super::ExperimentError;
use actors::schedule::{Method, Pace, ScheduleConfig};
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
    /// The difficulty schedule of `budget` (none: `budget` throughout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_schedule: Option<BudgetSchedule>,
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
            budget_schedule: None,
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

/// `[selfplay] budget_schedule`: how the level space's budget grows from `start` to
/// `budget` over the run (`actors::schedule::Pace`).
///
/// - `mode = "linear"` (the default): `start` to `budget` linearly over the first `over`
///   share of the protagonist's updates (default 0.5), then `budget`.
/// - `mode = "adaptive"`: from `start`, `+step` when the protagonist's success over the last
///   `window` episodes on levels drawn from the space is above `raise_above`, `-step` when
///   below `lower_below`, within `[start, budget]`.
///
/// `end`, when given, must be `budget` (the schedule ends at the space's budget, which the
/// held-out faulted levels use).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSchedule {
    #[serde(default = "linear")]
    pub mode: String,
    pub start: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raise_above: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_below: Option<f64>,
}

fn linear() -> String {
    "linear".into()
}

impl BudgetSchedule {
    /// The pace over a run of `updates` protagonist updates; `Err((key, reason))` for a
    /// key of the other mode, an unknown mode or an `end` that is not the budget.
    pub fn pace(&self, budget: f64, updates: u64) -> Result<Pace, (&'static str, String)> {
        if let Some(end) = self.end {
            if end != budget {
                return Err((
                    "selfplay.budget_schedule.end",
                    format!("is {end}; the schedule ends at selfplay.budget ({budget}): set budget = {end}, or leave end out"),
                ));
            }
        }
        let foreign = |keys: &[(&'static str, bool)]| {
            keys.iter()
                .find(|(_, set)| *set)
                .map(|(k, _)| (*k, format!("is not a key of mode `{}`", self.mode)))
        };
        match self.mode.as_str() {
            "linear" => {
                if let Some(e) = foreign(&[
                    ("selfplay.budget_schedule.step", self.step.is_some()),
                    ("selfplay.budget_schedule.window", self.window.is_some()),
                    (
                        "selfplay.budget_schedule.raise_above",
                        self.raise_above.is_some(),
                    ),
                    (
                        "selfplay.budget_schedule.lower_below",
                        self.lower_below.is_some(),
                    ),
                ]) {
                    return Err(e);
                }
                let over = self.over.unwrap_or(0.5);
                if !(over.is_finite() && over > 0.0 && over <= 1.0) {
                    return Err((
                        "selfplay.budget_schedule.over",
                        format!("is {over}; a share of the run in (0, 1]"),
                    ));
                }
                Ok(Pace::Linear {
                    start: self.start,
                    updates: ((over * updates as f64).round() as u64).max(1),
                })
            }
            "adaptive" => {
                if let Some(e) = foreign(&[("selfplay.budget_schedule.over", self.over.is_some())])
                {
                    return Err(e);
                }
                Ok(Pace::Adaptive {
                    start: self.start,
                    step: self.step.unwrap_or(0.5),
                    window: self.window.unwrap_or(32),
                    raise_above: self.raise_above.unwrap_or(0.8),
                    lower_below: self.lower_below.unwrap_or(0.5),
                })
            }
            other => Err((
                "selfplay.budget_schedule.mode",
                format!("unknown mode `{other}`; `linear` or `adaptive`"),
            )),
        }
    }
}

impl SelfPlay {
    /// The adversaries' settings for levels of `task`.
    pub fn adversary_settings(&self, task: &str) -> crate::roles::AdversarySettings {
        crate::roles::AdversarySettings {
            hidden: self.adversary_hidden.clone(),
            learning_rate: self.adversary_learning_rate,
            ent_coef: self.adversary_ent_coef,
            max_active: self.max_faults,
            task: task.to_string(),
        }
    }

    pub fn method(&self) -> Option<Method> {
        Method::parse(&self.method)
    }

    /// The budget schedule over a run of `updates` protagonist updates.
    pub fn pace(&self, updates: u64) -> Result<Pace, (&'static str, String)> {
        match &self.budget_schedule {
            None => Ok(Pace::Fixed),
            Some(b) => b.pace(self.budget, updates),
        }
    }

    /// The schedule's settings over `space` for experiment seed `seed`, in a run of
    /// `updates` protagonist updates (`None`: an unknown method or a bad budget schedule,
    /// which the config's check refuses by key).
    pub fn schedule(
        &self,
        space: actors::space::LevelSpace,
        seed: u64,
        updates: u64,
    ) -> Option<ScheduleConfig> {
        let mut c = ScheduleConfig::new(self.method()?, space, seed);
        c.pace = self.pace(updates).ok()?;
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
    let updates = s.updates(&exp.training.clone().unwrap_or_default());
    let pace = s
        .pace(updates)
        .map_err(|(key, reason)| invalid(key, reason))?;
    // The start against the template's priced space (masks come at run time; a space
    // that cannot be built is reported by the run).
    let priced = crate::roles::SpaceSettings {
        costs: s.costs.clone(),
        budget: s.budget,
        max_faults: s.max_faults,
        seed_base: 0,
        seed_count: 1,
    };
    if let Ok(fs) = crate::roles::FaultSpace::new(tpl.clone(), &priced) {
        pace.validate(&fs.space).map_err(|e| match e {
            actors::schedule::ScheduleError::Config { key, reason } => {
                invalid(pace_key(key), reason)
            }
            other => invalid("selfplay.budget_schedule", other.to_string()),
        })?;
    }
    let space = actors::space::LevelSpace::new(Vec::new(), s.budget, 0, 1)
        .map_err(|e| invalid("selfplay.budget", e.to_string()))?;
    let cfg = s
        .schedule(space, 0, updates)
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
                k => pace_key(k),
            };
            invalid(key, reason)
        }
        other => invalid("selfplay", other.to_string()),
    })?;
    Ok(())
}

/// The config key of a budget schedule's setting (`actors`' key without the table).
pub(super) fn pace_key(key: &str) -> &'static str {
    match key {
        "budget_schedule.start" => "selfplay.budget_schedule.start",
        "budget_schedule.over" => "selfplay.budget_schedule.over",
        "budget_schedule.step" => "selfplay.budget_schedule.step",
        "budget_schedule.window" => "selfplay.budget_schedule.window",
        "budget_schedule.raise_above" => "selfplay.budget_schedule.raise_above",
        "budget_schedule.lower_below" => "selfplay.budget_schedule.lower_below",
        "budget_schedule" => "selfplay.budget_schedule",
        _ => "selfplay",
    }
}
