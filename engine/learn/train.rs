//! One PPO training run on a task's levels: a random-agent throughput baseline on the same
//! vectorised environments, PPO updates until the step budget is spent (a learning curve
//! point per update) or, with a stopping rule, until the policy solves the check levels
//! (validation levels: neither training nor held-out ones); then the policy (sampled as in
//! training, or greedy) and the task's catalogue oracle on held-out levels.

use super::{LearnError, PlayedEpisode, TrainEnv};
use crate::agents::{Agent, CatalogueOracle, PolicyAgent};
use crate::env::{Env, EnvConfig};
use crate::episode::play;
use crate::instance::Plan;
use crate::synth::Cache;
use policies::nets::{Activation, ActorCriticConfig};
use policies::ppo::{PpoAgent, PpoConfig, RolloutBuffer};
use policies::rollout::{collect, Choice, VecEnv};
use rand::{Rng, SeedableRng};
use sandbox::Runtime;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// What to train and how.
#[derive(Debug, Clone)]
pub struct TrainSpec {
    pub task: String,
    pub seed: u64,
    pub train_levels: Vec<Plan>,
    pub env: EnvConfig,
    /// `num_envs` and `num_steps` of this are the vectorised environments and rollout length.
    pub ppo: PpoConfig,
    pub hidden: Vec<usize>,
    /// Environment steps to learn from.
    pub total_steps: u64,
    /// Threads the environments are stepped on.
    pub workers: usize,
    pub episodes_per_level: usize,
    /// Environment steps of the random-agent throughput baseline.
    pub baseline_steps: u64,
    /// Checks on validation levels: every `every_updates` updates (0: never), one episode of
    /// the policy (acting as `mode` says) on each of `levels`; training stops at the first
    /// check whose success rate reaches `stop_success`.
    pub checks: CheckSpec,
}

/// How a trained policy acts in checks and evaluations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Sampled from its action distribution, as in training (the policy PPO optimises),
    /// seeded per level.
    #[default]
    Sampled,
    /// Its most likely action at every step.
    Greedy,
}

impl PolicyMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sampled => "sampled",
            Self::Greedy => "greedy",
        }
    }
}

/// Checks of the policy during training, on validation levels.
#[derive(Debug, Clone, Default)]
pub struct CheckSpec {
    pub every_updates: u64,
    pub levels: Vec<Plan>,
    pub stop_success: Option<f64>,
    pub mode: PolicyMode,
}

/// One check (after an update).
#[derive(Debug, Clone, Serialize)]
pub struct CheckPoint {
    pub steps: u64,
    pub success_rate: f64,
    pub episodes: usize,
    /// Environment steps the check's episodes took (not training steps).
    pub check_steps: u64,
}

/// One point of the learning curve (after an update).
#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    pub steps: u64,
    /// Over the training episodes that ended in this rollout (not masked).
    pub success_rate: f64,
    pub mean_return: f64,
    pub episodes: usize,
    pub masked: usize,
}

/// An `f64` that JSON wrote as `null` because it was NaN (serde_json writes NaN so), read
/// back as NaN.
pub fn nan_as_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Success of an agent on a set of levels.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Evaluation {
    pub episodes: usize,
    pub successes: usize,
    /// Episodes the environment failed (not counted either way).
    pub infra: usize,
    /// Levels skipped (not certified, not catalogue-solvable, not applicable).
    pub skipped: usize,
    /// `successes / (episodes - infra)` (NaN when none counted).
    #[serde(deserialize_with = "nan_as_null")]
    pub success_rate: f64,
    #[serde(deserialize_with = "nan_as_null")]
    pub mean_steps: f64,
    /// Steps of the counted episodes.
    pub steps: u64,
}

