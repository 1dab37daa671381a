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
//! ([`client`] asks; the daemon answers [`Reply::Mismatch`] otherwise and the client makes the
//! sandbox itself): a host-rooted sandbox (other roots are resolved once per runtime, which a
//! new process would not do), the same engine binary (device, inode, size and modification
//! time of `/proc/self/exe`), the same state directory, the same variables that decide how a
//! sandbox is made ([`SANDBOX_ENV`]), a client of the daemon's own user in the daemon's own
//! mount, pid, user and cgroup namespaces. The host mask is found current at most
//! [`RECHECK_AFTER`] before a sandbox is handed out (`Runtime::host_mask_current`); when the
//! host changed, the daemon starts a new runtime, as a new process would plan a new mask. A
//! client that goes away (a signal, a closed terminal) has its command killed.
//!
//! Wire: one message each way, a little-endian u32 length and that many bytes of
//! MessagePack: the client's [`Request`], the daemon's [`Reply`].

pub mod client;
pub mod server;
mod workers;

use super::sandbox::{Outcome, SandboxOpts, OUTPUT_CAP};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use client::{ask, set_log_filter, BenchDaemon, SOCKET_ENV};
pub use server::{daemon, DaemonOpts};

/// The environment variables that decide how a sandbox is made (the init program, the
/// memory reserve of admission control): a request is served only when the client's and the
/// daemon's agree. (`ENVFACTORY_STATE` is compared as the state directory itself;
/// `ENVFACTORY_MAX_SANDBOXES`, a cap on one process's live sandboxes, keeps a daemon from
/// starting: its count would be the daemon's, not the one-shot's.)
pub const SANDBOX_ENV: [&str; 2] = ["ENVFACTORY_INIT", "ENVFACTORY_MEMORY_RESERVE"];

/// A host-rooted sandbox is handed out only when the host mask was found current at most this
/// long before.
pub const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// The largest request (a command line: the kernel's own limit on arguments is 2 MiB).
const MAX_REQUEST: usize = 4 << 20;
/// The largest reply: both streams at their cap, and the rest.
const MAX_REPLY: usize = 2 * OUTPUT_CAP as usize + (1 << 20);

/// The one-shot socket of a state directory.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join("exec.sock")
}

/// What identifies the engine binary a process runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ExeId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl ExeId {
    fn of_self() -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/proc/self/exe")?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// A one-shot's request.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    exe: ExeId,
    /// The client's state directory.
    state: PathBuf,
    /// The values of [`SANDBOX_ENV`], in order.
    env: Vec<Option<String>>,
    opts: SandboxOpts,
    timeout_ms: u64,
    cmd: Vec<String>,
}

/// The daemon's answer.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    /// Not served, and nothing was run: the client makes the sandbox itself.
    Mismatch(String),
    /// Served.
    Outcome(Outcome),
}

fn env_values() -> Vec<Option<String>> {
    SANDBOX_ENV.iter().map(|k| std::env::var(k).ok()).collect()
}

fn write_frame(s: &mut UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    let n = u32::try_from(bytes.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "message too large"))?;
    // One system call for both parts where the socket takes them (no copy of the message),
    // the rest after.
    let len = n.to_le_bytes();
    let sent = loop {
        match s.write_vectored(&[std::io::IoSlice::new(&len), std::io::IoSlice::new(bytes)]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    if sent < len.len() {
        s.write_all(&len[sent..])?;
        return s.write_all(bytes);
    }
    s.write_all(&bytes[sent - len.len()..])
}

/// A frame's length, read; `Err(n)` (the length) when it is over `max`.
fn read_len(s: &mut UnixStream, max: usize) -> std::io::Result<Result<usize, usize>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    Ok(if n > max { Err(n) } else { Ok(n) })
}

fn read_body(s: &mut UnixStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)?;
    Ok(buf)
}
