#![allow(dead_code, clippy::unwrap_used)]
//! Shared fixtures of the sandbox integration tests (they run as root).

use sandbox::{InitProgram, Runtime, SandboxConfig};

/// A fresh runtime over the default state directory. Each test owns its runtime, so whatever
/// it creates is removed when the test ends, even by a panic (RAII on unwind).
pub fn runtime() -> Runtime {
    Runtime::new(&sandbox::state::default_state_dir(), init_program()).unwrap()
}

pub fn init_program() -> InitProgram {
    InitProgram::at(env!("CARGO_BIN_EXE_sandbox-init").into(), vec![]).unwrap()
}

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

pub fn config() -> SandboxConfig {
    SandboxConfig::default()
}

pub fn sh(sb: &mut sandbox::Sandbox, cmd: &str) -> sandbox::ExecResult {
    sb.exec(&sandbox::ExecRequest::shell(cmd)).unwrap()
}

pub fn out(r: &sandbox::ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// Poll `cond` until it holds or `secs` pass (asynchronous kernel work: process exit, reaping).
pub fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() > until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
