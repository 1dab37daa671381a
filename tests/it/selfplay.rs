//! Self-play end to end: `[selfplay]` configs and their errors, a real RARL run through the
//! actor runtime on real sandboxes (metrics, episodes with plans, checkpoints of every role,
//! held-out evaluation), and supervision: a worker whose sandbox init is killed in the
//! middle of a run is restarted, its episode masked, and the run goes on.

use crate::common;
use actors::msg::{FailureKind, Level};
use actors::roles::EnvWorker;
use actors::runtime::{Budget, Control, Observer, Parts, WorkerFactory};
use actors::schedule::{Iteration, Method, ScheduleConfig};
use engine::env::{Env, EnvConfig};
use engine::experiment::Experiment;
use engine::roles::{CriticSettings, EnvRole, FaultSpace, PpoRole, RealismCritic, SpaceSettings};
use engine::synth::Cache;
use engine::template::Template;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const TEMPLATE: &str = r#"
[template]
name = "sp"
task = "fix-path"
[base_environment]
rootfs = "host"
[[perturbation_space]]
name = "noisy-env"
probability = 0.5
[perturbation_space.params]
count = [1, 3]
[[perturbation_space]]
name = "path-shuffle"
probability = 0.5
"#;

pub(crate) fn project(selfplay: &str, training: &str) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("experiments")).unwrap();
    std::fs::create_dir_all(root.path().join("templates")).unwrap();
    std::fs::write(root.path().join("templates/t.toml"), TEMPLATE).unwrap();
    let file = root.path().join("experiments/sp.toml");
    std::fs::write(
        &file,
        format!(
            "[experiment]\nname = \"sp\"\nseeds = [1]\nout_dir = \"{}\"\n[environment]\ntemplate = \"templates/t.toml\"\nworkers = 2\n[training]\n{training}\n[selfplay]\n{selfplay}",
            root.path().join("out").display()
        ),
    )
    .unwrap();
    (root, file)
}

#[test]
fn selfplay_configs_are_checked_with_the_file_and_key() {
    for (selfplay, key, says) in [
        (
            "method = \"minimax\"\n",
            "selfplay.method",
            "unknown method `minimax`",
        ),
        (
            "method = \"rarl\"\npopulation = 0\n",
            "selfplay.population",
            "between 1 and 64",
        ),
        ("lambda = nan\n", "selfplay.lambda", "finite"),
        ("budget = 0.0\n", "selfplay.budget", "> 0"),
        (
            "held_out_faults = [\"disk-fill\"]\n",
            "selfplay.held_out_faults",
            "not in",
        ),
        ("dr_share = 1.5\n", "selfplay.dr_share", "[0, 1]"),
        (
            "method = \"sfl\"\nsfl_keep = 40\nsfl_candidates = 8\n",
            "selfplay.sfl_keep",
            "sfl_candidates",
        ),
        ("score = \"regret\"\n", "selfplay.score", "pvl"),
        ("methd = \"rarl\"\n", "", "unknown field `methd`"),
        (
            "budget_schedule = { start = 3.0 }\n",
            "selfplay.budget_schedule.start",
            "at most the budget 2",
        ),
        (
            "budget_schedule = { start = 0.5 }\n",
            "selfplay.budget_schedule.start",
            "no fault fits",
        ),
        (
            "budget_schedule = { mode = \"step\", start = 1.0 }\n",
            "selfplay.budget_schedule.mode",
            "unknown mode `step`",
        ),
        (
            "budget_schedule = { start = 1.0, window = 4 }\n",
            "selfplay.budget_schedule.window",
            "not a key of mode `linear`",
        ),
        (
            "budget_schedule = { start = 1.0, end = 3.0 }\n",
            "selfplay.budget_schedule.end",
            "selfplay.budget (2)",
        ),
        (
            "budget_schedule = { start = 1.0, over = 0.0 }\n",
            "selfplay.budget_schedule.over",
            "(0, 1]",
        ),
        (
            "budget_schedule = { mode = \"adaptive\", start = 1.0, raise_above = 0.4 }\n",
            "selfplay.budget_schedule.lower_below",
            "below raise_above",
        ),
    ] {
        let (_r, file) = project(selfplay, "");
        let e = Experiment::load(&file).unwrap_err().to_string();
        assert!(e.contains("sp.toml:"), "{selfplay}: {e}");
        assert!(e.contains(key) && e.contains(says), "{selfplay}: {e}");
    }
    // lambda is a config key and an ablation axis: any finite weight loads.
    let (_r, file) = project("lambda = 0.5\n", "");
    assert_eq!(
        Experiment::load(&file).unwrap().selfplay.unwrap().lambda,
        0.5
    );
    let (_r, file) = project("method = \"plr\"\n", "");
    let exp = Experiment::load(&file).unwrap();
    let text = engine::experiment::selfplay::describe(&exp, exp.selfplay.as_ref().unwrap());
    assert!(
        text.contains("method plr") && text.contains("level buffer"),
        "{text}"
    );
    assert!(text.contains("budget 2 (fixed at 2)"), "{text}");
    // The budget schedule: --dry-run says how the budget moves.
    let (_r, file) = project(
        "budget_schedule = { start = 1.0, over = 0.5 }\n",
        "total_steps = 64\nnum_envs = 2\nnum_steps = 4\n",
    );
    let exp = Experiment::load(&file).unwrap();
    let text = engine::experiment::selfplay::describe(&exp, exp.selfplay.as_ref().unwrap());
    assert!(
        text.contains("linear from 1 to 2 over the first 4 protagonist updates"),
        "{text}"
    );
    let (_r, file) = project(
        "budget_schedule = { mode = \"adaptive\", start = 1.0, window = 8 }\n",
        "",
    );
    let exp = Experiment::load(&file).unwrap();
    let text = engine::experiment::selfplay::describe(&exp, exp.selfplay.as_ref().unwrap());
    assert!(
        text.contains("adaptive from 1") && text.contains("over 8 episodes"),
        "{text}"
    );
}

