//! Mount planning: the private directory of a sandbox, the side trees (`/proc`, `/dev`,
//! `/sys`) mounted once, and the root overlay mounted at start and after every reset.
//!
//! Every function here speaks to the kernel only through [`Sys`], so the exact sequence is
//! unit-tested with the recording fake. The order is the one `docs/sandbox.md` lists.

use crate::sys::{Sys, SysError};
use nix::mount::MsFlags;
use std::path::{Path, PathBuf};

/// Errors of mount planning.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("overlay options are {len} bytes, over the kernel's page limit: too many or too long layer paths")]
    OptionsTooLong { len: usize },
    #[error("layer path {0:?} contains a character overlayfs cannot take (',', ':' or '\\')")]
    BadLayerPath(String),
}

/// Paths inside a sandbox's private directory (itself a tmpfs in the sandbox's mount namespace).
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
    /// The size-limited tmpfs of one episode: it holds the upper and work directories and is
    /// the mount point of the root, so one detach removes the whole episode's tree.
    pub fn rw(&self) -> PathBuf {
        self.dir.join("ep")
    }
    /// The merged root the commands are chrooted into.
    pub fn root(&self) -> PathBuf {
        self.dir.join("ep/root")
    }
    pub fn upper(&self) -> PathBuf {
        self.dir.join("ep/upper")
    }
    pub fn work(&self) -> PathBuf {
        self.dir.join("ep/work")
    }
    pub fn proc(&self) -> PathBuf {
        self.dir.join("proc")
    }
    pub fn dev(&self) -> PathBuf {
        self.dir.join("dev")
    }
    pub fn sys(&self) -> PathBuf {
        self.dir.join("sys")
    }
    /// Topmost lower layer: the mount points every root needs (`/proc`, `/dev`, `/sys`, `/tmp`).
    pub fn skel(&self) -> PathBuf {
        self.dir.join("skel")
    }
    /// Snapshot layers, one directory per snapshot number.
    pub fn snapshots(&self) -> PathBuf {
        self.dir.join("snap")
    }
    pub fn snapshot(&self, n: u32) -> PathBuf {
        self.snapshots().join(n.to_string())
    }
}

/// Files of `/proc` hidden behind `/dev/null` (kernel memory, keys, timing side channels).
pub const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "kallsyms",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
];
/// Directories of `/proc` hidden behind an empty read-only tmpfs.
pub const PROC_MASKED_DIRS: &[&str] = &["acpi", "scsi", "asound"];
/// Directories of `/proc` made read-only (kernel tunables, irq affinity, buses).
pub const PROC_READONLY: &[&str] = &["sys", "irq", "bus", "fs", "sysvipc", "driver"];

/// Device nodes of the minimal `/dev`: name, major, minor.
pub const DEVICES: &[(&str, u64, u64)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// Directories that root inside a user-namespaced sandbox must own to work at all (home,
/// scratch space, runtime state), with their modes; created in the upper layer at each mount.
pub const USERNS_OWNED: &[(&str, u32)] = &[
    ("root", 0o700),
    ("tmp", 0o1777),
    ("home", 0o755),
    ("run", 0o755),
    ("var", 0o755),
    ("var/tmp", 0o1777),
    ("var/log", 0o755),
    ("var/cache", 0o755),
    ("opt", 0o755),
    ("srv", 0o755),
    ("mnt", 0o755),
];

/// Size of the writable layer of an episode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disk {
    /// Bytes of the tmpfs (writing more gives ENOSPC).
    pub bytes: u64,
    /// Inodes available to the root's writable layer (creating more files gives ENOSPC);
    /// `None`: the tmpfs default (half the host's pages).
    pub inodes: Option<u64>,
}

impl Disk {
    pub fn bytes(bytes: u64) -> Self {
        Self {
            bytes,
            inodes: None,
        }
    }
}

/// Inodes of the episode tmpfs that the sandbox itself uses (its root, `upper`, `work`,
/// `root`, [`USERNS_OWNED`]) and a margin, added to [`Disk::inodes`].
pub const DISK_INODES_RESERVED: u64 = 16;

