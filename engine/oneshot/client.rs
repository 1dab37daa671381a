//! The one-shot's side: find a daemon, ask it, or say that none serves this process.

use super::args::SandboxOpts;
use super::outcome::{Outcome, EXIT_SANDBOX_FAILURE};
use super::protocol::{
    env_values, read_body, read_len, socket_path, write_frame, ExeId, Reply, Request, MAX_REPLY,
    MAX_REQUEST,
};
use anyhow::Context;
use sandbox::{RootfsSpec, SandboxConfig};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A socket to use instead of `<state>/exec.sock`; a one-shot that names one must be served
/// by it (not reaching it, or a mismatch, is an error, not a fallback).
pub const SOCKET_ENV: &str = "ENVFACTORY_EXEC_SOCKET";

/// Whether the log filter lets more than warnings through: a one-shot then makes its
/// sandbox itself, so that its log shows how (the daemon's log is the daemon's).
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Tell one-shots the log filter `main` set up.
pub fn set_log_filter(filter: &str) {
    let verbose = tracing_subscriber::EnvFilter::try_new(filter)
        .ok()
        .and_then(|f| f.max_level_hint())
        .is_some_and(|max| max > tracing::level_filters::LevelFilter::WARN);
    VERBOSE.store(verbose, Ordering::Relaxed);
}

/// What asking a daemon came to.
#[derive(Debug)]
pub enum Asked {
    /// The daemon took the request: its outcome, or the loss of its answer
    /// ([`Outcome::NotRun`], 125). The command may have run: it must not be run again.
    Answered(Outcome),
    /// No daemon serves this process, and none took the request: the caller makes the sandbox
    /// itself (or hands the command line to the engine program, which asks again).
    NotServed,
}

/// Ask a daemon to run `cmd`: [`Asked::NotServed`] when none serves this process (no socket,
/// none listening, a root other than the host's, another build, binary, state directory or
/// environment, or a log filter letting more than warnings through). A socket named by
/// [`SOCKET_ENV`] must serve: not reaching it, or a mismatch, is an error. An error, like
/// `NotServed`, says that no daemon took the request. `exe` is the engine program the client would run the sandbox
/// with (this process's, or the front's engine program). From the request's sending to the
/// answer, the guard `exit_at_once` returns lives: a signal must then end the process at once
/// (the daemon kills the command when its client goes).
pub fn ask<G>(
    exe: std::io::Result<ExeId>,
    opts: &SandboxOpts,
    cfg: &SandboxConfig,
    timeout: Duration,
    cmd: &[String],
    exit_at_once: impl FnOnce() -> G,
) -> anyhow::Result<Asked> {
    let named = std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let strict = named.is_some();
    let not_served = |why: String| -> anyhow::Result<Asked> {
        if strict {
            Err(anyhow::anyhow!("{SOCKET_ENV}: not served: {why}"))
        } else {
            tracing::debug!(why = %why, "the one-shot daemon does not serve this one-shot");
            Ok(Asked::NotServed)
        }
    };
    if !strict && VERBOSE.load(Ordering::Relaxed) {
        return Ok(Asked::NotServed);
    }
    if cfg.rootfs != RootfsSpec::Host {
        return not_served(format!(
            "the daemon serves host-rooted sandboxes only, not --rootfs {}",
            opts.rootfs
        ));
    }
    let state = sandbox::state::default_state_dir();
    let sock = named.unwrap_or_else(|| socket_path(&state));
    let mut s = match UnixStream::connect(&sock) {
        Ok(s) => s,
        Err(e) if strict => {
            return Err(anyhow::anyhow!(
                "{SOCKET_ENV}={}: no daemon answers there: {e}",
                sock.display()
            ))
        }
        Err(_) => return Ok(Asked::NotServed),
    };
    // Only a daemon of root or of this user may see the command and answer for it.
    let me = nix::unistd::geteuid().as_raw();
    match nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(c) if c.uid() == 0 || c.uid() == me => {}
        Ok(c) => return not_served(format!("{} listens as uid {}", sock.display(), c.uid())),
        Err(e) => return not_served(format!("{}: its credentials: {e}", sock.display())),
    }
    let req = Request {
        build: super::BUILD.to_string(),
        exe: exe.context("identifying the engine program")?,
        // Absolute (a relative one is this process's, not the daemon's).
        state: std::path::absolute(&state).unwrap_or(state),
        env: env_values(),
        opts: opts.clone(),
        timeout_ms: timeout.as_millis() as u64,
        cmd: cmd.to_vec(),
    };
    let bytes = req.encode().context("encoding the request")?;
    if bytes.len() > MAX_REQUEST {
        return not_served(format!(
            "a request of {} bytes (at most {MAX_REQUEST})",
            bytes.len()
        ));
    }
    // A signal ends this process at once while the daemon runs the command (the daemon
    // then kills it); if the daemon does not serve, signals are the watcher's again.
    let _exit_at_once = exit_at_once();
    let lost = |e: &dyn std::fmt::Display| {
        Ok(Asked::Answered(Outcome::NotRun {
            code: EXIT_SANDBOX_FAILURE,
            message: format!(
                "the one-shot daemon at {} gave no answer: {e}",
                sock.display()
            ),
        }))
    };
    // A request the daemon did not take whole was not run: a refusal it sent meanwhile ("busy",
    // another user) is read, and either way the one-shot makes its own sandbox.
    let written = write_frame(&mut s, &bytes);
    let reply = match read_len(&mut s, MAX_REPLY) {
        Ok(Ok(n)) => match read_body(&mut s, n) {
            Ok(b) => b,
            Err(e) => return lost(&e),
        },
        Ok(Err(n)) => return lost(&format!("an answer of {n} bytes (at most {MAX_REPLY})")),
        Err(e) => match &written {
            Err(w) => {
                return not_served(format!(
                    "{}: the request was not taken: {w}",
                    sock.display()
                ))
            }
            Ok(()) => return lost(&e),
        },
    };
    match (Reply::decode(&reply), written) {
        (Ok(Reply::Outcome(o)), _) => Ok(Asked::Answered(o)),
        (Ok(Reply::Mismatch(why)), _) => not_served(format!("{}: {why}", sock.display())),
        (Err(_), Err(w)) => not_served(format!(
            "{}: the request was not taken: {w}",
            sock.display()
        )),
        (Err(e), Ok(())) => lost(&e),
    }
}
