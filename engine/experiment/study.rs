//! A training study (`engine run` of an experiment with `[training]`): for every task and
//! seed, PPO on the task's training levels ([`crate::learn::train`]), then the policy (sampled
//! as in training, and greedy) and the task's catalogue oracle on the same held-out levels (and, with
//! `training.eval_template`, on faulted levels: the robustness gap). Writes `report.json`,
//! `report.md`, a learning-curve PNG per task and `curves.jsonl`.

use super::config::{Training, FAULTED_OFFSET, HELD_OUT_OFFSET, VALIDATION_OFFSET};
use super::stats::Interval;
use super::{Experiment, ExperimentError};
use crate::learn::{self, Evaluation, TrainResult, TrainSpec};
use crate::synth::Cache;
use sandbox::Runtime;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Mean, 95% interval and the value of every seed.
#[derive(Debug, Clone, Serialize)]
pub struct PerSeed {
    pub mean: f64,
    pub ci95: f64,
    pub per_seed: Vec<f64>,
}

impl PerSeed {
    pub fn of(v: Vec<f64>) -> Self {
        let i = Interval::of_finite(&v);
        Self {
            mean: i.mean,
            ci95: i.ci95,
            per_seed: v,
        }
    }
}

/// Who plays an evaluation.
#[derive(Clone, Copy)]
enum Who {
    Policy(learn::PolicyMode),
    Oracle,
}

/// A task's figures over seeds.
#[derive(Debug, Clone, Serialize)]
pub struct TaskReport {
    /// The trained policy acting as `training.policy` says.
    pub held_out_success: PerSeed,
    /// The same policy, greedy, on the same levels (when `training.policy` is `sampled`).
    pub held_out_greedy_success: Option<PerSeed>,
    /// The catalogue oracle on the same held-out levels.
    pub catalogue_oracle_success: PerSeed,
    /// `held_out_success / catalogue_oracle_success` per seed.
    pub success_vs_oracle: PerSeed,
    /// On the faulted levels of `training.eval_template`, when given.
    pub faulted_success: Option<PerSeed>,
    pub faulted_catalogue_oracle_success: Option<PerSeed>,
    /// `held_out_success - faulted_success` per seed: the robustness gap.
    pub robustness_gap: Option<PerSeed>,
    pub train_steps_per_s: PerSeed,
    pub random_steps_per_s: PerSeed,
    /// `train_steps_per_s / random_steps_per_s` per seed (same workers, same run). Both
    /// count environment steps: a trained policy's short episodes pay more resets per step
    /// and its recovery actions run heavier commands, so this is not the learner's cost alone.
    pub throughput_ratio: PerSeed,
    /// The last updates' training steps per second (as many steps as the baseline's) over
    /// the steps per second of the late training's own finished episodes played again
    /// without a policy or learner (each on its level with the actions training took, right
    /// after, on as many fresh environments and the same workers, in rounds of a rollout's
    /// length): nearly the same environment work with and without learning, so one minus it
    /// is what learning costs end to end; `learning_cost` measures it by timers inside the
    /// training phase.
    pub learning_throughput_ratio: PerSeed,
    /// The late training's episodes replayed without learning (steps per second) over the
    /// random agent's steps per second: what the policy's own actions, episode lengths,
    /// resets and confirmations cost the environments against the random agent's, learning
    /// aside. `throughput_ratio` is exactly the whole training's steps per second over the
    /// late training's, times `learning_throughput_ratio`, times this (when the replay ran:
    /// else both are NaN).
    pub policy_work_ratio: PerSeed,
    /// Environment steps per second of the environments alone while learning (training steps
    /// over the wall time of the vectorised steps and resets): what the environments give
    /// under the learning policy's own actions and episode lengths.
    pub env_steps_per_s: PerSeed,
    /// What learning costs: the share of the training phase's wall time not spent stepping
    /// the environments (acting, value bootstraps, PPO updates, bookkeeping), i.e.
    /// `1 - train_steps_per_s / env_steps_per_s`.
    pub learning_cost: PerSeed,
    /// The share of the training phase's wall time spent in PPO updates.
    pub learner_share: PerSeed,
    /// Environment steps until the training success rate first reached 0.9 (NaN: never).
    pub steps_to_0_9: PerSeed,
    /// Environment steps until the policy (acting as in the evaluations) first solved at
    /// least 0.9 of the validation levels (NaN: never, or no checks).
    pub check_steps_to_0_9: PerSeed,
    /// Environment steps trained (the budget, or fewer where the stopping rule ended it).
    pub steps_trained: PerSeed,
    /// Training steps per episode that ended, in the first rollout (the initial policy) and
    /// in the last: where the untrained policy already succeeds within the step limit, the
    /// learning shows here (NaN: no episode ended in that rollout).
    pub episode_steps_first: PerSeed,
    pub episode_steps_last: PerSeed,
    pub curve_png: PathBuf,
    pub runs: Vec<RunReport>,
}

