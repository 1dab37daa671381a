//! PPO on an exact port of Gymnasium's CartPole-v1 with CleanRL's settings (4 envs x 128
//! steps, 4 minibatches, 4 epochs, annealing over 500k steps, separate 64x64 tanh trunks)
//! except the learning rate: 1e-3 instead of 2.5e-4 (every flag can override).
//!
//! `cargo run --release -p policies --example ppo_cartpole -- --seed 1 --json`
//!
//! Stops once the mean return of the last 20 episodes reaches `--target` (default 475) or
//! after `--total-steps` (default 200,000); the last line is a JSON summary.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use policies::envs::cartpole::CartPole;
use policies::nets::{Activation, ActorCriticConfig};
use policies::ppo::{PpoAgent, PpoConfig, RolloutBuffer};
use policies::rollout::{collect, VecEnv};

#[derive(Parser, Debug)]
#[command(about = "PPO on CartPole-v1")]
struct Args {
    /// Seed of the agent (init, sampling, shuffling) and of the environments.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print only the final JSON line.
    #[arg(long)]
    json: bool,
    /// Environment-step budget.
    #[arg(long, default_value_t = 200_000)]
    total_steps: u64,
    /// Steps over which the learning rate is annealed to 0 (CleanRL: its 500k budget).
    #[arg(long, default_value_t = 500_000)]
    anneal_steps: u64,
    /// Mean return over the last 20 episodes that counts as solved.
    #[arg(long, default_value_t = 475.0)]
    target: f64,
    /// Keep training after the target is reached.
    #[arg(long)]
    no_early_stop: bool,
    /// Initial learning rate (CleanRL uses 2.5e-4; 1e-3 solves every seed tried well
    /// within the 200k budget, see docs/policies.md).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Parallel environments.
    #[arg(long, default_value_t = 4)]
    num_envs: usize,
    /// Steps per environment per rollout.
    #[arg(long, default_value_t = 128)]
    num_steps: usize,
    /// Epochs per update.
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// Minibatches per epoch.
    #[arg(long, default_value_t = 4)]
    minibatches: usize,
    /// Discount.
    #[arg(long, default_value_t = 0.99)]
    gamma: f64,
    /// GAE lambda.
    #[arg(long, default_value_t = 0.95)]
    gae_lambda: f64,
    /// Entropy coefficient.
    #[arg(long, default_value_t = 0.01)]
    ent_coef: f64,
    /// Save a checkpoint (`<path>.safetensors`, `<path>.state`) at the end.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = PpoConfig {
        num_envs: args.num_envs,
        num_steps: args.num_steps,
        learning_rate: args.lr,
        update_epochs: args.epochs,
        num_minibatches: args.minibatches,
        gamma: args.gamma,
        gae_lambda: args.gae_lambda,
        ent_coef: args.ent_coef,
        ..PpoConfig::default()
    };
    let batch = cfg.batch_size() as u64;
    let cfg = PpoConfig {
        total_updates: args.anneal_steps.div_ceil(batch),
        ..cfg
    };
    let net = ActorCriticConfig {
        obs_dim: 4,
        action_dims: vec![2],
        hidden: vec![64, 64],
        activation: Activation::Tanh,
        shared_trunk: false,
    };
    let mut agent = PpoAgent::new(&net, &cfg, args.seed).context("building the agent")?;
    let envs = (0..cfg.num_envs as u64)
        .map(|i| CartPole::new(args.seed.wrapping_mul(1000).wrapping_add(i)))
        .collect();
    let mut venv = VecEnv::new(envs)?;
    let mut buf = RolloutBuffer::new(cfg.num_steps, cfg.num_envs, &net, false);
    let mut last: VecDeque<f64> = VecDeque::with_capacity(20);
    let mut episodes = 0u64;
    let mut steps = 0u64;
    let mut solved_at: Option<u64> = None;
    let start = Instant::now();
    let mut stats = None;
    while steps + batch <= args.total_steps {
        for ep in collect(&mut agent, &mut venv, &mut buf)? {
            episodes += 1;
            if last.len() == 20 {
                last.pop_front();
            }
            last.push_back(ep.ret);
        }
        steps += batch;
        let s = agent.update(&buf)?;
        let mean = if last.is_empty() {
            0.0
        } else {
            last.iter().sum::<f64>() / last.len() as f64
        };
        if !args.json && agent.updates() % 10 == 0 {
            println!(
                "step {steps:>7} mean_return(20) {mean:>6.1} episodes {episodes:>5} pg {:+.4} v {:.4} ent {:.3} kl {:.4} clip {:.3} ev {}",
                s.policy_loss,
                s.value_loss,
                s.entropy,
                s.approx_kl,
                s.clip_fraction,
                s.explained_variance.map_or("n/a".to_string(), |e| format!("{e:.3}")),
            );
        }
        stats = Some(s);
        if last.len() == 20 && mean >= args.target && solved_at.is_none() {
            solved_at = Some(steps);
            if !args.no_early_stop {
                break;
            }
        }
    }
    if let Some(p) = &args.checkpoint {
        agent
            .save(p)
            .with_context(|| format!("saving checkpoint {}", p.display()))?;
    }
    let mean = if last.is_empty() {
        0.0
    } else {
        last.iter().sum::<f64>() / last.len() as f64
    };
    let summary = serde_json::json!({
        "seed": args.seed,
        "steps": steps,
        "mean_return": mean,
        "episodes": episodes,
        "solved": solved_at.is_some(),
        "solved_at_step": solved_at,
        "target": args.target,
        "updates": agent.updates(),
        "wall_s": start.elapsed().as_secs_f64(),
        "last_update": stats,
    });
    println!("{summary}");
    Ok(())
}
