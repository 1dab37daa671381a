//! File requests served without forking: read, write, stat, list.
//!
//! Every path is resolved with `openat2(RESOLVE_IN_ROOT)` against the sandbox root, so a
//! symlink planted by an agent (`/x -> /etc/shadow`, `..` chains) can never lead init to a file
//! outside the sandbox.

use super::Init;
use crate::protocol::{DirEntry, FailureKind, FileKind, FileStat, Overview, Response, ShownEntry};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat as RawStat, SFlag};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn failed(path: &str, e: Errno) -> Response {
    Response::Failed {
        kind: failure_kind(e),
        message: format!("{path}: {}", e.desc()),
    }
}

/// Whose failure an errno of a file request is: the agent's state (`NotFound`, `Denied`,
/// `Invalid`) or init's own (`Internal`).
fn failure_kind(e: Errno) -> FailureKind {
    match e {
        // ESRCH: a process that exited between the open and the read of its /proc file is
        // not there any more, as when the open itself comes too late (ENOENT).
        Errno::ENOENT | Errno::ENOTDIR | Errno::ESRCH => FailureKind::NotFound,
        Errno::EACCES | Errno::EPERM | Errno::EROFS => FailureKind::Denied,
        Errno::EINVAL | Errno::EISDIR | Errno::ELOOP | Errno::EXDEV | Errno::ENXIO => {
            FailureKind::Invalid
        }
        _ => FailureKind::Internal,
    }
}

