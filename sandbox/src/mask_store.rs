//! Built host masks kept across processes ([`crate::layers::plan_host_mask`]'s plans, made
//! into directories once), so that a one-shot process mounts nothing and writes nothing for
//! its host layer.
//!
//! **Where.** A mask is a lower layer stacked over the host's `/`, and overlayfs refuses a
//! lower layer inside another one of the same filesystem ("overlapping lowerdir path"), so
//! the store cannot live in the state directory when that is on the root filesystem (the
//! usual case). It lives on `/dev/shm` (a tmpfs of its own on every Linux system), in
//! `envfactory-<euid>-hostmasks`: made mode 0700 by this user, and used only while it is a
//! directory (not a symlink) owned by this user that nobody else can read or write, on a
//! filesystem other than `/`'s. Otherwise [`MaskStore::open`] says no and the runtime builds
//! the mask on a tmpfs of its run as before. It empties at reboot; nothing in it is needed
//! for correctness.
//!
//! **Entries.** `<store>/<id>` where the id is the digest of the plan ([`mask_id`]). An entry
//! is built under a `.tmp-` name, checked against its plan, and renamed into place without
//! replacing anything (`RENAME_NOREPLACE`), so a half-built entry never has an id's name.
//! Every use checks the entry again against the plan it is used for, under a shared lock:
//! every path the plan makes is there with its type, mode, owner and overlay attributes and
//! nothing else is (a whiteout removed, an entry added, a mode or an overlay attribute
//! changed: the entry is renamed away and built again). A runtime holds the shared lock on its
//! entry for its life; removing a directory's contents takes the exclusive lock without
//! waiting (an entry in use is never emptied: its overlays read it live; one renamed away is
//! emptied by a later prune once no one holds it), and pruning renames an entry away before
//! removing it.
//! At most [`KEEP`] entries are kept (those used last); leftovers of crashed builds are
//! removed.

use crate::layers::OPAQUE;
use crate::sys::{Op, RealSys, Recorder, SysError};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Entries kept in the store (those used last; entries in use are never removed).
pub const KEEP: usize = 4;

