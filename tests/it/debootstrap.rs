//! `--rootfs debootstrap:SUITE` as a user runs it and stops it: a build whose engine is killed
//! (SIGKILL: nothing of the engine runs after it) ends with it, leaving no process of the
//! build, and the next engine makes the suite (the lock is free) and runs on it; and the
//! factory's tasks on a Debian suite made from the archive.

use crate::common;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Processes whose command line starts with `token` (the stand-in's sleepers, which only this
/// test starts); killed by pid when dropped, so a failed test leaves none.
struct Sleepers(String);

impl Sleepers {
    fn pids(&self) -> Vec<i32> {
        sandbox::testing::pids_with_cmdline_prefix(&self.0)
    }
}

/// `engine` over the state directory `state`.
fn engine_in(state: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engine"));
    c.env("ENVFACTORY_STATE", state);
    c
}

/// An engine process, killed and reaped when dropped (a failed assertion leaves none).
struct Engine(std::process::Child);

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[test]
fn a_build_dies_with_its_engine_and_the_next_engine_makes_the_suite() {
    require_root!();
    let state = common::TempState::new();
    let t = tempfile::tempdir().unwrap();
    let sleepers = Sleepers(format!("ef-debootstrap-sleeper-{}", std::process::id()));
    let fake = t.path().join("debootstrap");
    let copies = sandbox::testing::minimal_root_copies("4");
    // debootstrap's arguments after `--force-check-gpg --variant=minbase --arch=A`: SUITE
    // TARGET MIRROR; `hang` leaves a sleeper outside the build's process group.
    std::fs::write(
        &fake,
        format!(
            "#!/bin/bash\nset -e\nshift 3\n\
             if [ \"$(cat {dir}/mode)\" = hang ]; then\n\
             setsid bash -c 'exec -a {token} sleep 1000' & wait; exit 0\nfi\n\
             set -- x x x \"$2\"\n{copies}mkdir -p \"$4/etc\" \"$4/root\" \"$4/tmp\"; echo 13.99 > \"$4/etc/debian_version\"\n",
            dir = t.path().display(),
            token = sleepers.0,
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mode = |m: &str| std::fs::write(t.path().join("mode"), m).unwrap();
    // Output into files (a pipe nobody reads while the test polls could stall the engine).
    let (stdout, stderr) = (t.path().join("stdout"), t.path().join("stderr"));
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let engine = || {
        let mut c = engine_in(state.path());
        c.env("ENVFACTORY_DEBOOTSTRAP", &fake)
            .env("ENVFACTORY_DEBIAN_MIRROR", "http://mirror.invalid/debian")
            .env_remove("ENVFACTORY_LOG")
            .args(["sandbox", "exec", "--rootfs", "debootstrap:trixie", "--"])
            .args(["/bin/sh", "-c", "cat /etc/debian_version"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        Engine(c.spawn().unwrap())
    };

    mode("hang");
    let mut first = engine();
    let started = Instant::now();
    while sleepers.pids().is_empty() {
        let exited = first.0.try_wait().unwrap();
        assert!(
            exited.is_none() && started.elapsed() < Duration::from_secs(30),
            "the stand-in never started ({exited:?}): {}",
            read(&stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(first); // SIGKILL: nothing of the engine runs after it
    assert!(
        sandbox::testing::eventually(10, || sleepers.pids().is_empty()),
        "the build outlived its engine: {:?}",
        sleepers.pids()
    );

    mode("ok");
    let mut second = engine();
    let started = Instant::now();
    let status = loop {
        if let Some(st) = second.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the next build waited past 60 s (the suite's lock still held?): {}",
            read(&stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", read(&stderr));
    assert_eq!(read(&stdout), "13.99\n");
}

/// The factory's own tasks on another Debian than the host's: on `debootstrap:trixie` (made
/// from the archive in this test's state directory), every task's scripted oracle solves a
/// seeded instance, judged by its verifier, as on the `host` base.
#[test]
fn every_task_is_solved_by_its_oracle_on_a_debootstrapped_suite() {
    require_root!();
    let state = common::TempState::new();
    let made = engine_in(state.path())
        .args(["sandbox", "exec", "--rootfs", "debootstrap:trixie", "--"])
        .args(["/bin/sh", "-c", "cat /etc/debian_version"])
        .output()
        .unwrap();
    assert!(
        made.status.success() && String::from_utf8_lossy(&made.stdout).starts_with("13."),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // An episode's commands run on trixie there, and on this host's own system without it.
    let acts = state.path().join("actions.txt");
    std::fs::write(&acts, "grep -q '^13[.]' /etc/debian_version\n").unwrap();
    let first_exit = |base: &[&str]| {
        let o = engine_in(state.path())
            .args([
                "episode",
                "--task",
                "archive-logs",
                "--json",
                "--actions-file",
            ])
            .arg(&acts)
            .args(base)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        let first: serde_json::Value =
            serde_json::from_str(text.lines().next().unwrap_or("{}")).unwrap();
        first["exit"].clone()
    };
    assert_eq!(first_exit(&["--base", "debootstrap:trixie"]), 0);
    if sandbox::debootstrap::host_suite().is_some_and(|s| s.name() != "trixie") {
        assert_eq!(first_exit(&[]), 1);
    }
    for task in engine::tasks::names() {
        let o = engine_in(state.path())
            .args(["episode", "--task", task, "--seed", "3"])
            .args([
                "--base",
                "debootstrap:trixie",
                "--agent",
                "oracle",
                "--json",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        let last: serde_json::Value =
            serde_json::from_str(text.lines().last().unwrap_or("{}")).unwrap();
        assert_eq!(
            last["success"],
            true,
            "{task}: {text} {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
