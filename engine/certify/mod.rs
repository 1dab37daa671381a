//! Solvability certification: run a task's oracle in an instance and judge the result with the
//! verifier. An instance the oracle cannot solve is never used for training (`Env` with
//! `require_certified`, and the experiment loops, consult the certificate first).
//!
//! A certificate is stored beside the instance in the cache (`<id>.cert.json`): the instance id
//! already covers the base digest, the plan, the seed and the catalogue version, so a
//! certificate never outlives what it certifies.
//!
//! [`check`] is the `engine task check` campaign: certify a task under each fault of the
//! catalogue and sampled combinations, and report which keep it solvable.

mod check;

pub use check::{all_defaults, check, check_plans, render, CheckRow, CheckSpec};

use crate::instance::{Instance, PerturbationChoice, TaskSetup};
use crate::running::{
    RunningError, RunningInstance, AGENT_OUTPUT_CAP, AGENT_STEP_TIMEOUT_MS, OBSERVATION_BYTES,
};
use crate::synth::Cache;
use crate::tasks::{self, Seen, Verdict};
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
    /// The catalogue oracle's run on a fresh episode ([`Task::catalogue_step`]): whether the
    /// instance is solvable through the discrete catalogue a small policy acts with.
    ///
    /// [`Task::catalogue_step`]: crate::tasks::Task::catalogue_step
    pub catalogue: Option<CatalogueRun>,
    pub duration_ms: u64,
    /// Digest of the task setup certified (instruction, catalogue, costs, facts), as stored in
    /// the instance's manifest. It guards against a manifest and a certificate that disagree;
    /// a change of a task's code (its setup, verifier, oracles) must bump
    /// `instance::CATALOGUE_VERSION`, which changes every instance id.
    #[serde(default)]
    pub setup_digest: String,
}

/// The digest of an instance's task setup (empty without a task).
pub fn setup_digest(inst: &Instance) -> String {
    inst.task
        .as_ref()
        .and_then(|t| serde_json::to_vec(t).ok())
        .map(|b| crate::tasks::util::sha256_hex(&b))
        .unwrap_or_default()
}

/// What the catalogue oracle did in one episode of an instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogueRun {
    /// The goal was reached within the task's step limit.
    pub solvable: bool,
    /// The catalogue indices taken, in order.
    pub actions: Vec<usize>,
    /// Exit status of each.
    pub exit_codes: Vec<i32>,
    /// Why not solvable (the last verdict's reasons, or that the oracle gave up).
    pub reason: String,
    /// Progress of the last verdict.
    pub progress: f64,
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

    /// The stored certificate of an instance, if any and still of the same task setup.
    pub fn get(&self, instance: &Instance) -> Option<Certificate> {
        let text = std::fs::read(self.path(&instance.id)).ok()?;
        let c: Certificate = serde_json::from_slice(&text).ok()?;
        (c.setup_digest == setup_digest(instance)).then_some(c)
    }

    /// The certificate of an instance, certifying it now if there is none.
    pub fn get_or_check(
        &self,
        rt: &Runtime,
        instance: &Instance,
    ) -> Result<Certificate, RunningError> {
        if let Some(c) = self.get(instance) {
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
                Ok(running) => break run_oracle(running)?,
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
        catalogue: None,
        duration_ms: 0,
        setup_digest: setup_digest(inst),
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
pub fn run_oracle(mut running: RunningInstance) -> Result<Certificate, RunningError> {
    let t0 = Instant::now();
    let inst = running.instance.clone();
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
    cert.trivial = running.judge()?.success;
    let commands = task.oracle(&setup);
    cert.oracle_commands = commands.len();
    running.cwd = setup.cwd.clone();
    for c in &commands {
        let r = running.run(c, ORACLE_STEP_TIMEOUT)?;
        cert.exit_codes.push(r.exit_code());
    }
    let v = running.judge()?;
    cert.solvable = v.success && !cert.trivial;
    cert.reason = if cert.trivial {
        "the goal already holds before the oracle runs".into()
    } else if v.success {
        String::new()
    } else {
        v.reasons.join("; ")
    };
    cert.verdict = Some(v);
    if !cert.trivial {
        running.restart()?;
        cert.catalogue = Some(run_catalogue_oracle(&mut running, task, &setup)?);
    }
    cert.duration_ms = t0.elapsed().as_millis() as u64;
    Ok(cert)
}

/// Run the task's catalogue oracle in a fresh episode of `running` (started, start steps done),
/// the way the environment runs an agent's catalogue actions (the agent's cwd tracking, its
/// step timeout and output cap, the verdict after every step), up to the task's step limit.
pub fn run_catalogue_oracle(
    running: &mut RunningInstance,
    task: &dyn tasks::Task,
    setup: &TaskSetup,
) -> Result<CatalogueRun, RunningError> {
    running.cwd = setup.cwd.clone();
    let mut seen: Vec<Seen> = Vec::new();
    let mut run = CatalogueRun {
        solvable: false,
        actions: Vec::new(),
        exit_codes: Vec::new(),
        reason: String::new(),
        progress: 0.0,
    };
    for _ in 0..setup.max_steps {
        let Some(i) = task.catalogue_step(setup, &seen) else {
            run.reason = format!("the catalogue oracle gave up after {} steps", seen.len());
            return Ok(run);
        };
        let Some(cmd) = setup.actions.get(i) else {
            run.reason = format!(
                "the catalogue oracle chose action {i} of {}",
                setup.actions.len()
            );
            return Ok(run);
        };
        // Shown as `Env` shows it (the default limits; see `Shown`).
        let r = running.run_agent(cmd, AGENT_STEP_TIMEOUT_MS, AGENT_OUTPUT_CAP)?;
        let shown = crate::running::Shown::of(&r, AGENT_STEP_TIMEOUT_MS, OBSERVATION_BYTES);
        seen.push(Seen {
            action: i,
            exit_code: r.exit_code(),
            stdout: shown.stdout,
            stderr: shown.stderr,
        });
        run.actions.push(i);
        run.exit_codes.push(r.exit_code());
        let v = running.judge()?;
        run.progress = v.progress;
        if v.success {
            run.solvable = true;
            return Ok(run);
        }
        run.reason = v.reasons.join("; ");
    }
    run.reason = format!(
        "not solved within {} catalogue steps: {}",
        setup.max_steps, run.reason
    );
    Ok(run)
}

/// `name` or `name:k=v,k=v`.
pub fn describe(c: &PerturbationChoice) -> String {
    if c.params.is_empty() {
        return c.name.clone();
    }
    let kv: Vec<String> = c.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}:{}", c.name, kv.join(","))
}
