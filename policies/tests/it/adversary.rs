//! The adversary learns the worst perturbation combination within its budget.

use policies::adversary::{Adversary, AdversaryConfig};
use policies::rng::seeded;
use rand_distr::{Distribution, Normal};

/// Damage to the protagonist per (context, parameter, choice); choice 0 is "off".
/// Additive, so turning all three parameters on would hurt most; with a budget of two the
/// worst plan for the protagonist is the two largest effects.
const DAMAGE: [[[f32; 3]; 3]; 2] = [
    // context 0: best within budget (2, 0, 1) = 0.95; unconstrained (2, 1, 1) = 1.15
    [[0.0, 0.3, 0.5], [0.0, 0.2, 0.1], [0.0, 0.45, 0.35]],
    // context 1: best within budget (0, 1, 1) = 1.1; unconstrained (2, 1, 1) = 1.3
    [[0.0, 0.1, 0.2], [0.0, 0.6, 0.3], [0.0, 0.5, 0.4]],
];
const WORST: [[u32; 3]; 2] = [[2, 0, 1], [0, 1, 1]];

fn protagonist_return(ctx: usize, plan: &[u32]) -> f32 {
    1.0 - plan
        .iter()
        .enumerate()
        .map(|(d, &c)| DAMAGE[ctx][d][c as usize])
        .sum::<f32>()
}

#[test]
fn adversary_learns_the_worst_combination_within_budget_per_context() {
    let cfg = AdversaryConfig {
        context_dim: 2,
        choices: vec![3, 3, 3],
        max_active: 2,
        hidden: vec![32],
        learning_rate: 3e-3,
        ent_coef: 0.01,
        ..AdversaryConfig::default()
    };
    let mut adv = Adversary::new(&cfg, 11).unwrap();
    let mut rng = seeded(12);
    let noise = Normal::new(0.0f32, 0.1).unwrap();
    let contexts = [[1.0f32, 0.0], [0.0, 1.0]];
    for _ in 0..250 {
        let mut batch = Vec::with_capacity(64);
        for k in 0..64 {
            let c = k % 2;
            let s = adv.sample(&contexts[c]).unwrap();
            assert!(s.active() <= 2);
            // Adversary reward: minus the (noisy) protagonist return.
            let r = -protagonist_return(c, &s.choices) + noise.sample(&mut rng);
            batch.push((s, r));
        }
        adv.update(&batch).unwrap();
    }
    for c in 0..2 {
        assert_eq!(
            adv.mode(&contexts[c]).unwrap(),
            WORST[c].to_vec(),
            "context {c}"
        );
        let n = 400;
        let hits = (0..n)
            .filter(|_| adv.sample(&contexts[c]).unwrap().choices == WORST[c])
            .count();
        assert!(
            hits as f64 / n as f64 > 0.8,
            "context {c}: worst plan sampled {hits}/{n}"
        );
    }
}

#[test]
fn adversary_checkpoint_continues_identically() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("adv");
    let cfg = AdversaryConfig {
        context_dim: 2,
        choices: vec![3, 2],
        max_active: 1,
        hidden: vec![8],
        ..AdversaryConfig::default()
    };
    let mut a = Adversary::new(&cfg, 4).unwrap();
    let batch: Vec<_> = (0..8)
        .map(|i| (a.sample(&[1.0, 0.0]).unwrap(), i as f32))
        .collect();
    a.update(&batch).unwrap();
    a.save(&p).unwrap();
    let mut b = Adversary::load(&p).unwrap();
    let step = |x: &mut Adversary| {
        let batch: Vec<_> = (0..8)
            .map(|i| (x.sample(&[0.0, 1.0]).unwrap(), -(i as f32)))
            .collect();
        let stats = x.update(&batch).unwrap();
        (batch.into_iter().map(|(s, _)| s).collect::<Vec<_>>(), stats)
    };
    assert_eq!(step(&mut a), step(&mut b));
    assert_eq!(a.state().unwrap(), b.state().unwrap());
}

#[test]
fn samples_within_masks_and_a_cost_budget_and_learns_the_worst_affordable_plan() {
    let cfg = AdversaryConfig {
        context_dim: 2,
        choices: vec![3, 3, 3],
        max_active: 3,
        hidden: vec![32],
        learning_rate: 3e-3,
        ent_coef: 0.01,
        ..AdversaryConfig::default()
    };
    let mut adv = Adversary::new(&cfg, 5).unwrap();
    // Choice (0, 2) is forbidden; (1, 1) costs 2; everything else on costs 1; budget 2.
    let mut allowed = vec![1.0f32; 9];
    allowed[2] = 0.0;
    let mut costs = vec![0.0f32, 1.0, 1.0, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0];
    let ctx = [1.0f32, 0.0];
    let cost = |c: &[u32], costs: &[f32]| -> f32 {
        c.iter()
            .enumerate()
            .map(|(d, &k)| costs[d * 3 + k as usize])
            .sum()
    };
    for _ in 0..300 {
        let s = adv.sample_within(&ctx, &allowed, &costs, 2.0).unwrap();
        assert_ne!(s.choices[0], 2, "a forbidden choice was sampled");
        assert!(
            cost(&s.choices, &costs) <= 2.0,
            "over budget: {:?}",
            s.choices
        );
    }
    // Learning under the same constraints: damage as in context 0 above; the worst plan
    // within these masks and this budget is (1, 0, 1): 0.3 + 0.45.
    let mut rng = seeded(6);
    let noise = Normal::new(0.0f32, 0.05).unwrap();
    for _ in 0..250 {
        let batch: Vec<_> = (0..64)
            .map(|_| {
                let s = adv.sample_within(&ctx, &allowed, &costs, 2.0).unwrap();
                let r = -protagonist_return(0, &s.choices) + noise.sample(&mut rng);
                (s, r)
            })
            .collect();
        adv.update(&batch).unwrap();
    }
    let hits = (0..400)
        .filter(|_| {
            adv.sample_within(&ctx, &allowed, &costs, 2.0)
                .unwrap()
                .choices
                == [1, 0, 1]
        })
        .count();
    assert!(
        hits > 280,
        "the worst affordable plan was sampled {hits}/400"
    );
    // Bad shapes are refused by name.
    costs.pop();
    let e = adv
        .sample_within(&ctx, &allowed, &costs, 2.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("costs"), "{e}");
}
