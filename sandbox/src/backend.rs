//! The backend seam: the native backend ([`Runtime`]) and, with the `docker` feature, the
//! Docker backend (`docker::DockerBackend`) implement it.

use crate::protocol::{
    DirEntry, ExecRequest, ExecResult, FileKind, FileStat, Health, Look, Overview, Response,
    ShownEntry,
};
use crate::{Runtime, Sandbox, SandboxConfig, SandboxError};

/// One live sandbox, whatever runs it.
pub trait SandboxOps: Send {
    fn exec(&mut self, req: &ExecRequest) -> Result<ExecResult, SandboxError>;
    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<(Vec<u8>, bool), SandboxError>;
    /// [`SandboxOps::read_file`] of a regular file that is not a symlink itself (a final
    /// symlink is an `Invalid` failure; symlinks on the way resolve inside the root).
    fn read_file_nofollow(
        &mut self,
        path: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, bool), SandboxError>;
    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<(), SandboxError>;
    fn stat(&mut self, path: &str) -> Result<FileStat, SandboxError>;
    fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError>;
    /// A directory's first `max_entries` names and kinds and the disk usage; by default a
    /// [`Self::list_dir`] and a [`Self::health`] (the native backend asks init once).
    fn overview(&mut self, path: &str, max_entries: u32) -> Result<Overview, SandboxError> {
        let entries = match self.list_dir(path) {
            Ok(d) => {
                let mut v: Vec<ShownEntry> = d
                    .into_iter()
                    .map(|e| ShownEntry {
                        is_dir: e.stat.kind == FileKind::Dir,
                        name: e.name,
                    })
                    .collect();
                ShownEntry::sort_shown(&mut v);
                v.truncate(max_entries as usize);
                Some(v)
            }
            Err(e) if e.is_infrastructure() => return Err(e),
            Err(_) => None,
        };
        Ok(Overview {
            entries,
            upper_bytes: self.health()?.upper_bytes,
        })
    }
    fn kill_all(&mut self) -> Result<(), SandboxError>;
    fn reset(&mut self) -> Result<(), SandboxError>;
    /// [`Self::reset`], then `looks` answered on the fresh state, in order; by default none
    /// are (an empty answer: ask them one by one). The native backend answers them in the
    /// reset's own exchange.
    fn reset_and_look(&mut self, looks: &[Look]) -> Result<Vec<Response>, SandboxError> {
        let _ = looks;
        self.reset().map(|()| Vec::new())
    }
    fn snapshot(&mut self) -> Result<u32, SandboxError>;
    fn rollback(&mut self, snapshot: u32) -> Result<(), SandboxError>;
    fn health(&mut self) -> Result<Health, SandboxError>;
    /// False once the sandbox can no longer be used (its init died).
    fn is_alive(&self) -> bool;
    /// Processes in the sandbox now (its own helpers included), and its pids limit.
    fn pids_usage(&self) -> (u64, Option<u64>);
    /// Host pid of a process in the sandbox's namespaces (its init): the network namespace
    /// that verifiers' TCP requests and fault proxies join.
    fn init_pid(&self) -> i32;
    /// Copy the sandbox's writable layer (its diff over the lowers: whiteouts and opaque
    /// directories kept) into `dst`, a new directory, to stack as a layer of another sandbox;
    /// the bytes copied. `None` where the backend cannot (Docker). Stop the processes first.
    /// A diff whose files' apparent sizes add up to more than `max_bytes` is refused.
    fn export_diff(
        &self,
        _dst: &std::path::Path,
        _max_bytes: u64,
    ) -> Result<Option<u64>, SandboxError> {
        Ok(None)
    }
}

/// A source of sandboxes.
pub trait Backend: Send + Sync {
    type Sandbox: SandboxOps;
    fn name(&self) -> &'static str;
    /// Whether a sandbox keeps its network namespace (and init) across `reset` and
    /// `rollback`, so that what joined it from outside (fault proxies) stays in it.
    fn keeps_namespaces_across_resets(&self) -> bool {
        true
    }
    fn create(&self, cfg: &SandboxConfig) -> Result<Self::Sandbox, SandboxError>;
}

/// A [`Backend`] whose sandboxes are boxed: for callers that choose the backend at run time
/// (a configuration or command-line option) and hold it as `dyn DynBackend`.
pub trait DynBackend: Send + Sync {
    fn name(&self) -> &'static str;
    /// [`Backend::keeps_namespaces_across_resets`].
    fn keeps_namespaces_across_resets(&self) -> bool;
    fn create_boxed(&self, cfg: &SandboxConfig) -> Result<Box<dyn SandboxOps>, SandboxError>;
}

impl<B> DynBackend for B
where
    B: Backend,
    B::Sandbox: 'static,
{
    fn name(&self) -> &'static str {
        Backend::name(self)
    }
    fn keeps_namespaces_across_resets(&self) -> bool {
        Backend::keeps_namespaces_across_resets(self)
    }
    fn create_boxed(&self, cfg: &SandboxConfig) -> Result<Box<dyn SandboxOps>, SandboxError> {
        Ok(Box::new(self.create(cfg)?))
    }
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
    fn read_file_nofollow(
        &mut self,
        path: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, bool), SandboxError> {
        Sandbox::read_file_nofollow(self, path, max_bytes)
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
    fn overview(&mut self, path: &str, max_entries: u32) -> Result<Overview, SandboxError> {
        Sandbox::overview(self, path, max_entries)
    }
    fn kill_all(&mut self) -> Result<(), SandboxError> {
        Sandbox::kill_all(self)
    }
    fn reset(&mut self) -> Result<(), SandboxError> {
        Sandbox::reset(self)
    }
    fn reset_and_look(&mut self, looks: &[Look]) -> Result<Vec<Response>, SandboxError> {
        Sandbox::reset_and_look(self, looks)
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
    fn init_pid(&self) -> i32 {
        Sandbox::init_pid(self)
    }
    fn pids_usage(&self) -> (u64, Option<u64>) {
        Sandbox::pids_usage(self)
    }
    fn export_diff(
        &self,
        dst: &std::path::Path,
        max_bytes: u64,
    ) -> Result<Option<u64>, SandboxError> {
        Sandbox::export_diff(self, dst, max_bytes).map(Some)
    }
}