/// Step 1: make every mount of the new namespace private (nothing propagates to the host),
/// put a tmpfs on the sandbox's private directory and lay out its sub-directories.
pub fn setup_private_dir(
    sys: &mut dyn Sys,
    layout: &Layout,
    scratch_bytes: u64,
) -> Result<(), MountError> {
    sys.mount(
        "none",
        Path::new("/"),
        "",
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        "",
    )?;
    sys.mount(
        "envfactory",
        &layout.dir,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=0711,size={scratch_bytes}"),
    )?;
    for d in [
        layout.rw(),
        layout.proc(),
        layout.dev(),
        layout.sys(),
        layout.snapshots(),
    ] {
        sys.mkdir(&d, 0o700)?;
    }
    sys.mkdir(&layout.skel(), 0o755)?;
    for d in ["proc", "dev", "sys"] {
        sys.mkdir(&layout.skel().join(d), 0o555)?;
    }
    Ok(())
}

/// The private directory's tmpfs of an init prepared ahead, resized to the plan's scratch.
pub fn resize_private_dir(
    sys: &mut dyn Sys,
    layout: &Layout,
    scratch_bytes: u64,
) -> Result<(), MountError> {
    sys.mount(
        "envfactory",
        &layout.dir,
        "tmpfs",
        MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=0711,size={scratch_bytes}"),
    )?;
    Ok(())
}

/// Step 2: the side trees, mounted once and bound into every root: a `/proc` of the sandbox's
/// pid namespace with masked and read-only paths, a minimal `/dev`, and a read-only `/sys`.
///
/// `probe` tells whether a path exists and is a directory (`Some(true)`), another file
/// (`Some(false)`) or nothing (`None`), so masks are applied only to what the kernel has.
pub fn setup_side_trees(
    sys: &mut dyn Sys,
    layout: &Layout,
    probe: &dyn Fn(&Path) -> Option<bool>,
) -> Result<(), MountError> {
    let hidden = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let proc = layout.proc();
    sys.mount("proc", &proc, "proc", hidden, "")?;
    for f in PROC_MASKED_FILES {
        let p = proc.join(f);
        if probe(&p) == Some(false) {
            sys.mount("/dev/null", &p, "", MsFlags::MS_BIND, "")?;
        }
    }
    for d in PROC_MASKED_DIRS {
        let p = proc.join(d);
        if probe(&p) == Some(true) {
            sys.mount("masked", &p, "tmpfs", MsFlags::MS_RDONLY | hidden, "size=0")?;
        }
    }
    for d in PROC_READONLY {
        let p = proc.join(d);
        if probe(&p).is_some() {
            sys.mount(
                &p.to_string_lossy(),
                &p,
                "",
                MsFlags::MS_BIND | MsFlags::MS_REC,
                "",
            )?;
            sys.mount(
                "",
                &p,
                "",
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | hidden,
                "",
            )?;
        }
    }

    let dev = layout.dev();
    sys.mount(
        "dev",
        &dev,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "mode=0755,size=65536",
    )?;
    for (name, major, minor) in DEVICES {
        sys.mknod_char(&dev.join(name), 0o666, *major, *minor)?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        sys.symlink(target, &dev.join(link))?;
    }
    sys.mkdir(&dev.join("pts"), 0o755)?;
    sys.mkdir(&dev.join("shm"), 0o1777)?;
    sys.mount(
        "devpts",
        &dev.join("pts"),
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )?;
    // Read-only: `rm -rf /` cannot delete the device nodes that every later root shares.
    sys.mount(
        "",
        &dev,
        "",
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "mode=0755,size=65536",
    )?;

    sys.mount(
        "sysfs",
        &layout.sys(),
        "sysfs",
        MsFlags::MS_RDONLY | hidden,
        "",
    )?;
    Ok(())
}

/// The overlay options for a stack of lower layers (topmost first).
pub fn overlay_options(layout: &Layout, lowers: &[String]) -> Result<String, MountError> {
    let skel = layout.skel().to_string_lossy().into_owned();
    for l in std::iter::once(&skel).chain(lowers) {
        if l.contains([',', ':', '\\']) {
            return Err(MountError::BadLayerPath(l.clone()));
        }
    }
    let mut lowerdir = skel;
    for l in lowers {
        lowerdir.push(':');
        lowerdir.push_str(l);
    }
    let opts = format!(
        "lowerdir={lowerdir},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off",
        layout.upper().display(),
        layout.work().display()
    );
    // The kernel copies mount data into one page.
    if opts.len() >= 4000 {
        return Err(MountError::OptionsTooLong { len: opts.len() });
    }
    Ok(opts)
}

/// Step 3 (and every reset): a fresh size-limited tmpfs for the episode (upper, work and the
/// root's mount point) and the overlay on `root`; then [`bind_side_trees`].
///
/// With `userns_root` (the host uid that is root inside a user-namespaced sandbox), the root
/// directory and [`USERNS_OWNED`] are created in the upper layer owned by that uid.
pub fn mount_root(
    sys: &mut dyn Sys,
    layout: &Layout,
    lowers: &[String],
    disk: Disk,
    userns_root: Option<u32>,
) -> Result<(), MountError> {
    mount_overlay(sys, layout, lowers, disk, userns_root)?;
    bind_side_trees(sys, layout, disk.bytes)
}

