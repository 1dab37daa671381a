//! The Env API on a real task (`archive-logs`): rewards, termination, the step limit, cwd
//! tracking, refused and runaway commands, output floods, infrastructure failures, and episodes
//! that start clean.

use crate::common;

use engine::env::{Action, Env, EnvConfig, RewardConfig, RewardMode};
use engine::instance::Plan;

const TASK: &str = "archive-logs";

fn env(cfg: EnvConfig) -> Env {
    Env::new(common::runtime(), common::cache(), cfg).unwrap()
}

fn cmd(s: &str) -> Action {
    Action::Command(s.into())
}

#[test]
fn oracle_reaches_the_goal_and_is_rewarded_once() {
    require_root!();
    let mut e = env(EnvConfig::default());
    let plan = Plan::for_task(TASK, 3, vec![]);
    let obs = e.reset(&plan).unwrap();
    assert!(!obs.instruction.is_empty());
    assert!(obs.text.contains(&obs.instruction));
    assert!(obs.features.len() > 100);
    let setup = e.task().unwrap().clone();
    let oracle = engine::tasks::get(TASK).unwrap().oracle(&setup);
    let mut last = None;
    for c in &oracle {
        let s = e.step(&cmd(c)).unwrap();
        let done = s.terminated;
        last = Some(s);
        if done {
            break;
        }
    }
    let s = last.unwrap();
    assert!(s.terminated, "{:?}", s.info);
    assert!(s.info.success);
    assert!(!s.truncated);
    // The goal once, on the step that reached it.
    assert!(s.reward >= 1.0 - 0.01 - 1.0, "reward {}", s.reward);
    assert!(matches!(
        e.step(&cmd("true")),
        Err(engine::env::EnvError::EpisodeOver)
    ));
    // The next episode of the same instance starts unsolved, in the same sandbox.
    let pid = e.running().unwrap().sandbox().init_pid();
    e.reset(&plan).unwrap();
    assert_eq!(
        e.running().unwrap().sandbox().init_pid(),
        pid,
        "the sandbox was not reused"
    );
    assert!(!e.verify().unwrap().success);
}

#[test]
fn shaped_rewards_follow_the_config() {
    require_root!();
    let mut e = env(EnvConfig {
        reward: RewardConfig::shaped_demo(),
        ..EnvConfig::default()
    });
    e.reset(&Plan::for_task(TASK, 1, vec![])).unwrap();
    // A successful relevant command: -1 + 10.
    let s = e.step(&cmd("ls /")).unwrap();
    assert_eq!(s.observation.exit_code, Some(0));
    let expect = if s.info.irrelevant { 4.0 } else { 9.0 };
    assert_eq!(s.reward, expect);
    // A failing command: -1 - 20 (and -5 when irrelevant).
    let s = e.step(&cmd("false")).unwrap();
    assert_eq!(s.observation.exit_code, Some(1));
    assert!(s.info.irrelevant);
    assert_eq!(s.reward, -26.0);
    // Sparse: the step cost until the goal.
    let mut e = env(EnvConfig {
        reward: RewardConfig::sparse(),
        ..EnvConfig::default()
    });
    e.reset(&Plan::for_task(TASK, 1, vec![])).unwrap();
    assert_eq!(e.step(&cmd("false")).unwrap().reward, -0.01);
    // A reward that pays for commands outside the shaped mode is refused, naming the field.
    let bad = EnvConfig {
        reward: RewardConfig {
            success: 1.0,
            ..RewardConfig::default()
        },
        ..EnvConfig::default()
    };
    match Env::new(common::runtime(), common::cache(), bad) {
        Err(engine::env::EnvError::BadReward { field, .. }) => assert_eq!(field, "success"),
        Err(e) => panic!("expected BadReward, got {e}"),
        Ok(_) => panic!("expected BadReward"),
    }
}