#[test]
fn every_shipped_experiment_loads_and_the_methods_differ_by_one_key() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let rarl = std::fs::read_to_string(root.join("rarl.toml")).unwrap();
    let body = |s: &str| s[s.find("[experiment]").unwrap()..].to_string();
    for m in Method::ALL {
        let file = root.join(format!("{}.toml", m.name()));
        let exp = Experiment::load(&file).unwrap();
        assert_eq!(exp.selfplay.as_ref().unwrap().method(), Some(m));
        let text = std::fs::read_to_string(&file).unwrap();
        let differ: Vec<_> = body(&text)
            .lines()
            .zip(body(&rarl).lines())
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a.to_string())
            .collect();
        assert!(
            differ
                .iter()
                .all(|l| l.starts_with("name = ") || l.starts_with("method = ")),
            "{}: {differ:?}",
            m.name()
        );
    }
}

/// Each outcome's failure kind and success.
type Outcomes = Arc<Mutex<Vec<(Option<FailureKind>, bool)>>>;

struct Seen(Outcomes);

impl Observer for Seen {
    fn iteration(
        &mut self,
        _i: u64,
        _u: u64,
        it: &Iteration,
    ) -> Result<Control, actors::roles::RoleError> {
        let mut s = self.0.lock().unwrap();
        s.extend(
            it.outcomes
                .iter()
                .map(|o| (o.failure.as_ref().map(|f| f.kind), o.success)),
        );
        Ok(Control::default())
    }
}

/// An Env worker that kills its own sandbox's init (SIGKILL) at its `at`-th step.
struct KillInit {
    inner: EnvRole,
    /// Which build of a worker this is (1, 2: the first two; 3 on: rebuilt after a failure).
    build: u64,
    per_build: Arc<Mutex<std::collections::BTreeMap<u64, u64>>>,
    at: u64,
    steps: Arc<AtomicU64>,
    killed: Arc<AtomicBool>,
}

impl EnvWorker for KillInit {
    fn reset(&mut self, level: &Level) -> Result<actors::msg::Start, actors::msg::Failure> {
        self.inner.reset(level)
    }

