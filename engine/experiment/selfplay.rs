//! `engine run` of an experiment with `[selfplay]`: per seed, the template's perturbation
//! space becomes the level space (faults the catalogue cannot recover from masked, held-out
//! families kept out), the protagonist, the adversary population and the curriculum are put
//! in the actor runtime of `actors` with one supervised worker actor per environment, the
//! chosen schedule trains, every iteration goes to `metrics.jsonl` and every episode to
//! `episodes.jsonl`, every role is checkpointed, and the final protagonist is evaluated on
//! held-out task seeds: clean, with faults drawn from the space, and with the held-out
//! families, beside the catalogue oracle on the same levels. `--resume` goes on from each
//! seed's newest checkpoint (`resume.rs` checks the directory is this config's).

use super::config::{Experiment, Training, HELD_OUT_OFFSET, SEED_STRIDE};
use super::resume;
use super::selfplay_config::SelfPlay;
pub use super::selfplay_report::render;
use super::selfplay_report::save;
use super::study::{write, PerSeed};
use super::ExperimentError;
use crate::env::{Env, EnvConfig};
use crate::instance::Plan;
use crate::learn::{self, Evaluation};
use crate::roles::{
    AdversaryRole, BufferRole, CriticSettings, EnvRole, FaultSpace, PpoRole, RealismCritic,
    RolesError, ScoreKind, SpaceSettings,
};
use crate::synth::Cache;
use actors::msg::{Failure, FailureKind, Level, Origin};
use actors::roles::{EnvWorker, RoleError};
use actors::runtime::checkpoint::{self, Checkpoint};
use actors::runtime::{Budget, Control, Observer, Parts, WorkerFactory};
use actors::schedule::{Iteration, Phase};
use policies::curriculum::LevelBufferConfig;
use policies::nets::{Activation, ActorCriticConfig};
use rand::SeedableRng;
use sandbox::Runtime;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One point of a seed's curves (after a protagonist update or an adversary phase).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CurvePoint {
    pub iteration: u64,
    pub updates: u64,
    pub phase: String,
    pub steps: u64,
    /// Success and return of the protagonist's counted episodes of the iteration.
    #[serde(deserialize_with = "learn::nan_as_null")]
    pub success_rate: f64,
    #[serde(deserialize_with = "learn::nan_as_null")]
    pub mean_return: f64,
    pub episodes: usize,
    pub failed: usize,
    /// Mean reward of each adversary that learned (adversary phases).
    pub adversary_reward: Vec<(usize, f64)>,
    /// Faults switched on in the levels the adversaries proposed, by family.
    pub faults: BTreeMap<String, u64>,
    /// Levels the adversaries proposed (episodes of adversary origin) in the iteration.
    #[serde(default)]
    pub proposals: u64,
    /// The budget the iteration's levels were drawn under (`budget_schedule`).
    #[serde(default)]
    pub budget: Option<f64>,
    /// The realism critic's held-out AUC when it learned in the iteration: held-out real
    /// systems against the newest levels, which it had not trained on yet.
    #[serde(default)]
    pub critic_auc: Option<f64>,
}

/// What one seed measured (also its `seed-N/result.json`, kept by `--resume`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeedReport {
    pub seed: u64,
    pub updates: u64,
    pub steps: u64,
    pub seconds: f64,
    pub steps_per_s: f64,
    pub episodes: u64,
    pub failed_episodes: u64,
    pub worker_restarts: u64,
    /// Settings masked because the catalogue oracle could not recover from them.
    pub masked_settings: Vec<String>,
    pub width: usize,
    pub curve: Vec<CurvePoint>,
    pub held_out_clean: Evaluation,
    pub held_out_faulted: Evaluation,
    pub held_out_faulted_oracle: Evaluation,
    pub held_out_families: Option<Evaluation>,
    pub held_out_families_oracle: Option<Evaluation>,
    /// Success per fault family on the faulted held-out levels (levels with it on).
    pub per_fault: PerFault,
    pub checkpoint: PathBuf,
}

/// The report of a self-play run.
#[derive(Debug, Clone, Serialize)]
pub struct SelfPlayReport {
    pub name: String,
    pub method: String,
    pub template: PathBuf,
    pub seeds: Vec<SeedReport>,
    pub held_out_clean: PerSeed,
    pub held_out_faulted: PerSeed,
    pub held_out_faulted_oracle: PerSeed,
    pub held_out_families: Option<PerSeed>,
    pub steps_per_s: PerSeed,
    pub complete: bool,
    pub interrupted: bool,
}

