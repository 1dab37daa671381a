//! PPO must learn small tasks in seconds.

use policies::envs::toy::{ContextualBandit, DelayedChain, MaskedMultiDiscrete};
use policies::ppo::PpoAgent;
use policies::rollout::VecEnv;

use crate::{fast_ppo, net, train};

fn one_hot(n: usize, i: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    v[i] = 1.0;
    v
}

#[test]
fn contextual_bandit_learns_the_best_arm_of_every_context_shared_or_separate() {
    let best = vec![2, 0, 3, 1];
    for shared in [false, true] {
        let envs = (0..8)
            .map(|i| ContextualBandit::new(best.clone(), 4, 100 + i))
            .collect();
        let mut venv = VecEnv::new(envs).unwrap();
        let cfg = policies::nets::ActorCriticConfig {
            shared_trunk: shared,
            ..net(4, vec![4], vec![32])
        };
        let mut agent = PpoAgent::new(&cfg, &fast_ppo(8, 16, 3e-3), 1).unwrap();
        // Before training: uniform (policy head gain 0.01).
        let p0 = agent.probs(&one_hot(4, 0), None).unwrap();
        assert!(p0.iter().all(|&p| (p - 0.25).abs() < 0.02), "{p0:?}");
        let (eps, _) = train(&mut agent, &mut venv, false, 50);
        for (c, &b) in best.iter().enumerate() {
            let a = agent.act_greedy(&one_hot(4, c), None).unwrap().actions;
            assert_eq!(a, vec![b as u32], "shared {shared}, context {c}");
            let p = agent.probs(&one_hot(4, c), None).unwrap();
            assert!(p[b] > 0.9, "shared {shared}, context {c}: {p:?}");
        }
        let tail = &eps[eps.len() - 128..];
        let mean = tail.iter().map(|e| e.ret).sum::<f64>() / tail.len() as f64;
        assert!(
            mean > 0.85,
            "shared {shared}: mean reward of the last 128 episodes {mean}"
        );
    }
}

#[test]
fn delayed_reward_chain_is_solved_by_walking_right() {
    // Reward only after 4 consecutive "right" moves; "left" falls back to the start.
    let envs = (0..8).map(|_| DelayedChain::new(5, 20)).collect();
    let mut venv = VecEnv::new(envs).unwrap();
    let cfg = fast_ppo(8, 32, 3e-3);
    let mut agent = PpoAgent::new(&net(5, vec![2], vec![32]), &cfg, 2).unwrap();
    let (eps, _) = train(&mut agent, &mut venv, false, 40);
    for s in 0..4 {
        let a = agent.act_greedy(&one_hot(5, s), None).unwrap().actions;
        assert_eq!(a, vec![1], "state {s}");
    }
    // Finished episodes are now the shortest ones (4 steps, return 1).
    let tail = &eps[eps.len() - 40..];
    assert!(
        tail.iter().filter(|e| e.ret == 1.0 && e.len == 4).count() >= 32,
        "{tail:?}"
    );
    // Values grow towards the goal (the delayed reward has propagated back).
    let v = agent
        .values(&[one_hot(5, 0), one_hot(5, 3)].concat())
        .unwrap();
    assert!(v[1] > v[0] && v[1] > 0.8, "{v:?}");
}

#[test]
fn masked_multi_discrete_never_takes_a_masked_action_and_finds_the_best_valid_one() {
    let envs = (0..8).map(|i| MaskedMultiDiscrete::new(200 + i)).collect();
    let mut venv = VecEnv::new(envs).unwrap();
    let mut agent =
        PpoAgent::new(&net(3, vec![4, 3], vec![32]), &fast_ppo(8, 16, 3e-3), 3).unwrap();
    let (eps, _) = train(&mut agent, &mut venv, true, 50);
    assert!(eps.len() >= 50 * 128);
    let violations: u64 = venv
        .envs()
        .iter()
        .map(MaskedMultiDiscrete::violations)
        .sum();
    assert_eq!(violations, 0);
    for c in 0..3 {
        let mut mask = policies::envs::toy::MASK_A[c].to_vec();
        mask.extend_from_slice(&policies::envs::toy::MASK_B[c]);
        let obs = one_hot(3, c);
        let p = agent.probs(&obs, Some(&mask)).unwrap();
        for (i, &m) in mask.iter().enumerate() {
            if m == 0.0 {
                assert_eq!(
                    p[i], 0.0,
                    "context {c}: masked entry {i} has probability {}",
                    p[i]
                );
            }
        }
        let a = agent.act_greedy(&obs, Some(&mask)).unwrap().actions;
        assert_eq!(
            a,
            MaskedMultiDiscrete::best_valid(c).to_vec(),
            "context {c}"
        );
    }
    // Without masks the policy would be pulled towards the (masked) 2.0 entries; with them
    // the best valid return per context is 0.9, 0.9 or 1.2 (mean 1.0).
    let tail = &eps[eps.len() - 256..];
    let mean = tail.iter().map(|e| e.ret).sum::<f64>() / tail.len() as f64;
    assert!(mean > 0.9 && mean < 1.05, "{mean}");
}

#[test]
fn masked_actions_are_never_sent_to_the_environment() {
    let envs = (0..4).map(MaskedMultiDiscrete::new).collect();
    let mut venv = VecEnv::new(envs).unwrap();
    let mut agent =
        PpoAgent::new(&net(3, vec![4, 3], vec![16]), &fast_ppo(4, 64, 3e-3), 4).unwrap();
    // Untrained (near-uniform) policy: without masks about 1 - (3/4)(2/3) = 1/2 of the
    // actions would be invalid.
    train(&mut agent, &mut venv, true, 3);
    let violations: u64 = venv
        .envs()
        .iter()
        .map(MaskedMultiDiscrete::violations)
        .sum();
    assert_eq!(violations, 0);
}

