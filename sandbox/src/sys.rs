//! The syscall boundary of mount planning: a trait with the real implementation and a
//! recording fake, so the order and arguments of every mount are unit-tested without root.

use nix::mount::{MntFlags, MsFlags};
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

/// One operation, as recorded by [`Recorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Mount {
        source: String,
        target: PathBuf,
        fstype: String,
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

/// `lsetxattr(2)`.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    // SAFETY: both strings are valid NUL-terminated C strings that outlive the call, and the
    // value pointer/length pair describes a live slice.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
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

/// Records every operation instead of performing it.
#[derive(Debug, Default)]
pub struct Recorder {
    pub ops: Vec<Op>,
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
