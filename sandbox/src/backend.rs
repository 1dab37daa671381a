//! The backend seam: the native backend implements it today; a Docker backend (bollard) can be
//! added beside it without touching callers.

use crate::protocol::{DirEntry, ExecRequest, ExecResult, FileStat, Health};
use crate::{Runtime, Sandbox, SandboxConfig, SandboxError};

/// One live sandbox, whatever runs it.
pub trait SandboxOps: Send {
    fn exec(&mut self, req: &ExecRequest) -> Result<ExecResult, SandboxError>;
    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<(Vec<u8>, bool), SandboxError>;
    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<(), SandboxError>;
    fn stat(&mut self, path: &str) -> Result<FileStat, SandboxError>;
    fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError>;
    fn kill_all(&mut self) -> Result<(), SandboxError>;
    fn reset(&mut self) -> Result<(), SandboxError>;
    fn snapshot(&mut self) -> Result<u32, SandboxError>;
    fn rollback(&mut self, snapshot: u32) -> Result<(), SandboxError>;
    fn health(&mut self) -> Result<Health, SandboxError>;
    /// False once the sandbox can no longer be used (its init died).
    fn is_alive(&self) -> bool;
}

/// A source of sandboxes.
pub trait Backend: Send + Sync {
    type Sandbox: SandboxOps;
    fn name(&self) -> &'static str;
    fn create(&self, cfg: &SandboxConfig) -> Result<Self::Sandbox, SandboxError>;
}

impl Backend for Runtime {
    type Sandbox = Sandbox;
    fn name(&self) -> &'static str {
        "native"
    }
    fn create(&self, cfg: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        Runtime::create(self, cfg)
    }
}

impl SandboxOps for Sandbox {
    fn exec(&mut self, req: &ExecRequest) -> Result<ExecResult, SandboxError> {
        Sandbox::exec(self, req)
    }
    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<(Vec<u8>, bool), SandboxError> {
        Sandbox::read_file(self, path, max_bytes)
    }
    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<(), SandboxError> {
        Sandbox::write_file(self, path, data, mode)
    }
    fn stat(&mut self, path: &str) -> Result<FileStat, SandboxError> {
        Sandbox::stat(self, path)
    }
    fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        Sandbox::list_dir(self, path)
    }
    fn kill_all(&mut self) -> Result<(), SandboxError> {
        Sandbox::kill_all(self)
    }
    fn reset(&mut self) -> Result<(), SandboxError> {
        Sandbox::reset(self)
    }
    fn snapshot(&mut self) -> Result<u32, SandboxError> {
        Sandbox::snapshot(self)
    }
    fn rollback(&mut self, snapshot: u32) -> Result<(), SandboxError> {
        Sandbox::rollback(self, snapshot)
    }
    fn health(&mut self) -> Result<Health, SandboxError> {
        Sandbox::health(self)
    }
    fn is_alive(&self) -> bool {
        !self.is_dead()
    }
}
