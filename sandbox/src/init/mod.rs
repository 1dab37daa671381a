//! The resident init: PID 1 of every sandbox.
//!
//! It is started by the host in fresh mount, pid, net, uts and ipc namespaces with the control
//! socket on fd 3, receives a [`SetupPlan`], builds the root filesystem, then serves requests
//! until the socket closes, at which point it kills every process of the sandbox and exits (so
//! a crashed host leaves no process behind). It is single-threaded: forking children from it is
//! safe, and its own memory stays small.
//!
//! Agent commands cannot tamper with it: as the init of its pid namespace it receives no signal
//! from inside that it has no handler for (SIGKILL and SIGSTOP included), it is not dumpable
//! (no `/proc/1/mem`, no ptrace without CAP_SYS_PTRACE, which commands lack), commands are
//! landlocked with signal scoping, and seccomp denies ptrace and process_vm_* outright.

mod direct;
mod exec;
pub(crate) mod files;
pub(crate) mod snapshot;
pub(crate) mod spawn;
mod zygote;

use crate::mounts::{self, Layout};
use crate::protocol::{
    read_frame, write_frame, FailureKind, Health, Look, ProtocolError, Request, Response, SetUp,
    SetupPlan,
};
use crate::sys::RealSys;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The fd on which init finds its control socket.
pub const CONTROL_FD: i32 = 3;

/// Errors that stop init.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("setup: {0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: nix::errno::Errno,
    },
}

