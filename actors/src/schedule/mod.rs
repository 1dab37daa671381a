//! The schedules as pure code: what is played, by whom, and who learns from it, one
//! iteration at a time, against the role traits only (tested with `crate::testing`'s fakes;
//! run through actors by `crate::runtime`).
//!
//! | file | method |
//! |---|---|
//! | `arena.rs` | [`Arena`]: slots over the workers, episodes across rollouts, failures masked |
//! | `clean.rs` | clean: the protagonist on unperturbed levels |
//! | `dr.rs` | domain randomisation: levels drawn uniformly from the level space |
//! | `rarl.rs` | RARL: strict alternation of protagonist and adversary phases |
//! | `paired.rs` | PAIRED: the adversary maximises the antagonist's regret over the protagonist |
//! | `plr.rs` | robust PLR: replay by score, no gradient on fresh levels |
//! | `accel.rs` | ACCEL: robust PLR whose replays are mutated into new candidates |
//! | `sfl.rs` | SFL: train on the most learnable of sampled levels |
//!
//! Faults are fixed at reset, so RARL here is the minimax-adversary baseline of the
//! curriculum literature (the adversary picks the level, not per-step forces).

mod accel;
mod arena;
mod clean;
mod dr;
mod pace;
mod paired;
mod plr;
mod rarl;
mod sfl;

pub use arena::{Arena, Rollout};
pub use pace::{Pace, PaceState, Paced};

use crate::msg::{Assignment, EpisodeOutcome, Failure, LearnStats, Origin};
use crate::roles::{Agent, Critic, Curriculum, RoleError, Synthesizer, Workers};
use crate::space::LevelSpace;
use serde::{Deserialize, Serialize};

/// Errors of a schedule.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error(transparent)]
    Role(#[from] RoleError),
    #[error("{tried} resets in a row failed on one worker; the last: {last:?}")]
    NoUsableLevel { tried: u32, last: Failure },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("method `{method}` needs {what}")]
    MissingRole {
        method: &'static str,
        what: &'static str,
    },
    #[error("invalid schedule setting `{key}`: {reason}")]
    Config { key: &'static str, reason: String },
}

/// The training methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Clean,
    Dr,
    Rarl,
    Paired,
    Plr,
    Accel,
    Sfl,
}

impl Method {
    pub const ALL: [Method; 7] = [
        Method::Clean,
        Method::Dr,
        Method::Rarl,
        Method::Paired,
        Method::Plr,
        Method::Accel,
        Method::Sfl,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Method::Clean => "clean",
            Method::Dr => "dr",
            Method::Rarl => "rarl",
            Method::Paired => "paired",
            Method::Plr => "plr",
            Method::Accel => "accel",
            Method::Sfl => "sfl",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The roles the method needs besides the protagonist and the workers.
    pub fn needs(self) -> Needs {
        Needs {
            adversaries: matches!(self, Method::Rarl | Method::Paired),
            antagonist: self == Method::Paired,
            curriculum: matches!(self, Method::Plr | Method::Accel),
        }
    }
}

/// Which optional roles a method uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    pub adversaries: bool,
    pub antagonist: bool,
    pub curriculum: bool,
}

/// The roles a schedule drives.
pub struct Roles {
    pub protagonist: Box<dyn Agent>,
    pub antagonist: Option<Box<dyn Agent>>,
    pub adversaries: Vec<Box<dyn Synthesizer>>,
    pub critic: Option<Box<dyn Critic>>,
    pub curriculum: Option<Box<dyn Curriculum>>,
    pub workers: Box<dyn Workers + Send>,
}

/// Settings of the schedules (each method reads its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleConfig {
    pub method: Method,
    pub space: LevelSpace,
    /// Seeds the schedule's own choices (level draws, mixing).
    pub seed: u64,
    /// RARL, PAIRED, SFL: the share of the protagonist's levels drawn by domain
    /// randomisation instead.
    pub dr_share: f64,
    /// RARL: protagonist updates per protagonist phase.
    pub protagonist_updates: u32,
    /// RARL, PAIRED: levels each adversary proposes per adversary phase (RARL) or update
    /// (PAIRED).
    pub adversary_batch: usize,
    /// Weight of the realism critic's `log D` in the adversaries' reward (0: the critic is
    /// not consulted).
    pub lambda: f64,
    /// SFL: candidate levels sampled per selection, episodes per candidate, levels kept, and
    /// protagonist updates between selections.
    pub sfl_candidates: usize,
    pub sfl_rollouts: usize,
    pub sfl_keep: usize,
    pub sfl_every: u32,
    /// The difficulty schedule of the space's budget (`space.budget` is the final one).
    #[serde(default)]
    pub pace: Pace,
}

