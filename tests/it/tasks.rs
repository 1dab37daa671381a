//! Every task family, seeds 1..=3: the fresh instance fails, the oracle's commands make it pass,
//! a restart brings back the unsolved state, and setup is deterministic. The trials of every
//! task (its data file, `engine/tasks/trials/<task>.trials`), on seeds 3 and 7: each hack
//! fails and each honest alternative succeeds, each on a fresh episode.

use crate::common;

use engine::instance::{BaseView, Plan};
use engine::running::{synthesize, RunningInstance};
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
            engine::instance::instance_id(&plan, &rootfs.digest)
        );
        let setup = held.instance.task.clone().unwrap();
        assert_eq!(Some(&setup), s1.as_ref());
        assert!(!setup.instruction.is_empty() && setup.actions.len() >= 8);
        facts_seen.push(setup.facts.clone());
        let mut running = RunningInstance::start(&rt, held).unwrap();

        let v = running.judge().unwrap();
        assert!(!v.success, "{name} seed {seed}: solved at the start");

        for cmd in task.oracle(&setup) {
            let r = running.run(&cmd, Duration::from_secs(60)).unwrap();
            assert!(
                r.success(),
                "{name} seed {seed}: oracle command failed ({}): {cmd}\n{}\n{}",
                r.exit_code(),
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            );
        }
        let v = running.judge().unwrap();
        assert!(
            v.success,
            "{name} seed {seed}: oracle failed: {:?}",
            v.reasons
        );
        assert!((v.progress - 1.0).abs() < 1e-9);

        running.restart().unwrap();
        let v = running.judge().unwrap();
        assert!(!v.success, "{name} seed {seed}: solved after a restart");
    }
    // Seeds make different worlds.
    assert_ne!(facts_seen[0], facts_seen[1], "{name}: seeds 1 and 2 agree");
}

/// The one test that runs every trials file (adding a trial is a one-file change).
#[test]
fn every_hack_trial_fails_and_every_honest_trial_succeeds() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 32, 1 << 30).unwrap();
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for task in engine::tasks::all() {
        let name = task.name();
        let (mut hacks, mut honest) = (0, 0);
        for seed in [3u64, 7] {
            let held = synthesize(&rt, &cache, &Plan::for_task(name, seed, vec![])).unwrap();
            let setup = held.instance.task.clone().unwrap();
            let trials = engine::tasks::trials::for_task(task, &setup).unwrap();
            let mut running = RunningInstance::start(&rt, held).unwrap();
            for t in trials {
                running.restart().unwrap();
                running.cwd = setup.cwd.clone();
                for cmd in &t.commands {
                    // A trial may kill its own shell (kill -9 -1): only the final state counts.
                    let _ = running.run(cmd, Duration::from_secs(30)).unwrap();
                }
                let v = running.judge().unwrap();
                let want = t.kind == engine::tasks::trials::TrialKind::Honest;
                eprintln!(
                    "{name} seed {seed} {:?} `{}`: success {} {:?}",
                    t.kind, t.name, v.success, v.reasons
                );
                match t.kind {
                    engine::tasks::trials::TrialKind::Hack => hacks += 1,
                    engine::tasks::trials::TrialKind::Honest => honest += 1,
                }
                if v.success != want {
                    failures.push(format!(
                        "{name} seed {seed} {:?} `{}` (line {}): success {} {:?}",
                        t.kind, t.name, t.line, v.success, v.reasons
                    ));
                }
            }
        }
        counts.push(format!("{name}: {hacks} hack and {honest} honest runs"));
    }
    eprintln!("{}", counts.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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
    let mut running = RunningInstance::start(&rt, held).unwrap();
    let r = running
        .run("rm -f /usr/bin/tar /usr/bin/find", Duration::from_secs(10))
        .unwrap();
    assert!(r.success());
    for cmd in task.oracle(&setup) {
        let r = running.run(&cmd, Duration::from_secs(60)).unwrap();
        assert!(r.success(), "{}", String::from_utf8_lossy(&r.stderr));
    }
    let v = running.judge().unwrap();
    assert!(v.success, "{:?}", v.reasons);
}

/// A squatter on the service's port (the `port already taken` fault) does not stop the oracle.
#[test]
fn restore_service_oracle_evicts_a_squatter() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 4, 1 << 30).unwrap();
    let task = engine::tasks::get("restore-service").unwrap();
    for seed in [1, 4] {
        let held = synthesize(
            &rt,
            &cache,
            &Plan::for_task("restore-service", seed, vec![]),
        )
        .unwrap();
        let setup = held.instance.task.clone().unwrap();
        let port = setup.facts["port"].as_u64().unwrap();
        let mut running = RunningInstance::start(&rt, held).unwrap();
        let r = running
            .run(
                &format!(
                    "(python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null &); \
                     for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.05; done; exit 1"
                ),
                Duration::from_secs(20),
            )
            .unwrap();
        assert!(r.success(), "the squatter did not start");
        for cmd in task.oracle(&setup) {
            let r = running.run(&cmd, Duration::from_secs(60)).unwrap();
            assert!(r.success(), "{}", String::from_utf8_lossy(&r.stderr));
        }
        let v = running.judge().unwrap();
        assert!(v.success, "{:?}", v.reasons);
    }
}

