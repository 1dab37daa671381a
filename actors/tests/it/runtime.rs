use crate::schedules::DIMS;
use actors::msg::FailureKind;
use actors::roles::{EnvWorker, RoleError};
use actors::runtime::{run, Budget, Control, Observer, Parts, WorkerFactory};
use actors::schedule::{Iteration, Method, ScheduleConfig};
use actors::testing::{space, FakeAgent, FakeCritic, FakeSynthesizer, FakeWorker, Sabotage};
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
    let summary = run(
        &cfg,
        parts(sabotage),
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
    assert!(
        s.outcomes.iter().any(|o| o.3.is_none() && o.2),
        "no episode succeeded after the restarts"
    );
}