/// What a training run measured.
#[derive(Debug, Clone, Serialize)]
pub struct TrainResult {
    pub task: String,
    pub seed: u64,
    pub curve: Vec<CurvePoint>,
    pub steps: u64,
    /// PPO updates run (fewer than the budget's where the stopping rule ended training).
    pub updates: u64,
    /// Environment steps per second while learning (collection and updates).
    pub train_steps_per_s: f64,
    /// The random agent's steps per second on the same environments and workers.
    pub random_steps_per_s: f64,
    /// Steps per second of the last updates' training (collection and updates, as many
    /// steps as the baseline's, checks not counted).
    pub late_train_steps_per_s: f64,
    /// Each environment's latest training episodes (finished ones, as many steps as its
    /// share of the late training's, its last episodes cycled when they hold fewer) played
    /// again right after training, each on its level with the actions training took, on as
    /// many fresh environments and the same workers, in rounds of a rollout's length, with
    /// no policy and no learner: nearly the late training's environment work without the
    /// learning (NaN, with a warning, when an environment finished no episode or the replay
    /// failed).
    pub replay_steps_per_s: f64,
    /// Wall time of the training phase, and the part of it spent in PPO updates (the
    /// learner's own cost; acting is a forward pass per environment step besides, in the
    /// workers).
    pub train_seconds: f64,
    pub update_seconds: f64,
    /// The part of `train_seconds` spent stepping and resetting the environments (the
    /// rollouts' wall time times the workers' share of time spent in the environments
    /// rather than acting); the rest is the learner's: acting, value bootstraps, updates and
    /// bookkeeping.
    pub env_seconds: f64,
    /// Checks on validation levels (their time is not in `train_seconds`).
    pub checks: Vec<CheckPoint>,
    pub check_seconds: f64,
    /// The stopping rule ended training before the budget was spent.
    pub stopped_early: bool,
    pub skipped_levels: u64,
    pub masked_episodes: u64,
    #[serde(skip)]
    pub policy: Option<Arc<PpoAgent>>,
}

