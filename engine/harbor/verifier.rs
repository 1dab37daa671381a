//! What stands between the agent and the verdict once the agent's time is over (docs/harbor.md,
//! "The verifier"): every process the agent left is stopped, the tests run in a fresh sandbox
//! over the image with the agent's changes on top except in the system directories (the
//! image's own `/usr`, `/bin`, `/lib*`, loader and Python configuration under `/etc`), and
//! pytest is confined to `/tests`.

use super::{sbx_err, HarborError, Image, LayerStore, Task};
use crate::instance::BaseView;
use sandbox::{DynBackend, SandboxConfig, SandboxOps};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Top-level entries of the agent's diff dropped before the tests: the image's own system
/// directories come back from its layers, whatever the agent put there (a `python3` or
/// `pytest` replaced, a plugin, a `.pth` or `sitecustomize.py` in site-packages), and the
/// verifier's own folders start empty.
const SYSTEM: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "tests", "proc", "sys", "dev",
];

/// Entries of `/etc` restored the same way: the dynamic loader's preload and paths, Python's
/// `sitecustomize.py` (`python*`), the alternatives' links, and what the tools test scripts
/// run read as configuration that runs commands or redirects them (apt's and dpkg's hooks,
/// the login and interactive shells' start-up files, pip's, git's and npm's configuration);
/// the rest of `/etc` is the agent's work as much as `/app` is (a task may be to configure a
/// service). A task asking the agent to change one of these is judged on the image's.
const SYSTEM_ETC: &[&str] = &[
    "ld.so.preload",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld.so.cache",
    "alternatives",
    "apt",
    "dpkg",
    "profile",
    "profile.d",
    "bash.bashrc",
    "bashrc",
    "environment",
    "pip.conf",
    "xdg",
    "gitconfig",
    "npmrc",
];

/// The agent's diff, exported for the verifier's sandbox: removed when dropped (after it).
struct AgentDiff(PathBuf);

