//! Save -> load -> continue equals not stopping; same seed, same results; bad input.

use policies::checkpoint::{snapshot, state_path, weights_path};
use policies::envs::cartpole::CartPole;
use policies::ppo::{PpoAgent, PpoConfig, RolloutBuffer, StepRecord};
use policies::rollout::{collect, Env, Step, VecEnv};

use crate::{net, train};

fn cartpole(seed: u64) -> VecEnv<CartPole> {
    VecEnv::new((0..4).map(|i| CartPole::new(seed * 10 + i)).collect()).unwrap()
}

fn cfg() -> PpoConfig {
    PpoConfig {
        num_envs: 4,
        num_steps: 32,
        total_updates: 10,
        ..PpoConfig::default()
    }
}

#[test]
fn save_load_continue_gives_the_same_actions_and_update() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("agent");
    let net = net(4, vec![2], vec![16, 16]);
    let mut a = PpoAgent::new(&net, &cfg(), 7).unwrap();
    let mut venv = cartpole(7);
    train(&mut a, &mut venv, false, 2);
    a.save(&prefix).unwrap();
    assert!(weights_path(&prefix).exists() && state_path(&prefix).exists());
    let mut venv_b = venv.clone();

    // Not stopping.
    let probe: Vec<f32> = vec![0.01, -0.02, 0.03, 0.0, -0.04, 0.1, 0.02, -0.3];
    let act_a = a.act(&probe, None).unwrap();
    let mut buf_a = RolloutBuffer::new(32, 4, &net, false);
    collect(&mut a, &mut venv, &mut buf_a).unwrap();
    let stats_a = a.update(&buf_a).unwrap();

    // Stopped and restored.
    let mut b = PpoAgent::load(&prefix).unwrap();
    assert_eq!(b.updates(), 2);
    let act_b = b.act(&probe, None).unwrap();
    let mut buf_b = RolloutBuffer::new(32, 4, &net, false);
    collect(&mut b, &mut venv_b, &mut buf_b).unwrap();
    let stats_b = b.update(&buf_b).unwrap();

    assert_eq!(act_a, act_b);
    assert_eq!(buf_a.rewards(), buf_b.rewards());
    assert_eq!(stats_a, stats_b);
    assert_eq!(snapshot(a.varmap()).unwrap(), snapshot(b.varmap()).unwrap());
    assert_eq!(a.state().unwrap(), b.state().unwrap());
}

#[test]
fn same_seed_same_results_different_seed_differs() {
    let net = net(4, vec![2], vec![16]);
    let run = |seed: u64| {
        let mut a = PpoAgent::new(&net, &cfg(), seed).unwrap();
        let mut venv = cartpole(seed);
        let (eps, stats) = train(&mut a, &mut venv, false, 3);
        (eps, stats, snapshot(a.varmap()).unwrap())
    };
    let (e1, s1, w1) = run(5);
    let (e2, s2, w2) = run(5);
    assert_eq!(e1, e2);
    assert_eq!(s1, s2);
    assert_eq!(w1, w2);
    let (_, s3, w3) = run(6);
    assert_ne!(w1, w3);
    assert_ne!(s1, s3);
}

