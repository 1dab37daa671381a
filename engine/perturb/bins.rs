//! Binaries and packages: a shuffled or trimmed `PATH`, a missing tool, a tool shadowed by a
//! wrong one earlier in `PATH`, a tool replaced by a failing one, a dpkg package with files
//! removed, a missing shared library.

use super::fs::canonical;
use super::{Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::sh_quote;
use crate::instance::{Builder, DEFAULT_PATH};
use rand::seq::SliceRandom;
use rand::Rng;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![
        &PathShuffle,
        &PathTrim,
        &ToolMissing,
        &ToolShadowed,
        &ToolFailing,
        &PackageCorrupted,
        &LibraryMissing,
    ]
}

/// A tool name: one path component.
fn tool_param(params: &Params) -> Result<String, PerturbError> {
    let t = params.str("tool");
    if t.is_empty() || t.contains('/') || t == "." || t == ".." || t.contains('\0') {
        return Err(PerturbError::BadParam {
            param: "tool".into(),
            reason: format!("`{t}` is not a command name"),
        });
    }
    Ok(t.to_string())
}

/// The directories of a `PATH`, without empties and duplicates, in order.
fn path_dirs(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in path.split(':').filter(|d| !d.is_empty()) {
        let d = d.trim_end_matches('/');
        let d = if d.is_empty() { "/" } else { d };
        if !out.iter().any(|x| x == d) {
            out.push(d.to_string());
        }
    }
    out
}

/// A plausible message of a broken tool, chosen by the seed.
fn broken_message(tool: &str, rng: &mut impl Rng) -> String {
    let msgs = [
        format!("{tool}: error while loading shared libraries: libssl.so.1.1: cannot open shared object file: No such file or directory"),
        format!("{tool}: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.39' not found (required by {tool})"),
        format!("{tool}: internal error: unsupported operation in this build"),
        format!("{tool}: cannot execute binary file: Exec format error"),
        "Segmentation fault (core dumped)".to_string(),
        format!("{tool}: license check failed: contact your administrator"),
    ];
    msgs.choose(rng).cloned().unwrap_or_default()
}

/// A script that prints `message` (to stderr unless `exit_code` is 0) and exits.
fn failing_script(by: &str, message: &str, exit_code: i64) -> String {
    let redirect = if exit_code == 0 { "" } else { " >&2" };
    format!(
        "#!/bin/sh\n# {by}\nprintf '%s\\n' {}{redirect}\nexit {exit_code}\n",
        sh_quote(message)
    )
}

// ---------------------------------------------------------------------------------------------
// path-shuffle
// ---------------------------------------------------------------------------------------------

pub struct PathShuffle;

static PATH_SHUFFLE: Info = Info {
    name: "path-shuffle",
    family: Family::Binaries,
    summary: "PATH is in a different order (local overrides no longer win, sbin before bin), \
              with a decoy directory first",
    mechanism: "the command environment's PATH becomes a seed-driven permutation of its \
                directories (never the original order when there are two or more), preceded by \
                a decoy directory that the layer creates (e.g. /opt/legacy/bin)",
    params: &[ParamSpec {
        name: "decoy",
        kind: Kind::Bool,
        default: "true",
        realistic: "true (a leftover vendor or toolchain directory)",
        help: "put an extra, existing directory first",
    }],
};

impl Perturbation for PathShuffle {
    fn info(&self) -> &'static Info {
        &PATH_SHUFFLE
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        let orig = path_dirs(&b.path_var());
        let mut dirs = orig.clone();
        if dirs.len() >= 2 {
            while dirs == orig {
                dirs.shuffle(&mut rng);
            }
        }
        if params.flag("decoy") {
            let vendor = ["legacy", "vendor", "toolchain", "sdk", "conda"]
                .choose(&mut rng)
                .copied()
                .unwrap_or("legacy");
            let decoy = format!("/opt/{vendor}/bin");
            if !b.exists(&decoy) {
                b.mkdir(&decoy, 0o755)?;
            }
            dirs.retain(|d| *d != decoy);
            dirs.insert(0, decoy);
        }
        let path = dirs.join(":");
        b.runtime.env.insert("PATH".into(), Some(path.clone()));
        Ok(format!("PATH={path}"))
    }
}

// ---------------------------------------------------------------------------------------------
// path-trim
// ---------------------------------------------------------------------------------------------

pub struct PathTrim;

