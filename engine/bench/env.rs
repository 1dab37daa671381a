//! `engine bench env`: environment throughput and costs, with the sandbox's own `sh -c true`
//! step measured in the same run as the baseline.
//!
//! JSON keys (times in milliseconds as `{median, p90, n}` summaries unless named otherwise):
//! - `synth_cold`: synthesizing a new instance (task setup + perturbations + writing the layer)
//!   into an empty cache; `synth_full`: the same into a cache at its bound (256 entries, so
//!   each build evicts one); `synth_cached_us`: finding a cached instance (microseconds);
//! - `setup`: a new instance's sandbox created and its first episode started;
//! - `reset`: a new episode of the same instance (incremental reset + start steps);
//! - `exec_sh_true`: `sh -c true` in the same kind of sandbox, first command of an episode
//!   (the floor of one step); `host_sh_true`: the same forked on the host (baseline);
//! - `throughput`: for each agent and worker count, steps per second over all workers,
//!   episodes, successes, and infrastructure failures. Agents: `raw-exec` (the random agent's
//!   commands sent straight to the sandbox, no Env: the ceiling), `random`, `oracle`.

use super::{ms, Summary};
use crate::env::{Env, EnvConfig};
use crate::instance::Plan;
use crate::synth::Cache;
use rand::{Rng, SeedableRng};
use sandbox::Runtime;
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum BenchEnvError {
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),
    #[error(transparent)]
    Running(#[from] crate::running::RunningError),
    #[error(transparent)]
    Synth(#[from] crate::synth::SynthError),
    #[error(transparent)]
    Sandbox(#[from] sandbox::SandboxError),
    #[error(transparent)]
    Episode(#[from] crate::episode::EpisodeError),
    #[error("unknown task `{0}`")]
    UnknownTask(String),
    #[error("a benchmark worker panicked")]
    WorkerPanicked,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub agent: String,
    pub workers: usize,
    pub steps: u64,
    pub episodes: u64,
    pub successes: u64,
    pub infra_failures: u64,
    pub seconds: f64,
    pub steps_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EnvBenchReport {
    pub task: String,
    pub synth_cold: Summary,
    pub synth_full: Summary,
    pub synth_cached_us: Summary,
    pub setup: Summary,
    pub reset: Summary,
    pub exec_sh_true: Summary,
    /// `sh -c true` forked by this process on the host, measured in the same run.
    pub host_sh_true: Summary,
    pub throughput: Vec<Throughput>,
}

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct EnvBenchOpts {
    pub task: String,
    pub iterations: usize,
    pub workers: Vec<usize>,
    pub seconds: f64,
}

pub fn run(rt: &Runtime, cache: &Cache, o: &EnvBenchOpts) -> Result<EnvBenchReport, BenchEnvError> {
    if crate::tasks::get(&o.task).is_none() {
        return Err(BenchEnvError::UnknownTask(o.task.clone()));
    }
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host)?;
    // Synthesis, cold (a fresh cache) and cached.
    let fresh = Cache::temporary()?;
    let plans: Vec<Plan> = (0..o.iterations as u64)
        .map(|i| Plan::for_task(&o.task, 1_000 + i, vec![]))
        .collect();
    let mut cold = Vec::new();
    for p in &plans {
        let t = Instant::now();
        drop(fresh.get_or_build(p, &rootfs)?);
        cold.push(ms(t));
    }
    let mut cached = Vec::new();
    for p in &plans {
        let t = Instant::now();
        drop(fresh.get_or_build(p, &rootfs)?);
        cached.push(ms(t) * 1e3);
    }
    // Fill to the bound, then build new instances: each one evicts the least recently used.
    let fill = crate::synth::DEFAULT_CACHE_ENTRIES.saturating_sub(plans.len()) as u64;
    for i in 0..fill {
        drop(fresh.get_or_build(&Plan::for_task(&o.task, 100_000 + i, vec![]), &rootfs)?);
    }
    let mut full = Vec::new();
    for i in 0..o.iterations as u64 {
        let p = Plan::for_task(&o.task, 200_000 + i, vec![]);
        let t = Instant::now();
        drop(fresh.get_or_build(&p, &rootfs)?);
        full.push(ms(t));
    }
    drop(fresh);
    // Setup and reset of episodes.
    let mut setup = Vec::new();
    let mut reset = Vec::new();
    let mut exec = Vec::new();
    for p in plans.iter().take(o.iterations.clamp(1, 20)) {
        let held = crate::running::synthesize(rt, cache, p)?;
        let t = Instant::now();
        let mut running = crate::running::RunningInstance::start(rt, held)?;
        setup.push(ms(t));
        for _ in 0..5 {
            let r = running.run("touch /tmp/x /root/y", Duration::from_secs(5))?;
            let _ = r;
            let t = Instant::now();
            running.restart()?;
            reset.push(ms(t));
            let t = Instant::now();
            running.sandbox.exec(&sandbox::ExecRequest::shell("true"))?;
            exec.push(ms(t));
        }
    }
    let mut host = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let ok = std::process::Command::new("/bin/sh")
            .args(["-c", "true"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            host.push(ms(t));
        }
    }
    let mut throughput = Vec::new();
    for &w in &o.workers {
        throughput.push(measure_raw(rt, cache, &o.task, w, o.seconds)?);
    }
    for agent in ["random", "oracle"] {
        for &w in &o.workers {
            throughput.push(measure(rt, cache, &o.task, agent, w, o.seconds)?);
        }
    }
    Ok(EnvBenchReport {
        task: o.task.clone(),
        synth_cold: Summary::of(cold),
        synth_full: Summary::of(full),
        synth_cached_us: Summary::of(cached),
        setup: Summary::of(setup),
        reset: Summary::of(reset),
        exec_sh_true: Summary::of(exec),
        host_sh_true: Summary::of(host),
        throughput,
    })
}

/// Counts of one worker: steps, episodes, successes, infrastructure failures.
type Counts = (u64, u64, u64, u64);

/// Run `work(worker)` on `workers` threads and sum their counts into a throughput figure.
fn on_workers(
    agent: &str,
    workers: usize,
    seconds: f64,
    work: impl Fn(usize) -> Result<Counts, BenchEnvError> + Sync,
) -> Result<Throughput, BenchEnvError> {
    let work = &work;
    let results: Vec<Result<Counts, BenchEnvError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers).map(|w| s.spawn(move || work(w))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(BenchEnvError::WorkerPanicked)))
            .collect()
    });
    let mut t = Throughput {
        agent: agent.into(),
        workers,
        steps: 0,
        episodes: 0,
        successes: 0,
        infra_failures: 0,
        seconds,
        steps_per_s: 0.0,
    };
    for r in results {
        let (s, e, w, i) = r?;
        t.steps += s;
        t.episodes += e;
        t.successes += w;
        t.infra_failures += i;
    }
    t.steps_per_s = t.steps as f64 / seconds;
    Ok(t)
}

