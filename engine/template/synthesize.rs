//! The instances of a template's seeds, synthesized (or found in the cache); `engine synth`
//! prints them (`cli/synth.rs`).

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

/// A seed whose plan cannot be built: a sampled perturbation does not apply to it (e.g. it
/// shadows a tool another one removed).
#[derive(Debug, Clone, Serialize)]
pub struct NotApplicable {
    pub seed: u64,
    pub plan: Plan,
    pub perturbation: String,
    pub reason: String,
}

/// The instances of a template's seeds, and the seeds skipped as not applicable.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Synthesis {
    pub instances: Vec<Synthesized>,
    pub not_applicable: Vec<NotApplicable>,
}

/// Synthesize (or find in the cache) the instances of seeds `seed..seed+count`, after
/// checking the template's tools against its base. A plan that is not applicable is
/// recorded and the next seed goes on; any other failure stops.
pub fn synthesize(
    rt: &sandbox::Runtime,
    cache: &synth::Cache,
    t: &Template,
    seed: u64,
    count: u64,
) -> Result<Synthesis, TemplateError> {
    let fail = |seed: u64, e: crate::running::RunningError| TemplateError::Synthesis {
        file: t.file.clone(),
        seed,
        source: Box::new(e),
    };
    let spec = crate::running::base_spec(&t.base.rootfs).map_err(|e| fail(seed, e))?;
    let rootfs = rt.resolve(&spec).map_err(|e| fail(seed, e.into()))?;
    t.check_tools(&instance::BaseView::new(&rootfs))?;
    let mut out = Synthesis::default();
    for plan in t.sample_many(seed, count) {
        let start = std::time::Instant::now();
        let held = match crate::running::synthesize(rt, cache, &plan) {
            Ok(h) => h,
            Err(e) => {
                if let Some((name, reason)) = e.not_applicable() {
                    tracing::debug!(template = %t.name, seed = plan.seed, perturbation = %name, %reason, "not applicable");
                    out.not_applicable.push(NotApplicable {
                        seed: plan.seed,
                        perturbation: name.to_string(),
                        reason,
                        plan,
                    });
                    continue;
                }
                return Err(fail(plan.seed, e));
            }
        };
        let ms = start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(template = %t.name, seed = plan.seed, instance = %held.instance.id, ms, "synthesized");
        out.instances.push(Synthesized {
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