impl ScheduleConfig {
    /// Defaults for `method` over `space`.
    pub fn new(method: Method, space: LevelSpace, seed: u64) -> Self {
        Self {
            method,
            space,
            seed,
            dr_share: 0.2,
            protagonist_updates: 4,
            adversary_batch: 8,
            lambda: 0.0,
            sfl_candidates: 32,
            sfl_rollouts: 2,
            sfl_keep: 8,
            sfl_every: 8,
            pace: Pace::Fixed,
        }
    }

    /// Settings in range.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let bad = |key, reason: String| Err(ScheduleError::Config { key, reason });
        if !(self.dr_share.is_finite() && (0.0..=1.0).contains(&self.dr_share)) {
            return bad(
                "dr_share",
                format!("is {}; must be in [0, 1]", self.dr_share),
            );
        }
        if !self.lambda.is_finite() {
            return bad("lambda", format!("is {}; must be finite", self.lambda));
        }
        for (key, v) in [
            ("protagonist_updates", self.protagonist_updates as usize),
            ("adversary_batch", self.adversary_batch),
            ("sfl_candidates", self.sfl_candidates),
            ("sfl_rollouts", self.sfl_rollouts),
            ("sfl_keep", self.sfl_keep),
            ("sfl_every", self.sfl_every as usize),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if self.sfl_keep > self.sfl_candidates {
            return bad(
                "sfl_keep",
                format!("{} > sfl_candidates {}", self.sfl_keep, self.sfl_candidates),
            );
        }
        self.pace.validate(&self.space)
    }
}

/// Which part of the alternation an iteration was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The protagonist (and PAIRED's antagonist) learned.
    Protagonist,
    /// The adversaries learned against a frozen protagonist.
    Adversary,
    /// Levels were played only to be scored (SFL's selection).
    Selection,
}

/// What one iteration did.
#[derive(Debug, Default)]
pub struct Iteration {
    pub phase: Option<Phase>,
    /// Every episode that ended, of every agent and origin.
    pub outcomes: Vec<EpisodeOutcome>,
    /// Environment steps taken.
    pub steps: u64,
    pub protagonist: Option<LearnStats>,
    pub antagonist: Option<LearnStats>,
    /// `(adversary, stats)` of the adversaries that learned.
    pub adversaries: Vec<(usize, LearnStats)>,
    pub critic: Option<LearnStats>,
    /// Levels in the curriculum's buffer (SFL: levels kept) after the iteration.
    pub buffer: Option<usize>,
    /// The budget the iteration's levels were drawn under ([`Paced`]).
    pub budget: Option<f64>,
}

impl Iteration {
    /// A protagonist iteration of the learning rollout `r`.
    fn learned(r: Rollout) -> Self {
        let mut it = Self {
            phase: Some(Phase::Protagonist),
            protagonist: r.learned.clone(),
            ..Self::default()
        };
        it.add(r);
        it
    }

    fn add(&mut self, r: Rollout) {
        self.steps += r.steps;
        self.outcomes.extend(r.outcomes);
    }
}

/// One method's schedule.
pub trait Schedule: Send {
    fn method(&self) -> Method;
    /// Run one iteration (one protagonist update, or one adversary phase).
    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError>;
    /// Protagonist updates done so far.
    fn updates(&self) -> u64;
    /// What the levels it draws or has proposed may cost from now on (the pace's budget;
    /// at most the space's).
    fn set_budget(&mut self, budget: f64);
    /// Its state between two iterations, for a checkpoint.
    fn state(&self) -> ScheduleState;
    /// Go on from `state` (taken from a schedule of the same method). Live episodes are not
    /// part of a state: the next iteration starts every worker on a fresh episode.
    fn restore(&mut self, state: ScheduleState) -> Result<(), ScheduleError>;
}

/// A schedule's state between two iterations (checkpoints, `--resume`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleState {
    pub method: Method,
    /// Protagonist updates done.
    pub updates: u64,
    /// The schedule's own generator (level draws, mixing), at its exact position.
    pub rng: rand_chacha::ChaCha8Rng,
    #[serde(default)]
    pub detail: Detail,
    /// The budget schedule's state ([`Paced`]).
    #[serde(default)]
    pub pace: Option<PaceState>,
}

/// What a method keeps besides its generator and update count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Detail {
    #[default]
    None,
    /// Protagonist updates left in the current phase, and the next adversary to propose.
    Rarl { left: u32, next_adversary: usize },
    /// Mutations of replayed levels waiting to be played.
    Accel { mutations: Vec<crate::msg::Level> },
    /// The levels kept by the last selection, and the updates since it.
    Sfl {
        kept: Vec<crate::msg::Level>,
        since: Option<u32>,
    },
}

