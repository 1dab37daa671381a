//! Rollouts run each environment on its worker without waiting for the others' steps, and
//! are the same rollouts as lock-step ones: the policy is fixed within a rollout and every
//! environment samples from a generator of its own.

use crate::{fast_ppo, net};
use policies::ppo::{PpoAgent, RolloutBuffer, StepRecord};
use policies::rollout::{collect, Env, Episode, Step, StepInfo, VecEnv};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Steps taken by the free environment, and whether the gate is open.
type Shared = Arc<(Mutex<u32>, Condvar)>;

/// Env 0 (`gate`) holds its first step until env 1 has taken `until` steps (or 20 s have
/// passed, recorded in `waited_out`); env 1 counts its steps.
struct Gated {
    gate: bool,
    until: u32,
    shared: Shared,
    first: bool,
    waited_out: Arc<Mutex<bool>>,
}

impl Env for Gated {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        1
    }
    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        Ok(vec![0.0])
    }
    fn step(&mut self, _action: &[u32]) -> Result<Step, Self::Error> {
        let (count, cv) = &*self.shared;
        if self.gate {
            if self.first {
                self.first = false;
                let guard = count.lock().unwrap();
                let (count, r) = cv
                    .wait_timeout_while(guard, Duration::from_secs(20), |n| *n < self.until)
                    .unwrap();
                drop(count);
                *self.waited_out.lock().unwrap() = r.timed_out();
            }
        } else {
            *count.lock().unwrap() += 1;
            cv.notify_all();
        }
        Ok(Step {
            obs: vec![0.0],
            ..Step::default()
        })
    }
}

#[test]
fn a_slow_step_of_one_environment_holds_up_no_other_in_a_rollout() {
    let steps = 8;
    let shared: Shared = Arc::new((Mutex::new(0), Condvar::new()));
    let waited_out = Arc::new(Mutex::new(false));
    let envs: Vec<Gated> = [true, false]
        .into_iter()
        .map(|gate| Gated {
            gate,
            until: steps as u32,
            shared: shared.clone(),
            first: true,
            waited_out: waited_out.clone(),
        })
        .collect();
    let cfg = fast_ppo(2, steps, 1e-3);
    let mut agent = PpoAgent::new(&net(1, vec![2], vec![4]), &cfg, 3).unwrap();
    let mut venv = VecEnv::with_workers(envs, 2).unwrap();
    let mut buf = RolloutBuffer::new(steps, 2, agent.net_config(), false);
    collect(&mut agent, &mut venv, &mut buf).unwrap();
    // In lock-step env 1 could not take its second step before env 0's first returned.
    assert!(
        !*waited_out.lock().unwrap(),
        "env 1 could not run its rollout while env 0's first step waited"
    );
    assert_eq!(*shared.0.lock().unwrap(), steps as u32);
}

/// A walk on a line: action 1 moves right, 0 stays; reward the position; the episode ends
/// (terminal) at `goal`, or by its time limit after `limit` steps. Steps sleep a little, by
/// environment and time, so the workers' timings differ.
#[derive(Debug, Clone)]
struct Walk {
    id: usize,
    goal: u32,
    limit: u32,
    pos: u32,
    t: u32,
}

impl Env for Walk {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        2
    }
    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        (self.pos, self.t) = (0, 0);
        Ok(vec![0.0, self.id as f32])
    }
    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error> {
        std::thread::sleep(Duration::from_micros(
            ((self.id * 7 + self.t as usize) % 3) as u64 * 300,
        ));
        self.t += 1;
        self.pos += action[0];
        let terminated = self.pos >= self.goal;
        Ok(Step {
            obs: vec![self.pos as f32 / 4.0, self.id as f32],
            reward: self.pos as f32,
            terminated,
            truncated: !terminated && self.t >= self.limit,
            masked: false,
            info: StepInfo {
                level: Some(format!("walk-{}", self.id)),
                success: terminated,
                progress: f64::from(self.pos) / f64::from(self.goal),
            },
        })
    }
}

fn walks() -> Vec<Walk> {
    (0..5)
        .map(|id| Walk {
            id,
            goal: 2 + id as u32 % 3,
            limit: 3 + id as u32,
            pos: 0,
            t: 0,
        })
        .collect()
}

