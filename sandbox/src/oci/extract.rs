//! Safe extraction of one layer's tar entries below a private layer root:
//! every path is resolved lexically and written through the `O_NOFOLLOW` walk,
//! whiteouts and opaque markers become overlayfs whiteouts, and hard links may
//! only point at entries extracted earlier in the same layer.

use std::collections::HashSet;
use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{
    fchmod, fchmodat, futimens, mkdirat, mknodat, utimensat, FchmodatFlags, Mode, SFlag,
    UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use super::layer::Budget;
use super::paths::{cstring, join, lstatat, normalize, walk};
use super::{ImportLimits, OciError, MAX_PATH_BYTES};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

pub(super) struct Extractor<'a> {
    root: OwnedFd,
    blob: &'a str,
    limits: &'a ImportLimits,
    budget: &'a mut Budget,
    /// Non-directory paths extracted so far in this layer (hard-link targets).
    extracted: HashSet<String>,
    /// Directory mtimes, applied once all entries are written.
    dir_times: Vec<(Vec<Vec<u8>>, i64)>,
    root_seen: bool,
    pub(super) entries: u64,
    pub(super) bytes: u64,
    /// Copy buffer, reused for every file.
    buf: Vec<u8>,
    /// Last parent directory opened, by path components.
    parent_cache: Option<(Vec<Vec<u8>>, Rc<OwnedFd>)>,
}

/// Metadata of one entry, from its header.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
}

impl Meta {
    fn owner(&self) -> (Option<Uid>, Option<Gid>) {
        (Some(Uid::from_raw(self.uid)), Some(Gid::from_raw(self.gid)))
    }
}

impl<'a> Extractor<'a> {
    /// An extractor writing below `root` (a fresh private directory), counting into `budget`.
    pub(super) fn new(
        root: OwnedFd,
        blob: &'a str,
        limits: &'a ImportLimits,
        budget: &'a mut Budget,
    ) -> Self {
        Self {
            root,
            blob,
            limits,
            budget,
            extracted: HashSet::new(),
            dir_times: Vec::new(),
            root_seen: false,
            entries: 0,
            bytes: 0,
            buf: vec![0u8; 128 << 10],
            parent_cache: None,
        }
    }