fn learn_err(e: learn::LearnError) -> ExperimentError {
    ExperimentError::Learn(e)
}

fn roles_err(e: RolesError) -> ExperimentError {
    ExperimentError::Roles(e)
}

/// What `engine run --dry-run` prints for a self-play experiment.
pub fn describe(exp: &Experiment, sp: &SelfPlay) -> String {
    let t = exp.training.clone().unwrap_or_default();
    let tpl = exp
        .template
        .as_ref()
        .map(|t| t.file.display().to_string())
        .unwrap_or_default();
    let method = sp.method().map_or("?", |m| m.name());
    let needs = sp.method().map(|m| m.needs());
    let mut roles = vec!["protagonist (PPO)".to_string()];
    if needs.is_some_and(|n| n.antagonist) {
        roles.push("antagonist (PPO)".into());
    }
    if needs.is_some_and(|n| n.adversaries) {
        roles.push(format!("{} adversaries", sp.population));
    }
    if needs.is_some_and(|n| n.curriculum) {
        roles.push(format!(
            "level buffer (capacity {}, replay {})",
            sp.buffer_capacity, sp.replay_prob
        ));
    }
    if sp.lambda != 0.0 {
        roles.push(format!("realism critic (lambda {})", sp.lambda));
    }
    roles.push(format!("{} worker actors", t.num_envs));
    format!(
        "{name}: method {method} on {tpl}\n  roles: {roles}\n  budget: {steps} environment steps = {updates} protagonist updates of {envs} x {ns} per seed; seeds {seeds:?}\n  level space: budget {budget} ({pace}), at most {maxf} faults, task seeds {levels} per seed{held}\n  evaluation: {eval} held-out task seeds, clean and faulted (the catalogue oracle beside), held-out families: {families}\n  output: {out}",
        name = exp.experiment.name,
        roles = roles.join(", "),
        steps = t.total_steps,
        updates = sp.updates(&t),
        envs = t.num_envs,
        ns = t.num_steps,
        seeds = exp.experiment.seeds,
        budget = sp.budget,
        pace = sp.pace(sp.updates(&t)).map_or_else(|(k, r)| format!("{k}: {r}"), |p| p.describe(sp.budget)),
        maxf = sp.max_faults,
        levels = t.train_levels,
        held = if sp.mask_unrecoverable { ", settings the catalogue cannot recover from masked" } else { "" },
        eval = t.eval_levels,
        families = if sp.held_out_faults.is_empty() { "none".into() } else { sp.held_out_faults.join(", ") },
        out = exp.experiment.out_dir.join(&exp.experiment.name).display(),
    )
}

/// Run every seed; the report is rewritten after each one (`complete: false` until the end).
pub fn run(
    exp: &Experiment,
    sp: &SelfPlay,
    rt: &Runtime,
    cache: &Cache,
    stop: &'static AtomicBool,
    resume: bool,
) -> Result<(SelfPlayReport, PathBuf), ExperimentError> {
    let training = exp.training.clone().unwrap_or_default();
    let tpl = exp
        .template
        .clone()
        .ok_or_else(|| ExperimentError::SelfPlay("no template".into()))?;
    let dir = exp.experiment.out_dir.join(&exp.experiment.name);
    if resume {
        // Before anything is written: a directory of another config is left as it is.
        resume::check(&dir, exp)?;
    } else {
        std::fs::create_dir_all(&dir).map_err(|source| ExperimentError::Output {
            dir: dir.clone(),
            source,
        })?;
        // A run without --resume starts the directory over: nothing of an earlier run
        // (its checkpoints, its finished seeds) may be taken for this one's by a later
        // --resume, nor its report by a sweep.
        resume::forget_run(&dir, &exp.experiment.seeds)?;
        resume::record(&dir, exp)?;
    }
    let mut report = SelfPlayReport {
        name: exp.experiment.name.clone(),
        method: sp.method.clone(),
        template: tpl.file.clone(),
        seeds: Vec::new(),
        held_out_clean: PerSeed::of(Vec::new()),
        held_out_faulted: PerSeed::of(Vec::new()),
        held_out_faulted_oracle: PerSeed::of(Vec::new()),
        held_out_families: None,
        steps_per_s: PerSeed::of(Vec::new()),
        complete: false,
        interrupted: false,
    };
    let path = dir.join("report.json");
    for &seed in &exp.experiment.seeds {
        if stop.load(Ordering::Relaxed) {
            report.interrupted = true;
            break;
        }
        let s = run_seed(exp, sp, &training, rt, cache, &dir, seed, stop, resume)?;
        report.interrupted |= s.updates < sp.updates(&training);
        report.seeds.push(s);
        aggregate(&mut report);
        save(&dir, &report)?;
    }
    report.complete = !report.interrupted;
    save(&dir, &report)?;
    Ok((report, path))
}