#[test]
fn checkpoint_of_another_architecture_or_truncated_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("small");
    let a = PpoAgent::new(&net(4, vec![2], vec![16]), &cfg(), 1).unwrap();
    a.save(&prefix).unwrap();
    // Wider hidden layer: the first mismatching tensor is named with both shapes.
    let mut wide = PpoAgent::new(&net(4, vec![2], vec![32]), &cfg(), 1).unwrap();
    let e = wide.load_weights(&prefix).unwrap_err().to_string();
    assert!(
        e.contains("small.safetensors")
            && e.contains("`actor.l0.bias`")
            && e.contains("[16]")
            && e.contains("[32]"),
        "{e}"
    );
    // Deeper net: a tensor the file lacks.
    let mut deep = PpoAgent::new(&net(4, vec![2], vec![16, 16]), &cfg(), 1).unwrap();
    let e = deep.load_weights(&prefix).unwrap_err().to_string();
    assert!(
        e.contains("`actor.l1.bias`") && e.contains("missing"),
        "{e}"
    );
    // Truncated weights and state.
    let w = weights_path(&prefix);
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let e = PpoAgent::load(&prefix).err().unwrap().to_string();
    assert!(
        e.contains("small.safetensors") && e.contains("truncated"),
        "{e}"
    );
    let s = state_path(&prefix);
    let bytes = std::fs::read(&s).unwrap();
    std::fs::write(&s, &bytes[..bytes.len() - 10]).unwrap();
    let e = PpoAgent::load(&prefix).err().unwrap().to_string();
    assert!(e.contains("small.state") && e.contains("truncated"), "{e}");
    // A state file of another kind of model.
    let adv =
        policies::adversary::Adversary::new(&policies::adversary::AdversaryConfig::default(), 0)
            .unwrap();
    let other = dir.path().join("adv");
    adv.save(&other).unwrap();
    let e = PpoAgent::load(&other).err().unwrap().to_string();
    assert!(
        e.contains("`adversary`") && e.contains("`ppo_agent`"),
        "{e}"
    );
}

/// CartPole that reports a NaN reward or observation at a given step.
#[derive(Debug, Clone)]
struct Poisoned {
    inner: CartPole,
    t: u32,
    at: u32,
    in_obs: bool,
}

impl Env for Poisoned {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        4
    }
    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        self.inner.reset()
    }
    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error> {
        self.t += 1;
        let mut s = self.inner.step(action)?;
        if self.t == self.at {
            if self.in_obs {
                s.obs[2] = f32::NAN;
            } else {
                s.reward = f32::NAN;
            }
        }
        Ok(s)
    }
}

#[test]
fn nan_rewards_and_observations_stop_training_with_a_named_error() {
    let net = net(4, vec![2], vec![8]);
    for in_obs in [false, true] {
        let envs = (0..4)
            .map(|i| Poisoned {
                inner: CartPole::new(i),
                t: 0,
                at: 3 + i as u32,
                in_obs,
            })
            .collect();
        let mut venv = VecEnv::new(envs).unwrap();
        let mut a = PpoAgent::new(&net, &cfg(), 0).unwrap();
        let before = snapshot(a.varmap()).unwrap();
        let mut buf = RolloutBuffer::new(32, 4, &net, false);
        let e = collect(&mut a, &mut venv, &mut buf)
            .unwrap_err()
            .to_string();
        if in_obs {
            assert!(
                e.contains("`obs`")
                    && e.contains("row 0")
                    && e.contains("column 2")
                    && e.contains("NaN"),
                "{e}"
            );
        } else {
            assert!(
                e.contains("`rewards`") && e.contains("row 0") && e.contains("NaN"),
                "{e}"
            );
        }
        assert!(
            a.update(&buf).is_err(),
            "a partial buffer must not be trained on"
        );
        assert_eq!(before, snapshot(a.varmap()).unwrap());
    }
}

