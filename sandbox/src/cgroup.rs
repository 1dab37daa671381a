//! Resource limits with cgroups v1 and v2 (and the hybrid layout: v1 controllers next to a v2
//! mount). Each controller is taken from v2 when the unified hierarchy offers it, else from its
//! v1 hierarchy. Every sandbox gets `envfactory/<run>/<sandbox>` in each hierarchy it uses.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The directory under each hierarchy root that holds every cgroup of this project.
pub const TOP: &str = "envfactory";

/// Errors of cgroup management.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup hierarchy offers the {0} controller (is cgroupfs mounted?)")]
    NoController(&'static str),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kernel refused {file} = {value} for {path}: {source}")]
    Refused {
        file: &'static str,
        value: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cgroup {path} still has processes after killing them")]
    Busy { path: PathBuf },
}

/// Which version a hierarchy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Where each controller lives on this machine.
#[derive(Debug, Clone)]
pub struct Layout {
    pub memory: (Version, PathBuf),
    pub pids: (Version, PathBuf),
    pub cpu: (Version, PathBuf),
}

impl Layout {
    /// Read `/proc/self/mountinfo`.
    pub fn detect() -> Result<Self, CgroupError> {
        let text =
            crate::sys::read_proc("/proc/self/mountinfo").map_err(|source| CgroupError::Io {
                op: "read",
                path: "/proc/self/mountinfo".into(),
                source,
            })?;
        let v2_controllers = |root: &Path| {
            crate::sys::read_proc(root.join("cgroup.controllers")).unwrap_or_default()
        };
        Self::from_mountinfo(&text, &v2_controllers)
    }

    /// Parse mountinfo text; `v2_controllers` reads `cgroup.controllers` of a v2 mount.
    pub fn from_mountinfo(
        text: &str,
        v2_controllers: &dyn Fn(&Path) -> String,
    ) -> Result<Self, CgroupError> {
        let mut v1: Vec<(PathBuf, Vec<String>)> = Vec::new();
        let mut v2: Option<(PathBuf, String)> = None;
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split_whitespace().nth(4).unwrap_or("");
            let mut r = right.split_whitespace();
            let fstype = r.next().unwrap_or("");
            let _source = r.next();
            let opts = r.next().unwrap_or("");
            match fstype {
                "cgroup" => v1.push((
                    mount_point.into(),
                    opts.split(',').map(str::to_string).collect(),
                )),
                "cgroup2" if v2.is_none() => {
                    let root = PathBuf::from(mount_point);
                    let ctl = v2_controllers(&root);
                    v2 = Some((root, ctl));
                }
                _ => {}
            }
        }
        let find = |name: &'static str| -> Result<(Version, PathBuf), CgroupError> {
            if let Some((root, ctl)) = &v2 {
                if ctl.split_whitespace().any(|c| c == name) {
                    return Ok((Version::V2, root.clone()));
                }
            }
            v1.iter()
                .find(|(_, o)| o.iter().any(|x| x == name))
                .map(|(p, _)| (Version::V1, p.clone()))
                .ok_or(CgroupError::NoController(name))
        };
        Ok(Self {
            memory: find("memory")?,
            pids: find("pids")?,
            cpu: find("cpu")?,
        })
    }

    /// The distinct hierarchy roots in use.
    pub fn roots(&self) -> Vec<(Version, PathBuf)> {
        let mut v: Vec<(Version, PathBuf)> = Vec::new();
        for r in [&self.memory, &self.pids, &self.cpu] {
            if !v.iter().any(|x| x.1 == r.1) {
                v.push(r.clone());
            }
        }
        v
    }
}

/// Limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPU quota in cores (e.g. 1.0); 0 for no quota.
    pub cpus: f64,
}

/// The cgroups of one sandbox, removed on drop.
#[derive(Debug)]
pub struct Cgroup {
    layout: Layout,
    rel: PathBuf,
    created: Vec<PathBuf>,
    /// The memory controller's file that counts OOM kills, opened at its first read and read
    /// again from its start after that (the kernel makes the text afresh for a read at offset
    /// 0): [`Cgroup::oom_kills`] runs before every command, and a path walk and an open in
    /// cgroupfs cost about twenty times a `pread` (26.7 against 1.4 µs, measured here).
    oom_file: OnceLock<File>,
}

fn write(path: &Path, file: &'static str, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path.join(file), value).map_err(|source| CgroupError::Refused {
        file,
        value: value.into(),
        path: path.to_path_buf(),
        source,
    })
}

fn mkdir(path: &Path) -> Result<bool, CgroupError> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(CgroupError::Io {
            op: "mkdir",
            path: path.into(),
            source,
        }),
    }
}

impl Cgroup {
    /// Create `envfactory/<run>/<name>` in each hierarchy and apply `limits`.
    pub fn create(
        layout: &Layout,
        run: &str,
        name: &str,
        limits: &Limits,
    ) -> Result<Self, CgroupError> {
        let cg = Self::create_bare(layout, run, name)?;
        cg.apply(limits)?;
        Ok(cg)
    }

