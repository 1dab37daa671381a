//! The native backend: a [`Runtime`] per process (run id, layer caches, cgroup layout) and the
//! [`Sandbox`] handle that speaks to one resident init.

use crate::cgroup::{self, Cgroup, Limits};
use crate::layers::{self, LayerError, Rootfs, RootfsSpec};
use crate::lock;
use crate::protocol::{
    read_frame, write_frame, DirEntry, ExecRequest, ExecResult, FailureKind, FileStat, Health,
    ProtocolError, Request, Response, SetupPlan, Termination,
};
use crate::state;
use crate::sys::RealSys;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Errors of the native backend.
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
    #[error("{kind:?}: {message}")]
    Request { kind: FailureKind, message: String },
    #[error("unexpected response to {request}: {response}")]
    Unexpected {
        request: &'static str,
        response: String,
    },
    #[error("policy: {0}")]
    Policy(String),
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

/// The program that becomes PID 1 of each sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProgram {
    pub path: PathBuf,
    pub args: Vec<String>,
}

impl InitProgram {
    /// `$ENVFACTORY_INIT`, else `envfactory-init` beside the running executable (or one
    /// directory up, as for test binaries in `target/*/deps`).
    pub fn locate() -> Result<Self, SandboxError> {
        if let Some(p) = std::env::var_os("ENVFACTORY_INIT") {
            return Self::at(PathBuf::from(p), vec![]);
        }
        let exe = std::env::current_exe().map_err(|e| SandboxError::InitProgram {
            path: "/proc/self/exe".into(),
            reason: e.to_string(),
        })?;
        let mut tried = Vec::new();
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("envfactory-init");
            if p.is_file() {
                return Self::at(p, vec![]);
            }
            tried.push(p.display().to_string());
        }
        Err(SandboxError::InitProgram {
            path: "envfactory-init".into(),
            reason: format!(
                "not found (looked at {}); build it with `cargo build --bin envfactory-init` or set ENVFACTORY_INIT",
                tried.join(", ")
            ),
        })
    }

    /// A specific program with arguments.
    pub fn at(path: PathBuf, args: Vec<String>) -> Result<Self, SandboxError> {
        if !path.is_file() {
            return Err(SandboxError::InitProgram {
                path,
                reason: "no such file".into(),
            });
        }
        Ok(Self { path, args })
    }
}

/// Configuration of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub rootfs: RootfsSpec,
    /// Extra read-only layer directories stacked above the rootfs, topmost first (a
    /// synthesized instance). Each must be on a filesystem other than any host directory the
    /// rootfs uses (overlayfs refuses a layer nested inside another layer): the engine keeps
    /// them on their own tmpfs. Their names (content hashes) enter the sandbox's digest.
    pub layers: Vec<PathBuf>,
    pub limits: Limits,
    /// Size of the writable layer; writing more gives ENOSPC.
    pub disk_bytes: u64,
    /// Inodes of the writable layer (`nr_inodes` of its tmpfs); creating more files gives
    /// ENOSPC. `None`: the tmpfs default.
    pub disk_inodes: Option<u64>,
    /// Absolute paths inside the root that are bound read-only over themselves after every
    /// root mount (creation, reset, rollback): writes under them fail with EROFS even for root
    /// inside. Each must exist in the root filesystem (the sandbox fails to start otherwise).
    pub readonly_paths: Vec<String>,
    pub hostname: String,
    pub env: Vec<String>,
    pub keep_caps: Vec<u8>,
    /// Install the seccomp policy (`sandbox/policy/seccomp.toml`).
    pub seccomp: bool,
    /// Apply the landlock policy (`sandbox/policy/landlock.toml`).
    pub landlock: bool,
    pub nofile: u64,
    /// Run commands in a user namespace: root inside is host uid/gid `USERNS_BASE`, an
    /// unprivileged id. Trade-off: files of the read-only layers (owned by host root) appear
    /// owned by `nobody` and cannot be modified by root inside; only the root directory and
    /// the home and scratch directories (`mounts::USERNS_OWNED`) belong to root inside.
    pub userns: bool,
}

