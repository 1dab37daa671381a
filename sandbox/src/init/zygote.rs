//! The zygote: a process confined once (chroot, limits, landlock, capabilities, seccomp) that
//! starts every command of the episode (`spawn.rs`).
//!
//! Installing the seccomp filter costs about a millisecond (the kernel translates it and
//! precomputes its per-syscall cache); paid once per root instead of once per command, a step
//! costs little more than the host's own spawn and exec. Commands are cloned with
//! `CLONE_PARENT`, so they are children of init, which reaps them and sees their status as
//! before. The zygote is an ordinary, non-dumpable process of the sandbox with exactly the
//! privileges of a command: an agent that kills it only makes init start a new one. It dies
//! with every reset and rollback; init starts the next one over the new root once it has
//! answered (the next command starts one if that fork failed).

use super::{spawn, Init};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Where a command failed before `execve`, reported through its status pipe.
#[derive(Clone, Copy)]
#[repr(u8)]
pub(super) enum Stage {
    Chroot = 1,
    Chdir,
    Landlock,
    Caps,
    Seccomp,
    Exec,
    UserNs,
    User,
}

impl Stage {
    pub(super) fn name(b: u8) -> &'static str {
        match b {
            1 => "chroot",
            2 => "changing to the working directory",
            3 => "landlock",
            4 => "dropping capabilities",
            5 => "seccomp",
            7 => "entering the user namespace",
            8 => "switching to the requested user",
            _ => "execve",
        }
    }
}

/// What the zygote needs to start one command.
#[derive(serde::Deserialize)]
struct Spawn {
    argv: Vec<String>,
    env: Vec<String>,
    cwd: String,
    user: Option<(u32, u32)>,
    /// Set when `argv` are the words of this shell command (`direct.rs`): the environment is
    /// made dash's, and a failed exec runs `/bin/sh -c` with it instead.
    shell: Option<String>,
}

/// The same, borrowed, as init encodes it (same fields in the same order).
#[derive(serde::Serialize)]
struct SpawnRef<'a> {
    argv: &'a [String],
    env: &'a [String],
    cwd: &'a str,
    user: Option<(u32, u32)>,
    shell: Option<&'a str>,
}

/// Init's handle on the zygote.
pub(crate) struct Zygote {
    sock: UnixStream,
    pub pid: i32,
    /// Whether its readiness report has been read.
    ready: bool,
}

fn errno() -> i32 {
    nix::errno::Errno::last_raw()
}

impl Init {
    /// The live, ready zygote, started over the current root if there is none.
    pub(super) fn zygote(&mut self) -> Result<&mut Zygote, String> {
        if self.zygote.is_none() {
            self.zygote = Some(self.start_zygote()?);
        }
        let z = self
            .zygote
            .as_mut()
            .ok_or_else(|| "no zygote".to_string())?;
        if !z.ready {
            z.wait_ready()?;
        }
        Ok(z)
    }

    /// Kill the zygote (dead or alive: it failed us) and forget it; the next command starts a
    /// new one. Its pid is still its own (an unreaped zombie at worst) until init reaps it:
    /// here when `reap`, else with the command that is running now (whose status a reap
    /// here could take).
    pub(super) fn replace_zygote(&mut self, reap: bool) {
        if let Some(z) = self.zygote.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(z.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if reap {
            self.reap(None);
        }
    }

    /// Start a zygote over the current root without waiting for it: it confines itself while
    /// init goes on (at setup, while init mounts the side trees and answers; after a remount,
    /// while the host reads the answer), so the next command finds it ready.
    pub(super) fn prestart_zygote(&mut self) {
        match self.start_zygote() {
            Ok(z) => self.zygote = Some(z),
            Err(e) => tracing::debug!(error = %e, "zygote not prestarted"),
        }
    }

    fn start_zygote(&mut self) -> Result<Zygote, String> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
        let root = CString::new(self.layout.root().to_string_lossy().as_bytes())
            .map_err(|_| "root path contains a NUL byte".to_string())?;
        // SAFETY: init is single-threaded, so the child may run ordinary code after fork.
        match unsafe { nix::unistd::fork() } {
            Err(e) => Err(format!("fork: {e}")),
            Ok(nix::unistd::ForkResult::Child) => {
                drop(ours);
                let code = self.zygote_main(theirs, &root);
                // SAFETY: leaving the child without unwinding or running init's destructors.
                unsafe { libc::_exit(code) }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                drop(theirs);
                let mut z = Zygote {
                    sock: ours,
                    pid: child.as_raw(),
                    ready: false,
                };
                if let Some(map) = self.plan.userns {
                    z.map_user_namespace(map, &self.layout.proc())?;
                }
                Ok(z)
            }
        }
    }

