//! `sandbox`: isolated, snapshot-able Linux environments. Knows no RL.
//!
//! A [`Runtime`] creates [`Sandbox`]es: a resident init (PID 1 of fresh mount, pid, net, uts,
//! ipc and cgroup namespaces) over an overlay of read-only layers with a size-limited writable
//! layer, inside cgroups, serving typed requests (exec, files, reset, snapshot, rollback) over a
//! socketpair. The setup order and the security model are in `docs/sandbox.md`.

pub mod admission;
pub mod backend;
pub mod caps;
pub mod cgroup;
pub mod config;
pub mod debootstrap;
pub mod digest_cache;
pub mod docker;
#[cfg(all(feature = "testing", feature = "docker"))]
pub mod docker_testing;
pub mod error;
pub mod host_walk;
pub mod init;
mod init_forker;
mod init_reserve;
pub mod landlock;
pub mod layers;
pub mod mask_store;
pub mod mounts;
pub mod netns;
pub mod oci;
pub mod pool;
pub mod protocol;
pub mod runtime;
pub mod sandbox;
pub mod seccomp;
mod spawn_init;
pub mod state;
pub mod sys;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text_pos;

pub use self::sandbox::Sandbox;
pub use admission::Admission;
pub use backend::{Backend, DynBackend, SandboxOps};
pub use cgroup::Limits;
pub use config::SandboxConfig;
pub use error::SandboxError;
pub use layers::RootfsSpec;
pub use pool::{Lease, Pool};
pub use protocol::{Command, ExecRequest, ExecResult, Termination};
pub use runtime::{InitProgram, Runtime};

/// Lock a mutex whose data stays consistent at every step (caches filled in one assignment,
/// a Vec pushed and popped): a panic elsewhere does not make it unusable.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
