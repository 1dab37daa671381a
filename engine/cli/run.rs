//! `engine run EXPERIMENT`: run an experiment and print its figures.

use std::path::Path;

pub fn run(experiment: &Path, dry_run: bool, resume: bool) -> anyhow::Result<i32> {
    let exp = engine::experiment::Experiment::load(experiment)?;
    if dry_run {
        outln!("{}", describe(&exp));
        return Ok(0);
    }
    if resume && exp.selfplay.is_none() {
        return Err(super::errors::usage(format!(
            "{}: --resume needs a [selfplay] experiment (studies and episode runs are not checkpointed)",
            experiment.display()
        )));
    }
    let rt = super::sandbox::runtime()?;
    if let Some(sp) = &exp.selfplay {
        let cache = super::sandbox::cache()?;
        super::signals::cooperative();
        let (report, path) = engine::experiment::selfplay::run(
            &exp,
            sp,
            &rt,
            &cache,
            &super::signals::STOP,
            resume,
        )?;
        out!("{}", engine::experiment::selfplay::render(&report));
        outln!("report: {}", path.display());
        return Ok(match super::signals::received() {
            Some(sig) if report.interrupted => {
                eprintln!("engine: interrupted: the report covers what finished; every role was checkpointed");
                super::signals::exit_status(sig)
            }
            _ => 0,
        });
    }
    if let Some(training) = &exp.training {
        let (report, path) =
            engine::experiment::study::run(&exp, training, &rt, &super::sandbox::cache()?)?;
        out!("{}", engine::experiment::study::render(&report));
        outln!("report: {}", path.display());
        return Ok(0);
    }
    let cache = super::sandbox::cache()?;
    super::signals::cooperative();
    let (report, path) = engine::experiment::run_until(&exp, &rt, &cache, &super::signals::STOP)?;
    outln!(
        "{}: task {}{}, agent {}, {} episodes per seed on {} workers",
        report.name,
        report.task,
        report
            .template
            .as_ref()
            .map(|t| format!(" (template {})", t.display()))
            .unwrap_or_default(),
        report.agent.name(),
        report.episodes_per_seed,
        report.workers
    );
    for s in &report.seeds {
        outln!(
                "seed {:>4}: {} episodes ({} uncertified, {} not applicable, {} infra), {} steps, {:.0} steps/s, success {:.2}, return {:.1}, reset {:.2} ms",
                s.seed,
                s.episodes,
                s.skipped_uncertified,
                s.skipped_not_applicable,
                s.infra_failures,
                s.steps,
                s.steps_per_s,
                s.success_rate,
                s.mean_return,
                s.reset_ms_median
            );
    }
    outln!(
            "{}: {:.0} ± {:.0} steps/s, success {:.2} ± {:.2}, return {:.1} ± {:.1}, reset {:.2} ± {:.2} ms (mean ± 95% CI over {} seeds); report: {}, episodes: {}",
            report.name,
            report.steps_per_s.mean,
            report.steps_per_s.ci95,
            report.success_rate.mean,
            report.success_rate.ci95,
            report.mean_return.mean,
            report.mean_return.ci95,
            report.reset_ms.mean,
            report.reset_ms.ci95,
            report.seeds.len(),
            path.display(),
            report.episodes_file.display()
        );
    Ok(match super::signals::received() {
        Some(sig) if report.interrupted => {
            eprintln!("engine: interrupted: the report covers the episodes that finished");
            super::signals::exit_status(sig)
        }
        _ => 0,
    })
}

/// What `--dry-run` prints.
fn describe(exp: &engine::experiment::Experiment) -> String {
    if let Some(sp) = &exp.selfplay {
        return engine::experiment::selfplay::describe(exp, sp);
    }
    let tpl = exp
        .template
        .as_ref()
        .map(|t| format!(" (template {})", t.file.display()))
        .unwrap_or_default();
    match &exp.training {
        Some(t) => format!(
            "{}: a PPO study on task(s) {}{tpl}: {} environment steps per task and seed, {} x {} per rollout, {} training levels, {} held-out levels; seeds {:?}; output {}",
            exp.experiment.name,
            exp.training_tasks().join(", "),
            t.total_steps,
            t.num_envs,
            t.num_steps,
            t.train_levels,
            t.eval_levels,
            exp.experiment.seeds,
            exp.experiment.out_dir.join(&exp.experiment.name).display()
        ),
        None => format!(
            "{}: {} episodes per seed of agent {} on task {}{tpl} on {} workers; seeds {:?}; output {}",
            exp.experiment.name,
            exp.environment.episodes,
            exp.environment.agent.name(),
            exp.task(),
            exp.environment.workers,
            exp.experiment.seeds,
            exp.experiment.out_dir.join(&exp.experiment.name).display()
        ),
    }
}

/// `engine replay RUN EPISODE`.
pub fn replay(run: &Path, episode: &str, json: bool) -> anyhow::Result<i32> {
    let rt = super::sandbox::runtime()?;
    let r = engine::experiment::replay::replay(&rt, &super::sandbox::cache()?, run, episode)?;
    if json {
        outln!("{}", serde_json::to_string(&r)?);
    } else {
        outln!(
            "{} line {}: level {} ({}), actions {:?}\nrecorded: success {}, {} steps{}\nreplayed: success {}, {} steps, return {:.3}{}\n{}",
            r.file.display(),
            r.index,
            r.level,
            r.faults,
            r.actions,
            r.recorded_success,
            r.recorded_steps,
            r.recorded_failure
                .as_ref()
                .map(|f| format!(", failure {f}"))
                .unwrap_or_default(),
            r.success,
            r.steps,
            r.return_,
            if r.infra { " (the environment failed)" } else { "" },
            if r.same_verdict { "same verdict" } else { "DIFFERENT verdict" }
        );
    }
    Ok(if r.same_verdict { 0 } else { 1 })
}