    /// In the zygote: confine, report readiness, then serve spawn requests until init goes.
    fn zygote_main(&mut self, mut sock: UnixStream, root: &CString) -> i32 {
        let report = |sock: &mut UnixStream, stage: u8, errno: i32| {
            let e = errno.to_le_bytes();
            let _ = sock.write_all(&[stage, e[0], e[1], e[2], e[3]]);
        };
        let confined = self.confine(root, &mut sock);
        // Keep nothing of init's but our socket: not its control socket, not the pipes of the
        // command being started (their write ends must close when the command's do).
        let keep = sock.as_raw_fd() as u32;
        // SAFETY: closing descriptor ranges of this process; `keep` and stdio (/dev/null, so
        // that received descriptors are never 0-2) stay open.
        unsafe {
            if keep > 3 {
                libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
            }
            libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
        }
        // The commands' stack (`spawn.rs`), made once: each runs on it until its `execve`.
        let stack = confined.and_then(|()| spawn::Stack::new().map_err(|e| (Stage::Exec, e)));
        let stack = match stack {
            Ok(stack) => {
                report(&mut sock, 0, 0);
                stack
            }
            Err((stage, errno)) => {
                report(&mut sock, stage as u8, errno);
                return 1;
            }
        };
        loop {
            match serve_one(&mut sock, &stack) {
                Ok(()) => {}
                Err(()) => return 0,
            }
        }
    }

    /// Everything a command inherits: own session, signals reset, chroot, limits, OOM score,
    /// landlock, capabilities, no_new_privs and seccomp, in that order.
    fn confine(&mut self, root: &CString, sock: &mut UnixStream) -> Result<(), (Stage, i32)> {
        // The OOM killer picks commands before init (raising the score needs no privilege).
        let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
        // SAFETY: (whole block) plain syscalls on values we own, in the single-threaded zygote.
        unsafe {
            libc::setsid();
            libc::prctl(libc::PR_SET_NAME, c"sandbox-zygote".as_ptr(), 0, 0, 0);
            libc::sigprocmask(libc::SIG_SETMASK, &std::mem::zeroed(), std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let nofile = libc::rlimit {
                rlim_cur: self.plan.nofile,
                rlim_max: self.plan.nofile,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &nofile);
            let core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &core);
            if self.plan.userns.is_some() {
                // Before chroot: the kernel refuses a new user namespace to a chrooted process.
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err((Stage::UserNs, errno()));
                }
                // Ask init to write our uid and gid maps, and wait until it has.
                let mut ack = [0u8; 1];
                if sock.write_all(&[MAP_ME]).is_err() || sock.read_exact(&mut ack).is_err() {
                    return Err((Stage::UserNs, libc::EPIPE));
                }
                if libc::setresgid(0, 0, 0) != 0 || libc::setresuid(0, 0, 0) != 0 {
                    return Err((Stage::UserNs, errno()));
                }
            }
            // After any credential change, which resets it.
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            if libc::chroot(root.as_ptr()) != 0 {
                return Err((Stage::Chroot, errno()));
            }
            if libc::chdir(c"/".as_ptr()) != 0 {
                return Err((Stage::Chdir, errno()));
            }
        }
        if let Some(ll) = self.landlock.take() {
            ll.enforce().map_err(|_| (Stage::Landlock, errno()))?;
        }
        crate::caps::drop_to(&self.plan.keep_caps, self.last_cap)
            .map_err(|_| (Stage::Caps, errno()))?;
        if let Some(sc) = &self.seccomp {
            sc.apply().map_err(|_| (Stage::Seccomp, errno()))?;
        } else {
            // SAFETY: prctl with integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        }
        Ok(())
    }
}