/// The ceiling: the random agent's commands run straight through the sandbox (no Env: no cwd
/// tracking, verifier, observation or reward), an episode reset every `max_steps` commands.
fn measure_raw(
    rt: &Runtime,
    cache: &Cache,
    task: &str,
    workers: usize,
    seconds: f64,
) -> Result<Throughput, BenchEnvError> {
    let deadline = Duration::from_secs_f64(seconds);
    on_workers("raw-exec", workers, seconds, |w| {
        let plan = Plan::for_task(task, 1 + w as u64, vec![]);
        let held = crate::running::synthesize(rt, cache, &plan)?;
        let mut running = crate::running::RunningInstance::start(rt, held)?;
        let setup = running
            .instance
            .task
            .clone()
            .ok_or(crate::env::EnvError::NoTask)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(w as u64);
        let mut steps = 0u64;
        let t0 = Instant::now();
        while t0.elapsed() < deadline {
            let a = &setup.actions[rng.gen_range(0..setup.actions.len().max(1))];
            running.run(a, Duration::from_secs(10))?;
            steps += 1;
            if steps.is_multiple_of(u64::from(setup.max_steps.max(1))) {
                running.restart()?;
            }
        }
        Ok((steps, 0, 0, 0))
    })
}

/// Steps per second of `workers` threads, each with its own env, for `seconds`.
fn measure(
    rt: &Runtime,
    cache: &Cache,
    task: &str,
    agent: &str,
    workers: usize,
    seconds: f64,
) -> Result<Throughput, BenchEnvError> {
    let deadline = Duration::from_secs_f64(seconds);
    on_workers(agent, workers, seconds, |w| {
        let mut env = Env::new(rt.clone(), cache.clone(), EnvConfig::default())?;
        let plan = Plan::for_task(task, 1 + w as u64, vec![]);
        let mut agent: Box<dyn crate::agents::Agent> = if agent == "oracle" {
            Box::new(crate::agents::Oracle::default())
        } else {
            Box::new(crate::agents::Random::new(w as u64))
        };
        // Warm: the instance synthesized and its sandbox created.
        env.reset(&plan)?;
        let (mut steps, mut episodes, mut wins, mut infra) = (0, 0, 0, 0);
        let t0 = Instant::now();
        while t0.elapsed() < deadline {
            let first = env.reset(&plan)?;
            episodes += 1;
            let p = crate::episode::play(&mut env, &first, agent.as_mut(), &mut |_, _| {})?;
            steps += u64::from(p.steps);
            wins += u64::from(p.success);
            infra += u64::from(p.infra);
        }
        Ok((steps, episodes, wins, infra))
    })
}

/// A plain-text report.
pub fn render(r: &EnvBenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let row = |s: &mut String, name: &str, x: &Summary, unit: &str| {
        let _ = writeln!(
            s,
            "{name:<28} median {:>9.3} {unit}  p90 {:>9.3} {unit}  n={}",
            x.median, x.p90, x.n
        );
    };
    let _ = writeln!(s, "task {}", r.task);
    row(&mut s, "synthesis (cold)", &r.synth_cold, "ms");
    row(&mut s, "synthesis (cache full)", &r.synth_full, "ms");
    row(&mut s, "synthesis (cached)", &r.synth_cached_us, "us");
    row(&mut s, "setup (sandbox + start)", &r.setup, "ms");
    row(&mut s, "reset (next episode)", &r.reset, "ms");
    row(&mut s, "exec sh -c true (floor)", &r.exec_sh_true, "ms");
    row(&mut s, "host sh -c true (baseline)", &r.host_sh_true, "ms");
    for t in &r.throughput {
        let _ = writeln!(
            s,
            "{:<7} agent, {} worker(s): {:>7.0} steps/s  ({} steps, {} episodes, {} solved, {} infra failures)",
            t.agent, t.workers, t.steps_per_s, t.steps, t.episodes, t.successes, t.infra_failures
        );
    }
    s
}
