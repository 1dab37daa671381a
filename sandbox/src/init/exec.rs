//! Running one command: spawn it through the zygote, feed stdin, collect output under a cap,
//! enforce the timeout.

use super::Init;
use crate::protocol::{Command, ExecRequest, ExecResult, FailureKind, Response, Termination};
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::wait::WaitStatus;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

fn pipe() -> Result<(OwnedFd, OwnedFd), nix::errno::Errno> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC)
}

/// Strings bound for `execve` cannot hold a NUL byte.
fn nul_free(v: &[String], what: &str) -> Result<(), String> {
    match v.iter().find(|s| s.contains('\0')) {
        Some(s) => Err(format!("{what} {s:?} contains a NUL byte")),
        None => Ok(()),
    }
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
        if req.looks.len() > crate::protocol::MAX_LOOKS {
            return invalid(format!(
                "{} looks after the command; at most {}",
                req.looks.len(),
                crate::protocol::MAX_LOOKS
            ));
        }
        let env = req.env.clone().unwrap_or_else(|| self.plan.env.clone());
        // A shell command that needs no shell runs as its words (`direct.rs`).
        let (argv, shell): (Vec<String>, Option<&str>) = match &req.command {
            Command::Argv(a) if a.is_empty() => return invalid("empty argv".into()),
            Command::Argv(a) => (a.clone(), None),
            Command::Shell(s) => {
                match super::direct::words(s, &env).filter(|_| self.sh_is_dash()) {
                    Some(w) => (w, Some(s.as_str())),
                    None => {
                        let text = ExecRequest::shell_text(s, req.shell_epilogue.as_deref());
                        (vec!["/bin/sh".into(), "-c".into(), text], None)
                    }
                }
            }
        };
        let checked = nul_free(&argv, "argument")
            .and_then(|()| nul_free(&env, "variable"))
            .and_then(|()| nul_free(std::slice::from_ref(&req.cwd), "working directory"));
        if let Err(m) = checked {
            return invalid(m);
        }
        let started = Instant::now();
        let mut spawned = None;
        for _attempt in 0..2 {
            let pipes = (|| Ok::<_, nix::errno::Errno>((pipe()?, pipe()?, pipe()?, pipe()?)))();
            let Ok(((in_r, in_w), (out_r, out_w), (err_r, err_w), (st_r, st_w))) = pipes else {
                return internal("creating pipes".into());
            };
            let fds = [&in_r, &out_w, &err_w, &st_w];
            // `zygote()` fails when it died before it was ready (killed while it confined
            // itself): retried below like a zygote killed later.
            let answer = self
                .zygote()
                .and_then(|z| z.spawn(&argv, &env, &req.cwd, req.user, shell, fds));
            drop((in_r, out_w, err_w, st_w));
            // The child's first words are its pid (`spawn.rs`): whoever started, init knows it,
            // even when the command killed the zygote before the zygote could answer.
            let mut status_pipe = std::fs::File::from(st_r);
            let mut pid = [0u8; 4];
            let child =
                (read_full(&mut status_pipe, &mut pid) == 4).then(|| i32::from_le_bytes(pid));
            match (child, answer) {
                (Some(pid), answer) => {
                    if answer.is_err() {
                        self.replace_zygote(false);
                    }
                    spawned = Some(Ok((pid, status_pipe, in_w, out_r, err_r)));
                    break;
                }
                // Killed before its first words: reaped and reported by `collect`.
                (None, Ok(pid)) => {
                    spawned = Some(Ok((pid, status_pipe, in_w, out_r, err_r)));
                    break;
                }
                // A clone the kernel refused (EAGAIN: the pids limit is full) is not a dead
                // zygote: a new zygote could not start either, so report it as it is.
                (None, Err(e)) if e.starts_with("clone failed") => {
                    spawned = Some(Err(e));
                    break;
                }
                // The zygote died and nothing started (an agent may kill it at any time): start
                // a new one and try once more.
                (None, Err(e)) => {
                    self.replace_zygote(true);
                    spawned = Some(Err(e));
                }
            }
        }
        let (pid, mut status_pipe, in_w, out_r, err_r) = match spawned {
            Some(Ok(s)) => s,
            Some(Err(e)) => return internal(format!("starting the command: {e}")),
            None => return internal("starting the command: no attempt".into()),
        };
        let mut got = [0u8; 4];
        let mut n = read_full(&mut status_pipe, &mut got);
        // A command meant to run without the shell that went to `/bin/sh -c` after all says
        // so first (then, like any command, 3 bytes if that exec failed too).
        let by_shell = n >= 1 && shell.is_some() && got[0] == super::zygote::SHELL_AFTER_ALL;
        let st = if by_shell {
            n -= 1;
            [got[1], got[2], got[3]]
        } else {
            [got[0], got[1], got[2]]
        };
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
                    super::zygote::Stage::name(st[0]),
                    nix::errno::Errno::from_raw(errno).desc()
                ),
            };
        }
        let mut result = self.collect(pid, req, started, in_w, out_r, err_r);
        if shell.is_some() && !by_shell {
            as_dash_reports(&mut result, req.output_cap);
        }
        // The looks, answered as their own requests are, at the moment the command has ended.
        result.answers = req.looks.iter().map(|l| self.handle(l.request())).collect();
        Response::Exec(Box::new(result))
    }

    /// Whether the root's `/bin/sh` is its `/bin/dash` (the same file now).
    fn sh_is_dash(&self) -> bool {
        let Some(root) = &self.root_fd else {
            return false;
        };
        let id = |p: &str| {
            let fd = super::files::open_path_in_root(root, p).ok()?;
            let st = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?;
            Some((st.st_dev, st.st_ino))
        };
        matches!((id("/bin/sh"), id("/bin/dash")), (Some(a), Some(b)) if a == b)
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
            let _ = nix::fcntl::fcntl(
                fd.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK),
            );
        }
        let deadline = started + Duration::from_millis(req.timeout_ms.max(1));
        let cap = req.output_cap as usize;
        let mut out = Capture::new(cap);
        let mut err = Capture::new(cap);
        let mut stdin = (!req.stdin.is_empty()).then_some(stdin);
        let mut written = 0usize;
        let mut status: Option<WaitStatus> = None;
        let mut timed_out = false;
        let mut killed = Vec::new();
        let mut out_open = true;
        let mut err_open = true;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(64 << 10, 0);
        while status.is_none() {
            let now = Instant::now();
            if now >= deadline && !timed_out {
                timed_out = true;
                killed = kill_session(pid, &self.layout.proc());
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
        // A timed-out step ends only when its whole tree is gone (bounded: a process stuck in
        // uninterruptible sleep is left to the next reset).
        let gone_by = Instant::now() + Duration::from_secs(2);
        while !killed.is_empty() && Instant::now() < gone_by {
            self.reap(None);
            let proc = self.layout.proc();
            killed.retain(|p| proc.join(p.to_string()).exists());
            if !killed.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let keep = &mut self.buf;
        // What the command wrote before it exited is in the pipes; background processes that
        // keep them open are not waited for.
        if out_open {
            out.drain(&stdout, &mut buf);
        }
        if err_open {
            err.drain(&stderr, &mut buf);
        }
        *keep = buf;
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
            pid: u32::try_from(pid).unwrap_or(0),
            answers: Vec::new(),
        }
    }
}