/// Host uid and gid of root inside a user-namespaced sandbox (65,536 ids are mapped).
pub const USERNS_BASE: u32 = 100_000;

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            rootfs: RootfsSpec::Host,
            layers: Vec::new(),
            limits: Limits {
                memory_bytes: 256 << 20,
                pids: 128,
                cpus: 1.0,
            },
            disk_bytes: 64 << 20,
            disk_inodes: None,
            readonly_paths: Vec::new(),
            hostname: "sandbox".into(),
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "HOME=/root".into(),
                "USER=root".into(),
                "LOGNAME=root".into(),
                "SHELL=/bin/sh".into(),
                "TERM=dumb".into(),
                "LANG=C.UTF-8".into(),
            ],
            keep_caps: crate::caps::DEFAULT_KEEP.to_vec(),
            seccomp: true,
            landlock: true,
            nofile: 1024,
            userns: false,
        }
    }
}

struct Inner {
    state: PathBuf,
    run: String,
    run_dir: PathBuf,
    cgroups: cgroup::Layout,
    init: InitProgram,
    counter: AtomicU64,
    rootfs: Mutex<HashMap<RootfsSpec, Rootfs>>,
    host_mask: Mutex<Option<(PathBuf, String)>>,
    seccomp: Mutex<Option<crate::seccomp::CompiledSeccomp>>,
}

/// One process's handle on the sandbox machinery. Creating it reaps the leftovers of crashed
/// runs; dropping it removes everything the run created.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("run", &self.inner.run)
            .finish()
    }
}

impl Runtime {
    /// A runtime over `state` (see [`state::default_state_dir`]) using `init` as PID 1.
    pub fn new(state: &Path, init: InitProgram) -> Result<Self, SandboxError> {
        raise_nofile();
        let cgroups = cgroup::Layout::detect()?;
        let roots: Vec<PathBuf> = cgroups.roots().into_iter().map(|r| r.1).collect();
        let reaped = state::reap(state, &roots, None);
        if !reaped.runs.is_empty() {
            tracing::info!(
                runs = reaped.runs.len(),
                processes = reaped.processes,
                mounts = reaped.mounts,
                cgroups = reaped.cgroups,
                "reaped crashed runs"
            );
        }
        let run = state::new_run_id();
        let run_dir = state::create_run(state, &run)?;
        tracing::debug!(run = %run, dir = %run_dir.display(), "runtime started");
        Ok(Self {
            inner: Arc::new(Inner {
                state: state.to_path_buf(),
                run,
                run_dir,
                cgroups,
                init,
                counter: AtomicU64::new(0),
                rootfs: Mutex::new(HashMap::new()),
                host_mask: Mutex::new(None),
                seccomp: Mutex::new(None),
            }),
        })
    }

    /// The default state directory and the located init program.
    pub fn from_env() -> Result<Self, SandboxError> {
        Self::new(&state::default_state_dir(), InitProgram::locate()?)
    }

    pub fn run_id(&self) -> &str {
        &self.inner.run
    }

    pub fn run_dir(&self) -> &Path {
        &self.inner.run_dir
    }

    pub fn state_dir(&self) -> &Path {
        &self.inner.state
    }

    /// The cgroup hierarchy roots in use.
    pub fn cgroup_roots(&self) -> Vec<PathBuf> {
        self.inner
            .cgroups
            .roots()
            .into_iter()
            .map(|r| r.1)
            .collect()
    }

