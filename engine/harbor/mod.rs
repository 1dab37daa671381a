//! Harbor and Terminal-Bench task folders run in the factory's sandboxes: the folder
//! ([`task`]), its Dockerfile subset ([`dockerfile`]) built into cached layers in build
//! sandboxes ([`build`]; a `python` image's Debian suite: `python_base.rs`; the host's CA
//! bundle in build steps on a suite: `host_trust.rs`), and the episode: the agent (or the oracle), then the task's own
//! tests, the reward read by the host ([`episode`]), the agent kept away from the verdict
//! ([`verifier`]); the factory's faults on top ([`perturb`]). `docs/harbor.md` has the supported subset.

pub mod build;
pub mod dockerfile;
pub mod episode;
mod host_trust;
pub mod perturb;
mod python_base;
pub mod registries;
pub mod task;
mod verifier;

pub use build::{build_image, BuildOptions, Image, LayerStore};
pub use episode::{check_task, run_episode, Agent, Outcome};
pub use perturb::perturb_image;
pub use registries::{BuildNetwork, Registry};
pub use task::{load, Layout, Oracle, Task};
pub use verifier::{IMAGE_PYTHONPATH, SAFE_PATH_SITECUSTOMIZE};

use std::path::PathBuf;

/// Errors of task folders, their builds and episodes; each names its file (and line).
#[derive(Debug, thiserror::Error)]
pub enum HarborError {
    #[error("{}: missing {file}", dir.display())]
    Missing { dir: PathBuf, file: String },
    #[error(transparent)]
    Read(Box<crate::text::TextError>),
    #[error("{}: {reason}", file.display())]
    Config { file: PathBuf, reason: String },
    #[error("{}: unsupported: {what}", file.display())]
    Unsupported { file: PathBuf, what: String },
    #[error("{}: {}", file.display(), source)]
    Dockerfile {
        file: PathBuf,
        source: dockerfile::DockerfileError,
    },
    #[error("{}: line {line}: {reason}", file.display())]
    Build {
        file: PathBuf,
        line: usize,
        reason: String,
    },
    /// The build network (`registries.rs`) did not start for a build step.
    #[error("{}: line {line}: starting the build network: {source}", file.display())]
    BuildNetwork {
        file: PathBuf,
        line: usize,
        source: registries::RegistryError,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--perturb: {0}")]
    Perturb(Box<crate::synth::SynthError>),
    #[error("{what}: {source}")]
    Sandbox {
        what: String,
        source: Box<sandbox::SandboxError>,
    },
    /// A failure of this host, not of the task or the agent (the layer store's I/O, a
    /// sandbox that does not start even without the agent's changes): the episode is
    /// masked, never scored.
    #[error("infrastructure failure (not the agent's): {what}: {reason}")]
    Infrastructure { what: String, reason: String },
}

impl HarborError {
    /// Whether the error is the task folder's (bad input: a missing file, a bad config or
    /// Dockerfile, a build step that fails), not a sandbox or engine failure.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            Self::Io { .. }
                | Self::Sandbox { .. }
                | Self::Infrastructure { .. }
                | Self::BuildNetwork { .. }
        )
    }

    /// Whether the task uses something outside the supported subset (it is skipped, not
    /// half-run).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            Self::Unsupported { .. }
                | Self::Dockerfile {
                    source: dockerfile::DockerfileError::Unsupported { .. },
                    ..
                }
        )
    }
}

/// A sandbox error with what was being done.
pub(crate) fn sbx_err(
    what: impl Into<String>,
) -> impl FnOnce(sandbox::SandboxError) -> HarborError {
    let what = what.into();
    move |source| HarborError::Sandbox {
        what,
        source: Box::new(source),
    }
}
