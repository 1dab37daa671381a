//! The host mask's walk of the host ([`crate::layers::plan_host_mask`]) remembered across
//! processes, so that a one-shot process stats what the mask was planned from instead of
//! listing every directory of `/etc` again.
//!
//! What is remembered is the plan the walk gave, beside a check for each thing the listings it
//! read depend on: each listed directory (its change and modification times move whenever an
//! entry is added, removed or renamed, which is the only way an entry's name or type can
//! change) and every entry under `/etc` that is not a symlink (its mode, which decides whether
//! it is hidden; a chmod moves its change time). A check is the device, inode, full mode and
//! both times, taken with `fstatat` relative to the top-level directory the path is under
//! (opened once, so a check is one short lookup). On the next start every check is stat'ed
//! again; a single difference (or a missing path) means the host is walked again. The planner
//! is a function of the listings it reads, so while they are unchanged its plan is the one a
//! fresh walk would give; the entry's key holds the identity of the running program, so a
//! plan made by another build of the planner is never used. Change times cannot be set from
//! user space. A walk that saw a time less than [`crate::digest_cache::SETTLE`] old is not
//! remembered (file times have a coarse clock: a second change within the same tick could
//! keep them).
//! The entry lives in `<state>/digests` under [`crate::digest_cache`]'s trust rules.

use crate::layers::{HostEntry, HostView, LayerError, RealHost};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The cache entry's name (a planner's name follows) and key (the key changes with the format).
const ENTRY: &str = "host-walk.v4";
const KEY: &str = "host-walk-v4 etc-modes by-top-directory plan";

/// Entries under this directory are checked one by one (their modes are the plan's input).
const MODES_UNDER: &str = "/etc";

/// What a check compares: the device, inode, full mode and both times of one path (not
/// followed if it is a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    mode: u32,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(st: &libc::stat) -> Self {
        Self {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        }
    }
}

/// The checks of the paths under one top-level directory of the host: each is stat'ed
/// relative to that directory, opened once (so a check costs one `fstatat` of a short
/// relative path). The directory is opened by its path and the rest of the path is resolved
/// below it, symlinks on the way followed, as a stat of the full path would; only the last
/// component is not followed. Entries of `/` are checked relative to `/`, and `/` itself is
/// its entry `.`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct DirChecks {
    dir: PathBuf,
    entries: Vec<(String, Stamp)>,
}

/// Where a check of `path` is taken: the top-level directory it is under (or `/`), and the
/// rest of the path below that.
fn split(path: &Path) -> Option<(&Path, &str)> {
    if path == Path::new("/") {
        return Some((path, "."));
    }
    let rel = path.strip_prefix("/").ok()?.to_str()?;
    match rel.split_once('/') {
        Some((top, rest)) if !top.is_empty() && !rest.is_empty() => {
            let full = path.to_str()?;
            Some((Path::new(&full[..top.len() + 1]), rest))
        }
        None if !rel.is_empty() => Some((Path::new("/"), rel)),
        _ => None,
    }
}

fn open_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(dir)
}

