//! The daemon's side: listen, check who asks and what, keep a sandbox ready, serve.

use super::RECHECK_AFTER;
use crate::cli::errors::usage;
use crate::cli::sandbox::{one_shot, runtime, Outcome, SandboxOpts};
use crate::oneshot::outcome::NO_COMMAND;
use crate::oneshot::protocol::{
    env_values, read_body, read_len, socket_path, write_frame, ExeId, Reply, Request, MAX_REQUEST,
    SANDBOX_ENV,
};
use anyhow::Context;
use engine::units::parse_duration;
use sandbox::{Runtime, Sandbox, SandboxConfig};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Options of `engine sandbox daemon`.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonOpts {
    /// How long a sandbox made ahead for a configuration waits for a request before it is
    /// dropped (0: none is made ahead).
    #[arg(long, default_value = "30s")]
    pub keep_ready: String,
    /// The socket to listen on (default `<state>/exec.sock`, where one-shots look; one
    /// elsewhere serves the one-shots that name it in ENVFACTORY_EXEC_SOCKET).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// The most configurations with a sandbox kept ready at once (the oldest goes first).
const MAX_READY: usize = 8;
/// The most requests served at once; more are answered "busy" (the client makes its own).
const MAX_SERVING: usize = 64;
/// Served sandboxes waiting for the teardown thread; past this, a request thread tears its
/// own down.
const TEARDOWN_QUEUE: usize = 32;
/// How long a client may take to send its request, or to take the answer.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(10);

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
    state: PathBuf,
    env: Vec<Option<String>>,
    /// What this process passes on to the sandboxes it makes, which a client must share.
    lineage: Lineage,
    served: AtomicU64,
    serving: AtomicUsize,
    /// When the host mask was last found current (`Runtime::host_mask_current`).
    host_checked: Mutex<Option<Instant>>,
    /// Held while the host mask is checked (see [`Daemon::check_host`]).
    host_check: Mutex<()>,
    /// Served sandboxes (their processes killed), for the teardown thread.
    teardown: SyncSender<Sandbox>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The namespaces a client must share with the daemon for the sandbox to be the one it would
/// make: the files it sees, the processes, the user ids, the cgroups.
const NAMESPACES: [&str; 4] = ["mnt", "pid", "user", "cgroup"];

/// The lines of `/proc/<pid>/status` a sandbox inherits from the process that makes it (its
/// init's capabilities, no_new_privs, seccomp and CPUs), which a client must share with the
/// daemon; its resource limits (`/proc/<pid>/limits`) too.
const INHERITED: [&str; 7] = [
    "CapInh:",
    "CapPrm:",
    "CapEff:",
    "CapBnd:",
    "NoNewPrivs:",
    "Seccomp:",
    "Cpus_allowed_list:",
];

/// What a process passes on to a sandbox it makes: its namespaces (device and inode of each),
/// the [`INHERITED`] lines of its status, and its resource limits.
#[derive(Debug, PartialEq, Eq)]
struct Lineage {
    namespaces: Vec<(&'static str, (u64, u64))>,
    status: Vec<String>,
    limits: String,
}

impl Lineage {
    fn of(pid: &str) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let namespaces = NAMESPACES
            .iter()
            .map(|ns| {
                let m = std::fs::metadata(format!("/proc/{pid}/ns/{ns}"))?;
                Ok((*ns, (m.dev(), m.ino())))
            })
            .collect::<std::io::Result<_>>()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?
            .lines()
            .filter(|l| INHERITED.iter().any(|k| l.starts_with(k)))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
        Ok(Self {
            namespaces,
            status,
            limits,
        })
    }

    /// What of `self` differs from `other`, in words.
    fn differences(&self, other: &Self) -> Vec<String> {
        let mut out: Vec<String> = self
            .namespaces
            .iter()
            .zip(&other.namespaces)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| format!("its {} namespace", a.0))
            .collect();
        out.extend(
            self.status
                .iter()
                .filter(|l| !other.status.contains(l))
                .map(|l| format!("`{l}`")),
        );
        if self.limits != other.limits {
            out.push("its resource limits".into());
        }
        out
    }
}