    /// Resolve a rootfs source into layers (cached per runtime).
    pub fn resolve(&self, spec: &RootfsSpec) -> Result<Rootfs, SandboxError> {
        let mut cache = lock(&self.inner.rootfs);
        if let Some(r) = cache.get(spec) {
            return Ok(r.clone());
        }
        let r = match spec {
            RootfsSpec::Host => {
                let (mask, digest) = self.host_mask()?;
                Rootfs {
                    lowers: vec![mask.to_string_lossy().into_owned(), "/".into()],
                    digest,
                }
            }
            RootfsSpec::Dir(p) => {
                let p = p.canonicalize().map_err(|e| LayerError::BadDirectory {
                    path: p.clone(),
                    reason: e.to_string(),
                })?;
                Rootfs {
                    digest: layers::dir_digest(&p)?,
                    lowers: vec![p.to_string_lossy().into_owned()],
                }
            }
            RootfsSpec::Oci(p) => {
                let store = self.inner.state.join("layers");
                let img = crate::oci::import(p, &store, &crate::oci::ImportLimits::default())
                    .map_err(|source| LayerError::Oci {
                        path: p.clone(),
                        source,
                    })?;
                let lowers: Vec<String> = img
                    .layers
                    .iter()
                    .rev()
                    .map(|id| store.join(id).to_string_lossy().into_owned())
                    .collect();
                let digest = {
                    use sha2::Digest;
                    let mut h = sha2::Sha256::new();
                    for l in &img.layers {
                        h.update(l.as_bytes());
                        h.update(b"\n");
                    }
                    format!("sha256-{}", hex::encode(h.finalize()))
                };
                Rootfs { lowers, digest }
            }
        };
        cache.insert(spec.clone(), r.clone());
        Ok(r)
    }

    /// The host layer's mask: a small tmpfs in the host mount namespace, built once per run.
    /// (It cannot live on the root filesystem: overlayfs refuses a lower layer nested inside
    /// another lower layer, and the host's `/` is one.)
    fn host_mask(&self) -> Result<(PathBuf, String), SandboxError> {
        let mut guard = lock(&self.inner.host_mask);
        if let Some(m) = guard.as_ref() {
            return Ok(m.clone());
        }
        // Plan once (one walk of the host) relative to `/`, so the digest does not depend on
        // where this run keeps the mask; then perform the plan under the mask directory.
        let mut plan = crate::sys::Recorder::default();
        layers::plan_host_mask(&mut plan, Path::new("/"), &layers::RealHost)?;
        let digest = layers::host_digest(&plan.ops);
        let dir = self.inner.run_dir.join("hostmask");
        let plan = plan.rebased(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| SandboxError::Spawn {
            what: "creating the host mask directory",
            source,
        })?;
        let mut sys = RealSys;
        use crate::sys::Sys;
        sys.mount(
            "envfactory-hostmask",
            &dir,
            "tmpfs",
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            "mode=0755,size=4m",
        )
        .map_err(LayerError::from)?;
        if let Err(e) = plan.replay(&mut sys) {
            let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
            return Err(LayerError::from(e).into());
        }
        // Read-only from now on.
        sys.mount(
            "",
            &dir,
            "",
            nix::mount::MsFlags::MS_REMOUNT
                | nix::mount::MsFlags::MS_RDONLY
                | nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV,
            "",
        )
        .map_err(LayerError::from)?;
        *guard = Some((dir.clone(), digest.clone()));
        Ok((dir, digest))
    }

    fn seccomp(
        &self,
        cfg: &SandboxConfig,
    ) -> Result<Option<crate::seccomp::CompiledSeccomp>, SandboxError> {
        if !cfg.seccomp {
            return Ok(None);
        }
        let mut g = lock(&self.inner.seccomp);
        if g.is_none() {
            // Fail closed: a policy that does not load or compile stops every sandbox.
            let p = crate::seccomp::SeccompPolicy::embedded()
                .and_then(|p| p.compile())
                .map_err(|e| SandboxError::Policy(e.to_string()))?;
            *g = Some(p);
        }
        Ok(g.clone())
    }

