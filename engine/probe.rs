//! Trusted reads of a sandbox's state, for verifiers and observations: files, directories and
//! processes through the sandbox init's file requests (`openat2(RESOLVE_IN_ROOT)`, served by
//! init, parsed here), and TCP through a thread of this process that joins the sandbox's
//! network namespace. Nothing here runs a binary, a library or a `PATH` of the sandbox, so an
//! agent that replaces `tar`, `ps` or `curl` cannot fool a verifier.

use sandbox::protocol::{DirEntry, FileKind, FileStat};
use sandbox::{ExecResult, SandboxError, SandboxOps};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("joining the sandbox's network namespace: {0}")]
    Netns(std::io::Error),
    #[error("probe thread panicked")]
    Thread,
    /// A path the verifier built (following symlinks itself) that is longer than one lookup
    /// takes: it can tell neither what is there nor that nothing is, so its check fails.
    #[error("{prefix}...: a path of {len} bytes through symlinks, longer than one lookup takes")]
    PathTooLong { prefix: String, len: usize },
}

impl ProbeError {
    /// True when the sandbox or the engine failed, not the state the agent left (a read the
    /// sandbox refused as not found or not allowed is the latter).
    pub fn is_infrastructure(&self) -> bool {
        match self {
            Self::Sandbox(e) => e.is_infrastructure(),
            Self::Netns(_) | Self::Thread => true,
            Self::PathTooLong { .. } => false,
        }
    }
}

/// A process inside the sandbox (pids as the sandbox sees them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    /// Kernel state letter (R, S, Z, ...).
    pub state: char,
    pub comm: String,
    /// Arguments (empty for zombies and kernel-less entries).
    pub cmdline: Vec<String>,
    /// Total CPU time in clock ticks (utime + stime).
    pub cpu_ticks: u64,
    /// When the process started, in clock ticks since boot (`/proc/PID/stat` field 22).
    /// With the pid it names one process for good: pids are reused after a wrap, start
    /// times cannot be set by anyone.
    pub start_ticks: u64,
}

/// What verifiers may look at.
pub trait Probe {
    /// A file's bytes (at most `max`), or `None` when it does not exist or is not a file.
    fn read(&mut self, path: &str, max: u64) -> Result<Option<Vec<u8>>, ProbeError>;
    /// `lstat`, or `None` when absent.
    fn stat(&mut self, path: &str) -> Result<Option<FileStat>, ProbeError>;
    /// Directory entries, or `None` when absent or not a directory.
    fn list(&mut self, path: &str) -> Result<Option<Vec<DirEntry>>, ProbeError>;
    /// Every process but the sandbox's init and its zygote.
    fn processes(&mut self) -> Result<Vec<Proc>, ProbeError>;
    /// Send `request` to `127.0.0.1:port` inside the sandbox's network namespace and read the
    /// reply until the peer closes or the timeout passes. `Ok(None)`: nothing listens.
    fn tcp(
        &mut self,
        port: u16,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, ProbeError>;
    /// Bytes used in the sandbox's writable layer (its size-limited tmpfs), when the probe can
    /// tell; free space is the instance's disk size minus this.
    fn disk_used(&mut self) -> Result<Option<u64>, ProbeError> {
        Ok(None)
    }
    /// The kernel's accounting (`statvfs`) of both writable filesystems of the sandbox, its
    /// writable layer and its `/dev/shm`, when the probe can tell.
    fn disk_usage(&mut self) -> Result<Option<DiskUsage>, ProbeError> {
        Ok(None)
    }
    /// The processes alive when the episode's start steps had finished, as `(pid,
    /// start_ticks)` pairs: a process is one of them only if both match. Recorded for
    /// instances that ask (`RuntimeSettings::record_start_processes`); `None` otherwise.
    fn start_processes(&self) -> Option<&BTreeSet<(u32, u64)>> {
        None
    }
}

/// Space in use on the sandbox's writable filesystems, as their own `statvfs` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskUsage {
    /// Blocks in use on the writable layer (its size-limited tmpfs), in bytes.
    pub upper_bytes: u64,
    /// Inodes in use there. tmpfs charges every inode and every user xattr's name and value
    /// to its inode space in 1 KiB units (Linux >= 6.6), not to its blocks.
    pub upper_inodes: u64,
    /// The same two of `/dev/shm`, a tmpfs of its own.
    pub shm_bytes: u64,
    pub shm_inodes: u64,
}

