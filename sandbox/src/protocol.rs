//! The typed request/response protocol between the host and the resident init (PID 1).
//!
//! Frames are a 4-byte little-endian length followed by a MessagePack body (rmp-serde,
//! struct-as-map so fields can be added). One request, one response, strictly in turn.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Largest frame either side accepts (a file read or an output capture beyond this is refused).
pub const MAX_FRAME: usize = 256 << 20;

/// Errors of the framing layer.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("protocol i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("frame of {len} bytes exceeds the limit of {MAX_FRAME} bytes")]
    TooLarge { len: usize },
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("cannot decode a {what} frame of {len} bytes: {reason}")]
    Decode {
        what: &'static str,
        len: usize,
        reason: String,
    },
}

/// How to start a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// `argv[0]` is looked up in `PATH` of the command's environment when it has no `/`.
    Argv(Vec<String>),
    /// Run by `/bin/sh -c`.
    Shell(String),
}

/// One command to run inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub command: Command,
    /// Working directory inside the sandbox (absolute).
    pub cwd: String,
    /// Full environment of the command (`KEY=VALUE`), replacing the sandbox default when set.
    pub env: Option<Vec<String>>,
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// Wall-clock limit; the whole process tree of the command is killed when it passes.
    pub timeout_ms: u64,
    /// Bytes kept per stream; the rest is read and discarded, and the stream flagged truncated.
    pub output_cap: u64,
    /// Run as this `(uid, gid)` with no supplementary groups: the switch happens in the
    /// sandbox itself, before `execve`, so no program of the root filesystem is trusted with
    /// it, and leaving uid 0 clears every capability. `None`: the sandbox's own user.
    #[serde(default)]
    pub user: Option<(u32, u32)>,
    /// For a [`Command::Shell`]: shell text run when the shell exits after the command, when
    /// the command goes through the shell ([`ExecRequest::shell_text`]). A command that needs
    /// no shell and runs as its words (the native backend's `init/direct.rs`) runs without
    /// it: with no shell there is no shell state (its directory, its variables) for an
    /// epilogue to report, and such a command cannot change its parent's. Backends without
    /// that path always set it.
    #[serde(default)]
    pub shell_epilogue: Option<String>,
    /// Read-only looks answered right after the command, in the same exchange
    /// ([`ExecResult::answers`], one answer each, in order): what the caller would ask next (a
    /// verifier's reads, an observation's overview) without another round trip. At most
    /// [`MAX_LOOKS`]. Backends that cannot answer them leave [`ExecResult::answers`] empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub looks: Vec<Look>,
}

/// At most this many [`Look`]s ride on one command ([`ExecRequest::looks`]).
pub const MAX_LOOKS: usize = 16;

/// Quote a string as one word for a POSIX shell (single quotes; a quote inside as `'\''`).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A read-only request that may ride on a command ([`ExecRequest::looks`]) or a reset
/// ([`Request::ResetAndLook`]): answered as the request of the same name is, at the moment the
/// command has ended or the reset is done. (The native sandbox starts the new root's zygote
/// after answering a reset, or before its looks when one is health or a path with a `proc`
/// component; a read that reaches `/proc` through a symlink sees the fresh root without it.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Look {
    ReadFile {
        path: String,
        max_bytes: u64,
        nofollow: bool,
    },
    Stat {
        path: String,
    },
    ListDir {
        path: String,
    },
    Overview {
        path: String,
        max_entries: u32,
    },
    Health,
}

impl Look {
    /// Whether this look may see the sandbox's processes: health, or a path with a `proc`
    /// component (so that `/x/../proc` counts too; a symlink that leads into `/proc` is not
    /// seen here).
    pub fn reads_processes(&self) -> bool {
        let path = match self {
            Look::Health => return true,
            Look::ReadFile { path, .. }
            | Look::Stat { path }
            | Look::ListDir { path }
            | Look::Overview { path, .. } => path,
        };
        path.split('/').any(|c| c == "proc")
    }

    /// The request this look stands for.
    pub fn request(&self) -> Request {
        match self {
            Look::ReadFile {
                path,
                max_bytes,
                nofollow,
            } => Request::ReadFile {
                path: path.clone(),
                max_bytes: *max_bytes,
                nofollow: *nofollow,
            },
            Look::Stat { path } => Request::Stat { path: path.clone() },
            Look::ListDir { path } => Request::ListDir { path: path.clone() },
            Look::Overview { path, max_entries } => Request::Overview {
                path: path.clone(),
                max_entries: *max_entries,
            },
            Look::Health => Request::Health,
        }
    }
}

