#![allow(dead_code, clippy::unwrap_used)]
//! Shared fixtures of the engine's integration tests (root tests skip when not root).

use sandbox::{InitProgram, Runtime};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skip (with a message) when not root: these tests need namespaces, mounts and cgroups.
#[macro_export]
macro_rules! require_root {
    () => {
        if !common::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

pub fn init_program() -> InitProgram {
    InitProgram::at(env!("CARGO_BIN_EXE_envfactory-init").into(), vec![]).unwrap()
}

/// A fresh runtime over the default state directory; dropping it removes what it created.
pub fn runtime() -> Runtime {
    Runtime::new(&sandbox::state::default_state_dir(), init_program()).unwrap()
}

/// A private state directory whose instance cache (a tmpfs) is unmounted when dropped.
pub struct TempState {
    pub dir: tempfile::TempDir,
}

impl TempState {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for TempState {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(
            &self.dir.path().join("instances"),
            nix::mount::MntFlags::MNT_DETACH,
        );
    }
}

/// The shared instance cache of the default state directory.
pub fn cache() -> engine::synth::Cache {
    engine::synth::Cache::open(&sandbox::state::default_state_dir()).unwrap()
}
