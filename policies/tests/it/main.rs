//! One integration-test binary (one link step): learning, checkpoints, determinism, bad
//! input, adversary and discriminator.

// Test helpers outside `#[test]` functions may unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod adversary;
mod checkpoint;
mod discriminator;
mod learning;
mod masks;
mod segments;

use policies::nets::{Activation, ActorCriticConfig};
use policies::ppo::{PpoAgent, PpoConfig, RolloutBuffer, UpdateStats};
use policies::rollout::{collect, Env, Episode, VecEnv};

/// A small actor-critic config.
pub fn net(obs_dim: usize, action_dims: Vec<usize>, hidden: Vec<usize>) -> ActorCriticConfig {
    ActorCriticConfig {
        obs_dim,
        action_dims,
        hidden,
        activation: Activation::Tanh,
        shared_trunk: false,
    }
}

/// Train `updates` PPO updates; returns every finished episode and the last stats.
pub fn train<E: Env>(
    agent: &mut PpoAgent,
    venv: &mut VecEnv<E>,
    masked: bool,
    updates: usize,
) -> (Vec<Episode>, Option<UpdateStats>) {
    let cfg = agent.config().clone();
    let mut buf = RolloutBuffer::new(cfg.num_steps, cfg.num_envs, agent.net_config(), masked);
    let mut eps = Vec::new();
    let mut last = None;
    for _ in 0..updates {
        eps.extend(collect(agent, venv, &mut buf).unwrap());
        last = Some(agent.update(&buf).unwrap());
    }
    (eps, last)
}

/// PPO settings for the toy tasks: small rollouts, no annealing.
pub fn fast_ppo(num_envs: usize, num_steps: usize, lr: f64) -> PpoConfig {
    PpoConfig {
        num_envs,
        num_steps,
        learning_rate: lr,
        anneal_lr: false,
        total_updates: 1,
        ..PpoConfig::default()
    }
}
