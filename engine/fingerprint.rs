//! Fingerprints: an environment's feature vector, measured inside a sandbox, for a base root
//! filesystem or for a synthesized instance, so the realism of instances can be compared with
//! real systems (`engine/data/fingerprints/*.json`, measured on systems reachable here).
//!
//! How each feature is measured (see `docs/fingerprints.md` for the list):
//! - files, directories, processes and `/proc/net/tcp{,6}` through the sandbox init's file
//!   requests (no binary of the environment runs, so `PATH` tricks cannot change them);
//! - what needs a system call no file request makes (`statfs`, `ulimit -n`, `locale -a`,
//!   `dpkg --verify`) by commands run with the sandbox's clean default environment and
//!   absolute paths: these measure the filesystem, not the variables;
//! - what depends on the environment variables (`PATH`, locale, `HOME`, `TMPDIR`, the clock
//!   as `date` shows it, e.g. under libfaketime) from the instance's own environment list.
//!
//! A feature the environment does not allow to measure (no `stat`, no `dpkg`) is `null` in
//! `features` and `-1` in the vector, with the reason in `notes`.

use crate::probe::{is_absent, processes_of, read_text, resolve, which, ProbeError};
use crate::running::{RunningError, RunningInstance};
use sandbox::protocol::FileKind;
use sandbox::{ExecRequest, RootfsSpec, Runtime, SandboxConfig, SandboxError, SandboxOps};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Version of the feature set; bump it when a feature is added, removed or measured anew.
pub const SCHEMA: &str = "envfactory-fingerprint/1";

#[derive(Debug, thiserror::Error)]
pub enum FingerprintError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Running(#[from] RunningError),
    #[error("start command `{cmd}` failed: {output}")]
    Start { cmd: String, output: String },
    #[error("shipped fingerprint `{name}`: {reason}")]
    Data { name: String, reason: String },
}

/// The numeric features, in vector order, with what each one is.
pub const FEATURES: &[(&str, &str)] = &[
    ("disk_total_bytes", "size of / (the writable layer), statfs"),
    ("disk_used_bytes", "bytes used on /"),
    ("disk_used_frac", "used / total on /"),
    ("inodes_total", "inodes of /"),
    ("inodes_used", "inodes used on /"),
    ("inodes_used_frac", "used / total inodes on /"),
    ("path_set", "1 when PATH is set"),
    ("path_entries", "entries of PATH"),
    (
        "path_missing_dirs",
        "absolute PATH entries that are not directories",
    ),
    ("path_relative_entries", "empty or relative PATH entries"),
    ("path_duplicates", "PATH entries given more than once"),
    (
        "path_standard_frac",
        "fraction of /usr/local/bin, /usr/bin, /bin, /usr/sbin, /sbin in PATH",
    ),
    ("tools_checked", "tools looked for (the TOOLS list)"),
    ("tools_available", "TOOLS found in PATH as executable files"),
    (
        "tools_nonstandard_location",
        "TOOLS whose first PATH hit is outside /usr/bin, /bin, /usr/sbin, /sbin",
    ),
    (
        "tools_scripts",
        "TOOLS whose first PATH hit is a script (#!)",
    ),
    ("dpkg_packages", "packages installed (dpkg status)"),
    ("dpkg_essential", "installed packages marked Essential"),
    (
        "dpkg_verify_failures",
        "lines of `dpkg --verify` over the Essential packages",
    ),
    ("dpkg_verify_missing", "of which files missing"),
    (
        "listening_tcp",
        "listening TCP sockets (/proc/net/tcp, tcp6)",
    ),
    ("processes", "processes besides the sandbox's init"),
    ("zombies", "zombie processes"),
    (
        "clock_offset_s",
        "`date +%s` in the environment minus the host's clock, seconds",
    ),
    ("lang_set", "1 when LANG or LC_ALL is set"),
    (
        "locale_installed",
        "1 when the effective locale (LC_ALL, LC_CTYPE, LANG, else C) is installed",
    ),
    ("locales_available", "lines of `locale -a`"),
    ("home_set", "1 when HOME is set"),
    ("home_is_dir", "1 when HOME is an existing directory"),
    ("tmpdir_set", "1 when TMPDIR is set"),
    (
        "tmpdir_ok",
        "1 when TMPDIR (or /tmp when unset) is a directory",
    ),
    ("tmp_sticky_world_writable", "1 when /tmp has mode 1777"),
    ("nofile", "open files limit of a command (ulimit -n)"),
    ("resolv_conf_exists", "1 when /etc/resolv.conf is a file"),
    ("resolv_nameservers", "nameserver lines in /etc/resolv.conf"),
    (
        "resolv_bad_lines",
        "lines of /etc/resolv.conf that the resolver would not understand",
    ),
    (
        "resolv_valid",
        "1 when there is a nameserver and no bad line",
    ),
    ("env_vars", "variables in the environment"),
    ("env_nonstandard", "variables outside the usual login set"),
];

