//! `engine synth TEMPLATE`: synthesize instances of a template and print them.

use engine::template::{Synthesis, Template};
use std::path::Path;

pub fn run(template: &Path, seed: u64, count: u64, json: bool) -> anyhow::Result<i32> {
    let t = engine::template::Template::load(template)?;
    let rt = super::sandbox::runtime()?;
    let items =
        engine::template::synthesize(&rt, &super::sandbox::cache()?, &t, seed, count.max(1))?;
    if !json && items.instances.is_empty() && !items.not_applicable.is_empty() {
        tracing::warn!(seeds = count, "no seed gave an applicable plan");
    }
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report_json(&t, &items))?
        );
    } else {
        out!("{}", report_text(&t, &items));
    }
    Ok(0)
}

/// The JSON report of `engine synth --json`.
fn report_json(t: &Template, items: &Synthesis) -> serde_json::Value {
    serde_json::json!({
        "template": t.name,
        "file": t.file,
        "task": t.task,
        "base": t.base.rootfs,
        "instances": items.instances,
        "not_applicable": items.not_applicable,
    })
}

/// The human form of `engine synth`: one block per instance, one line per seed whose plan is
/// not applicable, in seed order.
fn report_text(t: &Template, items: &Synthesis) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "template {} ({})", t.name, t.file.display());
    let mut skipped = items.not_applicable.iter().peekable();
    for it in &items.instances {
        while let Some(n) = skipped.next_if(|n| n.seed < it.seed) {
            not_applicable_line(&mut s, n);
        }
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
    for n in skipped {
        not_applicable_line(&mut s, n);
    }
    s
}

fn not_applicable_line(s: &mut String, n: &engine::template::NotApplicable) {
    use std::fmt::Write;
    let _ = writeln!(
        s,
        "seed {:<6} not applicable: perturbation `{}`: {}",
        n.seed, n.perturbation, n.reason
    );
}