/// The same rollout stepped in lock-step, every environment with its own generator drawn as
/// `collect` draws them.
fn lock_step(agent: &mut PpoAgent, steps: usize) -> (RolloutBuffer, Vec<Episode>, Vec<f32>) {
    let mut venv = VecEnv::new(walks()).unwrap();
    let n = venv.len();
    let mut rngs = agent.fork_rngs(n);
    let mut buf = RolloutBuffer::new(steps, n, agent.net_config(), false);
    let mut episodes = Vec::new();
    for _ in 0..steps {
        let obs = venv.obs().to_vec();
        let (mut actions, mut log_probs, mut values) = (vec![], vec![], vec![]);
        for (i, rng) in rngs.iter_mut().enumerate() {
            let out = agent.act_with(&obs[i * 2..i * 2 + 2], None, rng).unwrap();
            actions.extend(out.actions);
            log_probs.extend(out.log_probs);
            values.extend(out.values);
        }
        let s = venv.step(&actions).unwrap();
        let final_values = agent.truncation_values(&s.truncated, &s.final_obs).unwrap();
        buf.push(&StepRecord {
            obs: &obs,
            masks: None,
            valid: Some(&s.valid),
            actions: &actions,
            log_probs: &log_probs,
            values: &values,
            rewards: &s.rewards,
            terminated: &s.terminated,
            truncated: &s.truncated,
            final_values: &final_values,
        })
        .unwrap();
        episodes.extend(s.episodes);
    }
    let last = agent.values(venv.obs()).unwrap();
    buf.set_last_values(&last).unwrap();
    (buf, episodes, venv.obs().to_vec())
}

#[test]
fn a_rollout_is_the_lock_step_one_whatever_the_workers() {
    let steps = 12;
    let cfg = fast_ppo(5, steps, 1e-3);
    let agent = || PpoAgent::new(&net(2, vec![2], vec![8]), &cfg, 11).unwrap();
    let mut reference = agent();
    let (want_buf, want_eps, want_obs) = lock_step(&mut reference, steps);
    assert!(want_eps.iter().any(|e| e.truncated) && want_eps.iter().any(|e| !e.truncated));
    assert!(
        want_buf.final_values().iter().any(|&v| v != 0.0),
        "a time limit's bootstrap is part of what is compared"
    );
    for workers in [1, 2, 5] {
        let mut a = agent();
        let mut venv = VecEnv::with_workers(walks(), workers).unwrap();
        let mut buf = RolloutBuffer::new(steps, 5, a.net_config(), false);
        let eps = collect(&mut a, &mut venv, &mut buf).unwrap();
        assert_eq!(
            format!("{buf:?}"),
            format!("{want_buf:?}"),
            "{workers} workers"
        );
        assert_eq!(eps, want_eps, "{workers} workers");
        assert_eq!(venv.obs(), want_obs.as_slice(), "{workers} workers");
        // The agent's generator moved on as the reference's did (a checkpoint resumes).
        assert_eq!(
            a.state().unwrap(),
            reference.state().unwrap(),
            "{workers} workers"
        );
    }
}

/// Env 1 panics at its second step: the rollout fails, naming it, and trains on nothing.
#[test]
fn a_panicking_environment_fails_the_rollout_by_name() {
    struct Panics {
        id: usize,
        t: u32,
    }
    impl Env for Panics {
        type Error = std::convert::Infallible;
        fn obs_dim(&self) -> usize {
            1
        }
        fn action_dims(&self) -> Vec<usize> {
            vec![2]
        }
        fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
            Ok(vec![0.0])
        }
        fn step(&mut self, _action: &[u32]) -> Result<Step, Self::Error> {
            self.t += 1;
            assert!(self.id != 1 || self.t < 2, "env 1 breaks");
            Ok(Step {
                obs: vec![0.0],
                ..Step::default()
            })
        }
    }
    for workers in [1, 3] {
        let envs = (0..3).map(|id| Panics { id, t: 0 }).collect();
        let cfg = fast_ppo(3, 4, 1e-3);
        let mut agent = PpoAgent::new(&net(1, vec![2], vec![4]), &cfg, 3).unwrap();
        let mut venv = VecEnv::with_workers(envs, workers).unwrap();
        let mut buf = RolloutBuffer::new(4, 3, agent.net_config(), false);
        let e = collect(&mut agent, &mut venv, &mut buf)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("env 1") && e.contains("panicked: env 1 breaks"),
            "{workers} workers: {e}"
        );
        assert!(
            agent.update(&buf).is_err(),
            "an empty buffer must not be trained on"
        );
    }
}
