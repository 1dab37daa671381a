//! Tests of the PPO losses, the rollout buffer and the agent.
use super::*;

fn t1(v: &[f32]) -> Tensor {
    Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap()
}

#[test]
fn gae_single_env_no_done_matches_hand_computation() {
    // gamma 0.5, lambda 0.5; V = [1, 2], r = [1, 1], V(s_2) = 4.
    // delta_1 = 1 + 0.5*4 - 2 = 1;  A_1 = 1
    // delta_0 = 1 + 0.5*2 - 1 = 1;  A_0 = 1 + 0.25*1 = 1.25
    let inp = GaeInput {
        num_steps: 2,
        num_envs: 1,
        rewards: &[1.0, 1.0],
        values: &[1.0, 2.0],
        terminated: &[false, false],
        truncated: &[false, false],
        final_values: &[0.0, 0.0],
        last_values: &[4.0],
        valid: None,
    };
    let (a, r) = gae(&inp, 0.5, 0.5).unwrap();
    assert_eq!(a, vec![1.25, 1.0]);
    assert_eq!(r, vec![2.25, 3.0]);
}

#[test]
fn gae_terminal_does_not_bootstrap_and_truncation_does() {
    // 3 steps, 2 envs (time-major), gamma 0.9, lambda 0.8, all V = 1, r = 1.
    // env 0: terminated at t=1.   env 1: truncated at t=1 with V(final obs) = 10.
    // t=2 (both): next = last_values [2, 3]; delta = 1 + 0.9*last - 1.
    //   env0: 1.8; env1: 2.7.
    // t=1 env0 terminated: delta = 1 + 0 - 1 = 0, A = 0 (no carry).
    // t=1 env1 truncated: delta = 1 + 0.9*10 - 1 = 9, A = 9 (no carry).
    // t=0: delta = 1 + 0.9*1 - 1 = 0.9; A = 0.9 + 0.72 * A_1.
    //   env0: 0.9; env1: 0.9 + 0.72*9 = 7.38.
    let inp = GaeInput {
        num_steps: 3,
        num_envs: 2,
        rewards: &[1.0; 6],
        values: &[1.0; 6],
        terminated: &[false, false, true, false, false, false],
        truncated: &[false, false, false, true, false, false],
        final_values: &[0.0, 0.0, 0.0, 10.0, 0.0, 0.0],
        last_values: &[2.0, 3.0],
        valid: None,
    };
    let (a, r) = gae(&inp, 0.9, 0.8).unwrap();
    let want = [0.9, 7.38, 0.0, 9.0, 1.8, 2.7];
    for (g, w) in a.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{a:?}");
    }
    for (i, (g, w)) in r.iter().zip(want).enumerate() {
        assert!((g - (w + 1.0)).abs() < 1e-5, "return {i}: {r:?}");
    }
    // Treating the truncation as terminal would give A = 0 at (t=1, env1): it must not.
    let as_terminal = GaeInput {
        terminated: &[false, false, true, true, false, false],
        ..inp
    };
    let (b, _) = gae(&as_terminal, 0.9, 0.8).unwrap();
    assert!((b[3] - 0.0).abs() < 1e-6 && (a[3] - b[3]).abs() > 8.0);
}

#[test]
fn gae_rejects_wrong_lengths() {
    let inp = GaeInput {
        num_steps: 2,
        num_envs: 1,
        rewards: &[1.0],
        values: &[1.0, 2.0],
        terminated: &[false, false],
        truncated: &[false, false],
        final_values: &[0.0, 0.0],
        last_values: &[4.0],
        valid: None,
    };
    let e = gae(&inp, 0.5, 0.5).unwrap_err().to_string();
    assert!(e.contains("`rewards`"), "{e}");
}

#[test]
fn advantage_normalisation_uses_unbiased_std() {
    let mut a = [1.0f32, 2.0, 3.0];
    normalize_advantages(&mut a);
    // mean 2, unbiased std 1.
    for (g, w) in a.iter().zip([-1.0f32, 0.0, 1.0]) {
        assert!((g - w).abs() < 1e-6);
    }
    let mut one = [5.0f32];
    normalize_advantages(&mut one);
    assert_eq!(one, [5.0]);
}

#[test]
fn explained_variance_hand_values() {
    assert_eq!(
        explained_variance(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]),
        Some(1.0)
    );
    // returns [1, 3] (var 1), values [0, 0] -> residual var 1 -> 0.
    assert_eq!(explained_variance(&[0.0, 0.0], &[1.0, 3.0]), Some(0.0));
    assert_eq!(explained_variance(&[0.0, 1.0], &[2.0, 2.0]), None);
}

