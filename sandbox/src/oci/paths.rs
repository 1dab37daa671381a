//! Hostile paths: lexical normalisation of archive names, and the `O_NOFOLLOW`
//! directory walk that every write below a layer root goes through.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode};

/// Lexically normalises a slash-separated path: drops empty and `.` parts,
/// resolves `..` against earlier parts. Fails when `..` would climb above the
/// root or the path contains a NUL byte.
pub(super) fn normalize(raw: &[u8]) -> Result<Vec<&[u8]>, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".into());
    }
    let mut out: Vec<&[u8]> = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err("`..` climbs above the layer root".into());
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

pub(super) fn join(comps: &[&[u8]]) -> String {
    let parts: Vec<String> = comps
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    parts.join("/")
}

pub(super) fn cstring(b: &[u8]) -> Result<CString, std::ffi::NulError> {
    CString::new(b)
}

/// Opens a directory by path; `follow` decides whether a final symlink is
/// followed (yes for the caller-given source, no for our temp dirs).
pub(super) fn open_dir_path(p: &Path, follow: bool) -> io::Result<OwnedFd> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    // Read-only; the standard library adds O_CLOEXEC.
    let dir = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | nofollow)
        .open(p)?;
    Ok(OwnedFd::from(dir))
}

/// Walks `comps` below `root` one component at a time with
/// `O_NOFOLLOW | O_DIRECTORY`, creating missing directories (0755, counted
/// in `*create`) if `create` is given.
/// Errors (as a reason string) on symlinks and non-directories.
pub(super) fn walk(
    root: BorrowedFd<'_>,
    comps: &[&[u8]],
    mut create: Option<&mut u64>,
) -> Result<OwnedFd, String> {
    let mut cur = root
        .try_clone_to_owned()
        .map_err(|e| format!("cannot dup layer root: {e}"))?;
    for (i, comp) in comps.iter().enumerate() {
        let shown = || join(&comps[..=i]);
        let c = cstring(comp).map_err(|_| "NUL in path".to_string())?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let next = match crate::sys::openat(cur.as_fd(), &c, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create.is_some() => {
                // nix's errors are shown as I/O errors (`... (os error N)`), like the others.
                mkdirat(
                    Some(cur.as_raw_fd()),
                    c.as_c_str(),
                    Mode::from_bits_truncate(0o755),
                )
                .map_err(|e| {
                    format!("cannot create parent {:?}: {}", shown(), io::Error::from(e))
                })?;
                if let Some(created) = create.as_deref_mut() {
                    *created += 1;
                }
                let fd = crate::sys::openat(cur.as_fd(), &c, flags, Mode::empty())
                    .map_err(|e| format!("cannot open parent {:?}: {e}", shown()))?;
                // mkdirat honours the umask: set the mode explicitly.
                fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(0o755)).map_err(|e| {
                    format!("cannot chmod parent {:?}: {}", shown(), io::Error::from(e))
                })?;
                fd
            }
            Err(e) => {
                let what = match lstatat(cur.as_fd(), &c) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                        "is a symlink (refusing to write through it)".to_string()
                    }
                    Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                        "is not a directory".to_string()
                    }
                    _ => format!("cannot be opened: {e}"),
                };
                return Err(format!("parent {:?} {what}", shown()));
            }
        };
        cur = next;
    }
    Ok(cur)
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)`: a symlink is stated itself, never followed.
pub(super) fn lstatat(dir: BorrowedFd<'_>, name: &CStr) -> nix::Result<libc::stat> {
    fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
}