/// Tools whose availability is measured (the common tools of a Debian system and of tasks).
pub const TOOLS: &[&str] = &[
    "sh", "bash", "ls", "cat", "cp", "mv", "rm", "mkdir", "chmod", "find", "grep", "sed", "awk",
    "tar", "gzip", "sort", "head", "tail", "wc", "ps", "df", "kill", "date", "env", "perl",
    "python3", "dpkg", "curl",
];

const STANDARD_TOOL_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/sbin"];
const STANDARD_PATH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"];
/// Variables of a usual login environment (others count as `env_nonstandard`).
const STANDARD_VARS: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PWD",
    "OLDPWD", "HOSTNAME", "MAIL", "SHLVL", "EDITOR", "PAGER", "_",
];

/// Non-numeric observations kept with the features.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub os: Option<String>,
    pub path: Option<String>,
    pub lang: Option<String>,
    pub lc_all: Option<String>,
    pub effective_locale: String,
    pub home: Option<String>,
    pub tmpdir: Option<String>,
    pub missing_tools: Vec<String>,
    pub listening_ports: Vec<u16>,
    pub nameservers: Vec<String>,
}

/// A measured fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub schema: String,
    /// Every name of [`FEATURES`]; `None` when it could not be measured.
    pub features: BTreeMap<String, Option<f64>>,
    /// The features in [`FEATURES`] order, `-1` for unmeasured.
    pub vector: Vec<f64>,
    pub observed: Observed,
    /// Why a feature is unmeasured, one line each.
    pub notes: Vec<String>,
}

impl Fingerprint {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.features.get(name).copied().flatten()
    }

    /// Named feature values that differ between two fingerprints: (name, self, other).
    pub fn diff(&self, other: &Fingerprint) -> Vec<(&'static str, Option<f64>, Option<f64>)> {
        FEATURES
            .iter()
            .filter_map(|(n, _)| {
                let (a, b) = (self.get(n), other.get(n));
                (a != b).then_some((*n, a, b))
            })
            .collect()
    }

    /// The human form of `engine fingerprint`.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for (name, what) in FEATURES {
            let v = match self.get(name) {
                Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{}", v as i64),
                Some(v) => format!("{v:.4}"),
                None => "-".into(),
            };
            let _ = writeln!(s, "{name:<28} {v:>14}  {what}");
        }
        let o = &self.observed;
        let _ = writeln!(s, "os                 {}", o.os.as_deref().unwrap_or("-"));
        let _ = writeln!(
            s,
            "PATH               {}",
            o.path.as_deref().unwrap_or("(unset)")
        );
        let _ = writeln!(s, "locale             {}", o.effective_locale);
        let _ = writeln!(s, "missing tools      {}", o.missing_tools.join(" "));
        let _ = writeln!(s, "listening ports    {:?}", o.listening_ports);
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

