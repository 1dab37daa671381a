//! The vocabulary of the environment factory, a leaf: it depends on nothing else of the
//! factory, and perturbations, tasks and synthesis all build on it.
//!
//! - [`Plan`] (with [`PerturbationChoice`], [`Params`], [`Resources`], [`TaskRef`]): everything
//!   that determines an instance; [`instance_id`] is its content address
//!   ([`CATALOGUE_VERSION`], the base's digest, the plan).
//! - [`Builder`]: what a task's setup and the perturbations write through. It reads the base
//!   through [`BaseView`] and collects a [`Layer`] (the files) and [`RuntimeSettings`] (what a
//!   layer cannot hold: environment, limits, start steps, fault proxies).
//! - [`Instance`]: the result of synthesis, ready to run; [`TaskSetup`] is what a task's
//!   setup hands to its verifier and oracle.
//! - Path helpers: [`clean_path`], [`resolve_link`], [`sh_quote`], [`DEFAULT_PATH`].

mod base;
mod builder;
mod id;
mod layer;
mod params;
mod paths;
mod plan;
mod runtime;
mod task_setup;

pub use base::{BaseView, Meta};
pub use builder::Builder;
pub use id::{instance_id, rng_for, CATALOGUE_VERSION};
pub use layer::{Entry, Layer};
pub use params::{Params, ParamsExt, Value};
pub use paths::{clean_path, resolve_link, sh_quote, DEFAULT_PATH};
pub use plan::{PerturbationChoice, Plan, Resources, TaskRef};
pub use runtime::{
    plain_forward, ProxySpec, RuntimeSettings, StartStep, Toxics, FRONT_PORT, SERVICE_PORT,
};
pub use task_setup::TaskSetup;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Errors of building a layer: a path a layer cannot hold, a write that failed.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("layer path {path:?}: {reason}")]
    BadPath { path: String, reason: String },
    #[error("writing the layer at {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl InstanceError {
    /// True when the machine failed (a write of the layer), not the plan (a bad path).
    pub fn is_infrastructure(&self) -> bool {
        matches!(self, Self::Write { .. })
    }
}

/// A synthesized instance, ready to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub plan: Plan,
    pub base_digest: String,
    /// The read-only layer directory (on the instance cache's tmpfs).
    pub layer: PathBuf,
    pub runtime: RuntimeSettings,
    pub task: Option<TaskSetup>,
    /// What each perturbation did, in order (one line each).
    pub applied: Vec<String>,
    /// Bytes of file data in the layer.
    pub layer_bytes: u64,
}