fn aggregate(r: &mut SelfPlayReport) {
    let col = |f: &dyn Fn(&SeedReport) -> f64| PerSeed::of(r.seeds.iter().map(f).collect());
    r.held_out_clean = col(&|s| s.held_out_clean.success_rate);
    r.held_out_faulted = col(&|s| s.held_out_faulted.success_rate);
    r.held_out_faulted_oracle = col(&|s| s.held_out_faulted_oracle.success_rate);
    r.steps_per_s = col(&|s| s.steps_per_s);
    r.held_out_families = r
        .seeds
        .iter()
        .all(|s| s.held_out_families.is_some())
        .then(|| {
            col(&|s| {
                s.held_out_families
                    .as_ref()
                    .map_or(f64::NAN, |e| e.success_rate)
            })
        });
}

#[allow(clippy::too_many_arguments)]
fn run_seed(
    exp: &Experiment,
    sp: &SelfPlay,
    t: &Training,
    rt: &Runtime,
    cache: &Cache,
    dir: &Path,
    seed: u64,
    stop: &'static AtomicBool,
    resume: bool,
) -> Result<SeedReport, ExperimentError> {
    let seed_dir = dir.join(format!("seed-{seed}"));
    let result_file = seed_dir.join(RESULT_FILE);
    let budget = Budget {
        updates: sp.updates(t),
    };
    let from: Option<Checkpoint> = if resume {
        if result_file.exists() {
            let done: SeedReport = resume::read_json(&result_file)?;
            if done.updates >= budget.updates {
                tracing::info!(seed, "seed finished before: kept");
                return Ok(done);
            }
        }
        checkpoint::latest(&resume::checkpoint_dirs(&seed_dir))
            .map(|c| checkpoint::promote(c).map_err(actors::runtime::RuntimeError::from))
            .transpose()?
    } else {
        None
    };
    let tpl = exp
        .template
        .clone()
        .ok_or_else(|| ExperimentError::SelfPlay("no template".into()))?;
    let env_cfg = exp.env_config()?;
    let settings = SpaceSettings {
        costs: sp.costs.clone(),
        budget: sp.budget,
        max_faults: sp.max_faults,
        seed_base: seed.wrapping_mul(SEED_STRIDE),
        seed_count: t.train_levels as u64,
    };
    let mut space = FaultSpace::new(tpl, &settings).map_err(roles_err)?;
    for (d, dim) in space.space.dims.clone().iter().enumerate() {
        if sp.held_out_faults.contains(&dim.name) {
            for c in 1..dim.choices() {
                space.forbid(d, c);
            }
        }
    }
    let (width, masked) = probe_space(
        rt,
        cache,
        &env_cfg,
        &mut space,
        exp.environment.workers,
        sp.mask_unrecoverable,
        settings.seed_base,
    )?;
    let space = Arc::new(space);
    let obs_dim = Env::new(rt.clone(), cache.clone(), env_cfg.clone())?.obs_dim();
    let net = ActorCriticConfig {
        obs_dim,
        action_dims: vec![width],
        hidden: t.hidden.clone(),
        activation: Activation::Tanh,
        shared_trunk: false,
    };
    let ppo = policies::ppo::PpoConfig {
        total_updates: budget.updates,
        ..exp.ppo_config(t)
    };
    let method = sp
        .method()
        .ok_or_else(|| ExperimentError::SelfPlay(format!("unknown method {}", sp.method)))?;
    let needs = method.needs();
    let adv = sp.adversary_settings(space.template.task.as_deref().unwrap_or_default());
    // Each role from the checkpoint being resumed, or new.
    let saved = |role: &str| from.as_ref().map(|c| c.dir.join(role));
    let adversaries = if needs.adversaries {
        (0..sp.population)
            .map(|k| {
                match saved(&format!("adversary-{k}")) {
                    Some(d) => AdversaryRole::load(&d, &space.space, &adv),
                    None => AdversaryRole::new(
                        &space.space,
                        &adv,
                        seed.wrapping_mul(1000).wrapping_add(k as u64),
                    ),
                }
                .map(|a| Box::new(a) as Box<dyn actors::roles::Synthesizer>)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(roles_err)?
    } else {
        Vec::new()
    };
    let curriculum = if needs.curriculum {
        let cfg = LevelBufferConfig {
            capacity: sp.buffer_capacity,
            temperature: sp.temperature,
            staleness_coef: sp.staleness,
            replay_prob: sp.replay_prob,
            min_fill: sp.min_fill,
        };
        let score = if sp.score == "maxmc" {
            ScoreKind::MaxMc
        } else {
            ScoreKind::PositiveValueLoss
        };
        let role = match saved("curriculum") {
            Some(d) => BufferRole::load(&d, &cfg, score, t.gamma, t.gae_lambda),
            None => BufferRole::new(cfg, score, t.gamma, t.gae_lambda, seed),
        };
        Some(Box::new(role.map_err(roles_err)?) as Box<dyn actors::roles::Curriculum>)
    } else {
        None
    };
    let agent = |role: &str, seed: u64| match saved(role) {
        Some(d) => PpoRole::load(&d, &net, &ppo),
        None => PpoRole::new(&net, &ppo, seed),
    };
    let antagonist = if needs.antagonist {
        Some(
            Box::new(agent("antagonist", seed ^ 0xa27a).map_err(roles_err)?)
                as Box<dyn actors::roles::Agent>,
        )
    } else {
        None
    };
    // The realism critic, when its term weighs anything (lambda is an ablation axis).
    let critic = if sp.lambda != 0.0 {
        let mut c = RealismCritic::new(
            rt.clone(),
            cache.clone(),
            space.clone(),
            CriticSettings::default(),
            seed ^ 0xc41c,
        )
        .map_err(|e| ExperimentError::SelfPlay(e.to_string()))?;
        if let Some(d) = saved("critic") {
            c.resume_from(&d).map_err(roles_err)?;
        }
        Some(Box::new(c) as Box<dyn actors::roles::Critic>)
    } else {
        None
    };
    let (rt2, cache2, cfg2, space2) = (rt.clone(), cache.clone(), env_cfg.clone(), space.clone());
    let factory: WorkerFactory = Arc::new(move |_i| {
        Env::new(rt2.clone(), cache2.clone(), cfg2.clone())
            .map(|env| Box::new(EnvRole::new(env, space2.clone(), width)) as Box<dyn EnvWorker>)
            .map_err(|e| Failure::new(FailureKind::Infrastructure, e.to_string()))
    });
    let parts = Parts {
        protagonist: Box::new(agent("protagonist", seed).map_err(roles_err)?),
        antagonist,
        adversaries,
        critic,
        curriculum,
        workers: ppo.num_envs,
        worker_factory: factory,
    };
    let final_dir = seed_dir.join("final");
    std::fs::create_dir_all(&seed_dir).map_err(|source| ExperimentError::Output {
        dir: seed_dir.clone(),
        source,
    })?;
    // The environment settings, for `engine replay`.
    let env_json = serde_json::to_vec_pretty(&env_cfg).map_err(|e| ExperimentError::Write {
        file: seed_dir.join("env.json"),
        source: std::io::Error::other(e),
    })?;
    write(&seed_dir.join("env.json"), &env_json)?;
    let shared = Arc::new(Mutex::new(Vec::new()));
    let observer = SeedObserver::new(
        &seed_dir,
        seed,
        sp.checkpoint_every,
        budget.updates,
        stop,
        space.clone(),
        shared.clone(),
        from.as_ref().map(|c| c.dir.as_path()),
    )?;
    let seconds_before = observer.seconds_before;
    let cfg = sp
        .schedule(space.space.clone(), seed, budget.updates)
        .ok_or_else(|| ExperimentError::SelfPlay(format!("unknown method {}", sp.method)))?;
    // The budget schedule against the space as masked (a start no fault fits any more).
    cfg.validate().map_err(|e| {
        ExperimentError::SelfPlay(match e {
            actors::schedule::ScheduleError::Config { key, reason } => format!(
                "seed {seed}: key `{}`: {reason} (in the level space after masking)",
                super::selfplay_config::pace_key(key)
            ),
            e => format!("seed {seed}: {e}"),
        })
    })?;
    let t0 = Instant::now();
    let summary = actors::runtime::run_from(&cfg, parts, Box::new(observer), budget, from)?;
    let seconds = seconds_before + t0.elapsed().as_secs_f64();
    let curve = shared.lock().map(|c| c.clone()).unwrap_or_default();
    // The final protagonist, from its checkpoint (the actor that trained it is gone).
    let agent = Arc::new(
        policies::ppo::PpoAgent::load(&final_dir.join("protagonist").join("ppo")).map_err(|e| {
            ExperimentError::SelfPlay(format!("loading the final protagonist: {e}"))
        })?,
    );
    let mode = t.policy;
    let workers = exp.environment.workers;
    let eval = |plans: &[Plan], oracle: bool| -> Result<Evaluation, ExperimentError> {
        let a = agent.clone();
        let make = move || {
            if oracle {
                learn::catalogue_oracle()
            } else {
                learn::policy_agent(&a, mode, seed)
            }
        };
        learn::evaluate(rt, cache, &env_cfg, plans, workers, &make).map_err(learn_err)
    };
    let held_seeds: Vec<u64> = (0..t.eval_levels as u64)
        .map(|k| {
            seed.wrapping_mul(SEED_STRIDE)
                .wrapping_add(HELD_OUT_OFFSET)
                .wrapping_add(k)
        })
        .collect();
    let clean: Vec<Plan> = held_seeds
        .iter()
        .map(|&s| space.template.sample_clean(s))
        .collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xe7a1);
    let faulted_levels: Vec<Level> = held_seeds
        .iter()
        .map(|&s| Level {
            seed: s,
            ..space.space.random(&mut rng)
        })
        .collect();
    let faulted: Vec<Plan> = faulted_levels.iter().map(|l| space.plan(l)).collect();
    let held_out_clean = eval(&clean, false)?;
    let (per_fault, held_out_faulted) = per_fault(
        &space,
        &faulted_levels,
        rt,
        cache,
        &env_cfg,
        workers,
        &agent,
        mode,
        seed,
    )?;
    let held_out_faulted_oracle = eval(&faulted, true)?;
    let families = held_out_family_plans(&space, &sp.held_out_faults, &held_seeds);
    let (held_out_families, held_out_families_oracle) = if families.is_empty() {
        (None, None)
    } else {
        (Some(eval(&families, false)?), Some(eval(&families, true)?))
    };
    let report = SeedReport {
        seed,
        updates: summary.updates,
        steps: summary.steps,
        seconds,
        steps_per_s: summary.steps as f64 / seconds.max(1e-9),
        episodes: summary.episodes,
        failed_episodes: summary.failed_episodes,
        worker_restarts: summary.worker_restarts,
        masked_settings: masked,
        width,
        curve,
        held_out_clean,
        held_out_faulted,
        held_out_faulted_oracle,
        held_out_families,
        held_out_families_oracle,
        per_fault,
        checkpoint: final_dir,
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| ExperimentError::Write {
        file: result_file.clone(),
        source: std::io::Error::other(e),
    })?;
    write(&result_file, &json)?;
    Ok(report)
}

/// A finished seed's report in its directory.
pub(super) const RESULT_FILE: &str = "result.json";
/// What the observer keeps in a checkpoint.
const OBSERVER_STATE: &str = "observer.json";

/// The observer's state at a checkpoint: how much of its files belongs to the run up to it,
/// and its curve.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ObserverState {
    metrics_bytes: u64,
    episodes_bytes: u64,
    last_checkpoint: u64,
    /// Seconds of training up to the checkpoint (over every process that ran it).
    seconds: f64,
    curve: Vec<CurvePoint>,
}

