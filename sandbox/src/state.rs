//! The state directory, run ids, and the start-up reaper.
//!
//! Everything a run creates is tagged with its run id and recorded under one directory:
//!
//! ```text
//! <state>/layers/<id>/            read-only layers (content-addressed, shared by runs)
//! <state>/digests/<name>.sha256   remembered digests of large host files (`digest_cache`)
//! <state>/runs/<run>/owner        "<pid> <start time>" of the process that owns the run
//! <state>/runs/<run>/hostmask/    tmpfs: the host layer's mask (a mount in the host namespace)
//! <state>/runs/<run>/sbx/<name>/  private directory of one sandbox (a mount point)
//! <state>/runs/<run>/sbx/<name>.init  "<pid> <start time>" of its init
//! /sys/fs/cgroup/<ctrl>/envfactory/<run>/<name>   its cgroups
//! ```
//!
//! A run whose owner is no longer alive is garbage: [`reap`] kills its inits (their pid
//! namespaces die with them, taking every sandbox process along), removes its cgroups,
//! unmounts whatever it left mounted and deletes its directory.

use std::path::{Path, PathBuf};

/// Errors of the state directory.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The default state directory: `$ENVFACTORY_STATE`, else `/var/lib/envfactory`.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("ENVFACTORY_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/envfactory"))
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = crate::sys::read_proc(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `"<pid> <start time>"` of a live process.
pub fn identity(pid: i32) -> String {
    format!("{pid} {}", start_time(pid).unwrap_or(0))
}

/// Whether the process recorded as `"<pid> <start time>"` is still the same live process.
pub fn is_alive(record: &str) -> Option<i32> {
    let mut it = record.split_whitespace();
    let pid: i32 = it.next()?.parse().ok()?;
    let t: u64 = it.next()?.parse().ok()?;
    (start_time(pid) == Some(t)).then_some(pid)
}

/// A fresh run id: time, a per-process counter and the pid, unique on this machine.
pub fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    // Two runtimes of one process may start within the clock's resolution: a counter keeps
    // their ids apart (the pid stays last: the reaper reads it there).
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("r{:x}-{}-{}", nanos, seq, std::process::id())
}

/// `<state>/digests`: digests of host files remembered across runs.
pub fn digest_cache_dir(state: &Path) -> PathBuf {
    state.join("digests")
}

/// Create `<state>/runs/<run>` with its owner record. The directory appears atomically with
/// its owner (built under a dot name, then renamed), so a concurrent reaper never mistakes a
/// run being born for a dead one.
pub fn create_run(state: &Path, run: &str) -> Result<PathBuf, StateError> {
    let runs = state.join("runs");
    std::fs::create_dir_all(&runs).map_err(io(&runs))?;
    std::fs::create_dir_all(state.join("layers")).map_err(io(state))?;
    let tmp = runs.join(format!(".new-{run}"));
    std::fs::create_dir_all(tmp.join("sbx")).map_err(io(&tmp))?;
    let owner = tmp.join("owner");
    std::fs::write(&owner, identity(std::process::id() as i32)).map_err(io(&owner))?;
    let dir = runs.join(run);
    std::fs::rename(&tmp, &dir).map_err(io(&dir))?;
    Ok(dir)
}

/// What [`reap`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub runs: Vec<String>,
    pub processes: usize,
    pub mounts: usize,
    pub cgroups: usize,
}

/// Mount points at or below `dir` in this mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = crate::sys::read_proc("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    // Deepest first; a path with two mounts stacked on it (the host mask on its shared mount
    // point) is listed twice, so unmounting each entry once removes both.
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v
}