static PATH_TRIM: Info = Info {
    name: "path-trim",
    family: Family::Binaries,
    summary: "PATH lacks standard directories: tools there are 'not found' by name",
    mechanism: "the listed directories are removed from the command environment's PATH (the \
                files stay: absolute paths still work)",
    params: &[ParamSpec {
        name: "drop",
        kind: Kind::Str,
        default: "/usr/sbin:/sbin",
        realistic: "/usr/sbin:/sbin (a non-login shell), /usr/local/bin, /usr/bin:/bin (broken)",
        help: "colon-separated directories to remove",
    }],
};

impl Perturbation for PathTrim {
    fn info(&self) -> &'static Info {
        &PATH_TRIM
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let drop = path_dirs(params.str("drop"));
        if drop.is_empty() {
            return Err(PerturbError::BadParam {
                param: "drop".into(),
                reason: "names no directory".into(),
            });
        }
        let path = b.path_var();
        let before = path_dirs(&path);
        let kept: Vec<String> = before
            .iter()
            .filter(|d| !drop.contains(d))
            .cloned()
            .collect();
        if kept.len() == before.len() {
            return Err(PerturbError::NotApplicable(format!(
                "PATH `{path}` has none of {}",
                drop.join(":")
            )));
        }
        let new = kept.join(":");
        b.runtime.env.insert("PATH".into(), Some(new.clone()));
        Ok(format!("PATH={new}"))
    }
}

// ---------------------------------------------------------------------------------------------
// tool-missing
// ---------------------------------------------------------------------------------------------

pub struct ToolMissing;

static TOOL_MISSING: Info = Info {
    name: "tool-missing",
    family: Family::Binaries,
    summary: "a tool is not installed: 'command not found'",
    mechanism: "a whiteout for every copy reachable on the default and the instance's PATH, \
                written at the directory's canonical path (on merged-usr, /bin/tar is \
                /usr/bin/tar: /bin stays a symlink)",
    params: &[ParamSpec {
        name: "tool",
        kind: Kind::Str,
        default: "tar",
        realistic: "tar, gzip, curl, ps, rsync, make, git (whatever the task needs)",
        help: "command name",
    }],
};

impl Perturbation for ToolMissing {
    fn info(&self) -> &'static Info {
        &TOOL_MISSING
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let tool = tool_param(params)?;
        let mut dirs = path_dirs(DEFAULT_PATH);
        for d in path_dirs(&b.path_var()) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        let mut removed: Vec<String> = Vec::new();
        for d in dirs {
            let Some(dir) = canonical(b, &d, true) else {
                continue;
            };
            let p = format!("{}/{tool}", dir.trim_end_matches('/'));
            if removed.contains(&p) || b.meta(&p).is_none_or(|m| m.is_dir) {
                continue;
            }
            b.remove(&p)?;
            removed.push(p);
        }
        if removed.is_empty() {
            return Err(PerturbError::NotApplicable(format!(
                "no `{tool}` on PATH in this base"
            )));
        }
        Ok(format!("removed {}", removed.join(", ")))
    }
}

// ---------------------------------------------------------------------------------------------
// tool-shadowed
// ---------------------------------------------------------------------------------------------

pub struct ToolShadowed;

static TOOL_SHADOWED: Info = Info {
    name: "tool-shadowed",
    family: Family::Binaries,
    summary: "a wrong program of the same name comes earlier in PATH and prints a plausible \
              error (or a wrong result)",
    mechanism: "a shell script named like the tool in the first PATH directory that precedes \
                the real one (usually /usr/local/bin); it prints the message (to stderr unless \
                exit_code is 0) and exits; the real tool stays reachable by absolute path",
    params: &[
        ParamSpec {
            name: "tool",
            kind: Kind::Str,
            default: "tar",
            realistic: "tar, python3, curl, git, ls",
            help: "command name",
        },
        ParamSpec {
            name: "message",
            kind: Kind::Str,
            default: "",
            realistic: "a library or version error, 'unsupported option', a stale wrapper's output",
            help: "what the shadow prints (empty: chosen by the seed)",
        },
        ParamSpec {
            name: "exit_code",
            kind: Kind::Int { min: 0, max: 255 },
            default: "2",
            realistic: "1, 2, 126, 127; 0 for a wrong result",
            help: "exit status of the shadow",
        },
    ],
};

