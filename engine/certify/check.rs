//! The `engine task check` campaign: certify a task's instances under every single fault and
//! sampled combinations, on worker threads, and tabulate which keep it solvable.

use super::{describe, Certificates};
use crate::instance::{PerturbationChoice, Plan};
use crate::perturb::{self, Perturbation};
use crate::synth::Cache;
use rand::seq::SliceRandom;
use sandbox::Runtime;
use serde::Serialize;
use std::time::Instant;

/// One row of a `task check` report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckRow {
    /// The perturbations of the instance (`none` for the unperturbed task).
    pub perturbations: String,
    pub seed: u64,
    pub instance: Option<String>,
    /// `solvable`, `unsolvable`, `trivial`, `not-applicable` or `error`.
    pub status: String,
    pub reason: String,
    /// Whether the catalogue oracle solved it (`None` when it was not run: trivial,
    /// not applicable or an error).
    pub catalogue_solvable: Option<bool>,
    /// Why the catalogue oracle did not solve it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub catalogue_reason: String,
    /// The catalogue indices the catalogue oracle took.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub catalogue_actions: Vec<usize>,
    pub duration_ms: u64,
}

/// What `engine task check` runs: the unperturbed task, every perturbation of `singles`, and
/// `combos` sampled combinations of two or three of the singles that applied, each for `seeds`
/// seeds.
#[derive(Debug, Clone)]
pub struct CheckSpec {
    pub task: String,
    pub base: String,
    pub singles: Vec<PerturbationChoice>,
    pub combos: usize,
    pub seeds: Vec<u64>,
    pub workers: usize,
}

/// Every perturbation of the catalogue with its default parameters.
pub fn all_defaults() -> Vec<PerturbationChoice> {
    perturb::catalogue()
        .into_iter()
        .filter_map(|p: &'static dyn Perturbation| {
            let params = p.info().check(&Default::default()).ok()?;
            Some(PerturbationChoice {
                name: p.info().name.into(),
                params,
            })
        })
        .collect()
}

/// The plans of a check without combinations: the unperturbed task, then each single.
fn single_plans(spec: &CheckSpec) -> Vec<Plan> {
    let mut sets: Vec<Vec<PerturbationChoice>> = vec![Vec::new()];
    sets.extend(spec.singles.iter().map(|c| vec![c.clone()]));
    plans_of(spec, sets)
}

/// `combos` sampled combinations of two or three of `pool` (seeded by the first seed).
fn combo_plans(spec: &CheckSpec, pool: &[PerturbationChoice]) -> Vec<Plan> {
    let mut sets = Vec::new();
    let mut rng = crate::instance::rng_for(
        spec.seeds.first().copied().unwrap_or(0),
        "task-check-combos",
    );
    for _ in 0..spec.combos {
        if pool.len() < 2 {
            break;
        }
        let k = if pool.len() >= 3 && rand::Rng::gen_bool(&mut rng, 0.5) {
            3
        } else {
            2
        };
        let mut pick: Vec<PerturbationChoice> =
            pool.choose_multiple(&mut rng, k).cloned().collect();
        pick.sort_by(|a, b| a.name.cmp(&b.name));
        sets.push(pick);
    }
    plans_of(spec, sets)
}

fn plans_of(spec: &CheckSpec, sets: Vec<Vec<PerturbationChoice>>) -> Vec<Plan> {
    let mut out = Vec::new();
    for set in sets {
        for &seed in &spec.seeds {
            let mut p = Plan::for_task(&spec.task, seed, set.clone());
            p.base = spec.base.clone();
            out.push(p);
        }
    }
    out
}

/// Certify the unperturbed task and every single perturbation, then `combos` combinations
/// drawn from the singles that applied to this task and base (a combination with a
/// perturbation that cannot apply would only repeat "not applicable"). Rows in that order.
pub fn check(rt: &Runtime, cache: &Cache, spec: &CheckSpec) -> Vec<CheckRow> {
    let certs = Certificates::new(cache.clone());
    let singles = single_plans(spec);
    let mut rows = check_all(rt, cache, &certs, &singles, spec.workers);
    // Rows come per set (the unperturbed task, then each single), one per seed; a single
    // applies when it applied for at least one seed.
    let n = spec.seeds.len().max(1);
    let pool: Vec<PerturbationChoice> = rows
        .get(n..)
        .unwrap_or_default()
        .chunks(n)
        .zip(&spec.singles)
        .filter(|(rs, _)| rs.iter().any(|r| r.status != "not-applicable"))
        .map(|(_, c)| c.clone())
        .collect();
    let combos = combo_plans(spec, &pool);
    rows.extend(check_all(rt, cache, &certs, &combos, spec.workers));
    rows
}

