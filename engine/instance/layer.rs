//! The layer under construction: entries keyed by absolute path, written out as one
//! read-only overlay layer with fixed times and sorted writes.

use super::base::BaseView;
use super::InstanceError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Fixed modification time of every file written into a layer (2024-01-01T00:00:00Z).
const LAYER_MTIME: i64 = 1_704_067_200;

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
    pub fn materialize(&self, dst: &Path, base: &BaseView) -> Result<(), InstanceError> {
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| InstanceError::Write { path, source }
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
                    .map_err(|e| InstanceError::Write {
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
