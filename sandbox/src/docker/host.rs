//! The container seen from this host's kernel: its processes (every process of its pid
//! namespace), signals to them, its memory cgroup's OOM count and its writable layer's usage.
//! Nothing here runs a program of the container.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Host pids of every live (not zombie) process in the pid namespace of `init_pid`, init
/// included. Empty when init is gone.
pub(crate) fn members(init_pid: i32) -> Vec<i32> {
    let Ok(ns) = std::fs::metadata(format!("/proc/{init_pid}/ns/pid")) else {
        return Vec::new();
    };
    let key = (ns.dev(), ns.ino());
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/pid"))
                .is_ok_and(|m| (m.dev(), m.ino()) == key)
        })
        .filter(|pid| stat_fields(*pid).is_some_and(|s| s.state != 'Z'))
        .collect()
}

/// The first child of `pid` (waiting up to a second for one to appear).
pub(crate) fn first_child(pid: i32) -> Option<i32> {
    for _ in 0..200 {
        let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        if let Some(k) = kids.split_whitespace().next().and_then(|k| k.parse().ok()) {
            return Some(k);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    None
}

/// The fields of `/proc/PID/stat` used here.
pub(crate) struct Stat {
    pub state: char,
    pub ppid: i32,
    pub pgid: i32,
}

pub(crate) fn stat_fields(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold anything: fields follow the last `)`.
    let rest = &text[text.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    Some(Stat { state, ppid, pgid })
}

fn sigkill(pid: i32) {
    // SAFETY: kill with integer arguments; a pid that has gone (or been reused by then) is
    // the race every process killer has, narrowed by reading the namespace just before.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// The container's processes but its init and keep-alive (`spared`): the commands' and what
/// they started.
pub(crate) fn others(init_pid: i32, spared: i32) -> Vec<i32> {
    members(init_pid)
        .into_iter()
        .filter(|p| *p != init_pid && *p != spared)
        .collect()
}

/// Kill every process of the container but its init and keep-alive, until none is left (a
/// fork bomb forks while it is killed). Returns how many rounds it took; gives up after
/// `max_rounds`, with the number left.
pub(crate) fn kill_all_but_init(init_pid: i32, spared: i32, max_rounds: u32) -> Result<u32, usize> {
    for round in 1..=max_rounds {
        let others = others(init_pid, spared);
        if others.is_empty() {
            return Ok(round);
        }
        for p in &others {
            sigkill(*p);
        }
        std::thread::sleep(std::time::Duration::from_millis(if round < 5 {
            1
        } else {
            10
        }));
    }
    let left = others(init_pid, spared).len();
    if left == 0 {
        Ok(max_rounds)
    } else {
        Err(left)
    }
}

/// Kill a command and what it started: `pid`, its process group, and every process of the
/// container descending from it (a daemon that left its session and was adopted by the
/// container's init is not its descendant any more, and survives as on the native backend).
pub(crate) fn kill_tree(init_pid: i32, spared: i32, pid: i32) {
    for _ in 0..20 {
        let procs: Vec<(i32, Stat)> = others(init_pid, spared)
            .into_iter()
            .filter_map(|p| Some((p, stat_fields(p)?)))
            .collect();
        let parent_of: std::collections::HashMap<i32, i32> =
            procs.iter().map(|(p, s)| (*p, s.ppid)).collect();
        let descends = |mut p: i32| {
            for _ in 0..4096 {
                if p == pid {
                    return true;
                }
                match parent_of.get(&p) {
                    Some(&pp) if pp != p => p = pp,
                    _ => return false,
                }
            }
            false
        };
        let doomed: Vec<i32> = procs
            .iter()
            .filter(|(p, s)| s.pgid == pid || descends(*p))
            .map(|(p, _)| *p)
            .collect();
        if doomed.is_empty() {
            return;
        }
        for p in doomed {
            sigkill(p);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The OOM kills counted by the memory cgroup of `pid` (v1 `memory.oom_control`, v2
/// `memory.events`); 0 when it cannot be read.
pub(crate) fn oom_kills(pid: i32) -> u64 {
    let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return 0;
    };
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        let files: Vec<String> = if ctrls.split(',').any(|c| c == "memory") {
            vec![format!("/sys/fs/cgroup/memory{path}/memory.oom_control")]
        } else if ctrls.is_empty() {
            vec![
                format!("/sys/fs/cgroup{path}/memory.events"),
                format!("/sys/fs/cgroup/unified{path}/memory.events"),
            ]
        } else {
            continue;
        };
        for f in files {
            if let Ok(text) = std::fs::read_to_string(&f) {
                if let Some(n) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse().ok())
                {
                    return n;
                }
            }
        }
    }
    0
}

/// Bytes (allocated blocks) and inodes under a directory, not crossing into other mounts.
pub(crate) fn usage(dir: &Path) -> (u64, u64) {
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let dev = top.dev();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            inodes += 1;
            bytes += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// Bytes and inodes used on the filesystem mounted at `path` (statfs).
pub(crate) fn fs_used(path: &str) -> (u64, u64) {
    match nix::sys::statfs::statfs(path) {
        Ok(s) => (
            s.blocks().saturating_sub(s.blocks_free()) * s.block_size() as u64,
            s.files().saturating_sub(s.files_free()),
        ),
        Err(_) => (0, 0),
    }
}
