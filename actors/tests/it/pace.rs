//! The budget schedule: a linear pace grows the budget every draw uses (DR draws, the
//! adversaries' proposals), an adaptive one follows the protagonist's success, its state goes
//! through a checkpoint, and bad settings are refused by key.

use crate::schedules::{roles, DIMS};
use actors::msg::{EpisodeOutcome, Level, Origin};
use actors::schedule::{build, Method, Pace, PaceState, Phase, ScheduleConfig, ScheduleState};
use actors::space::LevelSpace;
use actors::testing::{space, FakeSynthesizer, Sabotage};

fn outcome(success: bool, origin: Origin) -> EpisodeOutcome {
    EpisodeOutcome {
        level: Level {
            seed: 0,
            choices: vec![1, 0, 0],
        },
        origin,
        agent: "protagonist".into(),
        learn: true,
        tag: None,
        ret: 0.0,
        success,
        steps: 1,
        progress: 0.0,
        truncated: false,
        actions: vec![0],
        rewards: vec![0.0],
        values: vec![0.0],
        failure: None,
    }
}

#[test]
fn a_linear_pace_interpolates_then_stays_at_the_space_budget() {
    let p = Pace::Linear {
        start: 1.0,
        updates: 4,
    };
    let st = PaceState::default();
    let b: Vec<f64> = (0..7).map(|u| p.budget(u, &st, 3.0)).collect();
    assert_eq!(b, [1.0, 1.5, 2.0, 2.5, 3.0, 3.0, 3.0]);
    assert_eq!(Pace::Fixed.budget(0, &st, 3.0), 3.0);
}

#[test]
fn an_adaptive_pace_raises_on_success_lowers_on_failure_and_stays_in_range() {
    let p = Pace::Adaptive {
        start: 1.0,
        step: 0.5,
        window: 4,
        raise_above: 0.7,
        lower_below: 0.3,
    };
    let mut st = PaceState {
        budget: 1.0,
        ..PaceState::default()
    };
    let wins: Vec<_> = (0..4).map(|_| outcome(true, Origin::Random)).collect();
    let losses: Vec<_> = (0..4).map(|_| outcome(false, Origin::Random)).collect();
    p.observe(&wins[..3], &mut st, 2.0);
    assert_eq!(st.budget, 1.0, "the window was not full yet");
    p.observe(&wins[..1], &mut st, 2.0);
    assert_eq!((st.budget, st.episodes, st.raised), (1.5, 0, 1));
    p.observe(&wins, &mut st, 2.0);
    p.observe(&wins, &mut st, 2.0);
    assert_eq!(st.budget, 2.0, "the budget went past the space's");
    p.observe(&losses, &mut st, 2.0);
    assert_eq!((st.budget, st.lowered), (1.5, 1));
    for _ in 0..3 {
        p.observe(&losses, &mut st, 2.0);
    }
    assert_eq!(st.budget, 1.0, "the budget went below the start");
    // Clean levels, other agents and failed episodes are not the protagonist's success on
    // drawn levels.
    let mut other = vec![outcome(true, Origin::Clean); 8];
    other[0].agent = "antagonist".into();
    let mut failed = outcome(true, Origin::Random);
    failed.failure = Some(actors::msg::Failure::new(
        actors::msg::FailureKind::Infrastructure,
        "x",
    ));
    other.push(failed);
    p.observe(&other, &mut st, 2.0);
    assert_eq!((st.budget, st.episodes), (1.0, 0));
}

/// A space of three faults costing 1, 2 and 3, budget 3.
fn priced() -> LevelSpace {
    let mut s = space(DIMS, 1, 3.0, 20);
    for (d, dim) in s.dims.iter_mut().enumerate() {
        dim.cost[1] = 1.0 + d as f64;
    }
    s
}

#[test]
fn a_linear_pace_grows_what_dr_draws_and_adversaries_propose() {
    for method in [Method::Dr, Method::Rarl] {
        let (mut roles, _) = roles(2, Sabotage::default(), 0);
        let adv = FakeSynthesizer::new(priced(), 1);
        let budgets = adv.budgets.clone();
        roles.adversaries.push(Box::new(adv));
        let mut cfg = ScheduleConfig::new(method, priced(), 4);
        cfg.protagonist_updates = 2;
        cfg.dr_share = 0.5;
        cfg.pace = Pace::Linear {
            start: 1.0,
            updates: 4,
        };
        let mut s = build(&cfg, &roles).unwrap();
        let mut seen = Vec::new();
        for _ in 0..9 {
            let it = s.iterate(&mut roles).unwrap();
            let b = it.budget.expect("a paced iteration records its budget");
            for o in &it.outcomes {
                let cost = cfg.space.cost(&o.level);
                assert!(
                    cost <= b + 1e-9,
                    "{method:?}: a level of cost {cost} under {b}"
                );
            }
            seen.push((
                b,
                it.outcomes
                    .iter()
                    .map(|o| cfg.space.cost(&o.level))
                    .fold(0.0, f64::max),
            ));
        }
        let bs: Vec<f64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(bs[0], 1.0, "{method:?}");
        assert!(bs.windows(2).all(|w| w[1] >= w[0]), "{method:?}: {bs:?}");
        assert_eq!(*bs.last().unwrap(), 3.0, "{method:?}: {bs:?}");
        // Late levels use the room the early ones did not have.
        assert!(seen.iter().any(|s| s.1 > 1.0), "{method:?}: {seen:?}");
        assert!(seen[0].1 <= 1.0, "{method:?}: {seen:?}");
        if method == Method::Rarl {
            let asked = budgets.lock().unwrap().clone();
            assert_eq!(asked.first(), Some(&1.0));
            assert_eq!(asked.last(), Some(&3.0), "{asked:?}");
        }
    }
}