    /// Create a sandbox: cgroups, namespaces, init, root filesystem.
    pub fn create(&self, cfg: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        let t0 = std::time::Instant::now();
        let us = |t: std::time::Instant| t.elapsed().as_micros() as u64;
        let rootfs = stack_layers(self.resolve(&cfg.rootfs)?, &cfg.layers)?;
        let seccomp = self.seccomp(cfg)?;
        let n = self.inner.counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("s{n}");
        let dir = self.inner.run_dir.join("sbx").join(&name);
        std::fs::create_dir(&dir).map_err(|source| SandboxError::Spawn {
            what: "creating the sandbox directory",
            source,
        })?;
        let mut guard = CreateGuard {
            dir: Some(dir.clone()),
        };
        let t_cg = std::time::Instant::now();
        let cgroup = Cgroup::create(&self.inner.cgroups, &self.inner.run, &name, &cfg.limits)?;
        let cgroup_us = us(t_cg);
        let (host_sock, child_sock) = UnixStream::pair().map_err(|source| SandboxError::Spawn {
            what: "socketpair",
            source,
        })?;
        let t_spawn = std::time::Instant::now();
        let pid = spawn_init(&self.inner.init, child_sock.into())?;
        let spawn_us = us(t_spawn);
        let mut sb = Sandbox {
            rt: self.clone(),
            name,
            dir,
            sock: host_sock,
            pid,
            cgroup,
            rootfs: rootfs.clone(),
            dead: false,
        };
        guard.dir = None; // the sandbox's Drop owns cleanup from here on
        let rec = self
            .inner
            .run_dir
            .join("sbx")
            .join(format!("{}.init", sb.name));
        let _ = std::fs::write(&rec, state::identity(pid));
        let plan = SetupPlan {
            sandbox_dir: sb.dir.to_string_lossy().into_owned(),
            cgroup_join: sb
                .cgroup
                .self_join_files()
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            lowers: rootfs.lowers,
            disk_bytes: cfg.disk_bytes,
            disk_inodes: cfg.disk_inodes,
            readonly_paths: cfg.readonly_paths.clone(),
            hostname: cfg.hostname.clone(),
            env: cfg.env.clone(),
            keep_caps: cfg.keep_caps.clone(),
            seccomp,
            landlock: cfg.landlock,
            nofile: cfg.nofile,
            userns: cfg.userns.then_some((USERNS_BASE, 65_536)),
        };
        let t_setup = std::time::Instant::now();
        match sb.call(Request::Setup(Box::new(plan)), Duration::from_secs(30))? {
            Response::Ok => {}
            Response::Failed { message, .. } => return Err(SandboxError::Setup(message)),
            other => {
                return Err(SandboxError::Unexpected {
                    request: "setup",
                    response: format!("{other:?}"),
                })
            }
        }
        tracing::debug!(
            sandbox = %sb.name,
            pid,
            cgroup_us,
            spawn_us,
            setup_us = us(t_setup),
            total_us = us(t0),
            "sandbox ready"
        );
        Ok(sb)
    }
}

/// Put extra read-only layers above a resolved rootfs; the digest covers their names.
fn stack_layers(base: Rootfs, layers: &[PathBuf]) -> Result<Rootfs, SandboxError> {
    if layers.is_empty() {
        return Ok(base);
    }
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(base.digest.as_bytes());
    let mut lowers = Vec::with_capacity(layers.len() + base.lowers.len());
    for l in layers {
        if !l.is_absolute() || !l.is_dir() {
            return Err(LayerError::BadDirectory {
                path: l.clone(),
                reason: "an extra layer must be an existing absolute directory".into(),
            }
            .into());
        }
        h.update(b"\n");
        h.update(l.as_os_str().as_encoded_bytes());
        lowers.push(l.to_string_lossy().into_owned());
    }
    lowers.extend(base.lowers);
    Ok(Rootfs {
        lowers,
        digest: format!("sha256-{}", hex::encode(h.finalize())),
    })
}

/// One socket per live sandbox: lift the soft descriptor limit to the hard one (allowed
/// without privilege), so a thousand sandboxes fit.
fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::debug!(error = %e, soft, hard, "could not raise RLIMIT_NOFILE");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some((mask, _)) = self.host_mask.get_mut().ok().and_then(|m| m.take()) {
            let _ = nix::mount::umount2(&mask, nix::mount::MntFlags::MNT_DETACH);
        }
        for m in state::mounts_under(&self.run_dir) {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        for (_, root) in self.cgroups.roots() {
            let _ = cgroup::remove(&root.join(cgroup::TOP).join(&self.run));
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
        tracing::debug!(run = %self.run, "runtime cleaned up");
    }
}

struct CreateGuard {
    dir: Option<PathBuf>,
}

