//! Synthesis: a plan (base rootfs, task and seed, perturbations with parameters, seed) becomes a
//! content-addressed instance: one read-only layer directory stacked above the base, plus the
//! runtime settings that a layer cannot hold (environment, limits, processes started at every
//! episode start, fault proxies).
//!
//! Pipeline: [`Plan`] -> [`instance_id`] (sha256 of catalogue version, base digest, plan) ->
//! cache hit? ready : run the task's setup and every perturbation on a [`Builder`] (which reads
//! the base through [`BaseView`]) -> [`Layer::materialize`] into a temporary directory ->
//! rename into the cache. Same input, same id, same bytes (fixed mtimes, sorted writes).
//!
//! The cache lives on its own tmpfs (`<state>/instances`): overlayfs refuses a layer nested in
//! another layer, and the `host` base uses `/` itself as a layer. It is bounded (entries and
//! bytes, least recently used evicted first) and safe under concurrency: a build holds an
//! exclusive lock on the cache's lock file, users hold a shared lock on the entry they run.

use crate::perturb::{self, Params, PerturbError};
use crate::tasks::{self, TaskSetup};
use rand::SeedableRng;
use sandbox::layers::Rootfs;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bumped whenever a perturbation or task changes what it builds, or a task's oracle or
/// verifier changes: old instance ids die with it, and so do their certificates.
pub const CATALOGUE_VERSION: u32 = 7;

/// Fixed modification time of every file written into a layer (2024-01-01T00:00:00Z).
const LAYER_MTIME: i64 = 1_704_067_200;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("perturbation `{name}`: {source}")]
    Perturb { name: String, source: PerturbError },
    #[error("task `{task}`: {reason}")]
    Task { task: String, reason: String },
    #[error("unknown task `{0}` (known: {known})", known = tasks::names().join(", "))]
    UnknownTask(String),
    #[error("layer path {path:?}: {reason}")]
    BadPath { path: String, reason: String },
    #[error("instance cache {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing the layer at {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
}

// ---------------------------------------------------------------------------------------------
// Plans and instances
// ---------------------------------------------------------------------------------------------

/// One chosen perturbation with its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chosen {
    pub name: String,
    #[serde(default)]
    pub params: Params,
}

/// Resource limits of the instance's sandbox (from the template's `base_environment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: f64,
    pub memory_bytes: u64,
    pub disk_bytes: u64,
    pub pids: u64,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            cpus: 1.0,
            memory_bytes: 256 << 20,
            disk_bytes: 64 << 20,
            pids: 128,
        }
    }
}

/// The task part of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    pub name: String,
    pub seed: u64,
}

/// Everything that determines an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Rootfs source as given to the sandbox (`host`, a directory, `oci:PATH`).
    pub base: String,
    pub task: Option<TaskRef>,
    pub perturbations: Vec<Chosen>,
    pub seed: u64,
    pub resources: Resources,
    /// Tools the template requires in the base (checked at synthesis).
    #[serde(default)]
    pub tools: Vec<String>,
}

impl Plan {
    /// A plan of a task on the `host` base with default resources.
    pub fn for_task(task: &str, seed: u64, perturbations: Vec<Chosen>) -> Self {
        Self {
            base: "host".into(),
            task: Some(TaskRef {
                name: task.into(),
                seed,
            }),
            perturbations,
            seed,
            resources: Resources::default(),
            tools: Vec::new(),
        }
    }
}

/// A process or preparation that must run at every episode start (a reset kills every process
/// and reverts the writable layer). Run in order as `sh -c`; daemons must detach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartStep {
    /// Who asked for it (a perturbation or task name), for error messages.
    pub by: String,
    pub shell: String,
}

/// A fault-injecting TCP proxy run by the engine inside the sandbox's network namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxySpec {
    pub listen_port: u16,
    pub upstream_port: u16,
    pub toxics: crate::perturb::net::Toxics,
}

