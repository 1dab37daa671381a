//! Experiment files with their templates (resolved against the project root, their errors
//! naming both files), and `engine::experiment::run` on real instances: uncertified instances
//! are skipped and never run, plans a perturbation cannot apply to are skipped, consecutive
//! episodes of one instance share it, and the files agree with the report.

use crate::common;

use engine::experiment::{Experiment, Report, SEED_STRIDE};
use engine::synth::Cache;
use std::path::{Path, PathBuf};

/// `root/experiments/exp.toml` holding `config(root)`, and `root/templates/t.toml`.
fn project_with(
    template: &str,
    config: impl FnOnce(&Path) -> String,
) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("experiments")).unwrap();
    std::fs::create_dir_all(root.path().join("templates")).unwrap();
    std::fs::write(root.path().join("templates/t.toml"), template).unwrap();
    let file = root.path().join("experiments/exp.toml");
    std::fs::write(&file, config(root.path())).unwrap();
    (root, file)
}

/// `root/experiments/exp.toml` (writing to `root/out`) and `root/templates/t.toml`.
fn project(template: &str, environment: &str) -> (tempfile::TempDir, PathBuf) {
    project_with(template, |root| {
        format!(
            "[experiment]\nname = \"t\"\nseeds = [1, 2]\nout_dir = \"{}\"\n[environment]\n{environment}",
            root.join("out").display()
        )
    })
}

/// A project to load only: seed 3, four episodes, `env` first in `[environment]`.
fn loadable(template: &str, env: &str) -> (tempfile::TempDir, PathBuf) {
    project_with(template, |_| {
        format!("[experiment]\nname = \"t\"\nseeds = [3]\n[environment]\n{env}episodes = 4\n")
    })
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

const TEMPLATE: &str = r#"
[template]
name = "tpl"
task = "archive-logs"
[base_environment]
rootfs = "host"
[[perturbation_space]]
name = "noisy-env"
probability = 0.5
[perturbation_space.params]
count = [1, 3]
"#;

#[test]
fn templates_resolve_against_the_experiment_directory_parent() {
    let (root, file) = loadable(TEMPLATE, "template = \"templates/t.toml\"\n");
    let e = Experiment::load(&file).unwrap();
    let t = e.template.as_ref().unwrap();
    assert_eq!(t.file, root.path().join("templates/t.toml"));
    assert_eq!(e.task(), "archive-logs");
    // Plans are the template's samples at seed * 1_000_003 + episode.
    for ep in 0..4 {
        let p = e.plan(3, ep);
        assert_eq!(p, t.sample(3 * SEED_STRIDE + ep as u64));
        assert_eq!(p.task.as_ref().unwrap().name, "archive-logs");
    }
    assert_ne!(e.plan(3, 0).seed, e.plan(3, 1).seed);
    // The same relative path from the experiment's own directory is not found.
    let (_r, file) = loadable(TEMPLATE, "template = \"t.toml\"\n");
    let err = Experiment::load(&file).unwrap_err().to_string();
    assert!(
        err.contains("exp.toml:5:1: key `environment.template`: no template file at")
            && err.contains("t.toml"),
        "{err}"
    );
}

#[test]
fn template_errors_name_both_files_and_tasks_must_agree() {
    let bad = TEMPLATE.replace("count = [1, 3]", "cuont = [1, 3]");
    let (_r, file) = loadable(&bad, "template = \"templates/t.toml\"\n");
    let err = Experiment::load(&file).unwrap_err().to_string();
    assert!(
        err.contains("exp.toml:5:1: key `environment.template`: ")
            && err.contains("t.toml:11:1:")
            && err.contains("cuont"),
        "{err}"
    );
    let (_r, file) = loadable(
        TEMPLATE,
        "template = \"templates/t.toml\"\ntask = \"free-disk\"\n",
    );
    let err = Experiment::load(&file).unwrap_err().to_string();
    assert!(
        err.contains("key `environment.task`: `free-disk` conflicts"),
        "{err}"
    );
    // A template without a task needs `environment.task`.
    let no_task = TEMPLATE.replace("task = \"archive-logs\"\n", "");
    let (_r, file) = loadable(&no_task, "template = \"templates/t.toml\"\n");
    let err = Experiment::load(&file).unwrap_err().to_string();
    assert!(err.contains("names no task"), "{err}");
    let (_r, file) = loadable(
        &no_task,
        "template = \"templates/t.toml\"\ntask = \"free-disk\"\n",
    );
    let e = Experiment::load(&file).unwrap();
    assert_eq!(e.plan(1, 0).task.unwrap().name, "free-disk");
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

#[test]
fn a_bad_out_dir_fails_before_the_first_episode() {
    let root = tempfile::tempdir().unwrap();
    let blocker = root.path().join("file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let file = root.path().join("exp.toml");
    std::fs::write(
        &file,
        format!(
            "[experiment]\nname = \"t\"\nseeds = [1]\nout_dir = \"{}\"\n[environment]\ntask = \"archive-logs\"\nepisodes = 2\n",
            blocker.join("out").display()
        ),
    )
    .unwrap();
    let exp = Experiment::load(&file).unwrap();
    let rt = common::runtime();
    let cache = common::cache();
    let e = engine::experiment::run(&exp, &rt, &cache).unwrap_err();
    assert!(
        matches!(e, engine::experiment::ExperimentError::Output { .. }),
        "{e}"
    );
    assert!(
        e.to_string().starts_with(&format!(
            "output directory {}",
            blocker.join("out/t").display()
        )),
        "{e}"
    );
    // Nothing was synthesized: the cache is as empty as it started.
    assert_eq!(
        cache.ids(),
        Vec::<String>::new(),
        "an episode ran before the check"
    );
}