impl Drop for CreateGuard {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Clone a child into new namespaces and exec the init program in it with the control socket
/// on fd 3. The child runs only async-signal-safe code between clone and execve.
fn spawn_init(init: &InitProgram, sock: OwnedFd) -> Result<i32, SandboxError> {
    let bad = |reason: &str| SandboxError::InitProgram {
        path: init.path.clone(),
        reason: reason.into(),
    };
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(init.path.as_os_str().as_bytes()).map_err(|_| bad("NUL in path"))?;
    let mut args = vec![path.clone()];
    for a in &init.args {
        args.push(CString::new(a.as_bytes()).map_err(|_| bad("NUL in argument"))?);
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let env = [
        c"PATH=/usr/sbin:/usr/bin:/sbin:/bin".as_ptr(),
        std::ptr::null(),
    ];
    let flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC;
    let fd = sock.as_raw_fd();
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack). The child only calls
    // async-signal-safe functions (fcntl, dup2, execve, _exit) on data prepared before the
    // clone, so the state of other threads of this process does not matter to it.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: see above; this branch is the child and never returns.
        unsafe {
            if fd == crate::init::CONTROL_FD {
                libc::fcntl(fd, libc::F_SETFD, 0);
            } else {
                libc::dup2(fd, crate::init::CONTROL_FD);
            }
            libc::execve(path.as_ptr(), argv.as_ptr(), env.as_ptr());
            libc::_exit(127);
        }
    }
    if pid < 0 {
        return Err(SandboxError::Spawn {
            what: "clone into new namespaces",
            source: std::io::Error::last_os_error(),
        });
    }
    drop(sock);
    Ok(pid as i32)
}

/// A live sandbox. Dropping it kills everything in it and removes its cgroups and directory.
pub struct Sandbox {
    rt: Runtime,
    name: String,
    dir: PathBuf,
    sock: UnixStream,
    pid: i32,
    cgroup: Cgroup,
    rootfs: Rootfs,
    dead: bool,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("dead", &self.dead)
            .finish()
    }
}

const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

