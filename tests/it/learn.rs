//! Learning in the factory's environments: PPO on two fixed archive-logs levels improves the
//! greedy policy's return over the untrained one (no timing assertions), and the evaluation
//! counts what it played.

use crate::common;
use engine::env::EnvConfig;
use engine::instance::Plan;
use engine::learn::{evaluate, greedy, policy_agent, train, CheckSpec, PolicyMode, TrainSpec};
use policies::ppo::PpoConfig;

#[test]
fn ppo_improves_on_two_fixed_archive_logs_levels() {
    require_root!();
    let rt = common::runtime();
    let cache = common::cache();
    let levels: Vec<Plan> = (1..=2)
        .map(|s| Plan::for_task("archive-logs", s, vec![]))
        .collect();
    // Sparse: only the goal pays, so the signal is the task's alone.
    let env = EnvConfig {
        max_steps: Some(8),
        reward: engine::env::RewardConfig::sparse(),
        ..EnvConfig::default()
    };
    let spec = |total_steps, stop_success| TrainSpec {
        task: "archive-logs".into(),
        seed: 3,
        train_levels: levels.clone(),
        env: env.clone(),
        ppo: PpoConfig {
            num_envs: 4,
            num_steps: 16,
            learning_rate: 3e-3,
            anneal_lr: false,
            ..PpoConfig::default()
        },
        hidden: vec![32],
        total_steps,
        workers: 2,
        episodes_per_level: 4,
        baseline_steps: 16,
        // A greedy check on both training levels every four updates.
        checks: CheckSpec {
            every_updates: 4,
            levels: levels.clone(),
            stop_success,
            mode: PolicyMode::Greedy,
        },
    };
    let r = train(&rt, &cache, &spec(1536, None)).unwrap();
    assert!(r.curve.len() as u64 == r.updates && r.steps == r.updates * 64);
    assert!(!r.stopped_early);
    let at: Vec<u64> = r.checks.iter().map(|c| c.steps).collect();
    assert_eq!(at, (1..=6).map(|k| k * 256).collect::<Vec<_>>());
    assert!(r
        .checks
        .iter()
        .all(|c| c.episodes == 2 && c.check_steps >= 2));
    let rates: Vec<f64> = r.curve.iter().map(|c| c.success_rate).collect();
    eprintln!("training success per update: {rates:?}");
    // The untrained (near-uniform) policy's episodes of the first rollout against the last
    // four rollouts' episodes: a real improvement, from the agent's own experience.
    let first = rates[0];
    let last = rates[rates.len() - 4..].iter().sum::<f64>() / 4.0;
    assert!(
        first < 0.8,
        "the untrained policy already succeeds: {rates:?}"
    );
    assert!(
        last >= 0.95 && last > first + 0.2,
        "no improvement: {rates:?}"
    );
    // The greedy policy solves both levels in one step each.
    let p = r.policy.clone().unwrap();
    let make = move || greedy(&p);
    let e = evaluate(&rt, &cache, &env, &levels, 2, &make).unwrap();
    assert_eq!((e.episodes, e.infra, e.skipped), (2, 0, 0));
    assert_eq!(e.success_rate, 1.0);
    assert!(e.mean_steps <= 2.0, "{} steps per episode", e.mean_steps);
    // The last check played the same levels with the same policy.
    assert_eq!(r.checks.last().map(|c| c.success_rate), Some(1.0));
    // Sampled as in training, seeded per level: the same episodes whichever worker plays them.
    let q = r.policy.clone().unwrap();
    let sampled = move || policy_agent(&q, PolicyMode::Sampled, 7);
    let a = evaluate(&rt, &cache, &env, &levels, 2, &sampled).unwrap();
    let b = evaluate(&rt, &cache, &env, &levels, 1, &sampled).unwrap();
    assert_eq!((a.successes, a.steps), (b.successes, b.steps));

    // With a stopping rule, training ends at the first check that solves both levels,
    // before the budget: the steps trained are that check's, and no earlier check solved both.
    let budget = 4096;
    let s = train(&rt, &cache, &spec(budget, Some(1.0))).unwrap();
    let last = s.checks.last().unwrap();
    assert!(s.steps <= budget && s.curve.len() as u64 * 64 == s.steps);
    assert_eq!(s.updates, s.curve.len() as u64);
    assert_eq!(last.steps, s.steps);
    assert!(s.checks[..s.checks.len() - 1]
        .iter()
        .all(|c| c.success_rate < 1.0));
    // It stopped exactly when a check solved both levels before the budget.
    assert_eq!(
        s.stopped_early,
        last.success_rate >= 1.0 && s.steps < budget
    );
}

