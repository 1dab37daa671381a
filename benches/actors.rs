//! Criterion benchmarks of the actor runtime's messages, each beside its baseline measured in
//! the same run: an agent's `act` called in place against the same call through its actor
//! (one message round trip), and a vectorised step of 8 fake workers on scoped threads (the
//! direct loop) against the same step through 8 worker actors. The end-to-end figure on real
//! environments is `engine bench selfplay`.
#![allow(clippy::unwrap_used)]

use actors::roles::{Agent, EnvWorker, Workers};
use actors::runtime::{ActorWorkers, AgentProxy, WorkerFactory};
use actors::testing::{FakeAgent, FakeWorker, Sabotage};
use actors::workers::ThreadWorkers;
use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

const DIMS: usize = 3;
const N: usize = 8;

fn benches(c: &mut Criterion) {
    let obs = vec![0.0f32; N * (DIMS + 1)];
    let masks = vec![1.0f32; N * FakeWorker::actions(DIMS)];
    // The proxies block their caller, this thread; the system runs on its own.
    let (host, (mut proxy, mut actor_workers)) = actors::runtime::Host::start(|| {
        let steps = Arc::new(AtomicU64::new(0));
        let factory: WorkerFactory = Arc::new(move |_| {
            Ok(Box::new(FakeWorker::new(
                DIMS,
                1_000_000,
                Sabotage::default(),
                steps.clone(),
            )) as Box<dyn EnvWorker>)
        });
        let agent = FakeAgent::new(1, FakeWorker::actions(DIMS), 4, 0.5);
        (
            AgentProxy::start("protagonist", Box::new(agent)),
            ActorWorkers::start(N, factory),
        )
    })
    .unwrap();
    let mut g = c.benchmark_group("act");
    let mut local = FakeAgent::new(1, FakeWorker::actions(DIMS), 4, 0.5);
    g.bench_function("in place", |b| {
        b.iter(|| local.act(&obs, &masks, N).unwrap())
    });
    g.bench_function("through the actor", |b| {
        b.iter(|| proxy.act(&obs, &masks, N).unwrap())
    });
    g.finish();

    let steps = Arc::new(AtomicU64::new(0));
    let mut direct = ThreadWorkers::new(
        (0..N)
            .map(|_| FakeWorker::new(DIMS, 1_000_000, Sabotage::default(), steps.clone()))
            .collect(),
    );
    let levels: Vec<_> = (0..N)
        .map(|i| (i, actors::msg::Level::clean(i as u64)))
        .collect();
    direct.reset(&levels);
    actor_workers.reset(&levels);
    let actions = vec![Some(0u32); N];
    let mut g = c.benchmark_group("vectorised step of 8 workers");
    g.bench_function("scoped threads", |b| b.iter(|| direct.step(&actions)));
    g.bench_function("worker actors", |b| b.iter(|| actor_workers.step(&actions)));
    g.finish();
    drop(host);
}

criterion_group!(all, benches);
criterion_main!(all);
