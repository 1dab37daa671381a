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
            perturbations,
            perturb,
            seeds,
            combos,
            workers,
            base,
            json,
        } => task_check(
            &task,
            &base,
            &perturbations,
            &perturb,
            seeds,
            combos as usize,
            workers,
            json,
        ),
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
    if engine::tasks::get(task).is_none() {
        return Err(super::errors::usage(format!(
            "unknown task `{}` (known: {})",
            engine::text::cut(task),
            engine::tasks::names().join(", ")
        )));
    }
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
    if json {
        for r in &rows {
            outln!("{}", serde_json::to_string(r)?);
        }
    } else {
        out!("{}", engine::certify::render(&rows));
    }
    let errors = rows.iter().filter(|r| r.status == "error").count();
    let unsolved_plain = rows
        .iter()
        .any(|r| r.perturbations == "none" && r.status != "solvable");
    Ok(if errors > 0 || unsolved_plain { 1 } else { 0 })
}

/// `engine task list`.
fn task_list() -> i32 {
    for t in engine::tasks::all() {
        outln!("{:<18} {}", t.name(), t.summary());
    }
    0
}
