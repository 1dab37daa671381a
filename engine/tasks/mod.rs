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

/// One named check of a verifier's checklist (like a per-checkpoint function): what it looks
/// at, whether it passed, and why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// A short stable name (`archive exists`, `member srv/x/a.log`, `service answers`).
    pub name: String,
    pub passed: bool,
    /// Why it failed (empty when it passed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl Check {
    /// A check named `name`; `reason` is kept only when it failed.
    pub fn new(name: impl Into<String>, passed: bool, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            passed,
            reason: if passed { String::new() } else { reason.into() },
        }
    }
}

/// The verifier's judgement: the verdict and the checklist it was drawn from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub success: bool,
    /// Fraction of the checklist that passes (0..=1): the task's progress, the potential of
    /// the potential-based reward.
    pub progress: f64,
    /// Why it failed (empty on success), one line per failed check.
    pub reasons: Vec<String>,
    /// Every check, passed or not, in the verifier's order.
    #[serde(default)]
    pub checks: Vec<Check>,
}

impl Verdict {
    /// From a list of (check passed, reason when it did not), each check named by its reason.
    /// Transitional: tasks move to [`Verdict::checklist`] with names of their own.
    pub fn from_checks(checks: Vec<(bool, String)>) -> Self {
        Self::checklist(
            checks
                .into_iter()
                .map(|(ok, why)| Check::new(why.clone(), ok, why))
                .collect(),
        )
    }

    /// From a checklist: success when every check passes (an empty list passes).
    pub fn checklist(checks: Vec<Check>) -> Self {
        let n = checks.len().max(1) as f64;
        let passed = checks.iter().filter(|c| c.passed).count() as f64;
        let reasons = checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.reason.clone())
            .collect::<Vec<_>>();
        Self {
            success: reasons.is_empty(),
            progress: if checks.is_empty() { 1.0 } else { passed / n },
            reasons,
            checks,
        }
    }

    /// A verdict of one failed check.
    pub fn failed(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::checklist(vec![Check::new(name, false, reason)])
    }

    /// This verdict (of `verify`, which passed) completed by the confirmation's: success only
    /// when both pass; the progress counts the confirmation as the last half. The
    /// confirmation's checks are named `confirm: <name>`.
    pub fn confirmed_by(self, c: Verdict) -> Verdict {
        Verdict {
            success: self.success && c.success,
            progress: if c.success {
                self.progress
            } else {
                self.progress * 0.5 + c.progress * 0.5
            },
            reasons: self.reasons.into_iter().chain(c.reasons).collect(),
            checks: self
                .checks
                .into_iter()
                .chain(c.checks.into_iter().map(|mut k| {
                    k.name = format!("confirm: {}", k.name);
                    k
                }))
                .collect(),
        }
    }
}

/// What the catalogue oracle saw of one of its steps: the action it took and what the command
/// printed (the same text the environment's observation shows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seen {
    /// The catalogue index taken.
    pub action: usize,
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
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
    /// The catalogue oracle: a reactive scripted agent that acts through the discrete
    /// catalogue only (`setup.actions`), as a small policy must. Given what it saw of its
    /// earlier steps this episode (oldest first; the episode starts in `setup.cwd`), the next
    /// catalogue index, or `None` when it has nothing left to try. Certification runs it to
    /// decide whether an instance is solvable through the catalogue.
    fn catalogue_step(&self, _setup: &TaskSetup, _seen: &[Seen]) -> Option<usize> {
        None
    }
    /// The faults of the catalogue (by perturbation name) that leave the task solvable by free
    /// text but that the catalogue cannot recover from, each with the reason: declared, so the
    /// catalogue test holds every other fault to "solvable through the catalogue".
    fn catalogue_gaps(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
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
