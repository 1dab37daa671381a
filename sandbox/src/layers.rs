//! Root filesystem sources and the read-only, content-addressed layers they become.
//!
//! - `host`: the host's system directories, read-only and live, under a *mask* layer that hides
//!   everything private (see [`plan_host_mask`]);
//! - a directory (e.g. a debootstrap output), used in place as one layer;
//! - `oci:PATH`: an OCI image layout or a `docker save` tarball, unpacked once into the layer
//!   store (see [`crate::oci`]);
//! - `docker:IMAGE`: an image of the local Docker daemon, exported and unpacked the same way
//!   (see [`crate::docker`]).

use crate::sys::{Sys, SysError};
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Errors of root filesystem resolution.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("unknown rootfs `{}`: expected `host`, `oci:PATH` (an OCI layout or docker-save tarball), `docker:IMAGE` (an image of the local Docker daemon), `debootstrap:SUITE` (a Debian suite, built once) or an existing directory", crate::text_pos::cut(.0))]
    UnknownRootfs(String),
    #[error("rootfs directory {path}: {reason}")]
    BadDirectory { path: PathBuf, reason: String },
    #[error("building the host layer: {0}")]
    HostMask(#[from] SysError),
    #[error("host layer: reading {path}: {source}")]
    Host {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("rootfs `docker:{image}`: {source}")]
    Docker {
        image: String,
        source: Box<crate::docker::DockerError>,
    },
    #[error("{0}")]
    MaskStore(#[from] crate::mask_store::MaskStoreError),
    #[error("rootfs `debootstrap:{suite}`: {source}")]
    Debootstrap {
        suite: String,
        source: Box<crate::debootstrap::DebootstrapError>,
    },
    #[error("image {path}: {source}")]
    Oci {
        path: PathBuf,
        source: crate::oci::OciError,
    },
}

/// Where a sandbox's root filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RootfsSpec {
    Host,
    Dir(PathBuf),
    Oci(PathBuf),
    /// An image of the local Docker daemon (a name, tag or id), exported into the layer store.
    Docker(String),
    /// A Debian suite made with `debootstrap --variant=minbase` once, then used in place.
    Debootstrap(crate::debootstrap::Suite),
}

impl std::str::FromStr for RootfsSpec {
    type Err = LayerError;
    fn from_str(s: &str) -> Result<Self, LayerError> {
        if s == "host" {
            return Ok(Self::Host);
        }
        if let Some(image) = s.strip_prefix("docker:") {
            if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(LayerError::UnknownRootfs(s.to_string()));
            }
            return Ok(Self::Docker(image.to_string()));
        }
        if let Some(suite) = s.strip_prefix("debootstrap:") {
            return crate::debootstrap::Suite::parse(suite)
                .map(Self::Debootstrap)
                .map_err(|source| LayerError::Debootstrap {
                    suite: suite.to_string(),
                    source: Box::new(source),
                });
        }
        if let Some(p) = s.strip_prefix("oci:") {
            return Ok(Self::Oci(PathBuf::from(p)));
        }
        let p = Path::new(s);
        if p.is_dir() {
            return Ok(Self::Dir(p.to_path_buf()));
        }
        Err(LayerError::UnknownRootfs(s.to_string()))
    }
}

impl std::fmt::Display for RootfsSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host => f.write_str("host"),
            Self::Dir(p) => write!(f, "{}", p.display()),
            Self::Oci(p) => write!(f, "oci:{}", p.display()),
            Self::Docker(image) => write!(f, "docker:{image}"),
            Self::Debootstrap(suite) => write!(f, "debootstrap:{suite}"),
        }
    }
}

/// A resolved root filesystem: its lower layers (topmost first) and a digest that identifies
/// its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rootfs {
    pub lowers: Vec<String>,
    pub digest: String,
}

/// Top-level host directories passed through read-only.
pub const HOST_PASS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Top-level directories that start empty in every sandbox (mode).
pub const HOST_FRESH: &[(&str, u32)] = &[
    ("tmp", 0o1777),
    ("root", 0o700),
    ("home", 0o755),
    ("run", 0o755),
    ("srv", 0o755),
    ("opt", 0o755),
    ("mnt", 0o755),
    ("media", 0o755),
];
/// Mount points provided by the sandbox itself.
pub const HOST_MOUNTPOINTS: &[&str] = &["proc", "sys", "dev"];