/// What a layer cannot hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSettings {
    /// Variables set (`Some`) or removed (`None`) in the environment of every command.
    pub env: BTreeMap<String, Option<String>>,
    pub nofile: Option<u64>,
    /// Overrides the template's disk size.
    pub disk_bytes: Option<u64>,
    /// Inodes of the writable layer (`None`: the tmpfs default).
    #[serde(default)]
    pub disk_inodes: Option<u64>,
    /// Paths bound read-only over themselves in the sandbox (writes fail with EROFS).
    #[serde(default)]
    pub readonly: Vec<String>,
    pub start: Vec<StartStep>,
    pub proxies: Vec<ProxySpec>,
    /// Record the processes alive after the start steps at each episode start
    /// (`Probe::start_processes`), for verifiers that must tell them from later ones.
    #[serde(default)]
    pub record_start_processes: bool,
}

impl RuntimeSettings {
    /// The command environment: the sandbox default with this instance's changes applied.
    pub fn apply_env(&self, base: &[String]) -> Vec<String> {
        let mut out: Vec<String> = base
            .iter()
            .filter(|kv| {
                let k = kv.split('=').next().unwrap_or("");
                !self.env.contains_key(k)
            })
            .cloned()
            .collect();
        for (k, v) in &self.env {
            if let Some(v) = v {
                out.push(format!("{k}={v}"));
            }
        }
        out
    }
}

/// A synthesized instance, ready to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub plan: Plan,
    pub base_digest: String,
    /// The read-only layer directory (on the instance cache's tmpfs).
    pub layer: PathBuf,
    pub runtime: RuntimeSettings,
    pub task: Option<TaskSetup>,
    /// What each perturbation did, in order (one line each).
    pub applied: Vec<String>,
    /// Bytes of file data in the layer.
    pub layer_bytes: u64,
}

/// The content address of a plan on a base.
pub fn instance_id(plan: &Plan, base_digest: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(format!("envfactory-instance v{CATALOGUE_VERSION}\n").as_bytes());
    h.update(base_digest.as_bytes());
    h.update(b"\n");
    // serde_json of these plain structs is deterministic (fields in declaration order,
    // BTreeMaps sorted).
    h.update(serde_json::to_vec(plan).unwrap_or_default());
    format!("i-{}", &hex::encode(h.finalize())[..24])
}

/// A seeded generator for one purpose of one instance, independent of the others.
pub fn rng_for(seed: u64, purpose: &str) -> rand_chacha::ChaCha8Rng {
    let mut h = sha2::Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(purpose.as_bytes());
    let d = h.finalize();
    let mut s = [0u8; 32];
    s.copy_from_slice(&d);
    rand_chacha::ChaCha8Rng::from_seed(s)
}

// ---------------------------------------------------------------------------------------------
// Reading the base
// ---------------------------------------------------------------------------------------------

/// Read access to a base root filesystem given as overlay lower layers (topmost first), with
/// overlay semantics: whiteouts hide, opaque directories stop the descent.
#[derive(Debug, Clone)]
pub struct BaseView {
    lowers: Vec<PathBuf>,
}

/// Metadata of a path in the base or the layer under construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub is_dir: bool,
    pub is_symlink: bool,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
}

fn is_whiteout(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_char_device() && m.rdev() == 0
}

fn is_opaque(p: &Path) -> bool {
    sandbox::sys::get_xattr(p, "trusted.overlay.opaque")
        .ok()
        .flatten()
        .is_some_and(|v| v == b"y")
}

impl BaseView {
    pub fn new(rootfs: &Rootfs) -> Self {
        Self {
            lowers: rootfs.lowers.iter().map(PathBuf::from).collect(),
        }
    }

    /// A view of plain directories (topmost first), for tests and fingerprints.
    pub fn from_dirs(lowers: Vec<PathBuf>) -> Self {
        Self { lowers }
    }