/// Remove everything of runs whose owner is dead (never the caller's own run).
pub fn reap(state: &Path, cgroup_roots: &[PathBuf], own_run: Option<&str>) -> Reaped {
    let mut out = Reaped::default();
    let runs_dir = state.join("runs");
    let mut dead: Vec<String> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&runs_dir) {
        for e in rd.flatten() {
            let run = e.file_name().to_string_lossy().into_owned();
            if Some(run.as_str()) == own_run {
                continue;
            }
            if let Some(born) = run.strip_prefix(".new-") {
                // A run being created; garbage only if its creator died before the rename.
                let creator = born
                    .rsplit_once('-')
                    .and_then(|(_, p)| p.parse::<i32>().ok());
                if creator.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
                continue;
            }
            let owner = std::fs::read_to_string(e.path().join("owner")).unwrap_or_default();
            if is_alive(&owner).is_none() {
                dead.push(run);
            }
        }
    }
    // Cgroup trees of runs whose state directory is already gone are garbage too.
    for root in cgroup_roots {
        if let Ok(rd) = std::fs::read_dir(root.join(crate::cgroup::TOP)) {
            for e in rd.flatten() {
                let run = e.file_name().to_string_lossy().into_owned();
                // Another state directory may own it: only take it if its creator is gone.
                let creator_alive = run
                    .rsplit_once('-')
                    .and_then(|(_, pid)| pid.parse::<i32>().ok())
                    .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
                // The entry's type from the directory read: no stat of each control file.
                if e.file_type().is_ok_and(|t| t.is_dir())
                    && Some(run.as_str()) != own_run
                    && !runs_dir.join(&run).exists()
                    && !creator_alive
                    && !dead.contains(&run)
                {
                    dead.push(run);
                }
            }
        }
    }
    for run in dead {
        tracing::info!(run = %run, "reaping a run whose owner is gone");
        reap_into(state, cgroup_roots, &run, &mut out);
    }
    out
}

/// Remove everything of one run, whether or not its owner lives: its sandboxes' inits (their
/// pid namespaces take every sandbox process with them), cgroups, mounts and directory. The
/// owner itself calls this from a signal watcher to tear its own run down before it exits.
pub fn reap_run(state: &Path, cgroup_roots: &[PathBuf], run: &str) -> Reaped {
    let mut out = Reaped::default();
    reap_into(state, cgroup_roots, run, &mut out);
    out
}

fn reap_into(state: &Path, cgroup_roots: &[PathBuf], run: &str, out: &mut Reaped) {
    let dir = state.join("runs").join(run);
    // 1. inits: their pid namespaces take every sandbox process with them.
    if let Ok(rd) = std::fs::read_dir(dir.join("sbx")) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "init") {
                let rec = std::fs::read_to_string(e.path()).unwrap_or_default();
                if let Some(pid) = is_alive(&rec) {
                    // SAFETY: kill with integer arguments; identity checked by start time.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    out.processes += 1;
                }
            }
        }
    }
    // 2. cgroups (killing anything still inside).
    for root in cgroup_roots {
        let cg = root.join(crate::cgroup::TOP).join(run);
        if cg.exists() {
            match crate::cgroup::remove(&cg) {
                Ok(()) => out.cgroups += 1,
                Err(e) => tracing::warn!(error = %e, "reaper could not remove a cgroup"),
            }
        }
    }
    // 3. mounts left in the host namespace (the host mask).
    for m in mounts_under(&dir) {
        if nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH).is_ok() {
            out.mounts += 1;
        }
    }
    // 4. the directory.
    if dir.exists() {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(error = %e, dir = %dir.display(), "reaper could not remove a run directory");
        }
    }
    out.runs.push(run.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_detect_pid_reuse() {
        let me = identity(std::process::id() as i32);
        assert_eq!(is_alive(&me), Some(std::process::id() as i32));
        let pid = std::process::id();
        assert_eq!(
            is_alive(&format!("{pid} 1")),
            None,
            "same pid, other start time"
        );
        assert_eq!(is_alive("garbage"), None);
    }

    #[test]
    fn reaper_removes_dead_runs_and_keeps_live_ones() {
        let t = tempfile::tempdir().unwrap();
        let live = create_run(t.path(), "live").unwrap();
        let dead = t.path().join("runs/dead");
        std::fs::create_dir_all(dead.join("sbx/a")).unwrap();
        std::fs::write(dead.join("owner"), "999999999 5").unwrap();
        let fake_cg = t.path().join("cg");
        std::fs::create_dir_all(fake_cg.join("envfactory/orphan-999999999")).unwrap();
        std::fs::create_dir_all(fake_cg.join(format!("envfactory/other-{}", std::process::id())))
            .unwrap();
        let r = reap(t.path(), std::slice::from_ref(&fake_cg), None);
        assert!(r.runs.contains(&"dead".to_string()));
        assert!(r.runs.contains(&"orphan-999999999".to_string()));
        assert!(
            fake_cg
                .join(format!("envfactory/other-{}", std::process::id()))
                .exists(),
            "a live creator's cgroups stay"
        );
        assert!(!dead.exists());
        assert!(!fake_cg.join("envfactory/orphan-999999999").exists());
        assert!(live.exists());
    }
}
