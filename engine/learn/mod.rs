//! Learning in the factory's environments: the adapter of [`Env`](crate::env::Env) to the
//! PPO learner (`adapter.rs`), one training run of PPO on a task's levels with its held-out
//! evaluation and throughput baselines (`train.rs`), the learning-curve plot (`plot.rs`) and
//! the heatmap of tournaments and sweeps (`heatmap.rs`).
//! Experiments with a `[training]` table (`experiments/ppo-clean.toml`, `experiments/ppo-dr.toml`) run
//! through [`train`].
//!
//! | file | what it is |
//! |---|---|
//! | `adapter.rs` | [`TrainEnv`]: levels, skips, masked infrastructure failures; the latest episodes recorded and played again (the learning-cost baseline) |
//! | `train.rs` | [`train`], [`TrainSpec`], [`TrainResult`], [`evaluate`] |
//! | `plot.rs` | [`plot::curves_png`]: a PNG of learning curves |
//! | `heatmap.rs` | [`heatmap::heatmap_png`]: a PNG of a matrix of rates in [0, 1] |

mod adapter;
pub mod heatmap;
pub mod plot;
mod train;

pub use adapter::{AdapterCounts, PlayedEpisode, TrainEnv};
pub use train::{
    catalogue_oracle, evaluate, evaluate_each, greedy, nan_as_null, policy_agent, tally, train,
    CheckPoint, CheckSpec, CurvePoint, Evaluation, LevelOutcome, PolicyMode, TrainResult,
    TrainSpec,
};

use crate::env::EnvError;

#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Episode(#[from] crate::episode::EpisodeError),
    #[error(transparent)]
    Rollout(#[from] policies::rollout::RolloutError),
    #[error(transparent)]
    Ppo(#[from] policies::ppo::PpoError),
    #[error("no levels to train on")]
    NoLevels,
    #[error("a recorded episode names level {level}, but there are {levels} levels")]
    RecordedLevelOutOfRange { level: usize, levels: usize },
    #[error("no recorded episode with an action to replay")]
    NothingToReplay,
    #[error("{tried} levels in a row could not be used; the last: {last}")]
    NoUsableLevel { tried: u32, last: String },
    #[error(
        "task `{task}` (plan seed {seed}) has {got} catalogue actions; the policy was built for at most {want}"
    )]
    CatalogueSize {
        task: String,
        seed: u64,
        got: usize,
        want: usize,
    },
    #[error("task `{0}` is unknown or its instance has no catalogue")]
    NoCatalogue(String),
    #[error("the policy was still shared after a greedy check (an evaluation agent outlived it)")]
    PolicyShared,
}
