//! `engine sandbox daemon`: one-shots (`engine sandbox exec`) served by a running engine.
//!
//! A one-shot that makes its own sandbox pays, in every process, a runtime's start (the
//! state directory, the host mask's checks) and a sandbox's creation (cgroups, namespaces,
//! init, the root). The daemon ([`server`]) pays them ahead: it listens on
//! `<state>/exec.sock` (mode 0600) and, for each configuration it was asked for, keeps one
//! sandbox ready that no command has run in, made after the previous request of that
//! configuration and dropped after `--keep-ready` unused. Every request gets a sandbox of its
//! own, killed as soon as its command ends and torn down after the answer: none serves two.
//!
//! A request is served only where the daemon makes the sandbox the client would have made
//! (`crate::oneshot::client` asks; the daemon answers `Reply::Mismatch` otherwise and the
//! client makes the sandbox itself): a host-rooted sandbox (other roots are resolved once per
//! runtime, which a new process would not do), a client of the same build
//! (`crate::oneshot::BUILD`), the same engine program (device, inode, size and modification
//! time of the daemon's `/proc/self/exe` and of the client's: its own, or the engine program
//! beside the `engine` front), the same state directory, the same variables that decide how a
//! sandbox is made (`SANDBOX_ENV`), a client of the daemon's own user in the daemon's own
//! mount, pid, user and cgroup namespaces. The host mask is found current at most
//! [`RECHECK_AFTER`] before a sandbox is handed out (`Runtime::host_mask_current`); when the
//! host changed, the daemon starts a new runtime, as a new process would plan a new mask. A
//! client that goes away (a signal, a closed terminal) has its command killed.
//!
//! Wire: `crate::oneshot::protocol`.

pub mod server;
mod workers;

use anyhow::Context;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use server::{daemon, DaemonOpts};

/// A host-rooted sandbox is handed out only when the host mask was found current at most this
/// long before.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// `engine sandbox daemon --socket PATH` for a benchmark, on a socket in a directory of its
/// own: stopped (SIGTERM, then waited for) when dropped, or when this process dies
/// (`PR_SET_PDEATHSIG`).
pub struct BenchDaemon {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl BenchDaemon {
    /// Start it and wait until it answers (at most 30 s).
    pub fn start() -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::Builder::new()
            .prefix("envfactory-bench-daemon-")
            .tempdir()
            .context("a directory for the benchmark's daemon")?;
        let socket = dir.path().join("exec.sock");
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["sandbox", "daemon", "--socket"])
            .arg(&socket)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
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
        let mut me = Self { child, dir };
        let t = Instant::now();
        while UnixStream::connect(&socket).is_err() {
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

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("exec.sock")
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, not yet reaped (so its pid is still its own).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
