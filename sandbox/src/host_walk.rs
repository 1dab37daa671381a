//! The host mask's walk of the host ([`crate::layers::plan_host_mask`]) remembered across
//! processes, so that a one-shot process stats what the mask was planned from instead of
//! listing every directory of `/etc` again.
//!
//! What is remembered is the walk's *input*: every directory listing the planner asked for,
//! beside a check for each thing that listing depends on: each listed directory (its change
//! and modification times move whenever an entry is added, removed or renamed, which is the
//! only way an entry's name or type can change) and every entry under `/etc` that is not a
//! symlink (its mode, which decides whether it is hidden; a chmod moves its change time). A
//! check is the device, inode, full mode and both times. On the next start every check is
//! stat'ed again; a single difference (or a missing path) means the host is walked again, and
//! the plan is then made from the same listings by the same code either way, so the mask is
//! exactly the one a fresh walk would give. Change times cannot be set from user space.
//! A walk that saw a time less than [`crate::digest_cache::SETTLE`] old is not remembered
//! (file times have a coarse clock: a second change within the same tick could keep them).
//! The entry lives in `<state>/digests` under [`crate::digest_cache`]'s trust rules.

use crate::layers::{HostEntry, HostView, LayerError, RealHost};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The cache entry's name and key (the key changes with the format or the planner's input).
const ENTRY: &str = "host-walk.v2";
const KEY: &str = "host-walk-v2 etc-modes";

/// Entries under this directory are checked one by one (their modes are the plan's input).
const MODES_UNDER: &str = "/etc";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Check {
    path: PathBuf,
    dev: u64,
    ino: u64,
    mode: u32,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Check {
    fn of(path: &Path, m: &std::fs::Metadata) -> Self {
        Self {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            mode: m.mode(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        }
    }

    /// Still true of the host now (the path is not followed if it is a symlink).
    fn holds(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| Check::of(&self.path, &m) == *self)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Walk {
    listings: Vec<(PathBuf, Vec<HostEntry>)>,
    checks: Vec<Check>,
}

/// Listings answered from memory: the remembered walk, or a walk just made.
pub struct Remembered {
    listings: HashMap<PathBuf, Vec<HostEntry>>,
}

impl HostView for Remembered {
    fn list(&self, dir: &Path) -> Result<Vec<HostEntry>, LayerError> {
        self.listings
            .get(dir)
            .cloned()
            .ok_or_else(|| LayerError::Host {
                path: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not in the walk"),
            })
    }
}

/// The real host, recording what it answered and what that depended on.
#[derive(Default)]
struct Recording {
    walk: RefCell<Walk>,
    checked: RefCell<HashSet<PathBuf>>,
    /// Some time seen was too recent to be trusted later.
    racy: RefCell<bool>,
    settled_before: i128,
}

impl Recording {
    fn check(&self, path: &Path) -> Result<(), LayerError> {
        if !self.checked.borrow_mut().insert(path.to_path_buf()) {
            return Ok(());
        }
        let m = std::fs::symlink_metadata(path).map_err(|source| LayerError::Host {
            path: path.to_path_buf(),
            source,
        })?;
        let c = Check::of(path, &m);
        if c.mtime_ns >= self.settled_before || c.ctime_ns >= self.settled_before {
            *self.racy.borrow_mut() = true;
        }
        self.walk.borrow_mut().checks.push(c);
        Ok(())
    }
}

impl HostView for Recording {
    fn list(&self, dir: &Path) -> Result<Vec<HostEntry>, LayerError> {
        self.check(dir)?;
        let entries = RealHost.list(dir)?;
        if dir.starts_with(MODES_UNDER) {
            for e in entries.iter().filter(|e| !e.is_symlink) {
                self.check(&dir.join(&e.name))?;
            }
        }
        self.walk
            .borrow_mut()
            .listings
            .push((dir.to_path_buf(), entries.clone()));
        Ok(entries)
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// The remembered walk in `cache_dir` if every check still holds.
fn remembered(cache_dir: &Path) -> Option<Walk> {
    let bytes = crate::digest_cache::read(cache_dir, ENTRY, KEY)?;
    let walk: Walk = rmp_serde::from_slice(&bytes).ok()?;
    if walk.checks.is_empty() || !walk.checks.iter().all(Check::holds) {
        return None;
    }
    Some(walk)
}

/// Whether the answer came from the remembered walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Remembered,
    Walked,
}

/// Run `plan` over the host's listings: the remembered ones when every check still holds,
/// else a fresh walk (remembered for next time when it saw nothing too recent).
pub fn with_host<T>(
    cache_dir: &Path,
    plan: impl Fn(&dyn HostView) -> Result<T, LayerError>,
) -> Result<(T, Source), LayerError> {
    if let Some(walk) = remembered(cache_dir) {
        let host = Remembered {
            listings: walk.listings.into_iter().collect(),
        };
        // A remembered walk that does not answer every listing the planner asks for is
        // not used (it cannot happen for a walk recorded by the same planner).
        if let Ok(out) = plan(&host) {
            return Ok((out, Source::Remembered));
        }
    }
    let rec = Recording {
        settled_before: now_ns() - crate::digest_cache::SETTLE.as_nanos() as i128,
        ..Recording::default()
    };
    let out = plan(&rec)?;
    if !*rec.racy.borrow() {
        if let Ok(bytes) = rmp_serde::to_vec(&*rec.walk.borrow()) {
            crate::digest_cache::write(cache_dir, ENTRY, KEY, &bytes);
        }
    }
    Ok((out, Source::Walked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_fails_when_the_mode_or_the_entries_change() {
        let d = tempfile_dir();
        let f = d.join("f");
        std::fs::write(&f, b"x").unwrap();
        let c = Check::of(&f, &std::fs::symlink_metadata(&f).unwrap());
        assert!(c.holds());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(!c.holds(), "a chmod changes the mode and the change time");
        let dir = Check::of(&d, &std::fs::symlink_metadata(&d).unwrap());
        // Wait for the coarse clock to move so the directory's times can differ.
        let before = dir.mtime_ns;
        while now_ns() < before + 20_000_000 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::write(d.join("g"), b"y").unwrap();
        assert!(!dir.holds(), "a new entry changes the directory's times");
        std::fs::remove_dir_all(&d).unwrap();
        assert!(!c.holds(), "a missing path fails");
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "envfactory-host-walk-{}-{}",
            std::process::id(),
            now_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
