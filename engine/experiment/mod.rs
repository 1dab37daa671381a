//! Experiment configs (`experiments/*.toml`) and `engine run`.
//!
//! Today an experiment drives the environment factory the way training will: for every seed,
//! `episodes` real [`Env`] episodes on `workers` threads (each thread with its own `Env`), the
//! instances drawn from a template's perturbation space (domain randomisation) or the
//! unperturbed task, acted in by a built-in agent (`random` or `oracle`). Uncertified instances
//! are skipped and counted, never run; infrastructure failures are counted and masked. It
//! reports per-seed throughput, success rate, return and reset latency with a 95% Student-t
//! confidence interval over seeds, and one JSON line per episode. The learning stages
//! (protagonist, adversary, discriminator, curriculum) plug into the same loop with their issue.
//!
//! Plans: episode `e` of seed `s` uses the instance of plan seed `s * 1_000_003 + e / k`, where
//! `k` is `episodes_per_instance` (default 1: every episode a new instance); consecutive
//! episodes of one instance run on the same worker, so they reuse its sandbox through the
//! incremental reset.
//!
//! [`Env`]: crate::env::Env
//!
//! | file | what it is |
//! |---|---|
//! | `config.rs` | [`Experiment`] and its tables: loading, validation, [`Experiment::plan`], [`Experiment::env_config`] |
//! | `runner.rs` | [`run`], [`run_until`] (stops on a flag): the episodes on worker threads, [`EpisodeRecord`] |
//! | `output.rs` | the output directory (checked before the first episode), episodes appended as they finish, the report at the end or on interruption |
//! | `replay.rs` | `engine replay`: an episode of a self-play run played again from its record |
//! | `resume.rs` | `engine run --resume`: a run's identity (`run.json`) checked key by key, reading back what a run wrote |
//! | `selfplay.rs` | a self-play run (`[selfplay]`): the schedule through the actor runtime, metrics, checkpoints, held-out evaluation |
//! | `selfplay_config.rs` | [`SelfPlay`]: the `[selfplay]` table and its validation |
//! | `selfplay_report.rs` | a self-play run's `report.md` and its plots |
//! | `study.rs` | a training study (`[training]`): PPO per task and seed, held-out evaluation, `report.md` |
//! | `tournament.rs` | `engine tournament`: protagonists x adversaries of finished runs, the cross-play matrix, its Nash value, Nash-averaged scores, Elo |
//! | `nash.rs` | the zero-sum matrix game solved exactly (simplex), Nash-averaged scores, an Elo fit |
//! | `sweep.rs` | `engine sweep`: a base experiment and a grid of keys, one run per point (processes), `--resume`, the aggregate |
//! | `stats.rs` | [`summarize`], [`SeedResult`], [`Interval`], [`Report`] |

mod config;
pub mod nash;
mod output;
pub mod replay;
pub mod resume;
mod runner;
pub mod selfplay;
mod selfplay_config;
mod selfplay_report;
mod stats;
pub mod study;
pub mod sweep;
pub mod tournament;

pub use config::{resolve_template, Agent, Environment, Experiment, Meta, Training, SEED_STRIDE};
pub use runner::{run, run_until, EpisodeRecord};
pub use selfplay_config::SelfPlay;
pub use stats::{summarize, Interval, Report, SeedResult};

use crate::env::EnvError;
use crate::template::TemplateError;
use std::path::PathBuf;

/// Errors of loading or running an experiment.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error(transparent)]
    Read(#[from] crate::text::TextError),
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}:{line}:{column}: key `{key}`: {reason}")]
    Invalid {
        file: PathBuf,
        line: usize,
        column: usize,
        key: &'static str,
        reason: String,
    },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Running(#[from] crate::running::RunningError),
    #[error(transparent)]
    Learn(#[from] crate::learn::LearnError),
    #[error("self-play: {0}")]
    SelfPlay(String),
    #[error("{file}: {reason}")]
    Replay { file: PathBuf, reason: String },
    /// A tournament's or a sweep's file: the key (`runs[1]`, `grid."selfplay.lambda"`) and
    /// the reason.
    #[error("{}: key `{key}`: {reason}", file.display())]
    Config {
        file: PathBuf,
        key: String,
        reason: String,
    },
    #[error(transparent)]
    Roles(#[from] crate::roles::RolesError),
    #[error("self-play run")]
    Runtime(#[from] actors::runtime::RuntimeError),
    #[error("loading the final protagonist")]
    Checkpoint(#[source] policies::ppo::PpoError),
    #[error("an episode worker of seed {seed} panicked")]
    Worker { seed: u64 },
    #[error("--resume {}: {reason}", dir.display())]
    Resume { dir: PathBuf, reason: String },
    #[error("output directory {dir}: {source}")]
    Output {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {file}: {source}")]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
}

impl ExperimentError {
    /// A tournament's or a sweep's `file` is wrong at `key` for `reason`.
    pub(crate) fn config(
        file: &std::path::Path,
        key: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::Config {
            file: file.to_path_buf(),
            key: key.into(),
            reason: reason.into(),
        }
    }
}