/// Reward 1 every step, never terminal, cut by a time limit after 3 steps; observes
/// (t mod 3) / 10, so the final observation equals the first one.
#[derive(Debug, Clone)]
struct Clock {
    t: u32,
}

impl policies::rollout::Env for Clock {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        1
    }
    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        self.t = 0;
        Ok(vec![0.0])
    }
    fn step(&mut self, _action: &[u32]) -> Result<policies::rollout::Step, Self::Error> {
        self.t += 1;
        Ok(policies::rollout::Step {
            obs: vec![(self.t % 3) as f32 / 10.0],
            reward: 1.0,
            terminated: false,
            truncated: self.t >= 3,
            ..Default::default()
        })
    }
}

#[test]
fn time_limit_truncation_bootstraps_from_the_final_observation() {
    use policies::ppo::{PpoConfig, RolloutBuffer};
    use policies::rollout::collect;
    // gamma 0.5: the true value of this endless task is 1 / (1 - 0.5) = 2 in every state.
    // Treating the time limit as terminal would teach V(t=2) = 1, V(t=1) = 1.5, V(t=0) = 1.75.
    let cfg = PpoConfig {
        gamma: 0.5,
        gae_lambda: 0.95,
        ..fast_ppo(4, 12, 1e-2)
    };
    let mut agent = PpoAgent::new(&net(1, vec![2], vec![16]), &cfg, 9).unwrap();
    let mut venv = VecEnv::new(vec![Clock { t: 0 }; 4]).unwrap();
    let mut buf = RolloutBuffer::new(12, 4, agent.net_config(), false);
    collect(&mut agent, &mut venv, &mut buf).unwrap();
    // Every truncated step carries V(final obs) = V([0.0]); nothing is terminal.
    let v_final = agent.values(&[0.0]).unwrap()[0];
    assert_eq!(buf.truncated().iter().filter(|&&t| t).count(), 16);
    assert!(buf.terminated().iter().all(|&t| !t));
    for (i, &t) in buf.truncated().iter().enumerate() {
        assert_eq!(
            buf.final_values()[i],
            if t { v_final } else { 0.0 },
            "step {i}"
        );
    }
    train(&mut agent, &mut venv, false, 150);
    let v = agent.values(&[0.0, 0.1, 0.2]).unwrap();
    for (t, &x) in v.iter().enumerate() {
        assert!(
            (x - 2.0).abs() < 0.2,
            "V(t={t}) = {x}, expected 2 (bootstrapped), got {v:?}"
        );
    }
}

/// One-step episodes whose observation is a hashed encoding of a log line; the right
/// action depends on what the line says.
#[derive(Debug, Clone)]
struct LogTriage {
    enc: policies::encoder::HashedTextEncoder,
    rng: policies::rng::Rng,
    case: usize,
}

const LOG_LINES: [(&str, u32); 3] = [
    ("write /var/lib/db: No space left on device", 0),
    ("curl: (6) Could not resolve host: mirror.local", 1),
    ("bash: /usr/bin/make: Permission denied", 2),
];

impl LogTriage {
    fn obs(&self) -> Vec<f32> {
        use policies::encoder::{Encoder, Observation};
        let (text, _) = LOG_LINES[self.case];
        self.enc
            .encode(&Observation {
                text,
                numeric: &[self.case as f32 / 10.0],
            })
            .unwrap()
    }
}

impl policies::rollout::Env for LogTriage {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        use policies::encoder::Encoder;
        self.enc.dim()
    }
    fn action_dims(&self) -> Vec<usize> {
        vec![3]
    }
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        use rand::Rng;
        self.case = self.rng.gen_range(0..3);
        Ok(self.obs())
    }
    fn step(&mut self, action: &[u32]) -> Result<policies::rollout::Step, Self::Error> {
        let reward = if action[0] == LOG_LINES[self.case].1 {
            1.0
        } else {
            0.0
        };
        Ok(policies::rollout::Step {
            obs: self.obs(),
            reward,
            terminated: true,
            truncated: false,
            ..Default::default()
        })
    }
}

#[test]
fn ppo_learns_from_hashed_text_observations() {
    use policies::encoder::{Encoder, HashedTextConfig, HashedTextEncoder, Observation};
    let enc = HashedTextEncoder::new(HashedTextConfig {
        text_dim: 256,
        numeric_dim: 1,
        ..Default::default()
    })
    .unwrap();
    let envs = (0..8)
        .map(|i| LogTriage {
            enc: enc.clone(),
            rng: policies::rng::seeded(300 + i),
            case: 0,
        })
        .collect();
    let mut venv = VecEnv::new(envs).unwrap();
    let mut agent = PpoAgent::new(
        &net(enc.dim(), vec![3], vec![32]),
        &fast_ppo(8, 16, 3e-3),
        5,
    )
    .unwrap();
    train(&mut agent, &mut venv, false, 40);
    for (case, (text, want)) in LOG_LINES.iter().enumerate() {
        let obs = enc
            .encode(&Observation {
                text,
                numeric: &[case as f32 / 10.0],
            })
            .unwrap();
        assert_eq!(
            agent.act_greedy(&obs, None).unwrap().actions,
            vec![*want],
            "{text}"
        );
    }
}
