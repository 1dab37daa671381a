//! `engine bench harbor DIR...`: whole episodes (start, oracle, tests) of task folders in the
//! native sandbox against the Docker backend on the same built image, interleaved in one
//! run; the median per task and their ratio (the target is at most 0.25).

use super::Summary;
use crate::harbor::{self, Agent, HarborError};
use sandbox::{DynBackend, RootfsSpec, Runtime};
use serde::Serialize;
use std::path::PathBuf;

/// One task's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TaskFigures {
    pub task: String,
    /// Seconds per whole episode.
    pub native_s: Summary,
    pub docker_s: Summary,
    /// native median / docker median.
    pub ratio: f64,
    /// Whether every timed episode passed on each backend.
    pub native_passed: bool,
    pub docker_passed: bool,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub iterations: usize,
    pub tasks: Vec<TaskFigures>,
    /// Tasks not measured, with why.
    pub skipped: Vec<(String, String)>,
}

/// Measure every task folder; `iterations` timed episodes per backend, after one warm-up.
pub fn run(
    rt: &Runtime,
    store: &harbor::LayerStore,
    docker: &dyn DynBackend,
    dirs: &[PathBuf],
    build: &harbor::BuildOptions,
    iterations: usize,
) -> Result<Report, HarborError> {
    let mut report = Report {
        iterations,
        tasks: Vec::new(),
        skipped: Vec::new(),
    };
    for dir in dirs {
        let task = harbor::load(dir)?;
        let text = crate::text::read_input(&task.dockerfile)
            .map_err(|e| HarborError::Read(Box::new(e)))?;
        let df = match harbor::dockerfile::parse(&text) {
            Ok(d) => d,
            Err(source) => {
                report.skipped.push((
                    task.name.clone(),
                    HarborError::Dockerfile {
                        file: task.dockerfile.clone(),
                        source,
                    }
                    .to_string(),
                ));
                continue;
            }
        };
        let img = harbor::build_image(rt, store, &task, &df, build)?;
        if !matches!(img.rootfs, RootfsSpec::Docker(_)) {
            report.skipped.push((
                task.name.clone(),
                format!(
                    "the Docker backend needs a docker: base ({})",
                    img.base_note
                ),
            ));
            continue;
        }
        let backends: [&dyn DynBackend; 2] = [rt, docker];
        let mut secs = [Vec::new(), Vec::new()];
        let mut passed = [true, true];
        for b in backends {
            harbor::run_episode(b, store, &task, &img, &Agent::Oracle)?; // warm-up
        }
        for _ in 0..iterations {
            for (i, b) in backends.iter().enumerate() {
                let o = harbor::run_episode(*b, store, &task, &img, &Agent::Oracle)?;
                passed[i] &= o.passed;
                secs[i].push(o.seconds);
            }
        }
        let [n, d] = secs;
        let (n, d) = (Summary::of(n), Summary::of(d));
        report.tasks.push(TaskFigures {
            task: task.name.clone(),
            ratio: n.median / d.median,
            native_s: n,
            docker_s: d,
            native_passed: passed[0],
            docker_passed: passed[1],
        });
    }
    Ok(report)
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut s = format!(
        "whole episode (start, oracle, tests), median of {} per backend, interleaved\n",
        r.iterations
    );
    s.push_str("task                          native ms   docker ms   ratio   passed\n");
    for t in &r.tasks {
        s.push_str(&format!(
            "{:<28} {:>10.1} {:>11.1} {:>7.3}   {}/{}\n",
            crate::text::cut(&t.task),
            t.native_s.median * 1e3,
            t.docker_s.median * 1e3,
            t.ratio,
            t.native_passed,
            t.docker_passed
        ));
    }
    for (t, why) in &r.skipped {
        s.push_str(&format!("skipped {t}: {why}\n"));
    }
    s
}