fn b(x: bool) -> Option<f64> {
    Some(if x { 1.0 } else { 0.0 })
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Run `dpkg --verify` over the Essential packages (most of a measurement's time, about
    /// 0.35 s on the host rootfs); when off, `dpkg_verify_*` are unmeasured.
    pub dpkg_verify: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { dpkg_verify: true }
    }
}

/// Measure the environment of a sandbox: `env` is the environment its commands get (the
/// instance's, for an instance).
pub fn measure(ops: &mut dyn SandboxOps, env: &[String]) -> Result<Fingerprint, FingerprintError> {
    measure_with(ops, env, Options::default())
}

/// [`measure`] with options.
pub fn measure_with(
    ops: &mut dyn SandboxOps,
    env: &[String],
    opts: Options,
) -> Result<Fingerprint, FingerprintError> {
    let mut f: BTreeMap<String, Option<f64>> = BTreeMap::new();
    let mut notes = Vec::new();
    let mut obs = Observed::default();
    let vars: BTreeMap<&str, &str> = env
        .iter()
        .map(|kv| kv.split_once('=').unwrap_or((kv.as_str(), "")))
        .collect();
    let mut put = |k: &str, v: Option<f64>| {
        f.insert(k.to_string(), v);
    };

    // --- Clean-environment measurements (one command) ----------------------------------
    let clean = SandboxConfig::default().env;
    let script = "export LC_ALL=C\n\
        s=$(/usr/bin/stat -f -c '%S %b %f %c %d' / 2>/dev/null) || s=$(stat -f -c '%S %b %f %c %d' / 2>/dev/null)\n\
        echo \"statfs $s\"\n\
        echo \"nofile $(ulimit -n)\"\n\
        if [ -x /usr/bin/locale ]; then /usr/bin/locale -a 2>/dev/null | sed 's/^/locale /'; else echo nolocale; fi\n";
    let r = run(ops, script, &clean, 10_000)?;
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    let mut locales = Vec::new();
    let mut statfs = None;
    let mut nofile = None;
    let mut has_locale = true;
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("statfs ") {
            let n: Vec<f64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if n.len() == 5 {
                statfs = Some(n);
            }
        } else if let Some(rest) = line.strip_prefix("nofile ") {
            nofile = rest.trim().parse::<f64>().ok();
        } else if let Some(rest) = line.strip_prefix("locale ") {
            locales.push(rest.trim().to_string());
        } else if line == "nolocale" {
            has_locale = false;
        }
    }
    match statfs {
        Some(n) => {
            let (bsize, blocks, bfree, files, ffree) = (n[0], n[1], n[2], n[3], n[4]);
            let total = bsize * blocks;
            let used = bsize * (blocks - bfree);
            put("disk_total_bytes", Some(total));
            put("disk_used_bytes", Some(used));
            put(
                "disk_used_frac",
                Some(if total > 0.0 { used / total } else { 0.0 }),
            );
            put("inodes_total", Some(files));
            put("inodes_used", Some(files - ffree));
            put(
                "inodes_used_frac",
                Some(if files > 0.0 {
                    (files - ffree) / files
                } else {
                    0.0
                }),
            );
        }
        None => notes.push("disk and inodes: `stat -f /` did not run (no stat?)".into()),
    }
    put("nofile", nofile);
    if nofile.is_none() {
        notes.push("nofile: `ulimit -n` gave nothing".into());
    }

    // --- Variables of the environment ------------------------------------------------------
    put("env_vars", Some(vars.len() as f64));
    put(
        "env_nonstandard",
        Some(
            vars.keys()
                .filter(|k| !STANDARD_VARS.contains(k) && !k.starts_with("LC_"))
                .count() as f64,
        ),
    );
    let path = vars.get("PATH").map(|s| s.to_string());
    obs.path = path.clone();
    put("path_set", b(path.is_some()));
    let entries: Vec<&str> = path
        .as_deref()
        .map_or(Vec::new(), |p| p.split(':').collect());
    put("path_entries", Some(entries.len() as f64));
    put(
        "path_relative_entries",
        Some(entries.iter().filter(|e| !e.starts_with('/')).count() as f64),
    );
    let distinct: BTreeSet<&str> = entries.iter().copied().collect();
    put(
        "path_duplicates",
        Some((entries.len() - distinct.len()) as f64),
    );
    put(
        "path_standard_frac",
        Some(
            STANDARD_PATH
                .iter()
                .filter(|d| distinct.contains(*d))
                .count() as f64
                / STANDARD_PATH.len() as f64,
        ),
    );
    let mut missing_dirs = 0;
    for e in distinct.iter().filter(|e| e.starts_with('/')) {
        if resolve(ops, e)?.is_none_or(|(_, k)| k != FileKind::Dir) {
            missing_dirs += 1;
        }
    }
    put("path_missing_dirs", Some(missing_dirs as f64));
    let (mut avail, mut nonstd, mut scripts) = (0, 0, 0);
    for tool in TOOLS {
        match which(ops, tool, &entries)? {
            Some((dir, file)) => {
                avail += 1;
                if !STANDARD_TOOL_DIRS.contains(&dir.as_str()) {
                    nonstd += 1;
                }
                if let Ok((head, _)) = ops.read_file(&file, 2) {
                    if head == b"#!" {
                        scripts += 1;
                    }
                }
            }
            None => obs.missing_tools.push(tool.to_string()),
        }
    }
    put("tools_checked", Some(TOOLS.len() as f64));
    put("tools_available", Some(avail as f64));
    put("tools_nonstandard_location", Some(nonstd as f64));
    put("tools_scripts", Some(scripts as f64));

    let lang = vars.get("LANG").map(|s| s.to_string());
    let lc_all = vars.get("LC_ALL").map(|s| s.to_string());
    put("lang_set", b(lang.is_some() || lc_all.is_some()));
    let effective = [
        lc_all.as_deref(),
        vars.get("LC_CTYPE").copied(),
        lang.as_deref(),
    ]
    .into_iter()
    .flatten()
    .find(|s| !s.is_empty())
    .unwrap_or("C")
    .to_string();
    obs.lang = lang;
    obs.lc_all = lc_all;
    if has_locale {
        let installed: BTreeSet<String> = locales.iter().map(|l| norm_locale(l)).collect();
        let e = norm_locale(&effective);
        put(
            "locale_installed",
            b(e == "c" || e == "posix" || installed.contains(&e)),
        );
        put("locales_available", Some(locales.len() as f64));
    } else {
        notes.push("locales: no /usr/bin/locale".into());
        put("locale_installed", None);
        put("locales_available", None);
    }
    obs.effective_locale = effective;

    let home = vars.get("HOME").map(|s| s.to_string());
    put("home_set", b(home.is_some()));
    let home_dir = match &home {
        Some(h) if h.starts_with('/') => resolve(ops, h)?.is_some_and(|(_, k)| k == FileKind::Dir),
        _ => false,
    };
    put("home_is_dir", b(home_dir));
    obs.home = home;
    let tmpdir = vars.get("TMPDIR").map(|s| s.to_string());
    put("tmpdir_set", b(tmpdir.is_some()));
    let t = tmpdir.as_deref().unwrap_or("/tmp");
    let tmp_ok = t.starts_with('/') && resolve(ops, t)?.is_some_and(|(_, k)| k == FileKind::Dir);
    put("tmpdir_ok", b(tmp_ok));
    obs.tmpdir = tmpdir;
    let tmp_mode = match ops.stat("/tmp") {
        Ok(st) => st.kind == FileKind::Dir && st.mode & 0o1777 == 0o1777,
        Err(e) if is_absent(&e) => false,
        Err(e) => return Err(e.into()),
    };
    put("tmp_sticky_world_writable", b(tmp_mode));

    // The clock as the environment's commands see it.
    let host_secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    };
    let before = host_secs();
    let r = run(ops, "date +%s", env, 10_000)?;
    let after = host_secs();
    match String::from_utf8_lossy(&r.stdout).trim().parse::<i64>() {
        // Zero when the inside second lies within the host's seconds around the command.
        Ok(inside) if r.success() => put(
            "clock_offset_s",
            Some((inside - inside.clamp(before, after)) as f64),
        ),
        _ => {
            notes.push("clock: `date +%s` failed in the environment".into());
            put("clock_offset_s", None);
        }
    }

    // --- Trusted reads ---------------------------------------------------------------------
    obs.os = read_text(ops, "/etc/os-release")?.and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
    });
    match read_text(ops, "/etc/resolv.conf")? {
        Some(t) => {
            let (ns, bad) = resolv_conf(&t);
            put("resolv_conf_exists", b(true));
            put("resolv_nameservers", Some(ns.len() as f64));
            put("resolv_bad_lines", Some(bad as f64));
            put("resolv_valid", b(!ns.is_empty() && bad == 0));
            obs.nameservers = ns;
        }
        None => {
            put("resolv_conf_exists", b(false));
            put("resolv_nameservers", Some(0.0));
            put("resolv_bad_lines", Some(0.0));
            put("resolv_valid", b(false));
        }
    }
    let mut ports = BTreeSet::new();
    let mut listening = 0;
    for p in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Some(t) = read_text(ops, p)? {
            for port in listening_ports(&t) {
                listening += 1;
                ports.insert(port);
            }
        }
    }
    put("listening_tcp", Some(listening as f64));
    obs.listening_ports = ports.into_iter().collect();
    let procs = processes_of(ops)?;
    put("processes", Some(procs.len() as f64));
    put(
        "zombies",
        Some(procs.iter().filter(|p| p.state == 'Z').count() as f64),
    );

    // --- Packages ----------------------------------------------------------------------------
    match read_text(ops, "/var/lib/dpkg/status")? {
        Some(status) => {
            let (installed, essential) = dpkg_status(&status);
            put("dpkg_packages", Some(installed as f64));
            put("dpkg_essential", Some(essential.len() as f64));
            let verified = if opts.dpkg_verify {
                let cmd = format!(
                    "if [ -x /usr/bin/dpkg ]; then /usr/bin/dpkg --verify {}; echo \"dpkg-exit $?\"; fi",
                    essential.join(" ")
                );
                let r = run(ops, &cmd, &clean, 60_000)?;
                let out = String::from_utf8_lossy(&r.stdout).into_owned();
                if out.lines().any(|l| l.starts_with("dpkg-exit ")) {
                    let lines: Vec<&str> = out
                        .lines()
                        .filter(|l| !l.starts_with("dpkg-exit ") && !l.trim().is_empty())
                        .collect();
                    let missing = lines.iter().filter(|l| l.starts_with("missing")).count();
                    Some((lines.len() as f64, missing as f64))
                } else {
                    notes.push("dpkg --verify: no /usr/bin/dpkg".into());
                    None
                }
            } else {
                notes.push("dpkg --verify: skipped".into());
                None
            };
            put("dpkg_verify_failures", verified.map(|v| v.0));
            put("dpkg_verify_missing", verified.map(|v| v.1));
        }
        None => {
            notes.push("dpkg: no /var/lib/dpkg/status".into());
            for k in [
                "dpkg_packages",
                "dpkg_essential",
                "dpkg_verify_failures",
                "dpkg_verify_missing",
            ] {
                put(k, None);
            }
        }
    }

    let vector = FEATURES
        .iter()
        .map(|(n, _)| f.get(*n).copied().flatten().unwrap_or(-1.0))
        .collect();
    Ok(Fingerprint {
        schema: SCHEMA.into(),
        features: f,
        vector,
        observed: obs,
        notes,
    })
}

