//! Advantages: generalised advantage estimation (a time-limit truncation bootstraps from
//! `V(final observation)` and is not terminal), per-minibatch normalisation, and the explained
//! variance of the value estimates.

use super::PpoError;

/// Inputs of [`gae`], time-major: index `t * num_envs + e`.
#[derive(Debug, Clone, Copy)]
pub struct GaeInput<'a> {
    /// Rollout length.
    pub num_steps: usize,
    /// Environments.
    pub num_envs: usize,
    /// `r_t`.
    pub rewards: &'a [f32],
    /// `V(s_t)`.
    pub values: &'a [f32],
    /// The episode ended in a terminal state after step t (no bootstrap).
    pub terminated: &'a [bool],
    /// The episode was cut by a time limit after step t (bootstrap from `final_values`).
    pub truncated: &'a [bool],
    /// `V(final observation)` at truncated steps (ignored elsewhere).
    pub final_values: &'a [f32],
    /// `V(s_T)` per environment: bootstrap after the last step of the rollout.
    pub last_values: &'a [f32],
    /// Samples to learn from (`None`: all). An invalid sample (the environment failed after
    /// it) gets advantage 0 and return `V(s_t)`, and no advantage flows into the step before
    /// it, which bootstraps from `V(s_t)` as from a time limit.
    pub valid: Option<&'a [bool]>,
}

/// Advantages and returns (`A + V`) by GAE:
/// `next_v = 0` if terminated, `V(final obs)` if truncated, else `V(s_{t+1})`;
/// `delta_t = r_t + gamma * next_v - V(s_t)`;
/// `A_t = delta_t + gamma * lambda * (1 - ended_t) * A_{t+1}` where ended = terminated or
/// truncated (no advantage flows across an episode boundary).
pub fn gae(inp: &GaeInput<'_>, gamma: f64, lambda: f64) -> Result<(Vec<f32>, Vec<f32>), PpoError> {
    let n = inp.num_steps * inp.num_envs;
    for (name, len) in [
        ("rewards", inp.rewards.len()),
        ("values", inp.values.len()),
        ("terminated", inp.terminated.len()),
        ("truncated", inp.truncated.len()),
        ("final_values", inp.final_values.len()),
    ] {
        if len != n {
            return Err(PpoError::Shape {
                tensor: name,
                expected: format!("{n} entries"),
                got: format!("{len}"),
            });
        }
    }
    if inp.last_values.len() != inp.num_envs {
        return Err(PpoError::Shape {
            tensor: "last_values",
            expected: format!("{} entries", inp.num_envs),
            got: format!("{}", inp.last_values.len()),
        });
    }
    if let Some(v) = inp.valid {
        if v.len() != n {
            return Err(PpoError::Shape {
                tensor: "valid",
                expected: format!("{n} entries"),
                got: format!("{}", v.len()),
            });
        }
    }
    let ne = inp.num_envs;
    let mut adv = vec![0f32; n];
    let mut ret = vec![0f32; n];
    for e in 0..ne {
        let mut last = 0f64;
        for t in (0..inp.num_steps).rev() {
            let i = t * ne + e;
            if inp.valid.is_some_and(|v| !v[i]) {
                adv[i] = 0.0;
                ret[i] = inp.values[i];
                last = 0.0;
                continue;
            }
            let ended = inp.terminated[i] || inp.truncated[i];
            let next_v = if inp.terminated[i] {
                0.0
            } else if inp.truncated[i] {
                f64::from(inp.final_values[i])
            } else if t + 1 == inp.num_steps {
                f64::from(inp.last_values[e])
            } else {
                f64::from(inp.values[i + ne])
            };
            let delta = f64::from(inp.rewards[i]) + gamma * next_v - f64::from(inp.values[i]);
            let carry = if ended { 0.0 } else { last };
            last = delta + gamma * lambda * carry;
            adv[i] = last as f32;
            ret[i] = (last + f64::from(inp.values[i])) as f32;
        }
    }
    Ok((adv, ret))
}

/// `(a - mean) / (std + 1e-8)` with the unbiased std (PyTorch's `.std()`); a slice with
/// fewer than 2 entries is left as is.
pub fn normalize_advantages(a: &mut [f32]) {
    if a.len() < 2 {
        return;
    }
    let n = a.len() as f64;
    let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = a
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0);
    let std = var.sqrt();
    for x in a.iter_mut() {
        *x = ((f64::from(*x) - mean) / (std + 1e-8)) as f32;
    }
}

/// `1 - Var(returns - values) / Var(returns)`; `None` when `Var(returns)` is 0.
pub fn explained_variance(values: &[f32], returns: &[f32]) -> Option<f64> {
    let n = returns.len() as f64;
    if returns.is_empty() || values.len() != returns.len() {
        return None;
    }
    let var = |xs: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = xs.collect();
        let m = v.iter().sum::<f64>() / n;
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n
    };
    let vy = var(&mut returns.iter().map(|&x| f64::from(x)));
    if vy == 0.0 {
        return None;
    }
    let vd = var(&mut returns
        .iter()
        .zip(values)
        .map(|(&r, &v)| f64::from(r) - f64::from(v)));
    Some(1.0 - vd / vy)
}