/// Mask what the catalogue cannot recover from (one clean instance per setting, at the
/// first training seed) and measure the catalogue width. The unperturbed instance must be
/// usable: its catalogue oracle failing is a bad task, not a fault.
#[allow(clippy::too_many_arguments)]
fn probe_space(
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    space: &mut FaultSpace,
    workers: usize,
    mask: bool,
    seed: u64,
) -> Result<(usize, Vec<String>), ExperimentError> {
    let n = space.space.dims.len();
    let mut levels = vec![(
        None,
        Level {
            seed,
            choices: vec![0; n],
        },
    )];
    for (d, dim) in space.space.dims.iter().enumerate() {
        for c in 1..dim.choices() {
            if dim.allowed[c] {
                let mut choices = vec![0; n];
                choices[d] = c as u32;
                levels.push((Some((d, c)), Level { seed, choices }));
            }
        }
    }
    let plans: Vec<Plan> = levels.iter().map(|(_, l)| space.plan(l)).collect();
    let sizes = crate::work_queue::run(
        &plans,
        workers,
        |_| Env::new(rt.clone(), cache.clone(), cfg.clone()).map_err(ExperimentError::Env),
        |env, _, plan| match env.reset(plan) {
            Ok(_) => Ok(Ok(env.task().map_or(0, |t| t.actions.len()))),
            Err(e) if e.is_infrastructure() => Err(ExperimentError::Env(e)),
            Err(e) => Ok(Err(e.to_string())),
        },
        || ExperimentError::SelfPlay("a probe worker panicked".into()),
    )?;
    if let Err(reason) = &sizes[0] {
        return Err(ExperimentError::SelfPlay(format!(
            "the unperturbed instance of task seed {seed} cannot be used: {reason}"
        )));
    }
    let width = sizes.iter().flatten().copied().max().unwrap_or(0);
    let mut masked = Vec::new();
    for ((pick, level), size) in levels.iter().zip(&sizes) {
        if let (Some((d, c)), Err(reason)) = (pick, size) {
            let label = space.space.describe(level);
            tracing::info!(setting = %label, reason = %reason, "setting masked");
            if mask {
                masked.push(label);
                space.forbid(*d, *c);
            }
        }
    }
    Ok((width, masked))
}