/// Fingerprint of a base root filesystem: a fresh sandbox with the default configuration and
/// environment.
pub fn fingerprint_rootfs(
    rt: &Runtime,
    spec: &RootfsSpec,
) -> Result<Fingerprint, FingerprintError> {
    let cfg = SandboxConfig {
        rootfs: spec.clone(),
        ..SandboxConfig::default()
    };
    let mut sb = rt.create(&cfg)?;
    measure(&mut sb, &cfg.env)
}

/// Fingerprint of a base root filesystem with services running: each of `start` runs in the
/// fresh sandbox first (a shell command with the default environment; a daemon it starts
/// must detach, e.g. `setsid nginx`, and the command should wait until it listens), then the
/// sandbox is measured as [`fingerprint_rootfs`] measures it.
pub fn fingerprint_rootfs_started(
    rt: &Runtime,
    spec: &RootfsSpec,
    start: &[String],
) -> Result<Fingerprint, FingerprintError> {
    let cfg = SandboxConfig {
        rootfs: spec.clone(),
        ..SandboxConfig::default()
    };
    let mut sb = rt.create(&cfg)?;
    for cmd in start {
        let r = run(&mut sb, cmd, &cfg.env, 120_000)?;
        tracing::info!(cmd = %cmd, exit = r.exit_code(), "fingerprint start command");
        if !r.success() {
            return Err(FingerprintError::Start {
                cmd: cmd.clone(),
                output: String::from_utf8_lossy(&[r.stdout, r.stderr].concat())
                    .chars()
                    .take(2000)
                    .collect(),
            });
        }
    }
    measure(&mut sb, &cfg.env)
}

