//! `engine run`: the episodes of every seed on worker threads, each with its own `Env`, and the
//! report and episode files.

use super::output::Output;
use super::stats::{summarize, Interval, Report, SeedResult};
use super::{Agent, Experiment, ExperimentError};
use crate::certify;
use crate::env::{Env, EnvConfig, EnvError};
use crate::synth::Cache;
use rand::Rng;
use sandbox::Runtime;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// One episode, as written to `episodes.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpisodeRecord {
    pub seed: u64,
    pub worker: usize,
    pub episode: usize,
    /// The plan's seed (instance and task generation).
    pub plan_seed: u64,
    pub instance: Option<String>,
    pub perturbations: Vec<String>,
    pub success: bool,
    #[serde(rename = "return")]
    pub return_: f64,
    pub steps: u32,
    /// The environment, not the agent, failed: masked from success rate and return.
    pub infra: bool,
    /// The agent could no longer act (a language model's endpoint gave up, its replies held
    /// no command): a failed episode, counted, not masked; `error` says why.
    #[serde(default)]
    pub agent_failure: bool,
    /// The instance is not certified solvable: never run.
    pub skipped_uncertified: bool,
    /// The plan cannot be built (a sampled perturbation does not apply, e.g. it shadows a tool
    /// another one removed): never run.
    pub skipped_not_applicable: bool,
    /// Wall time of `Env::reset` (synthesis, certification and sandbox start when the instance
    /// is new; the incremental reset and start steps otherwise).
    pub reset_ms: Option<f64>,
    pub error: Option<String>,
    /// A language model's conversation, requests and token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<crate::agents::Transcript>,
}

/// Run one episode of `plan` in `env`.
fn episode(
    env: &mut Env,
    exp: &Experiment,
    seed: u64,
    worker: usize,
    index: usize,
) -> EpisodeRecord {
    let plan = exp.plan(seed, index);
    let mut rec = EpisodeRecord {
        seed,
        worker,
        episode: index,
        plan_seed: plan.seed,
        instance: None,
        perturbations: plan.perturbations.iter().map(certify::describe).collect(),
        success: false,
        return_: 0.0,
        steps: 0,
        infra: false,
        agent_failure: false,
        skipped_uncertified: false,
        skipped_not_applicable: false,
        reset_ms: None,
        error: None,
        transcript: None,
    };
    let t = Instant::now();
    match env.reset(&plan) {
        Ok(_) => rec.reset_ms = Some(t.elapsed().as_secs_f64() * 1e3),
        Err(EnvError::Uncertified { id, reason }) => {
            tracing::debug!(seed, episode = index, instance = %id, %reason, "skipped: not certified");
            rec.instance = Some(id);
            rec.skipped_uncertified = true;
            rec.error = Some(reason);
            return rec;
        }
        Err(e) if e.not_applicable().is_some() => {
            if let Some((name, why)) = e.not_applicable() {
                tracing::debug!(seed, episode = index, perturbation = %name, reason = %why, "skipped: not applicable");
                rec.error = Some(format!("perturbation `{name}`: not applicable: {why}"));
            }
            rec.skipped_not_applicable = true;
            return rec;
        }
        Err(e) => {
            // The agent never acted: whatever failed (sandbox, cache, synthesis, certification)
            // is the environment's, so the episode is masked.
            tracing::warn!(seed, episode = index, error = %e, infrastructure = e.is_infrastructure(), "episode reset failed");
            rec.infra = true;
            rec.error = Some(e.to_string());
            return rec;
        }
    }
    rec.instance = env.instance_id().map(str::to_string);
    let mut agent: Box<dyn crate::agents::Agent> = match exp.environment.agent {
        Agent::Random => {
            let mut rng = crate::instance::rng_for(plan.seed, &format!("experiment/agent/{index}"));
            Box::new(crate::agents::Random::new(rng.gen()))
        }
        Agent::Oracle => Box::new(crate::agents::Oracle::default()),
        Agent::CatalogueOracle => Box::new(crate::agents::CatalogueOracle::default()),
        Agent::Llm => match exp.llm.as_ref().map(crate::agents::LlmAgent::new) {
            Some(Ok(a)) => Box::new(a),
            // The config was checked at load; what fails now (the key's variable went away)
            // is the agent's.
            Some(Err(e)) => {
                rec.agent_failure = true;
                rec.error = Some(e.to_string());
                return rec;
            }
            None => {
                rec.agent_failure = true;
                rec.error = Some("the agent is `llm` but there is no `[llm]` table".into());
                return rec;
            }
        },
    };
    let first = env.last_observation().clone();
    match crate::episode::play(env, &first, agent.as_mut(), &mut |_, _| {}) {
        Ok(p) => {
            rec.steps = p.steps;
            rec.success = p.success;
            rec.infra = p.infra;
            rec.agent_failure = p.agent_failure.is_some();
            rec.error = p.error.or(p.agent_failure);
            rec.transcript = p.transcript;
        }
        Err(e) => {
            tracing::warn!(seed, episode = index, error = %e, "step failed");
            rec.infra = true;
            rec.error = Some(e.to_string());
        }
    }
    rec.return_ = env.episode_return();
    rec
}