/// Plans with exactly one held-out family's setting on (the settings in turn).
fn held_out_family_plans(space: &FaultSpace, families: &[String], seeds: &[u64]) -> Vec<Plan> {
    let dims: Vec<(usize, usize)> = space
        .space
        .dims
        .iter()
        .enumerate()
        .filter(|(_, d)| families.contains(&d.name))
        .flat_map(|(i, d)| (1..d.choices()).map(move |c| (i, c)))
        .collect();
    if dims.is_empty() {
        return Vec::new();
    }
    seeds
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let (d, c) = dims[k % dims.len()];
            let mut choices = vec![0; space.space.dims.len()];
            choices[d] = c as u32;
            space.plan(&Level { seed: s, choices })
        })
        .collect()
}

/// Per fault family: `(successes, counted episodes)` on the levels with it on.
pub type PerFault = BTreeMap<String, (usize, usize)>;

/// The faulted evaluation, and success per family over the levels with it on.
#[allow(clippy::too_many_arguments)]
fn per_fault(
    space: &FaultSpace,
    levels: &[Level],
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    workers: usize,
    agent: &Arc<policies::ppo::PpoAgent>,
    mode: learn::PolicyMode,
    seed: u64,
) -> Result<(PerFault, Evaluation), ExperimentError> {
    // Each level is played once; the families' figures are tallies over its outcomes.
    let plans: Vec<Plan> = levels.iter().map(|l| space.plan(l)).collect();
    let a = agent.clone();
    let make = move || learn::policy_agent(&a, mode, seed);
    let outcomes =
        learn::evaluate_each(rt, cache, cfg, &plans, workers, &make).map_err(learn_err)?;
    let mut by_family = BTreeMap::new();
    for (d, dim) in space.space.dims.iter().enumerate() {
        let with: Vec<_> = levels
            .iter()
            .zip(&outcomes)
            .filter(|(l, _)| l.choices.get(d).is_some_and(|&c| c != 0))
            .map(|(_, o)| o)
            .collect();
        if with.is_empty() {
            continue;
        }
        let e = learn::tally(with);
        // `episodes` leaves skipped levels out already.
        by_family.insert(dim.name.clone(), (e.successes, e.episodes - e.infra));
    }
    Ok((by_family, learn::tally(&outcomes)))
}

