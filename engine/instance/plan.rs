//! Plans: everything that determines an instance (base, task and seed, perturbations with
//! their parameters, resources).

use super::params::Params;
use serde::{Deserialize, Serialize};

/// One chosen perturbation with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerturbationChoice {
    pub name: String,
    #[serde(default)]
    pub params: Params,
}

/// Resource limits of the instance's sandbox (from the template's `base_environment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: f64,
    pub memory_bytes: u64,
    pub disk_bytes: u64,
    pub pids: u64,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            cpus: 1.0,
            memory_bytes: 256 << 20,
            disk_bytes: 64 << 20,
            pids: 128,
        }
    }
}

/// The task part of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    pub name: String,
    pub seed: u64,
}

/// Everything that determines an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Rootfs source as given to the sandbox (`host`, a directory, `oci:PATH`).
    pub base: String,
    pub task: Option<TaskRef>,
    pub perturbations: Vec<PerturbationChoice>,
    pub seed: u64,
    pub resources: Resources,
    /// Tools the template requires in the base (checked at synthesis).
    #[serde(default)]
    pub tools: Vec<String>,
}

impl Plan {
    /// A plan of a task on the `host` base with default resources.
    pub fn for_task(task: &str, seed: u64, perturbations: Vec<PerturbationChoice>) -> Self {
        Self {
            base: "host".into(),
            task: Some(TaskRef {
                name: task.into(),
                seed,
            }),
            perturbations,
            seed,
            resources: Resources::default(),
            tools: Vec::new(),
        }
    }
}
