//! What stands between the agent and the verdict once the agent's time is over (docs/harbor.md,
//! "The verifier"): every process the agent left is stopped, the tests run in a fresh sandbox
//! over the image with the agent's changes on top except in the system directories (the
//! image's own `/usr`, `/bin`, `/lib*`, loader and Python configuration under `/etc`), and
//! pytest is confined to `/tests`.

use super::{sbx_err, HarborError, LayerStore, Task};
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

/// Entries of `/etc` restored the same way (the dynamic loader's preload and paths, Python's
/// `sitecustomize.py`, the alternatives' links); the rest of `/etc` is the agent's work as
/// much as `/app` is (a task may be to configure a service).
const SYSTEM_ETC: &[&str] = &[
    "ld.so.preload",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld.so.cache",
    "alternatives",
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
    let rm = |p: &Path| -> std::io::Result<()> {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
            Ok(_) => std::fs::remove_file(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    };
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
/// system directories; elsewhere (Docker) the tests run in the same sandbox, its processes
/// killed and checked gone.
pub(crate) fn isolate(
    backend: &dyn DynBackend,
    store: &LayerStore,
    cfg: &SandboxConfig,
    mut sbx: Box<dyn SandboxOps>,
    task: &Task,
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
    let exported = sbx
        .export_diff(&diff.0, cfg.disk_bytes)
        .map_err(sbx_err(format!(
            "{}: exporting the agent's changes",
            task.name
        )))?;
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
        return Ok(Verifier {
            sbx,
            _diff: None,
            note: notes.join("; "),
        });
    }
    drop(sbx);
    restore_system(&diff.0).map_err(|source| HarborError::Io {
        path: diff.0.clone(),
        source,
    })?;
    let mut vcfg = cfg.clone();
    vcfg.layers.insert(0, diff.0.clone());
    let sbx = backend.create_boxed(&vcfg).map_err(sbx_err(format!(
        "{}: starting the verifier's sandbox",
        task.name
    )))?;
    Ok(Verifier {
        sbx,
        _diff: Some(diff),
        note: notes.join("; "),
    })
}

/// The verifier's environment for Python and pytest, whatever runs them (`pytest`,
/// `python3 -m pytest`, the offline shims): pytest's root and conftest search confined to
/// `/tests`, its configuration the task's own (`tests/pytest.ini`, ...) or none, no cache;
/// no user site-packages and no working directory on `sys.path` (a `pytest.py` the agent
/// leaves in `/app` is not imported). Prepended to what the task sets itself.
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
    vec![
        ("PYTEST_ADDOPTS".into(), addopts),
        ("PYTHONNOUSERSITE".into(), "1".into()),
        ("PYTHONSAFEPATH".into(), "1".into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
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