/// Writes the metrics and episodes of one seed, asks for checkpoints, watches the stop flag.
struct SeedObserver {
    seed: u64,
    metrics: std::fs::File,
    episodes: std::fs::File,
    metrics_bytes: u64,
    episodes_bytes: u64,
    /// Training seconds before this process (a resumed run).
    seconds_before: f64,
    every: u64,
    last_checkpoint: u64,
    budget: u64,
    dir: PathBuf,
    stop: &'static AtomicBool,
    space: Arc<FaultSpace>,
    curve: Arc<Mutex<Vec<CurvePoint>>>,
    t0: Instant,
}

impl SeedObserver {
    /// The observer of seed `seed` writing into `dir`; going on from the checkpoint
    /// `from` (its files cut back to what they held at that checkpoint), or from scratch.
    #[allow(clippy::too_many_arguments)]
    fn new(
        dir: &Path,
        seed: u64,
        every: u64,
        budget: u64,
        stop: &'static AtomicBool,
        space: Arc<FaultSpace>,
        curve: Arc<Mutex<Vec<CurvePoint>>>,
        from: Option<&Path>,
    ) -> Result<Self, ExperimentError> {
        let state: Option<ObserverState> = from
            .map(|d| resume::read_json(&d.join(OBSERVER_STATE)))
            .transpose()?;
        let resumed = state.is_some();
        let st = state.unwrap_or_default();
        let open = |name: &str, keep: Option<u64>| {
            let file = dir.join(name);
            let werr = |source| ExperimentError::Write {
                file: file.clone(),
                source,
            };
            match keep {
                None => std::fs::File::create(&file).map_err(werr),
                Some(len) => {
                    let f = std::fs::OpenOptions::new()
                        .append(true)
                        .open(&file)
                        .map_err(werr)?;
                    let have = f.metadata().map_err(werr)?.len();
                    if have < len {
                        return Err(ExperimentError::Resume {
                            dir: dir.to_path_buf(),
                            reason: format!(
                                "{} holds {have} bytes, the checkpoint counted {len}",
                                file.display()
                            ),
                        });
                    }
                    // What was written after the checkpoint is played again.
                    f.set_len(len).map_err(werr)?;
                    Ok(f)
                }
            }
        };
        let metrics = open("metrics.jsonl", resumed.then_some(st.metrics_bytes))?;
        let episodes = open("episodes.jsonl", resumed.then_some(st.episodes_bytes))?;
        if let (true, Ok(mut c)) = (resumed, curve.lock()) {
            *c = st.curve;
        }
        Ok(Self {
            seed,
            metrics,
            episodes,
            metrics_bytes: st.metrics_bytes,
            episodes_bytes: st.episodes_bytes,
            seconds_before: st.seconds,
            every,
            last_checkpoint: st.last_checkpoint,
            budget,
            dir: dir.to_path_buf(),
            stop,
            space,
            curve,
            t0: Instant::now(),
        })
    }
}