/// Train PPO on `spec.train_levels`.
pub fn train(rt: &Runtime, cache: &Cache, spec: &TrainSpec) -> Result<TrainResult, LearnError> {
    let levels = Arc::new(spec.train_levels.clone());
    let n = spec.ppo.num_envs;
    // The catalogue size of the task (every level of a task has the same catalogue).
    let probe = Env::new(rt.clone(), cache.clone(), spec.env.clone())?;
    let obs_dim = probe.obs_dim();
    drop(probe);
    // Every level synthesized and certified once; the policy's width is the largest
    // catalogue among them.
    let actions = warm(rt, cache, &spec.env, &levels, spec.workers)?;
    let mut envs = Vec::with_capacity(n);
    for k in 0..n {
        let env = Env::new(rt.clone(), cache.clone(), spec.env.clone())?;
        envs.push(TrainEnv::new(
            env,
            levels.clone(),
            k,
            n,
            spec.episodes_per_level,
            actions,
        )?);
    }
    let mut venv = VecEnv::with_workers(envs, spec.workers)?;
    // Each environment keeps its latest episodes, as many steps as its share of the late
    // training's window (the baseline's steps rounded up to whole updates), to be played
    // again without the learner.
    let per_update = spec.ppo.batch_size() as u64;
    let per_env = (spec.baseline_steps.max(1).div_ceil(per_update) * per_update)
        .div_ceil(n as u64)
        .max(1) as usize;
    // The random agent's throughput on the same environments and workers, each environment
    // run on its worker as training's rollouts are (baseline of the same run).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(spec.seed ^ 0x5eed);
    let mut rngs: Vec<_> = (0..n).map(|_| policies::rng::seeded(rng.gen())).collect();
    let base_steps = spec.baseline_steps.div_ceil(n as u64) * n as u64;
    let t0 = Instant::now();
    venv.play_rounds(
        (base_steps / n as u64) as usize,
        spec.ppo.num_steps,
        true,
        &mut rngs,
        &|_, _, mask, rng| {
            // Uniform over the level's own catalogue (a prefix of the policy's actions).
            let valid = mask.map_or(actions, |m| m.iter().filter(|&&x| x > 0.0).count());
            Ok(Choice {
                actions: vec![rng.gen_range(0..valid.max(1) as u32)],
                ..Choice::default()
            })
        },
    )?;
    let random_steps_per_s = base_steps as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    venv.reset_all()?;
    for e in venv.envs_mut() {
        e.record_last(per_env);
    }
    let net = ActorCriticConfig {
        obs_dim,
        action_dims: vec![actions],
        hidden: spec.hidden.clone(),
        activation: Activation::Tanh,
        shared_trunk: false,
    };
    let updates = spec.total_steps.div_ceil(per_update).max(1);
    let cfg = PpoConfig {
        total_updates: updates,
        ..spec.ppo.clone()
    };
    let mut agent = PpoAgent::new(&net, &cfg, spec.seed)?;
    let mut buf = RolloutBuffer::new(cfg.num_steps, cfg.num_envs, &net, true);
    let mut curve = Vec::new();
    let mut checks = Vec::new();
    let mut steps = 0u64;
    let t1 = Instant::now();
    let env_seconds_before = venv.env_seconds();
    let (mut update_seconds, mut check_seconds) = (0.0, 0.0);
    let mut stopped_early = false;
    // (steps, training seconds without checks) at the end of every update.
    let mut marks: Vec<(u64, f64)> = vec![(0, 0.0)];
    for u in 1..=updates {
        let eps = collect(&mut agent, &mut venv, &mut buf)?;
        let tu = Instant::now();
        agent.update(&buf)?;
        update_seconds += tu.elapsed().as_secs_f64();
        steps += per_update;
        let counted: Vec<_> = eps.iter().filter(|e| !e.masked).collect();
        let k = counted.len();
        curve.push(CurvePoint {
            steps,
            success_rate: if k == 0 {
                f64::NAN
            } else {
                counted.iter().filter(|e| e.info.success).count() as f64 / k as f64
            },
            mean_return: if k == 0 {
                f64::NAN
            } else {
                counted.iter().map(|e| e.ret).sum::<f64>() / k as f64
            },
            episodes: k,
            masked: eps.len() - k,
        });
        tracing::info!(
            task = %spec.task,
            seed = spec.seed,
            steps,
            success_rate = curve.last().map_or(f64::NAN, |c| c.success_rate),
            "ppo update"
        );
        marks.push((steps, t1.elapsed().as_secs_f64() - check_seconds));
        let c = &spec.checks;
        if c.every_updates > 0 && !c.levels.is_empty() && (u % c.every_updates == 0 || u == updates)
        {
            let tc = Instant::now();
            let (point, back) = check(rt, cache, spec, agent, steps)?;
            agent = back;
            check_seconds += tc.elapsed().as_secs_f64();
            // A check is advisory: one the environment failed is recorded as NaN, and
            // training goes on.
            let point = point.unwrap_or_else(|e| {
                tracing::warn!(task = %spec.task, seed = spec.seed, steps, error = %e, "check failed");
                CheckPoint {
                    steps,
                    success_rate: f64::NAN,
                    episodes: 0,
                    check_steps: 0,
                }
            });
            tracing::info!(
                task = %spec.task,
                seed = spec.seed,
                steps,
                check_success = point.success_rate,
                mode = spec.checks.mode.name(),
                "check on validation levels"
            );
            let reached = c.stop_success.is_some_and(|s| point.success_rate >= s);
            checks.push(point);
            if reached && u < updates {
                stopped_early = true;
                break;
            }
        }
    }
    let train_seconds = t1.elapsed().as_secs_f64() - check_seconds;
    let env_seconds = venv.env_seconds() - env_seconds_before;
    let updates_run = curve.len() as u64;
    let train_steps_per_s = steps as f64 / train_seconds.max(1e-9);
    let (mut skipped, mut masked) = (0, 0);
    for e in venv.envs() {
        skipped += e.counts.skipped_levels;
        masked += e.counts.masked_episodes;
    }
    // The last updates covering the baseline's steps, against their episodes played again
    // without learning right after (same levels, actions and workers, in the same run).
    let late = late_rate(&marks, spec.baseline_steps.max(1));
    let played: Vec<Vec<PlayedEpisode>> = venv.envs().iter().map(TrainEnv::recorded).collect();
    drop(venv);
    let per_env_late = late.0.div_ceil(n as u64).max(1) as usize;
    // A baseline that cannot be measured costs the run nothing but the figure.
    let replay_steps_per_s = replay_rate(rt, cache, spec, &levels, actions, played, per_env_late)
        .unwrap_or_else(|e| {
            tracing::warn!(task = %spec.task, seed = spec.seed, error = %e, "the replay baseline failed");
            f64::NAN
        });
    Ok(TrainResult {
        task: spec.task.clone(),
        seed: spec.seed,
        curve,
        steps,
        updates: updates_run,
        train_steps_per_s,
        random_steps_per_s,
        late_train_steps_per_s: late.1,
        replay_steps_per_s,
        train_seconds,
        update_seconds,
        env_seconds,
        checks,
        check_seconds,
        stopped_early,
        skipped_levels: skipped,
        masked_episodes: masked,
        policy: Some(Arc::new(agent)),
    })
}

/// `(steps, steps per second)` of the last updates in `marks` (cumulative `(steps,
/// seconds)`) that cover at least `want` steps (all of training when it had fewer).
fn late_rate(marks: &[(u64, f64)], want: u64) -> (u64, f64) {
    let Some(&(end_steps, end_s)) = marks.last() else {
        return (0, f64::NAN);
    };
    let start = marks
        .iter()
        .rev()
        .find(|m| end_steps - m.0 >= want)
        .or(marks.first())
        .copied()
        .unwrap_or((0, 0.0));
    let steps = end_steps - start.0;
    (steps, steps as f64 / (end_s - start.1).max(1e-9))
}

