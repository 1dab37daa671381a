//! A self-play run's `report.md` and its PNG plots (`engine::learn::plot`): the
//! protagonist's training success, each adversary's mean reward per adversary phase, the
//! share of the adversaries' proposals per fault family, the realism critic's held-out AUC,
//! the budget schedule's budget, and the final protagonist's held-out success per family.

use super::selfplay::{SeedReport, SelfPlayReport};
use super::study::{write, PerSeed};
use super::ExperimentError;
use crate::learn::plot::{chart_png, hbars_png, Bar, Chart, Series};
use std::collections::BTreeMap;
use std::path::Path;

/// One plot of the report.
pub(super) struct Plot {
    pub file: &'static str,
    pub caption: &'static str,
    pub kind: PlotKind,
}

pub(super) enum PlotKind {
    Lines(Chart),
    Bars {
        title: String,
        x_label: String,
        bars: Vec<Bar>,
    },
}

fn chart(
    title: &str,
    x: &str,
    y: &str,
    y_range: Option<(f64, f64)>,
    series: Vec<Series>,
) -> PlotKind {
    PlotKind::Lines(Chart {
        title: title.into(),
        x_label: x.into(),
        y_label: y.into(),
        y_range,
        series,
    })
}

const UPDATES: &str = "protagonist updates";

