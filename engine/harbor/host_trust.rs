//! The host's CA bundle for build steps on a debootstrapped suite ([`HostTrust`]): what the
//! host trusts for TLS, as steps on the `host` base see it, and not in the image.

use super::HarborError;
use sandbox::RootfsSpec;
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What the host trusts for TLS: build steps on a debootstrapped suite see it in place of the
/// suite's bundle, as steps on the `host` base do (a registry behind a TLS-intercepting
/// egress, whose CA the host holds, is then reachable from both).
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The host's CA bundle as a layer of the store holding only that file at its usual path, for
/// build steps on a debootstrapped suite: topmost in their sandbox (so a step that changes the
/// suite's bundle does not drop the host's for the next), not in the image.
pub(super) struct HostTrust {
    pub(super) layer: PathBuf,
    bundle: Vec<u8>,
}

impl HostTrust {
    /// The layer for `rootfs`'s build steps (`None` on other bases, or where the host has no
    /// bundle), made once per bundle content in `store` (the layer store's directory).
    pub(super) fn of(store: &Path, rootfs: &RootfsSpec) -> Result<Option<Self>, HarborError> {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if !matches!(rootfs, RootfsSpec::Debootstrap(_)) {
            return Ok(None);
        }
        let Ok(bundle) = std::fs::read(HOST_CA_BUNDLE) else {
            return Ok(None);
        };
        let digest = hex::encode(&Sha256::digest(&bundle)[..16]);
        let layer = store.join(format!(".host-trust-{digest}"));
        if layer.is_dir() {
            return Ok(Some(Self { layer, bundle }));
        }
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = store.join(format!(
            ".tmp-host-trust-{digest}-{n}-{}",
            std::process::id()
        ));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| HarborError::Io { path, source }
        };
        let _ = std::fs::remove_dir_all(&tmp);
        let made = (|| {
            // Modes set, not left to the umask: overlayfs shows a merged directory with its
            // topmost lower's mode, and a step's copy-up of `/etc` keeps it in the image.
            let mut dir = tmp.clone();
            for part in ["", "etc", "ssl", "certs"] {
                dir.push(part);
                std::fs::create_dir_all(&dir).map_err(io(&dir))?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                    .map_err(io(&dir))?;
            }
            let file = tmp.join(HOST_CA_BUNDLE.trim_start_matches('/'));
            std::fs::write(&file, &bundle).map_err(io(&file))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))
                .map_err(io(&file))
        })();
        if made.is_err() || std::fs::rename(&tmp, &layer).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
            made?;
            // Another build published it first: theirs holds the same bytes.
            if !layer.is_dir() {
                return Err(io(&layer)(std::io::Error::other(
                    "neither published nor published by another build",
                )));
            }
        }
        Ok(Some(Self { layer, bundle }))
    }

    /// Take the host's bundle out of a step's diff where the step only copied it up (a
    /// `chmod`, a `touch`): the image keeps the suite's own. A bundle the step changed keeps
    /// its content, the host's certificates with the change (public certificates).
    pub(super) fn forget_in(&self, diff: &Path) {
        let rel = HOST_CA_BUNDLE.trim_start_matches('/');
        let file = diff.join(rel);
        let mtime = |p: &Path| {
            std::fs::symlink_metadata(p)
                .ok()
                .filter(std::fs::Metadata::is_file)
                .map(|m| (m.mtime(), m.mtime_nsec()))
        };
        // A copy-up keeps the file's modification time (so do `chmod` and `chown`); a bundle
        // the step wrote anew, even with the same bytes, has its own, and stays.
        let copied = mtime(&file).is_some_and(|t| Some(t) == mtime(&self.layer.join(rel)))
            && std::fs::read(&file).is_ok_and(|b| b == self.bundle);
        if copied {
            let _ = std::fs::remove_file(&file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_copied_up_host_bundle_leaves_a_steps_layer() {
        let t = tempfile::tempdir().unwrap();
        let rel = HOST_CA_BUNDLE.trim_start_matches('/');
        let trust = HostTrust {
            layer: t.path().join("trust"),
            bundle: b"host CAs\n".to_vec(),
        };
        let put = |root: &Path, bytes: &[u8]| {
            let f = root.join(rel);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, bytes).unwrap();
            f
        };
        let theirs = put(&trust.layer, &trust.bundle);
        let when = std::fs::metadata(&theirs).unwrap().modified().unwrap();
        let earlier = when - std::time::Duration::from_secs(60);
        // Copied up (a chmod): same bytes, same time: taken out.
        let copied = put(&t.path().join("a"), &trust.bundle);
        std::fs::File::options()
            .write(true)
            .open(&copied)
            .unwrap()
            .set_modified(when)
            .unwrap();
        trust.forget_in(&t.path().join("a"));
        assert!(!copied.exists());
        // Written anew with the same bytes, or edited: kept.
        for (dir, bytes) in [
            ("b", trust.bundle.clone()),
            ("c", b"host CAs\nmine\n".to_vec()),
        ] {
            let f = put(&t.path().join(dir), &bytes);
            if dir == "c" {
                std::fs::File::options()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
            } else {
                std::fs::File::options()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_modified(earlier)
                    .unwrap();
            }
            trust.forget_in(&t.path().join(dir));
            assert!(f.exists(), "{dir}");
        }
    }
}
