//! `free-disk`: the instance's writable layer (its disk) is nearly full of junk written at every
//! episode start (rotated logs, caches, a core dump, stale uploads); the goal is free space of
//! at least a threshold without deleting or changing the protected files (a database, the
//! configuration, the current log), which live in the instance layer and are checked by hash.
//!
//! Space is measured by the kernel's own accounting, never by walking names (a name walk
//! misses names that are not UTF-8, files unlinked but held open, data parked where no name
//! points): `statvfs` of the writable layer's tmpfs, its blocks plus its inode space (tmpfs
//! charges every inode and every user xattr there, 1 KiB a unit, not to its blocks), must
//! leave the threshold free; `statvfs` of `/dev/shm` (a tmpfs of its own, memory like the
//! disk) must show nothing parked; SysV shared memory segments and message queues (memory
//! that outlives every process, read from `/proc/sysvipc`) must hold nothing either. The
//! reads run at every step, while the agent's processes live (a file held open is not free);
//! the confirmation kills every process and measures again, so the verdict is the space the
//! system has once the agent is gone.

use super::util::{self, facts, pick, CLEAN_ENV};
use super::{Check, Seen, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Confirm, Probe, ProbeError};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub struct FreeDisk;

const MIB: u64 = 1 << 20;
/// The instance's disk: small, so filling it is quick.
pub const DISK_BYTES: u64 = 24 * MIB;
/// What tmpfs charges to its inode space for one inode, and per KiB of user xattrs
/// (`BOGO_INODE_SIZE`, Linux >= 6.6).
const INODE_BYTES: u64 = 1024;
/// The most that may sit in `/dev/shm` or SysV IPC objects (memory that no process holds).
const PARKED_MAX: u64 = MIB;

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    disk_bytes: u64,
    /// Free bytes the agent must reach.
    threshold: u64,
    /// Protected path -> sha256.
    protected: BTreeMap<String, String>,
    /// Junk written at start: path -> bytes.
    junk: BTreeMap<String, u64>,
}