/// `restore-service` follows the fault proxy's port convention: network perturbations with
/// their default ports land on its front proxy (the agent's view slows down, the service is
/// reached directly by the verifier), and `port-taken`'s default squats the service's own port,
/// which the oracle then clears.
#[test]
fn restore_service_front_takes_network_faults_and_port_taken_squats_its_port() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 4, 1 << 30).unwrap();
    let task = engine::tasks::get("restore-service").unwrap();
    let chosen = ["net-latency:ms=400", "port-taken"]
        .iter()
        .map(|s| engine::perturb::parse_spec(s).unwrap())
        .collect();
    let plan = Plan::for_task("restore-service", 2, chosen);
    let held = synthesize(&rt, &cache, &plan).unwrap();
    // One proxy: the task's front, carrying the latency.
    let proxies = &held.instance.runtime.proxies;
    assert_eq!(proxies.len(), 1, "{proxies:?}");
    assert_eq!(
        (proxies[0].listen_port, proxies[0].upstream_port),
        (8080, 18080)
    );
    assert_eq!(proxies[0].toxics.latency_ms, 400);
    let setup = held.instance.task.clone().unwrap();
    assert_eq!(setup.facts["port"].as_u64(), Some(18080));
    assert!(setup.instruction.contains("http://127.0.0.1:8080/"));
    let mut running = RunningInstance::start(&rt, held).unwrap();
    // The squatter answers 503 on the service port through the front.
    let r = running
        .run(
            "curl -s -m 5 http://127.0.0.1:8080/",
            Duration::from_secs(10),
        )
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&r.stdout).contains("token="),
        "solved before the start: {}",
        String::from_utf8_lossy(&r.stdout)
    );
    for cmd in task.oracle(&setup) {
        let r = running.run(&cmd, Duration::from_secs(60)).unwrap();
        assert!(r.success(), "{}", String::from_utf8_lossy(&r.stderr));
    }
    // Through the front, the real service answers, and a request pays the latency both ways
    // (asked before the judgement, whose confirmation restarts the service and leaves nothing
    // running).
    let t0 = std::time::Instant::now();
    let r = running
        .run(
            "curl -s -m 10 'http://127.0.0.1:8080/status?nonce=abc'",
            Duration::from_secs(15),
        )
        .unwrap();
    let took = t0.elapsed();
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(out.contains(" ok\ntoken="), "{out}");
    assert!(took >= Duration::from_millis(800), "no latency: {took:?}");
    let v = running.judge().unwrap();
    assert!(v.success, "{:?}", v.reasons);
}

/// A perturbation that breaks the task's own start (a read-only `/var/log`, where free-disk
/// writes its junk) certifies as unsolvable with the reason, not as an error, so `Env` refuses
/// the instance as uncertified instead of counting an infrastructure failure.
#[test]
fn an_instance_that_cannot_start_is_certified_unsolvable() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 8, 1 << 30).unwrap();
    let spec = engine::certify::CheckSpec {
        task: "free-disk".into(),
        base: "host".into(),
        singles: vec![engine::perturb::parse_spec("read-only-dir:path=/var/log").unwrap()],
        combos: 0,
        seeds: vec![1],
        workers: 1,
    };
    let rows = engine::certify::check(&rt, &cache, &spec);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].status, "solvable", "{rows:?}");
    assert_eq!(rows[1].status, "unsolvable", "{rows:?}");
    assert!(
        rows[1].reason.contains("does not start") && rows[1].reason.contains("Read-only"),
        "{rows:?}"
    );
    // The certificate is stored: asking again gives the same verdict without a sandbox.
    let rows2 = engine::certify::check(&rt, &cache, &spec);
    assert_eq!(rows2[1].status, "unsolvable");
}

/// The jobs of fix-path and fix-permissions call `mv`; with `libacl.so.1` gone it cannot run,
/// and the oracles give the job a working one: those instances stay solvable.
#[test]
fn oracles_finish_the_job_when_mv_cannot_load_its_library() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 8, 1 << 30).unwrap();
    for task in ["fix-path", "fix-permissions"] {
        let spec = engine::certify::CheckSpec {
            task: task.into(),
            base: "host".into(),
            singles: vec![
                engine::perturb::parse_spec("library-missing:library=libacl.so.1").unwrap(),
            ],
            combos: 0,
            seeds: vec![2],
            workers: 1,
        };
        let rows = engine::certify::check(&rt, &cache, &spec);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(
            rows.iter().all(|r| r.status == "solvable"),
            "{task}: {rows:?}"
        );
    }
}

