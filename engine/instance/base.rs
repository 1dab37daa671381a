//! Read access to a base root filesystem (its overlay lower layers), with overlay semantics.

use sandbox::layers::Rootfs;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::path::PathBuf;

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