/// Steps per second of `played` (each environment's latest training episodes) played again
/// on fresh environments, one per list (cycled), `steps` steps each on the same workers, in
/// rounds of a rollout's length as training's are. NaN (and a warning) when an environment
/// finished no episode in training: the replay would run fewer environments than training
/// did (the caller makes a failed replay NaN too). The fresh environments' first resets are
/// not timed (nor were training's).
fn replay_rate(
    rt: &Runtime,
    cache: &Cache,
    spec: &TrainSpec,
    levels: &Arc<Vec<Plan>>,
    actions: usize,
    played: Vec<Vec<PlayedEpisode>>,
    steps: usize,
) -> Result<f64, LearnError> {
    let empty = played.iter().filter(|eps| eps.is_empty()).count();
    if empty > 0 {
        tracing::warn!(
            task = %spec.task,
            seed = spec.seed,
            envs = played.len(),
            without_episodes = empty,
            "an environment finished no training episode: no replay baseline"
        );
        return Ok(f64::NAN);
    }
    let mut envs = Vec::with_capacity(played.len());
    for eps in played {
        let env = Env::new(rt.clone(), cache.clone(), spec.env.clone())?;
        envs.push(TrainEnv::replaying(env, levels.clone(), eps, actions)?);
    }
    let mut venv = VecEnv::with_workers(envs, spec.workers)?;
    let mut rngs: Vec<_> = (0..venv.len() as u64).map(policies::rng::seeded).collect();
    let t = Instant::now();
    // The replaying environments take their own actions, whatever is chosen.
    venv.play_rounds(
        steps,
        spec.ppo.num_steps,
        false,
        &mut rngs,
        &|_, _, _, _| {
            Ok(Choice {
                actions: vec![0],
                ..Choice::default()
            })
        },
    )?;
    let done = steps * venv.len();
    Ok(done as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// One episode of the policy on each check level; hands the learner back.
fn check(
    rt: &Runtime,
    cache: &Cache,
    spec: &TrainSpec,
    agent: PpoAgent,
    steps: u64,
) -> Result<(Result<CheckPoint, LearnError>, PpoAgent), LearnError> {
    let shared = Arc::new(agent);
    let e = evaluate(
        rt,
        cache,
        &spec.env,
        &spec.checks.levels,
        spec.workers,
        &|| policy_agent(&shared, spec.checks.mode, spec.seed),
    );
    // Every evaluation agent (and its clone of the policy) is gone once `evaluate` returns.
    let agent = Arc::try_unwrap(shared).map_err(|_| LearnError::PolicyShared)?;
    let point = e.map(|e| CheckPoint {
        steps,
        success_rate: e.success_rate,
        episodes: e.episodes - e.infra,
        check_steps: e.steps,
    });
    Ok((point, agent))
}

/// Synthesize and (when the config requires it) certify every level once, on `workers`
/// threads, so that neither the throughput baseline nor the training pays for it; returns
/// the largest catalogue among the usable levels.
fn warm(
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    levels: &[Plan],
    workers: usize,
) -> Result<usize, LearnError> {
    // Per level: its catalogue's size, or why it cannot be used (the adapter skips and
    // counts those); an infrastructure failure ends the warm-up.
    let sizes = crate::work_queue::run(
        levels,
        workers,
        |_| Env::new(rt.clone(), cache.clone(), cfg.clone()).map_err(LearnError::Env),
        |env, _, plan| match env.reset(plan) {
            Ok(_) => Ok(Ok(env.task().map_or(0, |t| t.actions.len()))),
            Err(e) if e.is_infrastructure() => Err(LearnError::Env(e)),
            Err(e) => Ok(Err(e.to_string())),
        },
        || LearnError::NoUsableLevel {
            tried: 0,
            last: "a warm-up worker panicked".into(),
        },
    )?;
    let widest = sizes.iter().flatten().copied().max().unwrap_or(0);
    let last = sizes.into_iter().filter_map(Result::err).next_back();
    if widest == 0 {
        return match last {
            Some(last) => Err(LearnError::NoUsableLevel {
                tried: levels.len().min(u32::MAX as usize) as u32,
                last,
            }),
            None => Err(LearnError::NoCatalogue(
                levels.first().map(task_name).unwrap_or_default(),
            )),
        };
    }
    Ok(widest)
}

fn task_name(plan: &Plan) -> String {
    plan.task
        .as_ref()
        .map(|t| t.name.clone())
        .unwrap_or_default()
}

/// Play one episode per level with agents made by `make` (one per worker thread), on
/// `workers` threads; levels that cannot be used are skipped and counted.
pub fn evaluate(
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    levels: &[Plan],
    workers: usize,
    make: &(dyn Fn() -> Box<dyn Agent> + Sync),
) -> Result<Evaluation, LearnError> {
    Ok(tally(&evaluate_each(
        rt, cache, cfg, levels, workers, make,
    )?))
}

/// [`evaluate`]'s episodes, one outcome per level in level order (for tallies over subsets,
/// [`tally`]).
pub fn evaluate_each(
    rt: &Runtime,
    cache: &Cache,
    cfg: &EnvConfig,
    levels: &[Plan],
    workers: usize,
    make: &(dyn Fn() -> Box<dyn Agent> + Sync),
) -> Result<Vec<LevelOutcome>, LearnError> {
    crate::work_queue::run(
        levels,
        workers,
        |_| Ok((Env::new(rt.clone(), cache.clone(), cfg.clone())?, make())),
        |(env, agent), _, plan| {
            let first = match env.reset(plan) {
                Ok(o) => o,
                Err(e) if e.skips_level() => return Ok(LevelOutcome::Skipped),
                Err(e) if e.is_infrastructure() => return Ok(LevelOutcome::Infra),
                Err(e) => return Err(LearnError::Env(e)),
            };
            let p = play(env, &first, agent.as_mut(), &mut |_, _| {})?;
            Ok(if p.infra {
                LevelOutcome::Infra
            } else {
                LevelOutcome::Played {
                    success: p.success,
                    steps: p.steps,
                }
            })
        },
        || LearnError::NoUsableLevel {
            tried: 0,
            last: "an evaluation worker panicked".into(),
        },
    )
}

/// The [`Evaluation`] of some levels' outcomes.
pub fn tally<'a>(outcomes: impl IntoIterator<Item = &'a LevelOutcome>) -> Evaluation {
    let mut t = Tally::default();
    for o in outcomes {
        match *o {
            LevelOutcome::Skipped => t.skipped += 1,
            LevelOutcome::Infra => {
                t.episodes += 1;
                t.infra += 1;
            }
            LevelOutcome::Played { success, steps } => {
                t.episodes += 1;
                t.successes += usize::from(success);
                t.steps += u64::from(steps);
            }
        }
    }
    let counted = t.episodes - t.infra;
    let per = |x: f64| {
        if counted == 0 {
            f64::NAN
        } else {
            x / counted as f64
        }
    };
    Evaluation {
        episodes: t.episodes,
        successes: t.successes,
        infra: t.infra,
        skipped: t.skipped,
        success_rate: per(t.successes as f64),
        mean_steps: per(t.steps as f64),
        steps: t.steps,
    }
}

/// How one evaluation level went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LevelOutcome {
    /// Not usable (uncertified, not applicable): not an episode.
    Skipped,
    /// The environment failed: an episode, counted neither way.
    Infra,
    Played {
        success: bool,
        steps: u32,
    },
}

