//! A [`Sandbox`]: the handle on one live sandbox, speaking the request protocol to its
//! resident init (exec, files, reset, snapshot, rollback).

use crate::cgroup::Cgroup;
use crate::config::{SandboxConfig, USERNS_BASE};
use crate::error::SandboxError;
use crate::layers::Rootfs;
use crate::protocol::{
    read_frame, write_frame, DirEntry, ExecRequest, ExecResult, FailureKind, FileStat, Health,
    Look, Overview, ProtocolError, Request, Response, SetUp, SetupPlan, Termination,
};
use crate::runtime::Runtime;
use crate::seccomp::CompiledSeccomp;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

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
    /// The cgroup's count of forks refused at the pids limit when a refused fork was last
    /// classified (read only then, never on the path of a normal step).
    limit_hits_seen: u64,
    /// Set when this sandbox took an init started ahead: the runtime's reserve starts its
    /// replacement once this sandbox's first request is answered (or it is dropped), not
    /// while that request runs (`init_reserve.rs`).
    refill_pending: bool,
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
    /// The handle of a just-spawned init; from here on its `Drop` cleans up.
    pub(crate) fn new(
        rt: Runtime,
        name: String,
        dir: PathBuf,
        sock: UnixStream,
        pid: i32,
        cgroup: Cgroup,
        rootfs: Rootfs,
    ) -> Self {
        Self {
            rt,
            name,
            dir,
            sock,
            pid,
            cgroup,
            rootfs,
            dead: false,
            limit_hits_seen: 0,
            refill_pending: false,
        }
    }

    /// Defer the init reserve's refill to this sandbox's first answered request.
    pub(crate) fn defer_refill(&mut self) {
        self.refill_pending = true;
    }

    /// Let the runtime's init reserve refill now instead of after this sandbox's first
    /// request: for a sandbox made ahead of its use, whose first command should not share the
    /// CPUs with the refill's clone.
    pub fn refill_reserve_now(&mut self) {
        self.refill_now();
    }

    fn refill_now(&mut self) {
        if std::mem::take(&mut self.refill_pending) {
            self.rt.refill_inits();
        }
    }

    /// The root filesystem, resolved while init starts (before [`Self::setup`]).
    pub(crate) fn set_rootfs(&mut self, rootfs: Rootfs) {
        self.rootfs = rootfs;
    }

    /// Send init its setup plan (this sandbox's directory, cgroups and layers, and the rest of
    /// `cfg`) and wait until the sandbox is ready. Returns the plan, and what init did with a
    /// root it had made ahead ([`SetUp`]).
    pub(crate) fn setup(
        &mut self,
        cfg: &SandboxConfig,
        seccomp: Option<CompiledSeccomp>,
    ) -> Result<(SetupPlan, SetUp), SandboxError> {
        let plan = self.send_setup(cfg, seccomp)?;
        Ok((plan, self.wait_setup()?))
    }

    /// The first half of [`Self::setup`]: send the plan (init sets up while the caller works).
    pub(crate) fn send_setup(
        &mut self,
        cfg: &SandboxConfig,
        seccomp: Option<CompiledSeccomp>,
    ) -> Result<SetupPlan, SandboxError> {
        let plan = SetupPlan {
            sandbox_dir: self.dir.to_string_lossy().into_owned(),
            cgroup_join: self.cgroup.self_join_files(),
            lowers: self.rootfs.lowers.clone(),
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
        self.send(&Request::Setup(Box::new(plan.clone())))?;
        Ok(plan)
    }

    /// The second half of [`Self::setup`]: wait until init says the sandbox is ready.
    pub(crate) fn wait_setup(&mut self) -> Result<SetUp, SandboxError> {
        match self.receive(Duration::from_secs(30))? {
            Response::SetUp(s) => Ok(s),
            Response::Failed { message, .. } => Err(SandboxError::Setup(message)),
            other => Err(SandboxError::Unexpected {
                request: "setup",
                response: format!("{other:?}"),
            }),
        }
    }

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

    /// Copy the sandbox's current diff (its overlay's upper directory: whiteouts, opaque
    /// markers, owners, modes and times kept) into `dst`, which must not exist: a read-only
    /// layer for the `layers` of later sandboxes (image builds). Read from this host through
    /// init's view of its own mount namespace; call it with no command running. Returns the
    /// bytes of file data copied.
    pub fn export_diff(&self, dst: &std::path::Path, max_bytes: u64) -> Result<u64, SandboxError> {
        let rel = self.dir.strip_prefix("/").unwrap_or(&self.dir);
        let upper = PathBuf::from(format!("/proc/{}/root", self.pid))
            .join(rel)
            .join("ep/upper");
        let spawn = |source| SandboxError::Spawn {
            what: "exporting the sandbox's diff",
            source,
        };
        // Apparent sizes: a sparse file costs the sandbox's quota nothing but would be
        // written out whole on the host.
        if crate::init::snapshot::apparent_size(&upper, max_bytes)
            .map_err(spawn)?
            .is_none()
        {
            return Err(SandboxError::Setup(format!(
                "the sandbox's changes hold more than {max_bytes} bytes (apparent sizes: sparse files count whole); not exported"
            )));
        }
        crate::init::snapshot::copy_tree(&upper, dst).map_err(spawn)
    }

    fn call(&mut self, req: Request, timeout: Duration) -> Result<Response, SandboxError> {
        self.send(&req)?;
        let r = self.receive(timeout);
        self.refill_now();
        r
    }

    fn send(&mut self, req: &Request) -> Result<(), SandboxError> {
        if self.dead {
            return Err(SandboxError::Dead);
        }
        let r = write_frame(&mut self.sock, "request", req);
        r.map_err(|e| self.failed(e, None))
    }

    fn receive(&mut self, timeout: Duration) -> Result<Response, SandboxError> {
        if self.dead {
            return Err(SandboxError::Dead);
        }
        let r = (|| {
            self.sock
                .set_read_timeout(Some(timeout))
                .map_err(ProtocolError::Io)?;
            read_frame::<Response>(&mut self.sock, "response")
        })();
        r.map_err(|e| self.failed(e, Some(timeout)))
    }

    /// A failed exchange with init: init is killed, and the error says why.
    fn failed(&mut self, e: ProtocolError, timeout: Option<Duration>) -> SandboxError {
        match e {
            ProtocolError::Io(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) && timeout.is_some() =>
            {
                self.kill();
                SandboxError::Unresponsive(timeout.unwrap_or_default())
            }
            ProtocolError::Closed | ProtocolError::Io(_) => {
                self.kill();
                SandboxError::Dead
            }
            e => {
                self.kill();
                e.into()
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
                    // Unknown on either side (the count could not be read): not claimed.
                    r.oom_killed = matches!(
                        (oom_before, self.cgroup.oom_kills()),
                        (Some(before), Some(after)) if after > before
                    );
                }
                Ok(*r)
            }
            Response::Failed {
                kind: FailureKind::Internal,
                message,
            } if (message.contains("clone failed") || message.contains("fork:"))
                && self.refused_by_own_processes() =>
            {
                // The command (or a new zygote) could not be forked because the sandbox's own
                // processes fill its pids limit (a fork bomb whose forks outlived their
                // command): the agent's failure, not the sandbox's. The cgroup's count of
                // refused forks says so even when short-lived forks are gone by now.
                let (current, max) = self.cgroup.pids_usage();
                Err(SandboxError::Request {
                    kind: FailureKind::Spawn,
                    message: format!(
                        "{message}: the sandbox's own processes use {current} of its {} pids",
                        max.map_or("unlimited".to_string(), |m| m.to_string())
                    ),
                })
            }
            other => Err(unexpected("exec", other)),
        }
    }

    /// Processes (tasks) in the sandbox's cgroup now, and its limit.
    pub fn pids_usage(&self) -> (u64, Option<u64>) {
        self.cgroup.pids_usage()
    }

    /// Whether a fork just refused was refused because of the sandbox's own processes: the
    /// cgroup counted a fork refused at its pids limit since the last such check (the forks
    /// may be gone by now), or the limit is (nearly) full right now.
    fn refused_by_own_processes(&mut self) -> bool {
        let hits = self.cgroup.pids_limit_hits();
        let new_hits = hits > self.limit_hits_seen;
        self.limit_hits_seen = hits;
        new_hits || self.own_processes_at_limit()
    }

    /// Whether the sandbox's own processes have (nearly) used up its pids limit: a new
    /// process cannot start because of what runs inside, not because of the host.
    fn own_processes_at_limit(&self) -> bool {
        match self.cgroup.pids_usage() {
            // Init and the zygote are two of them; one more free slot may be raced away.
            (current, Some(max)) => current + 1 >= max,
            _ => false,
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
        let req = Request::ReadFile {
            path: path.into(),
            max_bytes,
            nofollow,
        };
        file_answer(self.call(req, CONTROL_TIMEOUT)?)
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
        stat_answer(self.call(Request::Stat { path: path.into() }, CONTROL_TIMEOUT)?)
    }

    pub fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        dir_answer(self.call(Request::ListDir { path: path.into() }, CONTROL_TIMEOUT)?)
    }

    /// What an observation reads, in one request: the first `max_entries` entries of `path`
    /// in the order an observation shows them, with their kinds, and the episode's disk usage
    /// ([`Overview`]).
    pub fn overview(&mut self, path: &str, max_entries: u32) -> Result<Overview, SandboxError> {
        let req = Request::Overview {
            path: path.into(),
            max_entries,
        };
        overview_answer(self.call(req, CONTROL_TIMEOUT)?)
    }

    /// Kill every process but init.
    pub fn kill_all(&mut self) -> Result<(), SandboxError> {
        self.expect_ok(Request::KillAll, "kill_all")
    }

    /// Kill every process but init and revert the filesystem to its base layers.
    pub fn reset(&mut self) -> Result<(), SandboxError> {
        self.expect_ok(Request::Reset, "reset")
    }

    /// [`Sandbox::reset`], then `looks` answered on the fresh state in the same exchange (at
    /// most [`crate::protocol::MAX_LOOKS`]; none where they did not fit in the reply).
    pub fn reset_and_look(&mut self, looks: &[Look]) -> Result<Vec<Response>, SandboxError> {
        if looks.is_empty() {
            return self.reset().map(|()| Vec::new());
        }
        let looks = looks.to_vec();
        match self.call(Request::ResetAndLook { looks }, CONTROL_TIMEOUT)? {
            Response::Answers(a) => Ok(a),
            other => Err(unexpected("reset_and_look", other)),
        }
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
        health_answer(self.call(Request::Health, CONTROL_TIMEOUT)?)
    }

    /// Memory charged to the sandbox's cgroup, bytes.
    pub fn memory_usage(&self) -> u64 {
        self.cgroup.memory_usage()
    }

    /// Kill every process of the sandbox now (SIGKILL to init: the kernel kills the rest of
    /// its pid namespace); what is left (reaping init, the cgroups, the directory) is done
    /// when the sandbox is dropped. Requests fail from now on.
    pub fn stop(&self) {
        self.signal_kill();
    }

    /// Whether init has exited, without reaping it (a sandbox that waited unused may have
    /// lost its init to a kill from outside; [`Sandbox::is_dead`] says so only once a
    /// request failed). Init exits only once every other process of its pid namespace is
    /// gone.
    pub fn init_exited(&self) -> bool {
        if self.dead {
            return true;
        }
        // SAFETY: an all-zero siginfo_t is a valid value of this plain C struct.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into `info`, a live local; WNOWAIT leaves the child unreaped,
        // so its pid stays ours.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid reads the field waitid filled (0 when no child has exited).
        r == 0 && unsafe { info.si_pid() } != 0
    }

    /// SIGKILL to init unless it is reaped already (whether it was sent).
    fn signal_kill(&self) -> bool {
        if self.dead {
            return false;
        }
        // SAFETY: kill with integer arguments; the pid is our own child, not yet reaped.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        true
    }

    /// Reap init once it was sent SIGKILL.
    fn reap_killed(&mut self) {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
        self.dead = true;
    }

    /// Kill init and reap it.
    fn kill(&mut self) {
        if self.signal_kill() {
            self.reap_killed();
        }
    }
}