/// Steps per ended episode (masked ones included) in rollout `k` of a learning curve.
fn rollout_episode_steps(curve: &[learn::CurvePoint], k: usize) -> f64 {
    let Some(p) = curve.get(k) else {
        return f64::NAN;
    };
    let before = if k == 0 { 0 } else { curve[k - 1].steps };
    let ended = p.episodes + p.masked;
    if ended == 0 {
        f64::NAN
    } else {
        (p.steps - before) as f64 / ended as f64
    }
}

/// One task and seed.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub train: TrainResult,
    /// The policy as `training.policy` says.
    pub held_out: Evaluation,
    /// The greedy policy on the same levels (when `training.policy` is `sampled`).
    pub held_out_greedy: Option<Evaluation>,
    pub catalogue_oracle: Evaluation,
    pub faulted: Option<Evaluation>,
    pub faulted_catalogue_oracle: Option<Evaluation>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StudyReport {
    pub name: String,
    pub template: Option<PathBuf>,
    pub eval_template: Option<PathBuf>,
    pub seeds: Vec<u64>,
    pub workers: usize,
    pub reward: crate::env::RewardConfig,
    pub training: Training,
    pub tasks: BTreeMap<String, TaskReport>,
    /// Every task and seed ran. The report is rewritten after each seed, so a run that is
    /// stopped keeps every finished seed (with `complete: false`).
    pub complete: bool,
}