    /// The host path that provides `path` (absolute, inside the rootfs), if it exists.
    /// Symlinks are not followed except in the last component (`follow`).
    pub fn locate(&self, path: &str) -> Option<PathBuf> {
        let rel = path.trim_start_matches('/');
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        'layers: for l in &self.lowers {
            let mut cur = l.clone();
            for (i, c) in comps.iter().enumerate() {
                cur.push(c);
                let Ok(m) = std::fs::symlink_metadata(&cur) else {
                    continue 'layers;
                };
                if is_whiteout(&m) {
                    return None;
                }
                if i + 1 < comps.len() {
                    if !m.is_dir() {
                        continue 'layers;
                    }
                    if is_opaque(&cur) {
                        // The rest of the path can only come from this layer.
                        let rest: PathBuf = comps[i + 1..].iter().collect();
                        let p = cur.join(rest);
                        return std::fs::symlink_metadata(&p)
                            .ok()
                            .filter(|m| !is_whiteout(m))
                            .map(|_| p);
                    }
                }
            }
            return Some(cur);
        }
        None
    }

    pub fn meta(&self, path: &str) -> Option<Meta> {
        let p = self.locate(path)?;
        let m = std::fs::symlink_metadata(p).ok()?;
        Some(Meta {
            is_dir: m.is_dir(),
            is_symlink: m.file_type().is_symlink(),
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            size: m.len(),
        })
    }

    pub fn read(&self, path: &str) -> Option<Vec<u8>> {
        let p = self.locate(path)?;
        std::fs::read(p).ok()
    }

    pub fn read_link(&self, path: &str) -> Option<String> {
        let p = self.locate(path)?;
        std::fs::read_link(p)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    }

    /// Names in a directory, merged over the layers (sorted).
    pub fn list(&self, path: &str) -> Vec<String> {
        let rel = path.trim_start_matches('/');
        let mut seen = BTreeSet::new();
        let mut hidden = BTreeSet::new();
        for l in &self.lowers {
            let d = l.join(rel);
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if hidden.contains(&name) || seen.contains(&name) {
                    continue;
                }
                match e.metadata() {
                    Ok(m) if is_whiteout(&m) => {
                        hidden.insert(name);
                    }
                    _ => {
                        seen.insert(name);
                    }
                }
            }
            if is_opaque(&d) {
                break;
            }
        }
        seen.into_iter().collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The layer under construction
// ---------------------------------------------------------------------------------------------

/// One entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    File {
        data: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
        /// Hide everything the base has under it.
        opaque: bool,
    },
    Symlink {
        target: String,
    },
    /// The path is deleted (an overlay whiteout).
    Whiteout,
}

/// The files of an instance's layer, keyed by absolute path.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    pub entries: BTreeMap<String, Entry>,
}

/// Check and normalise an absolute path for a layer.
pub fn clean_path(path: &str) -> Result<String, SynthError> {
    let bad = |reason: &str| SynthError::BadPath {
        path: path.into(),
        reason: reason.into(),
    };
    if !path.starts_with('/') {
        return Err(bad("not absolute"));
    }
    let mut out = String::new();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(bad("contains `..`"));
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        return Err(bad("is the root"));
    }
    for top in ["/proc", "/sys", "/dev"] {
        if out == top || out.starts_with(&format!("{top}/")) {
            return Err(bad("is under a mount the sandbox provides"));
        }
    }
    Ok(out)
}

