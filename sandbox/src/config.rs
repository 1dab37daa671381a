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
