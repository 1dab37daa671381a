//! Snapshots: the current diff (the overlay's upper directory) frozen into a read-only layer,
//! and rollback to one.

use super::Init;
use crate::mounts::Layout;
use crate::protocol::{FailureKind, Response};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// A frozen layer and the full stack under the root it was taken from (topmost first).
pub(crate) struct Snapshot {
    pub id: u32,
    pub stack: Vec<String>,
}

const OPAQUE: &str = "trusted.overlay.opaque";

/// Copy an overlay upper tree into `dst`, keeping whiteouts, opaque markers, modes, owners,
/// symlinks and modification times (hard links become separate files).
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<u64> {
    let meta = std::fs::symlink_metadata(src)?;
    let mut bytes = 0;
    std::fs::create_dir(dst)?;
    if let Some(v) = crate::sys::get_xattr(src, OPAQUE)? {
        crate::sys::set_xattr(dst, OPAQUE, &v)?;
    }
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let (s, d) = (e.path(), dst.join(e.file_name()));
        let m = e.metadata()?;
        let ft = m.file_type();
        if ft.is_dir() {
            bytes += copy_tree(&s, &d)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&s)?, &d)?;
        } else if ft.is_file() {
            bytes += std::fs::copy(&s, &d)?;
        } else if ft.is_char_device() || ft.is_fifo() || ft.is_block_device() {
            // Whiteouts are character devices 0:0; keep every special file as it is.
            let kind =
                nix::sys::stat::SFlag::from_bits_truncate(m.mode()) & nix::sys::stat::SFlag::S_IFMT;
            nix::sys::stat::mknod(
                &d,
                kind,
                nix::sys::stat::Mode::from_bits_truncate(m.mode()),
                m.rdev(),
            )?;
        } else {
            continue; // sockets are not state
        }
        finish(&d, &m)?;
    }
    finish(dst, &meta)?;
    Ok(bytes)
}

/// The apparent size of the regular files under `src` (links not followed), or `None` once
/// it passes `limit`.
pub(crate) fn apparent_size(src: &Path, limit: u64) -> std::io::Result<Option<u64>> {
    let mut total = 0u64;
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total = total.saturating_add(m.len());
                if total > limit {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(total))
}

fn finish(path: &Path, m: &std::fs::Metadata) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(m.uid()), Some(m.gid()))?;
    if !m.file_type().is_symlink() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
    }
    let t = nix::sys::time::TimeSpec::new(m.mtime(), m.mtime_nsec());
    nix::sys::stat::utimensat(
        None,
        path,
        &t,
        &t,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )?;
    Ok(())
}

pub(crate) fn remove_all(layout: &Layout) {
    if let Ok(d) = std::fs::read_dir(layout.snapshots()) {
        for e in d.flatten() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Init {
    pub(super) fn snapshot(&mut self) -> Response {
        let id = self.snapshots.last().map_or(1, |s| s.id + 1);
        let dst = self.layout.snapshot(id);
        // Stop every process while the diff is copied, so the layer is consistent.
        // SAFETY: kill with integer arguments.
        unsafe { libc::kill(-1, libc::SIGSTOP) };
        let copied = copy_tree(&self.layout.upper(), &dst);
        // SAFETY: kill with integer arguments.
        unsafe { libc::kill(-1, libc::SIGCONT) };
        match copied {
            Ok(bytes) => {
                tracing::debug!(snapshot = id, bytes, "snapshot taken");
                let mut stack = vec![dst.to_string_lossy().into_owned()];
                stack.extend(self.current.iter().cloned());
                self.snapshots.push(Snapshot { id, stack });
                Response::Snapshot(id)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dst);
                Response::Failed {
                    kind: FailureKind::Internal,
                    message: format!("snapshot {id}: copying the diff: {e}"),
                }
            }
        }
    }

    pub(super) fn rollback(&mut self, id: u32) -> Response {
        let Some(stack) = self
            .snapshots
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.stack.clone())
        else {
            return Response::Failed {
                kind: FailureKind::NotFound,
                message: format!("no snapshot {id} in this episode"),
            };
        };
        self.current = stack;
        match self.remount() {
            Ok(()) => Response::Ok,
            Err(e) => Response::Failed {
                kind: FailureKind::Internal,
                message: format!("rollback to {id}: {e}"),
            },
        }
    }
}
