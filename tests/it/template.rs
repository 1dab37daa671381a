//! Templates against the real catalogue: the shipped templates load, TOML and YAML give the
//! same plans, sampling is deterministic and follows the probabilities, errors name the file,
//! line, key and reason, and `engine synth`'s library side synthesizes instances.

use crate::common;

use engine::template::{self, ErrorKind, Template};
use std::path::{Path, PathBuf};

fn templates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")
}

#[test]
fn every_shipped_template_loads_and_samples() {
    let mut n = 0;
    for e in std::fs::read_dir(templates_dir()).unwrap() {
        let p = e.unwrap().path();
        if template::Format::of_path(&p).is_none() {
            continue;
        }
        let t = Template::load(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(!t.space.is_empty(), "{}", p.display());
        for plan in t.sample_many(0, 20) {
            // Every sampled parameter set passes the catalogue's check as recorded.
            for c in &plan.perturbations {
                let info = engine::perturb::get(&c.name).unwrap().info();
                assert_eq!(info.check(&c.params).unwrap(), c.params);
            }
        }
        n += 1;
    }
    assert!(n >= 3);
}

#[test]
fn toml_and_yaml_give_the_same_plans() {
    let a = Template::load(&templates_dir().join("archive-logs.toml")).unwrap();
    let b = Template::load(&templates_dir().join("archive-logs.yaml")).unwrap();
    assert_eq!(a.name, b.name);
    assert_eq!(a.description, b.description);
    let (pa, pb) = (a.sample_many(7, 300), b.sample_many(7, 300));
    assert_eq!(pa, pb);
    // And the same instance ids on any base.
    for (x, y) in pa.iter().zip(&pb) {
        assert_eq!(
            engine::instance::instance_id(x, "base"),
            engine::instance::instance_id(y, "base")
        );
    }
}

#[test]
fn sampling_is_deterministic_and_follows_the_probabilities() {
    let t = Template::load(&templates_dir().join("archive-logs.toml")).unwrap();
    assert_eq!(t.sample_many(100, 50), t.sample_many(100, 50));
    assert_ne!(t.sample_many(100, 50), t.sample_many(200, 50));
    let plans = t.sample_many(0, 2000);
    let freq = |name: &str| {
        plans
            .iter()
            .filter(|p| p.perturbations.iter().any(|c| c.name == name))
            .count() as f64
            / plans.len() as f64
    };
    let p = freq("tool-missing");
    assert!((0.25..=0.35).contains(&p), "tool-missing (p=0.3) in {p}");
    let p = freq("disk-fill");
    assert!((0.11..=0.19).contains(&p), "disk-fill (p=0.15) in {p}");
    // Choices are uniform: each of the two tools about half the time.
    let gz = plans
        .iter()
        .flat_map(|p| &p.perturbations)
        .filter(|c| c.name == "tool-missing")
        .filter(|c| c.params["tool"].to_string() == "gzip")
        .count() as f64;
    let all = freq("tool-missing") * 2000.0;
    assert!((0.4..=0.6).contains(&(gz / all)), "gzip chosen {gz}/{all}");
    for p in &plans {
        assert_eq!(p.task.as_ref().unwrap().name, "archive-logs");
        assert_eq!(p.task.as_ref().unwrap().seed, p.seed);
        assert_eq!(p.tools, vec!["tar", "gzip", "find", "perl"]);
    }
}

#[test]
fn errors_in_a_file_name_it_with_line_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(templates_dir().join("archive-logs.yaml")).unwrap();
    let cases: &[(&str, &str, ErrorKind, &str, &str)] = &[
        (
            "probability: 0.3",
            "probability: 3",
            ErrorKind::OutOfRange,
            "perturbation_space[0].probability",
            "outside [0, 1]",
        ),
        (
            "- name: noisy-env",
            "- name: noisy-environment",
            ErrorKind::UnknownPerturbation,
            "perturbation_space[4].name",
            "unknown perturbation `noisy-environment`",
        ),
        (
            "count: [1, 3, 5]",
            "count: [1, 3, 50]",
            ErrorKind::BadParam,
            "perturbation_space[4].params.count[2]",
            "50 is outside",
        ),
        (
            "tool: [tar, find]",
            "tol: [tar, find]",
            ErrorKind::UnknownParam,
            "perturbation_space[1].params.tol",
            "no parameter `tol`",
        ),
        (
            "task: archive-logs",
            "task: archive-log",
            ErrorKind::UnknownTask,
            "template.task",
            "unknown task `archive-log`",
        ),
        (
            "memory: 256M",
            "memory: 256Q",
            ErrorKind::BadSize,
            "base_environment.memory",
            "not a size",
        ),
        (
            "  pids: 128",
            "  pids: 128\n  gpus: 1",
            ErrorKind::UnknownKey,
            "base_environment.gpus",
            "unknown key",
        ),
    ];
    for (from, to, kind, key, reason) in cases {
        assert!(good.contains(from), "{from}");
        let text = good.replacen(from, to, 1);
        let file = dir.path().join("bad.yaml");
        std::fs::write(&file, &text).unwrap();
        let line = text
            .lines()
            .position(|l| l.contains(to.lines().last().unwrap()))
            .unwrap()
            + 1;
        let e = Template::load(&file).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.kind(), Some(*kind), "{msg}");
        assert_eq!(e.key(), Some(*key), "{msg}");
        assert_eq!(e.line(), Some(line), "{msg}");
        assert!(
            msg.starts_with(&format!("{}:{line}:", file.display())),
            "{msg}"
        );
        assert!(msg.contains(reason), "{msg}");
    }
    let file = dir.path().join("bad.json");
    std::fs::write(&file, "{}").unwrap();
    assert!(matches!(
        Template::load(&file),
        Err(template::TemplateError::Format { .. })
    ));
}

