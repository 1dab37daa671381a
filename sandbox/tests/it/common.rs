//! What these tests share beyond `sandbox::testing`: this crate's own init program, the
//! default config, and the locks that keep apart the few tests which, now that they share one
//! process, could otherwise see each other's work.

use sandbox::{InitProgram, Runtime, SandboxConfig};
use std::sync::{Mutex, MutexGuard};

pub use sandbox::require_root;
pub use sandbox::testing::{eventually, out, sh};

pub fn init_program() -> InitProgram {
    InitProgram::at(env!("CARGO_BIN_EXE_sandbox-init").into(), vec![]).unwrap()
}

/// A fresh runtime over the default state directory. Each test owns its runtime, so whatever
/// it creates is removed when the test ends, even by a panic (RAII on unwind). Starting one
/// reaps the runs of dead processes, so it waits for [`RUNTIME_START`].
pub fn runtime() -> Runtime {
    let _starting = serial(&RUNTIME_START);
    sandbox::testing::runtime_with(init_program())
}

pub fn config() -> SandboxConfig {
    SandboxConfig::default()
}

/// Held while a runtime of this process starts, and by the crash test from the moment it kills
/// its child until its own runtime has reaped the child's run: no other test's runtime may reap
/// that run first (the crash test checks that the run is left behind, then that a start reaps
/// it).
pub static RUNTIME_START: Mutex<()> = Mutex::new(());

/// Held by the tests that count processes host-wide (`ps`) or start the processes such a count
/// looks for (`sleep 1000`).
pub static HOST_PROCESSES: Mutex<()> = Mutex::new(());

/// Held by the tests that import images into the default state directory's shared layer
/// store, and by the one that counts that store's entries.
pub static LAYER_STORE: Mutex<()> = Mutex::new(());

/// Hold `lock` for the rest of the scope; a test that panicked while holding it does not
/// poison it for the others.
pub fn serial(lock: &'static Mutex<()>) -> MutexGuard<'static, ()> {
    lock.lock().unwrap_or_else(|p| p.into_inner())
}