impl ExecRequest {
    /// The text a shell runs for this request's shell command: the epilogue set as the
    /// shell's `EXIT` trap, then the command, on the same line. The command is parsed alone,
    /// as `sh -c CMD` parses it: nothing of it can continue into the epilogue (`true &&` is a
    /// syntax error, an unterminated here-document does not swallow it, a trailing comment
    /// cannot hide it), its line numbers are its own, and the epilogue also runs when the
    /// command ends the shell (`exit 3`, `set -e`) or fails to parse after its first complete
    /// command. It does not run when that first complete command (the trap's own) cannot be
    /// parsed (nothing runs), when the command replaces the trap or the shell (`trap ...
    /// EXIT`, `exec`), or when a signal ends the shell.
    pub fn shell_text(cmd: &str, epilogue: Option<&str>) -> String {
        match epilogue {
            Some(e) => format!("trap {} EXIT; {cmd}", sh_quote(e)),
            None => cmd.to_string(),
        }
    }

    /// A shell command with the defaults: cwd `/root`, 10 s timeout, 1 MiB per stream.
    pub fn shell(cmd: impl Into<String>) -> Self {
        Self {
            command: Command::Shell(cmd.into()),
            cwd: "/root".into(),
            env: None,
            stdin: Vec::new(),
            timeout_ms: 10_000,
            output_cap: 1 << 20,
            user: None,
            shell_epilogue: None,
            looks: Vec::new(),
        }
    }

    /// An argv command with the same defaults as [`ExecRequest::shell`].
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        Self {
            command: Command::Argv(argv.into_iter().map(Into::into).collect()),
            ..Self::shell("")
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Termination {
    Exited(i32),
    Signaled(i32),
    /// The wall timeout passed and the process tree was killed.
    TimedOut,
}

/// Result of one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    pub termination: Termination,
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_us: u64,
    /// Set by the host when the command's death coincided with an OOM kill in the sandbox.
    #[serde(default)]
    pub oom_killed: bool,
    /// The command's pid in the sandbox's pid namespace (its shell, for a shell command).
    #[serde(default)]
    pub pid: u32,
    /// The answers to [`ExecRequest::looks`], in order; empty where the backend does not
    /// answer looks, where they did not fit in the reply's frame, or where the request had
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<Response>,
}

impl ExecResult {
    /// Exit code in the shell's convention: status, or 128+signal, or 124 for a timeout.
    pub fn exit_code(&self) -> i32 {
        match self.termination {
            Termination::Exited(c) => c,
            Termination::Signaled(s) => 128 + s,
            Termination::TimedOut => 124,
        }
    }

    pub fn success(&self) -> bool {
        self.termination == Termination::Exited(0)
    }
}

/// File metadata as seen inside the sandbox (`lstat`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime_ns: i128,
    pub symlink_target: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub stat: FileStat,
}

/// A directory entry as an observation shows it: its name, and whether it is a directory (a
/// symlink to one is not), from the directory's own entry type (an `lstat` only where the
/// filesystem gives none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownEntry {
    pub name: String,
    pub is_dir: bool,
}

impl ShownEntry {
    /// The order an observation shows entries in: by name, a directory's with a `/` after it
    /// (`a-b` before `a/`).
    pub fn shown_cmp(&self, o: &Self) -> std::cmp::Ordering {
        fn shown(e: &ShownEntry) -> impl Iterator<Item = u8> + '_ {
            e.name.bytes().chain(e.is_dir.then_some(b'/'))
        }
        shown(self).cmp(shown(o))
    }

    /// Sort entries in the order an observation shows them ([`Self::shown_cmp`]).
    pub fn sort_shown(entries: &mut [ShownEntry]) {
        entries.sort_by(|a, b| a.shown_cmp(b));
    }
}

/// What an environment's observation reads of a sandbox, in one request ([`Request::Overview`]):
/// a directory's entries and the episode's disk usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overview {
    /// The first `max_entries` entries (`.` and `..` left out) in the order an observation
    /// shows them: by name, a directory's with a `/` after it. `None` when the
    /// directory cannot be listed because of what the agent did (gone, not a directory, not
    /// readable, a bad path); a failure of init itself fails the whole request. Names that are
    /// not UTF-8 are left out, as `list_dir` leaves them out.
    pub entries: Option<Vec<ShownEntry>>,
    /// As [`Health::upper_bytes`]: bytes in use on the episode's writable tmpfs.
    pub upper_bytes: u64,
}