#[test]
fn clipped_losses_match_hand_computation() {
    let cfg = PpoConfig {
        clip_coef: 0.2,
        ent_coef: 0.01,
        vf_coef: 0.5,
        ..PpoConfig::default()
    };
    // ratios: e^0.5 = 1.6487 (clipped for A > 0), e^-0.5 = 0.6065 (clipped for A < 0
    // only when it helps), 1.0.
    let old = t1(&[0.0, 0.0, 0.0]);
    let new = t1(&[0.5, -0.5, 0.0]);
    let adv = t1(&[1.0, -1.0, 2.0]);
    // values: new [1, 0, 3], old [0, 0, 1], returns [2, 1, 3]
    let losses = ppo_losses(
        &LossInputs {
            new_logp: &new,
            old_logp: &old,
            advantages: &adv,
            new_values: &t1(&[1.0, 0.0, 3.0]),
            old_values: &t1(&[0.0, 0.0, 1.0]),
            returns: &t1(&[2.0, 1.0, 3.0]),
            entropy: &t1(&[0.3, 0.6, 0.9]),
        },
        &cfg,
    )
    .unwrap();
    let r0 = 0.5f64.exp();
    let r1 = (-0.5f64).exp();
    // sample 0: max(-1*r0, -1*1.2) = -1.2; sample 1: max(1*r1, 1*0.8) = 0.8;
    // sample 2: max(-2, -2) = -2.  mean = (-1.2 + 0.8 - 2)/3 = -0.8
    assert!(
        (f64::from(losses.policy) - (-0.8)).abs() < 1e-6,
        "{}",
        losses.policy
    );
    // value: s0 unclipped (1-2)^2 = 1, clipped 0+clip(1)=0.2 -> (0.2-2)^2 = 3.24 -> 3.24
    // s1: 1 and 1 -> 1; s2: 0 and (1+0.2-3)^2 = 3.24 -> 3.24. 0.5*mean = 0.5*7.48/3
    let want_v = 0.5 * (3.24 + 1.0 + 3.24) / 3.0;
    assert!(
        (f64::from(losses.value) - want_v).abs() < 1e-5,
        "{}",
        losses.value
    );
    assert!((losses.entropy - 0.6).abs() < 1e-6);
    let total = losses.total.to_scalar::<f32>().unwrap();
    assert!((f64::from(total) - (-0.8 - 0.01 * 0.6 + 0.5 * want_v)).abs() < 1e-5);
    // clip fraction: |r0-1| = 0.65 > 0.2, |r1-1| = 0.39 > 0.2, 0 -> 2/3
    assert!((losses.clip_fraction - 2.0 / 3.0).abs() < 1e-6);
    let kl = ((r0 - 1.0 - 0.5) + (r1 - 1.0 + 0.5) + 0.0) / 3.0;
    assert!((f64::from(losses.approx_kl) - kl).abs() < 1e-6);
    assert!((losses.old_approx_kl - 0.0).abs() < 1e-7);
}

#[test]
fn clipped_surrogate_has_zero_gradient_outside_the_trust_region() {
    // A > 0 and ratio above 1 + c: the clipped term wins, gradient wrt new_logp is 0.
    // A > 0 and ratio inside: gradient is -A * r / B.
    let cfg = PpoConfig {
        ent_coef: 0.0,
        vf_coef: 0.0,
        ..PpoConfig::default()
    };
    let v = candle_core::Var::from_slice(&[0.5f32, 0.1], 2, &Device::Cpu).unwrap();
    let zero = t1(&[0.0, 0.0]);
    let losses = ppo_losses(
        &LossInputs {
            new_logp: v.as_tensor(),
            old_logp: &zero,
            advantages: &t1(&[1.0, 1.0]),
            new_values: &zero,
            old_values: &zero,
            returns: &zero,
            entropy: &zero,
        },
        &cfg,
    )
    .unwrap();
    let g = losses.total.backward().unwrap();
    let g = g.get(v.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(g[0], 0.0);
    assert!(
        (f64::from(g[1]) - (-(0.1f64.exp()) / 2.0)).abs() < 1e-6,
        "{g:?}"
    );
}

#[test]
fn config_errors_name_the_field() {
    let c = PpoConfig {
        num_minibatches: 3,
        ..PpoConfig::default()
    };
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("num_minibatches"));
    let c = PpoConfig {
        gamma: f64::NAN,
        ..PpoConfig::default()
    };
    assert!(c.validate().unwrap_err().to_string().contains("gamma"));
}