    fn step(&mut self, action: u32) -> actors::msg::StepResult {
        let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        *self
            .per_build
            .lock()
            .unwrap()
            .entry(self.build)
            .or_default() += 1;
        if n == self.at && !self.killed.swap(true, Ordering::SeqCst) {
            let pid = self.inner.env_mut().running().unwrap().sandbox().init_pid();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
        }
        self.inner.step(action)
    }
}

/// The level space of [`TEMPLATE`]: budget 1, at most 2 faults, task seeds 7000..7004.
fn test_space() -> Arc<FaultSpace> {
    let dir = tempfile::tempdir().unwrap();
    let tpl_file = dir.path().join("t.toml");
    std::fs::write(&tpl_file, TEMPLATE).unwrap();
    let tpl = Template::load(&tpl_file).unwrap();
    let settings = SpaceSettings {
        costs: Default::default(),
        budget: 1.0,
        max_faults: 2,
        seed_base: 7_000,
        seed_count: 4,
    };
    Arc::new(FaultSpace::new(tpl, &settings).unwrap())
}

#[test]
fn a_worker_whose_sandbox_init_is_killed_mid_run_is_restarted_and_the_run_goes_on() {
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let space = test_space();
    let level_space = space.space.clone();
    let cfg = EnvConfig::default();
    let probe = Env::new(rt.clone(), cache.clone(), cfg.clone()).unwrap();
    let obs_dim = probe.obs_dim();
    drop(probe);
    let width = 32;
    let net = policies::nets::ActorCriticConfig {
        obs_dim,
        action_dims: vec![width],
        hidden: vec![16],
        activation: policies::nets::Activation::Tanh,
        shared_trunk: false,
    };
    let ppo = policies::ppo::PpoConfig {
        num_envs: 2,
        num_steps: 4,
        num_minibatches: 1,
        update_epochs: 1,
        ..policies::ppo::PpoConfig::default()
    };
    let (steps, killed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (k2, s2) = (killed.clone(), steps.clone());
    let built = Arc::new(AtomicU64::new(0));
    let b2 = built.clone();
    let per_build = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
    let p2 = per_build.clone();
    let factory: WorkerFactory = Arc::new(move |_| {
        let build = b2.fetch_add(1, Ordering::SeqCst) + 1;
        let env = Env::new(rt.clone(), cache.clone(), cfg.clone()).unwrap();
        Ok(Box::new(KillInit {
            inner: EnvRole::new(env, space.clone(), width),
            build,
            per_build: p2.clone(),
            at: 5,
            steps: s2.clone(),
            killed: k2.clone(),
        }) as Box<dyn EnvWorker>)
    });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sc = ScheduleConfig::new(Method::Dr, level_space, 1);
    let summary = actors::runtime::run(
        &sc,
        Parts {
            protagonist: Box::new(PpoRole::new(&net, &ppo, 1).unwrap()),
            antagonist: None,
            adversaries: Vec::new(),
            critic: None,
            curriculum: None,
            workers: 2,
            worker_factory: factory,
        },
        Box::new(Seen(seen.clone())),
        Budget { updates: 4 },
    )
    .unwrap();
    assert!(killed.load(Ordering::SeqCst), "the init was never killed");
    assert_eq!(summary.updates, 4, "the run stopped after the kill");
    assert!(summary.worker_restarts >= 1, "{summary:?}");
    assert!(
        built.load(Ordering::SeqCst) >= 3,
        "no fresh worker was built after the kill"
    );
    let seen = seen.lock().unwrap();
    let infra = seen
        .iter()
        .filter(|o| o.0 == Some(FailureKind::Infrastructure))
        .count();
    assert!(
        infra >= 1,
        "the killed episode was not reported as an infrastructure failure: {seen:?}"
    );
    // The worker built after the kill played on.
    let per_build = per_build.lock().unwrap();
    assert!(
        per_build.range(3..).any(|(_, &steps)| steps > 0),
        "no rebuilt worker stepped: {per_build:?}"
    );
}

/// A self-play run of `exp`, not stopped, from scratch.
pub(crate) fn run_selfplay(
    exp: &Experiment,
    rt: &sandbox::Runtime,
    cache: &Cache,
) -> (engine::experiment::selfplay::SelfPlayReport, PathBuf) {
    static STOP: AtomicBool = AtomicBool::new(false);
    engine::experiment::selfplay::run(exp, exp.selfplay.as_ref().unwrap(), rt, cache, &STOP, false)
        .unwrap()
}

#[test]
fn a_short_rarl_run_writes_metrics_episodes_checkpoints_and_a_report() {
    // With the realism critic and a budget schedule: noisy-env costs 0.5, so the first
    // update's levels (budget 0.5) can only have it on; path-shuffle (1) fits at the end.
    let (root, file) = project(
        "method = \"rarl\"\npopulation = 1\nprotagonist_updates = 1\nadversary_batch = 2\nbudget = 1.0\nmax_faults = 1\ncheckpoint_every = 1\nlambda = 0.1\ncosts = { \"noisy-env\" = 0.5 }\nbudget_schedule = { start = 0.5, over = 1.0 }\n",
        "total_steps = 16\nnum_envs = 2\nnum_steps = 4\nnum_minibatches = 1\nupdate_epochs = 1\nhidden = [16]\ntrain_levels = 4\neval_levels = 2\n",
    );
    let exp = Experiment::load(&file).unwrap();
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let (report, path) = run_selfplay(&exp, &rt, &cache);
    assert!(report.complete && !report.interrupted);
    let s = &report.seeds[0];
    assert_eq!(s.updates, 2);
    // Two protagonist updates with an adversary phase between them.
    let phases: Vec<&str> = s.curve.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(phases, ["protagonist", "adversary", "protagonist"]);
    assert_eq!(s.held_out_clean.episodes, 2);
    assert_eq!(s.held_out_faulted.episodes, 2);
    for (family, (ok, n)) in &s.per_fault {
        assert!(ok <= n, "{family}: {ok} successes of {n} counted episodes");
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(json["method"], "rarl");
    assert!(json["held_out_clean"]["per_seed"].as_array().unwrap().len() == 1);
    let out = root.path().join("out/sp");
    for f in [
        "report.md",
        "seed-1/metrics.jsonl",
        "seed-1/final/protagonist/ppo.safetensors",
        "seed-1/final/adversary-0/adversary.safetensors",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let episodes = std::fs::read_to_string(out.join("seed-1/episodes.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(episodes.lines().next().unwrap()).unwrap();
    assert!(
        first["plan"]["task"]["name"] == "fix-path" && first["actions"].is_array(),
        "{first}"
    );
    let metrics = std::fs::read_to_string(out.join("seed-1/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 3);
    // The budget grows over the run, and no level costs more than its iteration's budget.
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let budgets: Vec<f64> = lines
        .iter()
        .map(|l| l["budget"].as_f64().unwrap())
        .collect();
    assert_eq!(budgets, [0.5, 0.75, 0.75]);
    assert!(s.curve.iter().all(|p| p.budget.is_some()));
    for line in episodes.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let faults = e["faults"].as_str().unwrap();
        assert!(!faults.contains("path-shuffle"), "over the budget: {e}");
    }
    // The adversary phase's line holds the adversary's reward and the critic's held-out
    // AUC (a number in [0, 1]).
    let adv = &lines[1];
    assert_eq!(adv["point"]["phase"], "adversary");
    assert_eq!(adv["point"]["proposals"], 2);
    let auc = adv["point"]["critic_auc"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&auc), "{adv}");
    assert!(adv["critic"].is_array(), "{adv}");
    assert!(
        adv["point"]["adversary_reward"][0][1].as_f64().is_some(),
        "{adv}"
    );
    // The report's plots: PNGs, linked from report.md.
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for png in [
        "curve.png",
        "adversaries.png",
        "faults.png",
        "auc.png",
        "budget.png",
        "per_fault.png",
    ] {
        let bytes = std::fs::read(out.join(png)).unwrap_or_else(|e| panic!("{png}: {e}"));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
        assert!(md.contains(&format!("]({png})")), "{png} not in report.md");
    }
    assert!(md.contains("held-out AUC"), "{md}");
    // Counted episodes (the adversary phase's are played to their end) replay to the same
    // verdict in the same number of steps.
    let mut replayed = 0;
    for (i, line) in episodes.lines().enumerate() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        if !e["failure"].is_null() || replayed == 3 {
            continue;
        }
        let r = engine::experiment::replay::replay(&rt, &cache, &out, &format!("1:{i}")).unwrap();
        assert!(
            r.same_verdict && r.success == e["success"].as_bool().unwrap(),
            "{r:?}"
        );
        assert_eq!(u64::from(r.steps), e["steps"].as_u64().unwrap(), "{r:?}");
        replayed += 1;
    }
    assert!(replayed > 0, "no episode was counted");
    for bad in ["1:x", "9:0", "1:100000"] {
        let e = engine::experiment::replay::replay(&rt, &cache, &out, bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("episodes.jsonl"), "{bad}: {e}");
    }
}

/// `(iteration, updates)` of every line of a seed's `metrics.jsonl`.
fn metric_points(file: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["point"]["iteration"].as_u64().unwrap(),
                v["point"]["updates"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_run_killed_with_sigkill_resumes_from_its_last_checkpoint_and_loses_at_most_one_update() {
    if !common::is_root() {
        return;
    }
    let (root, file) = project(
        "method = \"rarl\"\npopulation = 1\nprotagonist_updates = 1\nadversary_batch = 2\nbudget = 1.0\nmax_faults = 1\ncheckpoint_every = 1\n",
        "total_steps = 64\nnum_envs = 2\nnum_steps = 4\nnum_minibatches = 1\nupdate_epochs = 1\nhidden = [16]\ntrain_levels = 4\neval_levels = 2\n",
    );
    let st = common::TempState::new();
    let engine = |args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_engine"));
        c.env("ENVFACTORY_STATE", st.path())
            .args(args)
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        c
    };
    let seed = root.path().join("out/sp/seed-1");
    // (updates, iterations) of a complete checkpoint.
    let progress = |dir: &str| -> Option<(u64, u64)> {
        let d = seed.join(dir);
        d.join("COMPLETE").is_file().then_some(())?;
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("progress.json")).ok()?).ok()?;
        Some((v["updates"].as_u64()?, v["iterations"].as_u64()?))
    };
    let mut child = engine(&["run"]).spawn().unwrap();
    let killed = child.id();
    // Killed right after a checkpoint of an adversary phase (the iterations alternate, one
    // update then one adversary phase: an even count ends with an adversary phase).
    assert!(
        sandbox::testing::eventually(300, || {
            progress("checkpoint").is_some_and(|p| p.0 >= 3 && p.1 % 2 == 0)
                || seed.join("final/COMPLETE").is_file()
        }),
        "no checkpoint of 3 updates appeared"
    );
    assert!(
        !seed.join("final/COMPLETE").is_file(),
        "the run ended with no checkpoint after an adversary phase"
    );
    // SAFETY: kill with integer arguments: our own child.
    unsafe { libc::kill(killed as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let before = std::fs::read(seed.join("metrics.jsonl")).unwrap();
    let logged = metric_points(&seed.join("metrics.jsonl"));
    let (saved, saved_iterations) = ["checkpoint", "checkpoint.tmp", "checkpoint.old"]
        .iter()
        .filter_map(|d| progress(d))
        .max()
        .unwrap();
    let last_logged = logged.iter().map(|p| p.1).max().unwrap();
    assert!(
        saved + 1 >= last_logged && last_logged < 8,
        "checkpoint at {saved} updates, {last_logged} logged: more than one update lost (or the run had ended)"
    );
    // Adversary phases are checkpointed too: at most one iteration of any phase is lost.
    assert!(
        saved_iterations + 1 >= logged.len() as u64,
        "checkpoint after {saved_iterations} iterations, {} logged",
        logged.len()
    );

    // A resume under another configuration is refused and changes nothing.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("population = 1", "population = 2")).unwrap();
    let o = engine(&["run", "--resume"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("run.json")
            && err.contains("selfplay.population")
            && err.contains("nothing was changed"),
        "{err}"
    );
    assert_eq!(std::fs::read(seed.join("metrics.jsonl")).unwrap(), before);
    std::fs::write(&file, &text).unwrap();

    let out = engine(&["run", "--resume"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.path().join("out/sp/report.json")).unwrap())
            .unwrap();
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["seeds"][0]["updates"], 8);
    // The metrics up to the checkpoint are kept as they were, the rest played again: every
    // iteration once, in order, and 8 protagonist updates in all.
    let after = std::fs::read(seed.join("metrics.jsonl")).unwrap();
    let points = metric_points(&seed.join("metrics.jsonl"));
    let kept = points.iter().take_while(|p| p.0 < saved_iterations).count();
    assert_eq!(kept as u64, saved_iterations);
    let kept_bytes: usize = after
        .split_inclusive(|b| *b == b'\n')
        .take(kept)
        .map(<[u8]>::len)
        .sum();
    assert_eq!(&after[..kept_bytes], &before[..kept_bytes]);
    let iterations: Vec<u64> = points.iter().map(|p| p.0).collect();
    assert_eq!(iterations, (0..points.len() as u64).collect::<Vec<_>>());
    assert_eq!(points.last().unwrap().1, 8);
    // The seconds of the metrics go on from the killed run's, never back to 0.
    let seconds: Vec<f64> = String::from_utf8_lossy(&after)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seconds"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(seconds.windows(2).all(|w| w[0] <= w[1]), "{seconds:?}");
    // The protagonist went on learning: its optimiser counted every update once.
    let agent = policies::ppo::PpoAgent::load(&seed.join("final/protagonist/ppo")).unwrap();
    assert_eq!(agent.updates(), 8);
    // The killed run's sandboxes, cgroups and mounts were reaped by the resumed run.
    assert_eq!(crate::signals::leftovers(&st, killed), Vec::<String>::new());

    // A finished run resumes to the same report without training again.
    let again = engine(&["run", "--resume"]).output().unwrap();
    assert!(again.status.success());
    assert_eq!(std::fs::read(seed.join("metrics.jsonl")).unwrap(), after);
}

#[test]
fn resume_needs_a_run_directory() {
    if !common::is_root() {
        return;
    }
    let (_root, file) = project(
        "method = \"dr\"\n",
        "total_steps = 8\nnum_envs = 2\nnum_steps = 4\n",
    );
    let st = common::TempState::new();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .args(["run", "--resume"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nothing to resume") && err.contains("run.json"),
        "{err}"
    );
}

/// The realism critic (issue 11 item 3): it measures a level's instance without its task,
/// scores it `log D` against the shipped real set, and after learning on the adversaries'
/// levels scores those levels as less real than before.
#[test]
fn the_realism_critic_learns_the_adversaries_levels_are_generated() {
    use actors::roles::Critic;
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let space = test_space();
    let mut critic = RealismCritic::new(
        rt.clone(),
        cache.clone(),
        space.clone(),
        CriticSettings::default(),
        5,
    )
    .unwrap();
    let levels = vec![
        Level::clean(7_000),
        Level {
            seed: 7_001,
            choices: vec![1, 1],
        },
        Level {
            seed: 7_002,
            choices: vec![0, 1],
        },
    ];
    let before = critic.realism(&levels).unwrap();
    assert_eq!(before.len(), 3);
    assert!(
        before.iter().all(|d| d.is_finite() && *d <= 0.0),
        "{before:?}"
    );
    let mut stats = None;
    for _ in 0..5 {
        stats = Some(critic.learn(&levels).unwrap());
    }
    let stats = stats.unwrap();
    assert!(stats.get("loss").unwrap().is_finite(), "{stats:?}");
    assert_eq!(stats.get("generated"), Some(15.0));
    let after = critic.realism(&levels).unwrap();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(mean(&after) < mean(&before), "{before:?} -> {after:?}");
    let save = tempfile::tempdir().unwrap();
    critic.save(save.path()).unwrap();
    assert!(save.path().join("critic.safetensors").is_file());
    // A resumed run's critic (another seed) scores as the saved one did.
    let mut resumed = RealismCritic::new(rt, cache, space, CriticSettings::default(), 99).unwrap();
    resumed.resume_from(save.path()).unwrap();
    assert_eq!(
        resumed.realism(&levels).unwrap(),
        critic.realism(&levels).unwrap()
    );
}
