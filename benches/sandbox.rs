//! Criterion benchmarks of the sandbox, each beside its baseline measured in the same run:
//! `host/sh -c true` is the floor for one shell step. Needs root.
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use sandbox::{ExecRequest, InitProgram, Runtime, SandboxConfig};
use std::time::Duration;

fn runtime() -> Runtime {
    let init = InitProgram::at(env!("CARGO_BIN_EXE_envfactory-init").into(), vec![]).unwrap();
    Runtime::new(&sandbox::state::default_state_dir(), init).unwrap()
}

fn benches(c: &mut Criterion) {
    if !nix_is_root() {
        eprintln!("sandbox benchmarks need root; skipped");
        return;
    }
    let rt = runtime();
    let cfg = SandboxConfig::default();
    drop(rt.create(&cfg).unwrap()); // warm the layer caches

    let mut g = c.benchmark_group("step");
    g.bench_function("host sh -c true", |b| {
        b.iter(|| {
            std::process::Command::new("sh")
                .args(["-c", "true"])
                .status()
                .unwrap()
        })
    });
    let mut sb = rt.create(&cfg).unwrap();
    let req = ExecRequest::argv(["sh", "-c", "true"]);
    g.bench_function("sandbox exec sh -c true", |b| {
        b.iter(|| sb.exec(&req).unwrap())
    });
    g.finish();

    let mut g = c.benchmark_group("lifecycle");
    g.bench_function("create + first exec", |b| {
        b.iter(|| {
            let mut s = rt.create(&cfg).unwrap();
            s.exec(&ExecRequest::argv(["/bin/true"])).unwrap();
            s
        })
    });
    let change = ExecRequest::shell(engine::bench::sandbox::CHANGE_100);
    g.bench_function("reset after 100 changed files", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                sb.exec(&change).unwrap();
                let t = std::time::Instant::now();
                sb.reset().unwrap();
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("snapshot of 100 changed files", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                sb.exec(&change).unwrap();
                let t = std::time::Instant::now();
                sb.snapshot().unwrap();
                total += t.elapsed();
                sb.reset().unwrap();
            }
            total
        })
    });
    g.bench_function("rollback to a snapshot", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                sb.exec(&change).unwrap();
                let id = sb.snapshot().unwrap();
                sb.exec(&change).unwrap();
                let t = std::time::Instant::now();
                sb.rollback(id).unwrap();
                total += t.elapsed();
                sb.reset().unwrap();
            }
            total
        })
    });
    g.finish();
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

criterion_group! {
    name = sandbox_benches;
    config = Criterion::default().sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(sandbox_benches);
