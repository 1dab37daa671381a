//! [`SandboxConfig`]: what one sandbox is made of (root filesystem, layers, limits, policies)
//! and its defaults.

use crate::cgroup::Limits;
use crate::layers::RootfsSpec;
use std::path::PathBuf;

/// Configuration of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub rootfs: RootfsSpec,
    /// Extra read-only layer directories stacked above the rootfs, topmost first (a
    /// synthesized instance). Each must be on a filesystem other than any host directory the
    /// rootfs uses (overlayfs refuses a layer nested inside another layer): the engine keeps
    /// them on their own tmpfs. Their names (content hashes) enter the sandbox's digest.
    pub layers: Vec<PathBuf>,
    pub limits: Limits,
    /// Size of the writable layer; writing more gives ENOSPC.
    pub disk_bytes: u64,
    /// Inodes of the writable layer (`nr_inodes` of its tmpfs); creating more files gives
    /// ENOSPC. `None`: the tmpfs default.
    pub disk_inodes: Option<u64>,
    /// Absolute paths inside the root that are bound read-only over themselves after every
    /// root mount (creation, reset, rollback): writes under them fail with EROFS even for root
    /// inside. Each must exist in the root filesystem (the sandbox fails to start otherwise).
    pub readonly_paths: Vec<String>,
    pub hostname: String,
    pub env: Vec<String>,
    pub keep_caps: Vec<u8>,
    /// Install the seccomp policy (`sandbox/policy/seccomp.toml`).
    pub seccomp: bool,
    /// Apply the landlock policy (`sandbox/policy/landlock.toml`).
    pub landlock: bool,
    pub nofile: u64,
    /// Run commands in a user namespace: root inside is host uid/gid `USERNS_BASE`, an
    /// unprivileged id. Trade-off: files of the read-only layers (owned by host root) appear
    /// owned by `nobody` and cannot be modified by root inside; only the root directory and
    /// the home and scratch directories (`mounts::USERNS_OWNED`) belong to root inside.
    pub userns: bool,
}

/// The largest writable layer (1024 TiB): a larger tmpfs size wraps in the kernel to 0, which
/// means unlimited.
pub const MAX_DISK_BYTES: u64 = 1 << 50;

impl SandboxConfig {
    /// Refuse limits that the kernel would wrap or misread, rather than pass them on.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_DISK_BYTES).contains(&self.disk_bytes) {
            return Err(format!(
                "disk_bytes {} is outside 1..={MAX_DISK_BYTES}",
                self.disk_bytes
            ));
        }
        if self.limits.memory_bytes == 0 {
            return Err("memory_bytes must be positive".into());
        }
        if !(self.limits.cpus.is_finite() && self.limits.cpus >= 0.0) {
            return Err(format!(
                "cpus {} is not a non-negative number of cores",
                self.limits.cpus
            ));
        }
        Ok(())
    }
}

/// Host uid and gid of root inside a user-namespaced sandbox (65,536 ids are mapped).
pub const USERNS_BASE: u32 = 100_000;

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            rootfs: RootfsSpec::Host,
            layers: Vec::new(),
            limits: Limits {
                memory_bytes: 256 << 20,
                pids: 128,
                cpus: 1.0,
            },
            disk_bytes: 64 << 20,
            disk_inodes: None,
            readonly_paths: Vec::new(),
            hostname: "sandbox".into(),
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "HOME=/root".into(),
                "USER=root".into(),
                "LOGNAME=root".into(),
                "SHELL=/bin/sh".into(),
                "TERM=dumb".into(),
                "LANG=C.UTF-8".into(),
            ],
            keep_caps: crate::caps::DEFAULT_KEEP.to_vec(),
            seccomp: true,
            landlock: true,
            nofile: 1024,
            userns: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_that_would_wrap_are_refused() {
        assert_eq!(SandboxConfig::default().validate(), Ok(()));
        let c = SandboxConfig {
            disk_bytes: u64::MAX,
            ..SandboxConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("disk_bytes"));
        let mut c = SandboxConfig::default();
        c.limits.cpus = f64::NAN;
        assert!(c.validate().unwrap_err().contains("cpus"));
        let mut c = SandboxConfig::default();
        c.limits.memory_bytes = 0;
        assert!(c.validate().is_err());
    }
}
