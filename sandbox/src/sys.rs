//! The syscall boundary of mount planning: a trait with the real implementation and a
//! recording fake, so the order and arguments of every mount are unit-tested without root.
//! Also the few descriptor-level wrappers that `nix` lacks (xattrs) or returns raw (`openat`).

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// A failed filesystem operation, naming the operation and its target.
#[derive(Debug, thiserror::Error)]
#[error("{op} {target}: {source}")]
pub struct SysError {
    pub op: &'static str,
    pub target: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl SysError {
    pub fn new(op: &'static str, target: &Path, source: impl Into<std::io::Error>) -> Self {
        Self {
            op,
            target: target.to_path_buf(),
            source: source.into(),
        }
    }

    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// One operation, as recorded by [`Recorder`] (and remembered across processes, see
/// [`crate::host_walk`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    Mount {
        source: String,
        target: PathBuf,
        fstype: String,
        #[serde(with = "ms_flags")]
        flags: MsFlags,
        data: String,
    },
    Umount {
        target: PathBuf,
        detach: bool,
    },
    Mkdir {
        path: PathBuf,
        mode: u32,
    },
    Mknod {
        path: PathBuf,
        mode: u32,
        major: u64,
        minor: u64,
    },
    Symlink {
        target: String,
        link: PathBuf,
    },
    SetXattr {
        path: PathBuf,
        name: String,
        value: Vec<u8>,
    },
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
    },
}

/// The filesystem syscalls that mount planning needs.
pub trait Sys {
    fn mount(
        &mut self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: &str,
    ) -> Result<(), SysError>;
    fn umount(&mut self, target: &Path, detach: bool) -> Result<(), SysError>;
    fn mkdir(&mut self, path: &Path, mode: u32) -> Result<(), SysError>;
    fn mknod_char(
        &mut self,
        path: &Path,
        mode: u32,
        major: u64,
        minor: u64,
    ) -> Result<(), SysError>;
    fn symlink(&mut self, target: &str, link: &Path) -> Result<(), SysError>;
    fn set_xattr(&mut self, path: &Path, name: &str, value: &[u8]) -> Result<(), SysError>;
    fn chown(&mut self, path: &Path, uid: u32, gid: u32) -> Result<(), SysError>;
}

/// The real kernel.
#[derive(Debug, Default)]
pub struct RealSys;

impl Sys for RealSys {
    fn mount(
        &mut self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: &str,
    ) -> Result<(), SysError> {
        let fstype = (!fstype.is_empty()).then_some(fstype);
        let data = (!data.is_empty()).then_some(data);
        nix::mount::mount(Some(source), target, fstype, flags, data)
            .map_err(|e| SysError::new("mount", target, e))
    }

    fn umount(&mut self, target: &Path, detach: bool) -> Result<(), SysError> {
        let flags = if detach {
            MntFlags::MNT_DETACH
        } else {
            MntFlags::empty()
        };
        nix::mount::umount2(target, flags).map_err(|e| SysError::new("umount", target, e))
    }

    fn mkdir(&mut self, path: &Path, mode: u32) -> Result<(), SysError> {
        match nix::unistd::mkdir(path, nix::sys::stat::Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(SysError::new("mkdir", path, e)),
        }
        // mkdir applies the umask; set the exact mode.
        nix::sys::stat::fchmodat(
            None,
            path,
            nix::sys::stat::Mode::from_bits_truncate(mode),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| SysError::new("chmod", path, e))
    }

    fn mknod_char(
        &mut self,
        path: &Path,
        mode: u32,
        major: u64,
        minor: u64,
    ) -> Result<(), SysError> {
        nix::sys::stat::mknod(
            path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(mode),
            nix::sys::stat::makedev(major, minor),
        )
        .map_err(|e| SysError::new("mknod", path, e))?;
        nix::sys::stat::fchmodat(
            None,
            path,
            nix::sys::stat::Mode::from_bits_truncate(mode),
            nix::sys::stat::FchmodatFlags::NoFollowSymlink,
        )
        .map_err(|e| SysError::new("chmod", path, e))
    }

    fn symlink(&mut self, target: &str, link: &Path) -> Result<(), SysError> {
        std::os::unix::fs::symlink(target, link).map_err(|e| SysError::new("symlink", link, e))
    }

    fn set_xattr(&mut self, path: &Path, name: &str, value: &[u8]) -> Result<(), SysError> {
        set_xattr(path, name, value).map_err(|e| SysError::new("setxattr", path, e))
    }

    fn chown(&mut self, path: &Path, uid: u32, gid: u32) -> Result<(), SysError> {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(|e| SysError::new("chown", path, e))
    }
}