impl SeedObserver {
    /// A progress bar redrawn in place on a terminal; plain log lines otherwise.
    fn progress(&self, line: &str, updates: u64) {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            let width = 24usize;
            let done = (updates.min(self.budget) as usize * width) / self.budget.max(1) as usize;
            let bar = format!("[{}{}]", "#".repeat(done), ".".repeat(width - done));
            eprint!("\r\x1b[2K{bar} {line}");
            if updates >= self.budget {
                eprintln!();
            }
        } else {
            eprintln!("{line}");
        }
    }
}

fn io(e: std::io::Error) -> RoleError {
    RoleError::wrap("metrics", e)
}

impl Observer for SeedObserver {
    fn iteration(
        &mut self,
        index: u64,
        updates: u64,
        it: &Iteration,
    ) -> Result<Control, RoleError> {
        let mine: Vec<_> = it
            .outcomes
            .iter()
            .filter(|o| o.agent == "protagonist" && o.counted())
            .collect();
        let k = mine.len();
        let mut faults = BTreeMap::new();
        let mut proposals = 0;
        for o in it
            .outcomes
            .iter()
            .filter(|o| matches!(o.origin, Origin::Adversary(_)))
        {
            proposals += 1;
            for (d, &c) in o.level.choices.iter().enumerate() {
                if c != 0 {
                    if let Some(dim) = self.space.space.dims.get(d) {
                        *faults.entry(dim.name.clone()).or_insert(0) += 1;
                    }
                }
            }
        }
        let phase = match it.phase {
            Some(Phase::Protagonist) => "protagonist",
            Some(Phase::Adversary) => "adversary",
            Some(Phase::Selection) => "selection",
            None => "none",
        };
        let point = CurvePoint {
            iteration: index,
            updates,
            phase: phase.into(),
            steps: it.steps,
            success_rate: if k == 0 {
                f64::NAN
            } else {
                mine.iter().filter(|o| o.success).count() as f64 / k as f64
            },
            mean_return: if k == 0 {
                f64::NAN
            } else {
                mine.iter().map(|o| o.ret).sum::<f64>() / k as f64
            },
            episodes: it.outcomes.len(),
            failed: it.outcomes.iter().filter(|o| !o.counted()).count(),
            adversary_reward: it
                .adversaries
                .iter()
                .filter_map(|(a, s)| s.get("mean_reward").map(|r| (*a, r)))
                .collect(),
            faults,
            proposals,
            budget: it.budget,
            critic_auc: it
                .critic
                .as_ref()
                .and_then(|s| s.get("auc_held_out"))
                .filter(|a| a.is_finite()),
        };
        let mut line = serde_json::to_vec(&serde_json::json!({
            "seed": self.seed,
            "point": &point,
            "protagonist": it.protagonist.as_ref().map(|s| &s.values),
            "buffer": it.buffer,
            "budget": it.budget,
            "critic": it.critic.as_ref().map(|s| &s.values),
            "seconds": self.seconds_before + self.t0.elapsed().as_secs_f64(),
        }))
        .map_err(|e| RoleError::wrap("metrics", e))?;
        line.push(b'\n');
        self.metrics.write_all(&line).map_err(io)?;
        self.metrics_bytes += line.len() as u64;
        for o in &it.outcomes {
            let mut line = serde_json::to_vec(&serde_json::json!({
                "seed": self.seed,
                "iteration": index,
                "agent": o.agent,
                "origin": o.origin,
                "learn": o.learn,
                "level": o.level,
                "key": o.level.key(),
                "faults": self.space.space.describe(&o.level),
                "plan": self.space.plan(&o.level),
                "actions": o.actions,
                "return": o.ret,
                "success": o.success,
                "steps": o.steps,
                "failure": o.failure,
            }))
            .map_err(|e| RoleError::wrap("episodes", e))?;
            line.push(b'\n');
            self.episodes.write_all(&line).map_err(io)?;
            self.episodes_bytes += line.len() as u64;
        }
        let line = format!(
            "seed {}: update {updates}/{} ({phase}), {} steps, success {:.2}, return {:.2}{}{}",
            self.seed,
            self.budget,
            it.steps,
            point.success_rate,
            point.mean_return,
            point
                .budget
                .map_or(String::new(), |b| format!(", budget {b:.2}")),
            if point.adversary_reward.is_empty() {
                String::new()
            } else {
                format!(
                    ", adversary reward {}",
                    point
                        .adversary_reward
                        .iter()
                        .map(|(_, r)| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
        );
        self.progress(&line, updates);
        if let Ok(mut c) = self.curve.lock() {
            c.push(point);
        }
        let stop = self.stop.load(Ordering::Relaxed);
        let last = updates >= self.budget || stop;
        let checkpoint = if last {
            Some(self.dir.join("final"))
        } else if self.every > 0 && updates >= self.last_checkpoint + self.every {
            self.last_checkpoint = updates;
            Some(self.dir.join("checkpoint"))
        } else if self.every > 0 && matches!(it.phase, Some(Phase::Adversary | Phase::Selection)) {
            // A finished adversary phase (or SFL selection) is saved too, so a run killed in
            // the protagonist phase after it does not play it again.
            Some(self.dir.join("checkpoint"))
        } else {
            None
        };
        Ok(Control { checkpoint, stop })
    }

    fn checkpointed(&mut self, dir: &Path) -> Result<(), RoleError> {
        let st = ObserverState {
            metrics_bytes: self.metrics_bytes,
            episodes_bytes: self.episodes_bytes,
            last_checkpoint: self.last_checkpoint,
            seconds: self.seconds_before + self.t0.elapsed().as_secs_f64(),
            curve: self.curve.lock().map(|c| c.clone()).unwrap_or_default(),
        };
        let text = serde_json::to_vec(&st).map_err(|e| RoleError::wrap("checkpoint", e))?;
        std::fs::write(dir.join(OBSERVER_STATE), text).map_err(|e| RoleError::wrap("checkpoint", e))
    }
}