/// What an evaluation counted.
#[derive(Default)]
struct Tally {
    episodes: usize,
    successes: usize,
    infra: usize,
    skipped: usize,
    steps: u64,
}

/// The greedy policy of a training run as an evaluation agent.
pub fn greedy(agent: &Arc<PpoAgent>) -> Box<dyn Agent> {
    Box::new(PolicyAgent::new(agent.clone()))
}

/// The policy of a training run as an evaluation agent acting as `mode` says (sampling
/// seeded by `seed` and each level).
pub fn policy_agent(agent: &Arc<PpoAgent>, mode: PolicyMode, seed: u64) -> Box<dyn Agent> {
    match mode {
        PolicyMode::Sampled => Box::new(PolicyAgent::sampled(agent.clone(), seed)),
        PolicyMode::Greedy => greedy(agent),
    }
}

/// The catalogue oracle as an evaluation agent.
pub fn catalogue_oracle() -> Box<dyn Agent> {
    Box::new(CatalogueOracle::default())
}

#[cfg(test)]
mod tests {
    use super::late_rate;

    #[test]
    fn late_rate_covers_the_last_updates_with_enough_steps() {
        let marks = [(0, 0.0), (256, 1.0), (512, 2.0), (768, 4.0)];
        assert_eq!(late_rate(&marks, 512), (512, 512.0 / 3.0));
        assert_eq!(late_rate(&marks, 256), (256, 256.0 / 2.0));
        // Fewer steps than asked for: all of training.
        assert_eq!(late_rate(&marks, 4096), (768, 768.0 / 4.0));
    }
}
