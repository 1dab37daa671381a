//! Task families: procedurally generated per seed, each with an instruction, a setup (files
//! in the instance's layer, processes started at every episode start), a verifier on the final
//! state that uses only trusted reads ([`crate::probe::Probe`]) and a confirmation by the
//! system's own entry points ([`Task::confirm`]), an oracle solution, a discrete action
//! catalogue for small policies, and trials as data ([`trials`]: hacks that must fail, honest
//! alternatives that must pass). A file per task.

pub mod archive_logs;
pub mod fix_path;
pub mod fix_permissions;
pub mod free_disk;
pub mod kill_runaway;
pub mod repair_config;
pub mod restore_service;
pub mod tar_strict;
pub mod trials;
pub mod util;

use crate::instance::{Builder, InstanceError, TaskSetup};
use crate::probe::{Confirm, Probe, ProbeError};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("setup: {0}")]
    Setup(String),
    #[error(transparent)]
    Layer(#[from] InstanceError),
}

/// The verifier's judgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub success: bool,
    /// Fraction of the goal's checks that pass (0..=1), for diagnostics.
    pub progress: f64,
    /// Why it failed (empty on success), one line per failed check.
    pub reasons: Vec<String>,
}

impl Verdict {
    /// From a list of (check passed, reason when it did not).
    pub fn from_checks(checks: Vec<(bool, String)>) -> Self {
        let n = checks.len().max(1) as f64;
        let passed = checks.iter().filter(|c| c.0).count() as f64;
        let reasons: Vec<String> = checks.into_iter().filter(|c| !c.0).map(|c| c.1).collect();
        Self {
            success: reasons.is_empty(),
            progress: passed / n,
            reasons,
        }
    }
}

impl Verdict {
    /// This verdict (of `verify`, which passed) completed by the confirmation's: success only
    /// when both pass; the progress counts the confirmation as the last half.
    pub fn confirmed_by(self, c: Verdict) -> Verdict {
        Verdict {
            success: self.success && c.success,
            progress: if c.success {
                self.progress
            } else {
                self.progress * 0.5 + c.progress * 0.5
            },
            reasons: self.reasons.into_iter().chain(c.reasons).collect(),
        }
    }
}

pub trait Task: Send + Sync {
    fn name(&self) -> &'static str;
    /// One line for listings.
    fn summary(&self) -> &'static str;
    /// Build the world for a seed into the instance under construction.
    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError>;
    /// Judge the state through trusted reads only (every step: cheap, changes nothing).
    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError>;
    /// Once [`Task::verify`] passes: check the effect the way the system would see it, by its
    /// own entry points from a clean state (kill every process, start the service by its own
    /// start script, run the job as its own user, measure space after the agent's processes
    /// are gone). Runs on a snapshot that is rolled back (see [`Confirm`]). The default has
    /// nothing to add.
    fn confirm(&self, _setup: &TaskSetup, _sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        Ok(Verdict::from_checks(Vec::new()))
    }
    /// A solution as shell commands, robust to the faults the catalogue can inject that leave
    /// the task solvable (absolute paths, fallbacks).
    fn oracle(&self, setup: &TaskSetup) -> Vec<String>;
    /// The values of the `@NAME@` variables of this task's trials file ([`trials`]) for one
    /// instance: paths, ports and names drawn from its seed.
    fn trial_vars(&self, _setup: &TaskSetup) -> std::collections::BTreeMap<String, String> {
        Default::default()
    }
}

/// Every task family.
pub fn all() -> Vec<&'static dyn Task> {
    vec![
        &archive_logs::ArchiveLogs,
        &free_disk::FreeDisk,
        &restore_service::RestoreService,
        &repair_config::RepairConfig,
        &kill_runaway::KillRunaway,
        &fix_permissions::FixPermissions,
        &fix_path::FixPath,
    ]
}

pub fn names() -> Vec<&'static str> {
    all().iter().map(|t| t.name()).collect()
}

pub fn get(name: &str) -> Option<&'static dyn Task> {
    all().into_iter().find(|t| t.name() == name)
}
