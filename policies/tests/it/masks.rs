//! Per-sample masks: a sample the environment failed on changes no parameter and is no
//! bootstrap target; the parallel vectorised wrapper delivers each episode's level, success
//! and failure flag with that episode.

use crate::{fast_ppo, net};
use policies::checkpoint::snapshot;
use policies::ppo::{PpoAgent, RolloutBuffer, StepRecord};
use policies::rollout::{collect, Env, Step, StepInfo, VecEnv};

/// Fill a 4-step x 2-env buffer; `poison` changes the rewards of the samples marked invalid
/// (env 1 at t = 2 and every sample of t = 3), and with `all_invalid` their observations too.
/// (An invalid sample's observation is the real state before the failing step: the step before
/// it bootstraps from its value, as from a time limit.)
fn rollout(agent: &PpoAgent, poison: bool, all_invalid: bool) -> RolloutBuffer {
    let mut buf = RolloutBuffer::new(4, 2, agent.net_config(), false);
    for t in 0..4 {
        let valid = if all_invalid {
            [false, false]
        } else {
            [t != 3, t != 3 && t != 2]
        };
        let mut obs = vec![t as f32 / 4.0, 0.5, -(t as f32) / 4.0, 0.25];
        let mut rewards = [1.0, (t % 2) as f32];
        for e in 0..2 {
            if poison && !valid[e] {
                rewards[e] = 1e6;
                if all_invalid {
                    obs[e * 2] = 1e3;
                    obs[e * 2 + 1] = -7e2;
                }
            }
        }
        let out = agent.act_greedy(&obs, None).unwrap();
        buf.push(&StepRecord {
            obs: &obs,
            masks: None,
            valid: Some(&valid),
            actions: &out.actions,
            log_probs: &out.log_probs,
            values: &out.values,
            rewards: &rewards,
            terminated: &[false, false],
            truncated: &[false, false],
            final_values: &[0.0, 0.0],
        })
        .unwrap();
    }
    buf.set_last_values(&[0.0, 0.0]).unwrap();
    buf
}

#[test]
fn a_masked_sample_changes_no_parameter() {
    let cfg = fast_ppo(2, 4, 1e-2);
    let make = || PpoAgent::new(&net(2, vec![3], vec![8]), &cfg, 5).unwrap();
    // Only invalid samples: the update moves nothing.
    let mut a = make();
    let before = snapshot(a.varmap()).unwrap();
    let buf = rollout(&a, true, true);
    a.update(&buf).unwrap();
    assert_eq!(snapshot(a.varmap()).unwrap(), before);
    // The same valid samples with different junk in the invalid ones: the same parameters.
    let (mut b, mut c) = (make(), make());
    let clean = rollout(&b, false, false);
    let poisoned = rollout(&c, true, false);
    b.update(&clean).unwrap();
    c.update(&poisoned).unwrap();
    let (sb, sc) = (snapshot(b.varmap()).unwrap(), snapshot(c.varmap()).unwrap());
    assert_eq!(sb, sc);
    assert_ne!(sb, before, "the valid samples must move the parameters");
}

/// A two-step task on level `id`: success on the second step; on level 3 the environment
/// fails (masked) at the first step of every episode.
#[derive(Debug, Clone)]
struct Levels {
    id: u64,
    t: u32,
    episodes: u64,
}

impl Env for Levels {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        1
    }
    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        self.t = 0;
        self.episodes += 1;
        Ok(vec![self.id as f32])
    }
    fn step(&mut self, _action: &[u32]) -> Result<Step, Self::Error> {
        self.t += 1;
        // Slow enough that the workers overlap.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let failed = self.id == 3;
        let done = self.t == 2;
        Ok(Step {
            obs: vec![self.id as f32],
            reward: if done { 1.0 } else { 0.0 },
            terminated: done && !failed,
            truncated: false,
            masked: failed,
            info: StepInfo {
                level: Some(format!("level-{}-episode-{}", self.id, self.episodes)),
                success: done && !failed,
                progress: f64::from(self.t) / 2.0,
            },
        })
    }
}

#[test]
fn the_parallel_wrapper_delivers_levels_and_flags_with_their_episode() {
    let envs: Vec<Levels> = (0..6)
        .map(|id| Levels {
            id,
            t: 0,
            episodes: 0,
        })
        .collect();
    let cfg = fast_ppo(6, 8, 1e-3);
    let mut agent = PpoAgent::new(&net(1, vec![2], vec![8]), &cfg, 1).unwrap();
    let mut venv = VecEnv::with_workers(envs, 3).unwrap();
    let mut buf = RolloutBuffer::new(8, 6, agent.net_config(), false);
    let eps = collect(&mut agent, &mut venv, &mut buf).unwrap();
    // 8 steps: 4 episodes per ordinary level, 8 masked one-step episodes on level 3.
    for id in 0..6u64 {
        let mine: Vec<_> = eps.iter().filter(|e| e.env == id as usize).collect();
        let n = if id == 3 { 8 } else { 4 };
        assert_eq!(mine.len(), n, "level {id}");
        for (k, e) in mine.iter().enumerate() {
            let level = format!("level-{id}-episode-{}", k + 1);
            assert_eq!(e.info.level.as_deref(), Some(level.as_str()));
            assert_eq!(e.masked, id == 3);
            assert_eq!(e.info.success, id != 3);
            assert!(!e.truncated, "a failure is never a time limit");
        }
    }
    // The masked samples are the invalid ones of the buffer; nothing is a time limit.
    for (i, &v) in buf.valid().iter().enumerate() {
        assert_eq!(v, i % 6 != 3, "sample {i}");
    }
    assert!(buf.truncated().iter().all(|t| !t));
}
