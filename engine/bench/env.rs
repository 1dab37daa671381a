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
//! - `env_step_true`: a whole `Env::step` of the command `true` in a live episode, and
//!   `exec_warm_true`: `true` sent straight to the same sandbox between those steps: the
//!   difference is what the Env adds to every step (verdict, listing, disk usage);
//! - `throughput`: for each agent and worker count, steps per second over all workers,
//!   episodes, successes, and infrastructure failures. Agents: `raw-exec` (the random agent's
//!   commands sent straight to the sandbox, no Env: the ceiling), `random`, `oracle` (the
//!   free-text oracle), `catalogue` (the catalogue oracle: a solving agent's episodes, short,
//!   as a trained policy's are); `reset_ms_per_episode` and `step_ms` split each worker's
//!   time between `Env::reset` and the steps (summed over workers). `raw-exec` and `random`
//!   are measured in `rounds` alternating rounds (rounded up to an even count; which goes
//!   first alternates too) and summed; `random_vs_raw` gives, per worker count, their ratio
//!   and each round's. `raw-exec-episodes` (the ceiling's commands with an episode reset every
//!   as many steps as the random agent's episodes have lasted so far in the run) is measured
//!   in the same rounds, and `random_vs_raw_episodes` gives the random agent's ratio to it:
//!   what the Env itself costs, without the ceiling's rarer resets. For both ceilings
//!   `episodes` counts the first episode and each reset.
//!   Steps/s are each worker's steps over the time it really ran (an
//!   episode or command that started before the deadline ends after it), summed.
//!   `engine_cpu_us_per_step` and `init_cpu_us_per_step` say where the CPU of a step went on
//!   the engine's side and in the sandbox's init (on 2 busy CPUs, CPU is what limits the rate);
//!   `idle_cpu_share` how much of the machine's CPU was left idle while every worker ran (the
//!   workers start together, once each one's sandbox is ready; the share ends when the first
//!   worker's loop does).

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
    /// Seconds the workers really ran, their mean (summed over the rounds of a combined row).
    pub seconds: f64,
    pub steps_per_s: f64,
    /// Milliseconds per episode spent in `Env::reset` (sandbox reset, start steps, the start
    /// state's verdict and observation), summed over workers; for `raw-exec` and
    /// `raw-exec-episodes`, whose `episodes` count their resets, in the sandbox's reset and the
    /// start steps.
    pub reset_ms_per_episode: f64,
    /// Milliseconds per step spent in `Env::step` and the agent (command, verdict,
    /// observation), summed over workers; for `raw-exec` the commands alone.
    pub step_ms: f64,
    /// CPU time of the engine's worker threads per step, microseconds (resets included): what
    /// the engine itself spends on each step.
    pub engine_cpu_us_per_step: f64,
    /// CPU time of the sandboxes' init processes per step, microseconds (resets included;
    /// their commands and zygotes are processes of their own, not counted); `None` where the
    /// kernel keeps no scheduler statistics.
    pub init_cpu_us_per_step: Option<f64>,
    /// The steps `init_cpu_us_per_step` was measured over.
    #[serde(skip)]
    init_steps: u64,
    /// Share of the machine's CPU time that was idle while every worker ran (`/proc/stat`,
    /// all CPUs, from the moment every worker was ready to the moment the first one's loop
    /// ended: not the tail where the others finish their last episode alone); `None` where
    /// the kernel's statistics cannot be read. Near 0: the rate is bound by CPU; above it, by
    /// waits that left a CPU idle.
    pub idle_cpu_share: Option<f64>,
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
    /// A whole `Env::step` of the command `true` in a live episode (the command, the verdict
    /// and the observation's reads); minus `exec_warm_true`, what the Env adds to a step.
    pub env_step_true: Summary,
    /// `true` sent straight to the same sandbox between those steps (no Env).
    pub exec_warm_true: Summary,
    /// `sh -c true` forked by this process on the host, measured in the same run.
    pub host_sh_true: Summary,
    pub throughput: Vec<Throughput>,
    /// Per worker count: the random agent's steps/s over the raw-exec ceiling's, both summed
    /// over the alternating rounds, and each round's own ratio.
    pub random_vs_raw: Vec<RoundsRatio>,
    /// The same against `raw-exec-episodes`: the ceiling's commands with an episode reset
    /// every as many steps as the random agent's episodes have lasted on average so far in the
    /// run (rounded; its `steps / episodes` says what that came to), measured in the same
    /// rounds. The ceiling resets every `max_steps` commands,
    /// several times less often than a random agent whose episodes end when solved; this
    /// ratio leaves that difference of the workload out and keeps what the Env itself adds.
    pub random_vs_raw_episodes: Vec<RoundsRatio>,
}

