//! The realism discriminator separates separable distributions and not identical ones.

use policies::discriminator::{auc, Discriminator, DiscriminatorConfig};
use policies::rng::seeded;
use rand_distr::{Distribution, StandardNormal};

const DIM: usize = 8;

fn gaussian(n: usize, shift: f32, seed: u64) -> Vec<f32> {
    let mut rng = seeded(seed);
    (0..n * DIM)
        .map(|_| StandardNormal.sample(&mut rng))
        .map(|x: f32| x + shift)
        .collect()
}

fn disc() -> Discriminator {
    let cfg = DiscriminatorConfig {
        input_dim: DIM,
        hidden: vec![32, 32],
        label_smoothing: 0.1,
        ..Default::default()
    };
    Discriminator::new(&cfg, 3).unwrap()
}

#[test]
fn separable_distributions_reach_high_auc_on_held_out_data() {
    // Real ~ N(0, I), synthesized ~ N(1.5 * 1, I) in 8 dims: the Bayes-optimal AUC is
    // Phi(1.5 * sqrt(8) / sqrt(2)) = Phi(3) = 0.9987.
    let mut d = disc();
    d.fit(&gaussian(1000, 0.0, 1), &gaussian(1000, 1.5, 2), 8, 64)
        .unwrap();
    let (real, fake) = (gaussian(1000, 0.0, 3), gaussian(1000, 1.5, 4));
    let a = auc(&d.log_d(&real).unwrap(), &d.log_d(&fake).unwrap()).unwrap();
    assert!(a >= 0.95, "AUC {a}");
    // log D is a log-probability: finite and <= 0; higher on real data.
    let lr = d.log_d(&real).unwrap();
    let lf = d.log_d(&fake).unwrap();
    assert!(lr.iter().chain(&lf).all(|x| x.is_finite() && *x <= 0.0));
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    assert!(
        mean(&lr) > mean(&lf) + 1.0,
        "{} vs {}",
        mean(&lr),
        mean(&lf)
    );
    // Label smoothing 0.1 keeps real predictions at or below about 0.95: log D stays away from 0.
    assert!(mean(&lr) < -0.02, "{}", mean(&lr));
}

#[test]
fn identical_distributions_give_chance_auc_on_held_out_data() {
    let mut d = disc();
    d.fit(&gaussian(1000, 0.0, 5), &gaussian(1000, 0.0, 6), 8, 64)
        .unwrap();
    let a = auc(
        &d.log_d(&gaussian(1000, 0.0, 7)).unwrap(),
        &d.log_d(&gaussian(1000, 0.0, 8)).unwrap(),
    )
    .unwrap();
    // The AUC of a fixed scorer on two independent samples of 1000 has sd ~0.013.
    assert!((a - 0.5).abs() < 0.07, "AUC {a}");
}

#[test]
fn checkpoint_roundtrip_keeps_scores_and_training_continuation() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("disc");
    let mut d = disc();
    let (real, fake) = (gaussian(64, 0.0, 9), gaussian(64, 1.0, 10));
    d.train_step(&real, &fake).unwrap();
    d.save(&p).unwrap();
    let mut e = Discriminator::load(&p).unwrap();
    assert_eq!(d.log_d(&real).unwrap(), e.log_d(&real).unwrap());
    let sd = d.fit(&real, &fake, 1, 16).unwrap();
    let se = e.fit(&real, &fake, 1, 16).unwrap();
    assert_eq!(sd, se);
    assert_eq!(d.log_d(&fake).unwrap(), e.log_d(&fake).unwrap());
}
