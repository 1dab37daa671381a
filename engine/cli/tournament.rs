//! `engine tournament CONFIG` and `engine sweep CONFIG`: the cross-play matrix of finished
//! runs, and an ablation grid of runs.

use std::path::Path;

pub fn tournament(config: &Path) -> anyhow::Result<i32> {
    let rt = super::sandbox::runtime()?;
    let cache = super::sandbox::cache()?;
    let (m, report) = engine::experiment::tournament::run(config, &rt, &cache)?;
    out!("{}", engine::experiment::tournament::render(&m));
    outln!("report: {}", report.display());
    Ok(0)
}

pub fn sweep(config: &Path, dry_run: bool, resume: bool) -> anyhow::Result<i32> {
    let sw = engine::experiment::sweep::Sweep::load(config)?;
    if dry_run {
        out!("{}", sw.describe());
        return Ok(0);
    }
    super::signals::supervise();
    let exe = std::env::current_exe()?;
    let (agg, report) = engine::experiment::sweep::run(
        &sw,
        &exe,
        resume,
        &super::signals::STOP,
        &super::signals::take_pending,
    )?;
    out!("{}", engine::experiment::sweep::render(&agg));
    outln!("report: {}", report.display());
    Ok(match super::signals::received() {
        Some(sig) => super::signals::exit_status(sig),
        None if agg.complete() => 0,
        None => 1,
    })
}
