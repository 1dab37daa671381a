//! `engine synth TEMPLATE`: synthesize instances of a template and print them.

use engine::template::{Synthesis, Template};
use std::path::Path;

pub fn run(template: &Path, seed: u64, count: u64, json: bool) -> anyhow::Result<i32> {
    let t = engine::template::Template::load_any(template)?;
    if let Some((dir, _)) = &t.harbor {
        return harbor(&t, dir, seed, count.max(1), json);
    }
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

/// A template naming a task folder: the folder's image built (or found in the layer store)
/// once, then each seed's sampled perturbations synthesized on it as a layer of the store
/// (docs/harbor.md, "Perturbations"); one line (or JSON object) per seed.
fn harbor(t: &Template, dir: &Path, seed: u64, count: u64, json: bool) -> anyhow::Result<i32> {
    use engine::harbor;
    let rt = super::sandbox::runtime()?;
    let store = harbor::LayerStore::open(rt.state_dir())?;
    let task = harbor::load(dir)?;
    let text = engine::text::read_input(&task.dockerfile)?;
    let df =
        harbor::dockerfile::parse(&text).map_err(|source| harbor::HarborError::Dockerfile {
            file: task.dockerfile.clone(),
            source,
        })?;
    let img = harbor::build_image(&rt, &store, &task, &df, &harbor::BuildOptions::default())?;
    let mut instances = Vec::new();
    for s in seed..seed.saturating_add(count) {
        let plan = t.sample(s);
        let p = harbor::perturb_image(&rt, &store, &img, &plan.perturbations, s)?;
        let layer = (!plan.perturbations.is_empty()).then(|| p.layers[0].clone());
        instances.push(serde_json::json!({
            "seed": s,
            "perturbations": plan.perturbations,
            "applied": p.applied,
            "layer": layer,
        }));
    }
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "template": t.name,
                "file": t.file,
                "harbor": dir,
                "base": img.base_note,
                "instances": instances,
            }))?
        );
    } else {
        outln!(
            "template {} ({}): task folder {} ({})",
            t.name,
            t.file.display(),
            dir.display(),
            img.base_note
        );
        for i in &instances {
            let applied: Vec<&str> = i["applied"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .collect();
            let what = if applied.is_empty() {
                "no perturbation".to_string()
            } else {
                applied.join("; ")
            };
            outln!("seed {:<6} {what}", i["seed"]);
        }
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