/// The potential-based reward: each step pays `gamma * Phi(s') - Phi(s)` on top of the step
/// cost, with `Phi` the verifier's progress (0 once solved), so the undiscounted return of an
/// episode is `goal - Phi(s_0)` plus the step costs plus `(gamma - 1)` times the potentials
/// passed through: progress that is undone earns nothing.
#[test]
fn potential_rewards_telescope_over_an_episode() {
    require_root!();
    let mut e = env(EnvConfig::default());
    assert_eq!(e.config().reward.mode, RewardMode::Potential);
    let plan = Plan::for_task(TASK, 2, vec![]);
    e.reset(&plan).unwrap();
    let r = e.config().reward.clone();
    let phi0 = e.progress();
    let setup = e.task().unwrap().clone();
    let oracle = engine::tasks::get(TASK).unwrap().oracle(&setup);
    let (mut ret, mut steps, mut passed) = (0.0, 0.0, 0.0);
    let mut prev = phi0;
    for c in ["ls", "true"].iter().map(|c| c.to_string()).chain(oracle) {
        let s = e.step(&cmd(&c)).unwrap();
        let phi = if s.terminated { 0.0 } else { s.info.progress };
        let expect = r.step + if s.terminated { r.goal } else { 0.0 } + r.gamma * phi - prev;
        assert!((s.reward - expect).abs() < 1e-9, "{} vs {expect}", s.reward);
        ret += s.reward;
        steps += 1.0;
        passed += phi;
        prev = phi;
        if s.terminated {
            break;
        }
    }
    assert!(e.verify().unwrap().success);
    let telescoped = r.goal - phi0 + steps * r.step + (r.gamma - 1.0) * passed;
    assert!((ret - telescoped).abs() < 1e-9, "{ret} vs {telescoped}");
}

#[test]
fn catalogue_actions_cwd_and_bad_indices() {
    require_root!();
    let mut e = env(EnvConfig::default());
    e.reset(&Plan::for_task(TASK, 2, vec![])).unwrap();
    let n = e.task().unwrap().actions.len();
    assert!(n >= 4);
    let s = e.step(&Action::Index(0)).unwrap();
    assert_eq!(
        s.observation.last_command.as_deref(),
        Some(e.task().unwrap().actions[0].as_str())
    );
    match e.step(&Action::Index(n + 5)) {
        Err(engine::env::EnvError::BadAction { index, count, .. }) => {
            assert_eq!((index, count), (n + 5, n));
        }
        other => panic!("expected BadAction, got {other:?}"),
    }
    // cwd persists across steps, like a shell.
    e.step(&cmd("mkdir -p /tmp/w && cd /tmp/w")).unwrap();
    let s = e.step(&cmd("pwd")).unwrap();
    assert_eq!(s.observation.stdout.trim(), "/tmp/w");
    assert_eq!(s.observation.cwd, "/tmp/w");
    // The marker never leaks into what the agent sees.
    assert!(!s.observation.stderr.contains("envfactory-cwd"));
    // A trailing comment does not swallow the epilogue.
    let s = e.step(&cmd("cd / # go home")).unwrap();
    assert_eq!(s.observation.cwd, "/");
}

#[test]
fn an_agent_command_is_parsed_alone_and_its_directory_followed_however_its_shell_ends() {
    require_root!();
    let mut e = env(EnvConfig::default());
    e.reset(&Plan::for_task(TASK, 2, vec![])).unwrap();
    let start = e.last_observation().cwd.clone();
    // A text cut short is the shell's syntax error, as `sh -c` reports it: nothing of it runs,
    // and the engine's epilogue does not complete it (it did for `&&` and `|`, exiting 0).
    let seen = |o: &engine::env::Observation| format!("{:?} {:?} {}", o.exit_code, o.stderr, o.cwd);
    for c in ["cd /tmp &&", "cd /tmp |", "cd /tmp; echo 'open"] {
        let o = e.step(&cmd(c)).unwrap().observation;
        assert_eq!(o.exit_code, Some(2), "{c}: {}", seen(&o));
        assert!(o.stderr.contains("1: Syntax error"), "{c}: {}", seen(&o));
        assert_eq!(o.cwd, start, "{c}");
    }
    // The directory is followed when the command ends the shell itself.
    let o = e.step(&cmd("cd /tmp; exit 3")).unwrap().observation;
    assert_eq!((o.exit_code, o.cwd.as_str()), (Some(3), "/tmp"));
    let o = e
        .step(&cmd("set -e; cd /usr; false; echo not reached"))
        .unwrap()
        .observation;
    assert_eq!(
        (o.exit_code, o.cwd.as_str(), o.stdout.as_str()),
        (Some(1), "/usr", "")
    );
    // The epilogue is not traced by `set -x` (its trace ran into the reported directory, which
    // became `/tmp+ exit 0`) and keeps the status under any `IFS`.
    let o = e.step(&cmd("set -x; cd /tmp")).unwrap().observation;
    assert_eq!(
        (o.exit_code, o.cwd.as_str()),
        (Some(0), "/tmp"),
        "{}",
        seen(&o)
    );
    assert_eq!(o.stderr, "+ cd /tmp\n");
    let o = e.step(&cmd("IFS=0; cd /usr; exit 10")).unwrap().observation;
    assert_eq!(
        (o.exit_code, o.cwd.as_str()),
        (Some(10), "/usr"),
        "{}",
        seen(&o)
    );
    // An unterminated here-document reads nothing of the engine's (it took the epilogue as its
    // body and printed the marker).
    let o = e.step(&cmd("cat <<EOF")).unwrap().observation;
    assert_eq!((o.exit_code, o.stdout.as_str()), (Some(0), ""));
    assert!(!o.stderr.contains("envfactory-cwd"), "{}", seen(&o));
    assert_eq!(o.cwd, "/usr");
    // Line numbers in the shell's messages are the command's own (the unterminated quote above
    // is line 1's error, as `sh -c` reports it, where it was line 2's).
    let o = e.step(&cmd("cd /\nno-such-tool-here")).unwrap().observation;
    assert_eq!(o.exit_code, Some(127));
    assert!(
        o.stderr.contains("2: no-such-tool-here: not found"),
        "{}",
        seen(&o)
    );
    assert_eq!(o.cwd, "/");
}