/// `SO_PEERPIDFD` (Linux 6.5; the value of every architecture but mips, parisc and sparc).
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the connected peer, where the kernel gives one.
fn peer_pidfd(s: &UnixStream) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a live local.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel returned a new descriptor that nothing else owns.
    (r == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the process of a pidfd is there (running, or exited and not yet reaped: its pid
/// is still its own): signal 0 through the pidfd, a check only.
fn still_there(fd: &OwnedFd) -> bool {
    super::workers::pidfd_signal(fd, 0)
}

/// `engine sandbox daemon`: serve one-shots until a signal stops the process (its sandboxes
/// are torn down and its socket removed then, by the signal watcher).
pub fn daemon(o: &DaemonOpts) -> anyhow::Result<i32> {
    let keep = parse_duration(&o.keep_ready).context("--keep-ready")?;
    if std::env::var_os("ENVFACTORY_MAX_SANDBOXES").is_some_and(|v| !v.is_empty()) {
        return Err(usage(
            "ENVFACTORY_MAX_SANDBOXES caps one process's live sandboxes: a daemon's would count every one-shot it serves and every sandbox it keeps ready; unset it for the daemon",
        ));
    }
    let state = sandbox::state::default_state_dir();
    let sock = o.socket.clone().unwrap_or_else(|| socket_path(&state));
    // One daemon per socket: a lock beside it (`<socket>.lock`, left in place), held for the
    // process's life, taken before anything else.
    let mut lock_name = sock.file_name().unwrap_or_default().to_os_string();
    lock_name.push(".lock");
    let lock_path = sock.with_file_name(lock_name);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .or_else(|_| std::fs::File::open(&lock_path))
        .with_context(|| format!("opening {}", lock_path.display()))?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(usage(format!(
            "{}: a daemon already listens there",
            sock.display()
        )));
    }
    std::mem::forget(lock);
    let rt = runtime()?;
    match std::fs::symlink_metadata(&sock) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&sock)
            .with_context(|| format!("removing the stale socket {}", sock.display()))?,
        Ok(_) => {
            return Err(usage(format!(
                "{}: exists and is not a socket; not removed",
                sock.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("{}", sock.display())),
    }
    // Mode 0600 from the start: no one else may connect before a chmod. (The umask is the
    // process's: no other thread of this process makes files meanwhile; the runtime's
    // reserves start with its second sandbox.)
    let mask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(&sock);
    nix::sys::stat::umask(mask);
    let listener = bound.with_context(|| format!("listening on {}", sock.display()))?;
    crate::cli::signals::remove_on_exit(sock.clone());
    let d = Arc::new(Daemon {
        rt: Mutex::new(rt),
        ready: Mutex::new(Vec::new()),
        keep,
        exe: ExeId::of_self().context("identifying this engine binary")?,
        state,
        env: env_values(),
        lineage: Lineage::of("self").context("reading this process's namespaces and limits")?,
        served: AtomicU64::new(0),
        serving: AtomicUsize::new(0),
        host_checked: Mutex::new(None),
        host_check: Mutex::new(()),
        teardown: teardown_thread()?,
    });
    {
        let d = d.clone();
        std::thread::Builder::new()
            .name("keep-ready".into())
            .spawn(move || loop {
                std::thread::sleep(RECHECK_AFTER / 2);
                d.expire();
            })
            .context("starting the daemon's expiry thread")?;
    }
    eprintln!(
        "engine: serving `engine sandbox exec` on {} (a sandbox made ahead waits {keep:?})",
        sock.display()
    );
    // Requests are served on threads kept between them (`workers.rs`).
    let workers = super::workers::Workers::new("one-shot");
    for conn in listener.incoming() {
        let s = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a one-shot");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // Counted in until its job ends, however `serve` ends (a panic too), or until it is
        // refused here (the job, and with it the slot, is dropped unrun when no thread takes
        // it).
        let slot = Serving(d.clone());
        if d.serving.fetch_add(1, Ordering::SeqCst) >= MAX_SERVING {
            drop(slot);
            refuse(s, format!("busy: {MAX_SERVING} one-shots running"));
            continue;
        }
        let spare = s.try_clone();
        if let Err(e) = workers.run(Box::new(move || slot.0.serve(s))) {
            tracing::warn!(error = %e, "a one-shot was not served: no thread");
            if let Ok(s) = spare {
                refuse(s, format!("no thread to serve it: {e}"));
            }
        }
    }
    Ok(0)
}

/// A request counted in [`Daemon::serving`] until this drops.
struct Serving(Arc<Daemon>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tell a client it is not served (it makes its own sandbox), and close. Every refusal is
/// logged here, once, at debug (a client unlike the daemon, and one no thread took, also at
/// warn where that is found).
fn refuse(mut s: UnixStream, why: String) {
    tracing::debug!(why = %why, "a one-shot not served");
    let _ = s.set_write_timeout(Some(CLIENT_IO_TIMEOUT));
    let _ = send(&mut s, &Reply::Mismatch(why));
}

impl Daemon {
    fn serve(&self, mut s: UnixStream) {
        let _ = s.set_read_timeout(Some(CLIENT_IO_TIMEOUT));
        let _ = s.set_write_timeout(Some(CLIENT_IO_TIMEOUT));
        let req = match self.admit(&mut s) {
            Ok(r) => r,
            Err(Some(why)) => return refuse(s, why),
            Err(None) => return,
        };
        let t0 = Instant::now();
        let (cfg, mut sb) = match self.prepare(&req) {
            Ok(p) => p,
            Err(e) => {
                let _ = send(&mut s, &Reply::Outcome(Outcome::failed(&e)));
                return;
            }
        };
        let take_us = t0.elapsed().as_micros() as u64;
        let timeout = Duration::from_millis(req.timeout_ms);
        let outcome = super::workers::until_hangup(&s, sb.init_pid(), || {
            one_shot(&mut sb, timeout, &req.cmd)
        });
        // Nothing of the command outlives its answer: every process of the sandbox is killed
        // now, and when the command left any behind (more than init and its zygote), the
        // answer waits until they are gone (init exits last); the rest of the teardown waits.
        let left_behind = sb.pids_usage().0 > 2;
        sb.stop();
        if left_behind {
            let t = Instant::now();
            while !sb.init_exited() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let served = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(
            sandbox = %sb.name(),
            served,
            take_us,
            exec_us = t0.elapsed().as_micros() as u64 - take_us,
            "one-shot served"
        );
        // The answer waits for a client that is slow to take it (stopped with Ctrl-Z, say); a
        // client that goes away ends the write.
        let _ = s.set_write_timeout(None);
        let _ = send(&mut s, &Reply::Outcome(outcome));
        drop(s);
        self.tear_down(sb);
        // The next request of this configuration finds one ready.
        self.refill(&req.opts, &cfg);
    }

    /// The client's request when this daemon serves it; `Err(Some(why))` when it does not
    /// (the client makes its own sandbox), `Err(None)` when no whole request came.
    fn admit(&self, s: &mut UnixStream) -> Result<Request, Option<String>> {
        if let Some(why) = self.stranger(s) {
            tracing::warn!(why = %why, "a one-shot's client is unlike the daemon");
            return Err(Some(why));
        }
        let unread = |e: std::io::Error| {
            tracing::debug!(error = %e, "a one-shot's request was not read");
            None
        };
        let n = match read_len(s, MAX_REQUEST).map_err(unread)? {
            Ok(n) => n,
            Err(n) => {
                return Err(Some(format!(
                    "a request of {n} bytes (at most {MAX_REQUEST})"
                )))
            }
        };
        let body = read_body(s, n).map_err(unread)?;
        // Another build's client: it runs the command itself.
        let req =
            Request::decode(&body).map_err(|e| Some(format!("an unreadable request: {e}")))?;
        match self.mismatch(&req) {
            Some(why) => Err(Some(why)),
            None => Ok(req),
        }
    }

    /// A request's configuration, and a sandbox for it.
    fn prepare(&self, req: &Request) -> anyhow::Result<(SandboxConfig, Sandbox)> {
        if req.cmd.is_empty() {
            return Err(usage(NO_COMMAND));
        }
        let cfg = req.opts.config()?;
        let sb = self.take(&req.opts, &cfg)?;
        Ok((cfg, sb))
    }

    /// Why a client may not be served, if it may not: another user, other namespaces, or
    /// other capabilities, CPUs or limits than the daemon's (its sandbox would be made with
    /// the daemon's, not its own).
    fn stranger(&self, s: &UnixStream) -> Option<String> {
        let me = nix::unistd::geteuid().as_raw();
        let cred = match nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        {
            Ok(c) => c,
            Err(e) => return Some(format!("the client's credentials: {e}")),
        };
        if cred.uid() != me {
            return Some(format!(
                "a client of uid {} (the daemon's: {me})",
                cred.uid()
            ));
        }
        // The process that connected (its pid and a pidfd of it, where the kernel gives one,
        // name the same process): read through its pid, then found still there through the
        // pidfd. A process that has not been reaped keeps its pid, so what was read is its
        // own; one gone meanwhile (its pid maybe reused) is refused.
        let pidfd = peer_pidfd(s);
        let pid = cred.pid();
        let theirs = match Lineage::of(&pid.to_string()) {
            Ok(l) => l,
            Err(e) => return Some(format!("the client's namespaces and limits: {e}")),
        };
        if pidfd.as_ref().is_some_and(|fd| !still_there(fd)) {
            return Some("the client has exited".into());
        }
        let differ = theirs.differences(&self.lineage);
        (!differ.is_empty()).then(|| {
            format!(
                "the client differs from the daemon in {}",
                differ.join(", ")
            )
        })
    }

    /// Why this daemon would not make the sandbox the client would, if it would not.
    fn mismatch(&self, req: &Request) -> Option<String> {
        if req.build != crate::oneshot::BUILD {
            return Some(format!(
                "another build of the engine (the client's {}, the daemon's {})",
                engine::text::cut(&req.build),
                crate::oneshot::BUILD
            ));
        }
        if req.exe != self.exe {
            return Some("another engine binary".into());
        }
        // The same directory spelled otherwise (a symlink, `..`) is the same state; a relative
        // path would be resolved from the daemon's directory, not the client's.
        let same_dir = |a: &std::path::Path, b: &std::path::Path| {
            a.is_absolute()
                && (a == b
                    || matches!(
                        (std::fs::canonicalize(a), std::fs::canonicalize(b)),
                        (Ok(x), Ok(y)) if x == y
                    ))
        };
        if !same_dir(&req.state, &self.state) {
            return Some(format!(
                "another state directory (the client's {}, the daemon's {})",
                req.state.display(),
                self.state.display()
            ));
        }
        if req.env.len() != self.env.len() {
            return Some("another set of environment variables".into());
        }
        if let Some((k, (a, b))) = SANDBOX_ENV
            .iter()
            .zip(req.env.iter().zip(&self.env))
            .find(|(_, (a, b))| a != b)
        {
            let show = |v: &Option<String>| {
                v.as_deref().map_or("unset".to_string(), |v| {
                    format!("`{}`", engine::text::cut(v))
                })
            };
            return Some(format!(
                "{k} differs (the client's {}, the daemon's {})",
                show(a),
                show(b)
            ));
        }
        if req.opts.rootfs != "host" {
            return Some(format!(
                "the daemon serves host-rooted sandboxes only, not --rootfs {}",
                engine::text::cut(&req.opts.rootfs)
            ));
        }
        None
    }

    /// A sandbox for `cfg`: the one kept ready, else a new one.
    fn take(&self, opts: &SandboxOpts, cfg: &SandboxConfig) -> anyhow::Result<Sandbox> {
        // (Every root served is the host's.)
        if !self.host_checked_within(RECHECK_AFTER) {
            self.check_host(false)?;
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
            if !r.sandbox.init_exited() && r.run == rt.run_id() {
                return Ok(r.sandbox);
            }
            tracing::debug!(sandbox = %r.sandbox.name(), "a sandbox made ahead is not used: it died, or the host changed");
            self.tear_down(r.sandbox);
        }
        Ok(rt.create(cfg)?)
    }

    /// Whether the host mask was found current less than `within` ago.
    fn host_checked_within(&self, within: Duration) -> bool {
        locked(&self.host_checked).is_some_and(|t| t.elapsed() < within)
    }

    /// Check that the host mask of the daemon's runtime is the one a walk of the host would
    /// plan now; when it is not, a new runtime (which plans the mask again) replaces it, and
    /// the sandboxes made ahead with the old mask are dropped.
    fn check_host(&self, force: bool) -> anyhow::Result<()> {
        // One check at a time: requests that find the check stale together do not each
        // start a new runtime for the same change; a request's check is skipped when another
        // found the mask current meanwhile (`force`: the expiry thread's, which keeps the
        // last check recent, is not).
        let _one = locked(&self.host_check);
        if !force && self.host_checked_within(RECHECK_AFTER) {
            return Ok(());
        }
        let rt = locked(&self.rt).clone();
        let t = Instant::now();
        if rt.host_mask_current()? {
            *locked(&self.host_checked) = Some(t);
            return Ok(());
        }
        let fresh = runtime()?;
        tracing::info!(old_run = %rt.run_id(), new_run = %fresh.run_id(), "the host changed since the daemon's mask was made: a new runtime");
        *locked(&self.rt) = fresh;
        *locked(&self.host_checked) = None;
        let stale: Vec<Ready> = std::mem::take(&mut *locked(&self.ready));
        for r in stale {
            self.tear_down(r.sandbox);
        }
        Ok(())
    }

    /// Kill a sandbox's processes now and leave the rest of its teardown to the teardown
    /// thread (or do it here when that one is behind).
    fn tear_down(&self, sb: Sandbox) {
        sb.stop();
        if let Err(TrySendError::Full(sb) | TrySendError::Disconnected(sb)) =
            self.teardown.try_send(sb)
        {
            drop(sb);
        }
    }

    /// Make a sandbox ready for `opts` unless one is (or `--keep-ready` is 0).
    fn refill(&self, opts: &SandboxOpts, cfg: &SandboxConfig) {
        if self.keep.is_zero() || locked(&self.ready).iter().any(|r| r.opts == *opts) {
            return;
        }
        let rt = locked(&self.rt).clone();
        let sandbox = match rt.create(cfg) {
            Ok(mut sb) => {
                sb.refill_reserve_now();
                sb
            }
            Err(e) => {
                tracing::debug!(error = %e, rootfs = %opts.rootfs, memory = %opts.memory, "no sandbox made ahead");
                return;
            }
        };
        let mut ready = locked(&self.ready);
        if ready.iter().any(|r| r.opts == *opts) {
            drop(ready);
            self.tear_down(sandbox); // another request's refill was first
            return;
        }
        let evicted = (ready.len() >= MAX_READY).then(|| ready.remove(0));
        ready.push(Ready {
            opts: opts.clone(),
            run: rt.run_id().to_string(),
            sandbox,
            made: Instant::now(),
        });
        drop(ready);
        if let Some(r) = evicted {
            self.tear_down(r.sandbox);
        }
    }

    /// Drop the sandboxes kept ready longer than `--keep-ready`; check the host mask while
    /// any is kept (a request then need not).
    fn expire(&self) {
        let old: Vec<Ready> = {
            let mut ready = locked(&self.ready);
            let (old, keep) = std::mem::take(&mut *ready)
                .into_iter()
                .partition(|r| r.made.elapsed() >= self.keep);
            *ready = keep;
            old
        };
        for r in old {
            self.tear_down(r.sandbox);
        }
        if !locked(&self.ready).is_empty() {
            if let Err(e) = self.check_host(true) {
                tracing::warn!(error = %e, "checking the host mask");
            }
        }
    }
}

/// A thread that tears down the sandboxes sent to it (their processes already killed), at
/// the lowest CPU priority (nice 19): what a teardown costs (reaping init, removing the
/// cgroups and the directory) is then paid when the CPUs are not needed by the requests and
/// the refills.
fn teardown_thread() -> anyhow::Result<SyncSender<Sandbox>> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Sandbox>(TEARDOWN_QUEUE);
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
    let bytes = reply
        .encode()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    write_frame(s, &bytes)
}