/// `openat2(dirfd, path, flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`.
fn open_in_root(root: &OwnedFd, path: &str, flags: OFlag, mode: u32) -> Result<OwnedFd, Errno> {
    let c = CString::new(path.trim_start_matches('/')).map_err(|_| Errno::EINVAL)?;
    let c = if c.as_bytes().is_empty() {
        CString::from(c".")
    } else {
        c
    };
    // SAFETY: open_how is plain old data; zeroed is valid, then the fields are set.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | OFlag::O_CLOEXEC).bits() as u64;
    how.mode = if flags.contains(OFlag::O_CREAT) {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // With RESOLVE_IN_ROOT the kernel answers EAGAIN when a mount or rename anywhere raced a
    // `..` step of the lookup (other sandboxes mount all the time); openat2(2) says to retry.
    let mut tries = 0;
    loop {
        // SAFETY: valid descriptor, NUL-terminated path and an open_how of the size we pass.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel returned a fresh descriptor.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = Errno::last();
        tries += 1;
        if e != Errno::EAGAIN || tries >= 64 {
            return Err(e);
        }
    }
}

/// An `O_PATH` descriptor of a path inside the root (symlinks resolved within it).
pub(crate) fn open_path_in_root(root: &OwnedFd, path: &str) -> Result<OwnedFd, Errno> {
    open_in_root(root, path, OFlag::O_PATH, 0)
}

/// Split an absolute sandbox path into its parent and last component.
fn split(path: &str) -> Result<(&str, &str), Errno> {
    if !path.starts_with('/') {
        return Err(Errno::EINVAL);
    }
    let t = path.trim_end_matches('/');
    match t.rsplit_once('/') {
        Some((parent, name)) if !name.is_empty() && name != "." && name != ".." => {
            Ok((if parent.is_empty() { "/" } else { parent }, name))
        }
        _ => Err(Errno::EISDIR),
    }
}

pub(crate) fn to_stat(st: &RawStat, target: Option<String>) -> FileStat {
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let kind = match fmt {
        SFlag::S_IFDIR => FileKind::Dir,
        SFlag::S_IFLNK => FileKind::Symlink,
        SFlag::S_IFCHR => FileKind::CharDevice,
        SFlag::S_IFBLK => FileKind::BlockDevice,
        SFlag::S_IFIFO => FileKind::Fifo,
        SFlag::S_IFSOCK => FileKind::Socket,
        _ => FileKind::File,
    };
    FileStat {
        kind,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
        symlink_target: target,
    }
}

fn lstat_at(dir: &OwnedFd, name: &str) -> Result<FileStat, Errno> {
    let st = nix::sys::stat::fstatat(
        Some(dir.as_raw_fd()),
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    let target = if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
        nix::fcntl::readlinkat(Some(dir.as_raw_fd()), name)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(to_stat(&st, target))
}

impl Init {
    fn root(&self) -> Result<&OwnedFd, Errno> {
        self.root_fd.as_ref().ok_or(Errno::ESTALE)
    }

    pub(super) fn read_file(&mut self, path: &str, max: u64, nofollow: bool) -> Response {
        match self.root() {
            Ok(root) => read_in_root(root, path, max, nofollow),
            Err(e) => failed(path, e),
        }
    }

    pub(super) fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Response {
        let owner = self.plan.userns.map(|(base, _)| base);
        match self.root() {
            Ok(root) => write_in_root(root, path, data, mode, owner),
            Err(e) => failed(path, e),
        }
    }

    pub(super) fn stat(&mut self, path: &str) -> Response {
        match self.root() {
            Ok(root) => stat_in_root(root, path),
            Err(e) => failed(path, e),
        }
    }

    pub(super) fn list_dir(&mut self, path: &str) -> Response {
        match self.root() {
            Ok(root) => list_in_root(root, path),
            Err(e) => failed(path, e),
        }
    }

    /// [`Overview`]: the directory's first `max` names and kinds, and the upper layer's usage.
    pub(super) fn overview(&mut self, path: &str, max: u32) -> Response {
        let upper_bytes = super::fs_usage(&self.layout.rw()).0;
        match self.root() {
            Ok(root) => overview_in_root(root, path, max, upper_bytes),
            Err(e) => failed(path, e),
        }
    }
}

/// Read a regular file (up to `max` bytes) under `root`; with `nofollow` a final symlink is
/// `Invalid`. Also used by other backends over their own root directory.
pub(crate) fn read_in_root(root: &OwnedFd, path: &str, max: u64, nofollow: bool) -> Response {
    let r = (|| {
        if !path.starts_with('/') {
            return Err(Errno::EINVAL);
        }
        // O_NONBLOCK: opening a FIFO (swapped in for a file an agent expects to be read)
        // must not block init; regular files read the same with it.
        // O_NOFOLLOW: a final symlink is ELOOP, reported as "not a regular file".
        let follow = if nofollow {
            OFlag::O_NOFOLLOW
        } else {
            OFlag::empty()
        };
        let fd = open_in_root(
            root,
            path,
            OFlag::O_RDONLY | OFlag::O_NOCTTY | OFlag::O_NONBLOCK | follow,
            0,
        )?;
        let st = nix::sys::stat::fstat(fd.as_raw_fd())?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(Errno::EINVAL);
        }
        // Read straight into the answer: room for the size it has now and one byte more, to
        // see without another read whether it grew (a file growing under us is read on), and
        // at least a page, so that a file whose size says 0 (`/proc`, `/sys`) is read in one
        // go as before, not in growing small reads.
        let want = (st.st_size as u64).max(4095).min(max).saturating_add(1);
        let mut data = Vec::with_capacity(want as usize);
        let mut file = std::fs::File::from(fd).take(max.saturating_add(1));
        file.read_to_end(&mut data)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let truncated = data.len() as u64 > max;
        data.truncate(max as usize);
        Ok(Response::File { data, truncated })
    })();
    r.unwrap_or_else(|e| failed(path, e))
}

/// Create or replace a file under `root` (never through a final symlink); `owner`: the uid and
/// gid it gets (root of a user namespace), else the writer's.
pub(crate) fn write_in_root(
    root: &OwnedFd,
    path: &str,
    data: &[u8],
    mode: u32,
    owner: Option<u32>,
) -> Response {
    let r = (|| {
        split(path)?;
        // Non-blocking and not truncating until the file is known to be a regular one: a FIFO
        // or device node planted at the path must neither block the writer (on the Docker
        // backend that is the engine itself) nor receive the data.
        let fd = open_in_root(
            root,
            path,
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY,
            mode & 0o7777,
        )?;
        let st = nix::sys::stat::fstat(fd.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Errno::EINVAL);
        }
        nix::unistd::ftruncate(&fd, 0)?;
        let mut off = 0;
        while off < data.len() {
            off += nix::unistd::write(&fd, &data[off..])?;
        }
        // Owned by root as the sandbox sees it (in a user namespace, its host uid).
        if let Some(base) = owner {
            nix::unistd::fchown(
                fd.as_raw_fd(),
                Some(nix::unistd::Uid::from_raw(base)),
                Some(nix::unistd::Gid::from_raw(base)),
            )?;
        }
        nix::sys::stat::fchmod(
            fd.as_raw_fd(),
            nix::sys::stat::Mode::from_bits_truncate(mode & 0o7777),
        )?;
        Ok(Response::Ok)
    })();
    r.unwrap_or_else(|e| failed(path, e))
}

/// `lstat` of a path under `root` (the root itself for `/`).
pub(crate) fn stat_in_root(root: &OwnedFd, path: &str) -> Response {
    let r = (|| {
        if path.trim_end_matches('/').is_empty() && path.starts_with('/') {
            let st = nix::sys::stat::fstat(root.as_raw_fd())?;
            return Ok(Response::Stat(to_stat(&st, None)));
        }
        let (parent, name) = split(path)?;
        let dir = open_in_root(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY, 0)?;
        Ok(Response::Stat(lstat_at(&dir, name)?))
    })();
    r.unwrap_or_else(|e| failed(path, e))
}