/// The episode tmpfs and the overlay (the first half of [`mount_root`]).
pub fn mount_overlay(
    sys: &mut dyn Sys,
    layout: &Layout,
    lowers: &[String],
    disk: Disk,
    userns_root: Option<u32>,
) -> Result<(), MountError> {
    let opts = overlay_options(layout, lowers)?;
    let mut tmpfs = format!("mode=0755,size={}", disk.bytes);
    if let Some(n) = disk.inodes {
        // The episode tmpfs's own directories (root, upper, work, the root's mount point and
        // the user-namespace home directories) come out of the same count.
        tmpfs.push_str(&format!(
            ",nr_inodes={}",
            n.saturating_add(DISK_INODES_RESERVED)
        ));
    }
    sys.mount(
        "upper",
        &layout.rw(),
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &tmpfs,
    )?;
    sys.mkdir(&layout.upper(), 0o755)?;
    sys.mkdir(&layout.work(), 0o700)?;
    sys.mkdir(&layout.root(), 0o755)?;
    if let Some(uid) = userns_root {
        sys.chown(&layout.upper(), uid, uid)?;
        for (d, mode) in USERNS_OWNED {
            let p = layout.upper().join(d);
            sys.mkdir(&p, *mode)?;
            sys.chown(&p, uid, uid)?;
        }
    }
    sys.mount(
        "overlay",
        &layout.root(),
        "overlay",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &opts,
    )
    .map_err(MountError::from)
}

/// The side trees bound into the root and a fresh `/dev/shm` (the second half of
/// [`mount_root`]). Mounts under the root are seen by processes already chrooted into it, so
/// this may run while the zygote confines itself.
pub fn bind_side_trees(
    sys: &mut dyn Sys,
    layout: &Layout,
    disk_bytes: u64,
) -> Result<(), MountError> {
    let root = layout.root();
    for (side, name) in [
        (layout.proc(), "proc"),
        (layout.dev(), "dev"),
        (layout.sys(), "sys"),
    ] {
        sys.mount(
            &side.to_string_lossy(),
            &root.join(name),
            "",
            MsFlags::MS_BIND | MsFlags::MS_REC,
            "",
        )?;
    }
    // All of /proc is read-only for commands (the side tree itself stays writable for init,
    // which writes a user-namespaced zygote's uid_map there). Seccomp denies ptrace and
    // process_vm_writev; /proc/PID/mem is their file-based twin (a same-uid process may write
    // another's memory through it), and /proc/PID/{oom_score_adj,attr,...} are knobs of other
    // processes. Reads are unchanged; the zygote's own OOM-score write happens before it
    // enters the root.
    sys.mount(
        "",
        &root.join("proc"),
        "",
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        "",
    )?;
    // POSIX shared memory is state of the episode: a fresh one per root.
    sys.mount(
        "shm",
        &root.join("dev/shm"),
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        &format!("mode=1777,size={disk_bytes}"),
    )?;
    Ok(())
}

/// After every root mount: bind each path (absolute, inside the root) read-only over itself,
/// so writes under it fail with EROFS whatever the file modes say (root inside keeps
/// CAP_DAC_OVERRIDE). `resolve` opens a path inside the root without following symlinks out
/// of it and names it for `mount` (`/proc/self/fd/N`); it is called again after the bind, so
/// the read-only remount reaches the new mount rather than the one it covers.
pub fn bind_readonly(
    sys: &mut dyn Sys,
    paths: &[String],
    resolve: &mut dyn FnMut(&str) -> Result<Resolved, SysError>,
) -> Result<(), MountError> {
    for p in paths {
        let at = resolve(p)?;
        let target = at.path.to_string_lossy().into_owned();
        sys.mount(
            &target,
            &at.path,
            "",
            MsFlags::MS_BIND | MsFlags::MS_REC,
            "",
        )?;
        drop(at);
        let top = resolve(p)?;
        sys.mount(
            "",
            &top.path,
            "",
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV,
            "",
        )?;
    }
    Ok(())
}

/// A path resolved inside the root, named for `mount`; it holds what keeps the name valid (an
/// `O_PATH` descriptor behind `/proc/self/fd/N`).
#[derive(Debug)]
pub struct Resolved {
    pub path: PathBuf,
    pub keep: Option<std::os::fd::OwnedFd>,
}