/// A command run without the shell that died of a signal, as `sh -c` reports it: the shell
/// exits 128+N after writing the signal's description to stderr.
fn as_dash_reports(r: &mut ExecResult, cap: u64) {
    if let Termination::Signaled(sig) = r.termination {
        if let Some(m) = super::direct::signal_message(sig) {
            let room = (cap as usize).saturating_sub(r.stderr.len());
            r.stderr_truncated |= m.len() > room;
            r.stderr
                .extend_from_slice(&m.as_bytes()[..m.len().min(room)]);
        }
        r.termination = Termination::Exited(128 + sig);
    }
}

fn internal(message: String) -> Response {
    Response::Failed {
        kind: FailureKind::Internal,
        message,
    }
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
/// Returns the pids it signalled.
fn kill_session(pid: i32, proc: &std::path::Path) -> Vec<i32> {
    // SAFETY: kill with integer arguments.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let mut killed = vec![pid];
    let Ok(dir) = std::fs::read_dir(proc) else {
        return killed;
    };
    for e in dir.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
            // Fields after the parenthesised command: state ppid pgrp session ...
            let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            let pgrp = f.get(2).and_then(|s| s.parse::<i32>().ok());
            let session = f.get(3).and_then(|s| s.parse::<i32>().ok());
            if session == Some(pid) || pgrp == Some(pid) {
                // SAFETY: kill with integer arguments.
                unsafe { libc::kill(p, libc::SIGKILL) };
                killed.push(p);
            }
        }
    }
    killed
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
