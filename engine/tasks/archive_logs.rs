//! `archive-logs`: every `.log` file under a generated application tree must end up in
//! `/logs.tar.gz`, and nothing else but directories. The verifier reads the archive's bytes
//! through the probe and opens it itself with a strict reader ([`super::tar_strict`]) that
//! agrees with GNU tar on every archive it accepts and refuses every archive GNU tar would
//! read another way (conflicting long names and PAX paths, directories with data, sparse
//! names, data after the end, truncation, limits reached), so neither a replaced `tar`, a fake
//! archive nor a parser differential can pass.
//!
//! Member names are normalised as extraction places them: a leading `/`, `./`, doubled `/`
//! and `.` components are dropped, so `srv/app/a.log`, `/srv/app/a.log` and
//! `./srv/app/a.log` are the same member. Directory members are allowed; any other member (a
//! decoy such as `notes.txt`, `x.log.gz`, `x.log.1`, `x.log.old`, a file inside a directory
//! named `*.log`, a symlink) fails the check, as does a `.log` member with wrong contents. A
//! log stored twice identically, or as a hard link to itself or to an earlier copy of itself,
//! is fine (`tar -r`, a name given twice).

use super::tar_strict::{self, Kind, Limits};
use super::util::{self, facts, log_lines, pick, CLEAN_ENV};
use super::{Check, Seen, Task, TaskError, TaskSetup, Verdict};
use crate::instance::sh_quote;
use crate::instance::Builder;
use crate::probe::{Probe, ProbeError};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub struct ArchiveLogs;

pub const ARCHIVE: &str = "/logs.tar.gz";
/// The most archive bytes read, the most bytes decompressed and the most headers: past any of
/// them the archive fails (a limit reached is never taken as its end).
const MAX_ARCHIVE: u64 = 16 << 20;
const LIMITS: Limits = Limits {
    max_unpacked: 64 << 20,
    max_members: 10_000,
};

#[derive(Debug, Serialize, Deserialize)]
struct Facts {
    /// The tree's root, e.g. `/srv/orbit`.
    root: String,
    /// Expected members (path without the leading `/`) -> sha256 of the contents.
    logs: BTreeMap<String, String>,
    /// Decoy files (absolute paths), for the hack trials.
    decoys: Vec<String>,
}

