//! [`SandboxError`]: what creating, or talking to, a sandbox can fail with.

use crate::cgroup;
use crate::layers::LayerError;
use crate::protocol::{FailureKind, ProtocolError};
use crate::state;
use std::path::PathBuf;
use std::time::Duration;

/// Errors of the sandbox runtime and of requests to a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("sandbox init program {path}: {reason}")]
    InitProgram { path: PathBuf, reason: String },
    #[error("starting the sandbox: {what}: {source}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("talking to the sandbox init: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("the sandbox did not answer within {0:?}; it has been destroyed")]
    Unresponsive(Duration),
    #[error("the sandbox is dead (its init exited); create a new one")]
    Dead,
    #[error("{kind}: {message}")]
    Request { kind: FailureKind, message: String },
    #[error("unexpected response to {request}: {response}")]
    Unexpected {
        request: &'static str,
        response: String,
    },
    #[error("policy: {0}")]
    Policy(String),
    #[error("sandbox config: {0}")]
    Config(String),
    #[error(transparent)]
    Docker(#[from] crate::docker::DockerError),
    #[error("admission control refused a new sandbox: {0}")]
    Admission(#[from] crate::admission::Refusal),
}

impl SandboxError {
    /// True when the failure is the infrastructure's, not the command's or the request's.
    pub fn is_infrastructure(&self) -> bool {
        !matches!(
            self,
            Self::Request {
                kind: FailureKind::NotFound
                    | FailureKind::Invalid
                    | FailureKind::Denied
                    | FailureKind::Spawn,
                ..
            }
        )
    }
}
