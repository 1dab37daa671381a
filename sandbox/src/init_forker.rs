//! The init reserve's fork server: spare inits forked, not exec'd.
//!
//! An exec'd init pays, before it reads its first request, for loading its program: the
//! dynamic loader, the C library's start (on a virtual machine every `cpuid` of it traps) and
//! the Rust runtime's start, about 0.8 ms of CPU on the development VM, and it pays it for
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
//!   stack-overflow handler, which an exec'd init installs too), the forker's signal mask
//!   (empty, as the reserve thread's), `PATH` as its whole environment, the command line of
//!   an exec'd init (without `--forker`), not dumpable from its first instruction; its mount
//!   namespace a copy of the engine's at the clone (the forker shares the engine's), the
//!   network namespace made ahead entered before anything else when the reserve has one, else
//!   its own made as a one-shot's forked init makes it.
//! - **Protocol**: a `SOCK_SEQPACKET` pair. The forker first says `forker 1`; a program that
//!   does not (an older init named by `ENVFACTORY_INIT`) is never used as one. Each request is
//!   one byte (`n`: a network namespace follows, `-`: none) with the control socket (and the
//!   namespace) as `SCM_RIGHTS`; the answer is the child's pid, or minus an errno, as 4 bytes
//!   little-endian.
//! - **Failures**: a forker that does not answer (killed, gone, a wrong program) is killed and
//!   reaped, and that spare is exec'd as before; the next spare starts a new forker, up to
//!   [`MAX_FAILURES`] failures in a row, after which the reserve only execs. The forker exits
//!   when its socket reaches end of file (the engine gone); the reserve kills and reaps it when
//!   it stops.
//!
//! What differs from an exec'd init: the inits forked from one forker share its address space
//! layout (one `execve`'s randomization, as the zygote's commands share init's until they
//! exec), where exec'd inits each get their own. No isolation or limit changes: the same
//! namespaces, cgroups, credentials, capabilities, confinement and plan.

use crate::error::SandboxError;
use crate::runtime::InitProgram;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

/// The argument that makes the init program a fork server.
pub(crate) const FORKER_ARG: &str = "--forker";

/// What a forker says first.
const HELLO: &[u8] = b"forker 1";

/// Failures in a row after which the reserve stops starting forkers (and execs its spares).
pub(crate) const MAX_FAILURES: u32 = 3;

/// How long the engine waits for a forker's word (its hello, an answer).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn spawn_error(what: &'static str) -> impl FnOnce(std::io::Error) -> SandboxError {
    move |source| SandboxError::Spawn { what, source }
}

fn errno_error(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> SandboxError {
    move |e| SandboxError::Spawn {
        what,
        source: std::io::Error::from_raw_os_error(e as i32),
    }
}

/// A running fork server (see the module), the engine's end of its socket.
pub(crate) struct InitForker {
    child: std::process::Child,
    sock: OwnedFd,
}

impl InitForker {
    /// Start `init` as a fork server and wait for its hello.
    pub fn start(init: &InitProgram) -> Result<Self, SandboxError> {
        let (mine, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(errno_error("socketpair for the init forker"))?;
        let fd = theirs.as_raw_fd();
        let mut cmd = std::process::Command::new(&init.path);
        cmd.args(&init.args)
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
        let child = cmd
            .spawn()
            .map_err(spawn_error("starting the init forker"))?;
        drop(theirs);
        let forker = Self { child, sock: mine };
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        nix::sys::socket::setsockopt(
            &forker.sock,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        )
        .map_err(errno_error("setting the init forker's timeout"))?;
        let mut hello = [0u8; 16];
        let n = nix::sys::socket::recv(forker.sock.as_raw_fd(), &mut hello, MsgFlags::empty())
            .map_err(errno_error("reading the init forker's hello"))?;
        if &hello[..n] != HELLO {
            return Err(SandboxError::InitProgram {
                path: init.path.clone(),
                reason: format!("not an init forker (it said {:?})", &hello[..n]),
            });
        }
        tracing::debug!(pid = forker.pid(), "init forker started");
        Ok(forker)
    }

    /// The forker's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// A new init, forked with `sock` as its control socket and in `netns` when given: its
    /// pid, which is this process's child. The descriptors stay the caller's to close (init
    /// holds its own copies).
    pub fn fork(&mut self, sock: &OwnedFd, netns: Option<&OwnedFd>) -> Result<i32, SandboxError> {
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
        sendmsg::<()>(
            self.sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(errno_error("asking the init forker"))?;
        let mut answer = [0u8; 4];
        let n = nix::sys::socket::recv(self.sock.as_raw_fd(), &mut answer, MsgFlags::empty())
            .map_err(errno_error("reading the init forker's answer"))?;
        if n != 4 {
            return Err(SandboxError::Spawn {
                what: "reading the init forker's answer",
                source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            });
        }
        match i32::from_le_bytes(answer) {
            pid if pid > 0 => Ok(pid),
            e => Err(SandboxError::Spawn {
                what: "clone into new namespaces (init forker)",
                source: std::io::Error::from_raw_os_error(-e),
            }),
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

/// The reserve thread's forker, started on first use and replaced after a failure (see the
/// module).
#[derive(Default)]
pub(crate) struct ForkerSlot {
    forker: Option<InitForker>,
    failures: u32,
}

impl ForkerSlot {
    /// Start an init for a spare: forked by the forker when one runs or can be started, else
    /// exec'd (`spawn_init`). Returns its pid, this process's child either way.
    pub fn start_init(
        &mut self,
        init: &InitProgram,
        sock: OwnedFd,
        netns: Option<OwnedFd>,
    ) -> Result<i32, SandboxError> {
        if self.forker.is_none() && self.failures < MAX_FAILURES {
            match InitForker::start(init) {
                Ok(f) => self.forker = Some(f),
                Err(e) => {
                    self.failures += 1;
                    tracing::debug!(error = %e, failures = self.failures, "init forker not started: spares are exec'd");
                }
            }
        }
        if let Some(f) = self.forker.as_mut() {
            match f.fork(&sock, netns.as_ref()) {
                Ok(pid) => {
                    self.failures = 0;
                    return Ok(pid);
                }
                Err(e) => {
                    self.failures += 1;
                    tracing::debug!(error = %e, failures = self.failures, "init forker failed: this spare is exec'd");
                    self.forker = None;
                }
            }
        }
        crate::spawn_init::spawn_init(init, sock, netns)
    }

    /// The running forker's pid.
    pub fn pid(&self) -> Option<i32> {
        self.forker.as_ref().map(InitForker::pid)
    }
}

/// The forker's life: answer requests until its socket closes. Runs in the init program
/// started with [`FORKER_ARG`], single-threaded.
pub(crate) fn main_forker() -> ! {
    crate::spawn_init::close_above_control();
    // SAFETY: the engine passes the forker's socket on fd 3 and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(crate::init::CONTROL_FD) };
    let mut args = std::env::args_os();
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    let init = InitProgram {
        path,
        args: args
            .filter(|a| a != FORKER_ARG)
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    };
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
    match crate::spawn_init::fork_into_namespaces(
        cmdline,
        ctl.as_raw_fd(),
        net.map(|n| n.as_raw_fd()),
        libc::CLONE_PARENT,
    ) {
        Ok(pid) => pid,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    }
}
