//! The content-addressed, bounded, lock-safe instance cache on its own tmpfs.
//!
//! Eviction is least-recently-used over an in-memory index (ordered by use time), so a build
//! costs O(log n) in the number of cached entries rather than a walk of the cache. The index
//! is read from the manifests at the first build and re-read only when another process built
//! in between (every build bumps a counter in `.generation` under the build lock). Use times
//! written by other processes are seen when an entry comes up for eviction (its manifest's
//! mtime is checked then).
//! Opening the cache also removes what a crashed build left (`.tmp-*`), under the build lock.

use super::{build, SynthError};
use crate::instance::{instance_id, BaseView, Instance, Plan};
use sandbox::layers::Rootfs;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Default bounds of the instance cache.
pub const DEFAULT_CACHE_ENTRIES: usize = 256;
pub const DEFAULT_CACHE_BYTES: u64 = 512 << 20;

/// The content-addressed, bounded instance cache on its own tmpfs.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    max_entries: usize,
    max_bytes: u64,
    index: Arc<Mutex<Index>>,
    /// Set for a temporary cache: its tmpfs and directory go with the last clone.
    _temporary: Option<std::sync::Arc<TemporaryDir>>,
}

/// The entries of the cache by use time, as this process knows them.
#[derive(Debug, Default)]
struct Index {
    by_use: BTreeSet<(SystemTime, String)>,
    entries: HashMap<String, (SystemTime, u64)>,
    bytes: u64,
    /// The build generation the index is in step with (`None`: read the manifests first).
    generation: Option<u64>,
}

impl Index {
    fn insert(&mut self, id: &str, used: SystemTime, bytes: u64) {
        self.remove(id);
        self.by_use.insert((used, id.to_string()));
        self.entries.insert(id.to_string(), (used, bytes));
        self.bytes += bytes;
    }
    fn remove(&mut self, id: &str) {
        if let Some((used, bytes)) = self.entries.remove(id) {
            self.by_use.remove(&(used, id.to_string()));
            self.bytes = self.bytes.saturating_sub(bytes);
        }
    }
    fn touch(&mut self, id: &str, used: SystemTime) {
        if let Some(&(_, bytes)) = self.entries.get(id) {
            self.insert(id, used, bytes);
        }
    }
}

/// The state directory of a temporary cache; unmounts the cache's tmpfs when dropped.
#[derive(Debug)]
struct TemporaryDir {
    dir: tempfile::TempDir,
}

impl Drop for TemporaryDir {
    fn drop(&mut self) {
        let _ = remove_cache(self.dir.path());
    }
}

/// Unmount and forget the instance cache of a state directory (`engine reap --cache`).
/// Returns whether a cache was mounted there.
pub fn remove_cache(state: &Path) -> Result<bool, SynthError> {
    let dir = state.join("instances");
    if !is_mountpoint(&dir) {
        return Ok(false);
    }
    nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH).map_err(|e| SynthError::Cache {
        path: dir.clone(),
        source: e.into(),
    })?;
    let _ = std::fs::remove_dir(&dir);
    Ok(true)
}

/// Where a synthesis came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Origin {
    Cached,
    Built,
}

/// A held instance: its layer will not be evicted while this lives.
#[derive(Debug)]
pub struct PinnedInstance {
    pub instance: Instance,
    pub origin: Origin,
    _lock: std::fs::File,
}

impl Cache {
    /// Open (mounting its tmpfs when needed) the cache under a state directory.
    pub fn open(state: &Path) -> Result<Self, SynthError> {
        Self::open_with(state, DEFAULT_CACHE_ENTRIES, DEFAULT_CACHE_BYTES)
    }

