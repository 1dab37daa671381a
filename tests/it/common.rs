#![allow(dead_code)]
//! Shared fixtures of the engine's integration tests (root tests skip when not root).

use sandbox::{InitProgram, Runtime};

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skip (with a message) when not root: these tests need namespaces, mounts and cgroups.
#[macro_export]
macro_rules! require_root {
    () => {
        if !common::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

pub fn init_program() -> InitProgram {
    InitProgram::at(env!("CARGO_BIN_EXE_envfactory-init").into(), vec![]).unwrap()
}

/// A fresh runtime over the default state directory; dropping it removes what it created.
pub fn runtime() -> Runtime {
    Runtime::new(&sandbox::state::default_state_dir(), init_program()).unwrap()
}

/// A private state directory whose instance cache (a tmpfs) is unmounted when dropped.
pub struct TempState {
    pub dir: tempfile::TempDir,
}

impl TempState {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for TempState {
    fn drop(&mut self) {
        let _ = engine::synth::remove_cache(self.dir.path());
    }
}

/// A private instance cache, removed (tmpfs unmounted) with its last clone.
pub fn cache() -> engine::synth::Cache {
    engine::synth::Cache::temporary().unwrap()
}

/// Names, modes, owners, sizes, times and types of a directory tree, and a hash of its file
/// contents: equal digests mean equal trees.
pub fn tree_digest(dir: &std::path::Path) -> String {
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg("find . -printf '%p %m %U %G %s %T@ %y\\n' | sort; find . -type f -print0 | sort -z | xargs -0 cat | sha256sum")
        .current_dir(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A private tmpfs (for a layer: overlayfs refuses a layer nested in the host's `/`, which the
/// `host` base uses as a layer), unmounted when dropped, by a panic too.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("t"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=16m"),
        )
        .unwrap();
        Self { dir }
    }
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Run a test alone in a fresh process of this test binary, for the few assertions that no
/// other test may disturb (no sandbox of a parallel test forked while they run). In the test
/// process this re-runs the test binary on exactly `name`, asserts that it passed, and returns
/// false (the caller returns); in that child it returns true and the caller runs its body.
pub fn isolated(name: &str) -> bool {
    const CHILD: &str = "ENVFACTORY_TEST_ISOLATED";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "isolated run of {name} failed:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "isolated run of {name} ran no test:\n{text}"
    );
    false
}