fn os(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> InitError {
    move |source| InitError::Os { what, source }
}

/// Entry point of the `envfactory-init` binary (and of `engine-core __sandbox-init`).
pub fn main() -> ! {
    // Started as the reserve's fork server (`init_forker.rs`) rather than as a sandbox's init.
    if std::env::args_os()
        .last()
        .is_some_and(|a| a == crate::init_forker::FORKER_ARG)
    {
        crate::init_forker::main_forker()
    }
    // Nothing but the control socket above the standard descriptors: whatever the engine's
    // own parent left open without close-on-exec is not init's (nor its commands').
    crate::spawn_init::close_above_control();
    // SAFETY: the host passes the control socket on fd 3 and nothing else owns it.
    let sock = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    let code = match run(sock, false) {
        Ok(()) => 0,
        Err(e) => {
            // stderr is /dev/null once set up; this reaches the host's terminal only when the
            // very first steps fail.
            eprintln!("envfactory-init: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// Entry point of an init forked from a single-threaded host process
/// (`spawn_init::fork_init`) or from the init forker (`init_forker.rs`): as [`main`], but it
/// leaves with `_exit`, so the host's exit handlers and buffered output (copied with its
/// memory) are never run or flushed here. With `make_netns` it makes its own network
/// namespace (see [`run`]); else it entered one made ahead.
pub(crate) fn main_forked(make_netns: bool) -> ! {
    // SAFETY: the fork moved the control socket to fd 3 and closed every other descriptor.
    let sock = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
    // A panic (here or in the zygote, forked from here) must never unwind into the host's
    // frames copied below this one: their destructors would remove the host's cgroups,
    // mounts and directories from inside the sandbox.
    let code =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(sock, make_netns))) {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "envfactory-init: {e}");
                1
            }
            Err(_) => 101,
        };
    // SAFETY: leaving the process without running the host's exit handlers.
    unsafe { libc::_exit(code) }
}

pub(crate) struct Init {
    sock: UnixStream,
    sigfd: SignalFd,
    layout: Layout,
    plan: SetupPlan,
    /// Layers under the current root, topmost first (snapshots, then the base).
    current: Vec<String>,
    snapshots: Vec<snapshot::Snapshot>,
    root_fd: Option<OwnedFd>,
    landlock_policy: Option<crate::landlock::LandlockPolicy>,
    landlock: Option<crate::landlock::PreparedLandlock>,
    seccomp: Option<crate::seccomp::PreparedSeccomp>,
    last_cap: u8,
    /// The confined process that forks commands (see `zygote`): started at setup, after the
    /// answer to a request that remounted the root, and on demand when there is none.
    zygote: Option<zygote::Zygote>,
    /// Set by a remount: the new root's zygote is started once the request's answer is sent
    /// (it confines itself while the host reads the answer).
    zygote_due: bool,
    /// Read buffer of command output, kept across commands.
    buf: Vec<u8>,
}

/// Init's life. With `make_netns` (a forked init: `spawn_init::fork_init` leaves
/// `CLONE_NEWNET` out of its clone, so that the engine does not wait for a network namespace
/// to be made), init makes its own network namespace first, while the engine goes on resolving
/// the root; before it reads any request, so before anything of the sandbox exists. A failure
/// is the answer to the first request (`Prepare` or `Setup`).
fn run(mut sock: UnixStream, make_netns: bool) -> Result<(), InitError> {
    let netns = if make_netns {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(os("unshare(CLONE_NEWNET)"))
    } else {
        Ok(())
    };
    // Not dumpable: no /proc/1/mem, no ptrace attach without CAP_SYS_PTRACE.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(os("blocking SIGCHLD"))?;
    // SAFETY: ignoring SIGPIPE installs no handler code.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) }
        .map_err(os("ignoring SIGPIPE"))?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(os("signalfd"))?;
    quiet_stdio();

    // An init started ahead (`init_reserve.rs`) is told its directory and cgroups first and
    // does what depends on nothing else while it waits for its plan; given the plan the
    // runtime expects, it also mounts that root and starts its zygote (`setup_ahead`).
    // Its answer tells the reserve whether it is ready; one that failed exits.
    let first = read_frame::<Request>(&mut sock, "request")?;
    let (mut init, set_up) = match first {
        Request::Prepare(p) => {
            let mut p = *p;
            let expected = p.expected.take();
            if let Err(e) = netns.and_then(|()| prepare(&p)) {
                return answer_failed(&mut sock, e);
            }
            match expected {
                None => {
                    write_frame(&mut sock, "response", &Response::Ok)?;
                    let plan = read_setup(&mut sock)?;
                    let mut init = Init::new(sock, sigfd, plan);
                    let r = init.setup(Some(p)).map(|()| SetUp::default());
                    (init, r)
                }
                Some(mut expected) => {
                    expected.sandbox_dir = p.sandbox_dir.clone();
                    expected.cgroup_join = p.cgroup_join.clone();
                    let mut init = Init::new(sock, sigfd, *expected);
                    // A root that cannot be made (a layer of the expected plan gone since) is
                    // undone, and the spare waits as one without.
                    let ahead = match init.setup_ahead(&p) {
                        Ok(a) => Some(a),
                        Err(_) => match init.undo_ahead() {
                            Ok(()) => None,
                            Err(e) => return answer_failed(&mut init.sock, e),
                        },
                    };
                    write_frame(&mut init.sock, "response", &Response::Ok)?;
                    let plan = read_setup(&mut init.sock)?;
                    let r = init.setup_after_ahead(plan, p, ahead.as_ref());
                    (init, r)
                }
            }
        }
        Request::Setup(plan) => {
            let mut init = Init::new(sock, sigfd, *plan);
            let r = netns
                .and_then(|()| init.setup(None))
                .map(|()| SetUp::default());
            (init, r)
        }
        other => return Err(not_a_plan(&other)),
    };
    match set_up {
        Ok(done) => write_frame(&mut init.sock, "response", &Response::SetUp(done))?,
        Err(e) => return answer_failed(&mut init.sock, e),
    }
    init.serve()
}

/// Answer the pending request with `e`, after which init exits.
fn answer_failed(sock: &mut UnixStream, e: InitError) -> Result<(), InitError> {
    let reply = Response::Failed {
        kind: FailureKind::Internal,
        message: e.to_string(),
    };
    write_frame(sock, "response", &reply)?;
    Ok(())
}

/// The plan, which must come next.
fn read_setup(sock: &mut UnixStream) -> Result<SetupPlan, InitError> {
    match read_frame::<Request>(sock, "request")? {
        Request::Setup(plan) => Ok(*plan),
        other => Err(not_a_plan(&other)),
    }
}

/// The error for a first request (after a `Prepare`, the next) that is not the plan.
fn not_a_plan(other: &Request) -> InitError {
    InitError::Setup(format!("first request must be Setup, got {other:?}"))
}

/// What [`Init::setup_ahead`] made: the identity (device, inode) of each layer directory the
/// root was mounted on.
struct RootAhead {
    layers: Vec<(u64, u64)>,
}

/// The device and inode of each of `lowers` (symlinks followed, as the overlay's mount does).
fn layer_identities(lowers: &[String]) -> Result<Vec<(u64, u64)>, InitError> {
    use std::os::unix::fs::MetadataExt;
    lowers
        .iter()
        .map(|l| {
            std::fs::metadata(l)
                .map(|m| (m.dev(), m.ino()))
                .map_err(|e| InitError::Setup(format!("layer {l}: {e}")))
        })
        .collect()
}

/// Whether `path` is a mount point below `parent` (another filesystem).
fn mounted_on(path: &Path, parent: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(path), std::fs::metadata(parent)) {
        (Ok(a), Ok(b)) => a.dev() != b.dev(),
        _ => false,
    }
}

