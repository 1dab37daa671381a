//! Harbor and Terminal-Bench task folders (`tests/fixtures/harbor/`): each layout's tasks
//! built into layers and run with their oracle and their own tests, the reward-file trick
//! scoring 0, unsupported folders skipped, bad input named, build layers cached; and on a
//! private `dockerd` the same tasks on the Docker backend.

use crate::common;
use engine::harbor::{self, Agent, BuildOptions, LayerStore};
use sandbox::RootfsSpec;
use std::path::{Path, PathBuf};

mod base;
mod build_network;
mod python;

/// Every `FROM` on the host rootfs, the default build network.
fn on_host() -> BuildOptions {
    BuildOptions::on(RootfsSpec::Host)
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/harbor")
        .join(rel)
}

/// A private layer store (its own tmpfs), unmounted when dropped.
struct Store {
    dir: tempfile::TempDir,
    store: LayerStore,
}

impl Store {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path()).unwrap();
        Self { dir, store }
    }
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = LayerStore::remove(self.dir.path());
    }
}

#[test]
fn task_folders_of_both_layouts_pass_fail_or_skip_as_their_oracles_deserve() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let host = on_host();
    // (folder, passed, skipped, a part of the reason)
    let expect: &[(&str, bool, bool, &str)] = &[
        ("harbor/hello-file", true, false, "reward.txt: 1"),
        ("harbor/oracle-fails", false, false, "reward.txt: 0"),
        ("harbor/reward-trick", false, false, "wrote no reward file"),
        ("harbor/service-daemon", true, false, "reward.txt: 1"),
        ("harbor/user-glob-uvx", true, false, "reward.txt: 1"),
        (
            "harbor/two-services",
            false,
            true,
            "unsupported: 2 services",
        ),
        ("terminal-bench/count-lines", true, false, "1 tests passed"),
        (
            "terminal-bench/oracle-fails",
            false,
            false,
            "test_outputs.py::test_answer",
        ),
        ("terminal-bench/keystrokes", true, false, "1 tests passed"),
        (
            "terminal-bench/compose-context",
            true,
            false,
            "3 tests passed",
        ),
        ("terminal-bench/reward-trick", false, false, "failed:"),
        (
            "terminal-bench/multi-stage",
            false,
            true,
            "unsupported: a second FROM",
        ),
    ];
    for (dir, passed, skipped, reason) in expect {
        let o = harbor::check_task(
            &rt,
            &rt,
            &s.store,
            &fixture(dir),
            &host,
            &Agent::Oracle,
            &[],
            1,
        )
        .unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert_eq!((o.passed, o.skipped), (*passed, *skipped), "{dir}: {o:?}");
        assert!(o.reason.contains(reason), "{dir}: {}", o.reason);
        if !passed {
            assert_eq!(o.reward, 0.0, "{dir}");
        }
    }
    // The offline rule is reported per task.
    let o = harbor::check_task(
        &rt,
        &rt,
        &s.store,
        &fixture("harbor/user-glob-uvx"),
        &host,
        &Agent::Oracle,
        &[],
        1,
    )
    .unwrap();
    assert!(
        o.substituted.iter().any(|x| x.starts_with("uvx")),
        "{:?}",
        o.substituted
    );
    assert!(
        o.substituted.iter().any(|x| x.starts_with("curl")),
        "{:?}",
        o.substituted
    );
    // The tests can fail: without the oracle, nothing passes.
    for dir in ["harbor/hello-file", "terminal-bench/count-lines"] {
        let o = harbor::check_task(
            &rt,
            &rt,
            &s.store,
            &fixture(dir),
            &host,
            &Agent::Nothing,
            &[],
            1,
        )
        .unwrap();
        assert!(!o.passed && o.reward == 0.0, "{dir}: {o:?}");
    }
}

#[test]
fn a_reward_file_the_agent_leaves_before_the_tests_never_counts() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let episode = |cmds: &[&str]| {
        let cmds: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
        scripted(&s, &rt, &fixture("harbor/reward-trick"), &cmds)
    };
    // The agent writes both reward files, makes the folder read-only, leaves a decoy.
    let o = episode(&[
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
        "echo '{\"reward\": 1}' > /logs/verifier/reward.json; chmod 555 /logs/verifier",
        "mkdir -p /tmp/fake && echo 1 > /tmp/fake/reward.txt",
    ]);
    assert_eq!(o.reward, 0.0, "{o:?}");
    assert!(o.reason.contains("wrote no reward file"), "{}", o.reason);
    // An agent that breaks the deletion (`rm` and `mkdir` replaced, reward pre-written): the
    // verifier's sandbox has the image's own `rm` and `mkdir`, and no /logs/verifier of the
    // agent's; scores 0. (Where the tests run in the agent's sandbox, the oracle's or on
    // Docker, the host sees a surviving file and scores 0: `survived its deletion`.)
    let o = episode(&[
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
        "for b in rm mkdir; do p=$(command -v $b); cp /bin/true /tmp/t; mv /tmp/t \"$p\"; done",
    ]);
    assert_eq!(o.reward, 0.0, "{o:?}");
    assert!(o.reason.contains("wrote no reward file"), "{}", o.reason);
    // The honest agent on the same task scores 1.
    let o = episode(&["touch /app/done"]);
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// A copy of a fixture folder to edit.
fn copy_fixture(rel: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(fixture(rel))
        .arg(t.path().join("task"))
        .status()
        .unwrap();
    assert!(ok.success());
    t
}

