//! What `engine synth` needs: the instances of a template's seeds, synthesized (or found in
//! the cache), and their reports (`--json` and the human form).

use super::{Template, TemplateError};
use crate::instance::{self, Plan};
use crate::synth;
use serde::Serialize;

/// One synthesized instance of a template.
#[derive(Debug, Clone, Serialize)]
pub struct Synthesized {
    pub seed: u64,
    pub id: String,
    pub origin: synth::Origin,
    pub plan: Plan,
    /// What each perturbation did, one line each.
    pub applied: Vec<String>,
    pub layer_bytes: u64,
    /// Wall time of the synthesis (or the cache lookup), milliseconds.
    pub ms: f64,
}

/// Synthesize (or find in the cache) the instances of seeds `seed..seed+count`, after
/// checking the template's tools against its base.
pub fn synthesize(
    rt: &sandbox::Runtime,
    cache: &synth::Cache,
    t: &Template,
    seed: u64,
    count: u64,
) -> Result<Vec<Synthesized>, TemplateError> {
    let fail = |seed: u64, e: crate::running::RunningError| TemplateError::Synthesis {
        file: t.file.clone(),
        seed,
        source: Box::new(e),
    };
    let spec = crate::running::base_spec(&t.base.rootfs).map_err(|e| fail(seed, e))?;
    let rootfs = rt.resolve(&spec).map_err(|e| fail(seed, e.into()))?;
    t.check_tools(&instance::BaseView::new(&rootfs))?;
    let mut out = Vec::new();
    for plan in t.sample_many(seed, count) {
        let start = std::time::Instant::now();
        let held = crate::running::synthesize(rt, cache, &plan).map_err(|e| fail(plan.seed, e))?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(template = %t.name, seed = plan.seed, instance = %held.instance.id, ms, "synthesized");
        out.push(Synthesized {
            seed: plan.seed,
            id: held.instance.id.clone(),
            origin: held.origin,
            applied: held.instance.applied.clone(),
            layer_bytes: held.instance.layer_bytes,
            plan,
            ms,
        });
    }
    Ok(out)
}

/// The JSON report of `engine synth --json`.
pub fn synth_report(t: &Template, items: &[Synthesized]) -> serde_json::Value {
    serde_json::json!({
        "template": t.name,
        "file": t.file,
        "task": t.task,
        "base": t.base.rootfs,
        "instances": items,
    })
}

/// The human form of `engine synth`: one block per instance.
pub fn synth_text(t: &Template, items: &[Synthesized]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "template {} ({})", t.name, t.file.display());
    for it in items {
        let _ = writeln!(
            s,
            "seed {:<6} {}  {:?} in {:.2} ms, layer {} bytes",
            it.seed, it.id, it.origin, it.ms, it.layer_bytes
        );
        if let Some(task) = &it.plan.task {
            let _ = writeln!(s, "  task {} (seed {})", task.name, task.seed);
        }
        if it.applied.is_empty() {
            let _ = writeln!(s, "  no perturbation");
        }
        for (c, line) in it.plan.perturbations.iter().zip(&it.applied) {
            let params: Vec<String> = c.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "  {} [{}]", line, params.join(","));
        }
    }
    s
}
