//! Gymnasium's `CartPole-v1`, ported line by line from `gymnasium/envs/classic_control/
//! cartpole.py` (Euler integrator, physics in f64, observations in f32) with the
//! `TimeLimit` wrapper's 500-step truncation.
//!
//! Reward is 1 for every step, including the one that terminates; `terminated` when the
//! pole passes 12 degrees or the cart leaves +-2.4; `truncated` at step 500.

use rand::Rng as _;

use crate::rng::{self, Rng};
use crate::rollout::{Env, Step};

/// Gymnasium's constants.
pub const GRAVITY: f64 = 9.8;
/// Cart mass.
pub const MASSCART: f64 = 1.0;
/// Pole mass.
pub const MASSPOLE: f64 = 0.1;
/// Half the pole's length.
pub const LENGTH: f64 = 0.5;
/// Force magnitude.
pub const FORCE_MAG: f64 = 10.0;
/// Seconds between state updates.
pub const TAU: f64 = 0.02;
/// Angle at which the episode fails (12 degrees).
pub const THETA_THRESHOLD_RADIANS: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
/// Cart position at which the episode fails.
pub const X_THRESHOLD: f64 = 2.4;
/// `CartPole-v1`'s `max_episode_steps`.
pub const MAX_EPISODE_STEPS: u32 = 500;

/// The CartPole state `(x, x_dot, theta, theta_dot)` and its episode clock.
#[derive(Debug, Clone)]
pub struct CartPole {
    state: [f64; 4],
    elapsed: u32,
    max_steps: u32,
    rng: Rng,
}

impl CartPole {
    /// A CartPole whose resets draw from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: [0.0; 4],
            elapsed: 0,
            max_steps: MAX_EPISODE_STEPS,
            rng: rng::seeded(seed),
        }
    }

    /// Set the state directly (tests, replays).
    pub fn set_state(&mut self, state: [f64; 4]) {
        self.state = state;
    }

    /// The current state.
    pub fn state(&self) -> [f64; 4] {
        self.state
    }

    fn obs(&self) -> Vec<f32> {
        self.state.iter().map(|&x| x as f32).collect()
    }

    /// Gymnasium's `step` for action 0 (push left) or 1 (push right).
    pub fn physics(&mut self, action: u32) -> bool {
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        let costheta = theta.cos();
        let sintheta = theta.sin();
        let total_mass = MASSPOLE + MASSCART;
        let polemass_length = MASSPOLE * LENGTH;
        let temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass;
        let thetaacc = (GRAVITY * sintheta - costheta * temp)
            / (LENGTH * (4.0 / 3.0 - MASSPOLE * costheta * costheta / total_mass));
        let xacc = temp - polemass_length * thetaacc * costheta / total_mass;
        // Euler integration, in Gymnasium's order.
        let x = x + TAU * x_dot;
        let x_dot = x_dot + TAU * xacc;
        let theta = theta + TAU * theta_dot;
        let theta_dot = theta_dot + TAU * thetaacc;
        self.state = [x, x_dot, theta, theta_dot];
        // Gymnasium: x < -x_threshold or x > x_threshold or theta < -t or theta > t.
        !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
            || !(-THETA_THRESHOLD_RADIANS..=THETA_THRESHOLD_RADIANS).contains(&theta)
    }
}

impl Env for CartPole {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        4
    }

    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }

    /// Uniform(-0.05, 0.05) for each state variable.
    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        for s in self.state.iter_mut() {
            *s = self.rng.gen_range(-0.05..0.05);
        }
        self.elapsed = 0;
        Ok(self.obs())
    }

    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error> {
        let terminated = self.physics(action.first().copied().unwrap_or(0));
        self.elapsed += 1;
        Ok(Step {
            obs: self.obs(),
            reward: 1.0,
            terminated,
            truncated: self.elapsed >= self.max_steps,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_from_rest_matches_hand_computed_dynamics() {
        // From rest, push right: temp = 10/1.1, thetaacc = -temp / (0.5 (4/3 - 0.1/1.1)),
        // xacc = temp - 0.05 thetaacc / 1.1; Gymnasium gives [0, 0.19512196, 0, -0.29268292].
        let mut c = CartPole::new(0);
        c.set_state([0.0; 4]);
        let s = c.step(&[1]).unwrap();
        let temp = 10.0 / 1.1;
        let thetaacc = -temp / (0.5 * (4.0 / 3.0 - 0.1 / 1.1));
        let xacc = temp - 0.05 * thetaacc / 1.1;
        assert_eq!(c.state(), [0.0, 0.02 * xacc, 0.0, 0.02 * thetaacc]);
        let want = [0.0f32, 0.195_121_96, 0.0, -0.292_682_92];
        for (g, w) in s.obs.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{:?}", s.obs);
        }
        assert!(!s.terminated && !s.truncated);
        assert_eq!(s.reward, 1.0);
    }

    #[test]
    fn terminates_past_the_thresholds_with_reward_one() {
        let mut c = CartPole::new(0);
        c.set_state([0.0, 0.0, 0.2094, 0.1]);
        let s = c.step(&[0]).unwrap();
        assert!(s.terminated, "theta {}", c.state()[2]);
        assert_eq!(s.reward, 1.0);
        c.set_state([2.39, 1.0, 0.0, 0.0]);
        assert!(c.step(&[1]).unwrap().terminated);
    }

    #[test]
    fn truncates_at_500_steps_and_resets_in_range() {
        let mut c = CartPole::new(3);
        let o = c.reset().unwrap();
        assert!(o.iter().all(|x| x.abs() <= 0.05));
        let mut last = None;
        for i in 0..MAX_EPISODE_STEPS {
            // Keep the pole up artificially: reset the physical state but not the clock.
            c.set_state([0.0; 4]);
            let s = c.step(&[(i % 2)]).unwrap();
            last = Some(s);
        }
        let s = last.unwrap();
        assert!(s.truncated && !s.terminated);
    }

    #[test]
    fn same_seed_same_resets() {
        let mut a = CartPole::new(11);
        let mut b = CartPole::new(11);
        for _ in 0..3 {
            assert_eq!(a.reset().unwrap(), b.reset().unwrap());
        }
    }
}