impl Perturbation for ToolShadowed {
    fn info(&self) -> &'static Info {
        &TOOL_SHADOWED
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let tool = tool_param(params)?;
        let path = b.path_var();
        let real = b.which(&tool, &path).ok_or_else(|| {
            PerturbError::NotApplicable(format!("no `{tool}` on PATH `{path}` to shadow"))
        })?;
        let real_dir = real.rsplit_once('/').map_or("/", |(d, _)| d).to_string();
        let real_canon = canonical(b, &real_dir, true);
        let mut earlier: Vec<String> = Vec::new();
        for d in path_dirs(&path) {
            if d == real_dir {
                break;
            }
            let c = canonical(b, &d, true);
            if c.is_some() && c != real_canon {
                earlier.push(c.unwrap_or_default());
            }
        }
        let dir = earlier
            .iter()
            .find(|d| *d == "/usr/local/bin")
            .or_else(|| earlier.first())
            .cloned()
            .ok_or_else(|| {
                PerturbError::NotApplicable(format!(
                    "`{real}` is in the first directory of PATH: nothing can come before it"
                ))
            })?;
        let mut rng = b.rng(purpose);
        let message = match (params.str("message"), params.int("exit_code")) {
            // Exit 0: a plausible wrong result rather than an error.
            ("", 0) => ["done", "OK", "0"]
                .choose(&mut rng)
                .copied()
                .unwrap_or("done")
                .to_string(),
            ("", _) => broken_message(&tool, &mut rng),
            (m, _) => m.to_string(),
        };
        let shadow = format!("{dir}/{tool}");
        b.write(
            &shadow,
            failing_script(TOOL_SHADOWED.name, &message, params.int("exit_code")),
            0o755,
        )?;
        Ok(format!(
            "{shadow} shadows {real}: prints `{message}`, exits {}",
            params.int("exit_code")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// tool-failing
// ---------------------------------------------------------------------------------------------

pub struct ToolFailing;

static TOOL_FAILING: Info = Info {
    name: "tool-failing",
    family: Family::Binaries,
    summary: "a tool's binary is replaced in place by one that always fails",
    mechanism: "the file the tool's PATH entry resolves to (symlinks followed) is replaced in \
                the layer by a script that prints the message to stderr and exits with \
                exit_code; every name of it fails, and `dpkg --verify` sees a changed file",
    params: &[
        ParamSpec {
            name: "tool",
            kind: Kind::Str,
            default: "gzip",
            realistic: "gzip, tar, curl, python3, systemctl",
            help: "command name",
        },
        ParamSpec {
            name: "exit_code",
            kind: Kind::Int { min: 1, max: 255 },
            default: "1",
            realistic: "1, 2, 126, 127, 134 (abort), 139 (segfault)",
            help: "exit status",
        },
        ParamSpec {
            name: "message",
            kind: Kind::Str,
            default: "",
            realistic: "a loader, version or crash message",
            help: "printed to stderr (empty: chosen by the seed)",
        },
    ],
};

impl Perturbation for ToolFailing {
    fn info(&self) -> &'static Info {
        &TOOL_FAILING
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let tool = tool_param(params)?;
        let found = b
            .which(&tool, DEFAULT_PATH)
            .or_else(|| b.which(&tool, &b.path_var()))
            .ok_or_else(|| PerturbError::NotApplicable(format!("no `{tool}` on PATH")))?;
        let real = canonical(b, &found, true)
            .filter(|p| b.meta(p).is_some_and(|m| !m.is_dir && !m.is_symlink))
            .ok_or_else(|| {
                PerturbError::NotApplicable(format!("`{found}` does not lead to a file"))
            })?;
        let mut rng = b.rng(purpose);
        let message = match params.str("message") {
            "" => broken_message(&tool, &mut rng),
            m => m.to_string(),
        };
        b.write(
            &real,
            failing_script(TOOL_FAILING.name, &message, params.int("exit_code")),
            0o755,
        )?;
        Ok(format!(
            "{real} replaced: prints `{message}`, exits {}",
            params.int("exit_code")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// package-corrupted
// ---------------------------------------------------------------------------------------------

pub struct PackageCorrupted;

static PACKAGE_CORRUPTED: Info = Info {
    name: "package-corrupted",
    family: Family::Binaries,
    summary: "files of an installed dpkg package are gone, as `dpkg --verify` reports",
    mechanism: "reads /var/lib/dpkg/info/<package>[:arch].list, keeps the regular files, \
                removes that fraction of them (at least one, chosen by the seed) with \
                whiteouts at their canonical paths",
    params: &[
        ParamSpec {
            name: "package",
            kind: Kind::Str,
            default: "gzip",
            realistic: "a package the task's tools come from (gzip, tar, coreutils, curl)",
            help: "dpkg package name",
        },
        ParamSpec {
            name: "fraction",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.2",
            realistic: "0.05-0.5 (a failed upgrade, an over-eager cleanup)",
            help: "share of the package's regular files removed (at least one)",
        },
    ],
};

impl Perturbation for PackageCorrupted {
    fn info(&self) -> &'static Info {
        &PACKAGE_CORRUPTED
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let pkg = params.str("package");
        if pkg.is_empty() || pkg.contains('/') {
            return Err(PerturbError::BadParam {
                param: "package".into(),
                reason: format!("`{pkg}` is not a package name"),
            });
        }
        let info = "/var/lib/dpkg/info";
        let list = b
            .list(info)
            .into_iter()
            .find(|n| {
                n == &format!("{pkg}.list")
                    || (n.starts_with(&format!("{pkg}:")) && n.ends_with(".list"))
            })
            .ok_or_else(|| {
                PerturbError::NotApplicable(format!("package `{pkg}` is not installed here"))
            })?;
        let text = b.read(&format!("{info}/{list}")).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        // (listed name, canonical path) of each regular file.
        let mut files: Vec<(String, String)> = Vec::new();
        for l in text.lines().filter(|l| l.starts_with('/')) {
            let Some(c) = canonical(b, l, false) else {
                continue;
            };
            if b.meta(&c).is_some_and(|m| !m.is_dir && !m.is_symlink)
                && !files.iter().any(|(_, x)| *x == c)
            {
                files.push((l.to_string(), c));
            }
        }
        if files.is_empty() {
            return Err(PerturbError::NotApplicable(format!(
                "package `{pkg}` has no regular files here"
            )));
        }
        let n = files.len();
        let k = ((n as f64 * params.float("fraction")).round() as usize).clamp(1, n);
        let mut rng = b.rng(purpose);
        let mut idx = rand::seq::index::sample(&mut rng, n, k).into_vec();
        idx.sort_unstable();
        let mut names = Vec::new();
        for i in idx {
            let (listed, c) = &files[i];
            b.remove(c)?;
            names.push(listed.clone());
        }
        Ok(format!(
            "removed {k} of {n} files of package {pkg}: {}",
            names.join(", ")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// library-missing
// ---------------------------------------------------------------------------------------------

pub struct LibraryMissing;

static LIBRARY_MISSING: Info = Info {
    name: "library-missing",
    family: Family::Binaries,
    summary: "a shared library is gone: tools linked to it fail with 'error while loading \
              shared libraries'",
    mechanism: "a whiteout for the soname in every library directory (/lib, /usr/lib, \
                /lib64, /usr/lib64, /usr/local/lib and their multiarch subdirectories, at \
                their canonical paths); the loader's cache then points at nothing",
    params: &[ParamSpec {
        name: "library",
        kind: Kind::Str,
        default: "libacl.so.1",
        realistic: "libacl.so.1 (cp, mv), libz.so.1, libssl.so.3, libcurl.so.4, libpcre2-8.so.0",
        help: "soname (file name) of the library",
    }],
};

impl Perturbation for LibraryMissing {
    fn info(&self) -> &'static Info {
        &LIBRARY_MISSING
    }

    fn apply(
        &self,
        params: &Params,
        _purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let lib = params.str("library");
        if lib.is_empty() || lib.contains('/') || !lib.contains(".so") {
            return Err(PerturbError::BadParam {
                param: "library".into(),
                reason: format!("`{lib}` is not a library file name (like libz.so.1)"),
            });
        }
        let mut dirs: Vec<String> = Vec::new();
        for top in ["/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib"] {
            dirs.push(top.to_string());
            // Listed at its canonical path: `/lib` is a symlink on merged-usr systems.
            let Some(top) = canonical(b, top, true) else {
                continue;
            };
            for sub in b.list(&top) {
                if sub.ends_with("-linux-gnu") || sub.ends_with("-linux-gnueabihf") {
                    dirs.push(format!("{top}/{sub}"));
                }
            }
        }
        let mut removed: Vec<String> = Vec::new();
        for d in dirs {
            let Some(dir) = canonical(b, &d, true) else {
                continue;
            };
            let p = format!("{dir}/{lib}");
            if removed.contains(&p) || b.meta(&p).is_none_or(|m| m.is_dir) {
                continue;
            }
            b.remove(&p)?;
            removed.push(p);
        }
        if removed.is_empty() {
            return Err(PerturbError::NotApplicable(format!(
                "no `{lib}` in the library directories of this base"
            )));
        }
        Ok(format!("removed {}", removed.join(", ")))
    }
}