#[test]
fn templates_synthesize_into_cached_instances() {
    require_root!();
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = engine::synth::Cache::open(state.path()).unwrap();
    let t = Template::load(&templates_dir().join("archive-logs.toml")).unwrap();
    let first = template::synthesize(&rt, &cache, &t, 10, 4)
        .unwrap()
        .instances;
    assert_eq!(first.len(), 4);
    assert!(first
        .iter()
        .all(|s| s.origin == engine::synth::Origin::Built));
    for s in &first {
        assert_eq!(s.applied.len(), s.plan.perturbations.len());
    }
    let again = template::synthesize(&rt, &cache, &t, 10, 4)
        .unwrap()
        .instances;
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(a.id, b.id);
        assert_eq!(b.origin, engine::synth::Origin::Cached);
    }
    let ids: std::collections::BTreeSet<&str> = first.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), 4, "four seeds, four instances");
    // The reports are the command line's (`engine synth`), over the same cache.
    let synth = |json: bool| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_engine"));
        c.env("ENVFACTORY_STATE", state.path())
            .arg("synth")
            .arg(templates_dir().join("archive-logs.toml"))
            .args(["--seed", "10", "--count", "4"]);
        if json {
            c.arg("--json");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&synth(true)).unwrap();
    assert_eq!(json["template"], "archive-logs");
    assert_eq!(json["instances"][2]["id"], first[2].id.as_str());
    assert_eq!(json["instances"][2]["seed"], 12);
    let text = synth(false);
    eprintln!("{text}");
    for s in &first {
        assert!(text.contains(&s.id), "{text}");
    }
}

#[test]
fn shipped_templates_synthesize_and_start_on_the_host() {
    require_root!();
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = engine::synth::Cache::open(state.path()).unwrap();
    for name in ["archive-logs.toml", "ops-mix.toml"] {
        let t = Template::load(&templates_dir().join(name)).unwrap();
        // Sixteen seeds: together they apply most entries of the space, each one for real.
        let mut applied = std::collections::BTreeSet::new();
        for s in template::synthesize(&rt, &cache, &t, 0, 16)
            .unwrap()
            .instances
        {
            let held = cache.lookup(&s.id).unwrap().unwrap();
            let live = engine::running::RunningInstance::start(&rt, held)
                .unwrap_or_else(|e| panic!("{name} seed {}: {e}\n{:?}", s.seed, s.applied));
            drop(live);
            applied.extend(s.plan.perturbations.iter().map(|c| c.name.clone()));
        }
        eprintln!("{name}: {applied:?}");
        assert!(
            applied.len() * 3 >= t.space.len() * 2,
            "{name}: only {applied:?}"
        );
    }
}

#[test]
fn a_tool_the_base_lacks_is_named_with_its_line() {
    require_root!();
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = engine::synth::Cache::open(state.path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    std::fs::write(
        &file,
        "[template]\nname = \"t\"\n[base_environment]\ntools = [\"tar\",\n  \"no-such-tool-xyz\"]\n",
    )
    .unwrap();
    let t = Template::load(&file).unwrap();
    let e = template::synthesize(&rt, &cache, &t, 0, 1).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::MissingTool), "{e}");
    assert_eq!(e.line(), Some(5), "{e}");
    assert_eq!(e.key(), Some("base_environment.tools[1]"), "{e}");
    assert!(e.to_string().contains("no `no-such-tool-xyz`"), "{e}");
    assert!(cache.ids().is_empty());
}

#[test]
fn synth_reports_a_plan_that_is_not_applicable_and_goes_on() {
    require_root!();
    let state = common::TempState::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    // `find` removed always, shadowed half the time: those seeds cannot be built.
    std::fs::write(
        &file,
        "[template]\nname = \"t\"\ntask = \"archive-logs\"\n\
         [[perturbation_space]]\nname = \"tool-missing\"\n[perturbation_space.params]\ntool = \"find\"\n\
         [[perturbation_space]]\nname = \"tool-shadowed\"\nprobability = 0.5\n[perturbation_space.params]\ntool = \"find\"\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", state.path())
        .arg("synth")
        .arg(&file)
        .args(["--seed", "60", "--count", "10"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seeds: Vec<&str> = text.lines().filter(|l| l.starts_with("seed ")).collect();
    assert_eq!(seeds.len(), 10, "every seed is reported: {text}");
    let skipped = seeds
        .iter()
        .filter(|l| l.contains("not applicable"))
        .count();
    assert!(skipped > 0 && skipped < 10, "{text}");
    assert!(text.contains("perturbation `tool-shadowed`"), "{text}");
    let order: Vec<u64> = seeds
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(order, (60..70).collect::<Vec<_>>());
}