#[test]
fn dangerous_hanging_and_flooding_commands_end_their_step_cleanly() {
    require_root!();
    let mut e = env(EnvConfig {
        step_timeout_ms: 300,
        output_cap: 4096,
        max_steps: Some(50),
        ..EnvConfig::default()
    });
    e.reset(&Plan::for_task(TASK, 1, vec![])).unwrap();
    let s = e.step(&cmd("rm -rf /")).unwrap();
    assert!(s.info.dangerous.is_some());
    assert!(s.observation.stderr.contains("refused"));
    // The step's cost (the default reward charges nothing more for a refused command).
    assert_eq!(s.reward, -0.01);
    // The refused command did not run.
    assert!(
        e.step(&cmd("test -d /usr/bin"))
            .unwrap()
            .observation
            .exit_code
            == Some(0)
    );
    let s = e.step(&cmd("sleep 30")).unwrap();
    assert!(s.info.timeout);
    assert_eq!(s.observation.exit_code, Some(124));
    assert!(s.observation.stderr.contains("timed out"));
    let s = e.step(&cmd("yes flood")).unwrap();
    assert!(s.info.timeout);
    assert!(s.observation.stdout_truncated);
    assert!(s.observation.stdout.len() <= e.config().observation_bytes);
    // The env keeps working, and is not marked as failed infrastructure.
    let s = e.step(&cmd("echo alive")).unwrap();
    assert_eq!(s.observation.stdout.trim(), "alive");
    assert!(!s.info.infra_failure);
}

#[test]
fn a_wrecked_sandbox_is_an_infra_failure_and_the_next_episode_starts_clean() {
    require_root!();
    let mut e = env(EnvConfig::default());
    let plan = Plan::for_task(TASK, 4, vec![]);
    e.reset(&plan).unwrap();
    // The agent wrecks its files: an agent failure, not infrastructure.
    let s = e
        .step(&cmd(
            "rm -rf --one-file-system /srv /etc/passwd 2>/dev/null; echo done",
        ))
        .unwrap();
    assert!(!s.info.infra_failure);
    // The sandbox itself dies (from outside): infrastructure.
    let pid = e.running().unwrap().sandbox().init_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let s = e.step(&cmd("ls")).unwrap();
    assert!(s.info.infra_failure, "{:?}", s.info);
    assert!(s.truncated);
    assert_eq!(s.reward, 0.0);
    // Next episode: a fresh sandbox with the instance intact.
    e.reset(&plan).unwrap();
    assert_ne!(e.running().unwrap().sandbox().init_pid(), pid);
    let s = e.step(&cmd("test -f /etc/passwd && echo ok")).unwrap();
    assert_eq!(s.observation.stdout.trim(), "ok");
}