/// A ratio of two throughputs measured in alternating rounds.
#[derive(Debug, Clone, Serialize)]
pub struct RoundsRatio {
    pub workers: usize,
    pub ratio: f64,
    pub per_round: Vec<f64>,
}

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct EnvBenchOpts {
    pub task: String,
    pub iterations: usize,
    pub workers: Vec<usize>,
    pub seconds: f64,
    /// Rounds the raw-exec and random measurements alternate in.
    pub rounds: usize,
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
            running
                .sandbox_mut()
                .exec(&sandbox::ExecRequest::shell("true"))?;
            exec.push(ms(t));
        }
    }
    // One Env's steps of `true` against the same command sent straight to its sandbox,
    // interleaved (an episode's verifier, listing and disk usage are the difference).
    let (mut env_step, mut exec_warm) = (Vec::new(), Vec::new());
    {
        let plan = plans
            .first()
            .cloned()
            .unwrap_or_else(|| Plan::for_task(&o.task, 1_000, vec![]));
        let mut env = Env::new(rt.clone(), cache.clone(), EnvConfig::default())?;
        env.reset(&plan)?;
        let action = crate::env::Action::Command("true".into());
        for _ in 0..(10 * o.iterations).clamp(50, 200) {
            let t = Instant::now();
            let s = env.step(&action)?;
            env_step.push(ms(t));
            if let Some(r) = env.running() {
                let t = Instant::now();
                r.run("true", Duration::from_secs(5))?;
                exec_warm.push(ms(t));
            }
            if s.terminated || s.truncated {
                env.reset(&plan)?;
            }
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
    // The ceiling and the random agent in alternating rounds (which goes first alternates
    // too), each total the sum of its rounds.
    let mut throughput = Vec::new();
    let mut random_vs_raw = Vec::new();
    let mut random_vs_raw_episodes = Vec::new();
    let mut raw_episodes = Vec::new();
    // An even count, so that each goes first as often as the other.
    let rounds = o.rounds.max(1).next_multiple_of(2);
    let slice = o.seconds / rounds as f64;
    let mut randoms = Vec::new();
    let ratio =
        |b: &Throughput, a: &Throughput| b.steps_per_s / a.steps_per_s.max(f64::MIN_POSITIVE);
    let sum = |v: Vec<Throughput>| v.into_iter().reduce(|a, b| a.plus(&b));
    // The random agent's mean episode length so far (its episodes are the same each round).
    let episode_steps = |rands: &[Throughput]| {
        let (steps, episodes) = rands
            .iter()
            .fold((0, 0), |(s, e), t| (s + t.steps, e + t.episodes));
        (steps as f64 / episodes.max(1) as f64).round().max(1.0) as u64
    };
    for &w in &o.workers {
        let (mut raws, mut rands, mut raws_e) = (Vec::new(), Vec::new(), Vec::new());
        let at_max_steps = None;
        for r in 0..rounds {
            if r % 2 == 0 {
                raws.push(measure_raw(rt, cache, &o.task, w, slice, at_max_steps)?);
                rands.push(measure(rt, cache, &o.task, "random", w, slice)?);
                let every = Some(episode_steps(&rands));
                raws_e.push(measure_raw(rt, cache, &o.task, w, slice, every)?);
            } else {
                let every = Some(episode_steps(&rands));
                raws_e.push(measure_raw(rt, cache, &o.task, w, slice, every)?);
                rands.push(measure(rt, cache, &o.task, "random", w, slice)?);
                raws.push(measure_raw(rt, cache, &o.task, w, slice, at_max_steps)?);
            }
        }
        let per_round = rands.iter().zip(&raws).map(|(b, a)| ratio(b, a)).collect();
        let per_round_e = rands
            .iter()
            .zip(&raws_e)
            .map(|(b, a)| ratio(b, a))
            .collect();
        if let (Some(a), Some(b), Some(mut e)) = (sum(raws), sum(rands), sum(raws_e)) {
            random_vs_raw.push(RoundsRatio {
                workers: w,
                ratio: ratio(&b, &a),
                per_round,
            });
            random_vs_raw_episodes.push(RoundsRatio {
                workers: w,
                ratio: ratio(&b, &e),
                per_round: per_round_e,
            });
            e.agent = "raw-exec-episodes".into();
            throughput.push(a);
            raw_episodes.push(e);
            randoms.push(b);
        }
    }
    throughput.extend(raw_episodes);
    throughput.extend(randoms);
    for agent in ["oracle", "catalogue"] {
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
        env_step_true: Summary::of(env_step),
        exec_warm_true: Summary::of(exec_warm),
        host_sh_true: Summary::of(host),
        throughput,
        random_vs_raw,
        random_vs_raw_episodes,
    })
}

