use crate::schedules::DIMS;
use actors::msg::{FailureKind, Origin};
use actors::roles::{EnvWorker, RoleError};
use actors::runtime::{run, Budget, Control, Observer, Parts, WorkerFactory};
use actors::schedule::{Iteration, Method, ScheduleConfig};
use actors::testing::{
    space, FakeAgent, FakeCritic, FakeCurriculum, FakeSynthesizer, FakeWorker, Sabotage,
};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Seen {
    /// (iteration, level key, success, failure kind) of every outcome.
    outcomes: Vec<(u64, String, bool, Option<FailureKind>)>,
    checkpoints: u64,
}

struct Record(Arc<Mutex<Seen>>, Option<std::path::PathBuf>);

impl Observer for Record {
    fn iteration(
        &mut self,
        index: u64,
        _updates: u64,
        it: &Iteration,
    ) -> Result<Control, RoleError> {
        let mut s = self.0.lock().unwrap();
        for o in &it.outcomes {
            s.outcomes.push((
                index,
                o.level.key(),
                o.success,
                o.failure.as_ref().map(|f| f.kind),
            ));
        }
        let checkpoint = match (&self.1, index % 3 == 2) {
            (Some(d), true) => {
                s.checkpoints += 1;
                Some(d.join(format!("it-{index}")))
            }
            _ => None,
        };
        Ok(Control {
            checkpoint,
            stop: false,
        })
    }
}

fn parts(sabotage: Sabotage) -> Parts {
    let steps = Arc::new(AtomicU64::new(0));
    let sp = space(DIMS, 1, 1.0, 20);
    let factory: WorkerFactory = Arc::new(move |_i| {
        Ok(
            Box::new(FakeWorker::new(DIMS, 3, sabotage.clone(), steps.clone()))
                as Box<dyn EnvWorker>,
        )
    });
    Parts {
        protagonist: Box::new(FakeAgent::new(1, FakeWorker::actions(DIMS), 4, 0.3)),
        antagonist: None,
        adversaries: vec![Box::new(FakeSynthesizer::new(sp, 10))],
        critic: Some(Box::new(FakeCritic::default())),
        curriculum: None,
        workers: 4,
        worker_factory: factory,
    }
}

