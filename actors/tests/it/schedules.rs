use actors::msg::{FailureKind, Origin};
use actors::schedule::{build, Method, Phase, Roles, ScheduleConfig};
use actors::testing::{space, FakeAgent, FakeCritic, FakeSynthesizer, FakeWorker, Sabotage};
use actors::workers::ThreadWorkers;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

pub const DIMS: usize = 3;

pub fn roles(
    workers: usize,
    sabotage: Sabotage,
    adversaries: usize,
) -> (Roles, Arc<std::sync::Mutex<actors::testing::AgentLog>>) {
    let steps = Arc::new(AtomicU64::new(0));
    let ws: Vec<_> = (0..workers)
        .map(|_| FakeWorker::new(DIMS, 3, sabotage.clone(), steps.clone()))
        .collect();
    let agent = FakeAgent::new(1, FakeWorker::actions(DIMS), 4, 0.3);
    let log = agent.log.clone();
    let sp = space(DIMS, 1, 1.0, 20);
    let roles = Roles {
        protagonist: Box::new(agent),
        antagonist: None,
        adversaries: (0..adversaries)
            .map(|k| Box::new(FakeSynthesizer::new(sp.clone(), 10 + k as u64)) as _)
            .collect(),
        critic: Some(Box::new(FakeCritic::default())),
        curriculum: None,
        workers: Box::new(ThreadWorkers::new(ws)),
    };
    (roles, log)
}

#[test]
fn rarl_alternates_phases_and_its_adversaries_learn_from_the_frozen_protagonist() {
    let (mut roles, log) = roles(4, Sabotage::default(), 2);
    let mut cfg = ScheduleConfig::new(Method::Rarl, space(DIMS, 1, 1.0, 20), 5);
    cfg.protagonist_updates = 3;
    cfg.adversary_batch = 6;
    cfg.dr_share = 0.25;
    let mut s = build(&cfg, &roles).unwrap();
    let mut phases = Vec::new();
    for _ in 0..8 {
        let it = s.iterate(&mut roles).unwrap();
        let phase = it.phase.unwrap();
        if phase == Phase::Adversary {
            // Both adversaries learned, each from its own 6 proposals, none of which the
            // protagonist learned from.
            assert_eq!(it.adversaries.len(), 2);
            assert!(it.protagonist.is_none());
            assert_eq!(it.outcomes.len(), 12);
            assert!(it
                .outcomes
                .iter()
                .all(|o| !o.learn && matches!(o.origin, Origin::Adversary(_))));
        } else {
            assert!(it.protagonist.is_some());
            assert!(it.outcomes.iter().all(|o| o.learn));
        }
        phases.push(phase);
    }
    use Phase::*;
    assert_eq!(
        phases,
        [
            Protagonist,
            Protagonist,
            Protagonist,
            Adversary,
            Protagonist,
            Protagonist,
            Protagonist,
            Adversary
        ]
    );
    assert_eq!(s.updates(), 6);
    assert_eq!(log.lock().unwrap().updates, 6);
}

#[test]
fn failures_are_masked_from_learning_and_never_scored_as_a_reward() {
    let sabotage = Sabotage {
        infra_seeds: vec![3, 4],
        unusable_seeds: vec![5],
        ..Sabotage::default()
    };
    let (mut roles, log) = roles(3, sabotage, 1);
    let cfg = ScheduleConfig::new(Method::Dr, space(DIMS, 1, 1.0, 20), 9);
    let mut s = build(&cfg, &roles).unwrap();
    let (mut infra, mut unusable) = (0, 0);
    for _ in 0..30 {
        let it = s.iterate(&mut roles).unwrap();
        for o in &it.outcomes {
            match o.failure.as_ref().map(|f| f.kind) {
                Some(FailureKind::Infrastructure) => {
                    infra += 1;
                    assert!([3, 4].contains(&o.level.seed));
                }
                Some(FailureKind::Unusable) => {
                    unusable += 1;
                    assert_eq!(o.level.seed, 5);
                    assert_eq!(o.steps, 0);
                }
                Some(k) => panic!("unexpected failure {k:?}"),
                None => assert!(![3, 4, 5].contains(&o.level.seed)),
            }
        }
    }
    assert!(
        infra > 0 && unusable > 0,
        "infra {infra}, unusable {unusable}"
    );
    let log = log.lock().unwrap();
    assert!(
        log.invalid_samples > 0,
        "no failed step reached the learner as an invalid sample"
    );
}

#[test]
fn dr_training_makes_the_fake_agent_solve_faulted_levels() {
    let (mut roles, _) = roles(4, Sabotage::default(), 0);
    let cfg = ScheduleConfig::new(Method::Dr, space(DIMS, 1, 1.0, 20), 3);
    let mut s = build(&cfg, &roles).unwrap();
    let rate = |it: &actors::schedule::Iteration| {
        let c: Vec<_> = it.outcomes.iter().filter(|o| o.counted()).collect();
        c.iter().filter(|o| o.success).count() as f64 / c.len().max(1) as f64
    };
    let first: f64 = (0..5)
        .map(|_| rate(&s.iterate(&mut roles).unwrap()))
        .sum::<f64>()
        / 5.0;
    for _ in 0..60 {
        s.iterate(&mut roles).unwrap();
    }
    let last: f64 = (0..5)
        .map(|_| rate(&s.iterate(&mut roles).unwrap()))
        .sum::<f64>()
        / 5.0;
    assert!(last > first + 0.2, "success {first:.2} -> {last:.2}");
}

#[test]
fn a_method_without_its_roles_is_refused_by_name() {
    let (roles, _) = roles(2, Sabotage::default(), 0);
    let cfg = ScheduleConfig::new(Method::Rarl, space(DIMS, 1, 1.0, 20), 1);
    let e = build(&cfg, &roles).err().unwrap().to_string();
    assert!(e.contains("rarl") && e.contains("adversary"), "{e}");
    let mut cfg = ScheduleConfig::new(Method::Dr, space(DIMS, 1, 1.0, 20), 1);
    cfg.lambda = f64::NAN;
    let e = build(&cfg, &roles).err().unwrap().to_string();
    assert!(e.contains("lambda"), "{e}");
}