/// Processes the agent left behind that fill the sandbox's pids limit make the next command
/// fail to start: that is the agent's doing (a failed step that costs it), never an
/// infrastructure failure that would end the episode unscored. Also when the agent killed the
/// zygote first (init must then fork a new one, which the full limit refuses too). The reverse
/// direction (the sandbox dies from outside) is `a_wrecked_sandbox_is_an_infra_failure_...`.
#[test]
fn processes_the_agent_left_that_fill_the_pids_limit_are_its_own_failure() {
    require_root!();
    let mut e = env(EnvConfig::default());
    let plan = Plan::for_task(TASK, 5, vec![]);
    for bomb in [
        "perl -e 'fork while 1' >/dev/null 2>&1 & sleep 1; true",
        // The zygote is pid 2 of the sandbox's pid namespace.
        "perl -e 'fork while 1' >/dev/null 2>&1 & sleep 1; kill -9 2; true",
    ] {
        e.reset(&plan).unwrap();
        let s = e.step(&cmd(bomb)).unwrap();
        assert!(!s.info.infra_failure, "{bomb}: {:?}", s.info);
        let (current, max) = e.running().unwrap().sandbox().pids_usage();
        assert!(
            max.is_some_and(|m| current + 8 >= m),
            "{current} of {max:?}"
        );
        let mut refused = None;
        for _ in 0..5 {
            let s = e.step(&cmd("echo hi")).unwrap();
            assert!(!s.info.infra_failure, "{bomb}: {:?}", s.info);
            assert!(!s.truncated && !s.terminated, "the episode goes on");
            if s.observation.exit_code != Some(0) {
                refused = Some(s);
                break;
            }
        }
        let s = refused.expect("with every pid taken, a command cannot start");
        assert!(
            s.observation.stderr.contains("pids"),
            "{bomb}: the agent is told why: {}",
            s.observation.stderr
        );
        // The step cost what a failed command costs (no masked, zero-reward escape).
        assert!(s.reward < 0.0, "{}", s.reward);
    }
    // A reset kills them; the next episode works.
    e.reset(&plan).unwrap();
    let s = e.step(&cmd("echo hi")).unwrap();
    assert_eq!(s.observation.stdout.trim(), "hi");
}

#[test]
fn the_step_limit_truncates() {
    require_root!();
    let mut e = env(EnvConfig {
        max_steps: Some(3),
        ..EnvConfig::default()
    });
    e.reset(&Plan::for_task(TASK, 1, vec![])).unwrap();
    assert!(!e.step(&cmd("true")).unwrap().truncated);
    assert!(!e.step(&cmd("true")).unwrap().truncated);
    let s = e.step(&cmd("true")).unwrap();
    assert!(s.truncated && !s.terminated);
}

#[test]
fn a_vanished_cwd_or_late_stderr_is_the_agents_problem_not_infrastructure() {
    require_root!();
    let mut e = env(EnvConfig::default());
    e.reset(&Plan::for_task(TASK, 6, vec![])).unwrap();
    let s = e
        .step(&cmd("mkdir -p /tmp/d && cd /tmp/d && rmdir /tmp/d"))
        .unwrap();
    assert!(!s.info.infra_failure);
    let s = e.step(&cmd("pwd")).unwrap();
    assert!(!s.info.infra_failure, "{:?}", s.info);
    assert!(!s.truncated);
    let s = e.step(&cmd("pwd")).unwrap();
    assert_eq!(s.observation.exit_code, Some(0), "{}", s.observation.stderr);
    assert!(s.observation.cwd.starts_with('/'));
    // A background writer to stderr after the command ends cannot corrupt the cwd.
    e.step(&cmd("cd /tmp; (sleep 0.2; echo late >&2) &"))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    let s = e.step(&cmd("pwd")).unwrap();
    assert_eq!(s.observation.stdout.trim(), "/tmp");
    assert_eq!(s.observation.cwd, "/tmp");
    // Hack trial: a working directory longer than the kernel takes (a `PWD` the agent sets, or
    // a deep enough `cd`) must not end the episode as the environment's failure (no reward,
    // masked: a way out of any episode). It is the agent's bad path: no listing.
    let long = format!("/{}", "a".repeat(5000));
    let s = e.step(&cmd(&format!("export PWD={long}"))).unwrap();
    assert!(!s.info.infra_failure, "{:?}", s.info);
    assert!(!s.terminated && !s.truncated);
    assert!(
        s.observation.listing.is_empty(),
        "{:?}",
        s.observation.listing
    );
    // The next command cannot start there: the agent's failed step, and the cwd is / again.
    let s = e.step(&cmd("pwd")).unwrap();
    assert!(!s.info.infra_failure, "{:?}", s.info);
    assert_eq!(s.observation.exit_code, Some(127));
    assert_eq!(s.observation.cwd, "/");
}