/// Errors of the mask store.
#[derive(Debug, thiserror::Error)]
pub enum MaskStoreError {
    #[error("host mask store {path}: {op}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("host mask store: building the mask: {0}")]
    Build(#[from] SysError),
    #[error("host mask store {path}: the built mask does not match its plan: {reason}")]
    Mismatch { path: PathBuf, reason: String },
    #[error("host mask store: a plan with a `{0}` operation cannot be stored")]
    Unsupported(&'static str),
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MaskStoreError {
    let path = path.to_path_buf();
    move |source| MaskStoreError::Io { op, path, source }
}

/// The id of a plan's mask: a digest of its operations (relative to `/`).
pub fn mask_id(ops: &[Op]) -> String {
    let mut h = Sha256::new();
    h.update(b"envfactory-hostmask-v1\n");
    for op in ops {
        h.update(format!("{op:?}\n").as_bytes());
    }
    format!("hm-{}", hex::encode(&h.finalize()[..16]))
}

/// The default store's place: `/dev/shm/envfactory-<euid>-hostmasks`.
pub fn default_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/envfactory-{uid}-hostmasks"))
}

/// Owned by this user and writable by no one else.
fn trusted(m: &std::fs::Metadata, private: bool) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let others = if private { 0o077 } else { 0o022 };
    m.uid() == me && m.mode() & others == 0
}

/// [`trusted`] for an entry, as a check's reason.
fn entry_trusted(m: &std::fs::Metadata) -> Result<(), String> {
    if trusted(m, false) {
        Ok(())
    } else {
        Err("not owned by this user, or writable by others".to_string())
    }
}

/// A store of built masks (see the module's documentation).
#[derive(Debug, Clone)]
pub struct MaskStore {
    dir: PathBuf,
}

/// A mask entry in use: its path (a lower layer) and the shared lock that keeps it.
#[derive(Debug)]
pub struct HeldMask {
    pub path: PathBuf,
    _lock: std::fs::File,
}

/// The check of a held entry against its plan, left for later ([`MaskStore::get_deferred`]).
#[derive(Debug)]
pub struct MaskCheck {
    store: MaskStore,
    id: String,
    want: Expected,
    /// The held entry, opened anew (its own descriptor of the same directory): what is
    /// checked, whatever its path names by then (which must still be it).
    dir: std::fs::File,
}

impl MaskCheck {
    /// The held entry is exactly what its plan makes (as [`MaskStore::get_or_build`] checks,
    /// read through its own descriptor) and its path still names it (the overlay is given
    /// the path). An entry that does not match is moved out of the way at once, so that the
    /// next [`MaskStore::get_or_build`] builds it again; one whose path names another entry
    /// now fails without touching that one (it is someone else's, maybe just built).
    pub fn holds(&self) -> bool {
        let t0 = std::time::Instant::now();
        let path = self.store.dir.join(&self.id);
        let held = self.dir.metadata().map_err(|e| e.to_string());
        let here = match (&held, std::fs::symlink_metadata(&path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        let r = if here {
            held.and_then(|m| entry_trusted(&m))
                .and_then(|()| reopen(&self.dir).map_err(|e| e.to_string()))
                .and_then(|d| self.want.matches_dir(d))
        } else {
            Ok(())
        };
        tracing::debug!(
            check_us = t0.elapsed().as_micros() as u64,
            holds = here && r.is_ok(),
            "host mask entry checked"
        );
        match r {
            Ok(()) if here => true,
            Ok(()) => {
                tracing::debug!(entry = %path.display(), "host mask entry replaced since it was held; made again");
                false
            }
            Err(reason) => {
                tracing::warn!(entry = %path.display(), %reason, "host mask entry does not match its plan; building it again");
                self.store.discard_mismatched(&self.id);
                false
            }
        }
    }
}

/// A new descriptor (its own reading position) of the directory `dir` is open on.
fn reopen(dir: &std::fs::File) -> std::io::Result<std::fs::File> {
    use nix::fcntl::OFlag;
    use std::os::fd::AsFd;
    crate::sys::openat(
        dir.as_fd(),
        c".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map(std::fs::File::from)
}

pub(crate) fn flock(f: &std::fs::File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock on a descriptor this File owns.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Mark an entry as just used (its modification time, to the clock's full precision: the
/// order in which [`MaskStore::prune`] keeps entries). Best effort.
fn touch(f: &std::fs::File) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let _ = nix::sys::stat::futimens(
        f.as_raw_fd(),
        &nix::sys::time::TimeSpec::UTIME_OMIT,
        &nix::sys::time::TimeSpec::from(now),
    );
}

fn open_dir(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

fn unique(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}{}-{nanos:x}-{n}", std::process::id())
}

impl MaskStore {
    /// The store at `dir` (made if missing), if it can be trusted and is on a filesystem other
    /// than `/`'s; `None` otherwise (the caller builds its mask elsewhere).
    pub fn open(dir: &Path) -> Option<Self> {
        let check = |m: &std::fs::Metadata| m.is_dir() && trusted(m, true);
        let m = match std::fs::symlink_metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().mode(0o700).create(dir).ok()?;
                std::fs::symlink_metadata(dir).ok()?
            }
            Err(_) => return None,
        };
        let root = std::fs::metadata("/").ok()?;
        if !check(&m) || m.dev() == root.dev() {
            tracing::debug!(dir = %dir.display(), "host mask store not usable");
            return None;
        }
        Some(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry of `plan` (operations relative to `/`), checked against it and held; built
    /// (and the store pruned) when missing or when the entry there does not match.
    pub fn get_or_build(&self, plan: &Recorder) -> Result<HeldMask, MaskStoreError> {
        let want = Expected::of(&plan.ops)?;
        self.hold(plan, &want, &mask_id(&plan.ops), true)
    }

    /// The entry of `plan`, held (built when missing), with its check against the plan left
    /// to the caller: [`MaskCheck::holds`], to be run before anything relies on the entry (a
    /// runtime runs it while the sandbox's init sets up, off the one-shot's path).
    pub fn get_deferred(&self, plan: &Recorder) -> Result<(HeldMask, MaskCheck), MaskStoreError> {
        let want = Expected::of(&plan.ops)?;
        let id = mask_id(&plan.ops);
        let held = self.hold(plan, &want, &id, false)?;
        let dir = reopen(&held._lock).map_err(io("reopen", &held.path))?;
        let check = MaskCheck {
            store: self.clone(),
            id,
            want,
            dir,
        };
        Ok((held, check))
    }

    /// The entry `id` of `plan` (whose paths are `want`), held; checked against `want` when
    /// `check_now`, else only that it is this user's.
    fn hold(
        &self,
        plan: &Recorder,
        want: &Expected,
        id: &str,
        check_now: bool,
    ) -> Result<HeldMask, MaskStoreError> {
        let path = self.dir.join(id);
        // A few rounds: a concurrent pruner may move an entry away between the open and the
        // lock, and a concurrent builder may publish first.
        for _ in 0..4 {
            let f = match open_dir(&path) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.build(id, plan, want)?;
                    continue;
                }
                Err(e) => return Err(io("open", &path)(e)),
            };
            flock(&f, libc::LOCK_SH).map_err(io("lock", &path))?;
            let still_here = match (f.metadata(), std::fs::symlink_metadata(&path)) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            };
            if !still_here {
                continue;
            }
            let checked = f
                .metadata()
                .map_err(|e| e.to_string())
                .and_then(|m| entry_trusted(&m))
                .and_then(|()| {
                    if check_now {
                        want.matches(&path)
                    } else {
                        Ok(())
                    }
                });
            match checked {
                Ok(()) => {
                    touch(&f);
                    return Ok(HeldMask { path, _lock: f });
                }
                Err(reason) => {
                    tracing::warn!(entry = %path.display(), %reason, "host mask entry does not match its plan; building it again");
                    drop(f);
                    self.discard_mismatched(id);
                }
            }
        }
        Err(io("publish", &path)(std::io::Error::other(
            "the entry kept changing under concurrent builders and pruners",
        )))
    }

    /// Build `plan` under a temporary name, check it, publish it as `id` (unless another
    /// process did first), then prune.
    fn build(&self, id: &str, plan: &Recorder, want: &Expected) -> Result<(), MaskStoreError> {
        let tmp = self.dir.join(unique(".tmp-"));
        let remove_tmp = |t: &Path| {
            let _ = std::fs::remove_dir_all(t);
        };
        let r = (|| {
            use crate::sys::Sys;
            RealSys.mkdir(&tmp, 0o755)?;
            plan.rebased(&tmp).replay(&mut RealSys)?;
            want.matches(&tmp)
                .map_err(|reason| MaskStoreError::Mismatch {
                    path: tmp.clone(),
                    reason,
                })?;
            match crate::sys::rename_noreplace(&tmp, &self.dir.join(id)) {
                Ok(()) => Ok(true),
                // Another process published it first; ours goes.
                Err(nix::errno::Errno::EEXIST | nix::errno::Errno::ENOTEMPTY) => Ok(false),
                Err(e) => Err(io("rename into place", &tmp)(e.into())),
            }
        })();
        match r {
            Ok(true) => {
                tracing::debug!(entry = id, "host mask stored");
                self.prune(KEEP, id);
                Ok(())
            }
            Ok(false) => {
                remove_tmp(&tmp);
                Ok(())
            }
            Err(e) => {
                remove_tmp(&tmp);
                Err(e)
            }
        }
    }

    /// Remove entry `name` unless it is in use (best effort).
    fn discard(&self, name: &str) -> bool {
        let path = self.dir.join(name);
        let Ok(f) = open_dir(&path) else {
            return false;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_err() {
            return false;
        }
        let trash = self.dir.join(unique(".trash-"));
        if std::fs::rename(&path, &trash).is_err() {
            return false;
        }
        let _ = std::fs::remove_dir_all(&trash);
        true
    }

    /// Move entry `name`, which does not match its plan, out of the way at once (a runtime
    /// that uses it keeps what it has: a rename changes nothing under its overlays); its
    /// contents go when no one holds it any more (now, or at a later [`Self::prune`]).
    fn discard_mismatched(&self, name: &str) {
        let trash = self.dir.join(unique(".trash-"));
        if std::fs::rename(self.dir.join(name), &trash).is_ok() {
            remove_unless_held(&trash);
        }
    }

    /// Keep the `keep` entries used last (`except` among them), never remove one in use;
    /// remove what crashed builds and removals left.
    pub fn prune(&self, keep: usize, except: &str) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".trash-") {
                remove_unless_held(&e.path());
                continue;
            }
            if let Some(rest) = name.strip_prefix(".tmp-") {
                let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
                let dead = pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
                if dead {
                    let _ = std::fs::remove_dir_all(e.path());
                }
                continue;
            }
            if name.starts_with('.') {
                continue;
            }
            let used = e
                .metadata()
                .map(|m| (m.mtime(), m.mtime_nsec()))
                .unwrap_or((0, 0));
            entries.push((name == except, used, name));
        }
        // `except` first, then the most recently used.
        entries.sort_by(|a, b| b.cmp(a));
        for (_, _, name) in entries.into_iter().skip(keep) {
            if self.discard(&name) {
                tracing::debug!(entry = %name, "old host mask removed");
            }
        }
    }
}