/// The plots `r` has data for.
pub(super) fn plots(r: &SelfPlayReport) -> Vec<Plot> {
    let mut out = Vec::new();
    let per_seed = |f: &dyn Fn(&SeedReport) -> Vec<(f64, f64)>| -> Vec<Series> {
        r.seeds
            .iter()
            .map(|s| Series {
                label: format!("seed {}", s.seed),
                points: f(s),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let success = per_seed(&|s| {
        s.curve
            .iter()
            .filter(|p| p.phase == "protagonist" && p.success_rate.is_finite())
            .map(|p| (p.updates as f64, p.success_rate))
            .collect()
    });
    // Written even when no protagonist episode ended in an update (an empty chart says so).
    if r.seeds
        .iter()
        .any(|s| s.curve.iter().any(|p| p.phase == "protagonist"))
    {
        out.push(Plot {
            file: "curve.png",
            caption: "protagonist: training success per update, per seed",
            kind: chart(
                "Protagonist: training success",
                UPDATES,
                "success rate",
                Some((0.0, 1.0)),
                success,
            ),
        });
    }
    let mut adversaries = Vec::new();
    for s in &r.seeds {
        let mut by: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
        for p in &s.curve {
            for &(k, v) in &p.adversary_reward {
                by.entry(k).or_default().push((p.updates as f64, v));
            }
        }
        for (k, points) in by {
            adversaries.push(Series {
                label: format!("seed {} adversary {k}", s.seed),
                points,
            });
        }
    }
    if !adversaries.is_empty() {
        out.push(Plot {
            file: "adversaries.png",
            caption: "each adversary's mean reward per adversary phase",
            kind: chart(
                "Adversaries: mean reward per phase",
                UPDATES,
                "mean reward (unusable level: -10)",
                None,
                adversaries,
            ),
        });
    }
    // Share of the proposals with each family on, over seeds, by update count.
    let mut totals: BTreeMap<u64, u64> = BTreeMap::new();
    let mut counts: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    for p in r
        .seeds
        .iter()
        .flat_map(|s| &s.curve)
        .filter(|p| p.proposals > 0)
    {
        *totals.entry(p.updates).or_default() += p.proposals;
        for (f, &n) in &p.faults {
            *counts
                .entry(f.clone())
                .or_default()
                .entry(p.updates)
                .or_default() += n;
        }
    }
    if !totals.is_empty() {
        let series = counts
            .into_iter()
            .map(|(family, by)| Series {
                label: family,
                points: totals
                    .iter()
                    .map(|(&u, &t)| (u as f64, *by.get(&u).unwrap_or(&0) as f64 / t as f64))
                    .collect(),
            })
            .collect();
        out.push(Plot {
            file: "faults.png",
            caption: "share of the adversaries' proposals with each fault family on, over the run (all seeds)",
            kind: chart("Fault families the adversaries chose", UPDATES, "share of proposals", Some((0.0, 1.0)), series),
        });
    }
    let auc = per_seed(&|s| {
        s.curve
            .iter()
            .filter_map(|p| p.critic_auc.map(|a| (p.updates as f64, a)))
            .collect()
    });
    if !auc.is_empty() {
        out.push(Plot {
            file: "auc.png",
            caption: "the realism critic's held-out AUC at each update of the critic",
            kind: chart(
                "Realism critic: held-out AUC",
                UPDATES,
                "AUC (held-out real vs newest levels)",
                Some((0.0, 1.0)),
                auc,
            ),
        });
    }
    let budget = per_seed(&|s| {
        s.curve
            .iter()
            .filter_map(|p| p.budget.map(|b| (p.updates as f64, b)))
            .collect()
    });
    let moves = budget
        .iter()
        .flat_map(|s| s.points.windows(2))
        .any(|w| w[0].1 != w[1].1);
    if moves {
        out.push(Plot {
            file: "budget.png",
            caption: "the level space's budget (budget_schedule) over the run",
            kind: chart("Budget schedule", UPDATES, "budget", None, budget),
        });
    }
    let mut fam: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for s in &r.seeds {
        for (f, &(ok, n)) in &s.per_fault {
            let e = fam.entry(f.as_str()).or_default();
            e.0 += ok;
            e.1 += n;
        }
    }
    if !r.seeds.is_empty() {
        let bars = fam
            .into_iter()
            .map(|(f, (ok, n))| {
                let v = if n == 0 {
                    f64::NAN
                } else {
                    ok as f64 / n as f64
                };
                (f.to_string(), v, format!("{ok}/{n}"))
            })
            .collect();
        out.push(Plot {
            file: "per_fault.png",
            caption: "the final protagonist's held-out success per fault family (levels with it on, all seeds)",
            kind: PlotKind::Bars {
                title: "Final protagonist: held-out success per fault family".into(),
                x_label: "success rate".into(),
                bars,
            },
        });
    }
    out
}

/// `report.json`, `report.md` and the plots.
pub(super) fn save(dir: &Path, r: &SelfPlayReport) -> Result<(), ExperimentError> {
    let path = dir.join("report.json");
    let json = serde_json::to_vec_pretty(r).map_err(|e| ExperimentError::Write {
        file: path.clone(),
        source: std::io::Error::other(e),
    })?;
    write(&path, &json)?;
    for p in plots(r) {
        let file = dir.join(p.file);
        let png = match &p.kind {
            PlotKind::Lines(c) => chart_png(c),
            PlotKind::Bars {
                title,
                x_label,
                bars,
            } => hbars_png(title, x_label, bars),
        }
        .map_err(|source| ExperimentError::Write {
            file: file.clone(),
            source,
        })?;
        write(&file, &png)?;
    }
    write(&dir.join("report.md"), render(r).as_bytes())?;
    Ok(())
}

/// The budget schedule's range and the critic's held-out AUC, per seed.
fn budget_and_auc(r: &SelfPlayReport) -> String {
    let mut s = String::new();
    for x in &r.seeds {
        let b: Vec<f64> = x.curve.iter().filter_map(|p| p.budget).collect();
        let a: Vec<f64> = x.curve.iter().filter_map(|p| p.critic_auc).collect();
        if b.is_empty() && a.is_empty() {
            continue;
        }
        let mut line = format!("- seed {}:", x.seed);
        if let (Some(f), Some(l)) = (b.first(), b.last()) {
            line.push_str(&format!(" budget {f:.2} at the start, {l:.2} at the end;"));
        }
        if let (Some(f), Some(l)) = (a.first(), a.last()) {
            line.push_str(&format!(
                " realism critic's held-out AUC {f:.3} at its first update, {l:.3} at its last ({} updates);",
                a.len()
            ));
        }
        s.push_str(line.trim_end_matches(';'));
        s.push('\n');
    }
    if s.is_empty() {
        s
    } else {
        format!("\nBudget schedule and realism critic (held-out AUC: held-out real systems against the newest levels, measured before the critic trains on them):\n\n{s}")
    }
}

fn fmt(p: &PerSeed) -> String {
    format!("{:.3} ± {:.3}", p.mean, p.ci95)
}

/// `report.md`.
pub fn render(r: &SelfPlayReport) -> String {
    let mut s = format!(
        "# {} ({}, {})\n\n{} seeds{}. Held-out task seeds; mean ± 95% Student-t interval over seeds.\n\n| set | protagonist | catalogue oracle |\n|---|---|---|\n| clean | {} | |\n| faulted (drawn from the space) | {} | {} |\n",
        r.name,
        r.method,
        r.template.display(),
        r.seeds.len(),
        if r.complete { "" } else { " (incomplete)" },
        fmt(&r.held_out_clean),
        fmt(&r.held_out_faulted),
        fmt(&r.held_out_faulted_oracle),
    );
    if let Some(f) = &r.held_out_families {
        s.push_str(&format!("| held-out fault families | {} | |\n", fmt(f)));
    }
    let skipped = |f: &dyn Fn(&SeedReport) -> usize| r.seeds.iter().map(f).sum::<usize>();
    s.push_str(&format!(
        "\nLevels that cannot be played (uncertified, not solvable through the catalogue, faults that do not apply together) are skipped, not counted: clean {}, faulted {} (over all seeds).\n",
        skipped(&|x| x.held_out_clean.skipped),
        skipped(&|x| x.held_out_faulted.skipped),
    ));
    s.push_str(&format!(
        "\nEnvironment steps per second through the actor runtime (training, all roles): {}.\n\n| seed | updates | steps | steps/s | failed episodes | worker restarts | masked settings |\n|---|---|---|---|---|---|---|\n",
        fmt(&r.steps_per_s)
    ));
    for x in &r.seeds {
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {} |\n",
            x.seed,
            x.updates,
            x.steps,
            x.steps_per_s,
            x.failed_episodes,
            x.worker_restarts,
            if x.masked_settings.is_empty() {
                "none".into()
            } else {
                x.masked_settings.join(", ")
            }
        ));
    }
    s.push_str("\nSuccess per fault family on the faulted held-out levels (levels with it on), per seed:\n\n");
    for x in &r.seeds {
        let per: Vec<String> = x
            .per_fault
            .iter()
            .map(|(k, (ok, n))| format!("{k} {ok}/{n}"))
            .collect();
        s.push_str(&format!("- seed {}: {}\n", x.seed, per.join(", ")));
    }
    s.push_str(&budget_and_auc(r));
    s.push_str("\n## Plots\n\n");
    for p in plots(r) {
        s.push_str(&format!("![{}]({})\n\n", p.caption, p.file));
    }
    s.push_str("\nFaults are fixed at reset, so RARL here is the minimax-adversary baseline of the curriculum literature (the adversary picks the level, not per-step forces).\n");
    s
}