impl Drop for AgentDiff {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The sandbox the tests run in, and the agent's diff it stands on.
pub(crate) struct Verifier {
    // Declared first: dropped before the diff it stands on.
    pub sbx: Box<dyn SandboxOps>,
    _diff: Option<AgentDiff>,
    /// What was done, for the outcome's reason.
    pub note: String,
}

/// Remove from an exported diff what the tests must see as the image has it.
fn restore_system(diff: &Path) -> std::io::Result<()> {
    for name in SYSTEM {
        rm(&diff.join(name))?;
    }
    // `/logs` itself first: a link the agent put there must not lead the host's removal
    // of `logs/verifier` out of the diff (a link, file or whiteout goes whole, and the
    // image's `/logs` shows).
    let logs = diff.join("logs");
    match std::fs::symlink_metadata(&logs) {
        Ok(m) if !m.is_dir() => rm(&logs)?,
        Ok(_) => rm(&logs.join("verifier"))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let etc = diff.join("etc");
    match std::fs::symlink_metadata(&etc) {
        // A whiteout, a file or a symlink in place of /etc: the image's /etc, whole.
        Ok(m) if !m.is_dir() => rm(&etc)?,
        Ok(_) => {
            for e in std::fs::read_dir(&etc)? {
                let e = e?;
                let n = e.file_name().to_string_lossy().into_owned();
                if SYSTEM_ETC.contains(&n.as_str()) || n.starts_with("python") {
                    rm(&e.path())?;
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Remove a path of the diff, whatever it is (a directory whole, a file, a link, a whiteout).
fn rm(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn is_opaque(p: &Path) -> bool {
    sandbox::sys::get_xattr(p, "trusted.overlay.opaque")
        .ok()
        .flatten()
        .is_some_and(|v| v == b"y")
}

/// The directories outside the system ones whose content the tests run, judged as the
/// image built them (docs/harbor.md, "The verifier"): every absolute entry of the
/// verifier's `PATH` (a virtual environment whole where `DIR/bin` has a `DIR/pyvenv.cfg`
/// in the image), and `$HOME/.local/bin` (uv's `env` that test scripts source).
pub(crate) fn judged_as_built(env: &[String], image: &BaseView) -> Vec<String> {
    let get = |k: &str| {
        env.iter()
            .find_map(|e| e.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
    };
    let mut out: Vec<String> = Vec::new();
    let home = get("HOME")
        .filter(|h| h.starts_with('/'))
        .unwrap_or("/root");
    let path = get("PATH").unwrap_or(crate::instance::DEFAULT_PATH);
    let candidates = path
        .split(':')
        .filter_map(clean_abs)
        .chain(clean_abs(&format!("{home}/.local/bin")));
    for p in candidates {
        let first = p.trim_start_matches('/').split('/').next().unwrap_or("");
        if p == "/" || SYSTEM.contains(&first) {
            continue;
        }
        let p = match p.strip_suffix("/bin") {
            Some(venv)
                if !venv.is_empty() && image.meta(&format!("{venv}/pyvenv.cfg")).is_some() =>
            {
                venv.to_string()
            }
            _ => p,
        };
        out.push(p);
    }
    out.sort();
    out.dedup();
    // A directory under another one listed is restored with it.
    let all = out.clone();
    out.retain(|p| {
        !all.iter()
            .any(|q| q != p && p.starts_with(&format!("{q}/")))
    });
    out
}

/// `p` if it is absolute, without `.`, `..` or empty components (normalised: no trailing
/// slash); else `None` (such a `PATH` entry leaves the verifier's `PATH`).
fn clean_abs(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return None;
    }
    let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    if comps.iter().any(|c| *c == "." || *c == "..") {
        return None;
    }
    Some(format!("/{}", comps.join("/")))
}

/// The verifier's `PATH`: the absolute entries of `path` only (an empty or relative entry
/// is the working directory, the agent's).
pub(crate) fn verifier_path(path: &str) -> String {
    let mut v: Vec<String> = path.split(':').filter_map(clean_abs).collect();
    v.dedup();
    if v.is_empty() {
        return crate::instance::DEFAULT_PATH.into();
    }
    v.join(":")
}

/// Make the diff show `path` (absolute, clean) as the image has it: the agent's version
/// removed; where a directory above it in the diff is opaque (the agent deleted and made
/// it again, so the image's version is hidden) the image's copied in; where one is not a
/// directory (a link, a file, a whiteout) that one is removed, and the image's shows.
fn restore_built(
    diff: &Path,
    path: &str,
    image: &BaseView,
    budget: &mut u64,
) -> std::io::Result<()> {
    let comps: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut cur = diff.to_path_buf();
    let mut opaque = false;
    for c in &comps[..comps.len() - 1] {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => opaque |= is_opaque(&cur),
            Ok(_) => return rm(&cur),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    let target = diff.join(path.trim_start_matches('/'));
    rm(&target)?;
    if opaque {
        copy_built(image, path, &target, budget)?;
    }
    Ok(())
}

/// Copy `path` of the image (merged over its layers) to `dst`: directories, files and
/// links with their owners and modes; other kinds are left out. The files' bytes come off
/// `budget` (what is left of the agent's disk); past it the copy fails as the agent's
/// (not an error [`store_side`] counts).
fn copy_built(image: &BaseView, path: &str, dst: &Path, budget: &mut u64) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some(src) = image.locate(path) else {
        return Ok(());
    };
    let m = std::fs::symlink_metadata(&src)?;
    if m.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(&src)?, dst)?;
        return std::os::unix::fs::lchown(dst, Some(m.uid()), Some(m.gid()));
    }
    if m.is_dir() {
        std::fs::create_dir(dst)?;
        for name in image.list(path) {
            copy_built(image, &format!("{path}/{name}"), &dst.join(&name), budget)?;
        }
    } else if m.is_file() {
        *budget = budget.checked_sub(m.len()).ok_or_else(|| {
            std::io::Error::other(format!(
                "the image's {path} does not fit in what the agent left of its disk"
            ))
        })?;
        std::fs::copy(&src, dst)?;
    } else {
        return Ok(());
    }
    std::os::unix::fs::lchown(dst, Some(m.uid()), Some(m.gid()))?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(m.mode() & 0o7777))
}

fn processes(n: usize) -> String {
    if n == 1 {
        "1 process".into()
    } else {
        format!("{n} processes")
    }
}

/// After the agent: stop every process it left and move to the verifier's sandbox.
///
/// `trusted` (the task's own oracle): its processes are kept and the tests run in the same
/// sandbox, so that a daemon the oracle starts serves the tests. Otherwise every process but
/// the sandbox's init is killed; where the backend can export the agent's diff (native), the
/// sandbox is dropped and a fresh one is made over the image with that diff on top, less the
/// system directories and what [`judged_as_built`] names for `verifier_env`; elsewhere
/// (Docker) the tests run in the same sandbox, its processes killed and checked gone. The
/// perturbations' start steps run again in the sandbox the tests get.
///
/// A failure on this host's side is [`HarborError::Infrastructure`]: the layer store
/// failing its probe after an export or a restore failed, or the verifier's sandbox not
/// starting even without the agent's changes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn isolate(
    backend: &dyn DynBackend,
    store: &LayerStore,
    cfg: &SandboxConfig,
    mut sbx: Box<dyn SandboxOps>,
    task: &Task,
    img: &Image,
    verifier_env: &[String],
    trusted: bool,
) -> Result<Verifier, HarborError> {
    let left = crate::probe::processes_of(&mut *sbx)
        .map(|p| p.len())
        .unwrap_or(0);
    if trusted {
        let note = if left > 0 {
            format!("kept {} the oracle left running", processes(left))
        } else {
            String::new()
        };
        return Ok(Verifier {
            sbx,
            _diff: None,
            note,
        });
    }
    sbx.kill_all().map_err(sbx_err(format!(
        "{}: stopping the agent's processes",
        task.name
    )))?;
    let mut notes = Vec::new();
    if left > 0 {
        notes.push(format!(
            "stopped {} the agent left running",
            processes(left)
        ));
    }
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = store.dir().join(format!(
        ".tmp-agent{}-{}",
        N.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let diff = AgentDiff(dir);
    let exported = match sbx.export_diff(&diff.0, cfg.disk_bytes) {
        Ok(e) => e,
        // The refusal of a diff too large is the agent's, and so is a diff that cannot be
        // read (a path too long, a loop); a write that found the store full, read-only or
        // failing is the store's when the store fails its probe too, the agent's diff gone.
        Err(e) if matches!(&e, sandbox::SandboxError::Spawn { source, .. } if store_side(source)) =>
        {
            let _ = std::fs::remove_dir_all(&diff.0);
            store_probe(store, cfg.disk_bytes, "exporting the agent's changes", &e)?;
            return Err(sbx_err(format!(
                "{}: exporting the agent's changes",
                task.name
            ))(e));
        }
        Err(e) => {
            return Err(sbx_err(format!(
                "{}: exporting the agent's changes",
                task.name
            ))(e))
        }
    };
    if exported.is_none() {
        // The Docker backend: same sandbox, nothing of the agent's left running.
        let survivors = crate::probe::processes_of(&mut *sbx)
            .map(|p| p.len())
            .map_err(|e| HarborError::Sandbox {
                what: format!("{}: listing processes", task.name),
                source: Box::new(sandbox::SandboxError::Setup(e.to_string())),
            })?;
        if survivors > 0 {
            return Err(HarborError::Sandbox {
                what: format!("{}: stopping the agent's processes", task.name),
                source: Box::new(sandbox::SandboxError::Setup(format!(
                    "{survivors} processes survived"
                ))),
            });
        }
        notes.push("system directories not restored on this backend".into());
        start_steps(&mut sbx, task, img, &cfg.env)?;
        return Ok(Verifier {
            sbx,
            _diff: None,
            note: notes.join("; "),
        });
    }
    drop(sbx);
    let mut lowers = img.layers.clone();
    lowers.extend(img.base_lowers.iter().cloned());
    let image = BaseView::from_dirs(lowers);
    // What the image's copies add counts against the agent's disk, as the agent's own.
    let mut budget = cfg.disk_bytes.saturating_sub(exported.unwrap_or(0));
    let restored = restore_system(&diff.0).and_then(|()| {
        judged_as_built(verifier_env, &image)
            .iter()
            .try_for_each(|p| restore_built(&diff.0, p, &image, &mut budget))
    });
    if let Err(source) = restored {
        let candidate = store_side(&source);
        let e = HarborError::Io {
            path: diff.0.clone(),
            source,
        };
        // The probe without the agent's diff, for the sandbox's whole disk: a store that
        // the agent's bytes filled is sound.
        drop(diff);
        if candidate {
            store_probe(
                store,
                cfg.disk_bytes,
                "restoring the image's directories",
                &e,
            )?;
        }
        return Err(HarborError::Sandbox {
            what: format!("{}: restoring the image's directories", task.name),
            source: Box::new(sandbox::SandboxError::Setup(e.to_string())),
        });
    }
    let mut vcfg = cfg.clone();
    vcfg.layers.insert(0, diff.0.clone());
    let mut sbx = match backend.create_boxed(&vcfg) {
        Ok(s) => s,
        Err(e) => {
            // The agent's diff is the only thing of the agent's in this sandbox: the same
            // sandbox without it tells whose failure this is.
            if let Err(again) = backend.create_boxed(cfg) {
                return Err(HarborError::Infrastructure {
                    what: format!("{}: starting the verifier's sandbox", task.name),
                    reason: format!("{e}; without the agent's changes too: {again}"),
                });
            }
            return Err(sbx_err(format!(
                "{}: starting the verifier's sandbox",
                task.name
            ))(e));
        }
    };
    start_steps(&mut sbx, task, img, &cfg.env)?;
    Ok(Verifier {
        sbx,
        _diff: Some(diff),
        note: notes.join("; "),
    })
}

/// The perturbations' steps at every episode start, as root (a failing one is logged: the
/// fault may be what makes it fail).
pub(crate) fn start_steps(
    sbx: &mut Box<dyn SandboxOps>,
    task: &Task,
    img: &Image,
    root_env: &[String],
) -> Result<(), HarborError> {
    for step in &img.runtime.start {
        let mut r = sandbox::ExecRequest::shell(step.shell.clone());
        r.cwd = "/".into();
        r.env = Some(root_env.to_vec());
        r.timeout_ms = 30_000;
        r.output_cap = 1 << 20;
        let r = sbx.exec(&r).map_err(sbx_err(format!(
            "{}: a perturbation's start step",
            task.name
        )))?;
        if !r.success() {
            tracing::warn!(task = %task.name, by = %step.by, exit = r.exit_code(), "a perturbation's start step failed");
        }
    }
    Ok(())
}

/// The bytes free in the layer store.
pub(crate) fn store_free(store: &LayerStore) -> nix::Result<u64> {
    nix::sys::statvfs::statvfs(store.dir())
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// Whether an I/O error can be the layer store's (a write that found it full, read-only or
/// failing) rather than the agent's (a path too long or a loop in what it left, a copy past
/// its disk): only these are checked against the store.
fn store_side(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EIO)
    )
}

/// After `what` failed with `err`: an [`HarborError::Infrastructure`] when the layer store
/// cannot take a probe file or has less than `need` bytes free (the host's failure, not the
/// agent's); `Ok` when the store is sound (the failure is the agent's diff's).
fn store_probe(
    store: &LayerStore,
    need: u64,
    what: &str,
    err: &dyn std::fmt::Display,
) -> Result<(), HarborError> {
    let infra = |reason: String| HarborError::Infrastructure {
        what: format!("{what} ({err})"),
        reason,
    };
    let probe = store
        .dir()
        .join(format!(".tmp-probe-{}", std::process::id()));
    let wrote = std::fs::write(&probe, b"probe");
    let _ = std::fs::remove_file(&probe);
    if let Err(e) = wrote {
        return Err(infra(format!(
            "the layer store {} takes no file: {e}",
            store.dir().display()
        )));
    }
    let free =
        store_free(store).map_err(|e| infra(format!("statvfs {}: {e}", store.dir().display())))?;
    if free < need {
        return Err(infra(format!(
            "the layer store {} has {free} bytes free, less than the sandbox's disk ({need})",
            store.dir().display()
        )));
    }
    Ok(())
}

/// Where the verifier's own Python start-up file is written, in the verifier's sandbox
/// only (after the agent, so nothing of the agent's is there).
pub const SAFE_PATH_DIR: &str = "/usr/local/lib/envfactory-verifier";

/// The variable that carries the image's `PYTHONPATH` to the verifier's `sitecustomize.py`.
pub const IMAGE_PYTHONPATH: &str = "ENVFACTORY_IMAGE_PYTHONPATH";

/// The verifier's `sitecustomize.py` (alone on `PYTHONPATH`): `python -m MODULE` does not
/// put the working directory first on `sys.path`, on Pythons older than 3.11 too (which
/// ignore `PYTHONSAFEPATH`): `runpy._run_module_as_main` is wrapped to drop it before the
/// module is looked up. The image's `PYTHONPATH` entries (often `/app`), passed in
/// `ENVFACTORY_IMAGE_PYTHONPATH`, are appended after the image's own directories (standard
/// library, site-packages). What the agent leaves outside the interpreter's prefixes never
/// runs in place of the interpreter's own code: entry points (of every group: pytest11
/// plugins, which pytest loads by itself, and the groups libraries load) count only from
/// distributions in start-up `sys.path` entries under the prefixes, and a standard-library
/// module (or pytest's, or its dependencies'), top-level or a submodule, is looked up only
/// in `sys.path` entries under the prefixes (`msvcrt`, which the standard library tries and
/// misses on Linux, ran from `/app` before). docs/harbor.md lists what is not covered.
/// The image's own `sitecustomize`, if any, is imported after, from the image's own
/// directories only.
pub const SAFE_PATH_SITECUSTOMIZE: &str = r#"# EnvFactory's verifier (docs/harbor.md): no working directory on sys.path for python -m.
import os as _os, sys as _sys


def _envfactory_safe_path():
    try:
        import runpy
    except Exception:
        return
    run = runpy._run_module_as_main

    def _run_module_as_main(mod_name, alter_argv=True):
        try:
            cwd = _os.getcwd()
        except OSError:
            cwd = None
        while _sys.path and _sys.path[0] in ("", ".", cwd):
            del _sys.path[0]
        return run(mod_name, alter_argv)

    runpy._run_module_as_main = _run_module_as_main


_envfactory_safe_path()


class _EnvfactoryLoader(object):
    # A loader that patches the module it executes (see _envfactory_guard).
    def __init__(self, real, patch):
        self._envfactory_real = real
        self._envfactory_patch = patch

    def __getattr__(self, name):
        if name.startswith("_envfactory"):
            raise AttributeError(name)
        return getattr(self._envfactory_real, name)

    def create_module(self, spec):
        create = getattr(self._envfactory_real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._envfactory_real.exec_module(module)
        self._envfactory_patch(module)


class _EnvfactoryFinder(object):
    # The first finder on sys.meta_path: the metadata modules patched as they are imported
    # (see _envfactory_guard).
    _envfactory = True

    def __init__(self, patches):
        self._patches = patches

    def find_spec(self, name, path=None, target=None):
        patch = self._patches.get(name)
        if patch is None:
            return None
        for finder in list(_sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if getattr(finder, "_envfactory", False) or find is None:
                continue
            spec = find(name, path, target)
            if spec is None:
                continue
            if getattr(spec.loader, "exec_module", None) is None:
                _os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            else:
                spec.loader = _EnvfactoryLoader(spec.loader, patch)
            return spec
        return None


# Python 3.13's sys.stdlib_module_names: names later Pythons add, and every platform's.
_ENVFACTORY_STDLIB_3_13 = """
__future__ _abc _aix_support _android_support _ast _asyncio _bisect _blake2 _bz2 _codecs
_codecs_cn _codecs_hk _codecs_iso2022 _codecs_jp _codecs_kr _codecs_tw _collections
_collections_abc _colorize _compat_pickle _compression _contextvars _csv _ctypes _curses
_curses_panel _datetime _dbm _decimal _elementtree _frozen_importlib
_frozen_importlib_external _functools _gdbm _hashlib _heapq _imp _interpchannels
_interpqueues _interpreters _io _ios_support _json _locale _lsprof _lzma _markupbase
_md5 _multibytecodec _multiprocessing _opcode _opcode_metadata _operator _osx_support
_overlapped _pickle _posixshmem _posixsubprocess _py_abc _pydatetime _pydecimal _pyio
_pylong _pyrepl _queue _random _scproxy _sha1 _sha2 _sha3 _signal _sitebuiltins _socket
_sqlite3 _sre _ssl _stat _statistics _string _strptime _struct _suggestions _symtable
_sysconfig _thread _threading_local _tkinter _tokenize _tracemalloc _typing _uuid
_warnings _weakref _weakrefset _winapi _wmi _zoneinfo abc antigravity argparse array ast
asyncio atexit base64 bdb binascii bisect builtins bz2 cProfile calendar cmath cmd code
codecs codeop collections colorsys compileall concurrent configparser contextlib
contextvars copy copyreg csv ctypes curses dataclasses datetime dbm decimal difflib dis
doctest email encodings ensurepip enum errno faulthandler fcntl filecmp fileinput
fnmatch fractions ftplib functools gc genericpath getopt getpass gettext glob graphlib
grp gzip hashlib heapq hmac html http idlelib imaplib importlib inspect io ipaddress
itertools json keyword linecache locale logging lzma mailbox marshal math mimetypes mmap
modulefinder msvcrt multiprocessing netrc nt ntpath nturl2path numbers opcode operator
optparse os pathlib pdb pickle pickletools pkgutil platform plistlib poplib posix
posixpath pprint profile pstats pty pwd py_compile pyclbr pydoc pydoc_data pyexpat queue
quopri random re readline reprlib resource rlcompleter runpy sched secrets select
selectors shelve shlex shutil signal site smtplib socket socketserver sqlite3
sre_compile sre_constants sre_parse ssl stat statistics string stringprep struct
subprocess symtable sys sysconfig syslog tabnanny tarfile tempfile termios textwrap this
threading time timeit tkinter token tokenize tomllib trace traceback tracemalloc tty
turtle turtledemo types typing unicodedata unittest urllib uuid venv warnings wave
weakref webbrowser winreg winsound wsgiref xml xmlrpc zipapp zipfile zipimport zlib
zoneinfo
"""

# What pytest and its dependencies import, or try; and standard-library modules of older
# Pythons that a build may leave out (random tries _sha512 before 3.12).
_ENVFACTORY_TOOLS = """
_bootsubprocess _crypt _msi _sha256 _sha512 _bootlocale _dummy_thread audioop nis
ossaudiodev spwd org java pytest _pytest pluggy py importlib_metadata pkg_resources setuptools
_distutils_hack sitecustomize pygments colorama argcomplete pexpect exceptiongroup tomli
iniconfig packaging attr attrs more_itertools toml atomicwrites wcwidth
"""


def _envfactory_guard(startup):
    # What the agent leaves outside the interpreter's prefixes (the image's PYTHONPATH,
    # often /app; an editable install's directory; the working directory) never runs in
    # place of the interpreter's own code. The prefixes hold what the verifier restores.
    # - Entry points (pytest11 plugins, which pytest loads by itself, and every other group,
    #   which libraries load by themselves) count only from distributions in the
    #   start-up sys.path entries under the prefixes.
    # - A standard-library module (this Python's names, or 3.13's: every platform's, and
    #   names later Pythons add), or pytest's or its dependencies', top-level or a
    #   submodule, is looked up only in sys.path entries under the prefixes: the standard library tries msvcrt, _winapi, nt or
    #   org.python.core and misses them on Linux.
    # The metadata modules are patched as they are imported; where that fails, pytest loads
    # no plugin by itself.
    if _sys.version_info < (3, 4):
        _os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return
    roots = []
    for p in (
        _sys.prefix,
        _sys.exec_prefix,
        getattr(_sys, "base_prefix", None),
        getattr(_sys, "base_exec_prefix", None),
    ):
        r = _os.path.realpath(p) if p else None
        if r and r != _os.sep and r not in roots:
            roots.append(r)

    def under(path, dirs):
        for d in dirs:
            if path == d or path.startswith(d.rstrip(_os.sep) + _os.sep):
                return True
        return False

    real = {}

    def trusted(p):
        # An entry of sys.path under the interpreter's prefixes (not "", not relative).
        if not isinstance(p, str) or not _os.path.isabs(p):
            return False
        r = real.get(p)
        if r is None:
            r = real[p] = _os.path.realpath(p)
        return under(r, roots)

    own = frozenset(_os.path.abspath(p) for p in startup if trusted(p))

    def metadata(md):
        dist = getattr(md, "Distribution", None)
        prop = getattr(dist, "entry_points", None)
        if not isinstance(prop, property):
            raise TypeError("no Distribution.entry_points property")
        if getattr(prop.fget, "_envfactory", False):
            return

        def entry_points(self):
            eps = prop.fget(self)
            try:
                where = _os.path.dirname(_os.path.abspath(str(self._path)))
            except Exception:
                where = None
            if where in own or len(eps) == 0:
                return eps
            try:
                return type(eps)([])
            except Exception:
                return []

        entry_points._envfactory = True
        dist.entry_points = property(entry_points, doc=prop.__doc__)

    def pkg_resources(pr):
        cls = getattr(pr, "Distribution", None)
        get = getattr(cls, "get_entry_map", None)
        if get is None:
            raise TypeError("no Distribution.get_entry_map")
        if getattr(get, "_envfactory", False):
            return

        def get_entry_map(self, group=None):
            loc = getattr(self, "location", None)
            if loc is None or _os.path.abspath(loc) not in own:
                return {}
            return get(self, group)

        get_entry_map._envfactory = True
        cls.get_entry_map = get_entry_map

    def patched(fix):
        def run(module):
            try:
                fix(module)
            except Exception:
                _os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"

        return run

    patches = {
        "importlib.metadata": patched(metadata),
        "importlib_metadata": patched(metadata),
        "pkg_resources": patched(pkg_resources),
    }
    names = [None]

    def guarded():
        if names[0] is None:
            n = set(getattr(_sys, "stdlib_module_names", ()))
            n.update(_sys.builtin_module_names)
            n.update(_ENVFACTORY_STDLIB_3_13.split())
            n.update(_ENVFACTORY_TOOLS.split())
            if not getattr(_sys, "stdlib_module_names", None):
                lib = _os.path.dirname(_os.__file__)
                for d in (lib, _os.path.join(lib, "lib-dynload")):
                    try:
                        entries = _os.listdir(d)
                    except OSError:
                        continue
                    for e in entries:
                        n.add(e.split(".")[0])
                n.discard("test")
            names[0] = frozenset(n)
        return names[0]

    # A standard-library (or pytest's) module, top-level or a submodule, is looked up only
    # in the trusted entries, by whoever asks PathFinder: the import system,
    # importlib.util.find_spec, pytest's assertion rewriter.
    finder = None
    for f in _sys.meta_path:
        if isinstance(f, type) and f.__name__ == "PathFinder":
            finder = f
    orig = getattr(finder, "find_spec", None)
    if not roots:
        # Nothing to tell the interpreter's directories by (a prefix of "/"): no name is
        # guarded, and pytest loads no plugin by itself.
        _os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    elif orig is not None and not getattr(orig, "_envfactory", False):

        def find_spec(cls, fullname, path=None, target=None):
            # A guarded package's submodules too: pkg_resources' namespace declarations
            # can add an agent directory to a package's __path__.
            top, dot, _ = fullname.partition(".")
            if top in guarded() and (path is None or dot):
                path = [p for p in (_sys.path if path is None else path) if trusted(p)]
            return orig(fullname, path, target)

        find_spec._envfactory = True
        finder.find_spec = classmethod(find_spec)
    for name, patch in patches.items():
        if name in _sys.modules:
            patch(_sys.modules[name])
    if not any(getattr(f, "_envfactory", False) for f in _sys.meta_path):
        _sys.meta_path.insert(0, _EnvfactoryFinder(patches))


_here = _os.path.dirname(_os.path.abspath(__file__))
# The image's PYTHONPATH (often a directory the agent writes, /app) arrives in
# ENVFACTORY_IMAGE_PYTHONPATH, not PYTHONPATH: Python imports `encodings` (and `site`
# before 3.11) before this file runs. Its entries go after the image's own directories
# (standard library, site-packages), once the image's sitecustomize is looked up without them.
_theirs = []
for _p in _os.environ.get("ENVFACTORY_IMAGE_PYTHONPATH", "").split(_os.pathsep):
    if _p and _os.path.abspath(_p) != _here and _os.path.abspath(_p) not in _theirs:
        _theirs.append(_os.path.abspath(_p))
_saved = list(_sys.path)
_envfactory_guard([p for p in _saved if p and _os.path.abspath(p) != _here])
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_me = _sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # noqa: F401  (the image's own)
except ImportError:
    # None of the image's: ours stays, for the import machinery to find when ours ends.
    if _me is not None:
        _sys.modules["sitecustomize"] = _me
finally:
    _sys.path[:] = _saved + [p for p in _theirs if p not in _saved]
"#;

/// The verifier's environment: the sandbox's (`root_env`), the task's `[verifier.env]`,
/// then Python and pytest confined ([`python_env`]) and a `PATH` of absolute entries only.
pub(crate) fn verifier_env(task: &Task, root_env: &[String]) -> Vec<String> {
    let env = super::build::merge_env(root_env, &task.verifier_env);
    let env = super::build::merge_env(&env, &python_env(task, &env));
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(crate::instance::DEFAULT_PATH);
    let path = verifier_path(path);
    super::build::merge_env(&env, &[("PATH".into(), path)])
}

/// The verifier's environment for Python and pytest, whatever runs them (`pytest`,
/// `python3 -m pytest`, the offline shims): pytest's root and conftest search confined to
/// `/tests`, its configuration the task's own (`tests/pytest.ini`, ...) or none, no cache;
/// no user site-packages and no working directory on `sys.path` (a `pytest.py` the agent
/// leaves in `/app` is not imported: `PYTHONSAFEPATH`, and for older Pythons the
/// verifier's `sitecustomize.py` alone on `PYTHONPATH`, the image's entries appended by it
/// after site-packages). Prepended to what the task sets.
pub(crate) fn python_env(task: &Task, env: &[String]) -> Vec<(String, String)> {
    let own_ini = ["pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"]
        .iter()
        .find(|n| task.tests.iter().any(|(rel, _)| rel == *n))
        .map(|n| format!("/tests/{n}"))
        .unwrap_or_else(|| "/dev/null".into());
    let mut addopts =
        format!("-p no:cacheprovider --rootdir=/tests --confcutdir=/tests -c {own_ini}");
    if let Some(theirs) = env.iter().find_map(|e| e.strip_prefix("PYTEST_ADDOPTS=")) {
        addopts = format!("{addopts} {theirs}");
    }
    // The image's PYTHONPATH never reaches Python's start (`encodings`, `site` before 3.11
    // are imported from it before any sitecustomize): ours appends it after site-packages.
    let theirs = env.iter().find_map(|e| e.strip_prefix("PYTHONPATH="));
    vec![
        ("PYTEST_ADDOPTS".into(), addopts),
        ("PYTHONNOUSERSITE".into(), "1".into()),
        ("PYTHONSAFEPATH".into(), "1".into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("PYTHONPATH".into(), SAFE_PATH_DIR.to_string()),
        (
            IMAGE_PYTHONPATH.into(),
            theirs.unwrap_or_default().to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_system_directories_leave_the_agents_diff() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        for p in [
            "usr/local/bin",
            "app",
            "etc/nginx",
            "etc/python3.11",
            "etc/ld.so.conf.d",
            "etc/apt/apt.conf.d",
            "etc/profile.d",
            "logs/verifier",
            "logs/agent",
            "tests",
        ] {
            std::fs::create_dir_all(d.join(p)).unwrap();
        }
        std::fs::write(d.join("etc/ld.so.preload"), "/tmp/evil.so").unwrap();
        std::os::unix::fs::symlink("usr/lib", d.join("lib")).unwrap();
        restore_system(d).unwrap();
        let mut left: Vec<String> = Vec::new();
        for e in walk(d) {
            left.push(e);
        }
        left.sort();
        assert_eq!(left, ["app", "etc", "etc/nginx", "logs", "logs/agent"]);
        // /etc replaced by a symlink: the image's /etc, whole.
        std::fs::remove_dir_all(d.join("etc")).unwrap();
        std::os::unix::fs::symlink("/opt/evil", d.join("etc")).unwrap();
        restore_system(d).unwrap();
        assert!(std::fs::symlink_metadata(d.join("etc")).is_err());
    }

    #[test]
    fn the_verifiers_path_and_what_is_judged_as_built() {
        assert_eq!(
            verifier_path("::/app/bin:.:bin:/usr/bin/:/x/../y"),
            "/app/bin:/usr/bin"
        );
        assert_eq!(verifier_path(""), crate::instance::DEFAULT_PATH);
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("opt/venv/bin")).unwrap();
        std::fs::write(t.path().join("opt/venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        let image = BaseView::from_dirs(vec![t.path().to_path_buf()]);
        let env = [
            "HOME=/home/app".to_string(),
            "PATH=/app/.venv/bin:/opt/venv/bin:/home/app/.local/bin/tools:/usr/bin:/bin:/:rel"
                .to_string(),
        ];
        assert_eq!(
            judged_as_built(&env, &image),
            ["/app/.venv/bin", "/home/app/.local/bin", "/opt/venv"]
        );
    }

    /// The image's copies come off what the agent left of its disk: past it the copy
    /// fails as the agent's (not a store-side error), within it the bytes are taken.
    #[test]
    fn the_images_copies_count_against_the_agents_disk() {
        let t = tempfile::tempdir().unwrap();
        let layer = t.path().join("layer");
        std::fs::create_dir_all(layer.join("opt/venv")).unwrap();
        std::fs::write(layer.join("opt/venv/pyvenv.cfg"), [b'x'; 100]).unwrap();
        let image = BaseView::from_dirs(vec![layer]);
        let dst = t.path().join("out");
        let mut budget = 99;
        let e = copy_built(&image, "/opt", &dst, &mut budget).unwrap_err();
        assert!(!store_side(&e), "{e}");
        std::fs::remove_dir_all(&dst).unwrap();
        let mut budget = 150;
        copy_built(&image, "/opt", &dst, &mut budget).unwrap();
        assert_eq!(budget, 50);
        assert_eq!(
            std::fs::read(dst.join("venv/pyvenv.cfg")).unwrap().len(),
            100
        );
    }

    fn walk(d: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![d.to_path_buf()];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                let rel = e.path().strip_prefix(d).unwrap().display().to_string();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                }
                out.push(rel);
            }
        }
        out
    }
}
