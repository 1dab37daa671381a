//! The same `Env` on the Docker backend: a task's instance (its layer stacked on a Docker
//! image as a new image) in a container of a private `dockerd` (`sandbox::docker_testing`),
//! solved by its oracle and judged by its verifier, as on the native backend on that image.

use crate::common;
use engine::env::{Action, Env, EnvConfig};
use engine::instance::Plan;
use sandbox::docker::DockerBackend;
use sandbox::docker_testing::{rootfs_tar, Daemon};
use std::sync::Arc;

/// What the tasks' setups, oracles and verifiers run, beyond the shell.
const PROGRAMS: &[&str] = &[
    "sh", "bash", "ls", "cat", "echo", "sleep", "mkdir", "rm", "mv", "cp", "chmod", "chown",
    "touch", "id", "env", "true", "false", "head", "tail", "seq", "wc", "ln", "kill", "printf",
    "tr", "sed", "grep", "sort", "cut", "date", "readlink", "basename", "dirname", "stat", "perl",
    "ldconfig", "find", "tar", "gzip", "setpriv", "runuser", "su", "dd", "mktemp",
];

fn tasks_image(d: &Daemon) -> &'static str {
    static IMAGE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("rootfs.tar");
        rootfs_tar(
            &tar,
            PROGRAMS,
            &[
                "/usr/lib/x86_64-linux-gnu/perl-base",
                "/etc/ld.so.conf",
                "/etc/ld.so.conf.d",
                "/etc/ld.so.cache",
                "/etc/shells",
                "/etc/pam.d",
                "/etc/login.defs",
                "/usr/lib/x86_64-linux-gnu/security",
            ],
        );
        d.import(&tar, "envfactory-test:tasks");
    });
    "envfactory-test:tasks"
}

/// Run the task's oracle as the agent's commands; the last step.
fn solve(env: &mut Env, task: &str, plan: &Plan) -> engine::env::Step {
    env.reset(plan).unwrap();
    let setup = env.task().unwrap().clone();
    let oracle = engine::tasks::get(task).unwrap().oracle(&setup);
    let mut last = None;
    for c in &oracle {
        let s = env.step(&Action::Command(c.clone())).unwrap();
        let done = s.terminated;
        last = Some(s);
        if done {
            break;
        }
    }
    last.expect("the oracle has commands")
}

#[test]
fn env_solves_a_task_on_the_docker_backend_as_on_the_native_one() {
    require_root!();
    let d = require_docker!();
    let image = tasks_image(d);
    let task = "fix-path";
    let mut plan = Plan::for_task(task, 3, vec![]);
    plan.base = format!("docker:{image}");
    let mut native = Env::new(common::runtime(), common::cache(), EnvConfig::default()).unwrap();
    let s = solve(&mut native, task, &plan);
    assert!(s.terminated && s.info.success, "native: {:?}", s.info);

    let backend = Arc::new(DockerBackend::new(d.client(), &d.dir.join("work")));
    let mut docker = Env::new(common::runtime(), common::cache(), EnvConfig::default())
        .unwrap()
        .with_backend(backend);
    assert_eq!(docker.backend_name(), "docker");
    let s = solve(&mut docker, task, &plan);
    assert!(s.terminated && s.info.success, "docker: {:?}", s.info);
    // The next episode of the same instance starts unsolved again (the container recreated).
    let obs = docker.reset(&plan).unwrap();
    let s = docker.step(&Action::Command("true".into())).unwrap();
    assert!(
        !s.info.success && !s.terminated,
        "{:?} {}",
        s.info,
        obs.text
    );
    // What the agent does in one episode is gone in the next.
    docker
        .step(&Action::Command("echo x > /root/left-behind".into()))
        .unwrap();
    docker.reset(&plan).unwrap();
    let s = docker
        .step(&Action::Command("test -e /root/left-behind".into()))
        .unwrap();
    assert_eq!(s.observation.exit_code, Some(1));
    // An instance with fault proxies (restore-service's front proxy) is refused on Docker,
    // where a reset would leave its proxies in the old container's network namespace.
    let mut plan = Plan::for_task("restore-service", 1, vec![]);
    plan.base = format!("docker:{image}");
    let e = docker.reset(&plan).unwrap_err();
    assert!(
        e.to_string().contains("cannot run on the docker backend"),
        "{e}"
    );
    assert!(!e.is_infrastructure(), "{e}");
}

/// The command line: `--rootfs docker:IMAGE` for a native sandbox, and an episode of the
/// oracle with `--backend docker`.
#[test]
fn the_command_line_runs_docker_images_and_the_docker_backend() {
    require_root!();
    let d = require_docker!();
    let image = tasks_image(d);
    let st = common::TempState::new();
    let engine = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_engine"));
        c.env("ENVFACTORY_STATE", st.path())
            .env("DOCKER_HOST", &d.host);
        c
    };
    let o = engine()
        .args([
            "sandbox",
            "exec",
            "--rootfs",
            &format!("docker:{image}"),
            "--",
            "sh",
            "-c",
            "test -x /usr/bin/perl && test ! -e /usr/bin/python3 && echo image",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "image\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = engine()
        .args([
            "episode",
            "--task",
            "fix-path",
            "--seed",
            "2",
            "--base",
            &format!("docker:{image}"),
            "--backend",
            "docker",
            "--agent",
            "oracle",
            "--json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["success"],
        true,
        "{text} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = engine()
        .args([
            "sandbox",
            "exec",
            "--rootfs",
            "docker:envfactory-test:absent",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("docker:envfactory-test:absent")
            && err.contains("not in the local Docker daemon"),
        "{err}"
    );
}

/// SIGTERM during an episode on the Docker backend: the process's containers go with it.
#[test]
fn a_signal_removes_the_containers_of_the_run() {
    require_root!();
    let d = require_docker!();
    let image = tasks_image(d);
    let st = common::TempState::new();
    let dir = tempfile::tempdir().unwrap();
    let actions = dir.path().join("actions");
    std::fs::write(&actions, "sleep 60\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .env("DOCKER_HOST", &d.host)
        .args([
            "episode",
            "--task",
            "fix-path",
            "--base",
            &format!("docker:{image}"),
            "--backend",
            "docker",
            "--actions-file",
        ])
        .arg(&actions)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let owner = format!(
        "label=envfactory.owner={}",
        sandbox::state::identity(child.id() as i32)
    );
    let running = || !d.cli(&["ps", "-q", "--filter", &owner]).is_empty();
    assert!(
        sandbox::testing::eventually(120, running),
        "no container of the episode appeared"
    );
    // The episode's command is running in it (the sleep), then SIGTERM.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: kill with integer arguments: our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let left = d.cli(&["ps", "-aq", "--filter", &owner]);
    assert!(left.is_empty(), "containers left: {left}");
}
