//! The content-addressed, bounded, lock-safe instance cache on its own tmpfs.

use super::{build, SynthError};
use crate::instance::{instance_id, BaseView, Instance, Plan};
use sandbox::layers::Rootfs;
use serde::Serialize;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Default bounds of the instance cache.
pub const DEFAULT_CACHE_ENTRIES: usize = 256;
pub const DEFAULT_CACHE_BYTES: u64 = 512 << 20;

/// The content-addressed, bounded instance cache on its own tmpfs.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    max_entries: usize,
    max_bytes: u64,
    /// Set for a temporary cache: its tmpfs and directory go with the last clone.
    _temporary: Option<std::sync::Arc<TemporaryDir>>,
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
        Ok(Self {
            dir,
            max_entries,
            max_bytes,
            _temporary: None,
        })
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
        touch(&held);
        self.evict(Some(&id))?;
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
        touch(&file);
        Ok(Some(PinnedInstance {
            instance,
            origin: Origin::Cached,
            _lock: file,
        }))
    }

    /// Remove least recently used entries until the bounds hold; held entries and `keep` stay.
    /// A hold is a `flock` on the manifest's open file description, which a process forked by
    /// another thread shares until it execs (the sandbox's clone of its init): for that moment
    /// the entry counts as held and the next oldest goes instead, so under concurrency the order
    /// is least-recently-used but for entries being held or just released.
    fn evict(&self, keep: Option<&str>) -> Result<(), SynthError> {
        let mut entries: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
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
            entries.push((
                m.modified().unwrap_or(std::time::UNIX_EPOCH),
                id.to_string(),
                bytes,
            ));
        }
        entries.sort();
        let mut count = entries.len();
        let mut bytes: u64 = entries.iter().map(|e| e.2).sum();
        for (_, id, b) in entries {
            if count <= self.max_entries && bytes <= self.max_bytes {
                break;
            }
            if Some(id.as_str()) == keep {
                continue;
            }
            let m = self.manifest(&id);
            let Ok(f) = std::fs::File::open(&m) else {
                continue;
            };
            if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_err() {
                continue; // in use
            }
            let _ = std::fs::remove_file(&m);
            let _ = std::fs::remove_file(self.dir.join(format!("{id}.cert.json")));
            drop(f);
            let _ = std::fs::remove_dir_all(self.dir.join(&id));
            count -= 1;
            bytes = bytes.saturating_sub(b);
            tracing::debug!(instance = %id, "evicted from the instance cache");
        }
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

/// Mark a manifest as used now. Least recently used = oldest manifest mtime; a failure only
/// makes the entry look older, which is harmless.
fn touch(manifest: &std::fs::File) {
    let _ = manifest.set_modified(std::time::SystemTime::now());
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
