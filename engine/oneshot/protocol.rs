//! The one-shot's wire: one message each way on a Unix stream socket, a little-endian u32
//! length and that many bytes of MessagePack: the client's [`Request`], the daemon's
//! [`Reply`].

use super::args::SandboxOpts;
use super::outcome::{Outcome, OUTPUT_CAP};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The environment variables that decide how a sandbox is made (the init program, the
/// memory reserve of admission control): a request is served only when the client's and the
/// daemon's agree. (`ENVFACTORY_STATE` is compared as the state directory itself;
/// `ENVFACTORY_MAX_SANDBOXES`, a cap on one process's live sandboxes, keeps a daemon from
/// starting: its count would be the daemon's, not the one-shot's.)
pub const SANDBOX_ENV: [&str; 2] = ["ENVFACTORY_INIT", "ENVFACTORY_MEMORY_RESERVE"];

/// The largest request (a command line: the kernel's own limit on arguments is 2 MiB).
pub const MAX_REQUEST: usize = 4 << 20;
/// The largest reply: both streams at their cap, and the rest.
pub const MAX_REPLY: usize = 2 * OUTPUT_CAP as usize + (1 << 20);

/// The one-shot socket of a state directory.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join("exec.sock")
}

/// What identifies the engine program (`engine-core`, [`super::CORE`]) a client or
/// daemon runs: the file's device, inode, size and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExeId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl ExeId {
    /// The program this process runs.
    pub fn of_self() -> std::io::Result<Self> {
        Self::of(Path::new("/proc/self/exe"))
    }

    /// The program at `path` (the front's: the engine program beside it).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
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
pub struct Request {
    /// The build of the client's code ([`super::BUILD`]): the front and the engine program
    /// encode the same requests only when built from the same sources.
    pub build: String,
    pub exe: ExeId,
    /// The client's state directory.
    pub state: PathBuf,
    /// The values of [`SANDBOX_ENV`], in order.
    pub env: Vec<Option<String>>,
    pub opts: SandboxOpts,
    pub timeout_ms: u64,
    pub cmd: Vec<String>,
}

/// The daemon's answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// Not served, and nothing was run: the client makes the sandbox itself.
    Mismatch(String),
    /// Served.
    Outcome(Outcome),
}

impl Request {
    /// The message's bytes (MessagePack).
    pub fn encode(&self) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        rmp_serde::to_vec(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

impl Reply {
    /// The message's bytes (MessagePack).
    pub fn encode(&self) -> Result<Vec<u8>, rmp_serde::encode::Error> {
        rmp_serde::to_vec(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// The client's values of [`SANDBOX_ENV`], in order.
pub fn env_values() -> Vec<Option<String>> {
    SANDBOX_ENV.iter().map(|k| std::env::var(k).ok()).collect()
}

/// Write one message.
pub fn write_frame(s: &mut UnixStream, bytes: &[u8]) -> std::io::Result<()> {
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
pub fn read_len(s: &mut UnixStream, max: usize) -> std::io::Result<Result<usize, usize>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    Ok(if n > max { Err(n) } else { Ok(n) })
}

pub fn read_body(s: &mut UnixStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)?;
    Ok(buf)
}