impl Throughput {
    /// Two measurements of the same agent and workers as one.
    fn plus(&self, o: &Throughput) -> Throughput {
        let (episodes, steps) = (self.episodes + o.episodes, self.steps + o.steps);
        let seconds = self.seconds + o.seconds;
        let weighted = |a: f64, na: u64, b: f64, nb: u64| {
            (a * na as f64 + b * nb as f64) / (na + nb).max(1) as f64
        };
        Throughput {
            agent: self.agent.clone(),
            workers: self.workers,
            steps,
            episodes,
            successes: self.successes + o.successes,
            infra_failures: self.infra_failures + o.infra_failures,
            seconds,
            // Each side's rate weighted by the time it ran.
            steps_per_s: (self.steps_per_s * self.seconds + o.steps_per_s * o.seconds)
                / seconds.max(f64::MIN_POSITIVE),
            reset_ms_per_episode: weighted(
                self.reset_ms_per_episode,
                self.episodes,
                o.reset_ms_per_episode,
                o.episodes,
            ),
            step_ms: weighted(self.step_ms, self.steps, o.step_ms, o.steps),
            engine_cpu_us_per_step: weighted(
                self.engine_cpu_us_per_step,
                self.steps,
                o.engine_cpu_us_per_step,
                o.steps,
            ),
            init_cpu_us_per_step: match (self.init_cpu_us_per_step, o.init_cpu_us_per_step) {
                (Some(a), Some(b)) => Some(weighted(a, self.init_steps, b, o.init_steps)),
                (a, b) => a.or(b),
            },
            init_steps: self.init_steps + o.init_steps,
            idle_cpu_share: match (self.idle_cpu_share, o.idle_cpu_share) {
                (Some(a), Some(b)) => {
                    Some((a * self.seconds + b * o.seconds) / seconds.max(f64::MIN_POSITIVE))
                }
                (a, b) => a.or(b),
            },
        }
    }
}