/// Fingerprint of a running instance, with the environment its agent's commands get.
pub fn fingerprint_running(running: &mut RunningInstance) -> Result<Fingerprint, FingerprintError> {
    let env = running.env.clone();
    measure(running.sandbox_mut(), &env)
}

/// The fingerprints shipped with the engine (name, the data file's JSON: `provenance` and
/// `fingerprint`), in name order: the real set of `engine/data/fingerprints/` (docs/fingerprints.md).
pub fn shipped() -> Vec<(&'static str, serde_json::Value)> {
    // (name, text) of every data file, listed by `engine/data/fingerprints/build.sh`.
    const DATA: &[(&str, &str)] = include!("data/fingerprints/index.rs");
    DATA.iter()
        .map(|(n, t)| {
            // The files are checked by a test (`shipped_fingerprints_are_current`); a broken
            // one shows as null rather than taking the engine down.
            (
                *n,
                serde_json::from_str(t).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect()
}

/// The fingerprint part of a shipped data file.
pub fn shipped_fingerprint(name: &str) -> Result<Fingerprint, FingerprintError> {
    let bad = |reason: String| FingerprintError::Data {
        name: name.into(),
        reason,
    };
    let (_, v) = shipped()
        .into_iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| bad("no such fingerprint".into()))?;
    serde_json::from_value(v["fingerprint"].clone()).map_err(|e| bad(e.to_string()))
}

/// Where and how a fingerprint was measured, for data files.
pub fn provenance(rootfs: &str, how: &str) -> serde_json::Value {
    let uts = nix::sys::utsname::uname().ok();
    let s = |f: fn(&nix::sys::utsname::UtsName) -> &std::ffi::OsStr| {
        uts.as_ref()
            .map(|u| f(u).to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let host_os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_default();
    serde_json::json!({
        "rootfs": rootfs,
        "where": format!("the EnvFactory build machine ({}, {host_os})", s(|u| u.machine())),
        "when": utc_now(),
        "how": how,
        "kernel": format!("{} {}", s(|u| u.sysname()), s(|u| u.release())),
        "machine": format!("{}, {} cpus, {}", s(|u| u.machine()), std::thread::available_parallelism().map_or(0, |n| n.get()), cpu),
        "schema": SCHEMA,
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` of now.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (proleptic Gregorian), after Howard Hinnant's algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn run(
    ops: &mut dyn SandboxOps,
    cmd: &str,
    env: &[String],
    timeout_ms: u64,
) -> Result<sandbox::ExecResult, FingerprintError> {
    let mut req = ExecRequest::shell(cmd);
    req.cwd = "/".into();
    req.env = Some(env.to_vec());
    req.timeout_ms = timeout_ms;
    req.output_cap = 1 << 20;
    Ok(ops.exec(&req)?)
}

/// Ports of listening sockets in a `/proc/net/tcp{,6}` table (state `0A`).
pub fn listening_ports(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(3) != Some(&"0A") {
                return None;
            }
            let port = f.get(1)?.rsplit_once(':')?.1;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

/// Installed packages and the names of the installed Essential ones, from dpkg's status file.
pub fn dpkg_status(status: &str) -> (usize, Vec<String>) {
    let mut installed = 0;
    let mut essential = Vec::new();
    for para in status.split("\n\n") {
        let mut name = None;
        let (mut ok, mut ess) = (false, false);
        for l in para.lines() {
            if let Some(v) = l.strip_prefix("Package: ") {
                name = Some(v.trim());
            } else if let Some(v) = l.strip_prefix("Status: ") {
                ok = v.trim().ends_with(" installed");
            } else if l.trim() == "Essential: yes" {
                ess = true;
            }
        }
        if let (Some(n), true) = (name, ok) {
            installed += 1;
            if ess {
                essential.push(n.to_string());
            }
        }
    }
    essential.sort();
    (installed, essential)
}

/// The nameservers of a resolv.conf and the count of lines the resolver would not
/// understand (unknown keyword, a nameserver that is not one IP address, a malformed option,
/// control characters).
pub fn resolv_conf(text: &str) -> (Vec<String>, usize) {
    let mut ns = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        let ok = !l.chars().any(|c| c.is_control() && c != '\t')
            && match w[0] {
                "nameserver" => {
                    let ok = w.len() == 2 && w[1].parse::<std::net::IpAddr>().is_ok();
                    if ok {
                        ns.push(w[1].to_string());
                    }
                    ok
                }
                "search" | "domain" | "sortlist" => w.len() >= 2,
                "options" => {
                    w.len() >= 2
                        && w[1..].iter().all(|o| match o.split_once(':') {
                            None => o.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'),
                            Some((k, n)) => {
                                !k.is_empty()
                                    && !n.is_empty()
                                    && n.bytes().all(|c| c.is_ascii_digit())
                            }
                        })
                }
                _ => false,
            };
        if !ok {
            bad += 1;
        }
    }
    (ns, bad)
}

/// `en_US.UTF-8` and `en_US.utf8` are the same locale.
fn norm_locale(l: &str) -> String {
    l.to_ascii_lowercase().replace("utf-8", "utf8")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parsers() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n   1: 0100007F:1F91 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n";
        assert_eq!(listening_ports(tcp), vec![8080]);
        let status = "Package: tar\nStatus: install ok installed\nEssential: yes\n\nPackage: vim\nStatus: deinstall ok config-files\n\nPackage: curl\nStatus: install ok installed\n";
        assert_eq!(dpkg_status(status), (2, vec!["tar".to_string()]));
        assert_eq!(norm_locale("en_US.UTF-8"), "en_us.utf8");
        let ok = "# generated\nnameserver 10.0.0.2\nnameserver ::1\nsearch corp\noptions ndots:2 rotate edns0\n";
        assert_eq!(resolv_conf(ok), (vec!["10.0.0.2".into(), "::1".into()], 0));
        for bad in [
            "nameserver\n",
            "nameserver 256.1.1.1\n",
            "namesever 127.0.0.53\n",
            "nameserver 1.1.1.1 8.8.8.8\n",
            "options ndots:abc\n",
            "<<<<<<< HEAD\n",
            "search\x00corp\n",
            "nameserver: 8.8.8.8\n",
        ] {
            assert_eq!(resolv_conf(bad).1, 1, "{bad:?}");
        }
        assert!(utc_now().ends_with('Z') && utc_now().len() == 20);
    }

    #[test]
    fn feature_names_are_unique() {
        let names: BTreeSet<&str> = FEATURES.iter().map(|f| f.0).collect();
        assert_eq!(names.len(), FEATURES.len());
    }
}
