//! `engine task list` and `engine task check`.

use super::sandbox::cache;
use anyhow::Context;
use clap::Subcommand;
use engine::instance::PerturbationChoice;

#[derive(Subcommand)]
pub enum TaskCmd {
    /// List the task families.
    List,
    /// Certify solvability: run the oracle under each perturbation and sampled combinations.
    Check {
        task: String,
        /// `all` (every perturbation of the catalogue with default parameters) or `none`.
        #[arg(long, default_value = "all")]
        perturbations: String,
        /// Also this perturbation (`NAME` or `NAME:key=value,...`; repeatable).
        #[arg(long = "perturb", value_name = "SPEC")]
        perturb: Vec<String>,
        /// Seeds 1..=N of each instance.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        seeds: u64,
        /// Sampled combinations of two or three perturbations.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(0..=100_000))]
        combos: u64,
        #[arg(long, default_value = "2", value_parser = super::count::<64>)]
        workers: usize,
        #[arg(long, default_value = "host")]
        base: String,
        /// Instead of the catalogue's faults: `--samples` plans sampled from this template
        /// (seeds 1..=N), the task being the template's.
        #[arg(long, value_name = "FILE")]
        template: Option<std::path::PathBuf>,
        /// How many plans of `--template` to check (with `--rewards`: how many instances).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        samples: u64,
        /// Instead: the reward exploit check. On instances of the task (seeds 1..=--seeds, or
        /// `--samples` plans of `--template`), no constant-action policy and no two-action
        /// cycle of the catalogue may earn more than the catalogue oracle.
        #[arg(long)]
        rewards: bool,
        /// The reward mode the exploit check uses: potential, sparse or shaped.
        #[arg(long, default_value = "potential")]
        reward_mode: String,
        /// The exploit check's episode step limit (default: the task's).
        #[arg(long)]
        max_steps: Option<u32>,
        /// A JSON line per instance.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: TaskCmd) -> anyhow::Result<i32> {
    match cmd {
        TaskCmd::List => Ok(task_list()),
        TaskCmd::Check {
            task,
            seeds,
            workers,
            template,
            samples,
            rewards: true,
            reward_mode,
            max_steps,
            json,
            ..
        } => rewards_check(
            &task,
            template.as_deref(),
            if template.is_some() { samples } else { seeds },
            &reward_mode,
            max_steps,
            workers,
            json,
        ),
        TaskCmd::Check {
            task,
            perturbations,
            perturb,
            seeds,
            combos,
            workers,
            base,
            template,
            samples,
            json,
            ..
        } => match template {
            Some(file) => template_check(&task, &file, samples, workers, json),
            None => task_check(
                &task,
                &base,
                &perturbations,
                &perturb,
                seeds,
                combos as usize,
                workers,
                json,
            ),
        },
    }
}

/// `engine task check`.
#[allow(clippy::too_many_arguments)]
fn task_check(
    task: &str,
    base: &str,
    perturbations: &str,
    perturb: &[String],
    seeds: u64,
    combos: usize,
    workers: usize,
    json: bool,
) -> anyhow::Result<i32> {
    known_task(task)?;
    let mut singles: Vec<PerturbationChoice> = match perturbations {
        "all" => engine::certify::all_defaults(),
        "none" => Vec::new(),
        other => {
            return Err(super::errors::usage(format!(
            "--perturbations {}: expected `all` or `none` (use --perturb SPEC for specific ones)",
            engine::text::cut(other)
        )))
        }
    };
    for s in perturb {
        singles.push(engine::perturb::parse_spec(s).context("--perturb")?);
    }
    let spec = engine::certify::CheckSpec {
        task: task.into(),
        base: base.into(),
        singles,
        combos,
        seeds: (1..=seeds.max(1)).collect(),
        workers,
    };
    let rt = super::sandbox::runtime()?;
    let rows = engine::certify::check(&rt, &cache()?, &spec);
    print_rows(&rows, json)
}

/// `engine task check TASK --template FILE --samples N`.
fn template_check(
    task: &str,
    file: &std::path::Path,
    samples: u64,
    workers: usize,
    json: bool,
) -> anyhow::Result<i32> {
    let t = engine::template::Template::load(file)?;
    if t.task.as_deref() != Some(task) {
        return Err(super::errors::usage(format!(
            "{}: the template's task is `{}`, not `{}`",
            file.display(),
            t.task.as_deref().unwrap_or("none"),
            engine::text::cut(task)
        )));
    }
    let plans = t.sample_many(1, samples.max(1));
    let rt = super::sandbox::runtime()?;
    let rows = engine::certify::check_plans(&rt, &cache()?, &plans, workers);
    print_rows(&rows, json)
}

/// `engine task check TASK --rewards`.
fn rewards_check(
    task: &str,
    template: Option<&std::path::Path>,
    count: u64,
    mode: &str,
    max_steps: Option<u32>,
    workers: usize,
    json: bool,
) -> anyhow::Result<i32> {
    known_task(task)?;
    let reward = match mode {
        "potential" => engine::env::RewardConfig::default(),
        "sparse" => engine::env::RewardConfig::sparse(),
        "shaped" => engine::env::RewardConfig::shaped_demo(),
        other => {
            return Err(super::errors::usage(format!(
                "--reward-mode {}: expected potential, sparse or shaped",
                engine::text::cut(other)
            )))
        }
    };
    let plans = match template {
        Some(file) => {
            let t = engine::template::Template::load(file)?;
            if t.task.as_deref() != Some(task) {
                return Err(super::errors::usage(format!(
                    "{}: the template's task is not `{}`",
                    file.display(),
                    engine::text::cut(task)
                )));
            }
            t.sample_many(1, count.max(1))
        }
        None => (1..=count.max(1))
            .map(|s| engine::instance::Plan::for_task(task, s, vec![]))
            .collect(),
    };
    let cfg = engine::env::EnvConfig {
        reward,
        max_steps,
        ..engine::env::EnvConfig::default()
    };
    let rt = super::sandbox::runtime()?;
    let rows = engine::exploit::check(&rt, &cache()?, &cfg, &plans, workers)?;
    let mut exploited = 0;
    for r in &rows {
        exploited += usize::from(!r.exploits.is_empty());
        if json {
            outln!("{}", serde_json::to_string(r)?);
        } else {
            outln!(
                "plan seed {:>4}  {}  oracle {:+.3} ({} steps)  best of {} scripted: {} {:+.3}{}",
                r.plan_seed,
                r.instance,
                r.oracle.return_,
                r.oracle.steps,
                r.policies_tried,
                r.best.policy,
                r.best.return_,
                match (r.exploits.len(), r.better_solutions.len()) {
                    (0, 0) => String::new(),
                    (0, b) => format!("  ({b} scripted policies solve it with more)"),
                    (e, _) => format!("  EXPLOITED by {e} policies that do not solve it"),
                }
            );
        }
    }
    if !json {
        outln!(
            "{} instances, reward `{mode}`: {exploited} exploited",
            rows.len()
        );
    }
    Ok(i32::from(exploited > 0))
}

/// Print a check's rows; the exit status is 1 on errors or an unsolvable unperturbed task.
fn print_rows(rows: &[engine::certify::CheckRow], json: bool) -> anyhow::Result<i32> {
    if json {
        for r in rows {
            outln!("{}", serde_json::to_string(r)?);
        }
    } else {
        out!("{}", engine::certify::render(rows));
    }
    let errors = rows.iter().filter(|r| r.status == "error").count();
    let unsolved_plain = rows
        .iter()
        .any(|r| r.perturbations == "none" && r.status != "solvable");
    Ok(if errors > 0 || unsolved_plain { 1 } else { 0 })
}

/// An error naming the known tasks unless `task` is one.
fn known_task(task: &str) -> anyhow::Result<()> {
    if engine::tasks::get(task).is_none() {
        return Err(super::errors::usage(format!(
            "unknown task `{}` (known: {})",
            engine::text::cut(task),
            engine::tasks::names().join(", ")
        )));
    }
    Ok(())
}

/// `engine task list`.
fn task_list() -> i32 {
    for t in engine::tasks::all() {
        outln!("{:<18} {}", t.name(), t.summary());
    }
    0
}
