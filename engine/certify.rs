//! Solvability certification: run a task's oracle in an instance and judge the result with the
//! verifier. An instance the oracle cannot solve is never used for training (`Env` with
//! `require_certified`, and the experiment loops, consult the certificate first).
//!
//! A certificate is stored beside the instance in the cache (`<id>.cert.json`): the instance id
//! already covers the base digest, the plan, the seed and the catalogue version, so a
//! certificate never outlives what it certifies.

use crate::instance::{Instance, PerturbationChoice, Plan};
use crate::perturb::{self, Perturbation};
use crate::running::{RunningError, RunningInstance};
use crate::synth::Cache;
use crate::tasks::{self, Verdict};
use rand::seq::SliceRandom;
use sandbox::Runtime;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Wall-clock limit of one oracle command.
pub const ORACLE_STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The outcome of certifying one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Certificate {
    pub instance: String,
    pub task: String,
    pub seed: u64,
    pub perturbations: Vec<String>,
    /// The oracle reached the goal.
    pub solvable: bool,
    /// The goal held before the oracle ran (a broken task or a perturbation that solves it).
    pub trivial: bool,
    /// Why not solvable (the verifier's reasons or the failure), empty when solvable.
    pub reason: String,
    pub oracle_commands: usize,
    /// Exit status of each oracle command.
    pub exit_codes: Vec<i32>,
    pub verdict: Option<Verdict>,
    pub duration_ms: u64,
}

/// Certificates stored in an instance cache.
#[derive(Debug, Clone)]
pub struct Certificates {
    cache: Cache,
}

impl Certificates {
    pub fn new(cache: Cache) -> Self {
        Self { cache }
    }

    fn path(&self, id: &str) -> std::path::PathBuf {
        self.cache.dir().join(format!("{id}.cert.json"))
    }