/// Undo [`mount_root`]: detach the episode's tmpfs with everything mounted under it (the
/// root and its bound side trees) in one call, which frees exactly what the episode wrote.
pub fn unmount_root(sys: &mut dyn Sys, layout: &Layout) -> Result<(), MountError> {
    sys.umount(&layout.rw(), true)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{Op, Recorder};

    fn targets(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Mount { target, fstype, .. } => format!("mount {fstype} {}", target.display()),
                Op::Umount { target, .. } => format!("umount {}", target.display()),
                Op::Mkdir { path, .. } => format!("mkdir {}", path.display()),
                Op::Mknod { path, .. } => format!("mknod {}", path.display()),
                Op::Symlink { link, .. } => format!("symlink {}", link.display()),
                Op::SetXattr { path, .. } => format!("xattr {}", path.display()),
                Op::Chown { path, uid, .. } => format!("chown {uid} {}", path.display()),
            })
            .collect()
    }

    #[test]
    fn private_dir_is_made_private_before_anything_is_mounted() {
        let mut r = Recorder::default();
        let l = Layout::new("/s");
        setup_private_dir(&mut r, &l, 1 << 20).unwrap();
        match &r.ops[0] {
            Op::Mount { target, flags, .. } => {
                assert_eq!(target, Path::new("/"));
                assert!(flags.contains(MsFlags::MS_PRIVATE | MsFlags::MS_REC));
            }
            other => panic!("first op must make / private, got {other:?}"),
        }
        match &r.ops[1] {
            Op::Mount {
                target,
                fstype,
                data,
                ..
            } => {
                assert_eq!(target, Path::new("/s"));
                assert_eq!(fstype, "tmpfs");
                assert!(data.contains("size=1048576"), "{data}");
            }
            other => panic!("{other:?}"),
        }
        let t = targets(&r.ops);
        for want in [
            "mkdir /s/skel/proc",
            "mkdir /s/skel/dev",
            "mkdir /s/skel/sys",
        ] {
            assert!(t.contains(&want.to_string()), "{t:?}");
        }
    }

    #[test]
    fn side_trees_mask_only_what_exists_and_make_proc_sys_read_only() {
        let mut r = Recorder::default();
        let l = Layout::new("/s");
        let probe = |p: &Path| -> Option<bool> {
            match p.file_name()?.to_str()? {
                "kcore" | "keys" => Some(false),
                "acpi" | "sys" | "irq" => Some(true),
                _ => None,
            }
        };
        setup_side_trees(&mut r, &l, &probe).unwrap();
        let t = targets(&r.ops);
        assert_eq!(t[0], "mount proc /s/proc");
        assert!(t.contains(&"mount  /s/proc/kcore".to_string()), "{t:?}");
        assert!(
            !t.iter().any(|x| x.contains("timer_list")),
            "absent paths are skipped"
        );
        assert!(t.contains(&"mount tmpfs /s/proc/acpi".to_string()));
        let ro_sys = r.ops.iter().any(|op| {
            matches!(op, Op::Mount { target, flags, .. }
                if target == Path::new("/s/proc/sys")
                    && flags.contains(MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY))
        });
        assert!(ro_sys, "proc/sys must be remounted read-only");
        let devs: Vec<_> = r
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Mknod {
                    path, major, minor, ..
                } => Some((path.clone(), *major, *minor)),
                _ => None,
            })
            .collect();
        assert_eq!(devs.len(), DEVICES.len());
        assert!(devs.contains(&(PathBuf::from("/s/dev/null"), 1, 3)));
        let sysfs_ro = r.ops.iter().any(|op| {
            matches!(op, Op::Mount { fstype, flags, .. }
                if fstype == "sysfs" && flags.contains(MsFlags::MS_RDONLY))
        });
        assert!(sysfs_ro);
    }

    #[test]
    fn root_is_an_overlay_of_skel_then_lowers_with_upper_on_sized_tmpfs() {
        let mut r = Recorder::default();
        let l = Layout::new("/s");
        let lowers = vec!["/store/b".to_string(), "/store/a".to_string()];
        mount_root(&mut r, &l, &lowers, Disk::bytes(64 << 20), None).unwrap();
        let t = targets(&r.ops);
        assert_eq!(
            t,
            vec![
                "mount tmpfs /s/ep",
                "mkdir /s/ep/upper",
                "mkdir /s/ep/work",
                "mkdir /s/ep/root",
                "mount overlay /s/ep/root",
                "mount  /s/ep/root/proc",
                "mount  /s/ep/root/dev",
                "mount  /s/ep/root/sys",
                "mount  /s/ep/root/proc",
                "mount tmpfs /s/ep/root/dev/shm",
            ]
        );
        // The commands' /proc is read-only (no writes to /proc/PID/mem); the side tree is not.
        match &r.ops[8] {
            Op::Mount { flags, .. } => {
                assert!(flags.contains(MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY));
            }
            _ => unreachable!(),
        }
        match &r.ops[0] {
            Op::Mount { data, .. } => {
                assert!(data.contains("size=67108864"), "{data}");
                assert!(!data.contains("nr_inodes"), "{data}");
            }
            _ => unreachable!(),
        }
        match &r.ops[4] {
            Op::Mount { data, flags, .. } => {
                assert!(
                    data.starts_with("lowerdir=/s/skel:/store/b:/store/a,upperdir=/s/ep/upper"),
                    "{data}"
                );
                assert!(flags.contains(MsFlags::MS_NOSUID));
            }
            _ => unreachable!(),
        }
        let mut r = Recorder::default();
        unmount_root(&mut r, &l).unwrap();
        assert_eq!(targets(&r.ops), vec!["umount /s/ep"]);
    }

    #[test]
    fn user_namespaced_roots_give_root_inside_its_home_and_scratch_dirs() {
        let mut r = Recorder::default();
        let l = Layout::new("/s");
        mount_root(
            &mut r,
            &l,
            &["/a".into()],
            Disk::bytes(1 << 20),
            Some(100_000),
        )
        .unwrap();
        let t = targets(&r.ops);
        let overlay = t
            .iter()
            .position(|x| x == "mount overlay /s/ep/root")
            .unwrap();
        for want in [
            "chown 100000 /s/ep/upper",
            "chown 100000 /s/ep/upper/root",
            "chown 100000 /s/ep/upper/tmp",
        ] {
            let at = t
                .iter()
                .position(|x| x == want)
                .unwrap_or_else(|| panic!("{want}: {t:?}"));
            assert!(
                at < overlay,
                "the upper layer is prepared before the overlay is mounted"
            );
        }
    }

    #[test]
    fn a_bounded_inode_count_goes_into_the_episode_tmpfs() {
        let mut r = Recorder::default();
        let l = Layout::new("/s");
        let disk = Disk {
            bytes: 1 << 20,
            inodes: Some(100),
        };
        mount_overlay(&mut r, &l, &["/a".into()], disk, None).unwrap();
        match &r.ops[0] {
            Op::Mount { data, target, .. } => {
                assert_eq!(target, Path::new("/s/ep"));
                let want = format!("nr_inodes={}", 100 + DISK_INODES_RESERVED);
                assert!(data.contains(&want), "{data}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn read_only_paths_are_bound_then_the_new_mount_is_remounted_read_only() {
        let mut r = Recorder::default();
        let mut n = 0;
        let mut resolve = |p: &str| -> Result<Resolved, SysError> {
            n += 1;
            Ok(Resolved {
                path: PathBuf::from(format!("/proc/self/fd/{n}{p}")),
                keep: None,
            })
        };
        bind_readonly(&mut r, &["/var/log".into()], &mut resolve).unwrap();
        assert_eq!(r.ops.len(), 2, "{:?}", r.ops);
        match (&r.ops[0], &r.ops[1]) {
            (
                Op::Mount {
                    source,
                    target,
                    flags,
                    ..
                },
                Op::Mount {
                    target: t2,
                    flags: f2,
                    ..
                },
            ) => {
                assert_eq!(source, "/proc/self/fd/1/var/log");
                assert_eq!(target, Path::new("/proc/self/fd/1/var/log"));
                assert!(flags.contains(MsFlags::MS_BIND));
                assert!(!flags.contains(MsFlags::MS_RDONLY));
                // Resolved again: the remount must reach the bind, not what it covers.
                assert_eq!(t2, Path::new("/proc/self/fd/2/var/log"));
                assert!(f2.contains(MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hostile_or_oversized_layer_paths_are_refused() {
        let l = Layout::new("/s");
        let err = overlay_options(&l, &["/a,upperdir=/etc".into()]).unwrap_err();
        assert!(matches!(err, MountError::BadLayerPath(_)), "{err}");
        let many: Vec<String> = (0..200).map(|i| format!("/store/layer-{i:040}")).collect();
        let err = overlay_options(&l, &many).unwrap_err();
        assert!(matches!(err, MountError::OptionsTooLong { .. }), "{err}");
    }
}