/// Health report of init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub pid_in_sandbox: u32,
    /// Processes in the sandbox other than init.
    pub processes: u32,
    pub snapshots: u32,
    pub upper_bytes: u64,
    /// Inodes in use on the episode's tmpfs (`statvfs` files minus free files). tmpfs charges
    /// every inode and every user xattr to this count, in 1 KiB units, not to its blocks.
    #[serde(default)]
    pub upper_inodes: u64,
    /// Bytes and inodes in use on the root's `/dev/shm` (its own tmpfs), by `statvfs`.
    #[serde(default)]
    pub shm_bytes: u64,
    #[serde(default)]
    pub shm_inodes: u64,
    /// The zygote's pid in the sandbox, while it lives: with init, the one process that is the
    /// sandbox's and not a command's (a command may copy its command line, not its pid).
    #[serde(default)]
    pub zygote_pid: Option<u32>,
}

/// What an init started ahead can do before its sandbox's plan (`init_reserve.rs`): join the
/// cgroups and lay out the private directory and its side trees, none of which depend on the
/// sandbox's configuration. Sent once, before the [`SetupPlan`], whose `sandbox_dir` and
/// `cgroup_join` must then be the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparePlan {
    pub sandbox_dir: String,
    pub cgroup_join: Vec<String>,
    /// The plan the runtime expects (`InitReserve::expect`): init also mounts that root and
    /// starts its zygote now, and keeps them if the plan that comes has the same root and
    /// confinement ([`SetupPlan::same_root_and_confinement`], with the same layer directories),
    /// else unmounts them and sets up as without it. Its `sandbox_dir` and `cgroup_join` are
    /// this plan's.
    #[serde(default)]
    pub expected: Option<Box<SetupPlan>>,
}

/// Init's answer to a [`SetupPlan`]: the sandbox is ready.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetUp {
    /// Whether the root and zygote made ahead for [`PreparePlan::expected`] were kept.
    pub root_made_ahead: bool,
    /// Whether a root made ahead was undone (the plan had another root or confinement, or a
    /// layer path named another directory by then).
    pub root_undone: bool,
}

/// Everything init needs to build the sandbox; sent once, first (or after a [`PreparePlan`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupPlan {
    /// Host path of the sandbox's private directory (an empty directory in the run dir).
    pub sandbox_dir: String,
    /// Files init writes `0` to, first of all, to join the sandbox's cgroups.
    pub cgroup_join: Vec<String>,
    /// Read-only lower layers, topmost first.
    pub lowers: Vec<String>,
    /// Size of the writable layer (tmpfs), bytes.
    pub disk_bytes: u64,
    /// Inodes of the writable layer (`None`: the tmpfs default).
    #[serde(default)]
    pub disk_inodes: Option<u64>,
    /// Paths inside the root bound read-only over themselves after every root mount.
    #[serde(default)]
    pub readonly_paths: Vec<String>,
    pub hostname: String,
    /// Default environment of commands.
    pub env: Vec<String>,
    /// Capabilities kept by commands (numbers, see `caps`).
    pub keep_caps: Vec<u8>,
    /// Compiled seccomp filters, installed last before `execve`.
    pub seccomp: Option<crate::seccomp::CompiledSeccomp>,
    /// Apply the embedded landlock policy (`sandbox/policy/landlock.toml`) to each command.
    pub landlock: bool,
    /// `RLIMIT_NOFILE` of commands.
    pub nofile: u64,
    /// Run commands in a user namespace where root is host uid/gid `.0` (`.1` ids mapped).
    #[serde(default)]
    pub userns: Option<(u32, u32)>,
}

impl SetupPlan {
    /// Whether a root mounted and a zygote confined for `self` serve `other` as they are: the
    /// same layers (by name: init also checks that each is still the same directory), disk,
    /// read-only paths and confinement of commands. Where the sandbox lives, its host name and
    /// the commands' default environment may differ (init sets the host name at every setup;
    /// the environment goes with each command).
    pub fn same_root_and_confinement(&self, other: &SetupPlan) -> bool {
        // Every field named, so that a new one is sorted into one side or the other.
        let SetupPlan {
            sandbox_dir: _,
            cgroup_join: _,
            hostname: _,
            env: _,
            lowers,
            disk_bytes,
            disk_inodes,
            readonly_paths,
            keep_caps,
            seccomp,
            landlock,
            nofile,
            userns,
        } = self;
        *lowers == other.lowers
            && *disk_bytes == other.disk_bytes
            && *disk_inodes == other.disk_inodes
            && *readonly_paths == other.readonly_paths
            && *keep_caps == other.keep_caps
            && *seccomp == other.seccomp
            && *landlock == other.landlock
            && *nofile == other.nofile
            && *userns == other.userns
    }
}