impl Layer {
    /// Bytes of file data.
    pub fn bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| match e {
                Entry::File { data, .. } => data.len() as u64,
                _ => 0,
            })
            .sum()
    }

    /// Write the layer into `dst` (which must not exist). Parent directories that the layer
    /// does not define take the base's owner and mode, so the merged view keeps them.
    pub fn materialize(&self, dst: &Path, base: &BaseView) -> Result<(), SynthError> {
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SynthError::Write { path, source }
        };
        std::fs::create_dir(dst).map_err(werr(dst))?;
        set_meta(dst, 0o755, 0, 0, false).map_err(werr(dst))?;
        let mut dirs_made: BTreeSet<String> = BTreeSet::new();
        for (path, entry) in &self.entries {
            // Parents first (BTreeMap order puts "/a" before "/a/b", but a parent may be
            // implicit).
            let mut parent = String::new();
            let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
            for c in &comps[..comps.len() - 1] {
                parent.push('/');
                parent.push_str(c);
                if dirs_made.contains(&parent) || self.entries.contains_key(&parent) {
                    continue;
                }
                let host = dst.join(&parent[1..]);
                let m = base.meta(&parent);
                let (mode, uid, gid) = m.map_or((0o755, 0, 0), |m| (m.mode, m.uid, m.gid));
                std::fs::create_dir(&host).map_err(werr(&host))?;
                set_meta(&host, mode, uid, gid, false).map_err(werr(&host))?;
                dirs_made.insert(parent.clone());
            }
            let host = dst.join(&path[1..]);
            match entry {
                Entry::File {
                    data,
                    mode,
                    uid,
                    gid,
                } => {
                    std::fs::write(&host, data).map_err(werr(&host))?;
                    set_meta(&host, *mode, *uid, *gid, false).map_err(werr(&host))?;
                }
                Entry::Dir {
                    mode,
                    uid,
                    gid,
                    opaque,
                } => {
                    if !host.is_dir() {
                        std::fs::create_dir(&host).map_err(werr(&host))?;
                    }
                    if *opaque {
                        sandbox::sys::set_xattr(&host, "trusted.overlay.opaque", b"y")
                            .map_err(werr(&host))?;
                    }
                    set_meta(&host, *mode, *uid, *gid, false).map_err(werr(&host))?;
                    dirs_made.insert(path.clone());
                }
                Entry::Symlink { target } => {
                    std::os::unix::fs::symlink(target, &host).map_err(werr(&host))?;
                    set_meta(&host, 0o777, 0, 0, true).map_err(werr(&host))?;
                }
                Entry::Whiteout => {
                    nix::sys::stat::mknod(
                        &host,
                        nix::sys::stat::SFlag::S_IFCHR,
                        nix::sys::stat::Mode::empty(),
                        0,
                    )
                    .map_err(|e| SynthError::Write {
                        path: host.clone(),
                        source: std::io::Error::from(e),
                    })?;
                    set_meta(&host, 0, 0, 0, true).map_err(werr(&host))?;
                }
            }
        }
        // Directories last (writing into them changed their mtimes).
        for d in dirs_made {
            let host = dst.join(&d[1..]);
            set_times(&host).map_err(werr(&host))?;
        }
        set_times(dst).map_err(werr(dst))?;
        Ok(())
    }
}

fn set_times(p: &Path) -> std::io::Result<()> {
    let t = nix::sys::time::TimeSpec::new(LAYER_MTIME, 0);
    nix::sys::stat::utimensat(
        None,
        p,
        &t,
        &t,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(std::io::Error::from)
}

fn set_meta(p: &Path, mode: u32, uid: u32, gid: u32, link: bool) -> std::io::Result<()> {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
    if !link {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o7777))?;
    }
    set_times(p)
}

/// Builds an instance: the task's setup and the perturbations write into the layer and the
/// runtime settings; reads see the layer first, then the base.
pub struct Builder<'a> {
    pub base: &'a BaseView,
    pub layer: Layer,
    pub runtime: RuntimeSettings,
    pub resources: Resources,
    /// The task being built, once its setup ran (perturbations may aim at its files).
    pub task: Option<TaskSetup>,
    seed: u64,
}

impl<'a> Builder<'a> {
    pub fn new(base: &'a BaseView, seed: u64, resources: Resources) -> Self {
        Self {
            base,
            layer: Layer::default(),
            runtime: RuntimeSettings::default(),
            resources,
            task: None,
            seed,
        }
    }

