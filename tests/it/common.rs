#![allow(dead_code)]
//! Fixtures of the engine's integration tests. What the sandbox crate's tests share with these
//! (`is_root`, `require_root!`, `Tmpfs`, `eventually`, ...) is `sandbox::testing`; what is here
//! knows the engine (its init binary, private instance caches).

pub use sandbox::testing::{is_root, Tmpfs};
use sandbox::{InitProgram, Runtime};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub fn init_program() -> InitProgram {
    InitProgram::at(env!("CARGO_BIN_EXE_envfactory-init").into(), vec![]).unwrap()
}

/// A fresh runtime over the default state directory; dropping it removes what it created.
pub fn runtime() -> Runtime {
    sandbox::testing::runtime_with(init_program())
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
        let _ = engine::harbor::LayerStore::remove(self.dir.path());
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

/// Spawn `c`, again while a copied binary is still "text busy" (another thread of this test
/// process may hold it open for writing in a child it is forking).
pub fn spawn(c: &mut Command) -> Child {
    let t = Instant::now();
    loop {
        match c.spawn() {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && t.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
}