/// A copy of a fixture folder with one file replaced: (the copy, the task folder in it).
fn edited_fixture(rel: &str, file: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
    let t = copy_fixture(rel);
    let dir = t.path().join("task");
    std::fs::write(dir.join(file), body).unwrap();
    (t, dir)
}

#[test]
fn layers_are_cached_and_a_failed_step_publishes_nothing() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let t = copy_fixture("harbor/hello-file");
    let dir = t.path().join("task");
    let task = harbor::load(&dir).unwrap();
    let df =
        harbor::dockerfile::parse(&std::fs::read_to_string(&task.dockerfile).unwrap()).unwrap();
    let first = harbor::build_image(&rt, &s.store, &task, &df, &on_host()).unwrap();
    assert_eq!((first.built, first.cached), (3, 0), "WORKDIR, COPY, RUN");
    let again = harbor::build_image(&rt, &s.store, &task, &df, &on_host()).unwrap();
    assert_eq!((again.built, again.cached), (0, 3));
    assert_eq!(again.layers, first.layers);
    let before = s.entries();
    // A failing step after the cached ones: the error names the file and line; nothing new.
    let text = std::fs::read_to_string(&task.dockerfile).unwrap() + "RUN echo broken >&2; exit 3\n";
    std::fs::write(&task.dockerfile, &text).unwrap();
    let df = harbor::dockerfile::parse(&text).unwrap();
    let e = harbor::build_image(&rt, &s.store, &task, &df, &on_host())
        .unwrap_err()
        .to_string();
    let line = text.lines().count();
    assert!(
        e.contains(&format!(
            "Dockerfile: line {line}: the step failed (exit 3): broken"
        )),
        "{e}"
    );
    assert_eq!(
        s.entries(),
        before,
        "no half-built layer, earlier ones kept"
    );
    // A base that is nowhere: the error names the Dockerfile and the FROM line.
    let missing = harbor::dockerfile::parse("# base\nFROM no-such-image:1\nRUN true\n").unwrap();
    let e = harbor::build_image(&rt, &s.store, &task, &missing, &BuildOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Dockerfile: line 2: FROM no-such-image:1"),
        "{e}"
    );
    // An instruction changed in the middle rebuilds it and everything after it only.
    let text = text
        .replace("chmod 644", "chmod 640")
        .replace("RUN echo broken >&2; exit 3\n", "");
    let df = harbor::dockerfile::parse(&text).unwrap();
    let third = harbor::build_image(&rt, &s.store, &task, &df, &on_host()).unwrap();
    assert_eq!((third.built, third.cached), (1, 2));
}

#[test]
fn bad_task_folders_are_named() {
    let t = copy_fixture("harbor/hello-file");
    let dir = t.path().join("task");
    let toml = dir.join("task.toml");
    let good = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        good.replace("[verifier]", "[verifier]\ntimeout_secs = 3"),
    )
    .unwrap();
    let e = harbor::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("task.toml") && e.contains("unknown field `timeout_secs`"),
        "{e}"
    );
    std::fs::write(
        &toml,
        good.replace("memory_mb = 512", "memory_mb = \"lots\""),
    )
    .unwrap();
    let e = harbor::load(&dir).unwrap_err().to_string();
    assert!(e.contains("task.toml") && e.contains("memory_mb"), "{e}");
    std::fs::write(&toml, &good).unwrap();
    std::fs::remove_file(dir.join("tests/test.sh")).unwrap();
    let e = harbor::load(&dir).unwrap_err().to_string();
    assert!(e.ends_with("missing tests/test.sh"), "{e}");
    let e = harbor::load(&fixture("nowhere")).unwrap_err().to_string();
    assert!(e.contains("nowhere"), "{e}");
    let t = copy_fixture("terminal-bench/count-lines");
    let y = t.path().join("task/task.yaml");
    std::fs::write(&y, "instruction: [1, 2]\n").unwrap();
    let e = harbor::load(&t.path().join("task"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("task.yaml") && e.contains("`instruction` must be a string"),
        "{e}"
    );
}