    /// The instance seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A generator for one purpose (a perturbation's name and index), independent of others.
    pub fn rng(&self, purpose: &str) -> rand_chacha::ChaCha8Rng {
        rng_for(self.seed, purpose)
    }

    fn hidden_by_layer(&self, path: &str) -> bool {
        // A whiteout (or a file) on an ancestor hides the base's path.
        let mut cur = String::new();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            cur.push('/');
            cur.push_str(c);
            if cur.len() == path.len() {
                break;
            }
            match self.layer.entries.get(&cur) {
                Some(Entry::Whiteout | Entry::File { .. } | Entry::Symlink { .. }) => return true,
                Some(Entry::Dir { opaque: true, .. }) => return true,
                _ => {}
            }
        }
        false
    }

    /// Metadata as the sandbox will see it.
    pub fn meta(&self, path: &str) -> Option<Meta> {
        let path = clean_path(path).ok()?;
        match self.layer.entries.get(&path) {
            Some(Entry::Whiteout) => None,
            Some(Entry::File {
                data,
                mode,
                uid,
                gid,
            }) => Some(Meta {
                is_dir: false,
                is_symlink: false,
                mode: *mode,
                uid: *uid,
                gid: *gid,
                size: data.len() as u64,
            }),
            Some(Entry::Dir { mode, uid, gid, .. }) => Some(Meta {
                is_dir: true,
                is_symlink: false,
                mode: *mode,
                uid: *uid,
                gid: *gid,
                size: 0,
            }),
            Some(Entry::Symlink { .. }) => Some(Meta {
                is_dir: false,
                is_symlink: true,
                mode: 0o777,
                uid: 0,
                gid: 0,
                size: 0,
            }),
            None if self.hidden_by_layer(&path) => None,
            None => self.base.meta(&path),
        }
    }

    pub fn exists(&self, path: &str) -> bool {
        self.meta(path).is_some()
    }

    /// Contents of a regular file as the sandbox will see it (symlinks in the last component
    /// are followed once, within the rootfs).
    pub fn read(&self, path: &str) -> Option<Vec<u8>> {
        let path = clean_path(path).ok()?;
        match self.layer.entries.get(&path) {
            Some(Entry::File { data, .. }) => Some(data.clone()),
            Some(Entry::Symlink { target }) => {
                let t = resolve_link(&path, target);
                (t != path).then(|| self.read(&t)).flatten()
            }
            Some(_) => None,
            None if self.hidden_by_layer(&path) => None,
            None => {
                if let Some(t) = self.base.read_link(&path) {
                    let t = resolve_link(&path, &t);
                    return (t != path).then(|| self.read(&t)).flatten();
                }
                self.base.read(&path)
            }
        }
    }

    /// Names in a directory as the sandbox will see it (sorted).
    pub fn list(&self, path: &str) -> Vec<String> {
        let Ok(path) = clean_path(path) else {
            return self.base.list("/");
        };
        let mut names: BTreeSet<String> = if self.hidden_by_layer(&path)
            || matches!(
                self.layer.entries.get(&path),
                Some(Entry::Dir { opaque: true, .. })
            ) {
            BTreeSet::new()
        } else {
            self.base.list(&path).into_iter().collect()
        };
        let prefix = format!("{path}/");
        for (p, e) in self.layer.entries.range(prefix.clone()..) {
            let Some(rest) = p.strip_prefix(&prefix) else {
                break;
            };
            if let Some((dir, _)) = rest.split_once('/') {
                // An implicit parent directory of something the layer writes.
                names.insert(dir.to_string());
                continue;
            }
            if matches!(e, Entry::Whiteout) {
                names.remove(rest);
            } else {
                names.insert(rest.to_string());
            }
        }
        names.into_iter().collect()
    }

    /// Find an executable by name in a `PATH`-style list, as the sandbox would.
    pub fn which(&self, tool: &str, path_var: &str) -> Option<String> {
        path_var.split(':').filter(|d| !d.is_empty()).find_map(|d| {
            let p = format!("{}/{tool}", d.trim_end_matches('/'));
            let m = self.meta(&p)?;
            (m.is_symlink || (!m.is_dir && m.mode & 0o111 != 0)).then_some(p)
        })
    }

    pub fn write(
        &mut self,
        path: &str,
        data: impl Into<Vec<u8>>,
        mode: u32,
    ) -> Result<(), SynthError> {
        self.write_owned(path, data, mode, 0, 0)
    }

    pub fn write_owned(
        &mut self,
        path: &str,
        data: impl Into<Vec<u8>>,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), SynthError> {
        let path = clean_path(path)?;
        self.unhide_parents(&path);
        self.layer.entries.insert(
            path,
            Entry::File {
                data: data.into(),
                mode,
                uid,
                gid,
            },
        );
        Ok(())
    }

    pub fn mkdir(&mut self, path: &str, mode: u32) -> Result<(), SynthError> {
        self.mkdir_owned(path, mode, 0, 0)
    }

    pub fn mkdir_owned(
        &mut self,
        path: &str,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(), SynthError> {
        let path = clean_path(path)?;
        self.unhide_parents(&path);
        let opaque = matches!(self.layer.entries.get(&path), Some(Entry::Whiteout))
            || matches!(
                self.layer.entries.get(&path),
                Some(Entry::Dir { opaque: true, .. })
            );
        self.layer.entries.insert(
            path,
            Entry::Dir {
                mode,
                uid,
                gid,
                opaque,
            },
        );
        Ok(())
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), SynthError> {
        let path = clean_path(path)?;
        self.unhide_parents(&path);
        self.layer.entries.insert(
            path,
            Entry::Symlink {
                target: target.into(),
            },
        );
        Ok(())
    }

    /// Delete a path (and everything under it) from the sandbox's view.
    pub fn remove(&mut self, path: &str) -> Result<(), SynthError> {
        let path = clean_path(path)?;
        let prefix = format!("{path}/");
        self.layer.entries.retain(|p, _| !p.starts_with(&prefix));
        if self.base.meta(&path).is_some() && !self.hidden_by_layer(&path) {
            self.layer.entries.insert(path, Entry::Whiteout);
        } else {
            self.layer.entries.remove(&path);
        }
        Ok(())
    }

    /// Change the mode of an existing path (copying a base file up into the layer).
    pub fn chmod(&mut self, path: &str, mode: u32) -> Result<(), SynthError> {
        let p = clean_path(path)?;
        let m = self.meta(&p).ok_or_else(|| SynthError::BadPath {
            path: p.clone(),
            reason: "does not exist".into(),
        })?;
        match self.layer.entries.get_mut(&p) {
            Some(Entry::File { mode: m0, .. } | Entry::Dir { mode: m0, .. }) => {
                *m0 = mode;
                Ok(())
            }
            _ if m.is_dir => self.mkdir_owned(&p, mode, m.uid, m.gid),
            _ if m.is_symlink => Err(SynthError::BadPath {
                path: p,
                reason: "is a symbolic link".into(),
            }),
            _ => {
                let data = self.read(&p).ok_or_else(|| SynthError::BadPath {
                    path: p.clone(),
                    reason: "cannot be read".into(),
                })?;
                self.write_owned(&p, data, mode, m.uid, m.gid)
            }
        }
    }

    /// A parent that the layer deleted becomes an (opaque) directory again when something is
    /// written under it.
    fn unhide_parents(&mut self, path: &str) {
        let mut cur = String::new();
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        for c in &comps[..comps.len().saturating_sub(1)] {
            cur.push('/');
            cur.push_str(c);
            if let Some(Entry::Whiteout | Entry::File { .. } | Entry::Symlink { .. }) =
                self.layer.entries.get(&cur)
            {
                self.layer.entries.insert(
                    cur.clone(),
                    Entry::Dir {
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        opaque: true,
                    },
                );
            }
        }
    }

    /// Add a step run at every episode start.
    pub fn on_start(&mut self, by: &str, shell: impl Into<String>) {
        self.runtime.start.push(StartStep {
            by: by.into(),
            shell: shell.into(),
        });
    }

    /// The `PATH` the sandbox's commands will get.
    pub fn path_var(&self) -> String {
        match self.runtime.env.get("PATH") {
            Some(Some(p)) => p.clone(),
            Some(None) => String::new(),
            None => DEFAULT_PATH.into(),
        }
    }
}

