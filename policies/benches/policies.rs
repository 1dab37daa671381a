//! Criterion benchmarks: policy forward at batch 1, 64 and 1024; one PPO update on a
//! 2,048-sample batch; encoder throughput.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use policies::encoder::{Encoder, HashedTextConfig, HashedTextEncoder, Observation};
use policies::envs::cartpole::CartPole;
use policies::nets::{Activation, ActorCriticConfig};
use policies::ppo::{PpoAgent, PpoConfig, RolloutBuffer};
use policies::rollout::{collect, VecEnv};

fn net() -> ActorCriticConfig {
    ActorCriticConfig {
        obs_dim: 64,
        action_dims: vec![8, 4, 3],
        hidden: vec![64, 64],
        activation: Activation::Tanh,
        shared_trunk: false,
    }
}

fn forward(c: &mut Criterion) {
    let mut agent = PpoAgent::new(&net(), &PpoConfig::default(), 0).expect("agent");
    let mut g = c.benchmark_group("policy_forward");
    for b in [1usize, 64, 1024] {
        let obs: Vec<f32> = (0..b * 64)
            .map(|i| ((i * 37 % 101) as f32 / 101.0) - 0.5)
            .collect();
        g.throughput(Throughput::Elements(b as u64));
        g.bench_with_input(BenchmarkId::new("act", b), &obs, |bench, obs| {
            bench.iter(|| black_box(agent.act(black_box(obs), None).expect("act")))
        });
    }
    g.finish();
}

fn ppo_update(c: &mut Criterion) {
    // 2,048 samples: 8 CartPole envs x 256 steps, CleanRL's 4 epochs x 4 minibatches.
    let cfg = PpoConfig {
        num_envs: 8,
        num_steps: 256,
        total_updates: 1_000_000,
        ..PpoConfig::default()
    };
    let net = ActorCriticConfig {
        obs_dim: 4,
        action_dims: vec![2],
        hidden: vec![64, 64],
        activation: Activation::Tanh,
        shared_trunk: false,
    };
    let mut agent = PpoAgent::new(&net, &cfg, 0).expect("agent");
    let mut venv = VecEnv::new((0..8).map(CartPole::new).collect()).expect("venv");
    let mut buf = RolloutBuffer::new(cfg.num_steps, cfg.num_envs, &net, false);
    collect(&mut agent, &mut venv, &mut buf).expect("collect");
    let mut g = c.benchmark_group("ppo");
    g.sample_size(10);
    g.throughput(Throughput::Elements(2048));
    g.bench_function("update_2048_samples", |bench| {
        bench.iter(|| black_box(agent.update(&buf).expect("update")))
    });
    g.finish();
}

fn encoder(c: &mut Criterion) {
    let enc = HashedTextEncoder::new(HashedTextConfig {
        text_dim: 1024,
        numeric_dim: 4,
        ..Default::default()
    })
    .expect("encoder");
    let text = "ls: cannot access '/var/log/app.log': No such file or directory\n\
                total 24\ndrwxr-xr-x 2 root root 4096 Nov 30 04:00 bin\n\
                -rw-r--r-- 1 root root  220 Nov 30 04:00 .bashrc\n\
                systemctl status nginx: inactive (dead) since 03:59:12 UTC; 1min ago";
    let numeric = [1.0, 0.0, 3.0, 0.5];
    let mut out = vec![0.0; enc.dim()];
    let mut g = c.benchmark_group("encoder");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("hashed_text_256B", |bench| {
        bench.iter(|| {
            enc.encode_into(
                black_box(&Observation {
                    text,
                    numeric: &numeric,
                }),
                &mut out,
            )
            .expect("encode")
        })
    });
    g.finish();
}

criterion_group!(benches, forward, ppo_update, encoder);
criterion_main!(benches);
