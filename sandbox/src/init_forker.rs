//! The init reserve's fork server: spare inits forked, not exec'd.
//!
//! An exec'd init pays, before it reads its first request, for loading its program: the
//! dynamic loader, the C library's start (on a virtual machine every `cpuid` of it traps) and
//! the Rust runtime's start (`envfactory-init --version`, which does only that and exits: 0.79
//! ms task-clock on the development VM, against 0.50 for `/bin/true`), and it pays it for
//! every sandbox. The reserve (`init_reserve.rs`) instead starts, once, the init program as a
//! fork server (`envfactory-init --forker`, a process of its own with init's environment,
//! descriptors and signal state) and asks it for each spare: the forker, single-threaded and
//! holding nothing of the engine, clones a copy of itself into the sandbox's new namespaces,
//! exactly as `spawn_init::fork_init` forks a one-shot's init, and the copy runs the same init
//! code as an exec'd init.
//!
//! - **Whose child**: the clone has `CLONE_PARENT`, so init is the engine's child, as an
//!   exec'd spare is: the engine reaps it, kills it by its pid (never reused before the
//!   engine's wait), and gets its `SIGCHLD`. The forker never has a child.
//! - **What it starts with**: the control socket on fd 3 and no other descriptor above 2,
//!   every signal disposition at its default but SIGSEGV and SIGBUS (the Rust runtime's
//!   stack-overflow handler, which an exec'd init installs too), `PATH` as its whole
//!   environment, the command line of an exec'd init (without `--forker`), not dumpable from
//!   its first instruction; its mount namespace a copy of the engine's at the clone (the
//!   forker shares the engine's), the network namespace made ahead entered before anything
//!   else when the reserve has one, else its own made as a one-shot's forked init makes it.
//!   What it inherits from the process it was cloned from is the forker's as of the forker's
//!   start, where an exec'd spare's is the reserve thread's at its clone: the credentials,
//!   capabilities, limits, CPU affinity and cgroups (left for the sandbox's own at `Prepare`
//!   either way), and the signal mask, which is empty (`std::process::Command` clears it).
//! - **Protocol**: a `SOCK_SEQPACKET` pair. The forker first says `forker 1`; a program that
//!   says something else is killed and never started as one again by that reserve; one that says
//!   nothing within [`ANSWER_TIMEOUT`] (an older init named by `ENVFACTORY_INIT` waits for
//!   its plan instead) or exits first is killed, and after [`MAX_WITHOUT_HELLO`] such starts
//!   in a row never started again. Each request
//!   is one byte (`n`: a network namespace follows, `-`: none) with the control socket (and
//!   the namespace) as `SCM_RIGHTS`; the answer is the child's pid, or minus an errno, as 4
//!   bytes little-endian.
//! - **Failures**: a request that cannot be sent (the forker is gone) goes to an exec'd init
//!   with the same descriptors; a clone the forker reports failed fails that spare as an
//!   exec'd init's would (the reserve tries again after its pause). A request sent but never
//!   answered (the forker killed, stopped or stuck) fails that spare: the forker is killed and
//!   reaped first, then any child of the engine that is a pid namespace's init holding the
//!   spare's control socket (an init cloned but not reported), so no second init ever gets the
//!   same socket or network namespace. A forker that failed is started again for the next
//!   spare. The forker ignores
//!   the terminal's signals (SIGINT, SIGQUIT, SIGHUP, job control), and exits when its socket
//!   reaches end of file (the engine gone); the reserve kills and reaps it when it stops.
//!
//! What differs from an exec'd init: the inits forked from one forker share what its one
//! `execve` randomized (its address space layout, the stack protector's canary, the C
//! library's pointer guard, the Rust standard library's hash keys), where exec'd inits each
//! get their own. No namespace, cgroup, limit, credential or confinement of a sandbox
//! changes: its init gets the same plan and sets it up as before.

use crate::error::SandboxError;
use crate::runtime::InitProgram;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The argument that makes the init program a fork server (its last).
pub(crate) const FORKER_ARG: &str = "--forker";

/// What a forker says first.
const HELLO: &[u8] = b"forker 1";