/// Certify given plans (a template's samples, say) on `workers` threads; rows in plan order.
pub fn check_plans(rt: &Runtime, cache: &Cache, plans: &[Plan], workers: usize) -> Vec<CheckRow> {
    check_all(rt, cache, &Certificates::new(cache.clone()), plans, workers)
}

/// Certify `plans` on `workers` threads; rows in plan order.
fn check_all(
    rt: &Runtime,
    cache: &Cache,
    certs: &Certificates,
    plans: &[Plan],
    workers: usize,
) -> Vec<CheckRow> {
    // A certification records its failures in its row; a worker that panicked is a bug, and
    // the caller panics too (rather than get a campaign with rows missing).
    crate::work_queue::run(
        plans,
        workers,
        |_| Ok(()),
        |_, _, plan| Ok::<_, std::convert::Infallible>(check_one(rt, cache, certs, plan)),
        || panic!("a certification worker panicked"),
    )
    .unwrap_or_else(|never| match never {})
}

fn check_one(rt: &Runtime, cache: &Cache, certs: &Certificates, plan: &Plan) -> CheckRow {
    let t0 = Instant::now();
    let label = if plan.perturbations.is_empty() {
        "none".to_string()
    } else {
        plan.perturbations
            .iter()
            .map(describe)
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let mut row = CheckRow {
        perturbations: label,
        seed: plan.seed,
        instance: None,
        status: String::new(),
        reason: String::new(),
        catalogue_solvable: None,
        catalogue_reason: String::new(),
        catalogue_actions: Vec::new(),
        duration_ms: 0,
    };
    let held = match crate::running::synthesize(rt, cache, plan) {
        Ok(h) => h,
        Err(e) => {
            match e.not_applicable() {
                Some((_, why)) => {
                    row.status = "not-applicable".into();
                    row.reason = why;
                }
                None => {
                    row.status = "error".into();
                    row.reason = e.to_string();
                }
            }
            return row;
        }
    };
    row.instance = Some(held.instance.id.clone());
    let instance = held.instance.clone();
    drop(held);
    match certs.get_or_check(rt, &instance) {
        Ok(c) => {
            row.status = if c.trivial {
                "trivial"
            } else if c.solvable {
                "solvable"
            } else {
                "unsolvable"
            }
            .into();
            row.reason = c.reason;
            if let Some(k) = c.catalogue {
                row.catalogue_solvable = Some(k.solvable);
                row.catalogue_reason = k.reason;
                row.catalogue_actions = k.actions;
            }
        }
        Err(e) => {
            row.status = "error".into();
            row.reason = e.to_string();
        }
    }
    row.duration_ms = t0.elapsed().as_millis() as u64;
    row
}

/// A plain-text table of a check.
pub fn render(rows: &[CheckRow]) -> String {
    use std::fmt::Write;
    // The table names the perturbations; their parameters are in the JSON form.
    let names = |r: &CheckRow| {
        r.perturbations
            .split(" + ")
            .map(|p| p.split(':').next().unwrap_or(p))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let w = rows
        .iter()
        .map(|r| names(r).len())
        .max()
        .unwrap_or(4)
        .clamp(13, 72);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<w$}  {:>4}  {:<14}  {:<9}  reason",
        "perturbations", "seed", "status", "catalogue"
    );
    for r in rows {
        let mut p = names(r);
        if p.len() > w {
            p.truncate(w - 1);
            p.push('~');
        }
        let catalogue = match r.catalogue_solvable {
            Some(true) => "solvable",
            Some(false) => "no",
            None => "-",
        };
        let reason = if r.reason.is_empty() {
            &r.catalogue_reason
        } else {
            &r.reason
        };
        let _ = writeln!(
            s,
            "{p:<w$}  {:>4}  {:<14}  {catalogue:<9}  {}",
            r.seed,
            r.status,
            reason.lines().next().unwrap_or("")
        );
    }
    let count = |st: &str| rows.iter().filter(|r| r.status == st).count();
    let by_catalogue = rows
        .iter()
        .filter(|r| r.status == "solvable" && r.catalogue_solvable == Some(true))
        .count();
    let _ = writeln!(
        s,
        "{} instances: {} solvable ({} of them through the catalogue), {} unsolvable, {} trivial, {} not applicable, {} errors",
        rows.len(),
        count("solvable"),
        by_catalogue,
        count("unsolvable"),
        count("trivial"),
        count("not-applicable"),
        count("error")
    );
    s
}
