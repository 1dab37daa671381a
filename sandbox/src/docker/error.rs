//! [`DockerError`]: what talking to a Docker daemon, exporting its images or running its
//! containers can fail with.

use std::path::PathBuf;

/// Errors of the Docker parts (compiled without the `docker` feature too, so that the
/// rootfs resolver can name them).
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("this build has no Docker support (the sandbox crate's `docker` feature is off)")]
    Unsupported,
    #[error("cannot connect to the Docker daemon at {host}: {reason}")]
    Connect { host: String, reason: String },
    #[error("Docker {what}: {reason}")]
    Api { what: String, reason: String },
    #[error("image `{image}` is not in the local Docker daemon: {reason}")]
    NoImage { image: String, reason: String },
    #[error("exporting image `{image}`: {source}")]
    Import {
        image: String,
        source: crate::oci::OciError,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("container {id}: {reason}")]
    Container { id: String, reason: String },
    #[error("the Docker backend {0}")]
    Config(String),
}

impl DockerError {
    #[cfg(feature = "docker")]
    pub(crate) fn api(what: impl Into<String>, e: impl std::fmt::Display) -> Self {
        Self::Api {
            what: what.into(),
            reason: e.to_string(),
        }
    }
}
