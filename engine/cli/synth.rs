//! `engine synth TEMPLATE`: synthesize instances of a template and print them.

use engine::template::{Synthesized, Template};
use std::path::Path;

pub fn run(template: &Path, seed: u64, count: u64, json: bool) -> anyhow::Result<i32> {
    let t = engine::template::Template::load(template)?;
    let rt = super::sandbox::runtime()?;
    let items =
        engine::template::synthesize(&rt, &super::sandbox::cache()?, &t, seed, count.max(1))?;
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
fn report_json(t: &Template, items: &[Synthesized]) -> serde_json::Value {
    serde_json::json!({
        "template": t.name,
        "file": t.file,
        "task": t.task,
        "base": t.base.rootfs,
        "instances": items,
    })
}

/// The human form of `engine synth`: one block per instance.
fn report_text(t: &Template, items: &[Synthesized]) -> String {
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