#[test]
fn the_same_tasks_run_on_the_docker_backend() {
    require_root!();
    let d = require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("rootfs.tar");
    sandbox::docker_testing::rootfs_tar(
        &tar,
        &[
            "sh", "bash", "cat", "mkdir", "rm", "chmod", "grep", "tr", "test", "touch", "echo",
        ],
        &[],
    );
    // The fixtures' `FROM debian:bookworm` resolves to the daemon's image of that name.
    d.import(&tar, "debian:bookworm");
    let rt = common::runtime();
    let s = Store::new();
    let docker = sandbox::docker::DockerBackend::new(d.client(), &dir.path().join("work"));
    // The benchmark, tiny: both backends timed on the same task, both passing.
    let r = engine::bench::harbor::run(
        &rt,
        &s.store,
        &docker,
        &[fixture("harbor/hello-file")],
        &BuildOptions::default(),
        1,
    )
    .unwrap();
    assert_eq!(r.tasks.len(), 1, "{r:?}");
    let t = &r.tasks[0];
    assert!(t.native_passed && t.docker_passed, "{t:?}");
    assert_eq!((t.native_s.n, t.docker_s.n), (1, 1));
    assert!(t.ratio > 0.0 && t.ratio.is_finite(), "{t:?}");
    for (task, reward) in [("harbor/hello-file", 1.0), ("harbor/reward-trick", 0.0)] {
        for backend in [&rt as &dyn sandbox::DynBackend, &docker] {
            let o = harbor::check_task(
                &rt,
                backend,
                &s.store,
                &fixture(task),
                &BuildOptions::default(),
                &Agent::Oracle,
                &[],
                1,
            )
            .unwrap();
            assert_eq!(o.reward, reward, "{task} on {}: {o:?}", backend.name());
            assert!(o.base.contains("docker:debian:bookworm"), "{}", o.base);
        }
    }
}