/// The text of a kernel file (`/proc`, `/sys`): these report a size of 0, so a plain
/// `read_to_string` reads them through a chain of small buffers (32, 32, 64, ... bytes, a
/// syscall each); this reads into one buffer of `PROC_READ` bytes and grows only past it.
pub fn read_proc(path: impl AsRef<Path>) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = String::with_capacity(PROC_READ);
    f.read_to_string(&mut buf)?;
    Ok(buf)
}

const PROC_READ: usize = 16 << 10;

/// `lsetxattr(2)`.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    set_xattr_with(name, value, |n, v, len| {
        // SAFETY: `p` and `n` are valid NUL-terminated C strings that outlive the call, and the
        // value pointer/length pair describes a live slice.
        unsafe { libc::lsetxattr(p.as_ptr(), n, v, len, 0) }
    })
}

/// `fsetxattr(2)`: [`set_xattr`] on an open descriptor, so no path is resolved again.
pub(crate) fn fset_xattr(fd: BorrowedFd<'_>, name: &str, value: &[u8]) -> std::io::Result<()> {
    set_xattr_with(name, value, |n, v, len| {
        // SAFETY: `fd` is a live descriptor, `n` a valid NUL-terminated C string that outlives
        // the call, and the value pointer/length pair describes a live slice.
        unsafe { libc::fsetxattr(fd.as_raw_fd(), n, v, len, 0) }
    })
}

