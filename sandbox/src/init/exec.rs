//! Running one command: fork, confine, exec, collect output under a cap, enforce the timeout.

use super::Init;
use crate::protocol::{Command, ExecRequest, ExecResult, FailureKind, Response, Termination};
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::wait::WaitStatus;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Where the child failed before `execve`, reported through the error pipe.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Stage {
    Chroot = 1,
    Chdir,
    Landlock,
    Caps,
    Seccomp,
    Exec,
}

impl Stage {
    fn name(b: u8) -> &'static str {
        match b {
            1 => "chroot",
            2 => "changing to the working directory",
            3 => "landlock",
            4 => "dropping capabilities",
            5 => "seccomp",
            _ => "execve",
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), nix::errno::Errno> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC)
}

fn cstrings(v: &[String], what: &str) -> Result<Vec<CString>, String> {
    v.iter()
        .map(|s| CString::new(s.as_bytes()).map_err(|_| format!("{what} {s:?} contains a NUL byte")))
        .collect()
}

impl Init {
    pub(super) fn exec(&mut self, req: &ExecRequest) -> Response {
        let invalid = |message: String| Response::Failed {
            kind: FailureKind::Invalid,
            message,
        };
        if !req.cwd.starts_with('/') {
            return invalid(format!("working directory {:?} is not absolute", req.cwd));
        }
        let argv: Vec<String> = match &req.command {
            Command::Argv(a) if a.is_empty() => return invalid("empty argv".into()),
            Command::Argv(a) => a.clone(),
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        };
        let env = req.env.as_ref().unwrap_or(&self.plan.env);
        let (c_argv, c_env) = match (cstrings(&argv, "argument"), cstrings(env, "variable")) {
            (Ok(a), Ok(e)) => (a, e),
            (Err(m), _) | (_, Err(m)) => return invalid(m),
        };
        let Ok(c_cwd) = CString::new(req.cwd.as_bytes()) else {
            return invalid("working directory contains a NUL byte".into());
        };
        // Candidate program paths (inside the root): PATH search as execvp does.
        let programs = candidates(&argv[0], env);

        let pipes = (|| Ok::<_, nix::errno::Errno>((pipe()?, pipe()?, pipe()?, pipe()?)))();
        let Ok(((in_r, in_w), (out_r, out_w), (err_r, err_w), (st_r, st_w))) = pipes else {
            return internal("creating pipes".into());
        };
        let root = self.layout.root();
        let Ok(c_root) = CString::new(root.to_string_lossy().as_bytes()) else {
            return internal("root path contains a NUL byte".into());
        };
        let started = Instant::now();
        // SAFETY: init is single-threaded, so the child may run ordinary code after fork.
        let pid = match unsafe { nix::unistd::fork() } {
            Err(e) => return internal(format!("fork: {e}")),
            Ok(nix::unistd::ForkResult::Child) => {
                let stage = self.child_setup(&in_r, &out_w, &err_w, &c_root, &c_cwd);
                let (stage, errno) = match stage {
                    Err(se) => se,
                    Ok(()) => {
                        let mut errno = libc::ENOENT;
                        for prog in &programs {
                            // SAFETY: all pointers are valid NUL-terminated arrays built above.
                            errno = unsafe { execve(prog, &c_argv, &c_env) };
                            if errno != libc::ENOENT && errno != libc::ENOTDIR {
                                break;
                            }
                        }
                        (Stage::Exec, errno)
                    }
                };
                let msg = [stage as u8, (errno & 0xff) as u8, ((errno >> 8) & 0xff) as u8];
                // SAFETY: writing a stack buffer to our own pipe, then exiting without unwinding.
                unsafe {
                    libc::write(st_w.as_raw_fd(), msg.as_ptr().cast(), msg.len());
                    libc::_exit(127)
                }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => child.as_raw(),
        };
        drop((in_r, out_w, err_w, st_w));
        let mut st = [0u8; 3];
        let mut status_pipe = std::fs::File::from(st_r);
        let n = read_full(&mut status_pipe, &mut st);
        if n == 3 {
            // The command never started: reap it and say why.
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            self.reap(None);
            let errno = i32::from(st[1]) | (i32::from(st[2]) << 8);
            let kind = match errno {
                libc::ENOENT | libc::ENOTDIR => FailureKind::NotFound,
                libc::EACCES | libc::EPERM => FailureKind::Denied,
                _ => FailureKind::Spawn,
            };
            return Response::Failed {
                kind,
                message: format!(
                    "cannot run {:?}: {} failed: {}",
                    argv[0],
                    Stage::name(st[0]),
                    nix::errno::Errno::from_raw(errno).desc()
                ),
            };
        }
        let result = self.collect(pid, req, started, in_w, out_r, err_r);
        Response::Exec(Box::new(result))
    }

    /// In the forked child: stdio, session, chroot, cwd, limits, landlock, caps, seccomp.
    fn child_setup(
        &mut self,
        stdin: &OwnedFd,
        stdout: &OwnedFd,
        stderr: &OwnedFd,
        root: &CString,
        cwd: &CString,
    ) -> Result<(), (Stage, i32)> {
        let errno = || nix::errno::Errno::last_raw();
        // SAFETY (whole block): plain syscalls on descriptors and C strings we own, in a
        // single-threaded child that will exec or _exit.
        unsafe {
            libc::setsid();
            libc::dup2(stdin.as_raw_fd(), 0);
            libc::dup2(stdout.as_raw_fd(), 1);
            libc::dup2(stderr.as_raw_fd(), 2);
            // Everything else closes on exec (the status pipe reports exec failure only).
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
            libc::sigprocmask(libc::SIG_SETMASK, &std::mem::zeroed(), std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if libc::chroot(root.as_ptr()) != 0 {
                return Err((Stage::Chroot, errno()));
            }
            if libc::chdir(cwd.as_ptr()) != 0 {
                return Err((Stage::Chdir, errno()));
            }
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
        }
        // The OOM killer picks commands before init (raising the score needs no privilege).
        let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
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

    /// Feed stdin, read both streams under the cap, wait for the command or its deadline.
    fn collect(
        &mut self,
        pid: i32,
        req: &ExecRequest,
        started: Instant,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> ExecResult {
        for fd in [&stdin, &stdout, &stderr] {
            let _ = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        }
        let deadline = started + Duration::from_millis(req.timeout_ms.max(1));
        let cap = req.output_cap as usize;
        let mut out = Capture::new(cap);
        let mut err = Capture::new(cap);
        let mut stdin = (!req.stdin.is_empty()).then_some(stdin);
        let mut written = 0usize;
        let mut status: Option<WaitStatus> = None;
        let mut timed_out = false;
        let mut out_open = true;
        let mut err_open = true;
        let mut buf = vec![0u8; 64 << 10];
        while status.is_none() {
            let now = Instant::now();
            if now >= deadline && !timed_out {
                timed_out = true;
                kill_session(pid, &self.layout.proc());
            }
            let wait_ms = if timed_out {
                100
            } else {
                (deadline - now).as_millis().min(60_000) as u16
            };
            let mut fds = Vec::with_capacity(4);
            fds.push(PollFd::new(self.sigfd.as_fd(), PollFlags::POLLIN));
            if out_open {
                fds.push(PollFd::new(stdout.as_fd(), PollFlags::POLLIN));
            }
            if err_open {
                fds.push(PollFd::new(stderr.as_fd(), PollFlags::POLLIN));
            }
            if let Some(w) = &stdin {
                fds.push(PollFd::new(w.as_fd(), PollFlags::POLLOUT));
            }
            let _ = nix::poll::poll(&mut fds, PollTimeout::from(wait_ms));
            drop(fds);
            if out_open {
                out_open = out.drain(&stdout, &mut buf);
            }
            if err_open {
                err_open = err.drain(&stderr, &mut buf);
            }
            if let Some(w) = &stdin {
                match nix::unistd::write(w, &req.stdin[written..]) {
                    Ok(n) => written += n,
                    Err(nix::errno::Errno::EAGAIN) => {}
                    Err(_) => written = req.stdin.len(),
                }
                if written >= req.stdin.len() {
                    stdin = None;
                }
            }
            status = self.reap(Some(pid));
            if status.is_none() && timed_out && Instant::now() > deadline + Duration::from_secs(5) {
                // Still not dead 5 s after SIGKILL (uninterruptible sleep): give up waiting.
                break;
            }
        }
        let duration_us = started.elapsed().as_micros() as u64;
        // What the command wrote before it exited is in the pipes; background processes that
        // keep them open are not waited for.
        if out_open {
            out.drain(&stdout, &mut buf);
        }
        if err_open {
            err.drain(&stderr, &mut buf);
        }
        // Whatever the command left in its session dies with it on a timeout only.
        let termination = if timed_out {
            Termination::TimedOut
        } else {
            match status {
                Some(WaitStatus::Exited(_, c)) => Termination::Exited(c),
                Some(WaitStatus::Signaled(_, s, _)) => Termination::Signaled(s as i32),
                _ => Termination::Signaled(libc::SIGKILL),
            }
        };
        ExecResult {
            termination,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: out.data,
            stderr: err.data,
            duration_us,
            oom_killed: false,
        }
    }
}

fn internal(message: String) -> Response {
    Response::Failed {
        kind: FailureKind::Internal,
        message,
    }
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

/// `execve`; returns the errno when it fails.
///
/// # Safety
/// Only call in a forked child that is about to `_exit` on failure.
unsafe fn execve(prog: &CString, argv: &[CString], env: &[CString]) -> i32 {
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = env.iter().map(|s| s.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: NUL-terminated arrays of valid C strings that live across the call.
    unsafe { libc::execve(prog.as_ptr(), a.as_ptr(), e.as_ptr()) };
    nix::errno::Errno::last_raw()
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    n
}

/// Kill the command's process group and every process of its session (found through the
/// sandbox's own /proc), which covers pipelines and background jobs of the command.
fn kill_session(pid: i32, proc: &std::path::Path) {
    // SAFETY: kill with integer arguments.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let Ok(dir) = std::fs::read_dir(proc) else {
        return;
    };
    for e in dir.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
            // Fields after the parenthesised command: state ppid pgrp session ...
            let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(pid) {
                // SAFETY: kill with integer arguments.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    }
}

/// One output stream: keeps `cap` bytes, counts and discards the rest.
struct Capture {
    data: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            data: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// Read what is available; false once the stream reached end of file.
    fn drain(&mut self, fd: &OwnedFd, buf: &mut [u8]) -> bool {
        // Bounded, so a flood cannot starve the deadline and exit checks.
        for _ in 0..64 {
            match nix::unistd::read(fd.as_raw_fd(), buf) {
                Ok(0) => return false,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.data.len());
                    if n > room {
                        self.truncated = true;
                    }
                    self.data.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return true,
            }
        }
        true
    }
}