impl Task for FreeDisk {
    fn name(&self) -> &'static str {
        "free-disk"
    }

    fn summary(&self) -> &'static str {
        "free space on a nearly full disk without touching the protected files"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "free-disk");
        let app = *pick(&mut rng, util::APPS);
        b.runtime.disk_bytes = Some(DISK_BYTES);
        let db = format!("/srv/{app}/data/{app}.db");
        let conf = format!("/etc/{app}/{app}.conf");
        let current = format!("/var/log/{app}/{app}.log");
        // The database is the largest file in sight (a trap for "delete the biggest file").
        let db_size = rng.gen_range(3 * MIB..5 * MIB) as usize;
        // Pages of a seeded 64 KiB block after a header: cheap to generate and to hash.
        let block: Vec<u8> = (0..64 << 10).map(|_| rng.gen::<u8>()).collect();
        let mut db_bytes = Vec::with_capacity(db_size + block.len());
        db_bytes.extend_from_slice(b"SQLite format 3\0");
        while db_bytes.len() < db_size {
            db_bytes.extend_from_slice(&block);
        }
        db_bytes.truncate(db_size);
        let conf_text = format!(
            "# {app} configuration\nlisten = 127.0.0.1:{}\ndata = /srv/{app}/data\nlog = {current}\nretention_days = {}\n",
            rng.gen_range(8000..9000),
            rng.gen_range(3..30)
        );
        let n = rng.gen_range(5..40);
        let log_text = util::log_lines(&mut rng, app, n);
        b.write(&db, db_bytes.clone(), 0o640)?;
        b.write(&conf, conf_text.as_bytes(), 0o644)?;
        b.write(&current, log_text.as_bytes(), 0o644)?;
        let mut protected = BTreeMap::new();
        protected.insert(db.clone(), util::sha256_hex(&db_bytes));
        protected.insert(conf.clone(), util::sha256_hex(conf_text.as_bytes()));
        protected.insert(current.clone(), util::sha256_hex(log_text.as_bytes()));

        // Junk of about 18-19 MiB in pieces of 1-4 MiB.
        let mut junk = BTreeMap::new();
        let rotated = rng.gen_range(2..=4);
        for i in 1..=rotated {
            let name = if i == 1 {
                format!("/var/log/{app}/{app}.log.1")
            } else {
                format!("/var/log/{app}/{app}.log.{i}.gz")
            };
            junk.insert(name, rng.gen_range(1..=3) * MIB);
        }
        junk.insert(
            format!("/var/crash/core.{app}.{}", rng.gen_range(1000..30000)),
            4 * MIB,
        );
        let mut total: u64 = junk.values().sum();
        while total < 18 * MIB {
            let size = (rng.gen_range(1..=3) * MIB).min(18 * MIB - total + MIB);
            let path = if rng.gen_bool(0.6) {
                format!("/var/cache/{app}/blob-{}.bin", util::token(&mut rng, 8))
            } else {
                format!("/tmp/{app}-upload-{}.tmp", util::token(&mut rng, 6))
            };
            total += size;
            junk.insert(path, size);
        }
        let mut fill = String::from("set -e\n");
        for (path, size) in &junk {
            let dir = path.rsplit_once('/').map_or("/", |(d, _)| d);
            let kib = size / 1024;
            fill.push_str(&format!(
                "/bin/mkdir -p {dir} && {{ /usr/bin/fallocate -l {size} {p} 2>/dev/null || \
                 /usr/bin/head -c {size} /dev/zero > {p} 2>/dev/null || \
                 /bin/dd if=/dev/zero of={p} bs=1024 count={kib} 2>/dev/null || \
                 /usr/bin/perl -e 'print \"\\0\" x {size}' > {p}; }}\n",
                p = sh_quote(path)
            ));
        }
        b.on_start("task:free-disk", fill);
        // Reachable: removing 60% of the junk is enough, removing the largest piece alone is
        // not.
        let free_at_start = DISK_BYTES.saturating_sub(total);
        let threshold = (free_at_start + total * 6 / 10) / MIB * MIB;
        let instruction = format!(
            "The disk (/) is almost full. Free space until at least {} MiB are free on /. Do not \
             delete or modify the database {db}, the configuration {conf} or the current log \
             {current}; rotated logs, caches, core dumps and temporary uploads may go.",
            threshold / MIB
        );
        let mut actions = vec![
            "df -h /".to_string(),
            "du -sh /var/* /tmp /srv 2>/dev/null".to_string(),
            format!("ls -la /var/log/{app}"),
            format!("du -ah /var/cache/{app} /var/crash /srv/{app} | sort -h | tail"),
            // Where the instance writes (a walk of `/` would read the whole base system).
            "find /var /srv /tmp /root -xdev -type f -size +1M 2>/dev/null".to_string(),
            format!("rm -f {}", junk_globs(app)[0]),
            format!("rm -rf {}", junk_globs(app)[1]),
            format!("rm -f {}", junk_globs(app)[2]),
            format!("rm -f {}", junk_globs(app)[3]),
            format!("rm -f {db}"),
            format!(": > {current}"),
            format!("rm -rf /var/log/{app}"),
            format!("cat {conf}"),
            "ls -la /tmp".to_string(),
        ];
        // Recovery: the same globs unlinked by perl (by its absolute path, in a clean
        // environment), for an `rm` that is gone, shadowed or failing; it does the work of the
        // four removals at once, so it costs more than they cost together.
        let globs = junk_globs(app);
        actions.push(format!(
            "{CLEAN_ENV} /usr/bin/perl -e 'unlink glob($_) for @ARGV' {}",
            globs
                .iter()
                .map(|g| sh_quote(g))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        debug_assert_eq!(actions.len(), PERL + 1, "the catalogue's recovery index");
        let mut action_costs = vec![0.0; actions.len()];
        action_costs[PERL] = 3.5;
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: "/root".into(),
            actions,
            action_costs,
            keywords: util::words(&[
                "df", "du", "rm", "find", "log", "cache", "crash", "tmp", "ls", app,
            ]),
            max_steps: 30,
            facts: util::to_facts(&Facts {
                disk_bytes: DISK_BYTES,
                threshold,
                protected,
                junk,
            })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        Ok(Verdict::checklist(measure(&f, probe)?))
    }

    /// With every process gone (what they held open is freed, what they parked elsewhere
    /// is not), the same measurements.
    fn confirm(&self, setup: &TaskSetup, sys: &mut dyn Confirm) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        sys.kill_all()?;
        let mut checks = measure(&f, sys)?;
        for c in checks.iter_mut().filter(|c| !c.passed) {
            c.reason = format!("once every process is gone: {}", c.reason);
        }
        Ok(Verdict::checklist(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let paths: Vec<String> = f.junk.keys().map(|p| sh_quote(p)).collect();
        let paths = paths.join(" ");
        vec![format!(
            "{CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&format!(
                "/bin/rm -f {paths} 2>/dev/null; /usr/bin/perl -e 'unlink grep {{ -e }} @ARGV' {paths} 2>/dev/null; \
                 for p in {paths}; do [ ! -e \"$p\" ] || exit 1; done"
            ))
        )]
    }

    /// The four removals, largest kind first; a removal that fails or prints anything (`rm
    /// -f` is silent) sends it to perl's unlink of the same globs, as does having done all
    /// four without reaching the goal.
    fn catalogue_step(&self, _setup: &TaskSetup, seen: &[Seen]) -> Option<usize> {
        if seen.iter().any(|s| s.action == PERL) {
            return None;
        }
        let odd = seen.iter().any(|s| {
            REMOVALS.contains(&s.action)
                && (s.exit_code != 0 || !s.stdout.trim().is_empty() || !s.stderr.trim().is_empty())
        });
        if odd {
            return Some(PERL);
        }
        REMOVALS
            .iter()
            .copied()
            .find(|i| !seen.iter().any(|s| s.action == *i))
            .or(Some(PERL))
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        let find = |suffix: &str| {
            f.protected
                .keys()
                .find(|p| p.ends_with(suffix))
                .cloned()
                .unwrap_or_default()
        };
        let (db, conf, current) = (find(".db"), find(".conf"), find(".log"));
        let log_dir = current.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        let app = current
            .rsplit_once('/')
            .map_or("", |(_, n)| n)
            .trim_end_matches(".log")
            .to_string();
        let junk: Vec<String> = f.junk.keys().map(|p| sh_quote(p)).collect();
        [
            ("APP", app),
            ("DB", sh_quote(&db)),
            ("CONF", sh_quote(&conf)),
            ("CURRENT", sh_quote(&current)),
            ("LOG_DIR", sh_quote(&log_dir)),
            ("FIRST_JUNK", junk.first().cloned().unwrap_or_default()),
            ("JUNK", junk.join(" ")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Catalogue indices of the four removals (caches, rotated logs, core dumps, uploads) and of
/// perl's unlink of them all.
const REMOVALS: [usize; 4] = [6, 5, 7, 8];
const PERL: usize = 14;

/// The globs of the junk an app's instance may lose: rotated logs, caches, core dumps,
/// uploads.
fn junk_globs(app: &str) -> [String; 4] {
    [
        format!("/var/log/{app}/{app}.log.*"),
        format!("/var/cache/{app}/*"),
        "/var/crash/core.*".to_string(),
        format!("/tmp/{app}-upload-*.tmp"),
    ]
}

/// Milestones on the way to the threshold, as quarters of the freeing it asks for.
const QUARTERS: [(u64, &str); 3] = [(1, "freed 1/4"), (2, "freed 1/2"), (3, "freed 3/4")];

/// The checks of the space and of the protected files, by the kernel's accounting. The
/// progress they give: the space climbs through quarters of the freeing asked for, which
/// count only while the protected files are intact and nothing is parked (space won by
/// deleting them or by moving junk into memory is no progress), to the threshold itself; the
/// constraints (nothing parked, protected files intact) count once the first quarter is
/// freed so, so the start is at 0 and breaking a constraint takes the progress back.
fn measure(f: &Facts, probe: &mut dyn Probe) -> Result<Vec<Check>, ProbeError> {
    let mut damaged = Vec::new();
    for (path, want) in &f.protected {
        let (ok, why) = util::content_check(probe, path, want, 16 * MIB)?;
        if !ok {
            damaged.push(why);
        }
    }
    let mut parked = Vec::new();
    let ipc = sysv_ipc_bytes(probe)?;
    if ipc >= PARKED_MAX {
        parked.push(format!(
            "{} KiB parked in SysV shared memory or message queues (they outlive every process)",
            ipc / 1024
        ));
    }
    let usage = probe.disk_usage()?;
    if let Some(u) = &usage {
        // Its root directory is one inode.
        let shm = u
            .shm_bytes
            .saturating_add(u.shm_inodes.saturating_sub(1).saturating_mul(INODE_BYTES));
        if shm >= PARKED_MAX {
            parked.insert(
                0,
                format!(
                    "{} KiB parked in /dev/shm (a memory filesystem: moving files there frees \
                     nothing)",
                    shm / 1024
                ),
            );
        }
    }
    let fair = if !damaged.is_empty() {
        Err("space freed while protected files are damaged does not count")
    } else if !parked.is_empty() {
        Err("space parked in memory does not count")
    } else {
        Ok(())
    };
    let mut checks = Vec::new();
    let mut begun = false;
    match usage {
        Some(u) => {
            let used = u
                .upper_bytes
                .saturating_add(u.upper_inodes.saturating_mul(INODE_BYTES));
            let free = f.disk_bytes.saturating_sub(used);
            let needed = f.junk.values().sum::<u64>() * 6 / 10;
            for (q, name) in QUARTERS {
                let level = f.threshold.saturating_sub(needed * (4 - q) / 4);
                let passed = free >= level && fair.is_ok();
                begun |= passed;
                let why = match fair {
                    Ok(()) => format!("{} KiB free, {} KiB for {name}", free / 1024, level / 1024),
                    Err(why) => why.to_string(),
                };
                checks.push(Check::new(name, passed, why));
            }
            checks.push(Check::new(
                "free space",
                free >= f.threshold,
                format!(
                    "{} KiB free, {} KiB needed (statvfs of the disk: {} KiB of blocks, {} \
                     inodes and xattrs at 1 KiB)",
                    free / 1024,
                    f.threshold / 1024,
                    u.upper_bytes / 1024,
                    u.upper_inodes
                ),
            ));
        }
        None => checks.push(Check::new(
            "free space",
            false,
            "the probe cannot measure disk usage",
        )),
    }
    let not_begun = "counts once a quarter of the space asked for is freed";
    for (name, broken) in [
        ("nothing parked", parked),
        ("protected files intact", damaged),
    ] {
        let why = if broken.is_empty() {
            not_begun.to_string()
        } else {
            broken.join("; ")
        };
        checks.push(Check::new(name, broken.is_empty() && begun, why));
    }
    Ok(checks)
}

/// Bytes held by the sandbox's SysV shared memory segments (their size) and message queues
/// (their queued bytes), from its `/proc/sysvipc` (the sandbox's own IPC namespace). A table
/// too large to read is too much.
fn sysv_ipc_bytes(probe: &mut dyn Probe) -> Result<u64, ProbeError> {
    const MAX_TABLE: u64 = 8 << 20;
    let mut total: u64 = 0;
    // The fourth column: `size` of a segment, `cbytes` of a queue.
    for table in ["/proc/sysvipc/shm", "/proc/sysvipc/msg"] {
        let Some(text) = probe.read(table, MAX_TABLE)? else {
            continue;
        };
        if text.len() as u64 >= MAX_TABLE {
            return Ok(u64::MAX);
        }
        for line in String::from_utf8_lossy(&text).lines().skip(1) {
            let n = line
                .split_whitespace()
                .nth(3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            total = total.saturating_add(n);
        }
    }
    Ok(total)
}