#[test]
fn a_command_without_a_shell_cannot_forge_the_cwd_report() {
    require_root!();
    let mut e = env(EnvConfig::default());
    e.reset(&Plan::for_task(TASK, 8, vec![])).unwrap();
    // A program (run as its words, with no shell and so no epilogue) prints what the epilogue
    // would print, nonce-less: the tracked directory stays, and its stderr reaches the agent
    // whole.
    let forge = "printf '#!/bin/sh\\nprintf \\036envfactory-cwd:/etc >&2\\n' > /tmp/forge && chmod +x /tmp/forge";
    let s = e.step(&cmd(&format!("cd /tmp && {forge}"))).unwrap();
    assert_eq!(s.observation.exit_code, Some(0), "{}", s.observation.stderr);
    assert_eq!(s.observation.cwd, "/tmp");
    let s = e.step(&cmd("/tmp/forge")).unwrap();
    assert_eq!(s.observation.cwd, "/tmp");
    // (The observation escapes control characters.)
    assert_eq!(s.observation.stderr, "\\x1eenvfactory-cwd:/etc");
    let s = e.step(&cmd("pwd")).unwrap();
    assert_eq!(s.observation.stdout.trim(), "/tmp");
    // A command that needs no shell keeps the directory a `cd` gave.
    let s = e.step(&cmd("ls /")).unwrap();
    assert_eq!(s.observation.cwd, "/tmp");
}

#[test]
fn catalogue_actions_are_refused_by_the_patterns_and_the_actions_of_their_own_task() {
    require_root!();
    let mut e = env(EnvConfig {
        dangerous: vec!["^pwd$".into()],
        ..EnvConfig::default()
    });
    e.reset(&Plan::for_task(TASK, 3, vec![])).unwrap();
    assert_eq!(e.task().unwrap().actions[0], "pwd");
    // Refused at every use (from the verdict found when the instance started), as its text is.
    for a in [Action::Index(0), Action::Index(0), cmd("pwd")] {
        let s = e.step(&a).unwrap();
        assert_eq!(s.info.dangerous.as_deref(), Some("^pwd$"), "{a:?}");
        assert_eq!(s.observation.exit_code, Some(126));
    }
    // A new episode of the same instance (its verdicts kept) refuses it as before.
    e.reset(&Plan::for_task(TASK, 3, vec![])).unwrap();
    let s = e.step(&Action::Index(0)).unwrap();
    assert_eq!(s.info.dangerous.as_deref(), Some("^pwd$"));
    // Another task's action 0 is another command: judged as itself, not as `pwd` was.
    e.reset(&Plan::for_task("free-disk", 3, vec![])).unwrap();
    assert_ne!(e.task().unwrap().actions[0], "pwd");
    let s = e.step(&Action::Index(0)).unwrap();
    assert_eq!(s.info.dangerous, None);
    assert_eq!(s.observation.exit_code, Some(0), "{}", s.observation.stderr);
    e.reset(&Plan::for_task(TASK, 3, vec![])).unwrap();
    let s = e.step(&Action::Index(0)).unwrap();
    assert_eq!(s.info.dangerous.as_deref(), Some("^pwd$"));
}

#[test]
fn a_fifo_where_the_verifier_reads_neither_hangs_nor_passes() {
    require_root!();
    let mut e = env(EnvConfig::default());
    e.reset(&Plan::for_task(TASK, 7, vec![])).unwrap();
    let s = e.step(&cmd("mkfifo /logs.tar.gz")).unwrap();
    assert!(!s.info.infra_failure, "{:?}", s.info);
    assert!(!s.info.success);
    let s = e.step(&cmd("ls -l /logs.tar.gz")).unwrap();
    assert!(
        s.observation.stdout.starts_with('p'),
        "{}",
        s.observation.stdout
    );
    assert!(!s.info.infra_failure);
}