    fn unsafe_entry(&self, entry: &str, reason: impl Into<String>) -> OciError {
        OciError::UnsafeEntry {
            blob: self.blob.to_string(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    fn fs_err<E: Into<io::Error>>(
        &self,
        entry: &str,
        op: &'static str,
    ) -> impl FnOnce(E) -> OciError {
        let blob = self.blob.to_string();
        let entry = entry.to_string();
        move |source| OciError::Extract {
            blob,
            entry,
            op,
            source: source.into(),
        }
    }

    fn limit(&self, entry: &str, reason: String) -> OciError {
        OciError::LimitExceeded {
            blob: self.blob.to_string(),
            entry: entry.to_string(),
            reason,
        }
    }

    pub(super) fn entry<R: Read>(
        &mut self,
        e: &mut tar::Entry<'_, R>,
        stream_err: &dyn Fn(io::Error, &str) -> OciError,
    ) -> Result<(), OciError> {
        let raw_path = e.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw_path).into_owned();
        self.budget.entries += 1;
        self.entries += 1;
        if self.budget.entries > self.limits.max_entries {
            return Err(self.limit(
                &name,
                format!("more than {} entries", self.limits.max_entries),
            ));
        }
        let kind = e.header().entry_type();
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        if raw_path.len() > MAX_PATH_BYTES {
            return Err(
                self.unsafe_entry(&name, format!("path longer than {MAX_PATH_BYTES} bytes"))
            );
        }
        let comps = normalize(&raw_path).map_err(|r| self.unsafe_entry(&name, r))?;
        let meta = self.meta(e.header(), &name)?;

        let Some((&last, parents)) = comps.split_last() else {
            if kind.is_dir() {
                // `./`: metadata of the layer root itself.
                let root = self
                    .root
                    .try_clone()
                    .map_err(self.fs_err(&name, "dup root"))?;
                self.set_owner_mode(&root, &meta, &name)?;
                self.dir_times.push((Vec::new(), meta.mtime));
                self.root_seen = true;
                return Ok(());
            }
            return Err(self.unsafe_entry(&name, "non-directory entry for the layer root"));
        };

        // Whiteouts are recognised by name, whatever the entry type.
        if last == OPAQUE_MARKER {
            let dir = self.parent(parents, &name)?;
            crate::sys::fset_xattr(dir.as_fd(), "trusted.overlay.opaque", b"y")
                .map_err(self.fs_err(&name, "set trusted.overlay.opaque"))?;
            tracing::trace!(entry = %name, "opaque directory");
            return Ok(());
        }
        if let Some(target) = last.strip_prefix(WHITEOUT_PREFIX) {
            if target.starts_with(WHITEOUT_PREFIX) {
                // Other `.wh..wh.*` entries are aufs metadata: skipped.
                tracing::debug!(entry = %name, "skipping aufs metadata entry");
                return Ok(());
            }
            if target.is_empty() || target == b"." || target == b".." {
                return Err(self.unsafe_entry(&name, "whiteout without a valid target name"));
            }
            let dir = self.parent(parents, &name)?;
            let mut tcomps = parents.to_vec();
            tcomps.push(target);
            self.clear_slot(&dir, target, &join(&tcomps), &name)?;
            self.whiteout(&dir, target, &name)?;
            return Ok(());
        }

        let key = join(&comps);
        let cname = cstring(last).map_err(|_| self.unsafe_entry(&name, "NUL in name"))?;
        let dir = self.parent(parents, &name)?;
        use tar::EntryType as T;
        match kind {
            T::Directory => {
                let mkdir = || mkdirat(Some(dir.as_raw_fd()), cname.as_c_str(), mode(0o700));
                match lstatat(dir.as_fd(), &cname) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                    Ok(_) => {
                        self.clear_slot(&dir, last, &key, &name)?;
                        mkdir().map_err(self.fs_err(&name, "create directory"))?;
                    }
                    Err(Errno::ENOENT) => {
                        mkdir().map_err(self.fs_err(&name, "create directory"))?;
                    }
                    Err(err) => return Err(self.fs_err(&name, "stat")(err)),
                }
                let fd = crate::sys::openat(
                    dir.as_fd(),
                    &cname,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(self.fs_err(&name, "open directory"))?;
                self.set_owner_mode(&fd, &meta, &name)?;
                self.dir_times
                    .push((comps.iter().map(|c| c.to_vec()).collect(), meta.mtime));
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                let size = e.size();
                if size > self.limits.max_file_bytes {
                    return Err(self.limit(
                        &name,
                        format!(
                            "file of {size} bytes exceeds max_file_bytes {}",
                            self.limits.max_file_bytes
                        ),
                    ));
                }
                if self.budget.bytes.saturating_add(size) > self.limits.max_total_bytes {
                    return Err(self.limit(
                        &name,
                        format!(
                            "image content exceeds max_total_bytes {}",
                            self.limits.max_total_bytes
                        ),
                    ));
                }
                let create = |dir: &OwnedFd| {
                    crate::sys::openat(
                        dir.as_fd(),
                        &cname,
                        OFlag::O_WRONLY
                            | OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_NOFOLLOW
                            | OFlag::O_CLOEXEC,
                        mode(0o600),
                    )
                };
                // O_EXCL: never opens an existing file or follows a symlink.
                // Only when something is in the way is it removed first.
                let fd = match create(&dir) {
                    Err(err) if err.raw_os_error() == Some(libc::EEXIST) => {
                        self.clear_slot(&dir, last, &key, &name)?;
                        create(&dir)
                    }
                    other => other,
                }
                .map_err(self.fs_err(&name, "create file"))?;
                let mut file = File::from(fd);
                let mut written = 0u64;
                loop {
                    let n = match e.read(&mut self.buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                        Err(err) => return Err(stream_err(err, &name)),
                    };
                    written += n as u64;
                    if written > size || written > self.limits.max_file_bytes {
                        return Err(self.limit(&name, "file data exceeds its declared size".into()));
                    }
                    file.write_all(&self.buf[..n])
                        .map_err(self.fs_err(&name, "write file"))?;
                }
                if written != size {
                    return Err(stream_err(
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("entry {name:?} truncated: {written} of {size} bytes"),
                        ),
                        &name,
                    ));
                }
                self.budget.bytes += size;
                self.bytes += size;
                let fd = OwnedFd::from(file);
                self.set_owner_mode(&fd, &meta, &name)?;
                futimens(fd.as_raw_fd(), &time(meta.mtime), &time(meta.mtime))
                    .map_err(self.fs_err(&name, "set mtime"))?;
                self.extracted.insert(key);
            }
            T::Symlink => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| self.unsafe_entry(&name, "symlink without a target"))?;
                if target.is_empty() {
                    return Err(self.unsafe_entry(&name, "symlink with an empty target"));
                }
                let ctarget =
                    cstring(&target).map_err(|_| self.unsafe_entry(&name, "NUL in link target"))?;
                self.clear_slot(&dir, last, &key, &name)?;
                symlinkat(ctarget.as_c_str(), Some(dir.as_raw_fd()), cname.as_c_str())
                    .map_err(self.fs_err(&name, "create symlink"))?;
                lchownat(&dir, &cname, &meta).map_err(self.fs_err(&name, "chown symlink"))?;
                lutimensat(&dir, &cname, meta.mtime)
                    .map_err(self.fs_err(&name, "set symlink mtime"))?;
                self.extracted.insert(key);
            }
            T::Link => {
                let target = e
                    .link_name_bytes()
                    .ok_or_else(|| self.unsafe_entry(&name, "hard link without a target"))?
                    .into_owned();
                let tname = String::from_utf8_lossy(&target).into_owned();
                let tcomps = normalize(&target).map_err(|r| {
                    self.unsafe_entry(
                        &name,
                        format!("hard link target {tname:?} escapes the layer: {r}"),
                    )
                })?;
                let tkey = join(&tcomps);
                let Some((&tlast, tparents)) = tcomps.split_last() else {
                    return Err(self.unsafe_entry(&name, "hard link to the layer root"));
                };
                if !self.extracted.contains(&tkey) {
                    return Err(self.unsafe_entry(
                        &name,
                        format!(
                            "hard link target {tname:?} is not an entry extracted earlier in this layer"
                        ),
                    ));
                }
                if tkey == key {
                    return Err(self.unsafe_entry(&name, "hard link to itself"));
                }
                let tdir = walk(self.root.as_fd(), tparents, None)
                    .map_err(|r| self.unsafe_entry(&name, format!("hard link target: {r}")))?;
                let ctname =
                    cstring(tlast).map_err(|_| self.unsafe_entry(&name, "NUL in link target"))?;
                self.clear_slot(&dir, last, &key, &name)?;
                // No AT_SYMLINK_FOLLOW: a symlink target is linked itself, never followed.
                linkat(
                    Some(tdir.as_raw_fd()),
                    ctname.as_c_str(),
                    Some(dir.as_raw_fd()),
                    cname.as_c_str(),
                    AtFlags::empty(),
                )
                .map_err(self.fs_err(&name, "create hard link"))?;
                self.extracted.insert(key);
            }
            T::Char if is_zero_device(e.header()) => {
                // An overlay-format whiteout stored as-is.
                self.clear_slot(&dir, last, &key, &name)?;
                self.whiteout(&dir, last, &name)?;
            }
            T::Char | T::Block => {
                return Err(self.unsafe_entry(&name, "device nodes are not allowed in layers"));
            }
            T::Fifo => {
                self.clear_slot(&dir, last, &key, &name)?;
                let at = Some(dir.as_raw_fd());
                mknodat(at, cname.as_c_str(), SFlag::S_IFIFO, mode(0o600), 0)
                    .map_err(self.fs_err(&name, "create fifo"))?;
                lchownat(&dir, &cname, &meta).map_err(self.fs_err(&name, "chown fifo"))?;
                // Follows a final symlink, but this is the FIFO just created by us in our
                // private temp dir.
                fchmodat(
                    at,
                    cname.as_c_str(),
                    mode(meta.mode),
                    FchmodatFlags::FollowSymlink,
                )
                .map_err(self.fs_err(&name, "chmod fifo"))?;
                lutimensat(&dir, &cname, meta.mtime)
                    .map_err(self.fs_err(&name, "set fifo mtime"))?;
                self.extracted.insert(key);
            }
            other => {
                return Err(OciError::UnsupportedEntry {
                    blob: self.blob.to_string(),
                    entry: name,
                    kind: format!("{other:?}"),
                });
            }
        }
        Ok(())
    }

    fn meta(&self, h: &tar::Header, name: &str) -> Result<Meta, OciError> {
        let bad = |what: &str, e: io::Error| OciError::CorruptLayer {
            blob: self.blob.to_string(),
            reason: format!("entry {name:?}: bad {what} field: {e}"),
        };
        let id = |v: u64, what: &str| {
            u32::try_from(v).map_err(|_| OciError::CorruptLayer {
                blob: self.blob.to_string(),
                reason: format!("entry {name:?}: {what} {v} out of range"),
            })
        };
        Ok(Meta {
            mode: h.mode().map_err(|e| bad("mode", e))? & 0o7777,
            uid: id(h.uid().map_err(|e| bad("uid", e))?, "uid")?,
            gid: id(h.gid().map_err(|e| bad("gid", e))?, "gid")?,
            mtime: i64::try_from(h.mtime().map_err(|e| bad("mtime", e))?).unwrap_or(i64::MAX),
        })
    }

    /// Opens (creating missing directories) the parent directory of an entry,
    /// refusing symlinks and non-directories on the way. The last parent is
    /// cached: tar entries of one directory are usually consecutive. A cached
    /// directory could only stop being the one at its path by being removed;
    /// the entry removing it has another parent, which replaces the cache
    /// first, and the cache is also dropped on every directory removal.
    fn parent(&mut self, parents: &[&[u8]], name: &str) -> Result<Rc<OwnedFd>, OciError> {
        if let Some((key, fd)) = &self.parent_cache {
            if key.len() == parents.len() && key.iter().zip(parents).all(|(a, b)| a == b) {
                return Ok(fd.clone());
            }
        }
        let mut created = 0u64;
        let fd = walk(self.root.as_fd(), parents, Some(&mut created));
        // Implicitly created directories count as entries, so that one deep
        // path cannot create unbounded numbers of inodes.
        self.budget.entries += created;
        if self.budget.entries > self.limits.max_entries {
            return Err(self.limit(
                name,
                format!(
                    "more than {} entries (with implicit parent directories)",
                    self.limits.max_entries
                ),
            ));
        }
        let fd = Rc::new(fd.map_err(|r| self.unsafe_entry(name, r))?);
        self.parent_cache = Some((parents.iter().map(|c| c.to_vec()).collect(), fd.clone()));
        Ok(fd)
    }

    /// chown then chmod (chown clears setuid bits) through an open fd.
    fn set_owner_mode(&self, fd: &OwnedFd, meta: &Meta, name: &str) -> Result<(), OciError> {
        let (uid, gid) = meta.owner();
        fchown(fd.as_raw_fd(), uid, gid).map_err(self.fs_err(name, "chown"))?;
        fchmod(fd.as_raw_fd(), mode(meta.mode)).map_err(self.fs_err(name, "chmod"))
    }

    /// Makes room for a new entry `last` in `dir`: unlinks an existing
    /// non-directory, or an empty directory.
    fn clear_slot(
        &mut self,
        dir: &OwnedFd,
        last: &[u8],
        key: &str,
        name: &str,
    ) -> Result<(), OciError> {
        let cname = cstring(last).map_err(|_| self.unsafe_entry(name, "NUL in name"))?;
        match lstatat(dir.as_fd(), &cname) {
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(self.fs_err(name, "stat")(e)),
            Ok(st) => {
                let flags = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    self.parent_cache = None;
                    UnlinkatFlags::RemoveDir
                } else {
                    UnlinkatFlags::NoRemoveDir
                };
                unlinkat(Some(dir.as_raw_fd()), cname.as_c_str(), flags)
                    .map_err(self.fs_err(name, "replace existing path"))?;
                self.extracted.remove(key);
                Ok(())
            }
        }
    }

    fn whiteout(&self, dir: &OwnedFd, target: &[u8], name: &str) -> Result<(), OciError> {
        let ctarget = cstring(target).map_err(|_| self.unsafe_entry(name, "NUL in name"))?;
        // Device number 0:0 (makedev(0, 0) == 0) is the overlayfs whiteout.
        mknodat(
            Some(dir.as_raw_fd()),
            ctarget.as_c_str(),
            SFlag::S_IFCHR,
            Mode::empty(),
            0,
        )
        .map_err(self.fs_err(name, "create whiteout device"))?;
        tracing::trace!(entry = %name, "whiteout");
        Ok(())
    }

    /// Applies deferred directory mtimes and the default root mode.
    pub(super) fn finish(&mut self) -> Result<(), OciError> {
        if !self.root_seen {
            fchmod(self.root.as_raw_fd(), mode(0o755)).map_err(self.fs_err(".", "chmod root"))?;
        }
        for (comps, mtime) in self.dir_times.iter().rev() {
            let name = comps
                .iter()
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let Some((last, parents)) = comps.split_last() else {
                futimens(self.root.as_raw_fd(), &time(*mtime), &time(*mtime))
                    .map_err(self.fs_err(".", "set mtime"))?;
                continue;
            };
            let parents: Vec<&[u8]> = parents.iter().map(|c| c.as_slice()).collect();
            // A directory may have been replaced later in the layer: skip
            // quietly when it is gone, never follow anything.
            let Ok(dir) = walk(self.root.as_fd(), &parents, None) else {
                continue;
            };
            let Ok(cname) = cstring(last) else { continue };
            match lstatat(dir.as_fd(), &cname) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    lutimensat(&dir, &cname, *mtime)
                        .map_err(self.fs_err(&name, "set directory mtime"))?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn is_zero_device(h: &tar::Header) -> bool {
    matches!(h.device_major(), Ok(Some(0)) | Ok(None))
        && matches!(h.device_minor(), Ok(Some(0)) | Ok(None))
}

fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits)
}

/// Both times of an entry (atime and mtime) are its header's mtime.
fn time(mtime: i64) -> TimeSpec {
    TimeSpec::new(mtime, 0)
}

/// Owner of `name` in `dir` from the header, never following a symlink.
fn lchownat(dir: &OwnedFd, name: &CStr, meta: &Meta) -> nix::Result<()> {
    let (uid, gid) = meta.owner();
    fchownat(
        Some(dir.as_raw_fd()),
        name,
        uid,
        gid,
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
}

/// Times of `name` in `dir` (see [`time`]), never following a symlink.
fn lutimensat(dir: &OwnedFd, name: &CStr, mtime: i64) -> nix::Result<()> {
    let t = time(mtime);
    utimensat(
        Some(dir.as_raw_fd()),
        name,
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    )
}