/// Run the study; returns the report and the path of `report.json`.
pub fn run(
    exp: &Experiment,
    training: &Training,
    rt: &Runtime,
    cache: &Cache,
) -> Result<(StudyReport, PathBuf), ExperimentError> {
    let dir = exp.experiment.out_dir.join(&exp.experiment.name);
    std::fs::create_dir_all(&dir).map_err(|source| ExperimentError::Write {
        file: dir.clone(),
        source,
    })?;
    let env_cfg = exp.env_config()?;
    let ppo = exp.ppo_config(training);
    let mut report = StudyReport {
        name: exp.experiment.name.clone(),
        template: exp.template.as_ref().map(|t| t.file.clone()),
        eval_template: exp.eval_template.as_ref().map(|t| t.file.clone()),
        seeds: exp.experiment.seeds.clone(),
        workers: exp.environment.workers,
        reward: exp.reward.clone(),
        training: training.clone(),
        tasks: BTreeMap::new(),
        complete: false,
    };
    for task in exp.training_tasks() {
        let png = dir.join(format!("curve-{task}.png"));
        let mut runs = Vec::new();
        for &seed in &exp.experiment.seeds {
            let levels = |offset: u64, n: usize, tpl| {
                (0..n as u64)
                    .map(|k| exp.level(&task, seed, offset, k, tpl))
                    .collect::<Vec<_>>()
            };
            let train_levels = levels(0, training.train_levels, exp.template.as_ref());
            let per_update = ppo.batch_size() as u64;
            let checks = learn::CheckSpec {
                every_updates: training.check_every.div_ceil(per_update),
                levels: levels(
                    VALIDATION_OFFSET,
                    training.check_levels,
                    exp.template.as_ref(),
                ),
                stop_success: training.stop_success,
                mode: training.policy,
            };
            let spec = TrainSpec {
                task: task.clone(),
                seed,
                train_levels,
                env: env_cfg.clone(),
                ppo: ppo.clone(),
                hidden: training.hidden.clone(),
                total_steps: training.total_steps,
                workers: exp.environment.workers,
                episodes_per_level: training.episodes_per_level,
                baseline_steps: training.baseline_steps,
                checks,
            };
            tracing::info!(task = %task, seed, "training");
            let train = learn::train(rt, cache, &spec).map_err(ExperimentError::Learn)?;
            let policy = train.policy.clone().ok_or_else(|| {
                ExperimentError::Learn(learn::LearnError::NoCatalogue(task.clone()))
            })?;
            let eval = |plans: &[crate::instance::Plan], who: Who| {
                let p = policy.clone();
                let make = move || match who {
                    Who::Oracle => learn::catalogue_oracle(),
                    Who::Policy(mode) => learn::policy_agent(&p, mode, seed),
                };
                learn::evaluate(rt, cache, &env_cfg, plans, exp.environment.workers, &make)
                    .map_err(ExperimentError::Learn)
            };
            let (mode, oracle) = (Who::Policy(training.policy), Who::Oracle);
            let held = levels(HELD_OUT_OFFSET, training.eval_levels, exp.template.as_ref());
            let held_out = eval(&held, mode)?;
            let held_out_greedy = match training.policy {
                learn::PolicyMode::Greedy => None,
                learn::PolicyMode::Sampled => {
                    Some(eval(&held, Who::Policy(learn::PolicyMode::Greedy))?)
                }
            };
            let catalogue_oracle = eval(&held, oracle)?;
            // The faulted set is the evaluation template's own task's.
            let faulted_tpl = exp
                .eval_template
                .as_ref()
                .filter(|t| t.task.as_deref().is_none_or(|x| x == task));
            let (faulted, faulted_catalogue_oracle) = match faulted_tpl {
                Some(t) => {
                    let f = levels(FAULTED_OFFSET, training.eval_levels, Some(t));
                    (Some(eval(&f, mode)?), Some(eval(&f, oracle)?))
                }
                None => (None, None),
            };
            tracing::info!(
                task = %task,
                seed,
                held_out = held_out.success_rate,
                oracle = catalogue_oracle.success_rate,
                train_steps_per_s = train.train_steps_per_s,
                random_steps_per_s = train.random_steps_per_s,
                "trained"
            );
            runs.push(RunReport {
                seed,
                train,
                held_out,
                held_out_greedy,
                catalogue_oracle,
                faulted,
                faulted_catalogue_oracle,
            });
            write(&png, &curves_png(&runs, &png)?)?;
            report
                .tasks
                .insert(task.clone(), task_report(runs.clone(), png.clone()));
            save(&dir, &report)?;
        }
    }
    report.complete = true;
    let path = save(&dir, &report)?;
    Ok((report, path))
}

/// The learning curves of a task's runs so far, as a PNG.
fn curves_png(runs: &[RunReport], png: &Path) -> Result<Vec<u8>, ExperimentError> {
    let series: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.train
                .curve
                .iter()
                .map(|c| (c.steps as f64, c.success_rate))
                .collect()
        })
        .collect();
    learn::plot::curves_png(&series).map_err(|source| ExperimentError::Write {
        file: png.into(),
        source,
    })
}

/// Write `report.json` and `report.md` (each to a temporary file, then renamed).
fn save(dir: &Path, report: &StudyReport) -> Result<PathBuf, ExperimentError> {
    let path = dir.join("report.json");
    let json = serde_json::to_vec_pretty(report).map_err(|e| ExperimentError::Write {
        file: path.clone(),
        source: std::io::Error::other(e),
    })?;
    write(&path, &json)?;
    write(&dir.join("report.md"), render(report).as_bytes())?;
    Ok(path)
}

