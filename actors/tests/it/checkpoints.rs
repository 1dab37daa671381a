//! Checkpoints: a schedule's state goes through JSON and back into a fresh schedule, which
//! goes on where the first one was (RARL's phase, SFL's kept levels, the generator's draws);
//! a state of another method is refused; on disk, a checkpoint is whole or ignored, and one a
//! save left as `.tmp` or `.old` is found and put back under its name.

use crate::schedules::{roles, DIMS};
use actors::runtime::checkpoint::{self, Progress};
use actors::schedule::{build, Method, Phase, ScheduleConfig, ScheduleState};
use actors::testing::{space, Sabotage};

fn round_trip(st: &ScheduleState) -> ScheduleState {
    serde_json::from_str(&serde_json::to_string(st).unwrap()).unwrap()
}

#[test]
fn a_restored_schedule_goes_on_where_the_saved_one_was() {
    for method in [Method::Dr, Method::Clean, Method::Rarl, Method::Sfl] {
        let mut cfg = ScheduleConfig::new(method, space(DIMS, 1, 1.0, 20), 7);
        cfg.protagonist_updates = 3;
        cfg.sfl_candidates = 6;
        cfg.sfl_keep = 2;
        cfg.sfl_every = 2;
        let (mut r1, _) = roles(2, Sabotage::default(), 1);
        let mut a = build(&cfg, &r1).unwrap();
        for _ in 0..5 {
            a.iterate(&mut r1).unwrap();
        }
        let saved = round_trip(&a.state());
        assert_eq!(saved, a.state(), "{method:?}");
        let (mut r2, _) = roles(2, Sabotage::default(), 1);
        let mut b = build(&cfg, &r2).unwrap();
        b.restore(saved).unwrap();
        assert_eq!(b.state(), a.state(), "{method:?}");
        assert_eq!(b.updates(), a.updates());
        // The next iterations are of the same phases as the first schedule's would be.
        for _ in 0..4 {
            let pa = a.iterate(&mut r1).unwrap().phase;
            let pb = b.iterate(&mut r2).unwrap().phase;
            assert_eq!(pa, pb, "{method:?}");
        }
        assert_eq!(a.updates(), b.updates(), "{method:?}");
    }
}

#[test]
fn rarl_resumes_mid_phase_and_states_of_another_method_are_refused() {
    let mut cfg = ScheduleConfig::new(Method::Rarl, space(DIMS, 1, 1.0, 20), 3);
    cfg.protagonist_updates = 3;
    let (mut r, _) = roles(2, Sabotage::default(), 2);
    let mut a = build(&cfg, &r).unwrap();
    a.iterate(&mut r).unwrap();
    a.iterate(&mut r).unwrap();
    let st = a.state();
    let (mut r2, _) = roles(2, Sabotage::default(), 2);
    let mut b = build(&cfg, &r2).unwrap();
    b.restore(st.clone()).unwrap();
    // One protagonist update left in the phase, then the adversaries'.
    assert_eq!(b.iterate(&mut r2).unwrap().phase, Some(Phase::Protagonist));
    assert_eq!(b.iterate(&mut r2).unwrap().phase, Some(Phase::Adversary));
    let dr = ScheduleConfig::new(Method::Dr, space(DIMS, 1, 1.0, 20), 3);
    let mut c = build(&dr, &r2).unwrap();
    let e = c.restore(st).unwrap_err().to_string();
    assert!(e.contains("rarl schedule, not dr"), "{e}");
}

#[test]
fn checkpoints_are_whole_or_ignored_and_a_cut_short_save_is_put_back() {
    let cfg = ScheduleConfig::new(Method::Dr, space(DIMS, 1, 1.0, 20), 1);
    let (mut r, _) = roles(2, Sabotage::default(), 0);
    let mut s = build(&cfg, &r).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoint");
    let progress = |u| Progress {
        iterations: u,
        updates: u,
        ..Progress::default()
    };
    s.iterate(&mut r).unwrap();
    let mut seen = Vec::new();
    checkpoint::write(&dir, &r, s.as_ref(), &progress(1), &mut |d| {
        seen.push(d.to_path_buf());
        std::fs::write(d.join("observer.txt"), "1")
            .map_err(|e| actors::roles::RoleError::wrap("t", e))
    })
    .unwrap();
    // The observer wrote into the new directory before it was swapped in.
    assert_eq!(seen, [tmp.path().join("checkpoint.tmp")]);
    let cp = checkpoint::read(&dir).unwrap();
    assert_eq!(cp.progress, progress(1));
    assert_eq!(cp.schedule, s.state());
    assert!(dir.join("protagonist/fake-agent.txt").is_file() && dir.join("observer.txt").is_file());
    assert!(
        !tmp.path().join("checkpoint.tmp").exists() && !tmp.path().join("checkpoint.old").exists()
    );

    // A save cut short before its marker is not a checkpoint.
    s.iterate(&mut r).unwrap();
    let half = tmp.path().join("checkpoint.tmp");
    std::fs::create_dir_all(half.join("protagonist")).unwrap();
    assert!(checkpoint::read(&half)
        .unwrap_err()
        .to_string()
        .contains("not complete"));
    assert_eq!(
        checkpoint::latest(std::slice::from_ref(&dir))
            .unwrap()
            .progress,
        progress(1)
    );

    // Killed between the two renames: the old one is `.old`, the new one `.tmp`, none under
    // the name; the newest is found and put back.
    checkpoint::write(&dir, &r, s.as_ref(), &progress(2), &mut |_| Ok(())).unwrap();
    std::fs::rename(&dir, tmp.path().join("checkpoint.tmp")).unwrap();
    let best = checkpoint::latest(std::slice::from_ref(&dir)).unwrap();
    assert_eq!(best.progress, progress(2));
    let back = checkpoint::promote(best).unwrap();
    assert_eq!(back.dir, dir);
    assert_eq!(checkpoint::read(&dir).unwrap().progress, progress(2));
    assert!(checkpoint::latest(&[tmp.path().join("nothing")]).is_none());
}