#[test]
fn check_prints_a_json_line_per_task_and_fails_when_one_fails() {
    require_root!();
    let st = common::TempState::new();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .args(["harbor", "check", "--json", "--base", "host"])
        .args(
            [
                "harbor/hello-file",
                "terminal-bench/oracle-fails",
                "harbor/two-services",
            ]
            .map(fixture),
        )
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<(&str, bool, bool)> = lines
        .iter()
        .map(|v| {
            for k in ["task", "passed", "reward", "reason", "seconds"] {
                assert!(!v[k].is_null(), "{k}: {v}");
            }
            (
                v["task"].as_str().unwrap(),
                v["passed"].as_bool().unwrap(),
                v["skipped"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("hello-file", true, false),
            ("oracle-fails", false, false),
            ("two-services", false, true)
        ]
    );
    // A folder that is not a task is bad input (exit 2), named.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .args(["harbor", "check", "--base", "host"])
        .arg(fixture("harbor"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("missing task.toml (Harbor) or task.yaml (Terminal-Bench)"),
        "{err}"
    );
}

#[test]
fn the_factorys_perturbations_apply_to_task_folders() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let dir = fixture("harbor/hello-file");
    let host = &on_host();
    let spec = engine::perturb::parse_spec("tool-missing:tool=tr").unwrap();
    let o = harbor::check_task(&rt, &rt, &s.store, &dir, host, &Agent::Oracle, &[spec], 1).unwrap();
    assert_eq!(o.reward, 0.0, "the oracle needs tr: {o:?}");
    assert_eq!(o.perturbations, vec!["tool-missing: removed /usr/bin/tr"]);
    // The same task unperturbed still passes (the fault is in its own layer, not the image's).
    let o = harbor::check_task(&rt, &rt, &s.store, &dir, host, &Agent::Oracle, &[], 1).unwrap();
    assert_eq!(o.reward, 1.0, "{o:?}");
    assert!(o.perturbations.is_empty());
}

/// One episode of a fixture with a scripted agent on the host rootfs.
fn scripted(s: &Store, rt: &sandbox::Runtime, dir: &Path, cmds: &[String]) -> harbor::Outcome {
    harbor::check_task(
        rt,
        rt,
        &s.store,
        dir,
        &on_host(),
        &Agent::Commands(cmds.to_vec()),
        &[],
        1,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Hack trial: an agent that leaves processes running (a new session, a double fork, nohup)
/// that write the reward file or rewrite the tests once the verifier has copied them in.
/// None of them may change the verdict: the agent's processes are gone before the tests.
#[test]
fn processes_the_agent_leaves_running_never_touch_the_verdict() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let harbor_trick = fixture("harbor/reward-trick");
    let tb_trick = fixture("terminal-bench/reward-trick");
    let tricks: &[(&str, &Path, &str)] = &[
        (
            "a session leader writing reward.txt as soon as the tests are in",
            &harbor_trick,
            "setsid sh -c 'until [ -e /tests/test.sh ]; do :; done; echo 1 > /logs/verifier/reward.txt' >/dev/null 2>&1 </dev/null & sleep 0.05",
        ),
        (
            "a double-forked nohup process writing reward.json",
            &harbor_trick,
            "(nohup sh -c 'until [ -e /tests/test.sh ]; do :; done; echo 1 > /logs/verifier/reward.json' >/dev/null 2>&1 </dev/null &) ; sleep 0.05",
        ),
        (
            "a daemon rewriting the test file the verifier is about to run",
            &tb_trick,
            "setsid sh -c 'until [ -s /tests/test_outputs.py ]; do :; done; printf \"def test_done():\\n    pass\\n\" > /tests/test_outputs.py' >/dev/null 2>&1 </dev/null &",
        ),
    ];
    for (what, dir, cmd) in tricks {
        let o = scripted(&s, &rt, dir, &[cmd.to_string()]);
        assert_eq!(o.reward, 0.0, "{what}: {o:?}");
        assert!(
            o.reason.contains("stopped") && o.reason.contains("left running"),
            "{what}: {}",
            o.reason
        );
    }
    // The honest agent still scores 1, and a daemon the oracle starts still serves the tests
    // (`harbor/service-daemon` in the test above).
    let o = scripted(&s, &rt, &harbor_trick, &["touch /app/done".into()]);
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// A plugin that turns every test report into a pass.
const PASS_ALL: &str = "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    outcome = yield\n    outcome.get_result().outcome = 'passed'\n";

/// Hack trial: an agent running as root plants pytest configuration where pytest looks for it,
/// a `.pth` file or a plugin in the system's site-packages, a `python3` earlier on `PATH`, a
/// `pytest` module in the working directory, or, on the image's `PYTHONPATH`, a distribution
/// declaring a `pytest11` plugin or an `msvcrt.py` naming one; the task (`/app/done`) is not
/// solved, so every one must score 0.
#[test]
fn planted_pytest_configuration_and_replaced_tools_never_pass_the_tests() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let dir = fixture("terminal-bench/reward-trick");
    let write = |path: &str, body: &str| {
        format!("mkdir -p \"$(dirname {path})\" && cat > {path} <<'EOF'\n{body}EOF")
    };
    // Configuration that runs a passing test of the agent's instead of the task's.
    let fake = "def test_done():\n    pass\n";
    let deselect = "/opt/agent/test_fake.py --deselect tests/test_outputs.py::test_done";
    let plugin_ini = |path: &str, section: &str| {
        vec![
            write("/opt/agent/test_fake.py", fake),
            write(path, &format!("{section}\naddopts = {deselect}\n")),
        ]
    };
    let tricks: Vec<(&str, Vec<String>)> = vec![
        ("conftest.py at /", vec![write("/conftest.py", PASS_ALL)]),
        ("pytest.ini at /", plugin_ini("/pytest.ini", "[pytest]")),
        ("tox.ini at /", plugin_ini("/tox.ini", "[pytest]")),
        ("setup.cfg at /", plugin_ini("/setup.cfg", "[tool:pytest]")),
        (
            "pyproject.toml at /",
            vec![
                write("/opt/agent/test_fake.py", fake),
                write(
                    "/pyproject.toml",
                    &format!("[tool.pytest.ini_options]\naddopts = \"{deselect}\"\n"),
                ),
            ],
        ),
        (
            "a .pth file that loads a plugin",
            vec![
                write("/usr/lib/python3/dist-packages/agentplug.py", PASS_ALL),
                write(
                    "/usr/lib/python3/dist-packages/zz-agent.pth",
                    "import os; os.environ['PYTEST_PLUGINS'] = 'agentplug'\n",
                ),
            ],
        ),
        (
            "Debian's sitecustomize.py (in /etc) loading a plugin",
            vec![
                write("/etc/python3.11/agentplug.py", PASS_ALL),
                "echo \"import sys, os; sys.path.append('/etc/python3.11'); os.environ['PYTEST_PLUGINS'] = 'agentplug'\" >> /etc/python3.11/sitecustomize.py".into(),
            ],
        ),
        (
            "a python3 earlier on PATH",
            vec![
                write(
                    "/usr/local/bin/python3",
                    "#!/bin/sh\necho 'PASSED tests/test_outputs.py::test_done'\n",
                ),
                "chmod 755 /usr/local/bin/python3".into(),
            ],
        ),
        (
            "pytest's own module replaced",
            vec!["p=$(/usr/bin/python3 -c 'import pytest, os; print(os.path.dirname(pytest.__file__))') && printf \"print('PASSED tests/test_outputs.py::test_done')\\n\" > $p/__main__.py".into()],
        ),
        (
            "a pytest module in the working directory",
            vec![write(
                "/app/pytest.py",
                "print('PASSED tests/test_outputs.py::test_done')\n",
            )],
        ),
    ];
    for (what, cmds) in &tricks {
        let o = scripted(&s, &rt, &dir, cmds);
        assert_eq!(o.reward, 0.0, "{what}: {o:?}");
    }
    // The agent's work in /app is what the tests see: the honest agent passes.
    let o = scripted(&s, &rt, &dir, &["touch /app/done".into()]);
    assert_eq!(o.reward, 1.0, "{o:?}");
    // The image's PYTHONPATH names /app, where the agent declares a `pytest11` plugin (a
    // dist-info), which pytest loads by itself: 0; the honest agent on that image: 1.
    let (_t, on_path) = edited_fixture(
        "terminal-bench/reward-trick",
        "Dockerfile",
        "FROM debian:bookworm\nWORKDIR /app\nENV PYTHONPATH=/app\n",
    );
    let info = "/app/agentplug-1.0.dist-info";
    let plugin = [
        write("/app/agentplug.py", PASS_ALL),
        write(
            &format!("{info}/METADATA"),
            "Metadata-Version: 2.1\nName: agentplug\nVersion: 1.0\n",
        ),
        write(
            &format!("{info}/entry_points.txt"),
            "[pytest11]\nagentplug = agentplug\n",
        ),
    ];
    let o = scripted(&s, &rt, &on_path, &plugin);
    assert_eq!(
        o.reward, 0.0,
        "a pytest11 plugin on the image's PYTHONPATH: {o:?}"
    );
    // An msvcrt.py there (the standard library tries it, and misses it, at every pytest
    // start) that names that plugin: 0.
    let msvcrt = [
        write("/app/agentplug.py", PASS_ALL),
        write(
            "/app/msvcrt.py",
            "import os\nos.environ['PYTEST_PLUGINS'] = 'agentplug'\nraise ModuleNotFoundError('msvcrt')\n",
        ),
    ];
    let o = scripted(&s, &rt, &on_path, &msvcrt);
    assert_eq!(
        o.reward, 0.0,
        "an msvcrt.py on the image's PYTHONPATH: {o:?}"
    );
    let o = scripted(&s, &rt, &on_path, &["touch /app/done".into()]);
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// Hack trial: an agent (or an oracle) that breaks its own sandbox (its shell deleted, so no
/// command can start) fails its task with a reason; the other tasks of the check still run.
#[test]
fn a_link_at_logs_and_a_sparse_file_never_reach_the_host() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    // Hack trial: /logs replaced by a link to a host directory that has a `verifier`; the
    // host's clean-up of the diff's `logs/verifier` must not follow it.
    let victim = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(victim.path().join("verifier")).unwrap();
    std::fs::write(victim.path().join("verifier/keep"), "host file").unwrap();
    let o = scripted(
        &s,
        &rt,
        &fixture("harbor/reward-trick"),
        &[format!(
            "rm -rf /logs && ln -s {} /logs",
            victim.path().display()
        )],
    );
    assert_eq!(o.reward, 0.0, "{o:?}");
    assert!(
        victim.path().join("verifier/keep").is_file(),
        "the host lost a file"
    );
    // Hack trial: a 100 GiB sparse file costs the sandbox's quota nothing; its export would
    // write it out whole on the host. Refused, scored 0, nothing left in the store.
    let o = scripted(
        &s,
        &rt,
        &fixture("harbor/hello-file"),
        &["truncate -s 100G /sparse".into()],
    );
    assert_eq!(o.reward, 0.0, "{o:?}");
    assert!(o.reason.contains("apparent sizes"), "{}", o.reason);
    let left: Vec<_> = std::fs::read_dir(s.store.dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-agent"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_sandbox_the_agent_breaks_fails_its_task_and_the_check_goes_on() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let o = scripted(
        &s,
        &rt,
        &fixture("harbor/hello-file"),
        &[
            "rm -f /bin/sh /usr/bin/sh /bin/bash /usr/bin/bash".into(),
            "true".into(),
        ],
    );
    assert_eq!(o.reward, 0.0, "{o:?}");
    assert!(
        o.reason.contains("the agent broke its sandbox"),
        "{}",
        o.reason
    );
    // On the command line: an oracle that deletes the shell, then a good task.
    let (_t, broken) = edited_fixture(
        "harbor/hello-file",
        "solution/solve.sh",
        "#!/bin/bash\nrm -f /bin/sh /usr/bin/sh /bin/bash /usr/bin/bash\n",
    );
    let st = common::TempState::new();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .args(["harbor", "check", "--json", "--base", "host"])
        .arg(&broken)
        .arg(fixture("harbor/hello-file"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0]["passed"], false);
    assert!(
        lines[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the agent broke its sandbox"),
        "{}",
        lines[0]
    );
    assert_eq!(lines[1]["passed"], true, "{}", lines[1]);
}

/// Hack trial: the layer store nearly full (remounted to what its layers hold + the task's
/// 256 MiB disk + 32 MiB), an agent that fails the task, fills its disk and deletes `/opt`
/// (the image's venv must be copied back): its failure is scored 0, never masked as the
/// host's (the store probed without its diff, the copies counted against its disk); the
/// honest agent still scores 1. A store with less free than the task's disk (+ 64 MiB) masks
/// the episode before the agent acts, never a smaller disk for it.
#[test]
fn an_agent_that_fills_the_layer_store_is_scored_not_masked() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let dir = fixture("harbor/venv-path");
    let o = scripted(&s, &rt, &dir, &["touch /app/done".into()]);
    assert_eq!(o.reward, 1.0, "{o:?}");
    let remount = |opt: &str| {
        let ok = std::process::Command::new("mount")
            .args(["-o", opt])
            .arg(s.store.dir())
            .status()
            .unwrap();
        assert!(ok.success(), "mount -o {opt}");
    };
    let st = nix::sys::statvfs::statvfs(s.store.dir()).unwrap();
    let used = (st.blocks() - st.blocks_free()) * st.fragment_size();
    remount(&format!("remount,size={}", used + (64 << 20)));
    let honest = scripted(&s, &rt, &dir, &["touch /app/done".into()]);
    remount(&format!("remount,size={}", used + (288 << 20)));
    let o = scripted(
        &s,
        &rt,
        &dir,
        &[
            "rm -rf /opt && mkdir /opt && dd if=/dev/zero of=/app/fill bs=1M 2>/dev/null; true"
                .into(),
        ],
    );
    remount("remount,size=8g");
    assert!(
        honest.infrastructure && honest.reward.is_nan(),
        "{honest:?}"
    );
    assert!(
        honest.reason.contains("less than the task's disk"),
        "{}",
        honest.reason
    );
    assert!(!o.infrastructure && o.reward == 0.0, "{o:?}");
    let o = scripted(&s, &rt, &dir, &["touch /app/done".into()]);
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// Hack trial: an agent that makes its diff fail to export (a path deeper than `PATH_MAX`:
/// `ENAMETOOLONG` reading its upper directory), on a task with a large disk (4 GiB), scores 0: reading the agent's changes fails on the agent's
/// side, never masked as the host's; the honest agent still scores 1.
#[test]
fn a_diff_the_agent_makes_unexportable_scores_0_not_masked() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let t = copy_fixture("harbor/hello-file");
    let dir = t.path().join("task");
    let toml = std::fs::read_to_string(dir.join("task.toml")).unwrap();
    std::fs::write(
        dir.join("task.toml"),
        toml.replace("storage_mb = 256", "storage_mb = 4096"),
    )
    .unwrap();
    let o = scripted(
        &s,
        &rt,
        &dir,
        &["tr a-z A-Z < /app/word.txt > /app/hello.txt && cd /app && for i in $(seq 2100); do mkdir aaaaaaaa && cd aaaaaaaa || exit 1; done; cd /".into()],
    );
    assert!(!o.infrastructure && o.reward == 0.0, "{o:?}");
    let o = scripted(
        &s,
        &rt,
        &dir,
        &["tr a-z A-Z < /app/word.txt > /app/hello.txt".into()],
    );
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// Hack trial: terminal-bench's standard `run-tests.sh` makes a virtual environment in the
/// working directory and sources its `activate`: one the agent left at
/// `/app/.tbench-testing/bin/activate` that prints a passing line and exits must score 0
/// (the `uv venv` shim makes the directory anew); the honest agent 1, also when it leaves a
/// link to `/tests` there and the script runs `uv venv .tbench-testing/` (the link goes, not
/// `/tests`: 0 before).
#[test]
fn a_venv_the_agent_leaves_for_the_test_script_never_passes_the_tests() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    // The reward of an agent's command on count-lines with this run-tests.sh.
    let reward = |script: &str, agent: &str| {
        let (_t, dir) = edited_fixture("terminal-bench/count-lines", "run-tests.sh", script);
        let o = scripted(&s, &rt, &dir, &[agent.into()]);
        eprintln!("{o:?}");
        o.reward
    };
    let tbench = "#!/bin/bash\ncurl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\nsource $HOME/.local/bin/env\nuv venv .tbench-testing\nsource .tbench-testing/bin/activate\nuv pip install pytest==8.4.1\nuv run pytest $TEST_DIR/test_outputs.py -rA\n";
    let forged = "mkdir -p /app/.tbench-testing/bin && printf 'echo PASSED tests/test_outputs.py::test_count; exit 0\\n' > /app/.tbench-testing/bin/activate";
    let honest = "wc -l < /app/input.txt > /app/count.txt";
    assert_eq!(reward(tbench, forged), 0.0);
    assert_eq!(reward(tbench, honest), 1.0);
    // `uv venv DIR/` over a link the agent left to /tests: the link goes, never /tests.
    let slash = "#!/bin/bash\nuv venv .tbench-testing/\nsource .tbench-testing/bin/activate\nuv run pytest $TEST_DIR/test_outputs.py -rA\n";
    let link = format!("{honest} && ln -s /tests /app/.tbench-testing");
    assert_eq!(reward(slash, &link), 1.0);
}

/// Hack trial: test scripts run `apt-get` and login shells (terminal-bench's `apt-get update;
/// apt-get install -y curl`): an `APT::Update::Pre-Invoke` hook, a `/etc/profile.d` script,
/// a `/etc/profile` or `/etc/bash.bashrc` the agent wrote that forges the answer must score 0
/// (the image's `/etc` for those); the honest agent 1.
#[test]
fn hooks_the_agent_plants_in_etc_never_pass_the_tests() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let (_t, dir) = edited_fixture(
        "harbor/hello-file",
        "tests/test.sh",
        "#!/bin/bash\napt-get update >/dev/null 2>&1\n. /etc/profile >/dev/null 2>&1\nbash -i -c true </dev/null >/dev/null 2>&1\nif grep -qx HELLO /app/hello.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    );
    let forge = "echo HELLO > /app/hello.txt";
    let tricks: Vec<(&str, String)> = vec![
        (
            "an apt Pre-Invoke hook",
            format!("mkdir -p /etc/apt/apt.conf.d && echo 'APT::Update::Pre-Invoke {{\"{forge}\";}};' > /etc/apt/apt.conf.d/00hook"),
        ),
        (
            "a profile.d script",
            format!("mkdir -p /etc/profile.d && echo '{forge}' > /etc/profile.d/zz.sh"),
        ),
        ("/etc/profile", format!("echo '{forge}' >> /etc/profile")),
        (
            "/etc/bash.bashrc",
            format!("echo '{forge}' >> /etc/bash.bashrc"),
        ),
    ];
    for (what, cmd) in &tricks {
        let o = scripted(&s, &rt, &dir, std::slice::from_ref(cmd));
        assert_eq!(o.reward, 0.0, "{what}: {o:?}");
    }
    let o = scripted(
        &s,
        &rt,
        &dir,
        &["tr a-z A-Z < /app/word.txt > /app/hello.txt".into()],
    );
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// Hack trial: the image's `PATH` puts directories the agent can write ahead of `/usr/bin`
/// (a virtual environment in `/opt/venv`, `/app/.venv/bin`, `/root/.local/bin`) and the test
/// script sources uv's `$HOME/.local/bin/env`: a `python3` planted there, the venv replaced
/// (also under a directory made again, so that the image's is hidden), `/root` replaced by a
/// link, or the `env` file rewritten must all score 0; the honest agent 1.
#[test]
fn tools_planted_on_the_images_path_and_in_home_never_pass_the_tests() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let dir = fixture("harbor/venv-path");
    let fake_python = |d: &str| {
        format!("mkdir -p {d} && rm -f {d}/python3 && printf '#!/bin/sh\\nexit 0\\n' > {d}/python3 && chmod 755 {d}/python3")
    };
    let tricks: Vec<(&str, Vec<String>)> = vec![
        (
            "python3 in /app/.venv/bin",
            vec![fake_python("/app/.venv/bin")],
        ),
        (
            "the image's venv's python3 replaced",
            vec![fake_python("/opt/venv/bin")],
        ),
        (
            "the venv deleted and made again (an opaque /opt)",
            vec!["rm -rf /opt".into(), fake_python("/opt/venv/bin")],
        ),
        (
            "python3 in /root/.local/bin, the venv's removed",
            vec![
                "rm /opt/venv/bin/python3".into(),
                fake_python("/root/.local/bin"),
            ],
        ),
        (
            "uv's env file writing the reward",
            vec![
                "printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /root/.local/bin/env"
                    .into(),
            ],
        ),
        (
            "/root replaced by a link to the agent's home",
            vec![
                "mkdir -p /srv/home && cp -a /root/. /srv/home/".into(),
                "printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /srv/home/.local/bin/env"
                    .into(),
                "rm -rf /root && ln -s /srv/home /root".into(),
            ],
        ),
    ];
    for (what, cmds) in &tricks {
        let o = scripted(&s, &rt, &dir, cmds);
        assert_eq!(o.reward, 0.0, "{what}: {o:?}");
    }
    // The honest agent passes: the image's venv and env file are what the tests run, also
    // when the agent's own work made /opt again.
    let o = scripted(&s, &rt, &dir, &["touch /app/done".into()]);
    assert_eq!(o.reward, 1.0, "{o:?}");
    let o = scripted(
        &s,
        &rt,
        &dir,
        &["rm -rf /opt && mkdir -p /opt/other && touch /app/done".into()],
    );
    assert_eq!(o.reward, 1.0, "{o:?}");
}

/// A perturbation's start step (here `zombies`: a parent that never reaps its children) runs
/// again in the sandbox the tests get, after the agent's processes were stopped.
#[test]
fn perturbation_start_steps_run_again_for_the_tests() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let (_t, dir) = edited_fixture(
        "harbor/hello-file",
        "tests/test.sh",
        "#!/bin/bash\nif grep -qs '^State:.Z' /proc/[0-9]*/status; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    );
    let zombies = vec![engine::perturb::parse_spec("zombies:count=2").unwrap()];
    // Unperturbed, the same tests see no zombie.
    for (perturb, reward) in [(zombies, 1.0), (vec![], 0.0)] {
        let agent = Agent::Commands(vec!["true".into()]);
        let host = &on_host();
        let o = harbor::check_task(&rt, &rt, &s.store, &dir, host, &agent, &perturb, 1).unwrap();
        assert_eq!(o.reward, reward, "{o:?}");
    }
}

/// A backend whose sandboxes fail to start once `ok` have started, when `refuse` says so.
struct Flaky<'a> {
    rt: &'a sandbox::Runtime,
    ok: usize,
    made: std::sync::atomic::AtomicUsize,
    refuse: fn(&sandbox::SandboxConfig) -> bool,
}

impl<'a> Flaky<'a> {
    fn new(
        rt: &'a sandbox::Runtime,
        ok: usize,
        refuse: fn(&sandbox::SandboxConfig) -> bool,
    ) -> Self {
        Self {
            rt,
            ok,
            made: Default::default(),
            refuse,
        }
    }
}

impl sandbox::DynBackend for Flaky<'_> {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn keeps_namespaces_across_resets(&self) -> bool {
        true
    }
    fn create_boxed(
        &self,
        cfg: &sandbox::SandboxConfig,
    ) -> Result<Box<dyn sandbox::SandboxOps>, sandbox::SandboxError> {
        let n = self.made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n >= self.ok && (self.refuse)(cfg) {
            return Err(sandbox::SandboxError::Setup(
                "no memory left on this host".into(),
            ));
        }
        self.rt.create_boxed(cfg)
    }
}