/// Counts of one worker: steps, episodes, successes, infrastructure failures, and seconds
/// spent in resets and in steps.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    steps: u64,
    episodes: u64,
    successes: u64,
    infra: u64,
    reset_s: f64,
    step_s: f64,
    /// Seconds the worker really ran (its last episode or command ends after the deadline).
    elapsed_s: f64,
    /// CPU seconds of the worker's thread while it ran.
    engine_cpu_s: f64,
    /// CPU seconds of its sandbox's init while it ran, and the steps they were measured over
    /// (an episode whose sandbox was replaced is left out).
    init_cpu_s: f64,
    init_steps: u64,
}

/// CPU seconds this thread has used.
fn thread_cpu_s() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
        .unwrap_or(0.0)
}

/// CPU seconds a (single-threaded) process has used, from the scheduler's own accounting
/// (`/proc/PID/schedstat`, nanoseconds); `None` once it is gone.
fn process_cpu_s(pid: i32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// A process's start time (clock ticks since boot, `/proc/PID/stat`): with its pid, which
/// process it is (a pid may be reused).
fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces and parentheses): the state is
    // field 3, the start time field 22.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The init of `env`'s sandbox (pid, start time) and its CPU seconds so far.
fn init_cpu(env: &mut Env) -> Option<((i32, u64), f64)> {
    let pid = env.running()?.sandbox().init_pid();
    Some(((pid, start_ticks(pid)?), process_cpu_s(pid)?))
}

/// The machine's CPU time so far, all CPUs, in clock ticks: (idle, total), from the first
/// line of `/proc/stat` (idle and iowait count as idle).
fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    let total = ticks.iter().take(8).sum();
    Some((idle, total))
}

/// The idle share between two [`machine_cpu_ticks`] readings.
fn idle_share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((i0, t0), (i1, t1)) = (before?, after?);
    let total = t1.checked_sub(t0).filter(|t| *t > 0)?;
    Some(i1.saturating_sub(i0) as f64 / total as f64)
}

/// Where the workers of one measurement start together: each passes its [`Ticket`] once its
/// sandbox is ready, and the machine's CPU time is read when the last one arrives; it is read
/// again when the first worker's loop ends ([`Ticket::finish`]): the idle share is of the
/// time every worker ran (a worker that finishes its last episode alone leaves a CPU idle
/// that the others' load would not).
struct Gate {
    barrier: std::sync::Barrier,
    start: std::sync::Mutex<Option<(u64, u64)>>,
    end: std::sync::Mutex<Option<(u64, u64)>>,
}

/// One worker's way through the [`Gate`]. Dropped without having passed (a worker that failed
/// or panicked first), it passes then, so that the others do not wait for it.
struct Ticket<'a> {
    gate: &'a Gate,
    passed: std::cell::Cell<bool>,
}

impl Ticket<'_> {
    /// Wait for the other workers (once; later calls return at once).
    fn start(&self) {
        if self.passed.replace(true) {
            return;
        }
        if self.gate.barrier.wait().is_leader() {
            if let Ok(mut s) = self.gate.start.lock() {
                *s = machine_cpu_ticks();
            }
        }
    }

    /// This worker's loop has ended: the machine's CPU time now, unless another's ended first.
    fn finish(&self) {
        if let Ok(mut e) = self.gate.end.lock() {
            if e.is_none() {
                *e = machine_cpu_ticks();
            }
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.start();
    }
}

