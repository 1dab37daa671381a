#![allow(clippy::unwrap_used)]
//! Every task family, seeds 1..=3: the fresh instance fails, the oracle's commands make it pass,
//! every hack trial (each on a fresh episode) fails, a restart brings back the unsolved state,
//! and setup is deterministic.

mod common;

use engine::live::{synthesize, Live};
use engine::synth::{BaseView, Plan};
use std::time::Duration;

fn exercise(name: &str) {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 16, 1 << 30).unwrap();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let base = BaseView::new(&rootfs);
    let task = engine::tasks::get(name).unwrap();
    let mut facts_seen = Vec::new();
    for seed in 1..=3u64 {
        let plan = Plan::for_task(name, seed, vec![]);
        // Deterministic: the same plan builds the same layer, settings and setup.
        let (l1, r1, s1, _) = engine::synth::build(&plan, &base).unwrap();
        let (l2, r2, s2, _) = engine::synth::build(&plan, &base).unwrap();
        assert_eq!(l1.entries, l2.entries, "{name} seed {seed}: layer differs");
        assert_eq!(r1, r2, "{name} seed {seed}: runtime differs");
        assert_eq!(s1, s2, "{name} seed {seed}: setup differs");
        let held = synthesize(&rt, &cache, &plan).unwrap();
        assert_eq!(
            held.instance.id,
            engine::synth::instance_id(&plan, &rootfs.digest)
        );
        let setup = held.instance.task.clone().unwrap();
        assert_eq!(Some(&setup), s1.as_ref());
        assert!(!setup.instruction.is_empty() && setup.actions.len() >= 8);
        facts_seen.push(setup.facts.clone());
        let mut live = Live::start(&rt, held).unwrap();

        let v = task.verify(&setup, &mut live.probe()).unwrap();
        assert!(!v.success, "{name} seed {seed}: solved at the start");

        for cmd in task.oracle(&setup) {
            let r = live.run(&cmd, Duration::from_secs(60)).unwrap();
            assert!(
                r.success(),
                "{name} seed {seed}: oracle command failed ({}): {cmd}\n{}\n{}",
                r.exit_code(),
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            );
        }
        let v = task.verify(&setup, &mut live.probe()).unwrap();
        assert!(
            v.success,
            "{name} seed {seed}: oracle failed: {:?}",
            v.reasons
        );
        assert!((v.progress - 1.0).abs() < 1e-9);

        live.restart().unwrap();
        let v = task.verify(&setup, &mut live.probe()).unwrap();
        assert!(!v.success, "{name} seed {seed}: solved after a restart");

        let trials = task.hack_trials(&setup);
        assert!(!trials.is_empty());
        for trial in trials {
            live.restart().unwrap();
            for cmd in &trial.commands {
                // A trial may kill its own shell (kill -9 -1): only the final state counts.
                let _ = live.run(cmd, Duration::from_secs(30)).unwrap();
            }
            let v = task.verify(&setup, &mut live.probe()).unwrap();
            assert!(
                !v.success,
                "{name} seed {seed}: hack trial `{}` passed",
                trial.name
            );
        }
    }
    // Seeds make different worlds.
    assert_ne!(facts_seen[0], facts_seen[1], "{name}: seeds 1 and 2 agree");
}

#[test]
fn archive_logs() {
    exercise("archive-logs");
}

#[test]
fn archive_logs_oracle_survives_missing_tar_and_find() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 4, 1 << 30).unwrap();
    let task = engine::tasks::get("archive-logs").unwrap();
    let held = synthesize(&rt, &cache, &Plan::for_task("archive-logs", 5, vec![])).unwrap();
    let setup = held.instance.task.clone().unwrap();
    let mut live = Live::start(&rt, held).unwrap();
    let r = live
        .run("rm -f /usr/bin/tar /usr/bin/find", Duration::from_secs(10))
        .unwrap();
    assert!(r.success());
    for cmd in task.oracle(&setup) {
        let r = live.run(&cmd, Duration::from_secs(60)).unwrap();
        assert!(r.success(), "{}", String::from_utf8_lossy(&r.stderr));
    }
    let v = task.verify(&setup, &mut live.probe()).unwrap();
    assert!(v.success, "{:?}", v.reasons);
}

#[test]
fn free_disk() {
    exercise("free-disk");
}

#[test]
fn restore_service() {
    exercise("restore-service");
}

#[test]
fn repair_config() {
    exercise("repair-config");
}

#[test]
fn kill_runaway() {
    exercise("kill-runaway");
}

#[test]
fn fix_permissions() {
    exercise("fix-permissions");
}

#[test]
fn every_task_is_registered_once() {
    let names = engine::tasks::names();
    assert_eq!(names.len(), 6);
    for n in &names {
        assert_eq!(engine::tasks::get(n).unwrap().name(), *n);
    }
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len());
}
