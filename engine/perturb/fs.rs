//! Filesystem faults: a full disk, no inodes left, flipped permissions, a missing file, a
//! corrupted configuration file, a read-only directory.
//!
//! Also the path helper the other families share ([`canonical`]).

use super::{Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::{clean_path, resolve_link, sh_quote, Builder, Entry};
use rand::seq::SliceRandom;
use rand::Rng;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![
        &DiskFill,
        &InodeExhaustion,
        &PermissionFlip,
        &MissingFile,
        &CorruptedConfig,
        &ReadOnlyDir,
    ]
}

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// The target of a symlink as the sandbox will see it (the layer first, then the base).
fn link_target(b: &Builder, path: &str) -> Option<String> {
    match b.layer.entries.get(path) {
        Some(Entry::Symlink { target }) => Some(target.clone()),
        Some(_) => None,
        None => b.base.read_link(path),
    }
}

/// Resolve the symlinks of a path inside the rootfs under construction, as the sandbox would:
/// every directory component, and the last one too when `follow_last`. A missing component
/// ends the resolution (the rest is appended as is). `None`: a symlink loop or a path that
/// `clean_path` refuses.
///
/// Writing through the canonical path matters on merged-usr systems: `/bin` is a symlink to
/// `usr/bin`, and a layer entry under `/bin/` would turn it into a directory.
pub(crate) fn canonical(b: &Builder, path: &str, follow_last: bool) -> Option<String> {
    let mut cur = clean_path(path).ok()?;
    'restart: for _ in 0..40 {
        let comps: Vec<String> = cur
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        let mut prefix = String::new();
        for (i, c) in comps.iter().enumerate() {
            prefix.push('/');
            prefix.push_str(c);
            let last = i + 1 == comps.len();
            if last && !follow_last {
                break;
            }
            match b.meta(&prefix) {
                Some(m) if m.is_symlink => {
                    let t = link_target(b, &prefix)?;
                    let mut next = resolve_link(&prefix, &t);
                    for rest in &comps[i + 1..] {
                        next.push('/');
                        next.push_str(rest);
                    }
                    if next == "/" {
                        return None;
                    }
                    cur = next;
                    continue 'restart;
                }
                Some(_) => {}
                None => break,
            }
        }
        return Some(cur);
    }
    None
}

/// The canonical form of a path parameter (see [`canonical`]), or a `BadParam` naming it.
fn path_param(
    b: &Builder,
    params: &Params,
    name: &str,
    follow_last: bool,
) -> Result<String, PerturbError> {
    let raw = params.str(name);
    clean_path(raw).map_err(|e| PerturbError::BadParam {
        param: name.into(),
        reason: e.to_string(),
    })?;
    canonical(b, raw, follow_last).ok_or_else(|| PerturbError::BadParam {
        param: name.into(),
        reason: format!("`{raw}` is a symbolic link loop"),
    })
}

// ---------------------------------------------------------------------------------------------
// disk-fill
// ---------------------------------------------------------------------------------------------

pub struct DiskFill;

static DISK_FILL: Info = Info {
    name: "disk-fill",
    family: Family::Filesystem,
    summary: "the writable disk is (nearly) full: writes fail with ENOSPC",
    mechanism: "a start step measures the writable layer with statfs (`stat -f /`) at every \
                episode start and allocates a ballast file (fallocate, else zeros) in the \
                target directory so that only free_pct of the disk stays free",
    params: &[
        ParamSpec {
            name: "target",
            kind: Kind::Str,
            default: "/var/log",
            realistic: "/var/log, /tmp, /var/cache, the application's data directory",
            help: "directory that receives the ballast file (created when missing)",
        },
        ParamSpec {
            name: "free_pct",
            kind: Kind::Float {
                min: 0.0,
                max: 50.0,
            },
            default: "0",
            realistic: "0-5 (a disk at 95-100%)",
            help: "percentage of the writable layer left free",
        },
    ],
};

