//! SIGINT, SIGTERM and SIGHUP at several moments of `engine run` and `engine sandbox exec`:
//! the exit status is 128 + the signal, what was measured is written (`engine run`), and the
//! run leaves no run directory, mount or cgroup behind.

use crate::common::{is_root, TempState};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn engine_in(st: &TempState) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engine"));
    c.env("ENVFACTORY_STATE", st.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Wait (at most a minute) until `ready` holds; false if the child ended first.
fn wait_for(child: &mut Child, ready: impl Fn() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        if ready() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |t| t.lines().count())
}

/// The runs of `st` still present, and the cgroups and mounts of process `pid`.
pub(crate) fn leftovers(st: &TempState, pid: u32) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(st.path().join("runs"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path().display().to_string())
                .collect()
        })
        .unwrap_or_default();
    let suffix = format!("-{pid}");
    for root in [
        "/sys/fs/cgroup/envfactory",
        "/sys/fs/cgroup/unified/envfactory",
    ] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().ends_with(&suffix) {
                    left.push(e.path().display().to_string());
                }
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let runs = st.path().join("runs");
    for l in mounts.lines() {
        if l.contains(runs.to_str().unwrap()) {
            left.push(l.to_string());
        }
    }
    left
}

fn experiment(dir: &Path) -> PathBuf {
    let cfg = dir.join("exp.toml");
    std::fs::write(
        &cfg,
        format!(
            "[experiment]\nname = \"sig\"\nseeds = [1, 2]\nout_dir = \"{}\"\n\
             [environment]\ntask = \"archive-logs\"\nepisodes = 400\nworkers = 1\n\
             episodes_per_instance = 400\nagent = \"oracle\"\nrequire_certified = false\n",
            dir.display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn each_signal_stops_a_run_cleanly_at_several_moments() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    // (signal, episodes finished before it is sent: 0 = as soon as the run exists)
    for (sig, after) in [
        (libc::SIGINT, 0),
        (libc::SIGTERM, 1),
        (libc::SIGHUP, 5),
        (libc::SIGINT, 20),
    ] {
        let st = TempState::new();
        let dir = tempfile::tempdir().unwrap();
        let cfg = experiment(dir.path());
        let out = dir.path().join("sig");
        let mut child = engine_in(&st)
            .args(["run", cfg.to_str().unwrap()])
            .spawn()
            .unwrap();
        let partial = out.join(".episodes.jsonl.partial");
        let started = wait_for(&mut child, || {
            partial.exists() && (after == 0 || lines(&partial) >= after)
        });
        assert!(started, "signal {sig} after {after}: the run ended first");
        // SAFETY: kill with integer arguments, to our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(128 + sig),
            "{sig} after {after}: {err}"
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
        assert_eq!(report["interrupted"], true, "{report}");
        let written = lines(&out.join("episodes.jsonl"));
        let counted: u64 = report["seeds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["episodes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            written as u64, counted,
            "the report covers the episodes written"
        );
        assert!(written >= after && written < 800, "{written} episodes");
        assert!(!partial.exists());
        assert_eq!(leftovers(&st, pid), Vec::<String>::new(), "{err}");
    }
}

#[test]
fn a_signal_tears_down_a_command_that_does_not_stop_by_itself() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let st = TempState::new();
        let mut child = engine_in(&st)
            .args(["sandbox", "exec", "--timeout", "60s", "--", "sleep", "60"])
            .spawn()
            .unwrap();
        let runs = st.path().join("runs");
        let has_init = || {
            std::fs::read_dir(&runs).is_ok_and(|rd| {
                rd.flatten().any(|r| {
                    std::fs::read_dir(r.path().join("sbx")).is_ok_and(|s| {
                        s.flatten()
                            .any(|e| e.path().extension().is_some_and(|x| x == "init"))
                    })
                })
            })
        };
        assert!(wait_for(&mut child, has_init), "the sandbox never started");
        let pid = child.id();
        // SAFETY: kill with integer arguments, to our own child.
        unsafe { libc::kill(pid as i32, sig) };
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        // `sleep 60` would have exited 0: 128 + sig is the watcher's teardown.
        assert_eq!(o.status.code(), Some(128 + sig), "{err}");
        assert!(err.contains("sandboxes torn down"), "{err}");
        assert_eq!(leftovers(&st, pid), Vec::<String>::new(), "{err}");
    }
}

/// `engine sandbox exec` starts its signal watcher only once its sandbox's init is started
/// (until then it has a single thread, and its init is forked from it): a signal that comes
/// after the handlers are installed and before the watcher runs waits, and tears the run down
/// as soon as the watcher runs. Tried until the signal lands in that window at least once.
#[test]
fn a_signal_while_a_one_shots_sandbox_is_made_tears_it_down() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let threads =
        |pid: u32| std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |rd| rd.count());
    let mut in_window = 0;
    for _ in 0..40 {
        let st = TempState::new();
        let child = engine_in(&st)
            .args(["sandbox", "exec", "--timeout", "60s", "--", "sleep", "60"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let t = Instant::now();
        // Poll without sleeping (the window is a few milliseconds) until the engine catches
        // SIGTERM (its `SigCgt`), then signal it.
        let catches_term = || {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("SigCgt:"))
                    .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                    .is_some_and(|m| m & (1 << (libc::SIGTERM - 1)) != 0)
            })
        };
        let hit = loop {
            if catches_term() {
                break threads(pid) == 1;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the engine never handled SIGTERM"
            );
        };
        // SAFETY: kill with integer arguments, to our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        // Still one thread after the signal was sent: it came before the watcher.
        let hit = hit && threads(pid) == 1;
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(143), "{err}");
        assert!(err.contains("sandboxes torn down"), "{err}");
        assert_eq!(leftovers(&st, pid), Vec::<String>::new(), "{err}");
        if hit {
            in_window += 1;
            if in_window == 3 {
                break;
            }
        }
    }
    assert!(in_window > 0, "no signal came before the watcher started");
}

#[test]
fn a_second_signal_tears_a_run_down_at_once() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let st = TempState::new();
    let dir = tempfile::tempdir().unwrap();
    let cfg = experiment(dir.path());
    let partial = dir.path().join("sig/.episodes.jsonl.partial");
    let mut child = engine_in(&st)
        .args(["run", cfg.to_str().unwrap()])
        .spawn()
        .unwrap();
    assert!(wait_for(&mut child, || lines(&partial) >= 2));
    let pid = child.id();
    for _ in 0..2 {
        // SAFETY: kill with integer arguments, to our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(143), "{err}");
    // Either the run stopped by itself before the second signal was read, or the watcher tore
    // it down: nothing is left behind, and the episodes finished so far are on disk.
    assert_eq!(leftovers(&st, pid), Vec::<String>::new(), "{err}");
    let kept = lines(&partial).max(lines(&dir.path().join("sig/episodes.jsonl")));
    assert!(kept >= 2, "{kept} episodes kept: {err}");
}