fn quiet_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors, which init owns.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Join the cgroups (single-threaded, so moving this thread moves init), then make them the
/// root of a new cgroup namespace.
fn join_cgroups(files: &[String]) -> Result<(), InitError> {
    for f in files {
        std::fs::write(f, "0").map_err(|e| InitError::Setup(format!("joining cgroup {f}: {e}")))?;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(os("unshare(CLONE_NEWCGROUP)"))
}

/// The size of the private directory's tmpfs before the plan gives the disk size (it then
/// holds only the side trees' few files; the plan resizes it, never below this).
const PREPARED_SCRATCH: u64 = 16 << 20;

/// What an init started ahead does before its plan: the steps of [`Init::setup`] that depend
/// only on its directory and cgroups, in the same order.
fn prepare(p: &crate::protocol::PreparePlan) -> Result<(), InitError> {
    join_cgroups(&p.cgroup_join)?;
    crate::netns::loopback_up().map_err(os("bringing up lo"))?;
    let layout = Layout::new(&p.sandbox_dir);
    let mut sys = RealSys;
    mounts::setup_private_dir(&mut sys, &layout, PREPARED_SCRATCH)
        .map_err(|e| InitError::Setup(e.to_string()))?;
    mounts::setup_side_trees(&mut sys, &layout, &side_tree_probe)
        .map_err(|e| InitError::Setup(e.to_string()))
}

/// A plan must name the directory and cgroups its init was prepared for.
fn check_prepared(p: &crate::protocol::PreparePlan, plan: &SetupPlan) -> Result<(), InitError> {
    if p.sandbox_dir != plan.sandbox_dir || p.cgroup_join != plan.cgroup_join {
        return Err(InitError::Setup(format!(
            "the plan names {} and cgroups {:?}, but this init was prepared for {} and {:?}",
            plan.sandbox_dir, plan.cgroup_join, p.sandbox_dir, p.cgroup_join
        )));
    }
    Ok(())
}

fn side_tree_probe(p: &Path) -> Option<bool> {
    std::fs::symlink_metadata(p).ok().map(|m| m.is_dir())
}

impl Init {
    fn new(sock: UnixStream, sigfd: SignalFd, plan: SetupPlan) -> Self {
        Init {
            sock,
            sigfd,
            layout: Layout::new(&plan.sandbox_dir),
            current: plan.lowers.clone(),
            plan,
            snapshots: Vec::new(),
            root_fd: None,
            landlock_policy: None,
            landlock: None,
            seccomp: None,
            last_cap: crate::caps::last_cap(),
            zygote: None,
            zygote_due: false,
            buf: Vec::new(),
        }
    }

    /// In an init started ahead, with the plan the runtime expects as `self.plan`: the rest of
    /// the setup (the root mounted, the zygote started, the side trees and read-only paths
    /// bound), done before the sandbox's plan comes. Each layer directory is opened first and
    /// the overlay mounted on those descriptors (`/proc/self/fd/N`), so the identities kept
    /// are those of the directories mounted, whatever their paths named meanwhile.
    fn setup_ahead(
        &mut self,
        prepared: &crate::protocol::PreparePlan,
    ) -> Result<RootAhead, InitError> {
        use nix::fcntl::OFlag;
        let mut dirs = Vec::with_capacity(self.plan.lowers.len());
        let mut layers = Vec::with_capacity(self.plan.lowers.len());
        for l in &self.plan.lowers {
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            let fd = nix::fcntl::open(l.as_str(), flags, nix::sys::stat::Mode::empty())
                .map_err(|e| InitError::Setup(format!("layer {l}: {e}")))?;
            // SAFETY: open returned a fresh descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let st = nix::sys::stat::fstat(fd.as_raw_fd())
                .map_err(|e| InitError::Setup(format!("layer {l}: {e}")))?;
            layers.push((st.st_dev, st.st_ino));
            dirs.push(fd);
        }
        self.current = dirs
            .iter()
            .map(|fd| format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .collect();
        let made = self.setup(Some(prepared.clone()));
        // Resets mount the plan's layers by name, as in any sandbox.
        self.current = self.plan.lowers.clone();
        made?;
        Ok(RootAhead { layers })
    }

    /// Undo what [`Init::setup_ahead`] made, whole or in part: the zygote killed and reaped,
    /// the root unmounted, the confinement prepared for it dropped.
    fn undo_ahead(&mut self) -> Result<(), InitError> {
        if let Some(z) = self.zygote.take() {
            let pid = nix::unistd::Pid::from_raw(z.pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
        }
        if mounted_on(&self.layout.rw(), &self.layout.dir) {
            self.unmount_root()?;
        }
        self.landlock = None;
        self.root_fd = None;
        self.landlock_policy = None;
        self.seccomp = None;
        Ok(())
    }

    /// The sandbox's `plan`, in an init started ahead that made `ahead` for the expected one:
    /// the root and zygote made ahead are kept when the plan has the same root and
    /// confinement and each layer path still names the directory that was mounted; else they
    /// are undone and the plan is set up as in any init started ahead.
    fn setup_after_ahead(
        &mut self,
        plan: SetupPlan,
        prepared: crate::protocol::PreparePlan,
        ahead: Option<&RootAhead>,
    ) -> Result<SetUp, InitError> {
        check_prepared(&prepared, &plan)?;
        if let Some(ahead) = ahead {
            let same_layers = || layer_identities(&plan.lowers).is_ok_and(|l| l == ahead.layers);
            if self.plan.same_root_and_confinement(&plan) && same_layers() {
                nix::unistd::sethostname(&plan.hostname).map_err(os("sethostname"))?;
                self.plan = plan;
                return Ok(SetUp {
                    root_made_ahead: true,
                    root_undone: false,
                });
            }
        }
        self.undo_ahead()?;
        self.current = plan.lowers.clone();
        self.plan = plan;
        self.setup(Some(prepared))?;
        Ok(SetUp {
            root_made_ahead: false,
            root_undone: ahead.is_some(),
        })
    }

    /// The setup steps, in the order of docs/sandbox.md; `prepared`: what [`prepare`] did
    /// before the plan came.
    fn setup(&mut self, prepared: Option<crate::protocol::PreparePlan>) -> Result<(), InitError> {
        let plan = &self.plan;
        let mut sys = RealSys;
        let scratch = plan.disk_bytes.saturating_mul(4).saturating_add(16 << 20);
        let side_trees_done = match prepared {
            None => {
                join_cgroups(&plan.cgroup_join)?;
                crate::netns::loopback_up().map_err(os("bringing up lo"))?;
                mounts::setup_private_dir(&mut sys, &self.layout, scratch)
                    .map_err(|e| InitError::Setup(e.to_string()))?;
                false
            }
            Some(p) => {
                check_prepared(&p, plan)?;
                mounts::resize_private_dir(&mut sys, &self.layout, scratch.max(PREPARED_SCRATCH))
                    .map_err(|e| InitError::Setup(e.to_string()))?;
                true
            }
        };
        nix::unistd::sethostname(&plan.hostname).map_err(os("sethostname"))?;
        if let Some(s) = &plan.seccomp {
            self.seccomp = Some(s.prepare());
        }
        if plan.landlock {
            self.landlock_policy = Some(
                crate::landlock::LandlockPolicy::embedded()
                    .map_err(|e| InitError::Setup(format!("landlock policy: {e}")))?,
            );
        }
        self.mount_overlay()?;
        // The zygote confines itself (about a millisecond of seccomp) while init mounts the
        // side trees: it chroots into the root now and sees what is mounted under it later.
        self.prestart_zygote();
        if !side_trees_done {
            mounts::setup_side_trees(&mut sys, &self.layout, &side_tree_probe)
                .map_err(|e| InitError::Setup(e.to_string()))?;
        }
        self.bind_side_trees()
    }

    /// Bind the side trees into the root (see `mounts::bind_side_trees`), then the read-only
    /// paths over themselves (`mounts::bind_readonly`).
    fn bind_side_trees(&mut self) -> Result<(), InitError> {
        mounts::bind_side_trees(&mut RealSys, &self.layout, self.plan.disk_bytes)
            .map_err(|e| InitError::Setup(e.to_string()))?;
        if self.plan.readonly_paths.is_empty() {
            return Ok(());
        }
        let root = self
            .root_fd
            .as_ref()
            .ok_or_else(|| InitError::Setup("read-only paths: no root is mounted".into()))?;
        let mut resolve = |p: &str| -> Result<mounts::Resolved, crate::sys::SysError> {
            // Resolved inside the root (a symlink in the layers cannot lead out of it), then
            // named through the descriptor for mount(2).
            let fd = files::open_path_in_root(root, p)
                .map_err(|e| crate::sys::SysError::new("openat2", Path::new(p), e))?;
            Ok(mounts::Resolved {
                path: PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
                keep: Some(fd),
            })
        };
        mounts::bind_readonly(&mut RealSys, &self.plan.readonly_paths, &mut resolve)
            .map_err(|e| InitError::Setup(format!("read-only paths: {e}")))
    }

    /// Mount the overlay root over `self.current` and prepare what each command needs of it.
    fn mount_overlay(&mut self) -> Result<(), InitError> {
        mounts::mount_overlay(
            &mut RealSys,
            &self.layout,
            &self.current,
            mounts::Disk {
                bytes: self.plan.disk_bytes,
                inodes: self.plan.disk_inodes,
            },
            self.plan.userns.map(|(base, _)| base),
        )
        .map_err(|e| InitError::Setup(e.to_string()))?;
        let root = nix::fcntl::open(
            &self.layout.root(),
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(os("opening the root"))?;
        // SAFETY: open returned a fresh descriptor that nothing else owns.
        self.root_fd = Some(unsafe { OwnedFd::from_raw_fd(root) });
        if let Some(policy) = &self.landlock_policy {
            self.landlock = Some(
                policy
                    .prepare(&self.layout.root())
                    .map_err(|e| InitError::Setup(format!("landlock: {e}")))?,
            );
        }
        Ok(())
    }

    fn unmount_root(&mut self) -> Result<(), InitError> {
        self.landlock = None;
        self.root_fd = None;
        mounts::unmount_root(&mut RealSys, &self.layout)
            .map_err(|e| InitError::Setup(e.to_string()))
    }

    fn serve(&mut self) -> Result<(), InitError> {
        loop {
            let mut fds = [
                nix::poll::PollFd::new(self.sock.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(self.sigfd.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(os("poll")(e)),
            }
            let sig_ready = fds[1].any().unwrap_or(false);
            let sock_ready = fds[0].any().unwrap_or(false);
            if sig_ready {
                self.reap(None);
            }
            if !sock_ready {
                continue;
            }
            let req = match read_frame::<Request>(&mut self.sock, "request") {
                Ok(r) => r,
                Err(ProtocolError::Closed) => {
                    self.kill_all();
                    return Ok(());
                }
                Err(e @ ProtocolError::Decode { .. }) | Err(e @ ProtocolError::TooLarge { .. }) => {
                    // A malformed frame: say so and keep serving. (A too-large frame leaves the
                    // stream unsynchronised: the host drops the sandbox on this error.)
                    let r = Response::Failed {
                        kind: FailureKind::Invalid,
                        message: e.to_string(),
                    };
                    write_frame(&mut self.sock, "response", &r)?;
                    if matches!(e, ProtocolError::TooLarge { .. }) {
                        self.kill_all();
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => {
                    self.kill_all();
                    return Err(e.into());
                }
            };
            let shutdown = matches!(req, Request::Shutdown);
            let resp = self.handle(req);
            match write_frame(&mut self.sock, "response", &resp) {
                // When a command's answers to its looks make its reply too large to send, they
                // are all left out (nothing was written yet): the host asks one by one.
                Err(e @ ProtocolError::TooLarge { .. }) => match resp {
                    Response::Exec(mut r) if !r.answers.is_empty() => {
                        r.answers.clear();
                        write_frame(&mut self.sock, "response", &Response::Exec(r))?;
                    }
                    Response::Answers(a) if !a.is_empty() => {
                        write_frame(&mut self.sock, "response", &Response::Answers(Vec::new()))?;
                    }
                    _ => return Err(e.into()),
                },
                r => {
                    drop(resp);
                    r?
                }
            }
            if shutdown {
                return Ok(());
            }
            // After the answer, not before it: a reset's or rollback's answer does not wait
            // for the fork (the answer is freed first: a large one is unmapped before it).
            self.start_due_zygote();
        }
    }

    /// Start the zygote a remount left due (see `zygote_due`), unless one runs already.
    fn start_due_zygote(&mut self) {
        if std::mem::take(&mut self.zygote_due) && self.zygote.is_none() {
            self.prestart_zygote();
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        let internal = |e: InitError| Response::Failed {
            kind: FailureKind::Internal,
            message: e.to_string(),
        };
        match req {
            Request::Setup(_) | Request::Prepare(_) => Response::Failed {
                kind: FailureKind::Invalid,
                message: "the sandbox is already set up".into(),
            },
            Request::Exec(e) => self.exec(&e),
            Request::ReadFile {
                path,
                max_bytes,
                nofollow,
            } => self.read_file(&path, max_bytes, nofollow),
            Request::WriteFile { path, data, mode } => self.write_file(&path, &data, mode),
            Request::Stat { path } => self.stat(&path),
            Request::ListDir { path } => self.list_dir(&path),
            Request::Overview { path, max_entries } => self.overview(&path, max_entries),
            Request::KillAll => {
                self.kill_all();
                Response::Ok
            }
            Request::Reset => self.reset().map(|()| Response::Ok).unwrap_or_else(internal),
            Request::ResetAndLook { looks } => {
                if looks.len() > crate::protocol::MAX_LOOKS {
                    return Response::Failed {
                        kind: FailureKind::Invalid,
                        message: format!(
                            "{} looks after the reset; at most {}",
                            looks.len(),
                            crate::protocol::MAX_LOOKS
                        ),
                    };
                }
                match self.reset() {
                    // Answered as their own requests are, on the fresh state. A look that
                    // may see the zygote (health, a path through `/proc`) sees it as a request
                    // right after the reset would: it starts first.
                    Ok(()) => {
                        if looks.iter().any(Look::reads_processes) {
                            self.start_due_zygote();
                        }
                        Response::Answers(looks.iter().map(|l| self.handle(l.request())).collect())
                    }
                    Err(e) => internal(e),
                }
            }
            Request::Snapshot => self.snapshot(),
            Request::Rollback { snapshot } => self.rollback(snapshot),
            Request::Health => Response::Health(self.health()),
            Request::Shutdown => {
                self.kill_all();
                Response::Ok
            }
        }
    }

    /// Kill every process of the sandbox but init, and reap them.
    pub(crate) fn kill_all(&mut self) {
        self.signal_all();
        self.wait_all();
    }

    /// SIGKILL every process of the sandbox but init, without waiting for them. One sweep of
    /// `kill(-1)` from the init of a pid namespace reaches them all, and a process with a
    /// pending SIGKILL can no longer fork.
    fn signal_all(&mut self) {
        self.zygote = None; // it dies with the rest
                            // SAFETY: kill with integer arguments.
        unsafe { libc::kill(-1, libc::SIGKILL) };
    }

    /// Reap until no process but init is left (sweeping again in case one escaped the first).
    fn wait_all(&mut self) {
        for _ in 0..100_000 {
            // SAFETY: kill with integer arguments. It fails with ESRCH once nothing is left,
            // zombies included.
            if unsafe { libc::kill(-1, libc::SIGKILL) } != 0 {
                break;
            }
            match nix::sys::wait::waitpid(None, None) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        // Drain the signalfd of the SIGCHLDs just consumed.
        while let Ok(Some(_)) = self.sigfd.read_signal() {}
    }

    /// Reap every exited child without blocking; returns the wait status of `watch` if it was
    /// among them.
    pub(crate) fn reap(&mut self, watch: Option<i32>) -> Option<nix::sys::wait::WaitStatus> {
        while let Ok(Some(_)) = self.sigfd.read_signal() {}
        let mut found = None;
        loop {
            match nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(nix::sys::wait::WaitStatus::StillAlive) | Err(_) => break,
                Ok(st) => {
                    let pid = st.pid().map(|p| p.as_raw());
                    if pid == watch {
                        found = Some(st);
                    }
                    // A reaped zygote is forgotten at once: its pid may now be anyone's, and
                    // `Health::zygote_pid` must never name a command.
                    if pid.is_some() && pid == self.zygote.as_ref().map(|z| z.pid) {
                        self.zygote = None;
                    }
                }
            }
        }
        found
    }

    fn reset(&mut self) -> Result<(), InitError> {
        self.current = self.plan.lowers.clone();
        self.remount()?;
        self.snapshots.clear();
        snapshot::remove_all(&self.layout);
        Ok(())
    }

    /// Kill every process and mount a fresh root over `self.current`. The processes die while
    /// the root is remounted (they hold only the detached old tree); all are reaped before
    /// the new zygote starts, after the request's answer (`zygote_due`).
    pub(crate) fn remount(&mut self) -> Result<(), InitError> {
        self.signal_all();
        let r = self
            .unmount_root()
            .and_then(|()| self.mount_overlay())
            .and_then(|()| self.bind_side_trees());
        self.wait_all();
        // SysV IPC objects outlive every process, like files: they are state of the episode,
        // as a fresh /dev/shm is (the sandbox's IPC namespace is its own).
        self.remove_sysv_ipc();
        r?;
        // Started by `serve` once the answer is written (`start_due_zygote`).
        self.zygote_due = true;
        Ok(())
    }

    /// Remove every SysV shared memory segment, message queue and semaphore set of the
    /// sandbox's IPC namespace (listed in its `/proc/sysvipc`; no process is left to use them).
    /// A table the kernel counts empty is not read.
    fn remove_sysv_ipc(&self) {
        let in_use = sysv_ipc_in_use();
        for (table, used) in ["shm", "msg", "sem"].into_iter().zip(in_use) {
            if used == Some(0) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(self.layout.proc().join("sysvipc").join(table))
            else {
                continue;
            };
            for id in text
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i32>().ok())
            {
                // SAFETY: IPC_RMID with integer arguments and no buffer.
                unsafe {
                    match table {
                        "shm" => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                        "msg" => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
                        _ => libc::semctl(id, 0, libc::IPC_RMID),
                    };
                }
            }
        }
    }

    fn health(&self) -> Health {
        let processes = std::fs::read_dir(self.layout.proc())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .bytes()
                            .all(|b| b.is_ascii_digit())
                    })
                    .count()
            })
            .unwrap_or(1);
        let (upper_bytes, upper_inodes) = fs_usage(&self.layout.rw());
        let (shm_bytes, shm_inodes) = fs_usage(&self.layout.root().join("dev/shm"));
        Health {
            pid_in_sandbox: std::process::id(),
            // Neither init nor the zygote count.
            processes: processes.saturating_sub(1 + usize::from(self.zygote_alive())) as u32,
            snapshots: self.snapshots.len() as u32,
            upper_bytes,
            upper_inodes,
            shm_bytes,
            shm_inodes,
            zygote_pid: self
                .zygote
                .as_ref()
                .filter(|_| self.zygote_alive())
                .and_then(|z| u32::try_from(z.pid).ok()),
        }
    }
}

impl Init {
    fn zygote_alive(&self) -> bool {
        self.zygote
            .as_ref()
            .is_some_and(|z| self.layout.proc().join(z.pid.to_string()).exists())
    }
}

/// How many SysV shared memory segments, message queues and semaphore sets exist in this
/// process's IPC namespace, by the kernel's own counts (`SHM_INFO`, `MSG_INFO`, `SEM_INFO`);
/// `None` for a count the kernel did not give.
fn sysv_ipc_in_use() -> [Option<i32>; 3] {
    /// The kernel's `struct shm_info` (`SHM_INFO`, which libc does not name).
    #[repr(C)]
    #[derive(Default)]
    struct ShmInfo {
        used_ids: libc::c_int,
        shm_tot: libc::c_ulong,
        shm_rss: libc::c_ulong,
        shm_swp: libc::c_ulong,
        swap_attempts: libc::c_ulong,
        swap_successes: libc::c_ulong,
    }
    const SHM_INFO: libc::c_int = 14;
    let mut shm = ShmInfo::default();
    // SAFETY: with SHM_INFO the kernel writes a `struct shm_info` to the buffer, which is one.
    let shm_rc = unsafe {
        libc::shmctl(
            0,
            SHM_INFO,
            (&mut shm as *mut ShmInfo).cast::<libc::shmid_ds>(),
        )
    };
    // SAFETY: zeroed integer fields are a valid `msginfo`.
    let mut msg: libc::msginfo = unsafe { std::mem::zeroed() };
    // SAFETY: with MSG_INFO the kernel writes a `struct msginfo` to the buffer, which is one.
    let msg_rc = unsafe {
        libc::msgctl(
            0,
            libc::MSG_INFO,
            (&mut msg as *mut libc::msginfo).cast::<libc::msqid_ds>(),
        )
    };
    /// The kernel's `struct seminfo` (the libc crate has it for glibc only).
    #[repr(C)]
    #[derive(Default)]
    struct SemInfo {
        semmap: libc::c_int,
        semmni: libc::c_int,
        semmns: libc::c_int,
        semmnu: libc::c_int,
        semmsl: libc::c_int,
        semopm: libc::c_int,
        semume: libc::c_int,
        semusz: libc::c_int,
        semvmx: libc::c_int,
        semaem: libc::c_int,
    }
    let mut sem = SemInfo::default();
    // SAFETY: with SEM_INFO the fourth argument is a pointer to a `struct seminfo` (the
    // `__buf` of `union semun`), which the kernel fills; `sem` is one.
    let sem_rc = unsafe { libc::semctl(0, 0, libc::SEM_INFO, &mut sem as *mut SemInfo) };
    [
        (shm_rc >= 0).then_some(shm.used_ids),
        (msg_rc >= 0).then_some(msg.msgpool),
        (sem_rc >= 0).then_some(sem.semusz),
    ]
}

/// The kernel's own accounting of a filesystem: bytes and inodes in use (0 where it cannot say).
pub(super) fn fs_usage(p: &std::path::Path) -> (u64, u64) {
    nix::sys::statvfs::statvfs(p)
        .map(|s| {
            (
                s.blocks().saturating_sub(s.blocks_free()) * s.fragment_size(),
                s.files().saturating_sub(s.files_free()),
            )
        })
        .unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_counts_sysv_ipc_objects_of_the_namespace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        // In a thread of its own, in a new IPC namespace (gone with the thread).
        std::thread::spawn(|| {
            // SAFETY: unshare and the SysV calls take integer arguments (and null pointers
            // for the removals); the objects live in this thread's new namespace only.
            unsafe {
                assert_eq!(libc::unshare(libc::CLONE_NEWIPC), 0);
                assert_eq!(super::sysv_ipc_in_use(), [Some(0), Some(0), Some(0)]);
                let shm = libc::shmget(libc::IPC_PRIVATE, 4096, 0o600);
                let msg = libc::msgget(libc::IPC_PRIVATE, 0o600);
                let sem = libc::semget(libc::IPC_PRIVATE, 2, 0o600);
                let msg2 = libc::msgget(libc::IPC_PRIVATE, 0o600);
                assert!(shm >= 0 && msg >= 0 && sem >= 0 && msg2 >= 0);
                assert_eq!(super::sysv_ipc_in_use(), [Some(1), Some(2), Some(1)]);
                libc::shmctl(shm, libc::IPC_RMID, std::ptr::null_mut());
                libc::msgctl(msg, libc::IPC_RMID, std::ptr::null_mut());
                libc::msgctl(msg2, libc::IPC_RMID, std::ptr::null_mut());
                libc::semctl(sem, 0, libc::IPC_RMID);
                assert_eq!(super::sysv_ipc_in_use(), [Some(0), Some(0), Some(0)]);
            }
        })
        .join()
        .unwrap();
    }
}