fn has_agent_diff(cfg: &sandbox::SandboxConfig) -> bool {
    cfg.layers.first().is_some_and(|l| {
        l.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-agent"))
    })
}

/// Host-side failures are not the agent's: the verifier's sandbox that does not start even
/// without the agent's changes, or a layer store that cannot be written, mask the episode
/// (`infrastructure`, reward NaN, `null` in JSON), never score it 0; a verifier's sandbox
/// that fails only with the agent's changes is the agent's (0).
#[test]
fn host_side_failures_are_masked_not_scored() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let dir = fixture("harbor/reward-trick");
    let honest = Agent::Commands(vec!["touch /app/done".into()]);
    let host = &on_host();
    let run = |b: &dyn sandbox::DynBackend| {
        harbor::check_task(&rt, b, &s.store, &dir, host, &honest, &[], 1).unwrap()
    };
    let host_down = Flaky::new(&rt, 1, |_| true);
    let o = run(&host_down);
    assert!(o.infrastructure && !o.passed && o.reward.is_nan(), "{o:?}");
    assert!(o.reason.contains("infrastructure failure"), "{}", o.reason);
    let j = serde_json::to_value(&o).unwrap();
    assert!(j["reward"].is_null() && j["infrastructure"] == true, "{j}");
    // Only the agent's changes make it fail: the agent's.
    let agents = Flaky::new(&rt, 1, has_agent_diff);
    let o = run(&agents);
    assert!(!o.infrastructure && o.reward == 0.0, "{o:?}");
    assert!(
        o.reason.contains("the agent broke its sandbox"),
        "{}",
        o.reason
    );
    // The first sandbox does not start: before the agent, this host's.
    let none = Flaky::new(&rt, 0, |_| true);
    let o = run(&none);
    assert!(o.infrastructure && o.reward.is_nan(), "{o:?}");
    // The layer store read-only (its image built before): the agent's changes cannot be
    // exported, and the store fails its probe.
    assert_eq!(run(&rt).reward, 1.0);
    let remount = |opt: &str| {
        let ok = std::process::Command::new("mount")
            .args(["-o", opt])
            .arg(s.store.dir())
            .status()
            .unwrap();
        assert!(ok.success(), "mount -o {opt}");
    };
    remount("remount,ro");
    let o = run(&rt);
    remount("remount,rw");
    assert!(o.infrastructure && o.reward.is_nan(), "{o:?}");
    assert!(o.reason.contains("takes no file"), "{}", o.reason);
    assert_eq!(run(&rt).reward, 1.0, "the store works again");
}

