//! The message vocabulary of the self-play runtime: plain serde types, no actix. Levels are
//! named by the choices of the level space ([`crate::space::LevelSpace`]) and a task seed, so
//! a level survives a checkpoint, a replay and a trip through JSONL unchanged.

use serde::{Deserialize, Serialize};

/// One level (an environment instance to play): a task seed and one choice per fault
/// dimension of the level space (0 = off; empty = the clean level).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Level {
    pub seed: u64,
    pub choices: Vec<u32>,
}

impl Level {
    /// The unperturbed level of a task seed.
    pub fn clean(seed: u64) -> Self {
        Self {
            seed,
            choices: Vec::new(),
        }
    }

    /// Number of faults switched on.
    pub fn active(&self) -> usize {
        self.choices.iter().filter(|&&c| c != 0).count()
    }

    /// A stable printable key: `s<seed>` and the non-zero choices as `d<dim>=<choice>`.
    pub fn key(&self) -> String {
        let mut s = format!("s{}", self.seed);
        for (d, &c) in self.choices.iter().enumerate() {
            if c != 0 {
                s.push_str(&format!(",d{d}={c}"));
            }
        }
        s
    }
}

/// Where a level came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// A task seed with no faults.
    Clean,
    /// Sampled uniformly from the level space (domain randomisation).
    Random,
    /// Proposed by adversary `k` of the population.
    Adversary(usize),
    /// Replayed from the curriculum's level buffer.
    Replay,
    /// An edit of a buffered level (ACCEL).
    Mutation,
}

/// A level to play and whether its transitions may be learned from (robust PLR plays fresh
/// levels only to score them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub level: Level,
    pub origin: Origin,
    pub learn: bool,
    /// The schedule's own label (a proposal's index), returned with the outcome.
    pub tag: Option<u64>,
}

impl Assignment {
    pub fn new(level: Level, origin: Origin, learn: bool) -> Self {
        Self {
            level,
            origin,
            learn,
            tag: None,
        }
    }
}

/// What a worker returns after a reset: the first observation and the action mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Start {
    pub obs: Vec<f32>,
    /// One entry per action of the agent's action space (1 = allowed).
    pub mask: Vec<f32>,
}

/// Why an episode could not be played or finished. None of these is a result of the agent:
/// the failing step is masked from learning (no gradient, no bootstrap target from it), and
/// the episode is never scored as a zero reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The environment's infrastructure failed (a sandbox, the cache, a verifier read).
    Infrastructure,
    /// The worker panicked or its thread died; it was restarted.
    Crash,
    /// The level cannot be played (uncertified, not solvable through the catalogue, a fault
    /// that does not apply).
    Unusable,
}

/// A failure with its kind and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// One environment step as the worker saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// The next observation (the final one when the episode ended).
    pub obs: Vec<f32>,
    pub mask: Vec<f32>,
    pub reward: f32,
    pub terminated: bool,
    pub truncated: bool,
    /// The verifier passed.
    pub success: bool,
    /// The fraction of the verifier's checks that pass.
    pub progress: f32,
}

/// A worker's answer to a step: the transition, or the failure that ended the episode.
pub type StepResult = Result<Transition, Failure>;

/// The agent's actions for a batch of observations, with its value estimates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Acted {
    pub actions: Vec<u32>,
    pub values: Vec<f32>,
}

/// What the learner records of one vectorised step (one entry per environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    pub rewards: Vec<f32>,
    pub terminated: Vec<bool>,
    pub truncated: Vec<bool>,
    /// 0 for a sample that must contribute no gradient and no bootstrap target (a failure,
    /// or a level played only to be scored).
    pub valid: Vec<bool>,
    /// The final observation where the episode was truncated by its time limit (the
    /// bootstrap), `None` elsewhere.
    pub final_obs: Vec<Option<Vec<f32>>>,
}

/// One finished (or failed) episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeOutcome {
    pub level: Level,
    pub origin: Origin,
    /// The agent that played it (`protagonist`, `antagonist`).
    pub agent: String,
    pub learn: bool,
    /// The assignment's tag.
    pub tag: Option<u64>,
    pub ret: f64,
    pub success: bool,
    pub steps: u32,
    pub progress: f32,
    pub truncated: bool,
    pub actions: Vec<u32>,
    /// Per step: the reward, and the agent's value estimate of the state it acted in.
    pub rewards: Vec<f32>,
    pub values: Vec<f32>,
    pub failure: Option<Failure>,
}

impl EpisodeOutcome {
    /// The episode counts for statistics and scores (it did not fail).
    pub fn counted(&self) -> bool {
        self.failure.is_none()
    }
}

/// An adversary's proposal: the level, and a token the adversary learns it back by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub level: Level,
    pub token: u64,
}

/// Statistics of one learning step of any role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnStats {
    /// Named scalars (losses, entropy, AUC, ...), in a stable order.
    pub values: Vec<(String, f64)>,
}

impl LearnStats {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

/// The curriculum's pick of the next level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Pick {
    /// Replay this buffered level (learn from it).
    Replay(Level),
    /// Play a fresh level (robust PLR: only to score it).
    Fresh,
}