impl ScheduleState {
    /// `self` checked to come from a schedule of `method`.
    fn of(self, method: Method) -> Result<Self, ScheduleError> {
        if self.method == method {
            Ok(self)
        } else {
            Err(ScheduleError::Config {
                key: "method",
                reason: format!(
                    "the checkpoint holds a {} schedule, not {}",
                    self.method.name(),
                    method.name()
                ),
            })
        }
    }

    /// `detail` did not fit the method.
    fn bad_detail(&self) -> ScheduleError {
        ScheduleError::Config {
            key: "detail",
            reason: format!(
                "the checkpoint's {} schedule holds {:?}",
                self.method.name(),
                self.detail
            ),
        }
    }
}

/// The schedule of `cfg.method`, checking that `roles` has what it needs.
pub fn build(cfg: &ScheduleConfig, roles: &Roles) -> Result<Box<dyn Schedule>, ScheduleError> {
    cfg.validate()?;
    let m = cfg.method;
    let needs = m.needs();
    let missing = |what| ScheduleError::MissingRole {
        method: m.name(),
        what,
    };
    if needs.adversaries && roles.adversaries.is_empty() {
        return Err(missing("a population of at least one adversary"));
    }
    if needs.antagonist && roles.antagonist.is_none() {
        return Err(missing("an antagonist"));
    }
    if needs.curriculum && roles.curriculum.is_none() {
        return Err(missing("a curriculum (level buffer)"));
    }
    let n = roles.workers.len();
    if n == 0 {
        return Err(missing("at least one worker"));
    }
    let inner: Box<dyn Schedule> = match m {
        Method::Clean => Box::new(clean::Clean::new(cfg, n)),
        Method::Dr => Box::new(dr::Dr::new(cfg, n)),
        Method::Rarl => Box::new(rarl::Rarl::new(cfg, n)),
        Method::Paired => Box::new(paired::Paired::new(cfg, n)),
        Method::Plr => Box::new(plr::Plr::new(cfg, n)),
        Method::Accel => Box::new(accel::Accel::new(cfg, n)),
        Method::Sfl => Box::new(sfl::Sfl::new(cfg, n)),
    };
    Ok(Box::new(Paced::new(
        inner,
        cfg.pace.clone(),
        cfg.space.budget,
    )))
}

/// The schedule's generator for `cfg` (one stream per purpose).
fn rng(cfg: &ScheduleConfig, purpose: u64) -> rand_chacha::ChaCha8Rng {
    use rand::SeedableRng;
    rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The protagonist's next learning level (as an arena's source answers it): with
/// probability `share` a domain-randomised one, otherwise `other`'s (RARL's and PAIRED's
/// proposals, SFL's kept levels).
fn dr_or(
    space: &LevelSpace,
    rng: &mut rand_chacha::ChaCha8Rng,
    share: f64,
    other: impl FnOnce(&mut rand_chacha::ChaCha8Rng) -> Result<Assignment, ScheduleError>,
) -> Result<Option<Assignment>, ScheduleError> {
    use rand::Rng;
    if rng.gen::<f64>() < share {
        Ok(Some(Assignment::new(
            space.random(rng),
            Origin::Random,
            true,
        )))
    } else {
        other(rng).map(Some)
    }
}

/// The adversaries' reward for the protagonist's episode on a proposed level: its failure
/// (minus its return, so a level it solves slowly scores above one it solves at once),
/// plus `lambda * log D` of the level. A level that cannot be played (uncertified, not
/// solvable through the catalogue) scores `UNUSABLE_REWARD`, below any played level (played
/// rewards are floored at [`PLAYED_FLOOR`]), so an adversary never profits from proposing
/// one; an infrastructure failure is not scored.
pub fn adversary_reward(outcome: &EpisodeOutcome, log_d: f64, lambda: f64) -> Option<f64> {
    match &outcome.failure {
        None => Some((-outcome.ret + lambda * log_d).max(PLAYED_FLOOR)),
        Some(f) if f.kind == crate::msg::FailureKind::Unusable => Some(UNUSABLE_REWARD),
        Some(_) => None,
    }
}

/// See [`adversary_reward`].
pub const UNUSABLE_REWARD: f64 = -10.0;

/// The lowest reward a played level gives an adversary (RARL's minus return, PAIRED's
/// regret, with the realism term). The factory's rewards keep returns within a few units
/// (goal 1, potential 1, a small step cost), so the floor only binds on extreme `log D`
/// terms; it keeps [`UNUSABLE_REWARD`] strictly below every played level.
pub const PLAYED_FLOOR: f64 = -9.0;
