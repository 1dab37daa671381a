//! Small tasks that PPO must solve in seconds; the learning tests run on them.

use rand::Rng as _;

use crate::rng::{self, Rng};
use crate::rollout::{Env, Step};

fn one_hot(n: usize, i: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    v[i] = 1.0;
    v
}

/// One-step episodes: observe a one-hot context, pick an arm, reward 1 for the context's
/// best arm (`best[c]`), 0 otherwise.
#[derive(Debug, Clone)]
pub struct ContextualBandit {
    best: Vec<usize>,
    arms: usize,
    ctx: usize,
    rng: Rng,
}

impl ContextualBandit {
    /// `best[c]` is the rewarded arm of context `c`; arms are `0..arms`.
    pub fn new(best: Vec<usize>, arms: usize, seed: u64) -> Self {
        Self {
            best,
            arms,
            ctx: 0,
            rng: rng::seeded(seed),
        }
    }
}

impl Env for ContextualBandit {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        self.best.len()
    }

    fn action_dims(&self) -> Vec<usize> {
        vec![self.arms]
    }

    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        self.ctx = self.rng.gen_range(0..self.best.len());
        Ok(one_hot(self.best.len(), self.ctx))
    }

    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error> {
        let r = if action.first().map(|&a| a as usize) == Some(self.best[self.ctx]) {
            1.0
        } else {
            0.0
        };
        Ok(Step {
            obs: one_hot(self.best.len(), self.ctx),
            reward: r,
            terminated: true,
            truncated: false,
            ..Default::default()
        })
    }
}

/// A chain of `len` states (one-hot). Action 1 moves right, action 0 falls back to the
/// start. Reaching the last state ends the episode with reward 1; every other step pays 0
/// (the reward is delayed by `len - 1` decisions). Episodes are truncated after
/// `time_limit` steps.
#[derive(Debug, Clone)]
pub struct DelayedChain {
    len: usize,
    time_limit: u32,
    pos: usize,
    t: u32,
}

impl DelayedChain {
    /// A chain of `len >= 2` states with a time limit.
    pub fn new(len: usize, time_limit: u32) -> Self {
        Self {
            len: len.max(2),
            time_limit,
            pos: 0,
            t: 0,
        }
    }
}

impl Env for DelayedChain {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        self.len
    }

    fn action_dims(&self) -> Vec<usize> {
        vec![2]
    }

    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        self.pos = 0;
        self.t = 0;
        Ok(one_hot(self.len, 0))
    }

    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error> {
        self.t += 1;
        self.pos = if action.first() == Some(&1) {
            self.pos + 1
        } else {
            0
        };
        let done = self.pos == self.len - 1;
        Ok(Step {
            obs: one_hot(self.len, self.pos),
            reward: if done { 1.0 } else { 0.0 },
            terminated: done,
            truncated: !done && self.t >= self.time_limit,
            ..Default::default()
        })
    }
}

/// One-step episodes with two action dimensions (4 and 3 choices) and per-context masks.
/// Reward `table_a[c][a0] + table_b[c][a1]`; the highest entries of each table are masked
/// out, so a policy that ignored masks would prefer them. Counts every masked action it
/// receives in [`MaskedMultiDiscrete::violations`].
#[derive(Debug, Clone)]
pub struct MaskedMultiDiscrete {
    ctx: usize,
    rng: Rng,
    violations: u64,
}

/// Rewards of dimension 0 per context.
pub const MASKED_TABLE_A: [[f32; 4]; 3] = [
    [0.1, 0.5, 2.0, 0.0],
    [0.6, 0.0, 0.2, 2.0],
    [2.0, 0.1, 0.0, 0.7],
];
/// Rewards of dimension 1 per context.
pub const MASKED_TABLE_B: [[f32; 3]; 3] = [[2.0, 0.0, 0.4], [0.3, 2.0, 0.0], [0.0, 0.5, 2.0]];
/// Masks of dimension 0 per context (1 = allowed); each masks the table's best entry.
pub const MASK_A: [[f32; 4]; 3] = [
    [1.0, 1.0, 0.0, 1.0],
    [1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, 1.0, 1.0],
];
/// Masks of dimension 1 per context.
pub const MASK_B: [[f32; 3]; 3] = [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]];

impl MaskedMultiDiscrete {
    /// Contexts drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            ctx: 0,
            rng: rng::seeded(seed),
            violations: 0,
        }
    }

    /// Masked actions received so far.
    pub fn violations(&self) -> u64 {
        self.violations
    }

    /// The best allowed action of context `c`.
    pub fn best_valid(c: usize) -> [u32; 2] {
        let arg = |t: &[f32], m: &[f32]| {
            (0..t.len())
                .filter(|&i| m[i] == 1.0)
                .fold(None::<usize>, |b, i| match b {
                    Some(j) if t[j] >= t[i] => Some(j),
                    _ => Some(i),
                })
        };
        let a = arg(&MASKED_TABLE_A[c], &MASK_A[c]).unwrap_or(0) as u32;
        let b = arg(&MASKED_TABLE_B[c], &MASK_B[c]).unwrap_or(0) as u32;
        [a, b]
    }
}

impl Env for MaskedMultiDiscrete {
    type Error = std::convert::Infallible;
    fn obs_dim(&self) -> usize {
        3
    }

    fn action_dims(&self) -> Vec<usize> {
        vec![4, 3]
    }

    fn reset(&mut self) -> Result<Vec<f32>, Self::Error> {
        self.ctx = self.rng.gen_range(0..3);
        Ok(one_hot(3, self.ctx))
    }

    fn action_mask(&self) -> Option<Vec<f32>> {
        let mut m = MASK_A[self.ctx].to_vec();
        m.extend_from_slice(&MASK_B[self.ctx]);
        Some(m)
    }

    fn step(&mut self, action: &[u32]) -> Result<Step, Self::Error> {
        let c = self.ctx;
        let a = action.first().copied().unwrap_or(0) as usize;
        let b = action.get(1).copied().unwrap_or(0) as usize;
        if MASK_A[c].get(a) != Some(&1.0) || MASK_B[c].get(b) != Some(&1.0) {
            self.violations += 1;
        }
        let r = MASKED_TABLE_A[c].get(a).copied().unwrap_or(0.0)
            + MASKED_TABLE_B[c].get(b).copied().unwrap_or(0.0);
        Ok(Step {
            obs: one_hot(3, c),
            reward: r,
            terminated: true,
            truncated: false,
            ..Default::default()
        })
    }
}