/// A whole study as `engine run` runs it, at a tiny budget: the report names every figure
/// the README promises, per seed, and the curve and report files are written.
#[test]
fn a_tiny_study_writes_its_report() {
    require_root!();
    let rt = common::runtime();
    let cache = common::cache();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("experiments").join("tiny.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let text = format!(
        r#"
[experiment]
name = "tiny"
seeds = [1, 2]
out_dir = "{out}"

[environment]
task = "archive-logs"
workers = 2
max_steps = 6             # every environment finishes episodes, replayed for the learning cost

[reward]
mode = "potential"

[training]
total_steps = 128
num_envs = 4
num_steps = 16
num_minibatches = 2
hidden = [16]
train_levels = 3
check_levels = 2
check_every = 64
stop_success = 1.0
eval_levels = 2
eval_template = "{tpl}"
baseline_steps = 8
"#,
        out = dir.path().join("out").display(),
        tpl = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("templates/archive-logs.toml")
            .display(),
    );
    std::fs::write(&file, text).unwrap();
    let exp = engine::experiment::Experiment::load(&file).unwrap();
    let training = exp.training.clone().unwrap();
    let (report, path) = engine::experiment::study::run(&exp, &training, &rt, &cache).unwrap();
    let t = &report.tasks["archive-logs"];
    assert!(report.complete);
    for p in [
        &t.held_out_success,
        &t.catalogue_oracle_success,
        &t.steps_trained,
        &t.train_steps_per_s,
        &t.random_steps_per_s,
    ] {
        assert_eq!(p.per_seed.len(), 2);
    }
    assert!(t.faulted_success.is_some() && t.robustness_gap.is_some());
    // The policy is sampled by default; the greedy column is there beside it.
    assert_eq!(report.training.policy, PolicyMode::Sampled);
    assert_eq!(
        t.held_out_greedy_success.as_ref().unwrap().per_seed.len(),
        2
    );
    for (i, r) in t.runs.iter().enumerate() {
        assert_eq!(r.held_out.episodes, 2);
        assert!(!r.train.checks.is_empty());
        assert!(r.train.steps <= 128 && r.train.steps % 64 == 0);
        // Stopped early exactly when a check solved both check levels before the budget.
        let solved = r.train.checks.iter().any(|c| c.success_rate >= 1.0);
        assert_eq!(r.train.stopped_early, solved && r.train.steps < 128);
        // The environments' part of the training phase is a part of it.
        assert!(r.train.env_seconds > 0.0 && r.train.env_seconds <= r.train.train_seconds);
        // The learning-cost baseline: the late training's episodes played without learning.
        assert!(r.train.replay_steps_per_s > 0.0 && r.train.late_train_steps_per_s > 0.0);
        // The ratio against the random agent is the whole training's rate over the late
        // training's, times what learning costs, times the policy's environment work (the
        // columns' wiring; a replay that ran no episode would make both last factors NaN).
        let (tr, lt, pw) = (
            t.throughput_ratio.per_seed[i],
            t.learning_throughput_ratio.per_seed[i],
            t.policy_work_ratio.per_seed[i],
        );
        assert_eq!(pw, r.train.replay_steps_per_s / r.train.random_steps_per_s);
        let whole_over_late = r.train.train_steps_per_s / r.train.late_train_steps_per_s;
        assert!(
            (tr - whole_over_late * lt * pw).abs() <= 1e-9 * tr.max(1.0),
            "{tr} {lt} {pw}"
        );
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(json["complete"], true);
    for key in [
        "held_out_success",
        "held_out_greedy_success",
        "steps_trained",
        "check_steps_to_0_9",
        "throughput_ratio",
        "learning_throughput_ratio",
        "policy_work_ratio",
        "env_steps_per_s",
        "learning_cost",
        "episode_steps_first",
        "episode_steps_last",
    ] {
        assert!(
            json["tasks"]["archive-logs"][key]["per_seed"].is_array(),
            "{key}"
        );
    }
    let out = path.parent().unwrap();
    assert!(out.join("report.md").is_file() && out.join("curve-archive-logs.png").is_file());
}

/// A task whose catalogue grows with its instance (repair-config: an action per setting to
/// repair): the policy is as wide as the largest catalogue of its levels, the smaller levels'
/// extra actions are masked in training and in evaluation, and nothing fails on the sizes.
#[test]
fn levels_with_different_catalogue_sizes_train_under_one_policy() {
    require_root!();
    let rt = common::runtime();
    let cache = common::cache();
    let env = EnvConfig::default();
    let mut e = engine::env::Env::new(rt.clone(), cache.clone(), env.clone()).unwrap();
    let mut by_size = std::collections::BTreeMap::new();
    for seed in 1..=12 {
        let plan = Plan::for_task("repair-config", seed, vec![]);
        if e.reset(&plan).is_ok() {
            let n = e.task().unwrap().actions.len();
            by_size.entry(n).or_insert(plan);
        }
    }
    drop(e);
    assert!(
        by_size.len() >= 2,
        "one catalogue size only: {:?}",
        by_size.keys()
    );
    let levels: Vec<Plan> = by_size.values().cloned().collect();
    let spec = TrainSpec {
        task: "repair-config".into(),
        seed: 1,
        train_levels: levels.clone(),
        env: env.clone(),
        ppo: PpoConfig {
            num_envs: 2,
            num_steps: 16,
            ..PpoConfig::default()
        },
        hidden: vec![16],
        total_steps: 64,
        workers: 2,
        episodes_per_level: 2,
        // The random baseline too stays within each level's catalogue.
        baseline_steps: 128,
        checks: CheckSpec::default(),
    };
    let r = train(&rt, &cache, &spec).unwrap();
    let p = r.policy.clone().unwrap();
    let widest = *by_size.keys().last().unwrap();
    assert_eq!(p.net_config().action_dims, vec![widest]);
    for mode in [PolicyMode::Sampled, PolicyMode::Greedy] {
        let q = p.clone();
        let make = move || policy_agent(&q, mode, 3);
        let ev = evaluate(&rt, &cache, &env, &levels, 2, &make).unwrap();
        assert_eq!((ev.episodes, ev.infra, ev.skipped), (levels.len(), 0, 0));
    }
}

/// What a training environment records is what it replays: the same levels, actions,
/// rewards and episode ends, whatever actions the replay is given; an episode whose actions
/// are all played ends there.
#[test]
fn recorded_episodes_replay_on_their_levels_with_their_actions() {
    use engine::env::Env;
    use engine::learn::{PlayedEpisode, TrainEnv};
    use policies::rollout::Env as _;
    use std::sync::Arc;
    require_root!();
    let rt = common::runtime();
    let cache = common::cache();
    let levels: Arc<Vec<Plan>> = Arc::new(
        (1..=2)
            .map(|s| Plan::for_task("archive-logs", s, vec![]))
            .collect(),
    );
    let cfg = EnvConfig {
        max_steps: Some(4),
        reward: engine::env::RewardConfig::sparse(),
        ..EnvConfig::default()
    };
    let make = || Env::new(rt.clone(), cache.clone(), cfg.clone()).unwrap();
    // The catalogue sizes, from the levels' own instances: the policy's width is the largest,
    // the actions taken fit the smallest.
    let mut env = TrainEnv::new(make(), levels.clone(), 0, 1, 1, 64).unwrap();
    let mut sizes = Vec::new();
    for _ in 0..2 {
        env.reset().unwrap();
        sizes.push(
            env.action_mask()
                .unwrap()
                .iter()
                .filter(|&&m| m > 0.0)
                .count(),
        );
    }
    let (width, fits) = (*sizes.iter().max().unwrap(), *sizes.iter().min().unwrap());
    assert!(fits > 1);
    // Two episodes per level: levels 0, 0, 1, 1, 0, ... in that order.
    let mut env = TrainEnv::new(make(), levels.clone(), 0, 1, 2, width).unwrap();
    env.record_last(1_000);
    // Episodes of varied actions; every step's outcome kept: reward, ends, level and the
    // verifier's progress (not the observation: a listing after a change shows the clock).
    type Seen = (f32, bool, bool, Option<String>, u64);
    let outcome = |s: policies::rollout::Step| -> Seen {
        let progress = s.info.progress.to_bits();
        (s.reward, s.terminated, s.truncated, s.info.level, progress)
    };
    let mut seen: Vec<Vec<Seen>> = Vec::new();
    env.reset().unwrap();
    let mut cur = Vec::new();
    for k in 0..24u32 {
        let s = env.step(&[(k * 7 + k / 3) % fits as u32]).unwrap();
        assert!(!s.masked);
        let ended = s.terminated || s.truncated;
        cur.push(outcome(s));
        if ended {
            seen.push(std::mem::take(&mut cur));
            env.reset().unwrap();
        }
    }
    let recorded = env.recorded();
    assert_eq!(recorded.len(), seen.len());
    let order: Vec<usize> = recorded.iter().map(|e| e.level).collect();
    let want: Vec<usize> = (0..recorded.len()).map(|i| (i / 2) % 2).collect();
    assert_eq!(order, want, "the levels in the order they were played");
    for (e, s) in recorded.iter().zip(&seen) {
        assert_eq!(e.actions.len(), s.len());
    }
    // Played again with other actions given: the recorded ones are taken, on their levels.
    let mut replay = TrainEnv::replaying(make(), levels.clone(), recorded.clone(), width).unwrap();
    for (k, want) in seen.iter().enumerate() {
        replay.reset().unwrap();
        for (t, w) in want.iter().enumerate() {
            let got = outcome(replay.step(&[0]).unwrap());
            assert_eq!(&got, w, "episode {k} step {t}");
        }
    }
    // After the last recorded episode, the first comes again.
    replay.reset().unwrap();
    for (t, w) in seen[0].iter().enumerate() {
        assert_eq!(
            &outcome(replay.step(&[0]).unwrap()),
            w,
            "episode 0 again, step {t}"
        );
    }
    // Only the latest episodes holding at least the steps asked for are kept.
    let mut short_memory = TrainEnv::new(make(), levels.clone(), 0, 1, 2, width).unwrap();
    short_memory.record_last(3);
    short_memory.reset().unwrap();
    let mut lens = Vec::new();
    let mut len = 0;
    for k in 0..24u32 {
        let s = short_memory.step(&[(k * 7 + k / 3) % fits as u32]).unwrap();
        len += 1;
        if s.terminated || s.truncated {
            lens.push(len);
            len = 0;
            short_memory.reset().unwrap();
        }
    }
    let kept: Vec<usize> = short_memory
        .recorded()
        .iter()
        .map(|e| e.actions.len())
        .collect();
    let mut tail = Vec::new();
    for l in lens.iter().rev() {
        tail.insert(0, *l);
        if tail.iter().sum::<usize>() >= 3 {
            break;
        }
    }
    assert_eq!(kept, tail);
    // An episode cut short in the script ends where its actions end.
    let mut cut = recorded[0].clone();
    if cut.actions.len() > 1 {
        cut.actions.truncate(1);
        let mut short = TrainEnv::replaying(make(), levels.clone(), vec![cut], width).unwrap();
        short.reset().unwrap();
        let s = short.step(&[0]).unwrap();
        assert!(s.terminated || s.truncated);
    }
    // A level beyond the list, or nothing to play, is refused.
    let beyond = PlayedEpisode {
        level: 2,
        actions: vec![0],
    };
    assert!(TrainEnv::replaying(make(), levels.clone(), vec![beyond], width).is_err());
    assert!(TrainEnv::replaying(make(), levels.clone(), vec![], width).is_err());
    let empty = PlayedEpisode {
        level: 0,
        actions: vec![],
    };
    let e = TrainEnv::replaying(make(), levels, vec![empty], width)
        .err()
        .unwrap();
    assert!(e.to_string().contains("no recorded episode"), "{e}");
}
