//! `engine bench selfplay`: what the actor runtime costs. The same schedule (clean levels of
//! a task, PPO protagonist, one `Env` per worker) runs for the same number of updates
//! directly (the schedule over `ThreadWorkers`, the roles called in place) and through the
//! actor runtime (every role an actor, every worker a supervised actor), alternating, in the
//! same run. The ratio is the runtime's environment steps per second over the direct loop's.
//! A message round trip through a role's actor is timed beside.

use super::Summary;
use crate::env::{Env, EnvConfig};
use crate::roles::{EnvRole, FaultSpace, PpoRole, RolesError, SpaceSettings};
use crate::synth::Cache;
use crate::template::{Format, Template, TemplateError};
use actors::msg::{Failure, FailureKind};
use actors::roles::{Agent, EnvWorker};
use actors::runtime::{Budget, Control, Observer, Parts, WorkerFactory};
use actors::schedule::{build, Iteration, Method, Roles, ScheduleConfig};
use actors::workers::ThreadWorkers;
use policies::nets::{Activation, ActorCriticConfig};
use policies::ppo::PpoConfig;
use sandbox::Runtime;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum BenchSelfPlayError {
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Roles(#[from] RolesError),
    #[error(transparent)]
    Schedule(#[from] actors::schedule::ScheduleError),
    #[error(transparent)]
    Runtime(#[from] actors::runtime::RuntimeError),
    #[error("task `{0}` has no catalogue")]
    NoCatalogue(String),
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct SelfPlayBenchOpts {
    pub task: String,
    /// Environments (workers) and steps per rollout.
    pub envs: usize,
    pub num_steps: usize,
    /// Protagonist updates per measurement.
    pub updates: u64,
    /// Measurements each way (alternating).
    pub rounds: usize,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct SelfPlayBench {
    pub task: String,
    pub envs: usize,
    pub steps_per_update: usize,
    pub direct_steps_per_s: Vec<f64>,
    pub actors_steps_per_s: Vec<f64>,
    /// Per round, actors over direct.
    pub ratio: Summary,
    /// Round trip of one `act` through the protagonist's actor, minus the call in place
    /// (microseconds).
    pub act_overhead_us: Summary,
}

struct Quiet;

impl Observer for Quiet {
    fn iteration(
        &mut self,
        _: u64,
        _: u64,
        _: &Iteration,
    ) -> Result<Control, actors::roles::RoleError> {
        Ok(Control::default())
    }
}

pub fn run(
    rt: &Runtime,
    cache: &Cache,
    o: &SelfPlayBenchOpts,
) -> Result<SelfPlayBench, BenchSelfPlayError> {
    let text = format!(
        "[template]\nname = \"bench\"\ntask = \"{}\"\n[base_environment]\nrootfs = \"host\"\n",
        o.task
    );
    let tpl = Template::parse(&text, Path::new("bench-selfplay.toml"), Format::Toml)?;
    // As many task seeds as workers: after the first round every instance and certificate
    // is cached, so both ways measure the steps, not synthesis.
    let settings = SpaceSettings {
        costs: Default::default(),
        budget: 1.0,
        max_faults: 1,
        seed_base: 9_000_000,
        seed_count: o.envs as u64,
    };
    let space = Arc::new(FaultSpace::new(tpl, &settings)?);
    let cfg = EnvConfig::default();
    let mut probe = Env::new(rt.clone(), cache.clone(), cfg.clone())?;
    probe.reset(&space.template.sample_clean(settings.seed_base))?;
    let width = probe.task().map_or(0, |t| t.actions.len());
    if width == 0 {
        return Err(BenchSelfPlayError::NoCatalogue(o.task.clone()));
    }
    let net = ActorCriticConfig {
        obs_dim: probe.obs_dim(),
        action_dims: vec![width],
        hidden: vec![64, 64],
        activation: Activation::Tanh,
        shared_trunk: false,
    };
    drop(probe);
    let ppo = PpoConfig {
        num_envs: o.envs,
        num_steps: o.num_steps,
        num_minibatches: 1,
        ..PpoConfig::default()
    };
    let sched = ScheduleConfig::new(Method::Clean, space.space.clone(), 1);
    let make_worker = |space: Arc<FaultSpace>| -> Result<EnvRole, crate::env::EnvError> {
        Ok(EnvRole::new(
            Env::new(rt.clone(), cache.clone(), cfg.clone())?,
            space,
            width,
        ))
    };
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for round in 0..o.rounds.max(1) {
        // Direct: the schedule over the roles in place.
        let t = Instant::now();
        let workers = (0..o.envs)
            .map(|_| make_worker(space.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut roles = Roles {
            protagonist: Box::new(PpoRole::new(&net, &ppo, round as u64)?),
            antagonist: None,
            adversaries: Vec::new(),
            critic: None,
            curriculum: None,
            workers: Box::new(ThreadWorkers::new(workers)),
        };
        let mut s = build(&sched, &roles)?;
        let mut steps = 0;
        for _ in 0..o.updates {
            steps += s.iterate(&mut roles)?.steps;
        }
        drop(roles);
        direct.push(steps as f64 / t.elapsed().as_secs_f64());
        // Through the actors.
        let t = Instant::now();
        let (rt2, cache2, cfg2, space2) = (rt.clone(), cache.clone(), cfg.clone(), space.clone());
        let factory: WorkerFactory = Arc::new(move |_| {
            Env::new(rt2.clone(), cache2.clone(), cfg2.clone())
                .map(|env| Box::new(EnvRole::new(env, space2.clone(), width)) as Box<dyn EnvWorker>)
                .map_err(|e| Failure::new(FailureKind::Infrastructure, e.to_string()))
        });
        let parts = Parts {
            protagonist: Box::new(PpoRole::new(&net, &ppo, round as u64)?),
            antagonist: None,
            adversaries: Vec::new(),
            critic: None,
            curriculum: None,
            workers: o.envs,
            worker_factory: factory,
        };
        let summary = actors::runtime::run(
            &sched,
            parts,
            Box::new(Quiet),
            Budget { updates: o.updates },
        )?;
        through.push(summary.steps as f64 / t.elapsed().as_secs_f64());
        tracing::info!(
            round,
            direct = direct[round],
            actors = through[round],
            "selfplay bench round"
        );
    }
    let ratio = Summary::of(through.iter().zip(&direct).map(|(a, d)| a / d).collect());
    let act_overhead_us = act_overhead(&net, &ppo)?;
    Ok(SelfPlayBench {
        task: o.task.clone(),
        envs: o.envs,
        steps_per_update: o.envs * o.num_steps,
        direct_steps_per_s: direct,
        actors_steps_per_s: through,
        ratio,
        act_overhead_us,
    })
}

/// An `act` through the protagonist's actor against the same call in place, interleaved.
fn act_overhead(net: &ActorCriticConfig, ppo: &PpoConfig) -> Result<Summary, BenchSelfPlayError> {
    let obs = vec![0.1f32; net.obs_dim * ppo.num_envs];
    let masks = vec![1f32; net.action_dims[0] * ppo.num_envs];
    let mut local = PpoRole::new(net, ppo, 7)?;
    let remote = PpoRole::new(net, ppo, 7)?;
    let n = ppo.num_envs;
    // The proxy blocks its caller, this thread, as the coordinator's does.
    let (host, mut proxy) = actors::runtime::Host::start(move || {
        actors::runtime::AgentProxy::start("protagonist", Box::new(remote))
    })?;
    let mut diffs = Vec::with_capacity(200);
    for _ in 0..200 {
        let t = Instant::now();
        let _ = local.act(&obs, &masks, n);
        let d = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let _ = proxy.act(&obs, &masks, n);
        diffs.push((t.elapsed().as_secs_f64() - d) * 1e6);
    }
    drop(proxy);
    drop(host);
    Ok(Summary::of(diffs))
}
