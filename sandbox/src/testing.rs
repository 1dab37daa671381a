//! Test support, behind the `testing` feature: the fixtures that this crate's integration
//! tests and the engine's share. Not for production code: every helper panics on failure,
//! which is how a test should fail.
//!
//! ```toml
//! [dev-dependencies]
//! sandbox = { workspace = true, features = ["testing"] }
//! ```
//!
//! Root-only tests start with [`require_root!`](crate::require_root), which skips them (with a
//! message) when not root. Each test owns its [`Runtime`] (see [`runtime_with`]), so whatever
//! it creates is removed when the test ends, by a panic too.

use crate::{ExecRequest, ExecResult, InitProgram, Runtime, Sandbox};
use std::path::Path;
use std::time::{Duration, Instant};

/// Whether the tests run as root (sandboxes need namespaces, mounts and cgroups).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skip the calling test (with a message) when not root: return early from it.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::testing::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

/// Poll `cond` until it holds or `secs` pass (asynchronous kernel work: process exit,
/// reaping); whether it held.
pub fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Run `cmd` with `sh -c` in `sb` (a failure to run it at all panics).
pub fn sh(sb: &mut Sandbox, cmd: &str) -> ExecResult {
    sb.exec(&ExecRequest::shell(cmd))
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// A command's standard output, as text.
pub fn out(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// The host files of a minimal runnable root (x86-64 Debian paths): dash as `/bin/sh`, cat, and
/// the loader and libc they need, as (host path, path in the root).
pub const MINIMAL_ROOT: &[(&str, &str)] = &[
    ("/bin/dash", "bin/sh"),
    ("/usr/bin/cat", "bin/cat"),
    (
        "/lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libc.so.6",
    ),
    ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
];

/// Shell lines that copy [`MINIMAL_ROOT`] under the directory in `$VAR` (`var` names it).
pub fn minimal_root_copies(var: &str) -> String {
    MINIMAL_ROOT
        .iter()
        .map(|(host, inside)| {
            format!("mkdir -p \"${var}/$(dirname {inside})\"; cp {host} \"${var}/{inside}\"\n")
        })
        .collect()
}

/// The pids of the host's processes whose command line starts with `prefix` (a test's own
/// marked processes, `exec -a MARK ...`).
pub fn pids_with_cmdline_prefix(prefix: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|p| {
                    let pid = p.file_name().to_str()?.parse::<i32>().ok()?;
                    let cmd = std::fs::read(p.path().join("cmdline")).ok()?;
                    cmd.starts_with(prefix.as_bytes()).then_some(pid)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The lines of `/proc/<pid>/status` that describe a process's credentials, capabilities,
/// confinement and signal state, in the file's order.
pub fn confinement_status(pid: u32) -> Vec<String> {
    const KEYS: [&str; 14] = [
        "Umask",
        "Uid",
        "Gid",
        "Groups",
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
        "NoNewPrivs",
        "Seccomp",
        "SigBlk",
        "SigIgn",
        "SigCgt",
    ];
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"))
        .lines()
        .filter(|l| KEYS.iter().any(|k| l.split(':').next() == Some(k)))
        .map(str::to_string)
        .collect()
}

/// Whether `needle` is in any readable mapping of process `pid` (read as root through
/// `/proc/<pid>/mem`; a mapping that cannot be read is skipped).
pub fn memory_holds(pid: u32, needle: &[u8]) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/maps: {e}"));
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap_or_else(|e| panic!("opening /proc/{pid}/mem: {e}"));
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            panic!("a line of /proc/{pid}/maps without range and permissions: {line:?}");
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let address = |h: &str| {
            u64::from_str_radix(h, 16)
                .unwrap_or_else(|e| panic!("an address in /proc/{pid}/maps: {h:?}: {e}"))
        };
        let Some((a, b)) = range.split_once('-').map(|(a, b)| (address(a), address(b))) else {
            panic!("a range in /proc/{pid}/maps: {range:?}");
        };
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        if buf.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
    }
    false
}

/// A fresh runtime over the default state directory ([`crate::state::default_state_dir`])
/// with `init` as PID 1; dropping it removes what it created.
pub fn runtime_with(init: InitProgram) -> Runtime {
    Runtime::new(&crate::state::default_state_dir(), init)
        .unwrap_or_else(|e| panic!("starting a sandbox runtime: {e}"))
}

/// A private tmpfs (16 MiB) in a fresh temporary directory, unmounted when dropped, by a
/// panic too. For a layer: overlayfs refuses a layer nested in the host's `/`, which the
/// `host` base uses as a layer.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mount it (needs root).
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("creating a temp dir: {e}"));
        nix::mount::mount(
            Some("t"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=16m"),
        )
        .unwrap_or_else(|e| panic!("mounting a tmpfs on {}: {e}", dir.path().display()));
        Self { dir }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for Tmpfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventually_polls_until_the_condition_holds_or_time_runs_out() {
        let mut n = 0;
        assert!(eventually(5, || {
            n += 1;
            n == 3
        }));
        assert_eq!(n, 3);
        assert!(!eventually(0, || false));
    }

    #[test]
    fn a_tmpfs_is_mounted_until_dropped() {
        crate::require_root!();
        let t = Tmpfs::new();
        let path = t.path().to_path_buf();
        let mounted = |p: &Path| crate::state::mounts_under(p).contains(&p.to_path_buf());
        assert!(mounted(&path), "{}", path.display());
        std::fs::write(path.join("f"), b"x").unwrap();
        drop(t);
        assert!(!mounted(&path));
        assert!(!path.exists(), "the directory goes too");
    }
}