impl Sandbox {
    /// Host pid of the sandbox's init.
    pub fn init_pid(&self) -> i32 {
        self.pid
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Digest of the root filesystem's base layers.
    pub fn rootfs_digest(&self) -> &str {
        &self.rootfs.digest
    }

    pub fn is_dead(&self) -> bool {
        self.dead
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    fn call(&mut self, req: Request, timeout: Duration) -> Result<Response, SandboxError> {
        if self.dead {
            return Err(SandboxError::Dead);
        }
        let r = (|| {
            self.sock
                .set_read_timeout(Some(timeout))
                .map_err(ProtocolError::Io)?;
            write_frame(&mut self.sock, "request", &req)?;
            read_frame::<Response>(&mut self.sock, "response")
        })();
        match r {
            Ok(resp) => Ok(resp),
            Err(ProtocolError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                self.kill();
                Err(SandboxError::Unresponsive(timeout))
            }
            Err(ProtocolError::Closed) | Err(ProtocolError::Io(_)) => {
                self.kill();
                Err(SandboxError::Dead)
            }
            Err(e) => {
                self.kill();
                Err(e.into())
            }
        }
    }

    fn expect_ok(&mut self, req: Request, what: &'static str) -> Result<(), SandboxError> {
        match self.call(req, CONTROL_TIMEOUT)? {
            Response::Ok => Ok(()),
            other => Err(unexpected(what, other)),
        }
    }

    /// Run one command.
    pub fn exec(&mut self, req: &ExecRequest) -> Result<ExecResult, SandboxError> {
        let oom_before = self.cgroup.oom_kills();
        let timeout = Duration::from_millis(req.timeout_ms) + CONTROL_TIMEOUT;
        match self.call(Request::Exec(Box::new(req.clone())), timeout)? {
            Response::Exec(mut r) => {
                // Only a SIGKILL (or a shell reporting one) can be the OOM killer's.
                if matches!(
                    r.termination,
                    Termination::Signaled(libc::SIGKILL) | Termination::Exited(137)
                ) {
                    r.oom_killed = self.cgroup.oom_kills() > oom_before;
                }
                Ok(*r)
            }
            other => Err(unexpected("exec", other)),
        }
    }

    /// Read a file (up to `max_bytes`); returns the data and whether it was cut.
    pub fn read_file(
        &mut self,
        path: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, bool), SandboxError> {
        self.read_file_with(path, max_bytes, false)
    }

    /// [`Self::read_file`] of a regular file that is not a symlink itself (a final symlink is
    /// an `Invalid` failure; symlinks on the way still resolve inside the root). One request,
    /// where `stat` then `read_file` would be two and racy.
    pub fn read_file_nofollow(
        &mut self,
        path: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, bool), SandboxError> {
        self.read_file_with(path, max_bytes, true)
    }

    fn read_file_with(
        &mut self,
        path: &str,
        max_bytes: u64,
        nofollow: bool,
    ) -> Result<(Vec<u8>, bool), SandboxError> {
        match self.call(
            Request::ReadFile {
                path: path.into(),
                max_bytes,
                nofollow,
            },
            CONTROL_TIMEOUT,
        )? {
            Response::File { data, truncated } => Ok((data, truncated)),
            other => Err(unexpected("read_file", other)),
        }
    }

    pub fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<(), SandboxError> {
        self.expect_ok(
            Request::WriteFile {
                path: path.into(),
                data: data.to_vec(),
                mode,
            },
            "write_file",
        )
    }

    pub fn stat(&mut self, path: &str) -> Result<FileStat, SandboxError> {
        match self.call(Request::Stat { path: path.into() }, CONTROL_TIMEOUT)? {
            Response::Stat(s) => Ok(s),
            other => Err(unexpected("stat", other)),
        }
    }

    pub fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        match self.call(Request::ListDir { path: path.into() }, CONTROL_TIMEOUT)? {
            Response::Dir(d) => Ok(d),
            other => Err(unexpected("list_dir", other)),
        }
    }

    /// Kill every process but init.
    pub fn kill_all(&mut self) -> Result<(), SandboxError> {
        self.expect_ok(Request::KillAll, "kill_all")
    }

    /// Kill every process but init and revert the filesystem to its base layers.
    pub fn reset(&mut self) -> Result<(), SandboxError> {
        self.expect_ok(Request::Reset, "reset")
    }

    /// Freeze the current filesystem diff into a layer; returns its number.
    pub fn snapshot(&mut self) -> Result<u32, SandboxError> {
        match self.call(Request::Snapshot, CONTROL_TIMEOUT)? {
            Response::Snapshot(n) => Ok(n),
            other => Err(unexpected("snapshot", other)),
        }
    }

    /// Kill every process but init and return the filesystem to snapshot `n`.
    pub fn rollback(&mut self, n: u32) -> Result<(), SandboxError> {
        self.expect_ok(Request::Rollback { snapshot: n }, "rollback")
    }

    pub fn health(&mut self) -> Result<Health, SandboxError> {
        match self.call(Request::Health, CONTROL_TIMEOUT)? {
            Response::Health(h) => Ok(h),
            other => Err(unexpected("health", other)),
        }
    }

    /// Memory charged to the sandbox's cgroup, bytes.
    pub fn memory_usage(&self) -> u64 {
        self.cgroup.memory_usage()
    }

    fn kill(&mut self) {
        if !self.dead {
            // SAFETY: kill with integer arguments; the pid is our own child, not yet reaped.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
            self.dead = true;
        }
    }
}

fn unexpected(request: &'static str, r: Response) -> SandboxError {
    match r {
        Response::Failed { kind, message } => SandboxError::Request { kind, message },
        other => SandboxError::Unexpected {
            request,
            response: format!("{other:?}"),
        },
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if !self.dead {
            // Asking init to shut down lets it kill and reap its processes; killing it is the
            // fallback, and its pid namespace takes every remaining process along.
            let _ = self.sock.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = write_frame(&mut self.sock, "request", &Request::Shutdown);
            let _ = read_frame::<Response>(&mut self.sock, "response");
            self.kill();
        }
        if let Err(e) = self.cgroup.destroy() {
            tracing::warn!(sandbox = %self.name, error = %e, "cgroup cleanup failed");
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(
            self.rt
                .inner
                .run_dir
                .join("sbx")
                .join(format!("{}.init", self.name)),
        );
    }
}