/// Run `work(worker, ticket)` on `workers` threads and sum their counts into a throughput
/// figure; each worker passes its ticket once ready, before its clock starts, and finishes
/// it when its loop ends.
fn on_workers(
    agent: &str,
    workers: usize,
    seconds: f64,
    work: impl Fn(usize, &Ticket) -> Result<Counts, BenchEnvError> + Sync,
) -> Result<Throughput, BenchEnvError> {
    let work = &work;
    let gate = &Gate {
        barrier: std::sync::Barrier::new(workers.max(1)),
        start: std::sync::Mutex::new(None),
        end: std::sync::Mutex::new(None),
    };
    let results: Vec<Result<Counts, BenchEnvError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    let ticket = Ticket {
                        gate,
                        passed: std::cell::Cell::new(false),
                    };
                    work(w, &ticket)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err(BenchEnvError::WorkerPanicked)))
            .collect()
    });
    let idle_cpu_share = idle_share(
        gate.start.lock().ok().and_then(|s| *s),
        gate.end.lock().ok().and_then(|e| *e),
    );
    let mut t = Throughput {
        agent: agent.into(),
        workers,
        steps: 0,
        episodes: 0,
        successes: 0,
        infra_failures: 0,
        seconds,
        steps_per_s: 0.0,
        reset_ms_per_episode: 0.0,
        step_ms: 0.0,
        engine_cpu_us_per_step: 0.0,
        init_cpu_us_per_step: None,
        init_steps: 0,
        idle_cpu_share,
    };
    let (mut reset_s, mut step_s, mut elapsed_s) = (0.0, 0.0, 0.0);
    let (mut engine_cpu_s, mut init_cpu_s, mut init_steps) = (0.0, 0.0, 0);
    for r in results {
        let c = r?;
        t.steps += c.steps;
        t.episodes += c.episodes;
        t.successes += c.successes;
        t.infra_failures += c.infra;
        reset_s += c.reset_s;
        step_s += c.step_s;
        elapsed_s += c.elapsed_s;
        engine_cpu_s += c.engine_cpu_s;
        init_cpu_s += c.init_cpu_s;
        init_steps += c.init_steps;
        // Each worker's own rate over the time it really ran.
        t.steps_per_s += c.steps as f64 / c.elapsed_s.max(f64::MIN_POSITIVE);
    }
    t.seconds = elapsed_s / workers.max(1) as f64;
    t.reset_ms_per_episode = 1e3 * reset_s / t.episodes.max(1) as f64;
    t.step_ms = 1e3 * step_s / t.steps.max(1) as f64;
    t.engine_cpu_us_per_step = 1e6 * engine_cpu_s / t.steps.max(1) as f64;
    t.init_steps = init_steps;
    t.init_cpu_us_per_step = (init_steps > 0).then(|| 1e6 * init_cpu_s / init_steps as f64);
    Ok(t)
}

