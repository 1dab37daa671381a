//! `engine::experiment::run` on real instances: uncertified instances are skipped and never
//! run, plans a perturbation cannot apply to are skipped, consecutive episodes of one instance
//! share it, and the files agree with the report.

use crate::common;

use engine::experiment::{Experiment, Report};
use engine::synth::Cache;
use std::path::{Path, PathBuf};

/// `root/experiments/exp.toml` (writing to `root/out`) and `root/templates/t.toml`.
fn project(template: &str, environment: &str) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("experiments")).unwrap();
    std::fs::create_dir_all(root.path().join("templates")).unwrap();
    std::fs::write(root.path().join("templates/t.toml"), template).unwrap();
    let file = root.path().join("experiments/exp.toml");
    std::fs::write(
        &file,
        format!(
            "[experiment]\nname = \"t\"\nseeds = [1, 2]\nout_dir = \"{}\"\n[environment]\n{environment}",
            root.path().join("out").display()
        ),
    )
    .unwrap();
    (root, file)
}

/// Run in a private instance cache (cold, removed afterwards).
fn run(file: &Path) -> (Report, Vec<serde_json::Value>, serde_json::Value) {
    let exp = Experiment::load(file).unwrap();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let (report, path) = engine::experiment::run(&exp, &rt, &cache).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let lines = std::fs::read_to_string(&report.episodes_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (report, lines, json)
}

const TEMPLATE_HEAD: &str = "[template]\nname = \"t\"\ntask = \"archive-logs\"\n\
                             [base_environment]\nrootfs = \"host\"\n";

/// A disk with no room left for the archive: the oracle cannot solve it.
fn full_disk() -> String {
    format!(
        "{TEMPLATE_HEAD}[[perturbation_space]]\nname = \"disk-fill\"\nprobability = 1.0\n\
         [perturbation_space.params]\ntarget = \"/var/log\"\nfree_pct = 0\n"
    )
}

#[test]
fn uncertified_instances_are_skipped_and_never_run() {
    require_root!();
    let env = "template = \"templates/t.toml\"\nepisodes = 2\nworkers = 2\nagent = \"oracle\"\n";
    let (_root, file) = project(&full_disk(), env);
    let (report, lines, json) = run(&file);
    for s in &report.seeds {
        assert_eq!(s.episodes, 2);
        assert_eq!(s.skipped_uncertified, 2, "{s:?}");
        assert_eq!(s.infra_failures, 0);
        assert_eq!(s.steps, 0);
        assert!(s.success_rate.is_nan());
    }
    // No valid episode: no success rate (null in JSON), not a fake 0.
    assert!(json["seeds"][0]["success_rate"].is_null(), "{json}");
    assert!(json["success_rate"]["mean"].is_null(), "{json}");
    assert_eq!(lines.len(), 4);
    for l in &lines {
        assert_eq!(l["skipped_uncertified"], true, "{l}");
        assert_eq!(l["steps"], 0, "{l}");
        assert!(l["instance"].as_str().unwrap().starts_with("i-"), "{l}");
        assert!(l["error"].as_str().unwrap().contains("logs.tar.gz"), "{l}");
        assert_eq!(
            l["perturbations"][0].as_str().unwrap(),
            "disk-fill:free_pct=0,target=/var/log"
        );
    }

    // Without the requirement the same instances run, and the oracle fails in them.
    let (_root, file) = project(&full_disk(), &format!("{env}require_certified = false\n"));
    let (report, lines, _) = run(&file);
    for s in &report.seeds {
        assert_eq!(s.skipped_uncertified, 0);
        assert_eq!(s.infra_failures, 0);
        assert!(s.steps >= 2, "{s:?}");
        assert_eq!(s.success_rate, 0.0);
    }
    assert!(lines.iter().all(|l| l["success"] == false));
}

#[test]
fn plans_that_cannot_be_built_are_skipped() {
    require_root!();
    // `find` removed, then shadowed: the second cannot apply.
    let tpl = format!(
        "{TEMPLATE_HEAD}[[perturbation_space]]\nname = \"tool-missing\"\nprobability = 1.0\n\
         [perturbation_space.params]\ntool = \"find\"\n\
         [[perturbation_space]]\nname = \"tool-shadowed\"\nprobability = 1.0\n\
         [perturbation_space.params]\ntool = \"find\"\n"
    );
    let (_root, file) = project(&tpl, "template = \"templates/t.toml\"\nepisodes = 2\n");
    let (report, lines, _) = run(&file);
    for s in &report.seeds {
        assert_eq!(s.skipped_not_applicable, 2, "{s:?}");
        assert_eq!(s.infra_failures, 0);
        assert_eq!(s.steps, 0);
    }
    for l in &lines {
        assert_eq!(l["skipped_not_applicable"], true, "{l}");
        assert!(
            l["error"].as_str().unwrap().contains("tool-shadowed"),
            "{l}"
        );
    }
}

#[test]
fn episodes_of_one_instance_share_it_on_one_worker() {
    require_root!();
    let (_root, file) = project(
        "",
        "task = \"archive-logs\"\nepisodes = 5\nepisodes_per_instance = 3\nworkers = 2\nagent = \"oracle\"\n",
    );
    let (report, lines, _) = run(&file);
    assert_eq!(lines.len(), 10);
    for s in &report.seeds {
        assert_eq!(s.success_rate, 1.0, "{s:?}");
        assert_eq!(s.infra_failures, 0);
    }
    for seed in [1u64, 2] {
        let eps: Vec<&serde_json::Value> = lines.iter().filter(|l| l["seed"] == seed).collect();
        let ids: Vec<&str> = eps
            .iter()
            .map(|l| l["instance"].as_str().unwrap())
            .collect();
        let workers: Vec<u64> = eps.iter().map(|l| l["worker"].as_u64().unwrap()).collect();
        let episodes: Vec<u64> = eps.iter().map(|l| l["episode"].as_u64().unwrap()).collect();
        assert_eq!(episodes, [0, 1, 2, 3, 4]);
        assert!(ids[0] == ids[1] && ids[1] == ids[2], "{ids:?}");
        assert!(ids[3] == ids[4] && ids[2] != ids[3], "{ids:?}");
        assert!(workers[0] == workers[1] && workers[1] == workers[2]);
        assert_eq!(workers[3], workers[4]);
        assert_eq!(eps[3]["plan_seed"], seed * 1_000_003 + 1);
    }
}
