//! `engine sandbox daemon`: one-shots (`engine sandbox exec`) served by a running engine.
//!
//! A one-shot that makes its own sandbox pays, in every process, a runtime's start (the
//! state directory, the host mask's checks) and a sandbox's creation (cgroups, namespaces,
//! init, the root). The daemon pays them ahead: it listens on `<state>/exec.sock` (mode 0600
//! in root's state directory) and, for each configuration it was asked for, keeps one
//! sandbox ready that no command has run in, made after the previous request of that
//! configuration and dropped after `--keep-ready` unused. Every request gets a sandbox of its
//! own, torn down after its command: none serves two.
//!
//! A request is served only where the daemon makes the sandbox the client would have made:
//! the same engine binary (device, inode, size and modification time of `/proc/self/exe`)
//! and the same environment variables that decide how a sandbox is made ([`ENV`]); else the
//! daemon answers [`Reply::Mismatch`] and the client makes the sandbox itself. A host-rooted
//! sandbox made more than [`RECHECK_AFTER`] before its request is used only once the host
//! mask was checked again (`Runtime::host_mask_current`), and so is every host-rooted create;
//! when the host changed, the daemon starts a new runtime (the new mask), as a new process
//! would. A client that goes away (a signal, a closed terminal) has its command killed.
//!
//! Wire: one message each way, a little-endian u32 length and that many bytes of
//! MessagePack: the client's [`Request`], the daemon's [`Reply`].

use super::errors::usage;
use super::sandbox::{one_shot, runtime, Outcome, SandboxOpts, EXIT_SANDBOX_FAILURE, OUTPUT_CAP};
use anyhow::Context;
use engine::units::parse_duration;
use sandbox::layers::RootfsSpec;
use sandbox::{Runtime, Sandbox, SandboxConfig};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A socket to use instead of `<state>/exec.sock`; a one-shot that names one must be served
/// by it (its absence or a mismatch is an error, not a fallback).
pub const SOCKET_ENV: &str = "ENVFACTORY_EXEC_SOCKET";

/// The environment variables that decide how a sandbox is made (the init program, admission
/// control, the Docker daemon, how Debian suites are made): a request is served only when
/// the client's and the daemon's agree. (`PATH` too, for `debootstrap:` roots, where it
/// finds `debootstrap`; `ENVFACTORY_STATE` by the socket's place.)
pub const ENV: [&str; 6] = [
    "ENVFACTORY_INIT",
    "ENVFACTORY_MAX_SANDBOXES",
    "ENVFACTORY_MEMORY_RESERVE",
    "DOCKER_HOST",
    "ENVFACTORY_DEBIAN_MIRROR",
    "ENVFACTORY_DEBOOTSTRAP",
];

/// A host-rooted sandbox made longer ago than this is used only after the host mask is
/// checked again.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// The most configurations with a sandbox kept ready at once (the oldest goes first).
const MAX_READY: usize = 8;
/// The largest request (a command line).
const MAX_REQUEST: usize = 1 << 20;
/// The largest reply: both streams at their cap, and the rest.
const MAX_REPLY: usize = 2 * OUTPUT_CAP as usize + (1 << 20);

/// Options of `engine sandbox daemon`.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonOpts {
    /// How long a sandbox made ahead for a configuration waits for a request before it is
    /// dropped.
    #[arg(long, default_value = "30s")]
    pub keep_ready: String,
    /// The socket to listen on (default `<state>/exec.sock`, where one-shots look; one
    /// elsewhere serves the one-shots that name it in ENVFACTORY_EXEC_SOCKET).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// What identifies the engine binary a process runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ExeId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl ExeId {
    fn of_self() -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/proc/self/exe")?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// A one-shot's request.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    exe: ExeId,
    /// The values of [`ENV`], in order.
    env: Vec<Option<String>>,
    /// `PATH`, for a `debootstrap:` root only.
    path: Option<String>,
    /// The sandbox options, a relative root made absolute.
    opts: SandboxOpts,
    timeout_ms: u64,
    cmd: Vec<String>,
}

/// The daemon's answer.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    /// Not served, and nothing was run: the client makes the sandbox itself.
    Mismatch(String),
    /// Served.
    Outcome(Outcome),
}

/// The one-shot socket of a state directory.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join("exec.sock")
}