/// A request to init.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    Setup(Box<SetupPlan>),
    Exec(Box<ExecRequest>),
    ReadFile {
        path: String,
        max_bytes: u64,
        /// Refuse a final symlink (`O_NOFOLLOW`) instead of following it (in the root).
        #[serde(default)]
        nofollow: bool,
    },
    WriteFile {
        path: String,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        mode: u32,
    },
    Stat {
        path: String,
    },
    ListDir {
        path: String,
    },
    /// A directory's first `max_entries` names and kinds and the disk usage ([`Overview`]).
    Overview {
        path: String,
        max_entries: u32,
    },
    /// Kill every process but init.
    KillAll,
    /// Kill every process but init and revert the filesystem to the base layers.
    Reset,
    /// [`Request::Reset`], then `looks` (at most [`MAX_LOOKS`]) answered on the fresh state,
    /// in a [`Response::Answers`] (empty where they did not fit in the reply's frame).
    ResetAndLook {
        looks: Vec<Look>,
    },
    /// Freeze the current diff into a new read-only layer; returns its number.
    Snapshot,
    /// Kill every process but init and return the filesystem to snapshot `n`.
    Rollback {
        snapshot: u32,
    },
    Health,
    Shutdown,
    /// Only first, and only from the runtime's reserve of inits; answered `Ok` when done (an
    /// init that answers `Failed` exits).
    Prepare(Box<PreparePlan>),
}

/// Kinds of failure init reports, so callers can tell the agent's errors from infrastructure ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The request named something that does not exist (file, snapshot, program).
    NotFound,
    /// The request was malformed (relative path, bad argument).
    Invalid,
    /// Permission denied inside the sandbox.
    Denied,
    /// The command could not be started (exec failed).
    Spawn,
    /// Init itself failed (mount, fork, ...): the sandbox is unusable.
    Internal,
}

/// How an error names the kind of failure ("not found: ...").
impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NotFound => "not found",
            Self::Invalid => "invalid request",
            Self::Denied => "permission denied",
            Self::Spawn => "cannot start",
            Self::Internal => "sandbox init failed",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    SetUp(SetUp),
    Exec(Box<ExecResult>),
    File {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        truncated: bool,
    },
    Stat(FileStat),
    Dir(Vec<DirEntry>),
    Snapshot(u32),
    Health(Health),
    Overview(Overview),
    /// The answers to [`Request::ResetAndLook`]'s looks, in order.
    Answers(Vec<Response>),
    Failed {
        kind: FailureKind,
        message: String,
    },
}

/// Write one frame.
pub fn write_frame<T: Serialize>(
    w: &mut impl Write,
    what: &'static str,
    msg: &T,
) -> Result<(), ProtocolError> {
    let body = rmp_serde::to_vec_named(msg).map_err(|e| ProtocolError::Encode {
        what,
        reason: e.to_string(),
    })?;
    if body.len() > MAX_FRAME {
        return Err(ProtocolError::TooLarge { len: body.len() });
    }
    let mut buf = Vec::with_capacity(body.len() + 4);
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    Ok(())
}