/// Plausible names of a file that filled a disk.
const BALLAST_NAMES: &[&str] = &[
    "debug.log.1",
    "app.log.old",
    "core.4711",
    "backup-full.tar",
    "heapdump.hprof",
    "journal.bin",
    "access.log.2",
];

impl Perturbation for DiskFill {
    fn info(&self) -> &'static Info {
        &DISK_FILL
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let target = path_param(b, params, "target", true)?;
        match b.meta(&target) {
            Some(m) if !m.is_dir => {
                return Err(PerturbError::BadParam {
                    param: "target".into(),
                    reason: format!("`{target}` is not a directory"),
                })
            }
            Some(_) => {}
            None => b.mkdir(&target, 0o755)?,
        }
        let mut rng = b.rng(purpose);
        let name = BALLAST_NAMES.choose(&mut rng).copied().unwrap_or("ballast");
        let file = format!("{target}/{name}");
        // Basis points of the disk to leave free (integer arithmetic in the shell).
        let keep_bp = (params.float("free_pct") * 100.0).round() as u64;
        let f = sh_quote(&file);
        let shell = format!(
            "set -- $(stat -f -c '%S %b %a' /) && \
             n=$(( ($3 - $2 * {keep_bp} / 10000) * $1 )) && \
             if [ \"$n\" -gt 0 ]; then \
               fallocate -l \"$n\" {f} 2>/dev/null || \
               head -c \"$n\" /dev/zero > {f} 2>/dev/null || true; \
             fi"
        );
        b.on_start(DISK_FILL.name, shell);
        Ok(format!(
            "ballast {file} fills the writable layer to leave {}% free at every episode start",
            params.float("free_pct")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// inode-exhaustion
// ---------------------------------------------------------------------------------------------

pub struct InodeExhaustion;

static INODE_EXHAUSTION: Info = Info {
    name: "inode-exhaustion",
    family: Family::Filesystem,
    summary: "no inodes left: creating a file fails with ENOSPC while `df -h` shows free space",
    mechanism: "the writable layer's tmpfs gets a bounded inode count (`nr_inodes`, \
                RuntimeSettings.disk_inodes); a start step creates empty files (session-file \
                style) in the target directory until only `free` inodes remain",
    params: &[
        ParamSpec {
            name: "free",
            kind: Kind::Int { min: 0, max: 1000 },
            default: "0",
            realistic: "0-20",
            help: "inodes left free after the fill",
        },
        ParamSpec {
            name: "total",
            kind: Kind::Int {
                min: 128,
                max: 100_000,
            },
            default: "512",
            realistic: "512-4096 (each inode to fill costs about 50 µs at every episode start)",
            help: "inodes of the writable layer",
        },
        ParamSpec {
            name: "target",
            kind: Kind::Str,
            default: "/var/lib/php/sessions",
            realistic: "/var/lib/php/sessions, /var/spool/postfix/maildrop, /var/cache/app",
            help: "directory that receives the small files (created when missing)",
        },
    ],
};

impl Perturbation for InodeExhaustion {
    fn info(&self) -> &'static Info {
        &INODE_EXHAUSTION
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let free = params.int("free").max(0) as u64;
        let total = params.int("total").max(0) as u64;
        if free.saturating_mul(2) > total {
            return Err(PerturbError::BadParam {
                param: "free".into(),
                reason: format!("{free} is over half of total ({total})"),
            });
        }
        let target = path_param(b, params, "target", true)?;
        if b.meta(&target).is_none() {
            b.mkdir(&target, 0o733)?;
        }
        let prefix = ["sess_", "tmp.", "q", "thumb-"]
            .choose(&mut b.rng(purpose))
            .copied()
            .unwrap_or("f");
        let inodes = b.runtime.disk_inodes.map_or(total, |n| n.min(total));
        b.runtime.disk_inodes = Some(inodes);
        // A first file copies the directory and its parents up into the writable layer (they
        // take inodes too) before the count. `true >` rather than `: >`: a failed redirection
        // of a special builtin would end the shell. The loop stops at the first ENOSPC, should
        // anything else take inodes; its stderr is redirected once (per file, opening
        // /dev/null would cost more than the file).
        let shell = format!(
            "cd {d} && true > .{prefix}0 && rm -f .{prefix}0 && \
             n=$(( $(stat -f -c %d /) - {free} )) && i=0 && \
             {{ while [ $i -lt $n ]; do true > {prefix}$i || break; i=$((i+1)); done; }} 2>/dev/null",
            d = sh_quote(&target),
        );
        b.on_start(INODE_EXHAUSTION.name, shell);
        Ok(format!(
            "writable layer limited to {inodes} inodes; empty files {target}/{prefix}N leave {free} free"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// permission-flip
// ---------------------------------------------------------------------------------------------

pub struct PermissionFlip;

static PERMISSION_FLIP: Info = Info {
    name: "permission-flip",
    family: Family::Filesystem,
    summary: "a file or directory has the wrong mode (a binary loses its exec bits, a key \
              becomes world-readable, a directory untraversable for services)",
    mechanism: "the path (its symlinks followed) is copied into the instance layer with the new \
                mode; root inside keeps CAP_DAC_OVERRIDE, so read/write bits stop other users \
                and exec bits stop everyone",
    params: &[
        ParamSpec {
            name: "path",
            kind: Kind::Str,
            default: "/usr/bin/gzip",
            realistic: "a tool, a script, a service's config or data directory",
            help: "absolute path in the instance",
        },
        ParamSpec {
            name: "mode",
            kind: Kind::Str,
            default: "644",
            realistic: "644 for a binary, 600 or 000 for shared files, 777 for secrets",
            help: "new mode, octal (e.g. 640)",
        },
    ],
};

impl Perturbation for PermissionFlip {
    fn info(&self) -> &'static Info {
        &PERMISSION_FLIP
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let raw = params.str("mode");
        let mode = u32::from_str_radix(raw, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| PerturbError::BadParam {
                param: "mode".into(),
                reason: format!("`{raw}` is not an octal mode (0-7777)"),
            })?;
        let given = params.str("path");
        let path = path_param(b, params, "path", true)?;
        let old = b
            .meta(&path)
            .ok_or_else(|| PerturbError::NotApplicable(format!("`{given}` does not exist")))?;
        b.chmod(&path, mode)?;
        let via = if path == given {
            String::new()
        } else {
            format!(" (via {given})")
        };
        Ok(format!("mode of {path}{via}: {:o} -> {mode:o}", old.mode))
    }
}

// ---------------------------------------------------------------------------------------------
// missing-file
// ---------------------------------------------------------------------------------------------

pub struct MissingFile;

static MISSING_FILE: Info = Info {
    name: "missing-file",
    family: Family::Filesystem,
    summary: "a file (or directory) that something needs is gone",
    mechanism: "an overlay whiteout in the instance layer hides the path (a directory with \
                everything under it)",
    params: &[ParamSpec {
        name: "path",
        kind: Kind::Str,
        default: "/etc/nsswitch.conf",
        realistic: "a config file, a certificate bundle, a data file of the task",
        help: "absolute path in the instance",
    }],
};

impl Perturbation for MissingFile {
    fn info(&self) -> &'static Info {
        &MISSING_FILE
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let path = path_param(b, params, "path", false)?;
        let m = b.meta(&path).ok_or_else(|| {
            PerturbError::NotApplicable(format!("`{}` does not exist", params.str("path")))
        })?;
        b.remove(&path)?;
        let what = if m.is_dir {
            "directory"
        } else if m.is_symlink {
            "symbolic link"
        } else {
            "file"
        };
        Ok(format!("removed {what} {path}"))
    }
}

// ---------------------------------------------------------------------------------------------
// corrupted-config
// ---------------------------------------------------------------------------------------------

pub struct CorruptedConfig;

static CORRUPTED_CONFIG: Info = Info {
    name: "corrupted-config",
    family: Family::Filesystem,
    summary: "a configuration file is damaged: cut short, garbled, with conflicting duplicate \
              keys or broken syntax",
    mechanism: "the file is rewritten in the instance layer (same owner and mode): truncate \
                keeps the first 1-fraction of its bytes (mid-line); garble overwrites a span of \
                random bytes in that fraction of its non-empty lines; duplicate-key repeats that \
                fraction of its `key = value` lines further down with a different value; \
                bad-syntax breaks that fraction of its lines (separator dropped, unclosed quote \
                or section, stray brace). Lines are chosen by the seed",
    params: &[
        ParamSpec {
            name: "path",
            kind: Kind::Str,
            default: "/etc/login.defs",
            realistic: "the service's config file (ini, key=value, yaml, json)",
            help: "absolute path of a regular file",
        },
        ParamSpec {
            name: "how",
            kind: Kind::Choice(&["truncate", "garble", "duplicate-key", "bad-syntax"]),
            default: "truncate",
            realistic: "truncate (full disk, interrupted write), garble (bad sector, \
                        wrong encoding), duplicate-key / bad-syntax (a careless edit)",
            help: "kind of damage",
        },
        ParamSpec {
            name: "fraction",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.3",
            realistic: "0.05-0.5 (at least one line or byte is always damaged)",
            help: "share of the bytes (truncate) or lines damaged",
        },
    ],
};

/// A `key = value` style line: (indent + key, separator, value). Comments and sections are not.
fn split_key_line(line: &str) -> Option<(&str, &str, &str)> {
    let t = line.trim_start();
    if t.is_empty() || t.starts_with(['#', ';', '[', '{', '}', '/']) {
        return None;
    }
    for sep in ["=", ":"] {
        if let Some(i) = line.find(sep) {
            let (k, rest) = line.split_at(i);
            if !k.trim().is_empty() && !k.trim().contains(' ') {
                return Some((k, sep, &rest[1..]));
            }
        }
    }
    // `KEY   value` (login.defs, sshd_config).
    let i = line.find([' ', '\t'])?;
    let (k, rest) = line.split_at(i);
    (!k.trim().is_empty() && !rest.trim().is_empty()).then_some((k, "", rest))
}

/// A different but plausible value.
fn other_value(v: &str, rng: &mut impl Rng) -> String {
    let t = v.trim();
    let lead = &v[..v.len() - v.trim_start().len()];
    let new = if let Ok(n) = t.parse::<i64>() {
        let m = match rng.gen_range(0..3) {
            0 => n.saturating_mul(10),
            1 => n / 2,
            _ => n.saturating_add(rng.gen_range(1..100)),
        };
        (if m == n { n + 1 } else { m }).to_string()
    } else {
        match t.to_ascii_lowercase().as_str() {
            "yes" => "no".into(),
            "no" => "yes".into(),
            "true" => "false".into(),
            "false" => "true".into(),
            "on" => "off".into(),
            "off" => "on".into(),
            _ => {
                let alts = ["/tmp/old", "disabled", "localhost", "0", "changeme"];
                let a = alts.choose(rng).copied().unwrap_or("0");
                if a == t {
                    format!("{a}-old")
                } else {
                    a.to_string()
                }
            }
        }
    };
    format!("{lead}{new}")
}

/// How many of `n` items a fraction damages (at least one when there is any).
fn share(n: usize, fraction: f64) -> usize {
    ((n as f64 * fraction).round() as usize).clamp(n.min(1), n)
}

fn pick(n: usize, k: usize, rng: &mut impl Rng) -> Vec<usize> {
    let mut v = rand::seq::index::sample(rng, n, k).into_vec();
    v.sort_unstable();
    v
}

impl Perturbation for CorruptedConfig {
    fn info(&self) -> &'static Info {
        &CORRUPTED_CONFIG
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let given = params.str("path");
        let path = path_param(b, params, "path", true)?;
        let meta = b
            .meta(&path)
            .filter(|m| !m.is_dir && !m.is_symlink)
            .ok_or_else(|| {
                PerturbError::NotApplicable(format!("`{given}` is not a regular file here"))
            })?;
        let data = b
            .read(&path)
            .ok_or_else(|| PerturbError::NotApplicable(format!("`{given}` cannot be read")))?;
        if data.is_empty() {
            return Err(PerturbError::NotApplicable(format!("`{given}` is empty")));
        }
        let fraction = params.float("fraction");
        let mut rng = b.rng(purpose);
        let how = params.str("how").to_string();
        let text = String::from_utf8_lossy(&data).into_owned();
        let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
        let (out, what): (Vec<u8>, String) = match how.as_str() {
            "truncate" => {
                let cut = share(data.len(), fraction);
                let keep = data.len() - cut;
                (
                    data[..keep].to_vec(),
                    format!("truncated to {keep} of {} bytes", data.len()),
                )
            }
            "garble" => {
                let raw: Vec<&[u8]> = data.split_inclusive(|c| *c == b'\n').collect();
                let cands: Vec<usize> = (0..raw.len())
                    .filter(|i| raw[*i].iter().any(|c| !c.is_ascii_whitespace()))
                    .collect();
                let chosen: Vec<usize> = pick(cands.len(), share(cands.len(), fraction), &mut rng)
                    .into_iter()
                    .map(|c| cands[c])
                    .collect();
                let mut out = Vec::with_capacity(data.len());
                for (i, l) in raw.iter().enumerate() {
                    let mut bytes = l.to_vec();
                    let body = bytes.len() - usize::from(bytes.ends_with(b"\n"));
                    if chosen.contains(&i) && body > 0 {
                        let start = rng.gen_range(0..body);
                        let len = rng.gen_range(1..=(body - start).min(8));
                        for byte in &mut bytes[start..start + len] {
                            // Any byte but a newline: the line count stays.
                            *byte = loop {
                                let x: u8 = rng.gen();
                                if x != b'\n' && x != *byte {
                                    break x;
                                }
                            };
                        }
                    }
                    out.extend_from_slice(&bytes);
                }
                (
                    out,
                    format!("garbled {} of {} lines", chosen.len(), cands.len()),
                )
            }
            "duplicate-key" => {
                let keyed: Vec<usize> = (0..lines.len())
                    .filter(|i| split_key_line(lines[*i].trim_end_matches('\n')).is_some())
                    .collect();
                if keyed.is_empty() {
                    return Err(PerturbError::NotApplicable(format!(
                        "`{given}` has no `key = value` lines"
                    )));
                }
                let chosen = pick(keyed.len(), share(keyed.len(), fraction), &mut rng);
                let mut keys = Vec::new();
                // Insert from the bottom so earlier indices stay valid; each duplicate goes
                // somewhere after its original.
                for c in chosen.iter().rev() {
                    let i = keyed[*c];
                    let l = lines[i].trim_end_matches('\n').to_string();
                    let Some((k, sep, v)) = split_key_line(&l) else {
                        continue;
                    };
                    let dup = format!("{k}{sep}{}\n", other_value(v, &mut rng));
                    keys.push(k.trim().to_string());
                    let at = rng.gen_range(i + 1..=lines.len());
                    if at == lines.len() && !lines[at - 1].ends_with('\n') {
                        lines[at - 1].push('\n');
                    }
                    lines.insert(at, dup);
                }
                keys.reverse();
                (
                    lines.concat().into_bytes(),
                    format!("duplicated keys with other values: {}", keys.join(", ")),
                )
            }
            _ => {
                let cands: Vec<usize> = (0..lines.len())
                    .filter(|i| {
                        let t = lines[*i].trim();
                        !t.is_empty() && !t.starts_with('#')
                    })
                    .collect();
                if cands.is_empty() {
                    return Err(PerturbError::NotApplicable(format!(
                        "`{given}` has only comments"
                    )));
                }
                let chosen = pick(cands.len(), share(cands.len(), fraction), &mut rng);
                for c in &chosen {
                    let i = cands[*c];
                    let nl = if lines[i].ends_with('\n') { "\n" } else { "" };
                    let l = lines[i].trim_end_matches('\n').to_string();
                    let broken = match (split_key_line(&l), rng.gen_range(0..4)) {
                        (Some((k, sep, v)), 0) if !sep.is_empty() => {
                            format!("{}{}", k.trim_end(), v.trim_start())
                        }
                        (Some((k, sep, v)), 1) => format!("{k}{sep}\"{}", v.trim_start()),
                        (_, 2) => format!("[{}", l.trim()),
                        _ => format!("{l} }}"),
                    };
                    lines[i] = format!("{broken}{nl}");
                }
                (
                    lines.concat().into_bytes(),
                    format!(
                        "broke the syntax of {} of {} lines",
                        chosen.len(),
                        cands.len()
                    ),
                )
            }
        };
        b.write_owned(&path, out, meta.mode, meta.uid, meta.gid)?;
        Ok(format!("{path}: {what}"))
    }
}

// ---------------------------------------------------------------------------------------------
// read-only-dir
// ---------------------------------------------------------------------------------------------

pub struct ReadOnlyDir;

static READ_ONLY_DIR: Info = Info {
    name: "read-only-dir",
    family: Family::Filesystem,
    summary: "a directory is on a read-only mount: every write under it fails with EROFS, \
              for root too",
    mechanism: "the sandbox's init binds the path read-only over itself after every root mount \
                (creation, reset, rollback: RuntimeSettings.readonly -> \
                SandboxConfig.readonly_paths); chmod could not do it, root inside keeps \
                CAP_DAC_OVERRIDE. A missing directory is created first",
    params: &[ParamSpec {
        name: "path",
        kind: Kind::Str,
        default: "/var/log",
        realistic: "/var/log, /tmp, /etc, the application's data or output directory",
        help: "absolute path of a directory (a file works too)",
    }],
};

/// Mark a path read-only in the sandbox (deduplicated).
pub(crate) fn make_readonly(b: &mut Builder, path: &str) {
    if !b.runtime.readonly.iter().any(|p| p == path) {
        b.runtime.readonly.push(path.to_string());
    }
}

impl Perturbation for ReadOnlyDir {
    fn info(&self) -> &'static Info {
        &READ_ONLY_DIR
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let path = path_param(b, params, "path", true)?;
        let created = if b.meta(&path).is_none() {
            b.mkdir(&path, 0o755)?;
            " (created)"
        } else {
            ""
        };
        make_readonly(b, &path);
        Ok(format!("{path}{created} is mounted read-only"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::instance::Value;
    use crate::instance::{BaseView, Resources};

    /// A small merged-usr root: /bin -> usr/bin, /lib -> /usr/lib (absolute), a loop.
    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("usr/bin")).unwrap();
        std::fs::create_dir_all(p.join("usr/lib")).unwrap();
        std::fs::create_dir_all(p.join("etc")).unwrap();
        std::fs::write(p.join("usr/bin/tool"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink("usr/bin", p.join("bin")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", p.join("lib")).unwrap();
        std::os::unix::fs::symlink("b", p.join("etc/a")).unwrap();
        std::os::unix::fs::symlink("a", p.join("etc/b")).unwrap();
        std::os::unix::fs::symlink("../usr/bin/tool", p.join("etc/t")).unwrap();
        std::fs::write(
            p.join("etc/app.ini"),
            "# app\n[main]\nport = 8080\nname = web\nworkers = 4\ndebug = no\n\n[db]\nhost = localhost\n",
        )
        .unwrap();
        d
    }

    #[test]
    fn canonical_resolves_symlinks_inside_the_root_and_stops_on_loops() {
        let d = root();
        let base = BaseView::from_dirs(vec![d.path().to_path_buf()]);
        let b = Builder::new(&base, 1, Resources::default());
        assert_eq!(canonical(&b, "/bin/tool", true).unwrap(), "/usr/bin/tool");
        assert_eq!(canonical(&b, "/bin", false).unwrap(), "/bin");
        assert_eq!(canonical(&b, "/bin", true).unwrap(), "/usr/bin");
        // An absolute target is resolved in the root, not on the host.
        assert_eq!(canonical(&b, "/lib/x.so", true).unwrap(), "/usr/lib/x.so");
        assert_eq!(canonical(&b, "/etc/t", true).unwrap(), "/usr/bin/tool");
        assert_eq!(canonical(&b, "/etc/t", false).unwrap(), "/etc/t");
        assert_eq!(
            canonical(&b, "/bin/missing/x", true).unwrap(),
            "/usr/bin/missing/x"
        );
        assert!(canonical(&b, "/etc/a", true).is_none());
        assert!(canonical(&b, "relative", true).is_none());
    }

    fn corrupt(how: &str, fraction: f64, seed: u64) -> (String, String) {
        let d = root();
        let base = BaseView::from_dirs(vec![d.path().to_path_buf()]);
        let mut b = Builder::new(&base, seed, Resources::default());
        let params: Params = [
            ("path".to_string(), Value::Str("/etc/app.ini".into())),
            ("how".to_string(), Value::Str(how.into())),
            ("fraction".to_string(), Value::Float(fraction)),
        ]
        .into();
        let params = CORRUPTED_CONFIG.check(&params).unwrap();
        let what = CorruptedConfig.apply(&params, "c#0", &mut b).unwrap();
        let out = String::from_utf8_lossy(&b.read("/etc/app.ini").unwrap()).into_owned();
        (out, what)
    }

    const ORIG: &str =
        "# app\n[main]\nport = 8080\nname = web\nworkers = 4\ndebug = no\n\n[db]\nhost = localhost\n";

    #[test]
    fn corrupted_config_damage_is_of_the_asked_kind_and_deterministic() {
        let (t, what) = corrupt("truncate", 0.25, 1);
        assert_eq!(
            t.len(),
            ORIG.len() - (ORIG.len() as f64 * 0.25).round() as usize
        );
        assert!(ORIG.starts_with(&t), "{what}");

        let (g, what) = corrupt("garble", 0.5, 1);
        assert_eq!(g.lines().count(), ORIG.lines().count(), "{what}");
        assert_ne!(g, ORIG);
        assert_eq!(corrupt("garble", 0.5, 1).0, g, "same seed, same damage");
        assert_ne!(corrupt("garble", 0.5, 2).0, g, "another seed, other damage");

        let (dk, what) = corrupt("duplicate-key", 0.4, 3);
        // 5 key lines, 40%: 2 duplicates, each after its original, with another value.
        assert_eq!(dk.lines().count(), ORIG.lines().count() + 2, "{what}");
        for key in what.rsplit(": ").next().unwrap().split(", ") {
            let vals: Vec<&str> = dk
                .lines()
                .filter(|l| l.split('=').next().unwrap().trim() == key)
                .collect();
            assert_eq!(vals.len(), 2, "{key}: {dk}");
            assert_ne!(vals[0], vals[1], "{key}: {dk}");
        }

        let (bs, what) = corrupt("bad-syntax", 0.01, 4);
        assert_eq!(bs.lines().count(), ORIG.lines().count(), "{what}");
        let changed = bs.lines().zip(ORIG.lines()).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 1, "at least one line, and only that one: {bs}");
    }

    #[test]
    fn key_lines_are_recognised_in_the_usual_shapes() {
        assert_eq!(split_key_line("port = 80"), Some(("port ", "=", " 80")));
        assert_eq!(split_key_line("host: db"), Some(("host", ":", " db")));
        assert_eq!(
            split_key_line("PASS_MAX_DAYS\t99999"),
            Some(("PASS_MAX_DAYS", "", "\t99999"))
        );
        assert_eq!(split_key_line("# port = 80"), None);
        assert_eq!(split_key_line("[section]"), None);
        assert_eq!(split_key_line("   "), None);
    }
}
