//! The self-play roles of `actors` implemented with the factory: the level space of a
//! template (`space.rs`), an environment worker over [`Env`](crate::env::Env) (`worker.rs`),
//! the PPO protagonist (`agent.rs`), the learned adversary (`adversary.rs`), the level
//! buffer (`curriculum.rs`) and the realism critic (`critic.rs`). `experiment::selfplay` puts them in the actor runtime.
//!
//! | file | what it is |
//! |---|---|
//! | `space.rs` | [`FaultSpace`]: a template's perturbations as `actors` level dimensions, with costs, a budget and masks; levels to plans |
//! | `worker.rs` | [`EnvRole`]: `actors::roles::EnvWorker` over an `Env` (failures told apart) |
//! | `agent.rs` | [`PpoRole`]: `actors::roles::Agent` over `policies::ppo` |
//! | `adversary.rs` | [`AdversaryRole`]: `actors::roles::Synthesizer` over `policies::adversary` |
//! | `curriculum.rs` | [`BufferRole`]: `actors::roles::Curriculum` over `policies::curriculum::LevelBuffer` |
//! | `critic.rs` | [`RealismCritic`]: `actors::roles::Critic` over `policies::discriminator`, the real set against the adversaries' levels |

mod adversary;
mod agent;
mod critic;
mod curriculum;
mod space;
mod worker;

pub use adversary::{AdversaryRole, AdversarySettings};
pub use agent::PpoRole;
pub use critic::{CriticSettings, RealismCritic};
pub use curriculum::{BufferRole, ScoreKind};
pub use space::{FaultSpace, SpaceSettings};
pub use worker::EnvRole;

/// Errors of the role adapters.
#[derive(Debug, thiserror::Error)]
pub enum RolesError {
    #[error(transparent)]
    Space(#[from] actors::space::SpaceError),
    #[error(transparent)]
    Ppo(#[from] policies::ppo::PpoError),
    #[error(transparent)]
    Adversary(#[from] policies::adversary::AdversaryError),
    #[error(transparent)]
    Curriculum(#[from] policies::curriculum::CurriculumError),
    #[error("template `{template}` has no task: self-play needs one")]
    NoTask { template: String },
    #[error("cost of `{key}`: {reason}")]
    Cost { key: String, reason: String },
    #[error("the {what} does not match: {reason}")]
    Shape { what: &'static str, reason: String },
    #[error("checkpoint {}: {reason}", dir.display())]
    Checkpoint {
        dir: std::path::PathBuf,
        reason: String,
    },
}

impl RolesError {
    /// A checkpoint under `dir` that cannot be loaded for `reason`.
    pub(crate) fn checkpoint(dir: &std::path::Path, reason: impl Into<String>) -> Self {
        Self::Checkpoint {
            dir: dir.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// Write `v` as JSON to `dir/file` (a role's own state beside its weights).
fn write_state<T: serde::Serialize>(
    role: &'static str,
    dir: &std::path::Path,
    file: &str,
    v: &T,
) -> Result<(), actors::roles::RoleError> {
    let text = serde_json::to_vec(v).map_err(|e| actors::roles::RoleError::wrap(role, e))?;
    std::fs::write(dir.join(file), text).map_err(|e| actors::roles::RoleError::wrap(role, e))
}

/// Read [`write_state`]'s file.
fn read_state<T: serde::de::DeserializeOwned>(
    dir: &std::path::Path,
    file: &str,
) -> Result<T, RolesError> {
    let path = dir.join(file);
    let text = std::fs::read(&path)
        .map_err(|e| RolesError::checkpoint(dir, format!("{}: {e}", path.display())))?;
    serde_json::from_slice(&text)
        .map_err(|e| RolesError::checkpoint(dir, format!("{}: {e}", path.display())))
}