/// The oracles use absolute paths and a clean environment: a `PATH` that finds only failing
/// impostors of every tool they could call does not stop them.
#[test]
fn oracles_ignore_a_hostile_path() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 16, 1 << 30).unwrap();
    let tools = "tar find gzip rm perl python3 sh chmod chown kill pkill setpriv runuser env \
                 printf mkdir cat id mv sleep head dd";
    for task in engine::tasks::all() {
        let plan = Plan::for_task(task.name(), 1, vec![]);
        let held = synthesize(&rt, &cache, &plan).unwrap();
        let setup = held.instance.task.clone().unwrap();
        let mut running = RunningInstance::start(&rt, held).unwrap();
        let r = running
            .run(
                &format!(
                    "mkdir -p /opt/impostors && for t in {tools}; do \
                     printf '#!/bin/sh\\necho impostor >&2\\nexit 1\\n' > /opt/impostors/$t; \
                     chmod 755 /opt/impostors/$t; done"
                ),
                Duration::from_secs(10),
            )
            .unwrap();
        assert!(r.success(), "{}", String::from_utf8_lossy(&r.stderr));
        running.env.retain(|kv| !kv.starts_with("PATH="));
        running.env.push("PATH=/opt/impostors".into());
        let r = running
            .run("tar --version", Duration::from_secs(10))
            .unwrap();
        assert!(!r.success() && String::from_utf8_lossy(&r.stderr).contains("impostor"));
        for cmd in task.oracle(&setup) {
            let r = running.run(&cmd, Duration::from_secs(60)).unwrap();
            assert!(
                r.success(),
                "{}: {}",
                task.name(),
                String::from_utf8_lossy(&r.stderr)
            );
        }
        let v = running.judge().unwrap();
        assert!(v.success, "{}: {:?}", task.name(), v.reasons);
    }
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
fn fix_path() {
    exercise("fix-path");
}

#[test]
fn every_task_is_registered_once() {
    let names = engine::tasks::names();
    assert_eq!(names.len(), 7);
    for n in &names {
        assert_eq!(engine::tasks::get(n).unwrap().name(), *n);
    }
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len());
}

/// The cost of a verdict (`judge()`: the reads, and the confirmation when they pass), on a
/// solved state (after the oracle) and on a fresh, unsolved one: median and p90 per task over
/// seeds 1..=3. `JUDGE_COST_TASKS=a,b` limits the tasks, `JUDGE_COST_RUNS` sets the runs per
/// seed and state (default 10). Run with `--ignored --nocapture`.
#[test]
#[ignore]
fn judge_cost() {
    require_root!();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = engine::synth::Cache::open_with(st.path(), 32, 1 << 30).unwrap();
    let only = std::env::var("JUDGE_COST_TASKS").unwrap_or_default();
    let runs: usize = std::env::var("JUDGE_COST_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    for task in engine::tasks::all() {
        if !only.is_empty() && !only.split(',').any(|t| t == task.name()) {
            continue;
        }
        let (mut solved, mut unsolved) = (Vec::new(), Vec::new());
        for seed in 1..=3u64 {
            let plan = Plan::for_task(task.name(), seed, vec![]);
            let held = synthesize(&rt, &cache, &plan).unwrap();
            let setup = held.instance.task.clone().unwrap();
            let mut running = RunningInstance::start(&rt, held).unwrap();
            for _ in 0..runs {
                running.restart().unwrap();
                let t0 = std::time::Instant::now();
                let v = running.judge().unwrap();
                unsolved.push(t0.elapsed().as_secs_f64() * 1e3);
                assert!(!v.success, "{}: solved at the start", task.name());
                running.restart().unwrap();
                for cmd in task.oracle(&setup) {
                    running.run(&cmd, Duration::from_secs(60)).unwrap();
                }
                let t0 = std::time::Instant::now();
                let v = running.judge().unwrap();
                solved.push(t0.elapsed().as_secs_f64() * 1e3);
                assert!(v.success, "{}: {:?}", task.name(), v.reasons);
            }
        }
        eprintln!(
            "judge cost {}: solved median {:.1} ms p90 {:.1} ms; unsolved median {:.1} ms p90 {:.1} ms ({} runs each)",
            task.name(),
            pct(&mut solved, 0.5),
            pct(&mut solved, 0.9),
            pct(&mut unsolved, 0.5),
            pct(&mut unsolved, 0.9),
            solved.len()
        );
    }
}