    pub fn open_with(state: &Path, max_entries: usize, max_bytes: u64) -> Result<Self, SynthError> {
        let dir = state.join("instances");
        let cerr = |source| SynthError::Cache {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(cerr)?;
        if !is_mountpoint(&dir) {
            let lock = lock_file(&state.join("instances.lock"), true).map_err(cerr)?;
            if !is_mountpoint(&dir) {
                // Sized generously: tmpfs only uses what is written; eviction keeps it bounded.
                let size = format!(
                    "mode=0755,size={}",
                    max_bytes.saturating_mul(2).max(64 << 20)
                );
                nix::mount::mount(
                    Some("envfactory-instances"),
                    &dir,
                    Some("tmpfs"),
                    nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                    Some(size.as_str()),
                )
                .map_err(|e| cerr(std::io::Error::from(e)))?;
            }
            drop(lock);
        }
        let c = Self {
            dir,
            max_entries,
            max_bytes,
            index: Arc::default(),
            _temporary: None,
        };
        c.remove_partial_builds()?;
        Ok(c)
    }

    /// Remove the `.tmp-*` layers and manifests of builds that crashed: under the build lock,
    /// no build is in progress, so every one of them is garbage.
    fn remove_partial_builds(&self) -> Result<(), SynthError> {
        let cerr = |source| SynthError::Cache {
            path: self.dir.clone(),
            source,
        };
        let lock = lock_file(&self.dir.join(".lock"), true).map_err(cerr)?;
        let rd = std::fs::read_dir(&self.dir).map_err(cerr)?;
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                let p = e.path();
                let r = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                match r {
                    Ok(()) => {
                        tracing::info!(path = %p.display(), "removed a crashed build's partial layer")
                    }
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "could not remove a crashed build's partial layer")
                    }
                }
            }
        }
        drop(lock);
        Ok(())
    }

    /// A private, empty cache in a temporary directory: its tmpfs is unmounted and the
    /// directory removed when the last clone is dropped (tests, benchmarks).
    pub fn temporary() -> Result<Self, SynthError> {
        let dir = tempfile::tempdir().map_err(|source| SynthError::Cache {
            path: std::env::temp_dir(),
            source,
        })?;
        let guard = std::sync::Arc::new(TemporaryDir { dir });
        let mut c = Self::open(guard.dir.path())?;
        c._temporary = Some(guard);
        Ok(c)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn manifest(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Synthesize (or find) the instance of a plan on a resolved base.
    pub fn get_or_build(&self, plan: &Plan, rootfs: &Rootfs) -> Result<PinnedInstance, SynthError> {
        let id = instance_id(plan, &rootfs.digest);
        if let Some(h) = self.lookup(&id)? {
            return Ok(h);
        }
        let cerr = |source| SynthError::Cache {
            path: self.dir.clone(),
            source,
        };
        let lock = lock_file(&self.dir.join(".lock"), true).map_err(cerr)?;
        if let Some(h) = self.lookup(&id)? {
            return Ok(h);
        }
        self.sync_index()?;
        let base = BaseView::new(rootfs);
        let (layer, runtime, task, applied) = build(plan, &base)?;
        let tmp = self.dir.join(format!(".tmp-{id}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        if let Err(e) = layer.materialize(&tmp, &base) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e.into());
        }
        let layer_dir = self.dir.join(&id);
        // A layer without a readable manifest (a crash between the two renames, a torn
        // manifest) is rebuilt: nobody can hold it, since holding needs the manifest.
        if layer_dir.exists() {
            let _ = std::fs::remove_dir_all(&layer_dir);
        }
        std::fs::rename(&tmp, &layer_dir).map_err(cerr)?;
        let instance = Instance {
            id: id.clone(),
            plan: plan.clone(),
            base_digest: rootfs.digest.clone(),
            layer: layer_dir,
            runtime,
            task,
            applied,
            layer_bytes: layer.bytes(),
        };
        let json = serde_json::to_vec_pretty(&instance).map_err(|e| cerr(e.into()))?;
        let mtmp = self.dir.join(format!(".tmp-{id}.json"));
        std::fs::write(&mtmp, json).map_err(cerr)?;
        std::fs::rename(&mtmp, self.manifest(&id)).map_err(cerr)?;
        // PinnedInstance before the build lock goes, so no eviction can come in between.
        let held = std::fs::File::open(self.manifest(&id)).map_err(cerr)?;
        flock(&held, libc::LOCK_SH).map_err(cerr)?;
        // Use time on the fine clock, as `lookup` does: the mtime a write leaves comes from
        // the kernel's coarse clock (a jiffy behind), which could rank this new entry older
        // than one looked up a moment before it.
        let used = touch(&held);
        self.evict(&id, used, instance.layer_bytes)?;
        drop(lock);
        tracing::debug!(instance = %id, bytes = instance.layer_bytes, "instance synthesized");
        Ok(PinnedInstance {
            instance,
            origin: Origin::Built,
            _lock: held,
        })
    }

    /// A cached instance, held.
    pub fn lookup(&self, id: &str) -> Result<Option<PinnedInstance>, SynthError> {
        let m = self.manifest(id);
        let file = match std::fs::File::open(&m) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SynthError::Cache { path: m, source }),
        };
        // Shared lock: eviction (exclusive, non-blocking) skips held entries.
        if flock(&file, libc::LOCK_SH).is_err() {
            return Ok(None);
        }
        // The lock must be on the current manifest: an eviction may have removed (and a build
        // recreated) it between the open and the lock.
        let same = match (file.metadata(), std::fs::metadata(&m)) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        };
        if !same {
            return Ok(None);
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut text).map_err(|source| SynthError::Cache {
            path: m.clone(),
            source,
        })?;
        let instance: Instance = match serde_json::from_slice(&text) {
            Ok(i) => i,
            Err(_) => return Ok(None), // a torn or old manifest: rebuild
        };
        if !instance.layer.is_dir() {
            return Ok(None);
        }
        let used = touch(&file);
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .touch(id, used);
        Ok(Some(PinnedInstance {
            instance,
            origin: Origin::Cached,
            _lock: file,
        }))
    }

    /// Record the new entry `keep` and remove least recently used entries until the bounds
    /// hold; held entries and `keep` stay. Called under the build lock.
    /// A hold is a `flock` on the manifest's open file description, which a process forked by
    /// another thread shares until it execs (the sandbox's clone of its init): for that moment
    /// the entry counts as held and the next oldest goes instead, so under concurrency the order
    /// is least-recently-used but for entries being held or just released.
    fn evict(&self, keep: &str, used: SystemTime, bytes: u64) -> Result<(), SynthError> {
        let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
        idx.insert(keep, used, bytes);
        let mut passed = Vec::new();
        while idx.entries.len() > self.max_entries || idx.bytes > self.max_bytes {
            let Some((when, id)) = idx.by_use.pop_first() else {
                break;
            };
            let Some(&(_, b)) = idx.entries.get(&id) else {
                continue;
            };
            if id == keep {
                passed.push((when, id, b));
                continue;
            }
            let m = self.manifest(&id);
            let Ok(f) = std::fs::File::open(&m) else {
                // Gone already (another process evicted it).
                idx.entries.remove(&id);
                idx.bytes = idx.bytes.saturating_sub(b);
                continue;
            };
            // Another process may have used it since the index learnt its time.
            if let Ok(t) = f.metadata().and_then(|m| m.modified()) {
                if t > when {
                    idx.by_use.insert((t, id.clone()));
                    if let Some(e) = idx.entries.get_mut(&id) {
                        e.0 = t;
                    }
                    continue;
                }
            }
            if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_err() {
                passed.push((when, id, b)); // in use
                continue;
            }
            let _ = std::fs::remove_file(&m);
            let _ = std::fs::remove_file(self.dir.join(format!("{id}.cert.json")));
            drop(f);
            let _ = std::fs::remove_dir_all(self.dir.join(&id));
            idx.entries.remove(&id);
            idx.bytes = idx.bytes.saturating_sub(b);
            tracing::debug!(instance = %id, "evicted from the instance cache");
        }
        for (when, id, _) in passed {
            idx.by_use.insert((when, id));
        }
        idx.generation = Some(self.bump_generation(idx.generation.unwrap_or(0)));
        Ok(())
    }

    /// Under the build lock, before this build changes the directory: re-read the index when
    /// another process built since this one last did.
    fn sync_index(&self) -> Result<(), SynthError> {
        let mut idx = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.generation();
        if idx.generation.is_none() || idx.generation != Some(now) {
            self.rescan(&mut idx)?;
            idx.generation = Some(now);
        }
        Ok(())
    }

    /// The build counter of the cache (0 when none was written or it is unreadable, which
    /// only costs a re-read of the index).
    fn generation(&self) -> u64 {
        std::fs::read_to_string(self.dir.join(".generation"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Count one more build (under the build lock); the new generation.
    fn bump_generation(&self, current: u64) -> u64 {
        let next = current.wrapping_add(1);
        if let Err(e) = std::fs::write(self.dir.join(".generation"), next.to_string()) {
            tracing::debug!(error = %e, "could not write the cache generation");
        }
        next
    }

    /// Read the index from the manifests (use time = manifest mtime, size = the layer's).
    fn rescan(&self, idx: &mut Index) -> Result<(), SynthError> {
        *idx = Index::default();
        let rd = std::fs::read_dir(&self.dir).map_err(|source| SynthError::Cache {
            path: self.dir.clone(),
            source,
        })?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if id.starts_with('.') || id.ends_with(".cert") {
                continue;
            }
            let Ok(m) = e.metadata() else { continue };
            let bytes = dir_bytes(&self.dir.join(id));
            idx.insert(id, m.modified().unwrap_or(std::time::UNIX_EPOCH), bytes);
        }
        tracing::debug!(
            entries = idx.entries.len(),
            bytes = idx.bytes,
            "instance cache index read"
        );
        Ok(())
    }

    /// Ids currently cached.
    pub fn ids(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_suffix(".json")
                            .filter(|id| !id.starts_with('.') && !id.ends_with(".cert"))
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// Mark a manifest as used now; the time set. Least recently used = oldest manifest mtime; a
/// failure only makes the entry look older, which is harmless.
fn touch(manifest: &std::fs::File) -> SystemTime {
    let now = SystemTime::now();
    let _ = manifest.set_modified(now);
    now
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

fn is_mountpoint(p: &Path) -> bool {
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(p),
        p.parent().map(std::fs::metadata).transpose(),
    ) else {
        return false;
    };
    b.is_some_and(|b| a.dev() != b.dev())
}

/// `flock(2)` on an open file; the lock lives as long as the file stays open.
fn flock(f: &std::fs::File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock on a descriptor borrowed for the duration of the call.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(f), op) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Open (creating) a file and take a blocking exclusive or shared lock on it; the lock lives as
/// long as the returned file.
fn lock_file(path: &Path, exclusive: bool) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    flock(
        &f,
        if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        },
    )?;
    Ok(f)
}