/// How long the engine waits for a forker's word (its hello, an answer).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What went wrong with the init forker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForkerError {
    #[error("starting the init forker: {0}")]
    Start(#[source] std::io::Error),
    #[error("init program {path}: not an init forker ({said})")]
    NotAForker { path: PathBuf, said: String },
    /// No hello in time, or it exited first: maybe not a forker, maybe slow or crashed once.
    #[error("init program {path} as a forker: {said}")]
    NoHello { path: PathBuf, said: String },
    /// The request never reached it (it is gone): nothing was cloned.
    #[error("the init forker is gone: {0}")]
    Gone(#[source] std::io::Error),
    /// It answered that its clone failed: nothing was cloned.
    #[error("the init forker's clone into new namespaces failed: {0}")]
    Clone(#[source] std::io::Error),
    /// The request was sent but no answer came: a child may hold what was sent.
    #[error("no answer from the init forker: {0}")]
    NoAnswer(#[source] std::io::Error),
}

impl From<ForkerError> for SandboxError {
    fn from(e: ForkerError) -> Self {
        let (what, source) = match e {
            ForkerError::Clone(s) => ("clone into new namespaces (init forker)", s),
            ForkerError::NoAnswer(s) => ("waiting for the init forker's answer", s),
            ForkerError::Gone(s) => ("asking the init forker", s),
            ForkerError::Start(s) => ("starting the init forker", s),
            ForkerError::NotAForker { path, said } => {
                return SandboxError::InitProgram {
                    path,
                    reason: format!("not an init forker ({said})"),
                }
            }
            ForkerError::NoHello { path, said } => {
                return SandboxError::InitProgram {
                    path,
                    reason: format!("as an init forker: {said}"),
                }
            }
        };
        SandboxError::Spawn { what, source }
    }
}

fn io(e: nix::errno::Errno) -> std::io::Error {
    match e {
        // The socket's receive timeout.
        nix::errno::Errno::EAGAIN => std::io::Error::from(std::io::ErrorKind::TimedOut),
        e => std::io::Error::from_raw_os_error(e as i32),
    }
}

/// `recv` on `fd`, again after an interruption.
fn recv_again(fd: RawFd, buf: &mut [u8]) -> Result<usize, nix::errno::Errno> {
    loop {
        match nix::sys::socket::recv(fd, buf, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// A running fork server (see the module), the engine's end of its socket.
pub(crate) struct InitForker {
    child: std::process::Child,
    sock: OwnedFd,
}

impl InitForker {
    /// Start `init` as a fork server and wait for its hello.
    pub fn start(init: &InitProgram) -> Result<Self, ForkerError> {
        let (mine, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| ForkerError::Start(io(e)))?;
        let fd = theirs.as_raw_fd();
        // The path as `execve` takes it (relative to the working directory), never looked up
        // in `PATH`, as for an exec'd init.
        let path = if init.path.as_os_str().as_encoded_bytes().contains(&b'/') {
            init.path.clone()
        } else {
            PathBuf::from(".").join(&init.path)
        };
        let mut cmd = std::process::Command::new(path);
        // argv[0] as an exec'd init's: the forked inits show it.
        cmd.arg0(&init.path)
            .args(&init.args)
            .arg(FORKER_ARG)
            .env_clear()
            .env("PATH", crate::spawn_init::init_path())
            // Stderr stays the engine's, where an init's first failures go; a forked init
            // moves its standard descriptors to /dev/null as an exec'd one does.
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // SAFETY: between fork and exec the closure only makes system calls (dup2, fcntl)
        // that take no lock and do not allocate.
        unsafe {
            cmd.pre_exec(move || {
                let target = crate::init::CONTROL_FD;
                let r = if fd == target {
                    libc::fcntl(fd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, target)
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(ForkerError::Start)?;
        drop(theirs);
        // Killed and reaped when dropped, on every error below too.
        let forker = Self { child, sock: mine };
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(
            &forker.sock,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        )
        .map_err(|e| ForkerError::Start(io(e)))?;
        let mut hello = [0u8; 16];
        let path = init.path.clone();
        match recv_again(forker.sock.as_raw_fd(), &mut hello) {
            Ok(n) if &hello[..n] == HELLO => {
                tracing::debug!(pid = forker.pid(), "init forker started");
                Ok(forker)
            }
            Ok(0) => Err(ForkerError::NoHello {
                path,
                said: "it exited without a word".into(),
            }),
            Ok(n) => Err(ForkerError::NotAForker {
                path,
                said: format!("it said {}", hello[..n].escape_ascii()),
            }),
            Err(nix::errno::Errno::EAGAIN) => Err(ForkerError::NoHello {
                path,
                said: format!("no word in {} s", ANSWER_TIMEOUT.as_secs()),
            }),
            Err(e) => Err(ForkerError::NoHello {
                path,
                said: format!("its hello could not be read: {e}"),
            }),
        }
    }

    /// The forker's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// A new init, forked with `sock` as its control socket and in `netns` when given: its
    /// pid, which is this process's child. The descriptors stay the caller's to close (init
    /// holds its own copies).
    pub fn fork(&mut self, sock: &OwnedFd, netns: Option<&OwnedFd>) -> Result<i32, ForkerError> {
        let mut fds = vec![sock.as_raw_fd()];
        let tag = match netns {
            Some(n) => {
                fds.push(n.as_raw_fd());
                b"n"
            }
            None => b"-",
        };
        let iov = [IoSlice::new(tag)];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        loop {
            match sendmsg::<()>(
                self.sock.as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(ForkerError::Gone(io(e))),
            }
        }
        let mut answer = [0u8; 4];
        match recv_again(self.sock.as_raw_fd(), &mut answer) {
            Ok(4) => {}
            Ok(_) => {
                return Err(ForkerError::NoAnswer(std::io::Error::from(
                    std::io::ErrorKind::UnexpectedEof,
                )))
            }
            Err(e) => return Err(ForkerError::NoAnswer(io(e))),
        }
        match i32::from_le_bytes(answer) {
            pid if pid > 0 => Ok(pid),
            e => Err(ForkerError::Clone(std::io::Error::from_raw_os_error(-e))),
        }
    }
}

impl Drop for InitForker {
    fn drop(&mut self) {
        // Our child, not yet reaped: its pid cannot have been reused.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The reserve thread's forker, started on first use and again after it failed (see the
/// module).
#[derive(Default)]
pub(crate) struct ForkerSlot {
    forker: Option<InitForker>,
    /// The init program did not act as a forker: spares are exec'd from then on.
    not_a_forker: bool,
    /// Starts in a row that got no hello.
    without_hello: u32,
}

/// Starts in a row without a hello after which the program is taken for one that is not a
/// forker (an older init waits for its plan instead, at every start).
const MAX_WITHOUT_HELLO: u32 = 3;

impl ForkerSlot {
    /// Start an init for a spare: forked by the forker when one runs or can be started, else
    /// exec'd (`spawn_init`). Returns its pid, this process's child either way.
    pub fn start_init(
        &mut self,
        init: &InitProgram,
        sock: OwnedFd,
        netns: Option<OwnedFd>,
    ) -> Result<i32, SandboxError> {
        if self.forker.is_none() && !self.not_a_forker {
            match InitForker::start(init) {
                Ok(f) => {
                    self.forker = Some(f);
                    self.without_hello = 0;
                }
                Err(e @ ForkerError::NotAForker { .. }) => {
                    tracing::warn!(error = %e, "spares are exec'd from now on");
                    self.not_a_forker = true;
                }
                Err(e @ ForkerError::NoHello { .. }) => {
                    self.without_hello += 1;
                    self.not_a_forker = self.without_hello >= MAX_WITHOUT_HELLO;
                    tracing::warn!(error = %e, in_a_row = self.without_hello, given_up = self.not_a_forker, "this spare is exec'd");
                }
                // Tried again at the next spare.
                Err(e) => {
                    tracing::debug!(error = %e, "init forker not started: this spare is exec'd")
                }
            }
        }
        let Some(forker) = self.forker.as_mut() else {
            return crate::spawn_init::spawn_init(init, sock, netns);
        };
        match forker.fork(&sock, netns.as_ref()) {
            Ok(pid) => Ok(pid),
            // Nothing was sent: the same descriptors go to an exec'd init.
            Err(e @ ForkerError::Gone(_)) => {
                tracing::debug!(error = %e, "this spare is exec'd");
                self.forker = None;
                crate::spawn_init::spawn_init(init, sock, netns)
            }
            // Nothing was cloned, as an exec'd init's clone would fail: the forker stays.
            Err(e @ ForkerError::Clone(_)) => Err(e.into()),
            // A child may hold the descriptors: no second init gets them. The forker is
            // killed first (no clone can follow), then any such child.
            Err(e) => {
                tracing::warn!(error = %e, "init forker replaced");
                self.forker = None;
                kill_children_holding(&sock);
                Err(e.into())
            }
        }
    }

    /// The running forker's pid.
    pub fn pid(&self) -> Option<i32> {
        self.forker.as_ref().map(InitForker::pid)
    }
}

/// Kill and reap every child of this process that is the init of a pid namespace of its own
/// and holds `sock` (an init the forker cloned but did not report), found by the socket's
/// inode among its descriptors (readable with the engine's CAP_SYS_PTRACE though init is not
/// dumpable). One that already exited holds nothing and is not found: a zombie until this
/// process exits, its socket and namespace never used again.
fn kill_children_holding(sock: &OwnedFd) {
    let Ok(st) = nix::sys::stat::fstat(sock.as_raw_fd()) else {
        return;
    };
    let want = format!("socket:[{}]", st.st_ino);
    let me = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        let child = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1).map(|p| p == me))
                .unwrap_or(false)
        });
        // `NSpid:` of a pid namespace's init, seen from ours: its pid here, then 1.
        let init_of_its_own = child
            && std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .is_some_and(|ids| {
                        ids.split_whitespace().collect::<Vec<_>>()
                            == [pid.to_string().as_str(), "1"]
                    })
            });
        if !init_of_its_own {
            continue;
        }
        let holds = std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten()
                .any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
        });
        if holds {
            // SAFETY: kill with integer arguments; our child, not yet reaped (a pid
            // namespace's init holding this spare's socket, which only the forker's clone
            // could be: no one else waits for it), so the pid is still its own.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            tracing::warn!(
                pid,
                "an init the forker did not report was killed and reaped"
            );
        }
    }
}

/// The forker's life: answer requests until its socket closes. Runs in the init program
/// started with [`FORKER_ARG`], single-threaded.
pub(crate) fn main_forker() -> ! {
    crate::spawn_init::close_above_control();
    // Only a packet socket on fd 3 is the engine's (`InitForker::start`).
    // SAFETY: fd 3 stays open for the whole check (and is closed by nothing else).
    let fd3 = unsafe { std::os::fd::BorrowedFd::borrow_raw(crate::init::CONTROL_FD) };
    let kind = nix::sys::socket::getsockopt(&fd3, nix::sys::socket::sockopt::SockType);
    if kind != Ok(SockType::SeqPacket) {
        eprintln!("envfactory-init --forker: fd 3 is not the engine's socket");
        std::process::exit(2);
    }
    // SAFETY: fd 3 is the engine's socket (checked above) and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(crate::init::CONTROL_FD) };
    // Not stopped or ended by the terminal the engine runs in (an init, PID 1 of its
    // namespace, ignores such signals too); each child sets every disposition back to its
    // default.
    for sig in [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGHUP,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut args = std::env::args_os();
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    let mut rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    // Our own last argument (`init/mod.rs` checks that one).
    rest.pop();
    let init = InitProgram { path, args: rest };
    let cmdline = crate::spawn_init::CommandLine::of(&init);
    if nix::sys::socket::send(sock.as_raw_fd(), HELLO, MsgFlags::MSG_NOSIGNAL).is_err() {
        std::process::exit(1);
    }
    loop {
        let (tag, fds) = match receive(sock.as_raw_fd()) {
            Ok(Some(r)) => r,
            // End of file: the engine is gone or done.
            Ok(None) => std::process::exit(0),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => std::process::exit(1),
        };
        let answer = match (tag, fds.as_slice()) {
            (b'-', [ctl]) => fork_one(&cmdline, ctl, None),
            (b'n', [ctl, net]) => fork_one(&cmdline, ctl, Some(net)),
            _ => -libc::EINVAL,
        };
        drop(fds);
        if nix::sys::socket::send(
            sock.as_raw_fd(),
            &answer.to_le_bytes(),
            MsgFlags::MSG_NOSIGNAL,
        )
        .is_err()
        {
            std::process::exit(1);
        }
    }
}

/// One request: its tag and descriptors, or `None` at end of file.
fn receive(sock: RawFd) -> Result<Option<(u8, Vec<OwnedFd>)>, nix::errno::Errno> {
    let mut tag = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut tag)];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(got) = c {
            // SAFETY: descriptors the kernel just installed in this process for us.
            fds.extend(
                got.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let n = msg.bytes;
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((if n == 1 { tag[0] } else { 0 }, fds)))
}

/// Fork one init with `CLONE_PARENT` (the engine's child): its pid, or minus the errno.
fn fork_one(cmdline: &crate::spawn_init::CommandLine, ctl: &OwnedFd, net: Option<&OwnedFd>) -> i32 {
    // SAFETY: the forker has a single thread (its main, which never starts another).
    let forked = unsafe {
        crate::spawn_init::fork_into_namespaces(
            cmdline,
            ctl.as_raw_fd(),
            net.map(|n| n.as_raw_fd()),
            libc::CLONE_PARENT,
        )
    };
    match forked {
        Ok(pid) => pid,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    }
}
