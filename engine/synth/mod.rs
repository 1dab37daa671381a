//! Synthesis: a plan (base rootfs, task and seed, perturbations with parameters, seed) becomes a
//! content-addressed instance: one read-only layer directory stacked above the base, plus the
//! runtime settings that a layer cannot hold (environment, limits, processes started at every
//! episode start, fault proxies).
//!
//! Pipeline: [`Plan`](crate::instance::Plan) -> [`instance_id`](crate::instance::instance_id) (sha256 of catalogue version, base digest, plan) ->
//! cache hit? ready : run the task's setup and every perturbation on a [`Builder`](crate::instance::Builder) (which reads
//! the base through [`BaseView`](crate::instance::BaseView)) -> [`Layer::materialize`](crate::instance::Layer::materialize) into a temporary directory ->
//! rename into the cache. Same input, same id, same bytes (fixed mtimes, sorted writes).
//!
//! The cache lives on its own tmpfs (`<state>/instances`): overlayfs refuses a layer nested in
//! another layer, and the `host` base uses `/` itself as a layer. It is bounded (entries and
//! bytes, least recently used evicted first) and safe under concurrency: a build holds an
//! exclusive lock on the cache's lock file, users hold a shared lock on the entry they run.
//!
//! `mod.rs` holds the pure part ([`build`]); [`cache`] the content-addressed store.

mod cache;

pub use cache::{
    remove_cache, Cache, Origin, PinnedInstance, DEFAULT_CACHE_BYTES, DEFAULT_CACHE_ENTRIES,
};

use crate::instance::{
    BaseView, Builder, InstanceError, Layer, Plan, RuntimeSettings, TaskSetup, DEFAULT_PATH,
};
use crate::perturb::{self, PerturbError};
use crate::tasks::{self, TaskError};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("perturbation `{name}`: {source}")]
    Perturb { name: String, source: PerturbError },
    #[error("task `{task}`: {source}")]
    Task { task: String, source: TaskError },
    #[error("task `{task}`: the base `{base}` has no tool `{tool}` that the template requires")]
    MissingTool {
        task: String,
        base: String,
        tool: String,
    },
    #[error("unknown task `{0}` (known: {known})", known = tasks::names().join(", "))]
    UnknownTask(String),
    #[error(transparent)]
    Layer(#[from] InstanceError),
    #[error("instance cache {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
}

impl SynthError {
    /// True when the failure is the machine's (the cache's storage, a layer write, the
    /// sandbox), not the plan's.
    pub fn is_infrastructure(&self) -> bool {
        match self {
            Self::Cache { .. } => true,
            Self::Layer(e) => e.is_infrastructure(),
            Self::Sandbox(e) => e.is_infrastructure(),
            _ => false,
        }
    }

    /// The perturbation that cannot take hold in this instance, and why, when that is what
    /// failed (the plan is skipped, not counted).
    pub fn not_applicable(&self) -> Option<(&str, String)> {
        match self {
            Self::Perturb { name, source } => {
                source.not_applicable_reason().map(|w| (name.as_str(), w))
            }
            _ => None,
        }
    }
}

/// Run the task's setup and the perturbations of a plan on a base: the pure part of synthesis.
pub fn build(
    plan: &Plan,
    base: &BaseView,
) -> Result<(Layer, RuntimeSettings, Option<TaskSetup>, Vec<String>), SynthError> {
    let mut b = Builder::new(base, plan.seed, plan.resources.clone());
    for tool in &plan.tools {
        if b.which(tool, DEFAULT_PATH).is_none() {
            return Err(SynthError::MissingTool {
                task: plan
                    .task
                    .as_ref()
                    .map_or("template".into(), |t| t.name.clone()),
                base: plan.base.clone(),
                tool: tool.clone(),
            });
        }
    }
    if let Some(t) = &plan.task {
        let task = tasks::get(&t.name).ok_or_else(|| SynthError::UnknownTask(t.name.clone()))?;
        let setup = task
            .setup(t.seed, &mut b)
            .map_err(|source| SynthError::Task {
                task: t.name.clone(),
                source,
            })?;
        b.task = Some(setup);
    }
    let mut applied = Vec::new();
    for (i, c) in plan.perturbations.iter().enumerate() {
        let p = perturb::get(&c.name).ok_or_else(|| SynthError::Perturb {
            name: c.name.clone(),
            source: PerturbError::Unknown(c.name.clone()),
        })?;
        let params = p
            .info()
            .check(&c.params)
            .map_err(|source| SynthError::Perturb {
                name: c.name.clone(),
                source,
            })?;
        let what = p
            .apply(&params, &format!("{}#{i}", c.name), &mut b)
            .map_err(|source| SynthError::Perturb {
                name: c.name.clone(),
                source,
            })?;
        applied.push(format!("{}: {what}", c.name));
    }
    let Builder {
        layer,
        runtime,
        task,
        ..
    } = b;
    Ok((layer, runtime, task, applied))
}