fn env_values() -> Vec<Option<String>> {
    ENV.iter().map(|k| std::env::var(k).ok()).collect()
}

/// Whether the log filter asked for more than warnings: a one-shot then makes its sandbox
/// itself, so that its log shows how (the daemon's log is the daemon's).
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Tell one-shots the log filter `main` set up.
pub fn set_log_filter(filter: &str) {
    VERBOSE.store(filter.trim() != "warn", Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------
// The client: `engine sandbox exec`.

/// The outcome of `cmd` from a daemon, or `None` when none serves this process (no socket,
/// none listening, another binary or environment, or a log filter asking for more than
/// warnings): the caller then makes the sandbox itself. A socket named by
/// [`SOCKET_ENV`] must serve: not reaching it, or a mismatch, is an error.
pub fn ask(
    opts: &SandboxOpts,
    cfg: &SandboxConfig,
    timeout: Duration,
    cmd: &[String],
) -> anyhow::Result<Option<Outcome>> {
    let named = std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let strict = named.is_some();
    if !strict && VERBOSE.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let sock = named.unwrap_or_else(|| socket_path(&sandbox::state::default_state_dir()));
    let mut s = match UnixStream::connect(&sock) {
        Ok(s) => s,
        Err(e) if strict => {
            return Err(anyhow::anyhow!(
                "{SOCKET_ENV}={}: no daemon answers there: {e}",
                sock.display()
            ))
        }
        Err(_) => return Ok(None),
    };
    let Some(opts) = absolute(opts, cfg) else {
        if strict {
            return Err(usage(format!(
                "--rootfs {}: the daemon needs a root it can name (an absolute path in UTF-8)",
                opts.rootfs
            )));
        }
        return Ok(None);
    };
    let req = Request {
        exe: ExeId::of_self().context("identifying this engine binary")?,
        env: env_values(),
        path: matches!(cfg.rootfs, RootfsSpec::Debootstrap(_))
            .then(|| std::env::var("PATH").ok())
            .flatten(),
        opts,
        timeout_ms: timeout.as_millis() as u64,
        cmd: cmd.to_vec(),
    };
    // A signal ends this process from now on (the daemon then kills the command).
    super::signals::exit_on_signal();
    let lost = |e: &dyn std::fmt::Display| {
        Ok(Some(Outcome::NotRun {
            code: EXIT_SANDBOX_FAILURE,
            message: format!(
                "the one-shot daemon at {} gave no answer: {e}",
                sock.display()
            ),
        }))
    };
    let bytes = rmp_serde::to_vec(&req).context("encoding the request")?;
    if let Err(e) = write_frame(&mut s, &bytes) {
        return lost(&e);
    }
    let reply = match read_frame(&mut s, MAX_REPLY) {
        Ok(b) => b,
        Err(e) => return lost(&e),
    };
    match rmp_serde::from_slice::<Reply>(&reply) {
        Ok(Reply::Outcome(o)) => Ok(Some(o)),
        Ok(Reply::Mismatch(why)) if strict => Err(anyhow::anyhow!(
            "{SOCKET_ENV}={}: the daemon there does not serve this process: {why}",
            sock.display()
        )),
        Ok(Reply::Mismatch(why)) => {
            tracing::debug!(socket = %sock.display(), why = %why, "the one-shot daemon does not serve this process");
            Ok(None)
        }
        Err(e) => lost(&e),
    }
}

/// `opts` with a relative directory or `oci:` root made absolute (the daemon's working
/// directory is not the client's); `None` for a path that is not UTF-8.
fn absolute(opts: &SandboxOpts, cfg: &SandboxConfig) -> Option<SandboxOpts> {
    let rootfs = match &cfg.rootfs {
        RootfsSpec::Dir(p) if p.is_relative() => {
            RootfsSpec::Dir(std::env::current_dir().ok()?.join(p))
        }
        RootfsSpec::Oci(p) if p.is_relative() => {
            RootfsSpec::Oci(std::env::current_dir().ok()?.join(p))
        }
        RootfsSpec::Dir(p) | RootfsSpec::Oci(p) => {
            p.to_str()?;
            return Some(opts.clone());
        }
        _ => return Some(opts.clone()),
    };
    match &rootfs {
        RootfsSpec::Dir(p) | RootfsSpec::Oci(p) => {
            p.to_str()?;
        }
        _ => {}
    }
    Some(SandboxOpts {
        rootfs: rootfs.to_string(),
        ..opts.clone()
    })
}

fn write_frame(s: &mut UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    let n = u32::try_from(bytes.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "message too large"))?;
    s.write_all(&n.to_le_bytes())?;
    s.write_all(bytes)
}

fn read_frame(s: &mut UnixStream, max: usize) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message of {n} bytes (at most {max})"),
        ));
    }
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