/// Remove the directory at `path` unless a runtime holds it (its shared lock).
fn remove_unless_held(path: &Path) {
    if let Ok(f) = open_dir(path) {
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// What a mask directory holds, from its plan: every path (relative to the mask's root) as a
/// directory with its mode and whether it is opaque, or a whiteout.
#[derive(Debug, PartialEq, Eq)]
enum Want {
    Dir { mode: u32, opaque: bool },
    Whiteout,
}

#[derive(Debug)]
struct Expected(HashMap<PathBuf, Want>);

impl Expected {
    fn of(ops: &[Op]) -> Result<Self, MaskStoreError> {
        let rel = |p: &Path| p.strip_prefix("/").unwrap_or(p).to_path_buf();
        let mut m = HashMap::new();
        for op in ops {
            match op {
                Op::Mkdir { path, mode } => {
                    m.insert(
                        rel(path),
                        Want::Dir {
                            mode: *mode & 0o7777,
                            opaque: false,
                        },
                    );
                }
                Op::Mknod {
                    path,
                    major: 0,
                    minor: 0,
                    ..
                } => {
                    m.insert(rel(path), Want::Whiteout);
                }
                Op::SetXattr { path, name, value } if name == OPAQUE && value == b"y" => {
                    match m.get_mut(&rel(path)) {
                        Some(Want::Dir { opaque, .. }) => *opaque = true,
                        _ => return Err(MaskStoreError::Unsupported("xattr on a non-directory")),
                    }
                }
                Op::Mknod { .. } => return Err(MaskStoreError::Unsupported("mknod")),
                Op::SetXattr { .. } => return Err(MaskStoreError::Unsupported("setxattr")),
                Op::Mount { .. } => return Err(MaskStoreError::Unsupported("mount")),
                Op::Umount { .. } => return Err(MaskStoreError::Unsupported("umount")),
                Op::Symlink { .. } => return Err(MaskStoreError::Unsupported("symlink")),
                Op::Chown { .. } => return Err(MaskStoreError::Unsupported("chown")),
            }
        }
        Ok(Self(m))
    }

    /// Whether the tree at `root` is exactly this (else the first difference). Read through
    /// descriptors: each directory opened once (not following symlinks), its entries stat'ed
    /// relative to it.
    fn matches(&self, root: &Path) -> Result<(), String> {
        let dir = open_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
        self.matches_dir(dir)
    }

    /// [`Self::matches`] of the directory `dir` is open on.
    fn matches_dir(&self, dir: std::fs::File) -> Result<(), String> {
        let top = nix::sys::stat::fstat(dir.as_raw_fd()).map_err(|e| e.to_string())?;
        if top.st_mode & 0o7777 != 0o755 {
            return Err(format!("the root has mode {:o}", top.st_mode));
        }
        owned(&top, Path::new("/"))?;
        check_xattrs(&dir, false).map_err(|e| format!("/: {e}"))?;
        let mut seen = 0usize;
        self.walk(dir, &PathBuf::new(), &mut seen)?;
        if seen != self.0.len() {
            return Err(format!(
                "{} of the plan's {} paths present",
                seen,
                self.0.len()
            ));
        }
        Ok(())
    }

    fn walk(&self, dir: std::fs::File, rel: &Path, seen: &mut usize) -> Result<(), String> {
        use nix::fcntl::{AtFlags, OFlag};
        let fd = dir.as_raw_fd();
        let mut d = nix::dir::Dir::from_fd(std::os::fd::IntoRawFd::into_raw_fd(dir))
            .map_err(|e| format!("{}: {e}", rel.display()))?;
        let mut subdirs = Vec::new();
        for e in d.iter() {
            let e = e.map_err(|e| e.to_string())?;
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let r = rel.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            let show = Path::new("/").join(&r);
            let st = nix::sys::stat::fstatat(Some(fd), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| format!("{}: {e}", show.display()))?;
            owned(&st, &show)?;
            let kind = st.st_mode & libc::S_IFMT;
            match self.0.get(&r) {
                Some(Want::Dir { mode, opaque }) if kind == libc::S_IFDIR => {
                    if st.st_mode & 0o7777 != *mode {
                        return Err(format!("{}: mode {:o}", show.display(), st.st_mode));
                    }
                    let sub = crate::sys::openat(
                        // SAFETY: `fd` belongs to `d`, which lives until the end of this loop.
                        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                        name,
                        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    )
                    .map(std::fs::File::from)
                    .map_err(|e| format!("{}: {e}", show.display()))?;
                    check_xattrs(&sub, *opaque).map_err(|e| format!("{}: {e}", show.display()))?;
                    subdirs.push((sub, r));
                }
                // A whiteout is its type alone: overlayfs reads no attribute of a char 0:0.
                Some(Want::Whiteout) if kind == libc::S_IFCHR && st.st_rdev == 0 => {}
                Some(_) => return Err(format!("{}: wrong type", show.display())),
                None => return Err(format!("{}: not in the plan", show.display())),
            }
            *seen += 1;
        }
        drop(d);
        for (sub, r) in subdirs {
            self.walk(sub, &r, seen)?;
        }
        Ok(())
    }
}

/// Owned by this process's user and group, as everything the store builds.
fn owned(st: &libc::stat, what: &Path) -> Result<(), String> {
    // SAFETY: geteuid/getegid have no preconditions and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if st.st_uid == uid && st.st_gid == gid {
        Ok(())
    } else {
        Err(format!(
            "{}: owner {}:{}",
            what.display(),
            st.st_uid,
            st.st_gid
        ))
    }
}

/// The overlay attributes of directory `dir` are exactly the opaque marker when `opaque`,
/// else none.
fn check_xattrs(dir: &std::fs::File, opaque: bool) -> Result<(), String> {
    let mut buf = [0u8; 1024];
    // SAFETY: a descriptor `dir` owns; the buffer pointer/length pair describes a live,
    // writable array.
    let n = unsafe { libc::flistxattr(dir.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOTSUP) {
            return Err(format!("listing attributes: {e}"));
        }
    }
    let names = &buf[..n.max(0) as usize];
    let overlay: Vec<&[u8]> = names
        .split(|b| *b == 0)
        .filter(|n| n.starts_with(b"trusted.overlay."))
        .collect();
    let want: &[&[u8]] = if opaque { &[OPAQUE.as_bytes()] } else { &[] };
    if overlay != want {
        let shown: Vec<_> = overlay.iter().map(|n| String::from_utf8_lossy(n)).collect();
        return Err(format!("overlay attributes {shown:?}"));
    }
    if opaque {
        let mut v = [0u8; 8];
        let name = c"trusted.overlay.opaque";
        // SAFETY: as above; `name` is a valid C string.
        let n = unsafe {
            libc::fgetxattr(
                dir.as_raw_fd(),
                name.as_ptr(),
                v.as_mut_ptr().cast(),
                v.len(),
            )
        };
        if n != 1 || v[0] != b'y' {
            return Err(format!("{OPAQUE} is not `y`"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