/// Call `set` with the attribute's name (a C string) and the value's pointer and length, all
/// valid for the call, and turn its status into a result.
fn set_xattr_with(
    name: &str,
    value: &[u8],
    set: impl FnOnce(*const libc::c_char, *const libc::c_void, usize) -> libc::c_int,
) -> std::io::Result<()> {
    let n = std::ffi::CString::new(name)?;
    if set(n.as_ptr(), value.as_ptr().cast(), value.len()) == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `lgetxattr(2)`; `None` when the attribute is absent.
pub fn get_xattr(path: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings; the buffer pointer/length pair describes a live, writable slice.
    let rc = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(rc as usize);
    Ok(Some(buf))
}

/// `openat(2)` below `dir`, as an owned descriptor (nix 0.29 returns a raw one).
pub(crate) fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: OFlag,
    mode: Mode,
) -> std::io::Result<OwnedFd> {
    let fd = nix::fcntl::openat(Some(dir.as_raw_fd()), name, flags, mode)?;
    // SAFETY: `fd` was just returned by openat and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `renameat2(from, to, RENAME_NOREPLACE)`: fails with `EEXIST` where `to` exists instead of
/// replacing it. The raw syscall: `nix` wraps it for glibc only, and the musl-linked `engine`
/// front builds this crate too (engine/front/Cargo.toml); the syscall does not depend on the
/// C library's version either.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> nix::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    const RENAME_NOREPLACE: libc::c_uint = 1;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| nix::errno::Errno::EINVAL)
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that outlive the call; no other memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            RENAME_NOREPLACE,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// Mount flags as their bits.
mod ms_flags {
    use nix::mount::MsFlags;

    pub fn serialize<S: serde::Serializer>(f: &MsFlags, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(f.bits())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<MsFlags, D::Error> {
        let bits = <u64 as serde::Deserialize>::deserialize(d)?;
        Ok(MsFlags::from_bits_retain(bits))
    }
}

/// Records every operation instead of performing it.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Recorder {
    pub ops: Vec<Op>,
}

impl Recorder {
    /// The same operations with every absolute path moved under `base`.
    pub fn rebased(&self, base: &Path) -> Recorder {
        let mv = |p: &Path| base.join(p.strip_prefix("/").unwrap_or(p));
        let ops = self
            .ops
            .iter()
            .cloned()
            .map(|op| match op {
                Op::Mount {
                    source,
                    target,
                    fstype,
                    flags,
                    data,
                } => Op::Mount {
                    source,
                    target: mv(&target),
                    fstype,
                    flags,
                    data,
                },
                Op::Umount { target, detach } => Op::Umount {
                    target: mv(&target),
                    detach,
                },
                Op::Mkdir { path, mode } => Op::Mkdir {
                    path: mv(&path),
                    mode,
                },
                Op::Mknod {
                    path,
                    mode,
                    major,
                    minor,
                } => Op::Mknod {
                    path: mv(&path),
                    mode,
                    major,
                    minor,
                },
                Op::Symlink { target, link } => Op::Symlink {
                    target,
                    link: mv(&link),
                },
                Op::SetXattr { path, name, value } => Op::SetXattr {
                    path: mv(&path),
                    name,
                    value,
                },
                Op::Chown { path, uid, gid } => Op::Chown {
                    path: mv(&path),
                    uid,
                    gid,
                },
            })
            .collect();
        Recorder { ops }
    }

    /// Perform the recorded operations, in order, on `sys`.
    pub fn replay(&self, sys: &mut dyn Sys) -> Result<(), SysError> {
        for op in &self.ops {
            match op {
                Op::Mount {
                    source,
                    target,
                    fstype,
                    flags,
                    data,
                } => sys.mount(source, target, fstype, *flags, data)?,
                Op::Umount { target, detach } => sys.umount(target, *detach)?,
                Op::Mkdir { path, mode } => sys.mkdir(path, *mode)?,
                Op::Mknod {
                    path,
                    mode,
                    major,
                    minor,
                } => sys.mknod_char(path, *mode, *major, *minor)?,
                Op::Symlink { target, link } => sys.symlink(target, link)?,
                Op::SetXattr { path, name, value } => sys.set_xattr(path, name, value)?,
                Op::Chown { path, uid, gid } => sys.chown(path, *uid, *gid)?,
            }
        }
        Ok(())
    }
}

impl Sys for Recorder {
    fn mount(
        &mut self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: &str,
    ) -> Result<(), SysError> {
        self.ops.push(Op::Mount {
            source: source.into(),
            target: target.into(),
            fstype: fstype.into(),
            flags,
            data: data.into(),
        });
        Ok(())
    }

    fn umount(&mut self, target: &Path, detach: bool) -> Result<(), SysError> {
        self.ops.push(Op::Umount {
            target: target.into(),
            detach,
        });
        Ok(())
    }

    fn mkdir(&mut self, path: &Path, mode: u32) -> Result<(), SysError> {
        self.ops.push(Op::Mkdir {
            path: path.into(),
            mode,
        });
        Ok(())
    }

    fn mknod_char(
        &mut self,
        path: &Path,
        mode: u32,
        major: u64,
        minor: u64,
    ) -> Result<(), SysError> {
        self.ops.push(Op::Mknod {
            path: path.into(),
            mode,
            major,
            minor,
        });
        Ok(())
    }

    fn symlink(&mut self, target: &str, link: &Path) -> Result<(), SysError> {
        self.ops.push(Op::Symlink {
            target: target.into(),
            link: link.into(),
        });
        Ok(())
    }

    fn set_xattr(&mut self, path: &Path, name: &str, value: &[u8]) -> Result<(), SysError> {
        self.ops.push(Op::SetXattr {
            path: path.into(),
            name: name.into(),
            value: value.to_vec(),
        });
        Ok(())
    }

    fn chown(&mut self, path: &Path, uid: u32, gid: u32) -> Result<(), SysError> {
        self.ops.push(Op::Chown {
            path: path.into(),
            uid,
            gid,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_rebase_and_replay_in_order() {
        let mut plan = Recorder::default();
        plan.mkdir(Path::new("/etc"), 0o755).unwrap();
        plan.mknod_char(Path::new("/etc/shadow"), 0, 0, 0).unwrap();
        plan.set_xattr(Path::new("/tmp"), "trusted.overlay.opaque", b"y")
            .unwrap();
        let moved = plan.rebased(Path::new("/mask"));
        let mut out = Recorder::default();
        moved.replay(&mut out).unwrap();
        assert_eq!(
            out.ops,
            vec![
                Op::Mkdir {
                    path: "/mask/etc".into(),
                    mode: 0o755
                },
                Op::Mknod {
                    path: "/mask/etc/shadow".into(),
                    mode: 0,
                    major: 0,
                    minor: 0
                },
                Op::SetXattr {
                    path: "/mask/tmp".into(),
                    name: "trusted.overlay.opaque".into(),
                    value: b"y".to_vec()
                },
            ]
        );
    }

    #[test]
    fn rename_noreplace_moves_into_a_free_name_and_never_over_an_existing_one() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join("f"), "a").unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(b.join("f"), "b").unwrap();
        // Onto an existing name (a non-empty directory here): refused, both left as they were.
        assert_eq!(rename_noreplace(&a, &b), Err(nix::errno::Errno::EEXIST));
        assert_eq!(std::fs::read_to_string(a.join("f")).unwrap(), "a");
        assert_eq!(std::fs::read_to_string(b.join("f")).unwrap(), "b");
        // Onto a free name: moved.
        rename_noreplace(&a, &c).unwrap();
        assert!(!a.exists());
        assert_eq!(std::fs::read_to_string(c.join("f")).unwrap(), "a");
        // A path with an interior NUL: refused (EINVAL) before the syscall, nothing moved.
        use std::os::unix::ffi::OsStrExt;
        let bad = Path::new(std::ffi::OsStr::from_bytes(b"x\0y"));
        assert_eq!(rename_noreplace(&c, bad), Err(nix::errno::Errno::EINVAL));
        assert!(c.exists());
    }
}