/// True when a request failed because the path is not there (or is not what was asked for).
pub fn is_absent(e: &SandboxError) -> bool {
    matches!(e, SandboxError::Request { kind, .. }
        if matches!(kind, sandbox::protocol::FailureKind::NotFound | sandbox::protocol::FailureKind::Invalid))
}

/// What a task's confirmation may do beyond reading: restart the system the way the system
/// itself would. `Task::confirm` runs only once the reads say the task is solved, and on a
/// snapshot of the sandbox that is rolled back afterwards ([`SandboxConfirm::finish`]), so
/// the files the agent left are kept; what it left running does not survive (a real
/// operator's restart does not keep it either).
pub trait Confirm: Probe {
    /// Kill every process but the sandbox's init: the agent's, and the services' too.
    fn kill_all(&mut self) -> Result<(), ProbeError>;
    /// Run a shell command as the system would (`sh -c` from `/`, the sandbox's default
    /// environment, never the agent's), as `user` `(uid, gid)` with no capabilities (switched
    /// in the sandbox, not by a program of its filesystem), or as root when `None`.
    fn run(
        &mut self,
        shell: &str,
        user: Option<(u32, u32)>,
        timeout: Duration,
    ) -> Result<ExecResult, ProbeError>;
}

/// [`Confirm`] on a live sandbox: the snapshot is taken before the first change.
pub struct SandboxConfirm<'a> {
    pub probe: SandboxProbe<'a>,
    snapshot: Option<u32>,
}

impl<'a> SandboxConfirm<'a> {
    pub fn new(probe: SandboxProbe<'a>) -> Self {
        Self {
            probe,
            snapshot: None,
        }
    }

    fn before_change(&mut self) -> Result<(), ProbeError> {
        if self.snapshot.is_none() {
            self.snapshot = Some(self.probe.sandbox.snapshot()?);
        }
        Ok(())
    }

    /// Put the files back as the agent left them (when anything was changed): every process
    /// is gone afterwards.
    pub fn finish(self) -> Result<(), ProbeError> {
        if let Some(n) = self.snapshot {
            self.probe.sandbox.rollback(n)?;
        }
        Ok(())
    }
}

/// The [`Probe`] methods but `stat`, passed to the probe in `self.$field`.
macro_rules! pass_probe_through {
    ($field:ident) => {
        fn read(&mut self, path: &str, max: u64) -> Result<Option<Vec<u8>>, ProbeError> {
            self.$field.read(path, max)
        }
        fn list(&mut self, path: &str) -> Result<Option<Vec<DirEntry>>, ProbeError> {
            self.$field.list(path)
        }
        fn processes(&mut self) -> Result<Vec<Proc>, ProbeError> {
            self.$field.processes()
        }
        fn tcp(
            &mut self,
            port: u16,
            request: &[u8],
            timeout: Duration,
        ) -> Result<Option<Vec<u8>>, ProbeError> {
            self.$field.tcp(port, request, timeout)
        }
        fn disk_used(&mut self) -> Result<Option<u64>, ProbeError> {
            self.$field.disk_used()
        }
        fn disk_usage(&mut self) -> Result<Option<DiskUsage>, ProbeError> {
            self.$field.disk_usage()
        }
        fn start_processes(&self) -> Option<&BTreeSet<(u32, u64)>> {
            self.$field.start_processes()
        }
    };
}

impl Probe for SandboxConfirm<'_> {
    pass_probe_through!(probe);
    fn stat(&mut self, path: &str) -> Result<Option<FileStat>, ProbeError> {
        self.probe.stat(path)
    }
}

impl Confirm for SandboxConfirm<'_> {
    fn kill_all(&mut self) -> Result<(), ProbeError> {
        self.before_change()?;
        Ok(self.probe.sandbox.kill_all()?)
    }

    fn run(
        &mut self,
        shell: &str,
        user: Option<(u32, u32)>,
        timeout: Duration,
    ) -> Result<ExecResult, ProbeError> {
        self.before_change()?;
        let mut req = sandbox::ExecRequest::shell(shell);
        req.cwd = "/".into();
        req.env = Some(sandbox::SandboxConfig::default().env);
        req.timeout_ms = timeout.as_millis() as u64;
        req.output_cap = 64 << 10;
        req.user = user;
        Ok(self.probe.sandbox.exec(&req)?)
    }
}

