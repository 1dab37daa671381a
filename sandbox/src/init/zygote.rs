//! The zygote: a process confined once (chroot, limits, landlock, capabilities, seccomp) that
//! forks every command of the episode.
//!
//! Installing the seccomp filter costs about a millisecond (the kernel translates it and
//! precomputes its per-syscall cache); paid once per root instead of once per command, a step
//! costs little more than the host's own fork and exec. Commands are cloned with
//! `CLONE_PARENT`, so they are children of init, which reaps them and sees their status as
//! before. The zygote is an ordinary, non-dumpable process of the sandbox with exactly the
//! privileges of a command: an agent that kills it only makes init start a new one. It dies
//! with every reset and rollback, and the next command starts it over the new root.

use super::Init;
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

    /// Start a zygote over the current root without waiting for it: it confines itself while
    /// init answers the host, so the next command finds it ready. Called after every (re)mount.
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
        match confined {
            Ok(()) => report(&mut sock, 0, 0),
            Err((stage, errno)) => {
                report(&mut sock, stage as u8, errno);
                return 1;
            }
        }
        loop {
            match serve_one(&mut sock) {
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
/// clone the command as init's child, and answer with its pid (or -errno).
fn serve_one(sock: &mut UnixStream) -> Result<(), ()> {
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
    let (reply, go) = match (rmp_serde::from_slice::<Spawn>(&body), fds.len()) {
        (Ok(spawn), 4) => spawn_command(&spawn, &fds),
        _ => (-libc::EINVAL, None),
    };
    drop(fds);
    let sent = sock.write_all(&reply.to_le_bytes());
    // Only now may the command run: had it run first, it could kill this zygote (`kill -9 -1`)
    // before init learnt its pid, and init would start it a second time.
    if let Some(go) = go {
        if sent.is_ok() {
            let _ = nix::unistd::write(&go, &[1]);
        }
    }
    sent.map_err(|_| ())
}

/// Clone the command (as a sibling: its parent is init) and exec it there once the zygote
/// writes to the returned "go" pipe (after init has the pid); without that byte the command
/// exits 127 unrun.
fn spawn_command(spawn: &Spawn, fds: &[OwnedFd]) -> (i32, Option<OwnedFd>) {
    let cstr = |v: &[String]| -> Option<Vec<CString>> {
        v.iter().map(|s| CString::new(s.as_bytes()).ok()).collect()
    };
    let (Some(argv), Some(env), Ok(cwd)) = (
        cstr(&spawn.argv),
        cstr(&spawn.env),
        CString::new(spawn.cwd.as_bytes()),
    ) else {
        return (-libc::EINVAL, None);
    };
    let Some(arg0) = spawn.argv.first() else {
        return (-libc::EINVAL, None);
    };
    let programs = candidates(arg0, &spawn.env);
    let Ok((go_r, go_w)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return (-errno(), None);
    };
    // SAFETY: a fork-like clone in a single-threaded process; the child execs or _exits.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return (-errno(), None);
    }
    if pid > 0 {
        drop(go_r);
        return (pid as i32, Some(go_w));
    }
    // The command: wait for the go (EOF means the zygote died before init had our pid).
    drop(go_w);
    let mut go = [0u8; 1];
    let got = loop {
        // SAFETY: reading one byte into a stack buffer from our own pipe.
        let n = unsafe { libc::read(go_r.as_raw_fd(), go.as_mut_ptr().cast(), 1) };
        if n >= 0 || errno() != libc::EINTR {
            break n;
        }
    };
    if got != 1 {
        // SAFETY: leaving the child without unwinding.
        unsafe { libc::_exit(127) }
    }
    drop(go_r);
    let status = fds[3].as_raw_fd();
    let fail = |stage: Stage, e: i32| -> ! {
        let msg = [stage as u8, (e & 0xff) as u8, ((e >> 8) & 0xff) as u8];
        // SAFETY: writing a stack buffer to our own pipe, then exiting without unwinding.
        unsafe {
            libc::write(status, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    };
    // SAFETY: (whole block) plain syscalls on descriptors and strings we own.
    unsafe {
        libc::setsid();
        libc::dup2(fds[0].as_raw_fd(), 0);
        libc::dup2(fds[1].as_raw_fd(), 1);
        libc::dup2(fds[2].as_raw_fd(), 2);
        // Everything else closes on exec (the status pipe reports exec failure only).
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if let Some((uid, gid)) = spawn.user {
            // Groups first, then the gid, then the uid (after which none can change): leaving
            // uid 0 clears the permitted, effective and ambient capabilities.
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
                // The inheritable set survives a uid change: empty it too, so no file with
                // inheritable capabilities can hand any back.
                || crate::caps::capset([0, 0]) != 0
            {
                fail(Stage::User, errno());
            }
        }
        if libc::chdir(cwd.as_ptr()) != 0 {
            fail(Stage::Chdir, errno());
        }
    }
    let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let e = ptrs(&env);
    if let Some(cmd) = &spawn.shell {
        // Without the shell: dash's environment (its order, its PWD), dash's PATH search;
        // anything that does not exec goes to the shell itself (statuses, messages, ENOEXEC).
        let direct = super::direct::dash_pwd(&spawn.env)
            .and_then(|pwd| cstr(&super::direct::dash_environment(&spawn.env, &pwd)));
        if let Some(denv) = direct {
            let (a, de) = (ptrs(&argv), ptrs(&denv));
            for prog in &programs {
                // SAFETY: NUL-terminated arrays of valid C strings that live across the call.
                unsafe { libc::execve(prog.as_ptr(), a.as_ptr(), de.as_ptr()) };
                if !matches!(errno(), libc::ENOENT | libc::ENOTDIR) {
                    break;
                }
            }
        }
        let Ok(c) = CString::new(cmd.as_bytes()) else {
            fail(Stage::Exec, libc::EINVAL)
        };
        let sh = [c"/bin/sh".to_owned(), c"-c".to_owned(), c];
        let a = ptrs(&sh);
        // One byte on the status pipe: the shell runs this command after all (init then
        // reports its result as it is).
        // SAFETY: writing a stack byte to our own pipe, then execve as above.
        unsafe {
            libc::write(status, [SHELL_AFTER_ALL].as_ptr().cast(), 1);
            libc::execve(c"/bin/sh".as_ptr(), a.as_ptr(), e.as_ptr());
        }
        fail(Stage::Exec, errno())
    }
    let a = ptrs(&argv);
    let mut last = libc::ENOENT;
    for prog in &programs {
        // SAFETY: NUL-terminated arrays of valid C strings that live across the call.
        unsafe { libc::execve(prog.as_ptr(), a.as_ptr(), e.as_ptr()) };
        last = errno();
        if last != libc::ENOENT && last != libc::ENOTDIR {
            break;
        }
    }
    fail(Stage::Exec, last)
}

/// Program paths to try, as `execvp` would, from the command's own `PATH`.
fn candidates(arg0: &str, env: &[String]) -> Vec<CString> {
    if arg0.contains('/') {
        return CString::new(arg0).into_iter().collect();
    }
    let path = env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .map(|d| if d.is_empty() { "." } else { d })
        .filter_map(|d| CString::new(format!("{d}/{arg0}")).ok())
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_candidates_follow_path() {
        let env = vec!["PATH=/a::/b".to_string()];
        let c: Vec<String> = candidates("ls", &env)
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect();
        assert_eq!(c, vec!["/a/ls", "./ls", "/b/ls"]);
        assert_eq!(candidates("/bin/x", &env).len(), 1);
    }
}
