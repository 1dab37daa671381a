//! The roles the runtime runs, as traits with no actix in them. The `engine` package
//! implements them with its `Env`, the PPO agent, the adversary, the discriminator and the
//! level buffer; `crate::testing` has tiny fakes. A schedule (`crate::schedule`) drives them
//! directly in tests and through actors in `crate::runtime`.

use crate::msg::{
    Acted, EpisodeOutcome, Failure, LearnStats, Level, Pick, Proposal, Recorded, Start, StepResult,
};
use std::path::Path;

/// A role's failure: which role, what happened, and the implementation's own error.
#[derive(Debug, thiserror::Error)]
#[error("{role}: {message}")]
pub struct RoleError {
    pub role: &'static str,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl RoleError {
    pub fn new(role: &'static str, message: impl Into<String>) -> Self {
        Self {
            role,
            message: message.into(),
            source: None,
        }
    }

    /// Wrap an implementation's error.
    pub fn wrap(role: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            role,
            message: e.to_string(),
            source: Some(Box::new(e)),
        }
    }
}

/// A learning agent acting on batches of observations (the protagonist, PAIRED's
/// antagonist).
pub trait Agent: Send {
    /// Vectorised steps per learning rollout.
    fn rollout_len(&self) -> usize;
    /// Actions for `n` observations (`obs` is `n * obs_dim`, `masks` one row per
    /// observation). The agent remembers what it needs to learn from the step until the next
    /// [`record`](Agent::record).
    fn act(&mut self, obs: &[f32], masks: &[f32], n: usize) -> Result<Acted, RoleError>;
    /// The outcome of the last `act`, for the learner.
    fn record(&mut self, step: &Recorded) -> Result<(), RoleError>;
    /// Learn from the last `rollout_len` recorded steps; `next_obs` are the observations the
    /// environments are in now (the bootstrap).
    fn learn(&mut self, next_obs: &[f32], n: usize) -> Result<LearnStats, RoleError>;
    /// Write a checkpoint under `dir`.
    fn save(&self, dir: &Path) -> Result<(), RoleError>;
}

/// An adversary: proposes levels and learns from their scores.
pub trait Synthesizer: Send {
    /// `n` levels for the protagonist, each costing at most `budget` (the budget schedule's
    /// current value; at most the level space's own).
    fn propose(&mut self, n: usize, budget: f64) -> Result<Vec<Proposal>, RoleError>;
    /// Episodes the protagonist played (of any origin): the adversary's context.
    fn observe(&mut self, outcomes: &[EpisodeOutcome]) -> Result<(), RoleError>;
    /// Learn from `(proposal, reward)` pairs (the reward already includes realism).
    fn learn(&mut self, scored: &[(Proposal, f64)]) -> Result<LearnStats, RoleError>;
    fn save(&self, dir: &Path) -> Result<(), RoleError>;
}

/// A realism critic: how plausible a level looks (log D), trained on generated levels
/// against its set of real systems.
pub trait Critic: Send {
    fn realism(&mut self, levels: &[Level]) -> Result<Vec<f64>, RoleError>;
    fn learn(&mut self, generated: &[Level]) -> Result<LearnStats, RoleError>;
    fn save(&self, dir: &Path) -> Result<(), RoleError>;
}

/// One environment: reset to a level, step it. Failures are values, not errors: the
/// schedule masks the episode and goes on.
pub trait EnvWorker: Send {
    fn reset(&mut self, level: &Level) -> Result<Start, Failure>;
    fn step(&mut self, action: u32) -> StepResult;
}

/// The curriculum: a level buffer that picks the next level and takes the played levels'
/// scores.
pub trait Curriculum: Send {
    fn pick(&mut self) -> Result<Pick, RoleError>;
    /// Score an episode's level (a failed episode is never scored).
    fn update(&mut self, outcome: &EpisodeOutcome) -> Result<(), RoleError>;
    /// Levels in the buffer.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn save(&self, dir: &Path) -> Result<(), RoleError>;
}

/// A batch of environment workers stepped together (in parallel by the implementation).
pub trait Workers {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reset worker `i` to `level` for each `(i, level)`.
    fn reset(&mut self, levels: &[(usize, Level)]) -> Vec<Result<Start, Failure>>;
    /// Step the workers that have an action; the others idle and answer `None`.
    fn step(&mut self, actions: &[Option<u32>]) -> Vec<Option<StepResult>>;
    /// Tear every worker down now (their sandboxes with them) and wait for it; the run calls
    /// this before it returns. Dropping does the same, without the wait.
    fn shutdown(&mut self) {}
}