/// A template naming a task folder (`task = { harbor = "DIR" }`): `engine harbor run
/// --template` applies its sampled perturbation space to the folder's image, `engine synth`
/// synthesizes each seed's faults on it; the other readers refuse it by name and line; a
/// folder that is not a task is named.
#[test]
fn a_template_naming_a_task_folder_perturbs_its_image() {
    require_root!();
    let t = tempfile::tempdir().unwrap();
    let template = |probability: f64, dir: &Path| {
        let f = t
            .path()
            .join(format!("t{}.toml", (probability * 10.0) as u32));
        std::fs::write(
            &f,
            format!(
                "[template]\nname = \"hello\"\ntask = {{ harbor = \"{}\" }}\n\n[[perturbation_space]]\nname = \"tool-missing\"\nprobability = {probability}\n[perturbation_space.params]\ntool = \"tr\"\n",
                dir.display()
            ),
        )
        .unwrap();
        f
    };
    let st = common::TempState::new();
    let run = |f: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", st.path())
            .args(["harbor", "run", "--json", "--base", "host", "--template"])
            .arg(f)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let j: serde_json::Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {stdout}{}", String::from_utf8_lossy(&out.stderr)));
        j
    };
    let hello = fixture("harbor/hello-file");
    let j = run(&template(1.0, &hello));
    assert_eq!(j["reward"], 0.0, "the oracle needs tr: {j}");
    assert_eq!(
        j["perturbations"][0], "tool-missing: removed /usr/bin/tr",
        "{j}"
    );
    let j = run(&template(0.0, &hello));
    assert_eq!(j["reward"], 1.0, "{j}");
    assert_eq!(j["perturbations"], serde_json::json!([]), "{j}");
    // `engine synth`: each seed's faults synthesized on the folder's image, as a layer.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .args(["synth", "--json", "--count", "2"])
        .arg(template(1.0, &hello))
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let inst = j["instances"].as_array().unwrap();
    assert_eq!(inst.len(), 2, "{j}");
    assert_eq!(inst[1]["seed"], 2);
    assert_eq!(
        inst[0]["applied"][0], "tool-missing: removed /usr/bin/tr",
        "{j}"
    );
    let layer = Path::new(inst[0]["layer"].as_str().unwrap());
    assert!(layer.is_dir() && layer.starts_with(st.path()), "{j}");
    // Elsewhere (task, serve, experiments) such a template is refused by name.
    let e = engine::template::Template::load(&template(1.0, &hello))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(":3:")
            && e.contains("template.task")
            && e.contains("engine harbor run --template"),
        "{e}"
    );
    let e = engine::template::Template::load_any(&template(1.0, t.path()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("template.task.harbor") && e.contains("not a task folder"),
        "{e}"
    );
}