    /// [`Cgroup::create`] with no limit written yet (for an init started ahead, whose limits
    /// come with its plan: [`Cgroup::apply`]).
    pub fn create_bare(layout: &Layout, run: &str, name: &str) -> Result<Self, CgroupError> {
        let rel = Path::new(TOP).join(run).join(name);
        let mut cg = Self {
            layout: layout.clone(),
            rel,
            created: Vec::new(),
            oom_file: OnceLock::new(),
        };
        for (version, root) in layout.roots() {
            let mut p = root.clone();
            for comp in [TOP, run] {
                p.push(comp);
                mkdir(&p)?;
                if version == Version::V2 {
                    // Delegate the controllers we use down the tree (missing ones are ignored).
                    for c in ["+memory", "+pids", "+cpu"] {
                        let _ = std::fs::write(
                            p.parent().unwrap_or(&root).join("cgroup.subtree_control"),
                            c,
                        );
                        let _ = std::fs::write(p.join("cgroup.subtree_control"), c);
                    }
                }
            }
            p.push(name);
            if mkdir(&p)? {
                cg.created.push(p);
            }
        }
        Ok(cg)
    }

    fn dir(&self, which: &(Version, PathBuf)) -> PathBuf {
        which.1.join(&self.rel)
    }

    /// Write `l` (memory without swap, pids, and the CPU quota when it has one).
    pub fn apply(&self, l: &Limits) -> Result<(), CgroupError> {
        let mem = self.dir(&self.layout.memory);
        match self.layout.memory.0 {
            Version::V1 => {
                write(&mem, "memory.limit_in_bytes", &l.memory_bytes.to_string())?;
                if mem.join("memory.memsw.limit_in_bytes").exists() {
                    write(
                        &mem,
                        "memory.memsw.limit_in_bytes",
                        &l.memory_bytes.to_string(),
                    )?;
                }
            }
            Version::V2 => {
                write(&mem, "memory.max", &l.memory_bytes.to_string())?;
                if mem.join("memory.swap.max").exists() {
                    write(&mem, "memory.swap.max", "0")?;
                }
            }
        }
        write(
            &self.dir(&self.layout.pids),
            "pids.max",
            &l.pids.to_string(),
        )?;
        if l.cpus > 0.0 {
            let cpu = self.dir(&self.layout.cpu);
            let period = 100_000u64;
            let quota = ((l.cpus * period as f64) as u64).max(1);
            match self.layout.cpu.0 {
                Version::V1 => {
                    write(&cpu, "cpu.cfs_period_us", &period.to_string())?;
                    write(&cpu, "cpu.cfs_quota_us", &quota.to_string())?;
                }
                Version::V2 => write(&cpu, "cpu.max", &format!("{quota} {period}"))?,
            }
        }
        Ok(())
    }