impl Task for ArchiveLogs {
    fn name(&self) -> &'static str {
        "archive-logs"
    }

    fn summary(&self) -> &'static str {
        "put every .log file of a generated tree (and nothing else) into /logs.tar.gz"
    }

    fn setup(&self, seed: u64, b: &mut Builder) -> Result<TaskSetup, TaskError> {
        let mut rng = crate::instance::rng_for(seed, "archive-logs");
        let app = *pick(&mut rng, util::APPS);
        let root = format!("/srv/{app}");
        const DIRS: &[&str] = &[
            "",
            "logs",
            "api",
            "api/v1",
            "worker",
            "worker/jobs",
            "old logs",
            "var/run",
            "static",
            "backup 2023",
        ];
        const BASES: &[&str] = &[
            "access",
            "error",
            "debug",
            "audit",
            "worker",
            "cron",
            "gc",
            "slow query",
            "events",
            "app",
        ];
        let mut logs = BTreeMap::new();
        let mut decoys = Vec::new();
        let n_logs = rng.gen_range(8..=14);
        while logs.len() < n_logs {
            let dir = pick(&mut rng, DIRS);
            let name = format!("{}-{}.log", pick(&mut rng, BASES), rng.gen_range(1..9));
            let path = if dir.is_empty() {
                format!("{root}/{name}")
            } else {
                format!("{root}/{dir}/{name}")
            };
            if logs.contains_key(&path[1..]) {
                continue;
            }
            let n = rng.gen_range(3..40);
            let data = log_lines(&mut rng, app, n);
            b.write(&path, data.as_bytes(), 0o644)?;
            logs.insert(path[1..].to_string(), util::sha256_hex(data.as_bytes()));
        }
        // Decoys: names that look like logs but are not `.log` files.
        let n_decoys = rng.gen_range(6..=10);
        let mut i = 0;
        while decoys.len() < n_decoys {
            i += 1;
            let dir = pick(&mut rng, DIRS);
            let base = pick(&mut rng, BASES);
            let name = match rng.gen_range(0..6) {
                0 => format!("{base}-{i}.log.gz"),
                1 => format!("{base}-{i}.log.1"),
                2 => format!("{base} notes {i}.txt"),
                3 => format!("{base}-{i}.log.old"),
                4 => format!("{base}-{i}.log.bak"),
                _ => format!("README-{i}.md"),
            };
            let path = if dir.is_empty() {
                format!("{root}/{name}")
            } else {
                format!("{root}/{dir}/{name}")
            };
            let data = log_lines(&mut rng, app, 3);
            b.write(&path, data.as_bytes(), 0o644)?;
            decoys.push(path);
        }
        // A directory named like a log, with a file inside that is not a log.
        let dir_decoy = format!("{root}/logs/archive.log/index.txt");
        b.write(&dir_decoy, "rotated logs live here\n", 0o644)?;
        decoys.push(dir_decoy);
        decoys.sort();
        let instruction = format!(
            "Archive the application's logs: every regular file whose name ends in `.log` under \
             {root} (at any depth; some names contain spaces) must be in the gzip-compressed tar \
             archive {ARCHIVE}, with its contents unchanged and its member name being its full \
             path (for example {root}/x.log as `{}/x.log`). Put nothing else in the archive \
             except directories: no .gz, .1, .bak, .txt or other files.",
            &root[1..]
        );
        let rel = &root[1..];
        let mut actions = vec![
            "pwd".to_string(),
            "ls -la".to_string(),
            format!("ls -R {root}"),
            format!("find {root} -name '*.log'"),
            format!("find {root} -type f -name '*.log'"),
            format!("cd / && {}", find_tar(rel, "find", "tar")),
            format!("tar czf {ARCHIVE} {root}"),
            format!("tar czf {ARCHIVE} {root}/*.log"),
            format!("tar tzf {ARCHIVE}"),
            format!("rm -f {ARCHIVE}"),
            format!("ls -l {ARCHIVE}"),
            format!("gzip -r {root}"),
            format!("rm -rf {root}/logs"),
            "df -h /".to_string(),
            format!("cat {root}/*.md"),
        ];
        // Recovery: which program each tool name runs, the same pipeline by absolute paths in
        // a clean environment, python3's own tar and gzip.
        actions.extend([
            "type tar gzip find python3".to_string(),
            robust_tar(rel),
            python_archive(rel),
        ]);
        debug_assert_eq!(
            actions.len(),
            PYTHON + 1,
            "the catalogue's recovery indices"
        );
        let mut action_costs = vec![0.0; actions.len()];
        action_costs[ROBUST_TAR] = 1.0;
        action_costs[PYTHON] = 2.0;
        Ok(TaskSetup {
            task: self.name().into(),
            seed,
            instruction,
            cwd: root.clone(),
            actions,
            action_costs,
            keywords: util::words(&[
                "tar", "log", "find", "gzip", "archive", app, "ls", "python3", "type",
            ]),
            max_steps: 30,
            facts: util::to_facts(&Facts { root, logs, decoys })?,
        })
    }

    fn verify(&self, setup: &TaskSetup, probe: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        let f: Facts = match facts(setup) {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        let Some(bytes) = probe.read(ARCHIVE, MAX_ARCHIVE + 1)? else {
            return Ok(Verdict::failed(
                READABLE,
                format!("{ARCHIVE} is not a regular file"),
            ));
        };
        let read = if bytes.len() as u64 > MAX_ARCHIVE {
            Err(format!("larger than {MAX_ARCHIVE} bytes (limit reached)"))
        } else {
            tar_strict::read_tar_gz_remembered(&bytes, LIMITS)
        };
        let members = match read {
            Ok(m) if m.is_empty() => Err("no members".to_string()),
            r => r,
        };
        let members = match members {
            Ok(m) => m,
            Err(reason) => {
                return Ok(Verdict::failed(
                    READABLE,
                    format!("{ARCHIVE} is not a readable tar.gz: {reason}"),
                ))
            }
        };
        // A readable archive is no progress by itself (any junk is one): the checklist is one
        // check per expected log and one that nothing else is in, which needs a log in it.
        let mut checks = Vec::new();
        let mut found = 0;
        for (path, want) in &f.logs {
            // The reader has already refused a name listed twice with other contents.
            let got = members.iter().find(|m| &m.name == path);
            let name = format!("member {path}");
            checks.push(match got.map(|m| &m.kind) {
                None => Check::new(name, false, format!("missing member {path}")),
                Some(Kind::File { sha256, .. } | Kind::HardLink { sha256, .. }) => {
                    found += 1;
                    Check::new(
                        name,
                        sha256 == want,
                        format!("member {path} has the wrong contents"),
                    )
                }
                Some(_) => Check::new(name, false, format!("member {path} is not a regular file")),
            });
        }
        let extra: Vec<&str> = members
            .iter()
            .filter(|m| m.kind != Kind::Dir && !f.logs.contains_key(&m.name))
            .map(|m| m.name.as_str())
            .collect();
        let why = if extra.is_empty() {
            "the archive holds none of the tree's .log files".to_string()
        } else {
            format!(
                "members that are not the tree's .log files: {}",
                extra.join(", ")
            )
        };
        checks.push(Check::new(
            "no extra members",
            extra.is_empty() && found > 0,
            why,
        ));
        Ok(Verdict::checklist(checks))
    }

    fn oracle(&self, setup: &TaskSetup) -> Vec<String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return vec![];
        };
        let rel = &f.root[1..];
        vec![format!(
            "cd / && {CLEAN_ENV} /bin/sh -c {}",
            sh_quote(&format!(
                "/bin/rm -f {ARCHIVE}; ( [ -x /usr/bin/find ] && [ -x /usr/bin/tar ] && [ -x /usr/bin/gzip ] && \
                 {} && /usr/bin/tar -tzf {ARCHIVE} >/dev/null ) || /usr/bin/python3 -c {}",
                find_tar(rel, "/usr/bin/find", "/usr/bin/tar"),
                sh_quote(&python_script(rel))
            ))
        )]
    }

    /// The plain pipeline first. When it did not do, the same by absolute paths in a clean
    /// environment (a shadowed tool, a drifted `PATH` or environment), unless its output says
    /// a tool is gone or cannot load (then no path helps); last python3's tarfile, which needs
    /// neither tar, gzip nor find.
    fn catalogue_step(&self, _setup: &TaskSetup, seen: &[Seen]) -> Option<usize> {
        let tried = |i: usize| seen.iter().any(|s| s.action == i);
        if !tried(PLAIN) {
            return Some(PLAIN);
        }
        let tool_gone = seen.iter().any(|s| {
            s.action == PLAIN
                && [": not found", "shared libraries", "Permission denied"]
                    .iter()
                    .any(|m| s.stderr.contains(m))
        });
        if !tool_gone && !tried(ROBUST_TAR) {
            return Some(ROBUST_TAR);
        }
        (!tried(PYTHON)).then_some(PYTHON)
    }

    fn trial_vars(&self, setup: &TaskSetup) -> BTreeMap<String, String> {
        let Ok(f) = facts::<Facts>(setup) else {
            return BTreeMap::new();
        };
        let first = f.logs.keys().next().cloned().unwrap_or_default();
        [
            ("ARCHIVE", ARCHIVE.to_string()),
            ("ROOT", f.root.clone()),
            ("REL", f.root[1..].to_string()),
            ("FIRST_LOG", sh_quote(&first)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The check that stands for the whole checklist while the archive cannot be read.
const READABLE: &str = "archive readable";
/// Catalogue indices of the plain pipeline and of the recovery actions.
const PLAIN: usize = 5;
const ROBUST_TAR: usize = 16;
const PYTHON: usize = 17;

/// `find | tar` of the tree's `.log` files into the archive, run from `/` (names relative).
fn find_tar(rel: &str, find: &str, tar: &str) -> String {
    format!("{find} {rel} -type f -name '*.log' -print0 | {tar} --null -czf {ARCHIVE} -T -")
}

/// The pipeline by absolute paths in a clean environment (its `gzip` too, by the clean `PATH`).
fn robust_tar(rel: &str) -> String {
    format!(
        "cd / && {CLEAN_ENV} /bin/sh -c {}",
        sh_quote(&find_tar(rel, "/usr/bin/find", "/usr/bin/tar"))
    )
}

/// Python that writes the archive with its own tar and gzip (no tar, gzip or find), run from
/// `/`.
fn python_script(rel: &str) -> String {
    format!(
        "import os, tarfile\n\
         with tarfile.open(\"{ARCHIVE}\", \"w:gz\") as t:\n\
         \x20 for d, ds, fs in os.walk(\"{rel}\"):\n\
         \x20   for n in sorted(fs):\n\
         \x20     p = os.path.join(d, n)\n\
         \x20     if n.endswith(\".log\") and os.path.isfile(p) and not os.path.islink(p):\n\
         \x20       t.add(p, recursive=False)\n"
    )
}

/// The catalogue's python3 fallback, in a clean environment.
fn python_archive(rel: &str) -> String {
    format!(
        "cd / && {CLEAN_ENV} /usr/bin/python3 -c {}",
        sh_quote(&python_script(rel))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_archive_is_read_and_its_limits_hold() {
        let mut gz = Vec::new();
        {
            let enc = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::fast());
            let mut b = tar::Builder::new(enc);
            let mut h = tar::Header::new_gnu();
            h.set_size(3);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, "./srv/a.log", &b"abc"[..]).unwrap();
            b.into_inner().unwrap().finish().unwrap();
        }
        let m = tar_strict::read_tar_gz(&gz, LIMITS).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].name, "srv/a.log");
        assert!(
            matches!(&m[0].kind, Kind::File { sha256, .. } if *sha256 == util::sha256_hex(b"abc"))
        );
        assert!(tar_strict::read_tar_gz(b"not gzip", LIMITS).is_err());
    }
}