#[test]
fn wrong_shapes_are_named() {
    let net4 = net(4, vec![2], vec![8]);
    let mut a = PpoAgent::new(&net4, &cfg(), 0).unwrap();
    let e = a.act(&[0.0; 6], None).unwrap_err().to_string();
    assert!(e.contains("`obs`") && e.contains("obs_dim 4"), "{e}");
    let e = a
        .act(&[0.0; 4], Some(&[1.0, 1.0, 1.0]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`mask`"), "{e}");
    let e = a.act(&[0.0; 4], Some(&[0.0, 0.0])).unwrap_err().to_string();
    assert!(
        e.contains("masks every choice of action dimension 0"),
        "{e}"
    );
    let mut buf = RolloutBuffer::new(32, 4, &net4, false);
    let e = buf
        .push(&StepRecord {
            valid: None,
            obs: &[0.0; 12],
            masks: None,
            actions: &[0; 4],
            log_probs: &[0.0; 4],
            values: &[0.0; 4],
            rewards: &[0.0; 4],
            terminated: &[false; 4],
            truncated: &[false; 4],
            final_values: &[0.0; 4],
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("`obs`") && e.contains("16 entries"), "{e}");
    // 5 envs x 4 features = 20 values would also fit 4 rows of obs_dim 5: caught up front.
    let net5 = net(5, vec![2], vec![8]);
    let mut b = PpoAgent::new(&net5, &cfg(), 0).unwrap();
    let mut venv5 = VecEnv::new((0..5).map(CartPole::new).collect()).unwrap();
    let mut buf5 = RolloutBuffer::new(32, 4, &net5, false);
    let e = collect(&mut b, &mut venv5, &mut buf5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("obs_dim 4") && e.contains("obs_dim 5"), "{e}");
    let bad = policies::nets::ActorCriticConfig {
        hidden: vec![0],
        ..net4
    };
    let e = PpoAgent::new(&bad, &cfg(), 0).err().unwrap().to_string();
    assert!(e.contains("`hidden`"), "{e}");
}

#[test]
fn target_kl_stops_updates_early_and_the_learning_rate_is_annealed() {
    let net = net(4, vec![2], vec![16]);
    let base = PpoConfig {
        num_envs: 4,
        num_steps: 32,
        total_updates: 4,
        learning_rate: 1e-2,
        ..PpoConfig::default()
    };
    for target_kl in [None, Some(1e-6)] {
        let mut a = PpoAgent::new(
            &net,
            &PpoConfig {
                target_kl,
                ..base.clone()
            },
            3,
        )
        .unwrap();
        let mut venv = cartpole(3);
        let mut buf = RolloutBuffer::new(32, 4, &net, false);
        for (i, want_lr) in [1e-2, 0.75e-2, 0.5e-2].into_iter().enumerate() {
            collect(&mut a, &mut venv, &mut buf).unwrap();
            let s = a.update(&buf).unwrap();
            assert_eq!(s.update, i as u64);
            assert!(
                (s.learning_rate - want_lr).abs() < 1e-15,
                "{}",
                s.learning_rate
            );
            match target_kl {
                None => assert!(
                    !s.early_stopped && s.epochs == 4 && s.minibatches == 16,
                    "{s:?}"
                ),
                // The first minibatch sees the collection policy (KL ~ 0); after one step
                // at lr 1e-2 the KL exceeds 1e-6 and the update stops.
                Some(_) => assert!(
                    s.early_stopped && s.minibatches < 16 && s.epochs == 1,
                    "{s:?}"
                ),
            }
        }
    }
}

#[test]
fn corrupted_checkpoints_give_errors_never_panics_or_huge_allocations() {
    use rand::Rng;
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("agent");
    let a = PpoAgent::new(&net(4, vec![2], vec![16]), &cfg(), 1).unwrap();
    // A state file claiming a 2^40-wide hidden layer next to the real weights: rejected
    // before anything is allocated.
    let mut st = a.state().unwrap();
    st.net.hidden = vec![1 << 40];
    policies::checkpoint::save(&prefix, policies::ppo::PPO_CHECKPOINT_KIND, a.varmap(), &st)
        .unwrap();
    let e = PpoAgent::load(&prefix).err().unwrap().to_string();
    assert!(
        e.contains("agent.safetensors") && e.contains("parameters"),
        "{e}"
    );
    // Random byte corruptions of either file: an error or a valid agent, never a panic.
    a.save(&prefix).unwrap();
    let files = [weights_path(&prefix), state_path(&prefix)];
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let mut rng = policies::rng::seeded(99);
    let mut errors = 0;
    for k in 0..200 {
        let which = k % 2;
        let mut bytes = originals[which].clone();
        for _ in 0..rng.gen_range(1..4) {
            let i = rng.gen_range(0..bytes.len());
            bytes[i] = rng.gen();
        }
        std::fs::write(&files[which], &bytes).unwrap();
        errors += usize::from(PpoAgent::load(&prefix).is_err());
        std::fs::write(&files[which], &originals[which]).unwrap();
    }
    assert!(errors > 0);
    PpoAgent::load(&prefix).unwrap();
}