/// An entry of a host directory, as the mask planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostEntry {
    pub name: String,
    pub is_dir: bool,
    pub is_symlink: bool,
    pub mode: u32,
}

/// Read access to the host's tree (real or faked in tests).
pub trait HostView {
    fn list(&self, dir: &Path) -> Result<Vec<HostEntry>, LayerError>;
}

/// The real host.
pub struct RealHost;

impl HostView for RealHost {
    fn list(&self, dir: &Path) -> Result<Vec<HostEntry>, LayerError> {
        let err = |source| LayerError::Host {
            path: dir.to_path_buf(),
            source,
        };
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).map_err(err)? {
            let e = e.map_err(err)?;
            // The directory entry's own type says "symlink" without a stat (most of `/etc`
            // is symlinks: alternatives, certificates); Linux gives every symlink mode 0777.
            if e.file_type().map_err(err)?.is_symlink() {
                out.push(HostEntry {
                    name: e.file_name().to_string_lossy().into_owned(),
                    is_dir: false,
                    is_symlink: true,
                    mode: 0o777,
                });
                continue;
            }
            let m = match e.metadata() {
                Ok(m) => m,
                // Removed since the listing: nothing there to mask.
                Err(source) if source.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(err(source)),
            };
            out.push(HostEntry {
                name: e.file_name().to_string_lossy().into_owned(),
                is_dir: m.is_dir(),
                is_symlink: m.file_type().is_symlink(),
                mode: m.permissions().mode() & 0o7777,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// The overlay attribute that makes a directory hide what the layers below hold there.
pub(crate) const OPAQUE: &str = "trusted.overlay.opaque";

/// Lay out the mask that sits on top of the host's `/`:
/// - system directories ([`HOST_PASS`]) pass through;
/// - `/etc` passes through except every entry that is not world-readable (shadow, gshadow,
///   private keys, sudoers, ...), which is whited out;
/// - `/var` keeps only `lib/dpkg` (the package database), with fresh `tmp`, `log` and `cache`;
/// - [`HOST_FRESH`] directories are new and empty (opaque);
/// - everything else at the top level (home directories, `/work`, `/boot`, data directories,
///   files) is whited out.
pub fn plan_host_mask(
    sys: &mut dyn Sys,
    mask: &Path,
    host: &dyn HostView,
) -> Result<(), LayerError> {
    let whiteout = |sys: &mut dyn Sys, p: &Path| sys.mknod_char(p, 0, 0, 0);
    let fresh = |sys: &mut dyn Sys, p: &Path, mode: u32| -> Result<(), SysError> {
        sys.mkdir(p, mode)?;
        sys.set_xattr(p, OPAQUE, b"y")
    };
    for e in host.list(Path::new("/"))? {
        let p = mask.join(&e.name);
        let name = e.name.as_str();
        if HOST_PASS.contains(&name) || HOST_MOUNTPOINTS.contains(&name) {
            continue;
        }
        if HOST_FRESH.iter().any(|(n, _)| *n == name) {
            continue; // created below, present on the host or not
        }
        match name {
            "etc" if e.is_dir => {
                sys.mkdir(&p, e.mode)?;
                mask_private(sys, &p, Path::new("/etc"), host)?;
            }
            "var" if e.is_dir => {
                sys.mkdir(&p, e.mode)?;
                for v in host.list(Path::new("/var"))? {
                    let vp = p.join(&v.name);
                    match v.name.as_str() {
                        "lib" if v.is_dir => {
                            sys.mkdir(&vp, v.mode)?;
                            for l in host.list(Path::new("/var/lib"))? {
                                if l.name != "dpkg" {
                                    whiteout(sys, &vp.join(&l.name))?;
                                }
                            }
                        }
                        "tmp" | "log" | "cache" => {}
                        _ => whiteout(sys, &vp)?,
                    }
                }
                fresh(sys, &p.join("tmp"), 0o1777)?;
                fresh(sys, &p.join("log"), 0o755)?;
                fresh(sys, &p.join("cache"), 0o755)?;
            }
            _ => whiteout(sys, &p)?,
        }
    }
    for (name, mode) in HOST_FRESH {
        fresh(sys, &mask.join(name), *mode)?;
    }
    Ok(())
}

/// White out every entry under `host_dir` that others cannot read (recursively).
fn mask_private(
    sys: &mut dyn Sys,
    mask_dir: &Path,
    host_dir: &Path,
    host: &dyn HostView,
) -> Result<(), LayerError> {
    for e in host.list(host_dir)? {
        let p = mask_dir.join(&e.name);
        if e.is_symlink {
            continue;
        }
        if e.is_dir {
            if e.mode & 0o005 != 0o005 {
                sys.mknod_char(&p, 0, 0, 0)?;
            } else {
                // Plan the subtree once; only a subtree with something to hide gets a directory.
                let mut sub = crate::sys::Recorder::default();
                mask_private(&mut sub, &p, &host_dir.join(&e.name), host)?;
                if !sub.ops.is_empty() {
                    sys.mkdir(&p, e.mode)?;
                    sub.replay(sys)?;
                }
            }
        } else if e.mode & 0o004 == 0 {
            sys.mknod_char(&p, 0, 0, 0)?;
        }
    }
    Ok(())
}

/// Digest of the host layer: its mask plan and the package database it passes through (whose
/// own digest is remembered under `cache_dir` while the file is unchanged, see
/// [`crate::digest_cache`]).
pub fn host_digest(ops: &[crate::sys::Op], cache_dir: &Path) -> String {
    let mut h = Sha256::new();
    h.update(b"envfactory-host-v2\n");
    for op in ops {
        h.update(format!("{op:?}\n").as_bytes());
    }
    if let Some(status) =
        crate::digest_cache::file_sha256(Path::new("/var/lib/dpkg/status"), cache_dir)
    {
        h.update(b"dpkg ");
        h.update(status.as_bytes());
    }
    format!("sha256-{}", hex::encode(h.finalize()))
}

/// Digest of a directory layer used in place: names, types, modes, owners, sizes, mtimes and
/// symlink targets of every entry (contents are not read, so it is cheap; a file rewritten with
/// the same size and mtime would not change it).
pub fn dir_digest(root: &Path) -> Result<String, LayerError> {
    let bad = |reason: String| LayerError::BadDirectory {
        path: root.to_path_buf(),
        reason,
    };
    let mut h = Sha256::new();
    h.update(b"envfactory-dir-v1\n");
    let mut stack = vec![PathBuf::new()];
    let mut entries = 0u64;
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| bad(format!("{}: {e}", dir.display())))?
            .filter_map(Result::ok)
            .collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let m = e
                .metadata()
                .map_err(|err| bad(format!("{}: {err}", e.path().display())))?;
            let r = rel.join(e.file_name());
            let link = if m.file_type().is_symlink() {
                std::fs::read_link(e.path())
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            h.update(
                format!(
                    "{}\0{:o}\0{}\0{}\0{}\0{}\0{link}\n",
                    r.display(),
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.size(),
                    m.mtime_nsec() + m.mtime() * 1_000_000_000
                )
                .as_bytes(),
            );
            entries += 1;
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    if entries == 0 {
        return Err(bad("is empty".into()));
    }
    Ok(format!("sha256-{}", hex::encode(h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{Op, Recorder};
    use std::collections::HashMap;

    struct FakeHost(HashMap<&'static str, Vec<HostEntry>>);

    fn d(name: &str, mode: u32) -> HostEntry {
        HostEntry {
            name: name.into(),
            is_dir: true,
            is_symlink: false,
            mode,
        }
    }
    fn f(name: &str, mode: u32) -> HostEntry {
        HostEntry {
            name: name.into(),
            is_dir: false,
            is_symlink: false,
            mode,
        }
    }

    impl HostView for FakeHost {
        fn list(&self, dir: &Path) -> Result<Vec<HostEntry>, LayerError> {
            Ok(self
                .0
                .get(dir.to_str().unwrap())
                .cloned()
                .unwrap_or_default())
        }
    }

    fn fake() -> FakeHost {
        let mut m = HashMap::new();
        m.insert(
            "/",
            vec![
                d("usr", 0o755),
                HostEntry {
                    name: "bin".into(),
                    is_dir: false,
                    is_symlink: true,
                    mode: 0o777,
                },
                d("etc", 0o755),
                d("home", 0o755),
                d("root", 0o700),
                d("var", 0o755),
                d("work", 0o755),
                d("proc", 0o555),
                f("swapfile", 0o600),
            ],
        );
        m.insert(
            "/etc",
            vec![
                f("passwd", 0o644),
                f("shadow", 0o640),
                d("ssh", 0o755),
                d("ssl", 0o755),
                d("sudoers.d", 0o750),
            ],
        );
        m.insert(
            "/etc/ssh",
            vec![
                f("ssh_host_ed25519_key", 0o600),
                f("ssh_host_ed25519_key.pub", 0o644),
            ],
        );
        m.insert("/etc/ssl", vec![f("openssl.cnf", 0o644)]);
        m.insert(
            "/var",
            vec![d("lib", 0o755), d("log", 0o755), d("mail", 0o2775)],
        );
        m.insert(
            "/var/lib",
            vec![
                d("dpkg", 0o755),
                d("envfactory", 0o755),
                d("postgresql", 0o700),
            ],
        );
        FakeHost(m)
    }

    fn whiteouts(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .filter_map(|o| match o {
                Op::Mknod {
                    path,
                    major: 0,
                    minor: 0,
                    ..
                } => Some(path.display().to_string()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn host_mask_hides_everything_private_and_keeps_system_dirs() {
        let mut r = Recorder::default();
        plan_host_mask(&mut r, Path::new("/m"), &fake()).unwrap();
        let w = whiteouts(&r.ops);
        for hidden in [
            "/m/work",
            "/m/swapfile",
            "/m/etc/shadow",
            "/m/etc/ssh/ssh_host_ed25519_key",
            "/m/etc/sudoers.d",
            "/m/var/mail",
            "/m/var/lib/envfactory",
            "/m/var/lib/postgresql",
        ] {
            assert!(
                w.contains(&hidden.to_string()),
                "{hidden} not hidden: {w:?}"
            );
        }
        for kept in [
            "/m/usr",
            "/m/bin",
            "/m/etc/passwd",
            "/m/etc/ssh/ssh_host_ed25519_key.pub",
            "/m/var/lib/dpkg",
            "/m/proc",
        ] {
            assert!(!w.contains(&kept.to_string()), "{kept} must pass through");
        }
        // A public subtree without private entries is not even created in the mask.
        assert!(!r
            .ops
            .iter()
            .any(|o| matches!(o, Op::Mkdir { path, .. } if path == Path::new("/m/etc/ssl"))));
        let opaque: Vec<_> = r
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::SetXattr { path, name, value } if name == OPAQUE && value == b"y" => {
                    Some(path.display().to_string())
                }
                _ => None,
            })
            .collect();
        for fresh in [
            "/m/tmp",
            "/m/root",
            "/m/home",
            "/m/run",
            "/m/var/tmp",
            "/m/var/log",
        ] {
            assert!(
                opaque.contains(&fresh.to_string()),
                "{fresh} must be fresh: {opaque:?}"
            );
        }
    }

    #[test]
    fn rootfs_specs_parse_and_unknown_ones_are_named() {
        assert_eq!("host".parse::<RootfsSpec>().unwrap(), RootfsSpec::Host);
        assert_eq!(
            "oci:/x/img.tar".parse::<RootfsSpec>().unwrap(),
            RootfsSpec::Oci("/x/img.tar".into())
        );
        assert_eq!(
            "/".parse::<RootfsSpec>().unwrap(),
            RootfsSpec::Dir("/".into())
        );
        assert_eq!(
            "debootstrap:13".parse::<RootfsSpec>().unwrap().to_string(),
            "debootstrap:trixie"
        );
        let err = "debootstrap:buster".parse::<RootfsSpec>().unwrap_err();
        assert!(
            err.to_string()
                .contains("rootfs `debootstrap:buster`: `buster` is not a Debian suite"),
            "{err}"
        );
        let err = "debian:12".parse::<RootfsSpec>().unwrap_err();
        assert!(
            err.to_string().contains("unknown rootfs `debian:12`"),
            "{err}"
        );
    }

    #[test]
    fn dir_digest_changes_with_content_metadata() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("a"), "1").unwrap();
        let d1 = dir_digest(t.path()).unwrap();
        assert_eq!(d1, dir_digest(t.path()).unwrap());
        std::fs::write(t.path().join("b"), "22").unwrap();
        assert_ne!(d1, dir_digest(t.path()).unwrap());
        let empty = tempfile::tempdir().unwrap();
        assert!(dir_digest(empty.path()).is_err());
    }
}