    /// The files a single-threaded process writes `0` to, to move itself into this sandbox's
    /// cgroups: `tasks` on v1, which moves only the calling thread and so skips the kernel's
    /// global threadgroup lock (a migration by pid costs an RCU grace period, milliseconds);
    /// `cgroup.procs` on v2. As text, the form of init's plans.
    pub fn self_join_files(&self) -> Vec<String> {
        self.layout
            .roots()
            .into_iter()
            .map(|(v, root)| {
                let file = match v {
                    Version::V1 => "tasks",
                    Version::V2 => "cgroup.procs",
                };
                root.join(&self.rel)
                    .join(file)
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    /// Count of OOM kills in this sandbox so far; `None` when the file cannot be opened or
    /// read, or holds no complete `oom_kill` line.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.oom_file.get() {
            Some(f) => f,
            None => {
                let mem = self.dir(&self.layout.memory);
                let name = match self.layout.memory.0 {
                    Version::V1 => "memory.oom_control",
                    Version::V2 => "memory.events",
                };
                let f = File::open(mem.join(name)).ok()?;
                self.oom_file.get_or_init(|| f)
            }
        };
        // The whole text is a few lines (under 200 bytes in v1 and v2), which the kernel gives
        // in one read: reading stops at the first complete `oom_kill` line, else at the end.
        let mut buf = [0u8; 1024];
        let mut len = 0;
        while len < buf.len() {
            match file.read_at(&mut buf[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => {
                    len += n;
                    if let Some(count) = oom_kill_line(&buf[..len]) {
                        return Some(count);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// Memory in use by the sandbox, bytes.
    pub fn memory_usage(&self) -> u64 {
        let mem = self.dir(&self.layout.memory);
        let file = match self.layout.memory.0 {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        };
        std::fs::read_to_string(mem.join(file))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Processes (tasks) in the sandbox now, and its limit (`None`: no limit set).
    pub fn pids_usage(&self) -> (u64, Option<u64>) {
        let dir = self.dir(&self.layout.pids);
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let current = read("pids.current").trim().parse().unwrap_or(0);
        let max = read("pids.max").trim().parse().ok();
        (current, max)
    }

    /// How many times a fork was refused because the pids limit was reached (`pids.events`).
    pub fn pids_limit_hits(&self) -> u64 {
        std::fs::read_to_string(self.dir(&self.layout.pids).join("pids.events"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("max ").and_then(|v| v.trim().parse().ok()))
            })
            .unwrap_or(0)
    }

    /// Kill every process left and remove the directories (deepest first).
    pub fn destroy(&mut self) -> Result<(), CgroupError> {
        // The open events file does not keep the directory (the kernel removes it anyway); it
        // is closed first all the same.
        drop(self.oom_file.take());
        let mut result = Ok(());
        for dir in std::mem::take(&mut self.created) {
            if let Err(e) = remove(&dir) {
                result = Err(e);
            }
        }
        result
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            tracing::warn!(error = %e, "cgroup cleanup failed");
        }
    }
}

/// The count of the `oom_kill N` line of a memory controller's text, among the lines that
/// a newline ends (the kernel ends every line with one; a line without it may be cut).
fn oom_kill_line(text: &[u8]) -> Option<u64> {
    let complete = &text[..text.iter().rposition(|b| *b == b'\n')? + 1];
    std::str::from_utf8(complete).ok()?.lines().find_map(|l| {
        l.strip_prefix("oom_kill ")
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Kill the processes of one cgroup directory (and its children) and remove it.
pub fn remove(dir: &Path) -> Result<(), CgroupError> {
    // An empty cgroup without children (a sandbox's, once its init is reaped: the pid
    // namespace's processes are gone with it) goes with one rmdir; the kernel refuses it
    // (EBUSY) while a process or a child cgroup is left, and then both are dealt with below.
    match std::fs::remove_dir(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove(&e.path())?;
            }
        }
    }
    for attempt in 0..200 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill with integer arguments; pids are taken from the cgroup we own.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) if attempt < 199 => std::thread::sleep(std::time::Duration::from_millis(5)),
            Err(_) => break,
        }
    }
    Err(CgroupError::Busy { path: dir.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_count_is_read_again_from_the_start_of_the_open_file() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let dir = root.join("sb");
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("memory.oom_control");
        let cg = Cgroup {
            layout: Layout {
                memory: (Version::V1, root.clone()),
                pids: (Version::V1, root.clone()),
                cpu: (Version::V1, root.clone()),
            },
            rel: PathBuf::from("sb"),
            created: Vec::new(),
            oom_file: OnceLock::new(),
        };
        assert_eq!(cg.oom_kills(), None, "no file yet: none, and opened later");
        std::fs::write(&file, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(cg.oom_kills(), Some(3));
        // Written in place (the same inode, as the kernel's file stays): a longer text, then a
        // shorter one, each read whole from its start.
        let rewrite = |text: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&file)
                .unwrap();
            f.write_all(text.as_bytes()).unwrap();
        };
        // v2's `memory.events`, whose `oom_group_kill` comes after.
        rewrite("low 0\nhigh 0\nmax 0\noom 5\noom_kill 12\noom_group_kill 1\n");
        assert_eq!(cg.oom_kills(), Some(12));
        rewrite("oom_kill 4\n");
        assert_eq!(cg.oom_kills(), Some(4));
        rewrite("under_oom 0\noom_kill 7");
        assert_eq!(
            cg.oom_kills(),
            None,
            "a line without its newline may be cut"
        );
        rewrite("oom_kill 5\n");
        assert_eq!(cg.oom_kills(), Some(5));
        // The file stays open: another file at the same path is not read.
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "oom_kill 99\n").unwrap();
        assert_eq!(cg.oom_kills(), Some(5), "the file opened first");
    }

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn hybrid_layout_takes_v1_controllers_when_v2_lacks_them() {
        let l = Layout::from_mountinfo(HYBRID, &|_| "hugetlb\n".into()).unwrap();
        assert_eq!(l.memory, (Version::V1, "/sys/fs/cgroup/memory".into()));
        assert_eq!(l.pids, (Version::V1, "/sys/fs/cgroup/pids".into()));
        assert_eq!(l.cpu, (Version::V1, "/sys/fs/cgroup/cpu,cpuacct".into()));
        assert_eq!(l.roots().len(), 3);
    }

    #[test]
    fn pure_v2_layout_uses_the_unified_root() {
        let text = "31 23 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = Layout::from_mountinfo(text, &|_| "cpuset cpu io memory pids".into()).unwrap();
        assert_eq!(l.memory.0, Version::V2);
        assert_eq!(
            l.roots(),
            vec![(Version::V2, PathBuf::from("/sys/fs/cgroup"))]
        );
    }

    #[test]
    fn missing_controller_is_named() {
        let err = Layout::from_mountinfo("", &|_| String::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no cgroup hierarchy offers the memory controller (is cgroupfs mounted?)"
        );
    }
}
