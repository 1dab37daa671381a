//! Learning in the factory's environments: PPO on two fixed archive-logs levels improves the
//! greedy policy's return over the untrained one (no timing assertions), and the evaluation
//! counts what it played.

use crate::common;
use engine::env::EnvConfig;
use engine::instance::Plan;
use engine::learn::{evaluate, greedy, train, TrainSpec};
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
    let spec = |total_steps| TrainSpec {
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
    };
    let r = train(&rt, &cache, &spec(1536)).unwrap();
    assert!(r.curve.len() as u64 == r.updates && r.steps == r.updates * 64);
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
}