/// Receive one spawn request with its four descriptors (stdin, stdout, stderr, status pipe),
/// start the command as init's child ([`spawn`]), and answer with its pid (or -errno).
fn serve_one(sock: &mut UnixStream, stack: &spawn::Stack) -> Result<(), ()> {
    let mut len = [0u8; 4];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let (fds, got) = {
        let mut iov = [IoSliceMut::new(&mut len)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|_| ())?;
        if msg.bytes == 0 {
            return Err(());
        }
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg.cmsgs().map_err(|_| ())? {
            if let ControlMessageOwned::ScmRights(v) = c {
                // SAFETY: the kernel just installed these descriptors for us.
                fds.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        (fds, msg.bytes)
    };
    if got < 4 {
        sock.read_exact(&mut len[got..]).map_err(|_| ())?;
    }
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    sock.read_exact(&mut body).map_err(|_| ())?;
    let reply = match (rmp_serde::from_slice::<Spawn>(&body), fds.len()) {
        (Ok(spawn), 4) => start_command(&spawn, &fds, stack),
        _ => -libc::EINVAL,
    };
    // The command has exec'd (or exited) by now: our copies of its descriptors go.
    drop(fds);
    sock.write_all(&reply.to_le_bytes()).map_err(|_| ())
}

/// Build everything the child reads (it may not allocate), then start it; its pid or -errno.
fn start_command(spawn: &Spawn, fds: &[OwnedFd], stack: &spawn::Stack) -> i32 {
    let cstr = |v: &[String]| -> Option<Vec<CString>> {
        v.iter().map(|s| CString::new(s.as_bytes()).ok()).collect()
    };
    let (Some(argv), Some(env), Ok(cwd)) = (
        cstr(&spawn.argv),
        cstr(&spawn.env),
        CString::new(spawn.cwd.as_bytes()),
    ) else {
        return -libc::EINVAL;
    };
    let Some(arg0) = spawn.argv.first() else {
        return -libc::EINVAL;
    };
    let programs = spawn::candidates(arg0, &spawn.env);
    // A shell command run as its words: dash's environment for them, and the shell's argv for
    // when they cannot be exec'd.
    // `PWD` is judged from the command's working directory: the zygote goes there for the
    // question (the child goes there again itself, as its own user) and comes back to `/`.
    let direct_env = spawn.shell.as_ref().and_then(|_| {
        // SAFETY: chdir with a valid C string; the zygote is single-threaded.
        if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
            return None;
        }
        let pwd = super::direct::dash_pwd(&spawn.env);
        // SAFETY: as above.
        unsafe { libc::chdir(c"/".as_ptr()) };
        pwd.and_then(|pwd| cstr(&super::direct::dash_environment(&spawn.env, &pwd)))
    });
    let shell_argv = match &spawn.shell {
        Some(cmd) => match CString::new(cmd.as_bytes()) {
            Ok(c) => Some(vec![c"/bin/sh".to_owned(), c"-c".to_owned(), c]),
            Err(_) => return -libc::EINVAL,
        },
        None => None,
    };
    let (a, e) = (spawn::pointers(&argv), spawn::pointers(&env));
    let de = direct_env.as_deref().map(spawn::pointers);
    let sh = shell_argv.as_deref().map(spawn::pointers);
    let plan = spawn::Plan {
        fds: [
            fds[0].as_raw_fd(),
            fds[1].as_raw_fd(),
            fds[2].as_raw_fd(),
            fds[3].as_raw_fd(),
        ],
        user: spawn.user,
        cwd: &cwd,
        programs: &programs,
        argv: &a,
        env: &e,
        shell: sh.as_deref().map(|sh| (de.as_deref(), sh)),
    };
    spawn::spawn(&plan, stack)
}

/// Written alone on a command's status pipe when a command meant to run without the shell
/// execs `/bin/sh -c` after all.
pub(super) const SHELL_AFTER_ALL: u8 = 0xfe;

/// The zygote's request to have its user namespace mapped.
const MAP_ME: u8 = 0xff;

impl Zygote {
    /// Write the zygote's uid and gid maps (root inside is `base` outside) once it has entered
    /// its user namespace.
    /// `proc` is the sandbox's own /proc (pids are those of its pid namespace).
    fn map_user_namespace(
        &mut self,
        (base, count): (u32, u32),
        proc: &std::path::Path,
    ) -> Result<(), String> {
        let mut first = [0u8; 1];
        self.sock
            .read_exact(&mut first)
            .map_err(|e| format!("the zygote died before its user namespace: {e}"))?;
        if first[0] != MAP_ME {
            let mut rest = [0u8; 4];
            let _ = self.sock.read_exact(&mut rest);
            return Err(format!(
                "confining commands: {} failed: {}",
                Stage::name(first[0]),
                nix::errno::Errno::from_raw(i32::from_le_bytes(rest)).desc()
            ));
        }
        let map = format!("0 {base} {count}\n");
        for file in ["uid_map", "gid_map"] {
            std::fs::write(proc.join(self.pid.to_string()).join(file), &map)
                .map_err(|e| format!("writing the zygote's {file}: {e}"))?;
        }
        self.sock
            .write_all(&[1])
            .map_err(|e| format!("the zygote is gone: {e}"))
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let mut ready = [0u8; 5];
        self.sock
            .read_exact(&mut ready)
            .map_err(|e| format!("the zygote died during setup: {e}"))?;
        if ready[0] != 0 {
            let errno = i32::from_le_bytes([ready[1], ready[2], ready[3], ready[4]]);
            return Err(format!(
                "confining commands: {} failed: {}",
                Stage::name(ready[0]),
                nix::errno::Errno::from_raw(errno).desc()
            ));
        }
        self.ready = true;
        Ok(())
    }

    /// Ask for one command; returns its pid.
    pub(super) fn spawn(
        &mut self,
        argv: &[String],
        env: &[String],
        cwd: &str,
        user: Option<(u32, u32)>,
        shell: Option<&str>,
        fds: [&OwnedFd; 4],
    ) -> Result<i32, String> {
        let body = rmp_serde::to_vec(&SpawnRef {
            argv,
            env,
            cwd,
            user,
            shell,
        })
        .map_err(|e| format!("encoding the command: {e}"))?;
        let len = (body.len() as u32).to_le_bytes();
        let raw = fds.map(|f| f.as_raw_fd());
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let iov = [IoSlice::new(&len)];
        sendmsg::<()>(self.sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .map_err(|e| format!("the zygote is gone: {e}"))?;
        self.sock
            .write_all(&body)
            .map_err(|e| format!("the zygote is gone: {e}"))?;
        let mut reply = [0u8; 4];
        self.sock
            .read_exact(&mut reply)
            .map_err(|e| format!("the zygote is gone: {e}"))?;
        let pid = i32::from_le_bytes(reply);
        if pid <= 0 {
            return Err(format!(
                "clone failed: {}",
                nix::errno::Errno::from_raw(-pid).desc()
            ));
        }
        Ok(pid)
    }
}