    /// The stored certificate of an instance, if any.
    pub fn get(&self, id: &str) -> Option<Certificate> {
        let text = std::fs::read(self.path(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// The certificate of an instance, certifying it now if there is none.
    pub fn get_or_check(
        &self,
        rt: &Runtime,
        instance: &Instance,
    ) -> Result<Certificate, RunningError> {
        if let Some(c) = self.get(&instance.id) {
            return Ok(c);
        }
        // A perturbation that breaks the task's own start (a read-only directory the task
        // writes its junk into) makes an instance nobody can train on: unsolvable, with the
        // reason, rather than an infrastructure error. Only a start step that exits with a
        // status of its own (not a timeout or a signal), twice in a row, counts: a failure
        // that load or chance caused is returned as an error and not stored. Without
        // perturbations a failing start step is a bug of the task and stays an error.
        let deterministic = |e: &RunningError| {
            matches!(e, RunningError::Start { code, .. } if (1..124).contains(code))
                && !instance.plan.perturbations.is_empty()
        };
        let mut attempt = 0;
        let cert = loop {
            attempt += 1;
            let held = crate::running::synthesize(rt, &self.cache, &instance.plan)?;
            match RunningInstance::start(rt, held) {
                Ok(live) => break run_oracle(live)?,
                Err(e) if deterministic(&e) && attempt == 2 => break cannot_start(instance, &e),
                Err(e) if deterministic(&e) => {
                    tracing::debug!(instance = %instance.id, error = %e, "start failed; once more");
                }
                Err(e) => return Err(e),
            }
        };
        let tmp = self.path(&format!(".tmp-{}-{}", instance.id, std::process::id()));
        if let Ok(json) = serde_json::to_vec_pretty(&cert) {
            if std::fs::write(&tmp, json).is_ok() {
                let _ = std::fs::rename(&tmp, self.path(&instance.id));
            }
        }
        Ok(cert)
    }
}

/// A certificate of `inst` saying nothing yet (not solvable, no reason).
fn blank(inst: &Instance) -> Certificate {
    Certificate {
        instance: inst.id.clone(),
        task: inst
            .task
            .as_ref()
            .map(|t| t.task.clone())
            .unwrap_or_default(),
        seed: inst.plan.seed,
        perturbations: inst.plan.perturbations.iter().map(describe).collect(),
        solvable: false,
        trivial: false,
        reason: String::new(),
        oracle_commands: 0,
        exit_codes: Vec::new(),
        verdict: None,
        duration_ms: 0,
    }
}

/// The certificate of an instance whose start steps fail.
fn cannot_start(inst: &Instance, e: &RunningError) -> Certificate {
    Certificate {
        reason: format!("the instance does not start: {e}"),
        ..blank(inst)
    }
}

/// Run the oracle of the live instance's task and judge the result.
pub fn run_oracle(mut live: RunningInstance) -> Result<Certificate, RunningError> {
    let t0 = Instant::now();
    let inst = live.instance.clone();
    let mut cert = blank(&inst);
    let Some(setup) = inst.task.clone() else {
        cert.reason = "the instance has no task".into();
        return Ok(cert);
    };
    cert.task = setup.task.clone();
    let Some(task) = tasks::get(&setup.task) else {
        cert.reason = format!("unknown task `{}`", setup.task);
        return Ok(cert);
    };
    let verify = |live: &mut RunningInstance| -> Result<Verdict, RunningError> {
        Ok(task.verify(&setup, &mut live.probe())?)
    };
    cert.trivial = verify(&mut live)?.success;
    let commands = task.oracle(&setup);
    cert.oracle_commands = commands.len();
    live.cwd = setup.cwd.clone();
    for c in &commands {
        let r = live.run(c, ORACLE_STEP_TIMEOUT)?;
        cert.exit_codes.push(r.exit_code());
    }
    let v = verify(&mut live)?;
    cert.solvable = v.success && !cert.trivial;
    cert.reason = if cert.trivial {
        "the goal already holds before the oracle runs".into()
    } else if v.success {
        String::new()
    } else {
        v.reasons.join("; ")
    };
    cert.verdict = Some(v);
    cert.duration_ms = t0.elapsed().as_millis() as u64;
    Ok(cert)
}

/// `name` or `name:k=v,k=v`.
pub fn describe(c: &PerturbationChoice) -> String {
    if c.params.is_empty() {
        return c.name.clone();
    }
    let kv: Vec<String> = c.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}:{}", c.name, kv.join(","))
}

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

/// Certify `plans` on `workers` threads; rows in plan order.
fn check_all(
    rt: &Runtime,
    cache: &Cache,
    certs: &Certificates,
    plans: &[Plan],
    workers: usize,
) -> Vec<CheckRow> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = std::sync::Mutex::new(vec![None; plans.len()]);
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(plan) = plans.get(i) else {
                    break;
                };
                let row = check_one(rt, cache, certs, plan);
                if let Ok(mut g) = rows.lock() {
                    g[i] = Some(row);
                }
            });
        }
    });
    rows.into_inner()
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect()
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
        duration_ms: 0,
    };
    let held = match crate::running::synthesize(rt, cache, plan) {
        Ok(h) => h,
        Err(RunningError::Synth(crate::synth::SynthError::Perturb {
            source: perturb::PerturbError::NotApplicable(why),
            ..
        })) => {
            row.status = "not-applicable".into();
            row.reason = why;
            return row;
        }
        Err(e) => {
            row.status = "error".into();
            row.reason = e.to_string();
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
        "{:<w$}  {:>4}  {:<14}  reason",
        "perturbations", "seed", "status"
    );
    for r in rows {
        let mut p = names(r);
        if p.len() > w {
            p.truncate(w - 1);
            p.push('~');
        }
        let _ = writeln!(
            s,
            "{p:<w$}  {:>4}  {:<14}  {}",
            r.seed,
            r.status,
            r.reason.lines().next().unwrap_or("")
        );
    }
    let count = |st: &str| rows.iter().filter(|r| r.status == st).count();
    let _ = writeln!(
        s,
        "{} instances: {} solvable, {} unsolvable, {} trivial, {} not applicable, {} errors",
        rows.len(),
        count("solvable"),
        count("unsolvable"),
        count("trivial"),
        count("not-applicable"),
        count("error")
    );
    s
}