fn task_report(runs: Vec<RunReport>, curve_png: PathBuf) -> TaskReport {
    let col = |f: &dyn Fn(&RunReport) -> f64| PerSeed::of(runs.iter().map(f).collect());
    let opt = |f: &dyn Fn(&RunReport) -> Option<f64>| {
        let v: Option<Vec<f64>> = runs.iter().map(f).collect();
        v.map(PerSeed::of)
    };
    TaskReport {
        held_out_success: col(&|r| r.held_out.success_rate),
        held_out_greedy_success: opt(&|r| r.held_out_greedy.as_ref().map(|e| e.success_rate)),
        catalogue_oracle_success: col(&|r| r.catalogue_oracle.success_rate),
        success_vs_oracle: col(&|r| r.held_out.success_rate / r.catalogue_oracle.success_rate),
        faulted_success: opt(&|r| r.faulted.as_ref().map(|e| e.success_rate)),
        faulted_catalogue_oracle_success: opt(&|r| {
            r.faulted_catalogue_oracle.as_ref().map(|e| e.success_rate)
        }),
        robustness_gap: opt(&|r| {
            r.faulted
                .as_ref()
                .map(|f| r.held_out.success_rate - f.success_rate)
        }),
        train_steps_per_s: col(&|r| r.train.train_steps_per_s),
        random_steps_per_s: col(&|r| r.train.random_steps_per_s),
        throughput_ratio: col(&|r| r.train.train_steps_per_s / r.train.random_steps_per_s),
        learning_throughput_ratio: col(&|r| {
            r.train.late_train_steps_per_s / r.train.replay_steps_per_s
        }),
        policy_work_ratio: col(&|r| r.train.replay_steps_per_s / r.train.random_steps_per_s),
        env_steps_per_s: col(&|r| r.train.steps as f64 / r.train.env_seconds),
        learning_cost: col(&|r| 1.0 - r.train.env_seconds / r.train.train_seconds),
        learner_share: col(&|r| r.train.update_seconds / r.train.train_seconds),
        steps_to_0_9: col(&|r| {
            first_at_0_9(r.train.curve.iter().map(|c| (c.steps, c.success_rate)))
        }),
        check_steps_to_0_9: col(&|r| {
            first_at_0_9(r.train.checks.iter().map(|c| (c.steps, c.success_rate)))
        }),
        steps_trained: col(&|r| r.train.steps as f64),
        episode_steps_first: col(&|r| rollout_episode_steps(&r.train.curve, 0)),
        episode_steps_last: col(&|r| {
            rollout_episode_steps(&r.train.curve, r.train.curve.len().saturating_sub(1))
        }),
        curve_png,
        runs,
    }
}

/// The steps of the first `(steps, success rate)` point at 0.9 or more (NaN: none).
fn first_at_0_9(mut points: impl Iterator<Item = (u64, f64)>) -> f64 {
    points
        .find(|&(_, rate)| rate >= 0.9)
        .map_or(f64::NAN, |(steps, _)| steps as f64)
}

pub(super) fn write(path: &Path, bytes: &[u8]) -> Result<(), ExperimentError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| ExperimentError::Write {
            file: path.into(),
            source,
        })
}

/// `v` as pretty JSON to `path` (through a temporary file).
pub(super) fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), ExperimentError> {
    let json = serde_json::to_vec_pretty(v).map_err(|e| ExperimentError::Write {
        file: path.into(),
        source: std::io::Error::other(e),
    })?;
    write(path, &json)
}

/// A heatmap of `rows` of rates ([`crate::learn::heatmap`]) to `path`.
/// A matrix too large to draw is skipped with a warning (the tables and JSON beside it say
/// everything); failing to write the PNG is an error.
pub(super) fn write_heatmap(path: &Path, rows: &[Vec<f64>]) -> Result<(), ExperimentError> {
    match crate::learn::heatmap::heatmap_png(rows) {
        Ok(png) => write(path, &png),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            tracing::warn!(file = %path.display(), error = %e, "heatmap not drawn");
            Ok(())
        }
        Err(source) => Err(ExperimentError::Write {
            file: path.into(),
            source,
        }),
    }
}