#[test]
fn rarl_through_actors_plays_and_checkpoints_every_role() {
    let dir = std::env::temp_dir().join(format!("actors-rt-{}", std::process::id()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut cfg = ScheduleConfig::new(Method::Rarl, space(DIMS, 1, 1.0, 20), 5);
    cfg.protagonist_updates = 2;
    cfg.lambda = 0.5;
    let summary = run(
        &cfg,
        parts(Sabotage::default()),
        Box::new(Record(seen.clone(), Some(dir.clone()))),
        Budget { updates: 6 },
    )
    .unwrap();
    assert_eq!(summary.updates, 6);
    // 6 protagonist iterations and an adversary phase after every 2 (the last one not run:
    // the budget is spent first).
    assert_eq!(summary.iterations, 8);
    assert_eq!(summary.worker_restarts, 0);
    let s = seen.lock().unwrap();
    assert!(s.outcomes.len() as u64 == summary.episodes && summary.episodes > 10);
    assert!(s.checkpoints >= 2);
    for entry in ["protagonist/fake-agent.txt", "adversary-0/weights.txt"] {
        assert!(
            dir.join("it-2").join(entry).is_file(),
            "{entry} was not saved"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_worker_that_panics_is_restarted_and_its_episode_masked() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let cfg = ScheduleConfig::new(Method::Dr, space(DIMS, 1, 1.0, 20), 2);
    let sabotage = Sabotage {
        panic_at_step: Some(10),
        infra_seeds: vec![7],
        ..Sabotage::default()
    };
    let mut p = parts(sabotage);
    let agent = FakeAgent::new(1, FakeWorker::actions(DIMS), 4, 0.3);
    let log = agent.log.clone();
    p.protagonist = Box::new(agent);
    let summary = run(
        &cfg,
        p,
        Box::new(Record(seen.clone(), None)),
        Budget { updates: 12 },
    )
    .unwrap();
    assert_eq!(
        summary.updates, 12,
        "the run did not go on after the failures"
    );
    assert_eq!(summary.worker_panics, 1);
    let s = seen.lock().unwrap();
    let crashes = s
        .outcomes
        .iter()
        .filter(|o| o.3 == Some(FailureKind::Crash))
        .count();
    let infra = s
        .outcomes
        .iter()
        .filter(|o| o.3 == Some(FailureKind::Infrastructure))
        .count();
    assert_eq!(crashes, 1);
    assert!(infra >= 1, "no level of seed 7 was drawn in 12 updates");
    // Each of them restarted its worker.
    assert_eq!(summary.worker_restarts as usize, crashes + infra);
    // The failed steps reached the learner as invalid samples: no gradient from them.
    let invalid = log.lock().unwrap().invalid_samples as usize;
    assert!(
        invalid >= crashes + infra,
        "{invalid} invalid samples for {crashes} crashes and {infra} infrastructure failures"
    );
    assert!(
        s.outcomes.iter().any(|o| o.3.is_none() && o.2),
        "no episode succeeded after the restarts"
    );
}

/// What a curriculum method's run showed, iteration by iteration.
#[derive(Default)]
struct Shown {
    phases: Vec<actors::schedule::Phase>,
    buffers: Vec<Option<usize>>,
    antagonist_learned: u64,
    adversaries_learned: u64,
    /// (agent, origin, learn) of every counted episode.
    episodes: Vec<(String, Origin, bool)>,
}

struct Show(Arc<Mutex<Shown>>);

impl Observer for Show {
    fn iteration(&mut self, _: u64, _: u64, it: &Iteration) -> Result<Control, RoleError> {
        let mut s = self.0.lock().unwrap();
        s.phases.push(it.phase.unwrap());
        s.buffers.push(it.buffer);
        s.antagonist_learned += u64::from(it.antagonist.is_some());
        s.adversaries_learned += it.adversaries.len() as u64;
        for o in it.outcomes.iter().filter(|o| o.counted()) {
            s.episodes.push((o.agent.clone(), o.origin, o.learn));
        }
        Ok(Control::default())
    }
}

/// Run `cfg` through actors for `updates` protagonist updates.
fn show(cfg: &ScheduleConfig, parts: Parts, updates: u64) -> (actors::runtime::Summary, Shown) {
    let shown = Arc::new(Mutex::new(Shown::default()));
    let summary = run(
        cfg,
        parts,
        Box::new(Show(shown.clone())),
        Budget { updates },
    )
    .unwrap();
    assert_eq!(summary.updates, updates);
    assert_eq!(summary.worker_restarts, 0);
    let shown = std::mem::take(&mut *shown.lock().unwrap());
    assert_eq!(shown.phases.len() as u64, summary.iterations);
    (summary, shown)
}

#[test]
fn paired_through_actors_trains_both_agents_and_scores_the_adversary() {
    let mut cfg = ScheduleConfig::new(Method::Paired, space(DIMS, 1, 1.0, 20), 3);
    cfg.adversary_batch = 4;
    cfg.lambda = 0.5;
    let mut p = parts(Sabotage::default());
    p.antagonist = Some(Box::new(FakeAgent::new(
        2,
        FakeWorker::actions(DIMS),
        4,
        0.3,
    )));
    let (summary, shown) = show(&cfg, p, 4);
    assert_eq!(summary.iterations, 4);
    assert_eq!(shown.antagonist_learned, 4);
    assert_eq!(
        shown.adversaries_learned, 4,
        "the adversary did not learn every iteration"
    );
    assert!(shown.episodes.iter().any(|e| e.0 == "antagonist"));
    assert!(shown.episodes.iter().any(|e| e.0 == "protagonist"));
}

fn curriculum_parts() -> Parts {
    let mut p = parts(Sabotage::default());
    p.adversaries.clear();
    p.curriculum = Some(Box::new(FakeCurriculum::new(7, 0.6, 16)));
    p
}

#[test]
fn robust_plr_through_actors_fills_its_buffer_and_never_learns_a_fresh_level() {
    let cfg = ScheduleConfig::new(Method::Plr, space(DIMS, 1, 1.0, 20), 4);
    let (summary, shown) = show(&cfg, curriculum_parts(), 6);
    assert_eq!(summary.iterations, 6);
    assert!(shown.buffers.last().unwrap().unwrap() > 0);
    assert!(shown.episodes.iter().any(|e| e.1 == Origin::Replay));
    for (_, origin, learn) in &shown.episodes {
        assert_eq!(*learn, *origin == Origin::Replay);
    }
}

#[test]
fn accel_through_actors_plays_mutations_only_to_score_them() {
    let cfg = ScheduleConfig::new(Method::Accel, space(DIMS, 1, 1.0, 20), 4);
    let (_, shown) = show(&cfg, curriculum_parts(), 6);
    let mutations: Vec<_> = shown
        .episodes
        .iter()
        .filter(|e| e.1 == Origin::Mutation)
        .collect();
    assert!(!mutations.is_empty(), "no mutation was played");
    assert!(mutations.iter().all(|e| !e.2));
}

#[test]
fn sfl_through_actors_alternates_selections_and_updates() {
    let mut cfg = ScheduleConfig::new(Method::Sfl, space(DIMS, 1, 1.0, 20), 4);
    cfg.sfl_candidates = 8;
    cfg.sfl_keep = 2;
    cfg.sfl_every = 2;
    let mut p = parts(Sabotage::default());
    p.adversaries.clear();
    let (_, shown) = show(&cfg, p, 4);
    use actors::schedule::Phase::*;
    assert_eq!(
        shown.phases,
        [
            Selection,
            Protagonist,
            Protagonist,
            Selection,
            Protagonist,
            Protagonist
        ]
    );
    for (phase, buffer) in shown.phases.iter().zip(&shown.buffers) {
        let kept = buffer.unwrap();
        assert!(
            kept <= 2 && (*phase != Selection || kept > 0),
            "{phase:?} kept {kept}"
        );
    }
}