/// A [`Probe`] that asks the sandbox for each path's `lstat` once and answers repeats from
/// what it was told: for one phase of reads of a state that nothing in the phase changes
/// (a confirmation's look-ups of every tool along a `PATH` stat `/usr`, `/usr/local`, ...
/// again and again). Drop it before anything runs in the sandbox: what ran may have changed
/// the files. Everything else is passed through.
pub struct StatOnce<'a> {
    probe: &'a mut dyn Probe,
    seen: std::collections::HashMap<String, Option<FileStat>>,
}

impl<'a> StatOnce<'a> {
    pub fn new(probe: &'a mut dyn Probe) -> Self {
        Self {
            probe,
            seen: std::collections::HashMap::new(),
        }
    }
}

impl Probe for StatOnce<'_> {
    pass_probe_through!(probe);
    fn stat(&mut self, path: &str) -> Result<Option<FileStat>, ProbeError> {
        if let Some(st) = self.seen.get(path) {
            return Ok(st.clone());
        }
        let st = self.probe.stat(path)?;
        self.seen.insert(path.to_string(), st.clone());
        Ok(st)
    }
}

/// A text file as the system's own programs would read it (a final symlink followed), or
/// `None` when it is not there or not a file. Verifiers use [`Probe::read`] instead, which
/// never follows a final symlink.
pub fn read_text(ops: &mut dyn SandboxOps, path: &str) -> Result<Option<String>, ProbeError> {
    match ops.stat(path) {
        Ok(st) if st.kind == FileKind::File => {}
        Ok(st) if st.kind == FileKind::Symlink => {}
        Ok(_) => return Ok(None),
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    match ops.read_file(path, 64 << 20) {
        Ok((d, _)) => Ok(Some(String::from_utf8_lossy(&d).into_owned())),
        Err(e) if is_absent(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Follow symbolic links (at most 16) from `path`: the final path and its kind.
pub fn resolve(
    ops: &mut dyn SandboxOps,
    path: &str,
) -> Result<Option<(String, FileKind)>, ProbeError> {
    let mut cur = path.to_string();
    for _ in 0..16 {
        let st = match ops.stat(&cur) {
            Ok(st) => st,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match (st.kind, st.symlink_target) {
            (FileKind::Symlink, Some(t)) => cur = crate::instance::resolve_link(&cur, &t),
            (kind, _) => return Ok(Some((cur, kind))),
        }
    }
    Ok(None)
}

/// The first PATH directory holding an executable `tool`: (directory, resolved file).
pub fn which(
    ops: &mut dyn SandboxOps,
    tool: &str,
    path: &[&str],
) -> Result<Option<(String, String)>, ProbeError> {
    for dir in path.iter().filter(|d| d.starts_with('/')) {
        let p = format!("{}/{tool}", dir.trim_end_matches('/'));
        let Some((file, kind)) = resolve(ops, &p)? else {
            continue;
        };
        if kind != FileKind::File {
            continue;
        }
        let exec = match ops.stat(&file) {
            Ok(st) => st.mode & 0o111 != 0,
            Err(e) if is_absent(&e) => false,
            Err(e) => return Err(e.into()),
        };
        if exec {
            return Ok(Some((dir.trim_end_matches('/').to_string(), file)));
        }
    }
    Ok(None)
}

/// Read the sandbox's `/proc` (its own procfs) through init.
pub fn processes_of(ops: &mut dyn SandboxOps) -> Result<Vec<Proc>, ProbeError> {
    let mut out = Vec::new();
    let entries = match ops.list_dir("/proc") {
        Ok(e) => e,
        Err(e) if is_absent(&e) => return Ok(out),
        Err(e) => return Err(e.into()),
    };
    // Init (pid 1) and the zygote are the sandbox's, not the agent's. The zygote is named by
    // its pid, which init reports: a command can copy its command line and become a child of
    // pid 1 (by orphaning itself), never take its pid.
    let zygote = ops.health()?.zygote_pid;
    for e in entries {
        let Ok(pid) = e.name.parse::<u32>() else {
            continue;
        };
        let stat = match ops.read_file(&format!("/proc/{pid}/stat"), 4096) {
            Ok((s, _)) => String::from_utf8_lossy(&s).into_owned(),
            Err(e) if is_absent(&e) => continue, // exited meanwhile
            Err(e) => return Err(e.into()),
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let state = f.first().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = f.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        let cpu_ticks = ticks(11) + ticks(12);
        let start_ticks = ticks(19);
        let raw = match ops.read_file(&format!("/proc/{pid}/cmdline"), 64 << 10) {
            Ok((c, _)) => c,
            Err(_) => Vec::new(),
        };
        if pid == 1 || Some(pid) == zygote {
            continue;
        }
        let cmdline = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.push(Proc {
            pid,
            ppid,
            state,
            comm,
            cmdline,
            cpu_ticks,
            start_ticks,
        });
    }
    Ok(out)
}

/// Connect to `127.0.0.1:port` in the network namespace of `init_pid` on a fresh thread
/// (`setns` changes only the calling thread's namespace), send, read the reply.
pub fn tcp_in_netns(
    init_pid: i32,
    port: u16,
    request: &[u8],
    timeout: Duration,
) -> Result<Option<Vec<u8>>, ProbeError> {
    let ns_path = format!("/proc/{init_pid}/ns/net");
    let request = request.to_vec();
    let h = std::thread::spawn(move || -> Result<Option<Vec<u8>>, ProbeError> {
        let ns = std::fs::File::open(&ns_path).map_err(ProbeError::Netns)?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| ProbeError::Netns(e.into()))?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut s = match std::net::TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => s,
            Err(_) => return Ok(None),
        };
        let _ = s.set_read_timeout(Some(timeout));
        let _ = s.set_write_timeout(Some(timeout));
        if s.write_all(&request).is_err() {
            return Ok(Some(Vec::new()));
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut buf = Vec::new();
        let deadline = std::time::Instant::now() + timeout;
        let mut chunk = [0u8; 16 << 10];
        while std::time::Instant::now() < deadline && buf.len() < (4 << 20) {
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => break,
            }
        }
        Ok(Some(buf))
    });
    h.join().map_err(|_| ProbeError::Thread)?
}

/// A [`Probe`] over a live sandbox (of any backend).
pub struct SandboxProbe<'a> {
    pub sandbox: &'a mut dyn SandboxOps,
    /// See [`Probe::start_processes`]; recorded by `RunningInstance` after the start steps.
    pub start_processes: Option<&'a BTreeSet<(u32, u64)>>,
    /// Set before a TCP request: a service may change the sandbox when asked, so reads
    /// answered ahead ([`crate::looks`]) stop being used from then on.
    pub contact: Option<&'a std::sync::atomic::AtomicBool>,
}

impl Probe for SandboxProbe<'_> {
    fn read(&mut self, path: &str, max: u64) -> Result<Option<Vec<u8>>, ProbeError> {
        // One request: a final symlink or a non-regular file is `Invalid`, i.e. not a file.
        match self.sandbox.read_file_nofollow(path, max) {
            Ok((d, _)) => Ok(Some(d)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn stat(&mut self, path: &str) -> Result<Option<FileStat>, ProbeError> {
        match self.sandbox.stat(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn list(&mut self, path: &str) -> Result<Option<Vec<DirEntry>>, ProbeError> {
        match self.sandbox.list_dir(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn processes(&mut self) -> Result<Vec<Proc>, ProbeError> {
        processes_of(&mut *self.sandbox)
    }

    fn tcp(
        &mut self,
        port: u16,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, ProbeError> {
        if let Some(c) = self.contact {
            c.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        tcp_in_netns(self.sandbox.init_pid(), port, request, timeout)
    }

    fn disk_used(&mut self) -> Result<Option<u64>, ProbeError> {
        Ok(Some(self.sandbox.health()?.upper_bytes))
    }

    fn disk_usage(&mut self) -> Result<Option<DiskUsage>, ProbeError> {
        let h = self.sandbox.health()?;
        Ok(Some(DiskUsage {
            upper_bytes: h.upper_bytes,
            upper_inodes: h.upper_inodes,
            shm_bytes: h.shm_bytes,
            shm_inodes: h.shm_inodes,
        }))
    }

    fn start_processes(&self) -> Option<&BTreeSet<(u32, u64)>> {
        self.start_processes
    }
}