// ---------------------------------------------------------------------------------------
// A daemon of this binary for a benchmark.

/// `engine sandbox daemon --socket PATH`, started by this process and stopped (SIGTERM, then
/// waited for) when dropped, or when this process dies (`PR_SET_PDEATHSIG`).
pub struct Spawned {
    child: std::process::Child,
    socket: PathBuf,
}

impl Spawned {
    /// Start it and wait until it answers on `socket` (at most 30 s).
    pub fn start(socket: &Path) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["sandbox", "daemon", "--socket"])
            .arg(socket)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .context("starting `engine sandbox daemon` for the benchmark")?;
        let mut me = Self {
            child,
            socket: socket.to_path_buf(),
        };
        let t = Instant::now();
        while UnixStream::connect(socket).is_err() {
            if let Some(status) = me.child.try_wait()? {
                anyhow::bail!("`engine sandbox daemon` for the benchmark ended: {status}");
            }
            if t.elapsed() > Duration::from_secs(30) {
                anyhow::bail!(
                    "`engine sandbox daemon` for the benchmark did not answer on {} in 30 s",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(me)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// The daemon.

/// A sandbox no command has run in, made for a configuration.
struct Ready {
    opts: SandboxOpts,
    /// The run of the runtime that made it (one replaced since is not used).
    run: String,
    sandbox: Sandbox,
    made: Instant,
}

struct Daemon {
    /// The runtime new sandboxes are made by (a new one when the host changed).
    rt: Mutex<Runtime>,
    ready: Mutex<Vec<Ready>>,
    keep: Duration,
    exe: ExeId,
    env: Vec<Option<String>>,
    served: AtomicU64,
    /// When the host mask was last found current (`Runtime::host_mask_current`).
    host_checked: Mutex<Option<Instant>>,
    /// Sandboxes that served their request, for the teardown thread.
    done: Mutex<std::sync::mpsc::Sender<Sandbox>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `engine sandbox daemon`: serve one-shots until a signal stops the process (its sandboxes
/// are torn down and its socket removed then, by the signal watcher).
pub fn daemon(o: &DaemonOpts) -> anyhow::Result<i32> {
    let keep = parse_duration(&o.keep_ready).context("--keep-ready")?;
    let state = sandbox::state::default_state_dir();
    let sock = o.socket.clone().unwrap_or_else(|| socket_path(&state));
    if UnixStream::connect(&sock).is_ok() {
        return Err(usage(format!(
            "{}: a daemon already listens there",
            sock.display()
        )));
    }
    let rt = runtime()?;
    match std::fs::remove_file(&sock) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", sock.display())),
    }
    // Mode 0600 from the start: no one else may connect before a chmod.
    let mask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(&sock);
    nix::sys::stat::umask(mask);
    let listener = bound.with_context(|| format!("listening on {}", sock.display()))?;
    super::signals::remove_on_exit(sock.clone());
    let d = Arc::new(Daemon {
        rt: Mutex::new(rt),
        ready: Mutex::new(Vec::new()),
        keep,
        exe: ExeId::of_self().context("identifying this engine binary")?,
        env: env_values(),
        served: AtomicU64::new(0),
        host_checked: Mutex::new(None),
        done: Mutex::new(teardown_thread()?),
    });
    {
        let d = d.clone();
        std::thread::Builder::new()
            .name("keep-ready".into())
            .spawn(move || loop {
                std::thread::sleep(d.keep.clamp(Duration::from_millis(100), RECHECK_AFTER) / 2);
                d.expire();
            })
            .context("starting the daemon's expiry thread")?;
    }
    eprintln!(
        "engine: serving `engine sandbox exec` on {} (a sandbox made ahead waits {keep:?})",
        sock.display()
    );
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let d = d.clone();
                if let Err(e) = std::thread::Builder::new()
                    .name("one-shot".into())
                    .spawn(move || d.serve(s))
                {
                    tracing::warn!(error = %e, "a one-shot was not served: no thread");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a one-shot");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    Ok(0)
}

impl Daemon {
    fn serve(&self, mut s: UnixStream) {
        // Only the daemon's own user (the socket's mode says the same).
        let me = nix::unistd::geteuid().as_raw();
        match nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials) {
            Ok(c) if c.uid() == me => {}
            other => {
                tracing::warn!(peer = ?other.map(|c| c.uid()), "a one-shot of another user refused");
                return;
            }
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let req = match read_frame(&mut s, MAX_REQUEST) {
            Ok(b) => match rmp_serde::from_slice::<Request>(&b) {
                Ok(r) => r,
                Err(e) => {
                    // Another build's client: it runs the command itself.
                    let _ = send(
                        &mut s,
                        &Reply::Mismatch(format!("an unreadable request: {e}")),
                    );
                    return;
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, "a one-shot's request was not read");
                return;
            }
        };
        let _ = s.set_read_timeout(None);
        if let Some(why) = self.mismatch(&req) {
            let _ = send(&mut s, &Reply::Mismatch(why));
            return;
        }
        let cfg = match req.opts.config() {
            Ok(c) => c,
            Err(e) => {
                let _ = send(&mut s, &Reply::Outcome(Outcome::failed(&e)));
                return;
            }
        };
        let t0 = Instant::now();
        let mut sb = match self.take(&req.opts, &cfg) {
            Ok(sb) => sb,
            Err(e) => {
                let _ = send(&mut s, &Reply::Outcome(Outcome::failed(&e)));
                return;
            }
        };
        let take_us = t0.elapsed().as_micros() as u64;
        let timeout = Duration::from_millis(req.timeout_ms);
        let outcome = until_hangup(&s, sb.init_pid(), || one_shot(&mut sb, timeout, &req.cmd));
        let served = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(
            sandbox = %sb.name(),
            served,
            take_us,
            exec_us = t0.elapsed().as_micros() as u64 - take_us,
            "one-shot served"
        );
        let _ = send(&mut s, &Reply::Outcome(outcome));
        drop(s);
        // The next request of this configuration finds one ready; this one goes.
        self.refill(&req.opts, &cfg);
        if let Err(back) = locked(&self.done).send(sb) {
            drop(back.0);
        }
    }

    /// Why this daemon would not make the sandbox the client would, if it would not.
    fn mismatch(&self, req: &Request) -> Option<String> {
        if req.exe != self.exe {
            return Some("another engine binary".into());
        }
        if let Some((k, (a, b))) = ENV
            .iter()
            .zip(req.env.iter().zip(&self.env))
            .find(|(_, (a, b))| a != b)
        {
            return Some(format!(
                "{k} differs (the client's {a:?}, the daemon's {b:?})"
            ));
        }
        if req.env.len() != self.env.len() {
            return Some("another set of environment variables".into());
        }
        if req.path.is_some() && req.path != std::env::var("PATH").ok() {
            return Some("PATH differs (it finds debootstrap)".into());
        }
        None
    }

    /// A sandbox for `cfg`: the one kept ready, else a new one.
    fn take(&self, opts: &SandboxOpts, cfg: &SandboxConfig) -> anyhow::Result<Sandbox> {
        if cfg.rootfs == RootfsSpec::Host {
            self.check_host(true)?;
        }
        let found = {
            let mut ready = locked(&self.ready);
            ready
                .iter()
                .position(|r| r.opts == *opts)
                .map(|i| ready.remove(i))
        };
        let rt = locked(&self.rt).clone();
        if let Some(r) = found {
            if !r.sandbox.is_dead() && r.run == rt.run_id() {
                return Ok(r.sandbox);
            }
            tracing::debug!(sandbox = %r.sandbox.name(), "a sandbox made ahead is not used: it died, or the host changed");
        }
        Ok(rt.create(cfg)?)
    }

    /// Make sure the host mask of the daemon's runtime is the one a walk of the host would
    /// plan now, as found by a check at most [`RECHECK_AFTER`] ago (with `recent`) or now;
    /// when it is not, a new runtime (which plans the mask again) replaces it, and the
    /// sandboxes made ahead with the old mask are dropped.
    fn check_host(&self, recent: bool) -> anyhow::Result<()> {
        let last = *locked(&self.host_checked);
        if recent && last.is_some_and(|t| t.elapsed() < RECHECK_AFTER) {
            return Ok(());
        }
        let rt = locked(&self.rt).clone();
        let t = Instant::now();
        if rt.host_mask_current()? {
            *locked(&self.host_checked) = Some(t);
            return Ok(());
        }
        tracing::info!("the host changed since the daemon's mask was made: a new runtime");
        let fresh = runtime()?;
        *locked(&self.rt) = fresh;
        *locked(&self.host_checked) = None;
        let stale: Vec<Ready> = std::mem::take(&mut *locked(&self.ready));
        drop(stale);
        Ok(())
    }

    /// Make a sandbox ready for `opts` unless one is.
    fn refill(&self, opts: &SandboxOpts, cfg: &SandboxConfig) {
        if locked(&self.ready).iter().any(|r| r.opts == *opts) {
            return;
        }
        let rt = locked(&self.rt).clone();
        let sandbox = match rt.create(cfg) {
            Ok(mut sb) => {
                sb.refill_reserve_now();
                sb
            }
            Err(e) => {
                tracing::debug!(error = %e, "no sandbox made ahead");
                return;
            }
        };
        let mut ready = locked(&self.ready);
        if ready.iter().any(|r| r.opts == *opts) {
            return; // another request's refill was first; this one drops
        }
        let evicted = (ready.len() >= MAX_READY).then(|| ready.remove(0));
        ready.push(Ready {
            opts: opts.clone(),
            run: rt.run_id().to_string(),
            sandbox,
            made: Instant::now(),
        });
        drop(ready);
        drop(evicted);
    }

    /// Drop the sandboxes kept ready longer than `--keep-ready`; check the host mask of those
    /// left (a request then need not).
    fn expire(&self) {
        let old: Vec<Ready> = {
            let mut ready = locked(&self.ready);
            let (old, keep) = std::mem::take(&mut *ready)
                .into_iter()
                .partition(|r| r.made.elapsed() >= self.keep);
            *ready = keep;
            old
        };
        drop(old);
        let host = locked(&self.ready).iter().any(|r| r.opts.rootfs == "host");
        if host {
            if let Err(e) = self.check_host(false) {
                tracing::warn!(error = %e, "checking the host mask");
            }
        }
    }
}

/// A thread that tears down the sandboxes sent to it, at the lowest CPU priority (nice 19):
/// what a sandbox's teardown costs is then paid when the CPUs are not needed by the next
/// requests and refills.
fn teardown_thread() -> anyhow::Result<std::sync::mpsc::Sender<Sandbox>> {
    let (tx, rx) = std::sync::mpsc::channel::<Sandbox>();
    std::thread::Builder::new()
        .name("teardown".into())
        .spawn(move || {
            // SAFETY: gettid and setpriority on this thread's own id; no memory is passed.
            let r = unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::setpriority(libc::PRIO_PROCESS, tid, 19)
            };
            if r != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "the teardown thread keeps its priority");
            }
            for sb in rx {
                drop(sb);
            }
        })
        .context("starting the daemon's teardown thread")?;
    Ok(tx)
}

fn send(s: &mut UnixStream, reply: &Reply) -> std::io::Result<()> {
    let bytes = rmp_serde::to_vec(reply)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    write_frame(s, &bytes)
}

/// Run `f` (a command in the sandbox whose init is `init`); if the client hangs up (or
/// sends anything: it has nothing more to say) meanwhile, kill that init, which ends the
/// command and the sandbox. (`init` cannot be another process's pid then: it is this
/// process's child, reaped only when its sandbox is dropped, after this returns.)
fn until_hangup<T>(client: &UnixStream, init: i32, f: impl FnOnce() -> T) -> T {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let Ok((stop_r, stop_w)) = nix::unistd::pipe() else {
        return f();
    };
    std::thread::scope(|scope| {
        let watcher = scope.spawn(move || {
            let mut fds = [
                PollFd::new(client.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop_r.as_fd(), PollFlags::POLLIN),
            ];
            loop {
                match poll(&mut fds, PollTimeout::NONE) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => return,
                    Ok(_) => {}
                }
                if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                    return;
                }
                if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                    tracing::debug!(
                        init,
                        "the one-shot's client went away: its command is killed"
                    );
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(init),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    return;
                }
            }
        });
        let out = f();
        drop(stop_w);
        let _ = watcher.join();
        out
    })
}