fn stat_at(dir: &std::fs::File, name: &str) -> std::io::Result<Stamp> {
    nix::sys::stat::fstatat(
        Some(dir.as_raw_fd()),
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map(|st| Stamp::of(&st))
    .map_err(std::io::Error::from)
}

impl DirChecks {
    /// Every entry still as recorded (a missing directory or entry fails).
    fn hold(&self) -> bool {
        let Ok(dir) = open_dir(&self.dir) else {
            return false;
        };
        self.entries
            .iter()
            .all(|(name, want)| stat_at(&dir, name).is_ok_and(|now| now == *want))
    }
}

/// What is remembered: the checks, and the plan they guard.
#[derive(Debug, Serialize, Deserialize)]
struct Memo<T> {
    checks: Vec<DirChecks>,
    plan: T,
}

/// The real host, recording what its answers depended on.
#[derive(Default)]
struct Recording {
    checks: RefCell<Vec<DirChecks>>,
    checked: RefCell<HashSet<PathBuf>>,
    /// Index in `checks` of each directory's group.
    groups: RefCell<HashMap<PathBuf, usize>>,
    /// Some time seen was too recent to be trusted later, or a path cannot be checked.
    racy: RefCell<bool>,
    settled_before: i128,
}

impl Recording {
    fn check(&self, path: &Path) -> Result<(), LayerError> {
        if !self.checked.borrow_mut().insert(path.to_path_buf()) {
            return Ok(());
        }
        let err = |source| LayerError::Host {
            path: path.to_path_buf(),
            source,
        };
        let Some((dir, name)) = split(path) else {
            // A name that is not text cannot be remembered: this walk is not.
            *self.racy.borrow_mut() = true;
            return Ok(());
        };
        let c = stat_at(&open_dir(dir).map_err(err)?, name).map_err(err)?;
        if c.mtime_ns >= self.settled_before || c.ctime_ns >= self.settled_before {
            *self.racy.borrow_mut() = true;
        }
        let mut checks = self.checks.borrow_mut();
        let i = *self
            .groups
            .borrow_mut()
            .entry(dir.to_path_buf())
            .or_insert_with(|| {
                checks.push(DirChecks {
                    dir: dir.to_path_buf(),
                    entries: Vec::new(),
                });
                checks.len() - 1
            });
        checks[i].entries.push((name.to_string(), c));
        Ok(())
    }
}

impl HostView for Recording {
    fn list(&self, dir: &Path) -> Result<Vec<HostEntry>, LayerError> {
        self.check(dir)?;
        let mut entries = RealHost.list(dir)?;
        if dir.starts_with(MODES_UNDER) {
            let mut kept = Vec::with_capacity(entries.len());
            for e in entries {
                if e.is_symlink {
                    kept.push(e);
                    continue;
                }
                match self.check(&dir.join(&e.name)) {
                    Ok(()) => kept.push(e),
                    // Removed since the listing: nothing there to mask. The directory changed
                    // meanwhile, so this walk is not remembered.
                    Err(LayerError::Host { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        *self.racy.borrow_mut() = true;
                    }
                    Err(err) => return Err(err),
                }
            }
            entries = kept;
        }
        Ok(entries)
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// The entry's key: the format, the planner's name, and the identity of the running program
/// (device, inode, size, both times), so that a plan is never taken from another build of the
/// planner. `None` (nothing is remembered) when the program cannot be stat'ed.
fn key(planner: &str) -> Option<String> {
    let exe = std::fs::metadata("/proc/self/exe").ok()?;
    Some(format!(
        "{KEY} {planner} exe {}",
        crate::digest_cache::identity(&exe)
    ))
}

/// The remembered plan in `cache_dir` and its checks, not run yet.
fn load<T: serde::de::DeserializeOwned>(
    cache_dir: &Path,
    entry: &str,
    key: &str,
) -> Option<Memo<T>> {
    let t0 = std::time::Instant::now();
    let bytes = crate::digest_cache::read(cache_dir, entry, key)?;
    let memo: Memo<T> = rmp_serde::from_slice(&bytes).ok()?;
    tracing::debug!(
        read_us = t0.elapsed().as_micros() as u64,
        checks = memo.checks.iter().map(|g| g.entries.len()).sum::<usize>(),
        "remembered host walk read"
    );
    Some(memo)
}

/// Whether the answer came from the remembered walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Remembered,
    Walked,
}

/// The checks of a remembered plan, to be run before anything relies on it (see
/// [`with_host_deferred`]).
#[derive(Debug)]
pub struct Deferred {
    checks: Vec<DirChecks>,
}

impl Deferred {
    /// Every check still holds: the plan is the one a walk of the host would give now.
    pub fn holds(&self) -> bool {
        let t0 = std::time::Instant::now();
        let holds = self.checks.iter().any(|g| !g.entries.is_empty())
            && self.checks.iter().all(DirChecks::hold);
        tracing::debug!(
            check_us = t0.elapsed().as_micros() as u64,
            holds,
            "remembered host walk checked"
        );
        holds
    }
}

/// Run `plan` over the host: `planner` names it (each planner has its own entry). Its answer
/// is the remembered one when every check of the walk it was made from still holds (the
/// planner is a function of the listings it reads, so the answer is the one it would give
/// now), else the planner walks the host afresh, and its answer is remembered for next time
/// when the walk saw nothing too recent.
pub fn with_host<T: Serialize + serde::de::DeserializeOwned>(
    cache_dir: &Path,
    planner: &str,
    plan: impl Fn(&dyn HostView) -> Result<T, LayerError>,
) -> Result<(T, Source), LayerError> {
    match with_host_deferred(cache_dir, planner, &plan)? {
        (out, source, None) => Ok((out, source)),
        (out, source, Some(d)) if d.holds() => Ok((out, source)),
        (_, _, Some(_)) => walk(cache_dir, planner, &plan).map(|out| (out, Source::Walked)),
    }
}

/// [`with_host`] whose checks are left to the caller: a remembered plan comes with them
/// ([`Deferred`]), to be run while the caller does something else with the plan, and the
/// plan must not be relied on (nothing may run on it) unless [`Deferred::holds`] says yes; a
/// walked plan comes with `None`.
pub fn with_host_deferred<T: Serialize + serde::de::DeserializeOwned>(
    cache_dir: &Path,
    planner: &str,
    plan: impl Fn(&dyn HostView) -> Result<T, LayerError>,
) -> Result<(T, Source, Option<Deferred>), LayerError> {
    let entry = format!("{ENTRY}.{planner}");
    if let Some(memo) = key(planner)
        .as_deref()
        .and_then(|k| load::<T>(cache_dir, &entry, k))
    {
        let checks = Deferred {
            checks: memo.checks,
        };
        return Ok((memo.plan, Source::Remembered, Some(checks)));
    }
    walk(cache_dir, planner, plan).map(|out| (out, Source::Walked, None))
}

/// Walk the host for `plan`, remembering the answer unless the walk saw something too recent.
fn walk<T: Serialize>(
    cache_dir: &Path,
    planner: &str,
    plan: impl Fn(&dyn HostView) -> Result<T, LayerError>,
) -> Result<T, LayerError> {
    let rec = Recording {
        settled_before: now_ns() - crate::digest_cache::SETTLE.as_nanos() as i128,
        ..Recording::default()
    };
    let out = plan(&rec)?;
    if let (false, Some(key)) = (*rec.racy.borrow(), key(planner)) {
        let memo = Memo {
            checks: rec.checks.take(),
            plan: &out,
        };
        if let Ok(bytes) = rmp_serde::to_vec(&memo) {
            crate::digest_cache::write(cache_dir, &format!("{ENTRY}.{planner}"), &key, &bytes);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(dir: &Path, names: &[&str]) -> DirChecks {
        let f = open_dir(dir).unwrap();
        DirChecks {
            dir: dir.to_path_buf(),
            entries: names
                .iter()
                .map(|n| (n.to_string(), stat_at(&f, n).unwrap()))
                .collect(),
        }
    }

    #[test]
    fn a_check_fails_when_the_mode_or_the_entries_change() {
        let d = tempfile_dir();
        let f = d.join("f");
        std::fs::write(&f, b"x").unwrap();
        let c = checks(&d, &["f"]);
        assert!(c.hold());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(!c.hold(), "a chmod changes the mode and the change time");
        let (parent, name) = split(&d).unwrap();
        let dir = checks(parent, &[name]);
        assert!(dir.hold());
        // Wait for the coarse clock to move so the directory's times can differ.
        let before = dir.entries[0].1.mtime_ns;
        while now_ns() < before + 20_000_000 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::write(d.join("g"), b"y").unwrap();
        assert!(!dir.hold(), "a new entry changes the directory's times");
        std::fs::remove_dir_all(&d).unwrap();
        assert!(!c.hold(), "a missing path fails");
        assert!(!dir.hold(), "a missing path fails");
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_fails_its_check() {
        let d = tempfile_dir();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::create_dir(d.join("other")).unwrap();
        let c = checks(&d, &["sub"]);
        assert!(c.hold());
        std::fs::remove_dir(d.join("sub")).unwrap();
        std::os::unix::fs::symlink(d.join("other"), d.join("sub")).unwrap();
        assert!(!c.hold(), "the entry is not followed");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_root_is_checked_as_the_dot_of_itself() {
        assert_eq!(split(Path::new("/")), Some((Path::new("/"), ".")));
        assert_eq!(
            split(Path::new("/etc/ssh")),
            Some((Path::new("/etc"), "ssh"))
        );
        assert_eq!(
            split(Path::new("/etc/ssh/moduli")),
            Some((Path::new("/etc"), "ssh/moduli"))
        );
        assert_eq!(split(Path::new("/var")), Some((Path::new("/"), "var")));
        assert_eq!(split(Path::new("relative")), None);
        assert!(checks(Path::new("/"), &["."]).hold());
    }

    #[test]
    fn a_plan_is_remembered_for_its_planner_and_a_torn_entry_is_walked_again() {
        let cache = tempfile_dir();
        let plan = |planner: &str| {
            with_host(&cache, planner, |host| {
                Ok(host
                    .list(Path::new("/"))?
                    .into_iter()
                    .map(|e| e.name)
                    .collect::<Vec<_>>())
            })
            .unwrap()
        };
        let (names, first) = plan("a");
        assert_eq!(first, Source::Walked);
        assert_eq!(
            plan("b").1,
            Source::Walked,
            "each planner has its own entry"
        );
        // Whether the walk was remembered depends on `/` having settled.
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata("/").unwrap();
        let changed = (m.ctime().max(m.mtime()) as i128) * 1_000_000_000;
        if changed + 1_000_000_000 < now_ns() - crate::digest_cache::SETTLE.as_nanos() as i128 {
            assert_eq!(plan("a"), (names.clone(), Source::Remembered));
            let entry = cache.join(format!("{ENTRY}.a"));
            let bytes = std::fs::read(&entry).unwrap();
            std::fs::write(&entry, &bytes[..bytes.len() / 2]).unwrap();
            assert_eq!(
                plan("a"),
                (names, Source::Walked),
                "a torn entry is not used"
            );
        }
        std::fs::remove_dir_all(&cache).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "envfactory-host-walk-{}-{}-{}",
            std::process::id(),
            now_ns(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
