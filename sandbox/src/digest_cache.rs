//! Results remembered in the state directory under a digest of what they were computed from,
//! so that a one-shot process does not redo them:
//! - a file's SHA-256 under the file's identity (device, inode, size, modification and change
//!   times): the host layer's digest covers the dpkg database (about 600 KiB);
//! - any entry under a caller's key ([`read`], [`write`]): the compiled seccomp program under
//!   the digest of the policy text it was compiled from.
//!
//! Trust: an entry is used only when it is a regular file owned by this process's user and
//! writable by nobody else, in a directory with the same properties, and when it names the
//! exact key asked for (for a file, the identity it has now: the change time cannot be set from
//! user space, and any write, chmod or rename over the file gives it a new one). Writers put an
//! entry under a temporary name and rename it into place, so concurrent writers never leave a
//! torn entry (the last rename wins, and every one was right). An entry that fails a check is
//! ignored and rewritten. A file changed less than [`SETTLE`] ago is not remembered: file
//! times have a coarse clock, and a second change within the same tick (same size) would keep
//! the identity.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

const VERSION: &str = "envfactory-cache-v1";
/// No entry is larger (a compiled seccomp program is a few KiB).
const MAX_ENTRY: u64 = 1 << 20;

/// How long ago a file must have changed for its digest to be remembered.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// What identifies a file's contents without reading them.
pub(crate) fn identity(m: &std::fs::Metadata) -> String {
    format!(
        "{} {} {} {}.{} {}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// Owned by us and writable by no one else.
fn trusted(m: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    m.uid() == me && m.permissions().mode() & 0o022 == 0
}

/// The entry's name: a digest of the path it describes.
fn entry_name(path: &Path) -> String {
    let h = Sha256::digest(path.as_os_str().as_encoded_bytes());
    format!("{}.sha256", hex::encode(&h[..16]))
}

/// The payload of entry `name` in `dir` if it is trusted and was written under `key`.
pub fn read(dir: &Path, name: &str, key: &str) -> Option<Vec<u8>> {
    let d = std::fs::symlink_metadata(dir).ok()?;
    if !d.is_dir() || !trusted(&d) {
        return None;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(name))
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || !trusted(&m) || m.len() > MAX_ENTRY {
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.read_to_end(&mut bytes).ok()?;
    let header = format!("{VERSION} {key}\n");
    bytes.strip_prefix(header.as_bytes()).map(<[u8]>::to_vec)
}

/// Remember `payload` as entry `name` in `dir` under `key` (best effort: a cache that cannot
/// be written costs only speed).
pub fn write(dir: &Path, name: &str, key: &str, payload: &[u8]) {
    let write = || -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let tmp = dir.join(format!(
            ".{name}.{}.{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        let mut bytes = format!("{VERSION} {key}\n").into_bytes();
        bytes.extend_from_slice(payload);
        std::io::Write::write_all(&mut f, &bytes)?;
        drop(f);
        std::fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    };
    if let Err(e) = write() {
        tracing::debug!(dir = %dir.display(), entry = name, error = %e, "cache entry not written");
    }
}

/// The remembered digest of `path` if `cache_dir` holds a trusted entry for its identity now.
fn lookup(cache_dir: &Path, path: &Path, id: &str) -> Option<String> {
    let digest = String::from_utf8(read(cache_dir, &entry_name(path), id)?).ok()?;
    (digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit())).then_some(digest)
}

/// The SHA-256 of `path`'s contents (hex), from `cache_dir` when it holds a trusted entry for
/// the file as it is now, else read, hashed and remembered there. `None` when the file cannot
/// be read.
pub fn file_sha256(path: &Path, cache_dir: &Path) -> Option<String> {
    file_sha256_settled(path, cache_dir, SETTLE)
}

fn file_sha256_settled(
    path: &Path,
    cache_dir: &Path,
    settle: std::time::Duration,
) -> Option<String> {
    let before = std::fs::metadata(path).ok()?;
    let id = identity(&before);
    if let Some(d) = lookup(cache_dir, path, &id) {
        return Some(d);
    }
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let digest = hex::encode(h.finalize());
    // Remembered only if the file did not change while it was read, and last changed long
    // enough ago that any later change gets another change time.
    let changed = std::time::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(before.ctime()).unwrap_or(0),
            u32::try_from(before.ctime_nsec()).unwrap_or(0),
        );
    let settled = std::time::SystemTime::now()
        .duration_since(changed)
        .is_ok_and(|age| age >= settle);
    if settled
        && f.metadata()
            .ok()
            .is_some_and(|after| identity(&after) == id)
    {
        write(cache_dir, &entry_name(path), &id, digest.as_bytes());
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_remembered_digest_follows_the_file_and_rejects_tampering() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("status");
        let cache = t.path().join("cache");
        std::fs::write(&file, b"Package: a\n").unwrap();
        let want = hex::encode(Sha256::digest(b"Package: a\n"));
        let hour = std::time::Duration::from_secs(3600);
        let file_sha256 = |f: &Path, c: &Path| file_sha256_settled(f, c, Duration::ZERO);
        let entry = cache.join(entry_name(&file));
        assert_eq!(
            file_sha256_settled(&file, &cache, hour).as_deref(),
            Some(want.as_str())
        );
        assert!(!entry.exists(), "a file changed just now is not remembered");
        assert_eq!(file_sha256(&file, &cache).as_deref(), Some(want.as_str()));
        assert!(entry.is_file(), "the digest was remembered");
        // A forged entry for the current identity is used only while it is trusted.
        let id = identity(&std::fs::metadata(&file).unwrap());
        let forged = "f".repeat(64);
        std::fs::write(&entry, format!("{VERSION} {id}\n{forged}")).unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(file_sha256(&file, &cache), Some(forged.clone()));
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            file_sha256(&file, &cache).as_deref(),
            Some(want.as_str()),
            "a world-writable entry is ignored (and rewritten)"
        );
        // A changed file has a new identity: its new contents are hashed.
        std::fs::write(&file, b"Package: bb\n").unwrap();
        let want_b = hex::encode(Sha256::digest(b"Package: bb\n"));
        assert_eq!(file_sha256(&file, &cache).as_deref(), Some(want_b.as_str()));
        // A torn or foreign entry is not a digest.
        std::fs::write(&entry, "garbage").unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(file_sha256(&file, &cache).as_deref(), Some(want_b.as_str()));
        assert_eq!(file_sha256(&t.path().join("missing"), &cache), None);
    }
}