fn fmt(p: &PerSeed) -> String {
    format!("{:.3} ± {:.3}", p.mean, p.ci95)
}

/// The Markdown report.
pub fn render(r: &StudyReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", r.name);
    let _ = writeln!(
        s,
        "PPO, {} seeds ({:?}), at most {} environment steps per task and seed{}, {} environments on {} workers, reward `{}` (gamma {}); the policy is evaluated {}. Mean ± 95% interval (Student t) over seeds.\n",
        r.seeds.len(),
        r.seeds,
        r.training.total_steps,
        r.training.stop_success.map_or(String::new(), |x| format!(
            " (training stops at the first check on {} validation levels with success at least {x})",
            r.training.check_levels
        )),
        r.training.num_envs,
        r.workers,
        r.reward.mode.name(),
        r.reward.gamma,
        match r.training.policy {
            learn::PolicyMode::Sampled => "sampling its actions as in training (the greedy column: its most likely actions)",
            learn::PolicyMode::Greedy => "greedily",
        }
    );
    if !r.complete {
        let _ = writeln!(
            s,
            "**Incomplete**: the run stopped before every task and seed ran; the tables hold the seeds that finished.\n"
        );
    }
    if let Some(t) = &r.template {
        let _ = writeln!(
            s,
            "Training levels sampled from {} (domain randomisation).\n",
            t.display()
        );
    }
    let _ = writeln!(
        s,
        "| task | held-out success | greedy | catalogue oracle | ratio | faulted success | faulted oracle | robustness gap | train steps/s | random steps/s | ratio | late training / its episodes replayed without learning | its episodes replayed / random | env steps/s while training | learning cost | learner share | steps to 0.9 (training, checks) | steps trained | steps per episode (first, last rollout) |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let o = |p: &Option<PerSeed>| p.as_ref().map_or("-".to_string(), fmt);
    for (task, t) in &r.tasks {
        let _ = writeln!(
            s,
            "| {task} | {} | {} | {} | {} | {} | {} | {} | {:.0} ± {:.0} | {:.0} ± {:.0} | {} | {} | {} | {:.0} ± {:.0} | {} | {} | {:.0}, {:.0} | {:.0} ± {:.0} | {:.1}, {:.1} |",
            fmt(&t.held_out_success),
            o(&t.held_out_greedy_success),
            fmt(&t.catalogue_oracle_success),
            fmt(&t.success_vs_oracle),
            o(&t.faulted_success),
            o(&t.faulted_catalogue_oracle_success),
            o(&t.robustness_gap),
            t.train_steps_per_s.mean,
            t.train_steps_per_s.ci95,
            t.random_steps_per_s.mean,
            t.random_steps_per_s.ci95,
            fmt(&t.throughput_ratio),
            fmt(&t.learning_throughput_ratio),
            fmt(&t.policy_work_ratio),
            t.env_steps_per_s.mean,
            t.env_steps_per_s.ci95,
            fmt(&t.learning_cost),
            fmt(&t.learner_share),
            t.steps_to_0_9.mean,
            t.check_steps_to_0_9.mean,
            t.steps_trained.mean,
            t.steps_trained.ci95,
            t.episode_steps_first.mean,
            t.episode_steps_last.mean,
        );
    }
    let _ = writeln!(s, "\nPer seed (held-out success):\n");
    for (task, t) in &r.tasks {
        let _ = writeln!(s, "- {task}: {:?}", t.held_out_success.per_seed);
    }
    let _ = writeln!(
        s,
        "\nLearning curves (x: environment steps, y: training success rate 0 to 1, one line per seed; grid lines at quarters):\n"
    );
    for (task, t) in &r.tasks {
        let name = t
            .curve_png
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(s, "- {task}: ![{task}]({name})");
    }
    s
}