#[test]
fn an_adaptive_pace_follows_the_learning_agent_and_resumes_from_its_checkpoint() {
    let mut cfg = ScheduleConfig::new(Method::Dr, priced(), 11);
    cfg.pace = Pace::Adaptive {
        start: 1.0,
        step: 1.0,
        window: 8,
        raise_above: 0.5,
        lower_below: 0.1,
    };
    let (mut r1, _) = roles(2, Sabotage::default(), 0);
    let mut a = build(&cfg, &r1).unwrap();
    let mut budgets = Vec::new();
    for _ in 0..30 {
        budgets.push(a.iterate(&mut r1).unwrap().budget.unwrap());
    }
    // The fake agent learns the faults of DR levels: the budget rises off its start.
    assert_eq!(budgets[0], 1.0);
    assert!(budgets.iter().any(|&b| b > 1.0), "{budgets:?}");
    let st: ScheduleState =
        serde_json::from_str(&serde_json::to_string(&a.state()).unwrap()).unwrap();
    let pace = st.pace.clone().expect("the pace's state is checkpointed");
    assert_eq!(pace.budget, a.state().pace.unwrap().budget);
    let (mut r2, _) = roles(2, Sabotage::default(), 0);
    let mut b = build(&cfg, &r2).unwrap();
    b.restore(st).unwrap();
    assert_eq!(b.state(), a.state());
    assert_eq!(b.iterate(&mut r2).unwrap().budget, Some(pace.budget));
    assert_eq!(a.iterate(&mut r1).unwrap().phase, Some(Phase::Protagonist));
    // A checkpoint's budget outside the space is refused.
    let mut bad = a.state();
    bad.pace = Some(PaceState {
        budget: 9.0,
        ..pace.clone()
    });
    let e = build(&cfg, &r2)
        .unwrap()
        .restore(bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("budget_schedule"), "{e}");
    // So is one below the schedule's start, and one with no adaptive state at all.
    let mut low = a.state();
    low.pace = Some(PaceState {
        budget: 0.5,
        ..pace.clone()
    });
    let e = build(&cfg, &r2).unwrap().restore(low).unwrap_err();
    assert!(e.to_string().contains("budget_schedule"), "{e}");
    let mut none = a.state();
    none.pace = None;
    let e = build(&cfg, &r2).unwrap().restore(none).unwrap_err();
    assert!(e.to_string().contains("no adaptive budget state"), "{e}");
}

#[test]
fn bad_paces_are_refused_by_key() {
    let (roles, _) = roles(2, Sabotage::default(), 1);
    let adaptive = |step, window, raise_above, lower_below| Pace::Adaptive {
        start: 1.0,
        step,
        window,
        raise_above,
        lower_below,
    };
    for (pace, key) in [
        (
            Pace::Linear {
                start: 4.0,
                updates: 2,
            },
            "budget_schedule.start",
        ),
        (
            Pace::Linear {
                start: 0.5,
                updates: 2,
            },
            "budget_schedule.start",
        ),
        (
            Pace::Linear {
                start: f64::NAN,
                updates: 2,
            },
            "budget_schedule.start",
        ),
        (
            Pace::Linear {
                start: 1.0,
                updates: 0,
            },
            "budget_schedule.over",
        ),
        (adaptive(0.0, 4, 0.8, 0.2), "budget_schedule.step"),
        (adaptive(1.0, 0, 0.8, 0.2), "budget_schedule.window"),
        (adaptive(1.0, 4, 1.5, 0.2), "budget_schedule.raise_above"),
        (adaptive(1.0, 4, 0.5, 0.6), "budget_schedule.lower_below"),
    ] {
        let mut cfg = ScheduleConfig::new(Method::Rarl, priced(), 1);
        cfg.pace = pace.clone();
        let e = build(&cfg, &roles).err().expect("refused").to_string();
        assert!(e.contains(key), "{pace:?}: {e}");
    }
}