/// The episodes of one seed on `workers` threads.
fn run_seed(
    exp: &Experiment,
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    seed: u64,
    (out, stop): (&Output, &AtomicBool),
) -> Result<Vec<EpisodeRecord>, ExperimentError> {
    let e = &exp.environment;
    let k = e.episodes_per_instance.max(1);
    let groups = e.episodes.div_ceil(k);
    // A group of `k` consecutive episodes shares an instance (and so a sandbox): the queue's
    // items are groups.
    let group_ids: Vec<usize> = (0..groups).collect();
    let results = crate::work_queue::run(
        &group_ids,
        e.workers,
        |w| Ok((w, Env::new(rt.clone(), cache.clone(), cfg.clone())?)),
        |(w, env), _, &g| {
            let mut recs = Vec::new();
            for i in g * k..((g + 1) * k).min(e.episodes) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let rec = episode(env, exp, seed, *w, i);
                out.episode(&rec)?;
                recs.push(rec);
            }
            Ok(recs)
        },
        || ExperimentError::Worker { seed },
    )?;
    let mut all = Vec::with_capacity(e.episodes);
    for r in results {
        all.extend(r);
    }
    all.sort_by_key(|r| r.episode);
    Ok(all)
}

/// Run the experiment; write `<out_dir>/<name>/report.json` and `episodes.jsonl`.
pub fn run(
    exp: &Experiment,
    rt: &Runtime,
    cache: &Cache,
) -> Result<(Report, PathBuf), ExperimentError> {
    run_until(exp, rt, cache, &AtomicBool::new(false))
}

/// [`run`], stopping between episodes once `stop` is set (a signal): the report is then of
/// the episodes that finished, marked `interrupted`.
pub fn run_until(
    exp: &Experiment,
    rt: &Runtime,
    cache: &Cache,
    stop: &AtomicBool,
) -> Result<(Report, PathBuf), ExperimentError> {
    let cfg = exp.env_config()?;
    if let Some(t) = &exp.template {
        // The template's tools must exist in its base before any instance is built.
        let spec = crate::running::base_spec(&t.base.rootfs)?;
        let rootfs = rt
            .resolve(&spec)
            .map_err(crate::running::RunningError::from)?;
        t.check_tools(&crate::instance::BaseView::new(&rootfs))?;
    }
    let out = Output::open(exp)?;
    let mut seeds = Vec::new();
    let mut records = Vec::new();
    for &seed in &exp.experiment.seeds {
        let started = Instant::now();
        let r = run_seed(exp, rt, cache, &cfg, seed, (&out, stop))?;
        let res = summarize(seed, &r, started.elapsed().as_secs_f64());
        tracing::info!(
            seed,
            steps = res.steps,
            steps_per_s = res.steps_per_s,
            success_rate = res.success_rate,
            skipped = res.skipped_uncertified,
            infra = res.infra_failures,
            "seed done"
        );
        seeds.push(res);
        records.extend(r);
        if stop.load(Ordering::Relaxed) {
            tracing::warn!(seed, episodes = records.len(), "stopped by a signal");
            break;
        }
    }
    let col = |f: fn(&SeedResult) -> f64| seeds.iter().map(f).collect::<Vec<_>>();
    let report = Report {
        name: exp.experiment.name.clone(),
        template: exp.template.as_ref().map(|t| t.file.clone()),
        task: exp.task().to_string(),
        agent: exp.environment.agent,
        workers: exp.environment.workers,
        episodes_per_seed: exp.environment.episodes,
        episodes_per_instance: exp.environment.episodes_per_instance,
        require_certified: exp.environment.require_certified,
        reward: exp.reward.clone(),
        steps_per_s: Interval::of_finite(&col(|s| s.steps_per_s)),
        success_rate: Interval::of_finite(&col(|s| s.success_rate)),
        mean_return: Interval::of_finite(&col(|s| s.mean_return)),
        reset_ms: Interval::of_finite(&col(|s| s.reset_ms_median)),
        seeds,
        episodes_file: out.episodes_file(),
        interrupted: stop.load(Ordering::Relaxed),
    };
    let path = out.finish(&records, &report)?;
    Ok((report, path))
}