/// The entries of a directory under `root`, sorted by name, each with its `lstat`.
pub(crate) fn list_in_root(root: &OwnedFd, path: &str) -> Response {
    let r = (|| {
        if !path.starts_with('/') {
            return Err(Errno::EINVAL);
        }
        let fd = open_in_root(root, path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)?;
        let probe = nix::unistd::dup(fd.as_raw_fd())?;
        // SAFETY: dup returned a fresh descriptor.
        let probe = unsafe { OwnedFd::from_raw_fd(probe) };
        // `Dir` owns the descriptor from here (and closes it itself when `fdopendir` fails).
        let mut dir = nix::dir::Dir::from(fd)?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            if let Ok(stat) = lstat_at(&probe, &name) {
                out.push(DirEntry { name, stat });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::Dir(out))
    })();
    r.unwrap_or_else(|e| failed(path, e))
}

/// The first `max` entries of directory `path` under `root`, each with whether it is a
/// directory, in the order an observation shows them (by name, a directory's with a `/` after
/// it); `Ok(None)` when the agent made it unlistable (gone, not a directory, not readable, a
/// bad path), `Err` when init itself failed opening it (descriptors, memory, I/O; an error
/// while reading the entries ends nix's iterator early, as in [`list_in_root`]). The kind comes from
/// the entry's own type (`d_type`); only an entry whose filesystem gives none is `lstat`ed.
/// As in [`list_in_root`], a name that is not UTF-8 is left out. At most `max` entries are
/// held at a time, whatever the directory's size.
fn names_in_root(root: &OwnedFd, path: &str, max: usize) -> Result<Option<Vec<ShownEntry>>, Errno> {
    let agents = |e: Errno| match e {
        // A cwd longer than the kernel takes is one the agent made (its `PWD`): no listing.
        // (Other requests keep ENAMETOOLONG as init's failure: a path a verifier builds past
        // PATH_MAX, which the kernel still resolves link by link, must never read as absent.)
        Errno::ENAMETOOLONG => Ok(None),
        e if failure_kind(e) == FailureKind::Internal => Err(e),
        _ => Ok(None),
    };
    if !path.starts_with('/') {
        return agents(Errno::EINVAL);
    }
    let fd = match open_in_root(root, path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0) {
        Ok(fd) => fd,
        Err(e) => return agents(e),
    };
    // `Dir` owns the descriptor from here (and closes it itself when `fdopendir` fails).
    let mut dir = nix::dir::Dir::from(fd)?;
    let dirfd = dir.as_raw_fd();
    // The `max` first entries in shown order, the last of them on top.
    let mut kept: std::collections::BinaryHeap<Shown> = std::collections::BinaryHeap::new();
    for e in dir.iter() {
        let e = e?;
        let Ok(name) = e.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let is_dir = match e.file_type() {
            Some(t) => t == nix::dir::Type::Directory,
            None => match nix::sys::stat::fstatat(
                Some(dirfd),
                name,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR,
                Err(_) => continue, // gone meanwhile, as `list_in_root` leaves it out
            },
        };
        let entry = Shown(ShownEntry {
            name: name.to_string(),
            is_dir,
        });
        if kept.len() < max {
            kept.push(entry);
        } else if kept.peek().is_some_and(|last| entry < *last) {
            kept.pop();
            kept.push(entry);
        }
    }
    let mut out: Vec<ShownEntry> = kept.into_iter().map(|s| s.0).collect();
    ShownEntry::sort_shown(&mut out);
    Ok(Some(out))
}

/// [`Overview`] of directory `path` under `root` with the caller's disk usage; an error left
/// after the agent's errnos is init's own failure (`Internal`). Also used by other backends
/// over their own root directory.
pub(crate) fn overview_in_root(root: &OwnedFd, path: &str, max: u32, upper_bytes: u64) -> Response {
    match names_in_root(root, path, max as usize) {
        Ok(entries) => Response::Overview(Overview {
            entries,
            upper_bytes,
        }),
        Err(e) => Response::Failed {
            kind: FailureKind::Internal,
            message: format!("{path}: {}", e.desc()),
        },
    }
}

/// An entry ordered as [`ShownEntry::sort_shown`] orders them.
#[derive(PartialEq, Eq)]
struct Shown(ShownEntry);

impl Ord for Shown {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.shown_cmp(&o.0)
    }
}

impl PartialOrd for Shown {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_parent_and_name() {
        assert_eq!(split("/etc/passwd"), Ok(("/etc", "passwd")));
        assert_eq!(split("/x"), Ok(("/", "x")));
        assert_eq!(split("/a/b/"), Ok(("/a", "b")));
        assert_eq!(split("rel"), Err(Errno::EINVAL));
        assert_eq!(split("/"), Err(Errno::EISDIR));
        assert_eq!(split("/a/.."), Err(Errno::EISDIR));
    }

    #[test]
    fn a_process_gone_mid_read_is_absent_not_an_internal_error() {
        for e in [Errno::ENOENT, Errno::ESRCH] {
            match failed("/proc/7/stat", e) {
                Response::Failed { kind, .. } => assert_eq!(kind, FailureKind::NotFound),
                other => panic!("{other:?}"),
            }
        }
    }
}