/// The sandbox's default `PATH`.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Resolve a symlink target relative to the link's directory (lexically).
pub fn resolve_link(link: &str, target: &str) -> String {
    let joined = if target.starts_with('/') {
        target.to_string()
    } else {
        let dir = link.rsplit_once('/').map_or("", |(d, _)| d);
        format!("{dir}/{target}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

// ---------------------------------------------------------------------------------------------
// Building and caching
// ---------------------------------------------------------------------------------------------

/// Run the task's setup and the perturbations of a plan on a base: the pure part of synthesis.
pub fn build(
    plan: &Plan,
    base: &BaseView,
) -> Result<(Layer, RuntimeSettings, Option<TaskSetup>, Vec<String>), SynthError> {
    let mut b = Builder::new(base, plan.seed, plan.resources.clone());
    for tool in &plan.tools {
        if b.which(tool, DEFAULT_PATH).is_none() {
            return Err(SynthError::Task {
                task: plan
                    .task
                    .as_ref()
                    .map_or("template".into(), |t| t.name.clone()),
                reason: format!(
                    "the base `{}` has no tool `{tool}` that the template requires",
                    plan.base
                ),
            });
        }
    }
    if let Some(t) = &plan.task {
        let task = tasks::get(&t.name).ok_or_else(|| SynthError::UnknownTask(t.name.clone()))?;
        let setup = task.setup(t.seed, &mut b).map_err(|e| SynthError::Task {
            task: t.name.clone(),
            reason: e.to_string(),
        })?;
        b.task = Some(setup);
    }
    let mut applied = Vec::new();
    for (i, c) in plan.perturbations.iter().enumerate() {
        let p = perturb::get(&c.name).ok_or_else(|| SynthError::Perturb {
            name: c.name.clone(),
            source: PerturbError::Unknown(c.name.clone()),
        })?;
        let params = p
            .info()
            .check(&c.params)
            .map_err(|source| SynthError::Perturb {
                name: c.name.clone(),
                source,
            })?;
        let what = p
            .apply(&params, &format!("{}#{i}", c.name), &mut b)
            .map_err(|source| SynthError::Perturb {
                name: c.name.clone(),
                source,
            })?;
        applied.push(format!("{}: {what}", c.name));
    }
    let Builder {
        layer,
        runtime,
        task,
        ..
    } = b;
    Ok((layer, runtime, task, applied))
}

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
pub struct Held {
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
    pub fn get_or_build(&self, plan: &Plan, rootfs: &Rootfs) -> Result<Held, SynthError> {
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
            return Err(e);
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
        // Held before the build lock goes, so no eviction can come in between.
        let held = std::fs::File::open(self.manifest(&id)).map_err(cerr)?;
        flock(&held, libc::LOCK_SH).map_err(cerr)?;
        // Use time on the fine clock, as `lookup` does: the mtime a write leaves comes from
        // the kernel's coarse clock (a jiffy behind), which could rank this new entry older
        // than one looked up a moment before it.
        touch(&held);
        self.evict(Some(&id))?;
        drop(lock);
        tracing::debug!(instance = %id, bytes = instance.layer_bytes, "instance synthesized");
        Ok(Held {
            instance,
            origin: Origin::Built,
            _lock: held,
        })
    }

    /// A cached instance, held.
    pub fn lookup(&self, id: &str) -> Result<Option<Held>, SynthError> {
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
        Ok(Some(Held {
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