/// Read one frame; `Closed` on a clean end of stream before a frame starts.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    what: &'static str,
) -> Result<T, ProtocolError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(ProtocolError::Closed)
        }
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge { len });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    rmp_serde::from_slice(&body).map_err(|e| ProtocolError::Decode {
        what,
        len,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> SetupPlan {
        SetupPlan {
            sandbox_dir: "/run/s1".into(),
            cgroup_join: vec!["/cg/s1/cgroup.procs".into()],
            lowers: vec!["/mask".into(), "/".into()],
            disk_bytes: 64 << 20,
            disk_inodes: None,
            readonly_paths: Vec::new(),
            hostname: "sandbox".into(),
            env: vec!["PATH=/bin".into()],
            keep_caps: vec![0, 1],
            seccomp: Some(crate::seccomp::CompiledSeccomp {
                programs: vec![vec![(6, 0, 0, 0x7fff_0000)]],
            }),
            landlock: true,
            nofile: 1024,
            userns: None,
        }
    }

    #[test]
    fn a_root_made_ahead_serves_only_a_plan_with_the_same_root_and_confinement() {
        let a = plan();
        // Where it lives, its host name and the default environment may differ.
        let mut b = plan();
        b.sandbox_dir = "/run/s2".into();
        b.cgroup_join = vec!["/cg/s2/cgroup.procs".into()];
        b.hostname = "other".into();
        b.env = vec!["PATH=/usr/bin".into(), "X=1".into()];
        assert!(a.same_root_and_confinement(&b));
        // Anything of the root or of the commands' confinement may not.
        type Change = (&'static str, fn(&mut SetupPlan));
        let changes: Vec<Change> = vec![
            ("lowers", |p| p.lowers.insert(0, "/extra".into())),
            ("disk_bytes", |p| p.disk_bytes += 1),
            ("disk_inodes", |p| p.disk_inodes = Some(100)),
            ("readonly_paths", |p| p.readonly_paths.push("/etc".into())),
            ("keep_caps", |p| p.keep_caps.push(2)),
            ("seccomp", |p| p.seccomp = None),
            ("seccomp program", |p| {
                p.seccomp.as_mut().unwrap().programs[0][0].3 = 0
            }),
            ("landlock", |p| p.landlock = false),
            ("nofile", |p| p.nofile = 64),
            ("userns", |p| p.userns = Some((100_000, 65_536))),
        ];
        for (what, change) in changes {
            let mut c = plan();
            change(&mut c);
            assert!(!a.same_root_and_confinement(&c), "{what} differs");
            assert!(!c.same_root_and_confinement(&a), "{what} differs");
        }
    }

    #[test]
    fn an_epilogue_is_one_quoted_word_of_a_trap_on_the_commands_first_line() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        let text = ExecRequest::shell_text("true &&", Some("echo 'EPI' >&2"));
        assert_eq!(text, r"trap 'echo '\''EPI'\'' >&2' EXIT; true &&");
        // The shell reads the trap as written, and the cut-short command is its syntax error.
        let out = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                &ExecRequest::shell_text("cd /tmp; exit 3", Some("echo \"end $PWD\"")),
            ])
            .output()
            .unwrap();
        assert_eq!(
            (out.status.code(), &out.stdout[..]),
            (Some(3), &b"end /tmp\n"[..])
        );
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", &text])
            .output()
            .unwrap();
        assert_eq!((out.status.code(), out.stdout.is_empty()), (Some(2), true));
        assert!(!String::from_utf8_lossy(&out.stderr).contains("EPI"));
        assert_eq!(ExecRequest::shell_text("ls", None), "ls");
    }

    #[test]
    fn frames_round_trip() {
        let req = Request::Exec(Box::new(ExecRequest {
            stdin: b"abc".to_vec(),
            ..ExecRequest::argv(["ls", "-l"])
        }));
        let mut buf = Vec::new();
        write_frame(&mut buf, "request", &req).unwrap();
        let back: Request = read_frame(&mut buf.as_slice(), "request").unwrap();
        match back {
            Request::Exec(e) => {
                assert_eq!(e.command, Command::Argv(vec!["ls".into(), "-l".into()]));
                assert_eq!(e.stdin, b"abc");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn oversized_and_garbage_frames_are_refused() {
        let mut buf = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(&[0; 16]);
        let err = read_frame::<Request>(&mut buf.as_slice(), "request").unwrap_err();
        assert!(matches!(err, ProtocolError::TooLarge { .. }), "{err}");

        let mut buf = 3u32.to_le_bytes().to_vec();
        buf.extend_from_slice(&[0xc1, 0xc1, 0xc1]);
        let err = read_frame::<Request>(&mut buf.as_slice(), "request").unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot decode a request frame of 3 bytes"),
            "{err}"
        );

        let err = read_frame::<Request>(&mut [].as_slice(), "request").unwrap_err();
        assert!(matches!(err, ProtocolError::Closed));
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        let mut r = ExecResult {
            termination: Termination::Exited(3),
            stdout: vec![],
            stderr: vec![],
            stdout_truncated: false,
            stderr_truncated: false,
            duration_us: 0,
            oom_killed: false,
            pid: 0,
            answers: Vec::new(),
        };
        assert_eq!(r.exit_code(), 3);
        r.termination = Termination::Signaled(9);
        assert_eq!(r.exit_code(), 137);
        r.termination = Termination::TimedOut;
        assert_eq!(r.exit_code(), 124);
    }
}