/// The ceiling: the random agent's commands run straight through the sandbox (no Env: no cwd
/// tracking, verifier, observation or reward), an episode reset every `every` commands
/// (`None`: the task's `max_steps`), its time counted.
fn measure_raw(
    rt: &Runtime,
    cache: &Cache,
    task: &str,
    workers: usize,
    seconds: f64,
    every: Option<u64>,
) -> Result<Throughput, BenchEnvError> {
    let deadline = Duration::from_secs_f64(seconds);
    on_workers("raw-exec", workers, seconds, |w, ticket| {
        let plan = Plan::for_task(task, 1 + w as u64, vec![]);
        let held = crate::running::synthesize(rt, cache, &plan)?;
        let mut running = crate::running::RunningInstance::start(rt, held)?;
        let setup = running
            .instance
            .task
            .clone()
            .ok_or(crate::env::EnvError::NoTask)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(w as u64);
        // Its first episode counts, as an agent's does.
        let mut c = Counts {
            episodes: 1,
            ..Counts::default()
        };
        let init_pid = running.sandbox().init_pid();
        let init = (init_pid, start_ticks(init_pid));
        ticket.start();
        let init_before = process_cpu_s(init_pid);
        let cpu0 = thread_cpu_s();
        let t0 = Instant::now();
        while t0.elapsed() < deadline {
            let a = &setup.actions[rng.gen_range(0..setup.actions.len().max(1))];
            let t = Instant::now();
            running.run(a, Duration::from_secs(10))?;
            c.step_s += t.elapsed().as_secs_f64();
            c.steps += 1;
            if c.steps
                .is_multiple_of(every.unwrap_or(u64::from(setup.max_steps)).max(1))
            {
                // Counted as an episode, so that a row says how often its ceiling reset.
                let t = Instant::now();
                running.restart()?;
                c.reset_s += t.elapsed().as_secs_f64();
                c.episodes += 1;
            }
        }
        c.elapsed_s = t0.elapsed().as_secs_f64();
        c.engine_cpu_s = thread_cpu_s() - cpu0;
        ticket.finish();
        let same_init = init.1.is_some() && (init_pid, start_ticks(init_pid)) == init;
        if let (Some(a), Some(b), true) = (init_before, process_cpu_s(init_pid), same_init) {
            c.init_cpu_s = b - a;
            c.init_steps = c.steps;
        }
        Ok(c)
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
    on_workers(agent, workers, seconds, |w, ticket| {
        let mut env = Env::new(rt.clone(), cache.clone(), EnvConfig::default())?;
        let plan = Plan::for_task(task, 1 + w as u64, vec![]);
        let mut agent: Box<dyn crate::agents::Agent> = match agent {
            "oracle" => Box::new(crate::agents::Oracle::default()),
            "catalogue" => Box::new(crate::agents::CatalogueOracle::default()),
            _ => Box::new(crate::agents::Random::new(w as u64)),
        };
        // Warm: the instance synthesized and its sandbox created.
        env.reset(&plan)?;
        let mut c = Counts::default();
        ticket.start();
        let mut init_last = init_cpu(&mut env);
        let cpu0 = thread_cpu_s();
        let t0 = Instant::now();
        while t0.elapsed() < deadline {
            // The last episode's reading is this one's start (an init replaced in between is
            // told apart by its pid and start time).
            let init_before = init_last.take();
            let t = Instant::now();
            let first = env.reset(&plan)?;
            let t_play = Instant::now();
            c.reset_s += (t_play - t).as_secs_f64();
            c.episodes += 1;
            let p = crate::episode::play(&mut env, &first, agent.as_mut(), &mut |_, _| {})?;
            c.step_s += t_play.elapsed().as_secs_f64();
            c.steps += u64::from(p.steps);
            c.successes += u64::from(p.success);
            c.infra += u64::from(p.infra);
            // The same init before the reset and after the episode (else it was replaced).
            init_last = init_cpu(&mut env);
            if let (Some((init, a)), Some((init_after, b))) = (init_before, init_last) {
                if init == init_after {
                    c.init_cpu_s += b - a;
                    c.init_steps += u64::from(p.steps);
                }
            }
        }
        c.elapsed_s = t0.elapsed().as_secs_f64();
        c.engine_cpu_s = thread_cpu_s() - cpu0;
        ticket.finish();
        Ok(c)
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
    row(&mut s, "env step `true`", &r.env_step_true, "ms");
    row(&mut s, "  its exec alone", &r.exec_warm_true, "ms");
    row(&mut s, "host sh -c true (baseline)", &r.host_sh_true, "ms");
    for t in &r.throughput {
        let _ = writeln!(
            s,
            "{:<9} agent, {} worker(s): {:>7.0} steps/s  ({} steps, {} episodes, {} solved, {} infra failures; reset {:.2} ms/episode, step {:.2} ms; CPU per step: engine {:.0} us, init {}; CPU idle {})",
            t.agent, t.workers, t.steps_per_s, t.steps, t.episodes, t.successes, t.infra_failures,
            t.reset_ms_per_episode, t.step_ms, t.engine_cpu_us_per_step,
            t.init_cpu_us_per_step.map_or("n/a".to_string(), |us| format!("{us:.0} us")),
            t.idle_cpu_share.map_or("n/a".to_string(), |x| format!("{:.1}%", 100.0 * x))
        );
    }
    for (name, ratios) in [
        ("raw-exec", &r.random_vs_raw),
        ("raw-exec-episodes", &r.random_vs_raw_episodes),
    ] {
        for q in ratios {
            let rounds: Vec<String> = q.per_round.iter().map(|x| format!("{x:.3}")).collect();
            let _ = writeln!(
                s,
                "random / {name}, {} worker(s): {:.3} (alternating rounds: {})",
                q.workers,
                q.ratio,
                rounds.join(", ")
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_come_from_the_kernels_accounting_and_grow_with_work() {
        // This thread's own scheduler entry (`/proc/TID` reads as a process's does).
        let tid = nix::unistd::gettid().as_raw();
        let (thread0, sched0) = (thread_cpu_s(), process_cpu_s(tid).unwrap());
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(thread_cpu_s() > thread0);
        assert!(process_cpu_s(tid).unwrap() > sched0);
        // A pid that is not there (above the kernel's pid_max) reads as gone.
        assert_eq!(process_cpu_s(i32::MAX), None);
        assert_eq!(start_ticks(i32::MAX), None);
        // Which process a pid is: this one started once, before now, and stays the same.
        let me = std::process::id() as i32;
        let started = start_ticks(me).unwrap();
        assert!(started > 0);
        assert_eq!(start_ticks(me), Some(started));
    }

    #[test]
    fn the_idle_share_comes_from_the_machines_own_tick_counts() {
        let before = machine_cpu_ticks().expect("/proc/stat");
        assert!(before.0 <= before.1, "idle within total: {before:?}");
        // Sleep past a tick or two (USER_HZ is 100): time passes on every CPU.
        std::thread::sleep(Duration::from_millis(60));
        let after = machine_cpu_ticks().expect("/proc/stat");
        assert!(after.1 > before.1 && after.0 >= before.0);
        let share = idle_share(Some(before), Some(after)).unwrap();
        assert!((0.0..=1.0).contains(&share), "{share}");
        // Unknown or unchanged readings give no share (never a division by zero).
        assert_eq!(idle_share(None, Some(after)), None);
        assert_eq!(idle_share(Some(after), Some(after)), None);
        assert_eq!(idle_share(Some((10, 100)), Some((40, 200))), Some(0.3));
    }

    #[test]
    fn workers_start_together_and_one_that_fails_or_panics_first_does_not_hold_the_others() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        // On a thread of its own, so that a gate that held the live workers fails the test
        // (after a timeout) instead of hanging it.
        let (arrived, seen) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(usize::MAX)),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let (a, v) = (arrived.clone(), seen.clone());
        std::thread::spawn(move || {
            let t = on_workers("test", 4, 0.0, |w, ticket| {
                match w {
                    0 => return Err(BenchEnvError::UnknownTask("early".into())),
                    1 => panic!("a worker that panics before the gate"),
                    _ => {}
                }
                a.fetch_add(1, Ordering::SeqCst);
                ticket.start();
                // Past the gate, every worker that got there has arrived.
                v.fetch_min(a.load(Ordering::SeqCst), Ordering::SeqCst);
                ticket.start(); // a second call does not wait again
                Ok(Counts::default())
            });
            let _ = tx.send(matches!(t, Err(BenchEnvError::UnknownTask(ref x)) if x == "early"));
        });
        let first_error = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a worker that failed or panicked before the gate held the others");
        // The first error in worker order is returned; the live workers both passed the gate.
        assert!(first_error);
        assert_eq!(arrived.load(Ordering::SeqCst), 2);
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        let t = on_workers("test", 2, 0.0, |w, ticket| {
            ticket.start();
            // Long enough for the kernel's tick counts to move (USER_HZ is 100); the first
            // worker to finish ends the idle share's window.
            std::thread::sleep(Duration::from_millis(60 * (1 + w as u64)));
            ticket.finish();
            Ok(Counts {
                steps: 1,
                elapsed_s: 0.01,
                ..Counts::default()
            })
        })
        .unwrap();
        assert_eq!(t.steps, 2);
        assert!(t.idle_cpu_share.is_some_and(|x| (0.0..=1.0).contains(&x)));
    }
}