/// The answer to a [`Request::ReadFile`] (or its [`crate::protocol::Look`]): the bytes and
/// whether they were cut.
pub fn file_answer(r: Response) -> Result<(Vec<u8>, bool), SandboxError> {
    match r {
        Response::File { data, truncated } => Ok((data, truncated)),
        other => Err(unexpected("read_file", other)),
    }
}

/// The answer to a [`Request::Stat`] (or its look).
pub fn stat_answer(r: Response) -> Result<FileStat, SandboxError> {
    match r {
        Response::Stat(s) => Ok(s),
        other => Err(unexpected("stat", other)),
    }
}

/// The answer to a [`Request::ListDir`] (or its look).
pub fn dir_answer(r: Response) -> Result<Vec<DirEntry>, SandboxError> {
    match r {
        Response::Dir(d) => Ok(d),
        other => Err(unexpected("list_dir", other)),
    }
}

/// The answer to a [`Request::Overview`] (or its look).
pub fn overview_answer(r: Response) -> Result<Overview, SandboxError> {
    match r {
        Response::Overview(o) => Ok(o),
        other => Err(unexpected("overview", other)),
    }
}

/// The answer to a [`Request::Health`] (or its look).
pub fn health_answer(r: Response) -> Result<Health, SandboxError> {
    match r {
        Response::Health(h) => Ok(h),
        other => Err(unexpected("health", other)),
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
        let t0 = std::time::Instant::now();
        // SIGKILL to init, no goodbye: the kernel kills every other process of its pid
        // namespace and init's exit waits until they are all gone, so once it is reaped
        // nothing of the sandbox runs (its mounts went with its mount namespace) and the
        // cgroups are empty. (A `Shutdown` request first would cost a round trip for the same
        // end state.) While the kernel tears init's namespaces down (about half a millisecond
        // here), its directory and record go: no process of the sandbox can run any more
        // (a pending SIGKILL), the directory is empty on this side (init's private tmpfs is
        // mounted on it in init's namespace only, which the rmdir detaches lazily, as the
        // namespace's end would), and a run that crashes now leaves only a dying init to the
        // reaper, as before.
        let killed = self.signal_kill();
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(self.rt.init_record(&self.name));
        let t_wait = std::time::Instant::now();
        if killed {
            self.reap_killed();
        }
        let wait_us = t_wait.elapsed().as_micros() as u64;
        if let Err(e) = self.cgroup.destroy() {
            tracing::warn!(sandbox = %self.name, error = %e, "cgroup cleanup failed");
        }
        self.rt.release();
        self.refill_now();
        tracing::debug!(sandbox = %self.name, wait_us, us = t0.elapsed().as_micros() as u64, "sandbox removed");
    }
}
