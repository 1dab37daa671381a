//! `engine tournament` and `engine sweep` end to end: a real tournament over two tiny
//! self-play runs (the matrix's shape, the reference rows, the game solved), runs that do
//! not share the level space or have not finished refused by key, and a 2-point sweep run
//! through the binary (both runs, the aggregate, `--resume` keeping them), its bad grids
//! refused with the file and key before anything runs; a grid over the template, a refused
//! or differently typed `--resume`, stale reports, and signals (each passed on once as
//! itself, every point waited for, the aggregate saved).

use crate::common;
use crate::selfplay::{project, run_selfplay};
use engine::experiment::sweep::Sweep;
use engine::experiment::Experiment;
use engine::synth::Cache;
use std::path::{Path, PathBuf};

const TINY: &str = "total_steps = 16\nnum_envs = 2\nnum_steps = 4\nnum_minibatches = 1\nupdate_epochs = 1\nhidden = [16]\ntrain_levels = 4\neval_levels = 2\n";
const RARL: &str = "method = \"rarl\"\npopulation = 1\nprotagonist_updates = 1\nadversary_batch = 2\nbudget = 1.0\nmax_faults = 1\ncheckpoint_every = 0\n";

/// A project with its experiment named `name` (the same template as every other).
fn named(name: &str, selfplay: &str) -> (tempfile::TempDir, PathBuf) {
    let (root, file) = project(selfplay, TINY);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("name = \"sp\"", &format!("name = \"{name}\"")),
    )
    .unwrap();
    (root, file)
}

fn tournament_file(dir: &Path, runs: &[&Path]) -> PathBuf {
    let file = dir.join("experiments/tournament.toml");
    let runs: Vec<String> = runs
        .iter()
        .map(|r| format!("\"{}\"", r.display()))
        .collect();
    std::fs::write(
        &file,
        format!(
            "[tournament]\nname = \"t\"\nout_dir = \"{}\"\nruns = [{}]\nlevels = 4\nworkers = 2\n",
            dir.join("out").display(),
            runs.join(", ")
        ),
    )
    .unwrap();
    file
}

#[test]
fn a_tournament_of_two_tiny_runs_plays_the_matrix_and_solves_the_game() {
    if !common::is_root() {
        return;
    }
    let rt = common::runtime();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 64, 1 << 30).unwrap();
    let (ra, fa) = named("rarl", RARL);
    let (_rb, fb) = named(
        "dr",
        "method = \"dr\"\nbudget = 1.0\nmax_faults = 1\ncheckpoint_every = 0\n",
    );
    // Not run yet: refused by key.
    let t = tournament_file(ra.path(), &[&fa, &fb]);
    let e = engine::experiment::tournament::run(&t, &rt, &cache)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tournament.toml") && e.contains("tournament.runs[0]") && e.contains("run.json"),
        "{e}"
    );
    for f in [&fa, &fb] {
        let exp = Experiment::load(f).unwrap();
        run_selfplay(&exp, &rt, &cache);
    }
    let (m, report) = engine::experiment::tournament::run(&t, &rt, &cache).unwrap();
    assert_eq!(m.rows, ["rarl/1", "dr/1", "catalogue-oracle", "random"]);
    assert_eq!(m.cols, ["rarl/1/adversary-0", "clean", "dr"]);
    assert_eq!(m.cells.len(), 4);
    assert!(m.cells.iter().all(|r| r.len() == 3));
    for c in m.cells.iter().flatten() {
        assert_eq!(c.counted + c.skipped + c.infra, 4, "{c:?}");
        assert!(
            c.successes <= c.counted && (c.counted == 0 || (c.lo <= c.rate && c.rate <= c.hi)),
            "{c:?}"
        );
    }
    // The catalogue oracle solves the clean levels.
    let oracle_clean = &m.cells[2][1];
    assert!(
        oracle_clean.counted > 0 && oracle_clean.rate == 1.0,
        "{oracle_clean:?}"
    );
    // The game: the two learned protagonists against the three columns.
    assert_eq!(m.game_rows, ["rarl/1", "dr/1"]);
    let g = m.nash.as_ref().expect("the game is solved");
    assert!(
        (g.rows.iter().sum::<f64>() - 1.0).abs() < 1e-9
            && (g.cols.iter().sum::<f64>() - 1.0).abs() < 1e-9
    );
    assert!(
        g.gap.abs() < 1e-9 && (0.0..=1.0).contains(&g.value),
        "{g:?}"
    );
    assert_eq!(m.nash_averaged_rows.len(), 2);
    assert_eq!(m.elo_rows.len() + m.elo_cols.len(), 7);
    let dir = ra.path().join("out/t");
    for f in ["matrix.json", "report.md", "heatmap.png"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    // Fixed seeds: played again, every cell counts the same.
    let (again, _) = engine::experiment::tournament::run(&t, &rt, &cache).unwrap();
    let counts = |m: &engine::experiment::tournament::Matrix| -> Vec<(usize, usize)> {
        m.cells
            .iter()
            .flatten()
            .map(|c| (c.successes, c.counted))
            .collect()
    };
    assert_eq!(counts(&again), counts(&m));
    let md = std::fs::read_to_string(report).unwrap();
    assert!(
        md.contains("Nash value") && md.contains("| catalogue-oracle |"),
        "{md}"
    );

    // A run of another level space is refused with the key that differs.
    let text = std::fs::read_to_string(&fb).unwrap();
    let other = fb.with_file_name("other.toml");
    std::fs::write(&other, text.replace("budget = 1.0", "budget = 2.0")).unwrap();
    let t2 = tournament_file(ra.path(), &[&fa, &other]);
    let e = engine::experiment::tournament::run(&t2, &rt, &cache)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tournament.runs[1]")
            && e.contains("selfplay.budget")
            && e.contains("level space"),
        "{e}"
    );
}

fn sweep_file(root: &Path, base: &Path, grid: &str) -> PathBuf {
    let file = root.join("experiments/sweep.toml");
    std::fs::write(
        &file,
        format!(
            "[sweep]\nname = \"sw\"\nbase = \"{}\"\nout_dir = \"{}\"\nparallel = 2\nseeds = [1]\n[grid]\n{grid}",
            base.display(),
            root.join("out").display()
        ),
    )
    .unwrap();
    file
}

#[test]
fn bad_sweep_grids_are_refused_with_the_file_and_key_before_anything_runs() {
    let (root, base) = named("base", "method = \"dr\"\n");
    for (grid, says) in [
        (
            "\"selfplay.lambdax\" = [0.0]\n",
            "grid.\"selfplay.lambdax\"` : no key `lambdax`",
        ),
        (
            "\"selfplay.lambda\" = [\"high\"]\n",
            "is a string, the key takes a number",
        ),
        (
            "\"selfplay.max_faults\" = [1.5]\n",
            "is a number, the key takes an integer",
        ),
        ("\"selfplay.budget\" = [0.0]\n", "selfplay.budget"),
        ("\"experiment.name\" = [\"x\"]\n", "the sweep sets it"),
    ] {
        let f = sweep_file(root.path(), &base, grid);
        let e = Sweep::load(&f).unwrap_err().to_string();
        let says = says.replace("` : ", "`: ");
        assert!(e.contains("sweep.toml") && e.contains(&says), "{grid}: {e}");
    }
    assert!(
        !root.path().join("out/sw").exists(),
        "a refused sweep wrote something"
    );
    // Through the command line: bad input, exit 2, the file and key on stderr.
    let f = sweep_file(root.path(), &base, "\"selfplay.lambda\" = [true]\n");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["sweep", "--dry-run"])
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sweep.toml: key `grid.\"selfplay.lambda\"`: true is a boolean"),
        "{err}"
    );
    let f = sweep_file(
        root.path(),
        &base,
        "\"selfplay.method\" = [\"dr\", \"clean\"]\n\"selfplay.lambda\" = [0.0, 0.5]\n",
    );
    let sw = Sweep::load(&f).unwrap();
    let names: Vec<&str> = sw.points.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "lambda-0.0_method-dr",
            "lambda-0.0_method-clean",
            "lambda-0.5_method-dr",
            "lambda-0.5_method-clean"
        ]
    );
    assert!(sw.describe().contains("4 points"));

    // Points whose `engine run` fails are reported as failed, every point is still tried,
    // and the aggregate is written; a stopped sweep launches nothing.
    let f = sweep_file(
        root.path(),
        &base,
        "\"selfplay.method\" = [\"dr\", \"clean\"]\n",
    );
    let sw = Sweep::load(&f).unwrap();
    let fails = root.path().join("fails.sh");
    std::fs::write(
        &fails,
        "#!/bin/sh\necho out: \"$@\"\necho err: failing >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&fails, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let no = std::sync::atomic::AtomicBool::new(false);
    let (agg, _) = engine::experiment::sweep::run(&sw, &fails, false, &no, &Vec::new).unwrap();
    assert!(!agg.complete());
    for p in &agg.points {
        assert!(
            p.status.starts_with("failed (exit 3"),
            "{}: {}",
            p.point.name,
            p.status
        );
        let log = std::fs::read_to_string(p.point.dir.join("log.txt")).unwrap();
        // Both streams, in one file.
        assert!(
            log.contains("out: run") && log.contains("experiment.toml"),
            "{log}"
        );
        assert!(log.contains("err: failing"), "{log}");
    }
    let agg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.path().join("out/sw/sweep.json")).unwrap())
            .unwrap();
    assert_eq!(agg["points"].as_array().unwrap().len(), 2);
    let stopped = std::sync::atomic::AtomicBool::new(true);
    let (agg, _) = engine::experiment::sweep::run(&sw, &fails, false, &stopped, &Vec::new).unwrap();
    assert!(agg.points.iter().all(|p| p.status == "not run"), "{agg:?}");

    // The shipped pair: the tournament plays the sweep's points.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let sw = Sweep::load(&shipped.join("sweep.toml")).unwrap();
    let t =
        engine::experiment::tournament::Tournament::load(&shipped.join("tournament.toml")).unwrap();
    assert_eq!(sw.points.len(), t.runs.len());
    for (p, run) in sw.points.iter().zip(&t.runs) {
        let tail = Path::new(&sw.table.name)
            .join("points")
            .join(&p.name)
            .join("experiment.toml");
        assert!(
            run.ends_with(&tail),
            "{} is not the point {}",
            run.display(),
            p.name
        );
    }
}

/// A fake `engine` at `root/name` running `body` (`$2` is the point's experiment file).
fn fake_engine(root: &Path, name: &str, body: &str) -> PathBuf {
    let file = root.join(name);
    std::fs::write(&file, format!("#!/bin/sh\nd=$(dirname \"$2\")\n{body}")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    file
}

/// A project of `[selfplay]` and `[training]` and its sweep over `selfplay.method` (dr,
/// clean).
fn method_sweep_over(selfplay: &str, training: &str) -> (tempfile::TempDir, PathBuf) {
    let (root, base) = project(selfplay, training);
    let f = sweep_file(
        root.path(),
        &base,
        "\"selfplay.method\" = [\"dr\", \"clean\"]\n",
    );
    (root, f)
}

/// [`method_sweep_over`] the tiny dr experiment, loaded.
fn method_sweep() -> (tempfile::TempDir, PathBuf, Sweep) {
    let (root, f) = method_sweep_over("method = \"dr\"\n", TINY);
    let sw = Sweep::load(&f).unwrap();
    (root, f, sw)
}

#[test]
fn a_grid_over_the_template_gives_each_point_its_own_and_relative_paths_load() {
    let (root, base) = project(
        "method = \"dr\"\n",
        &format!("{TINY}eval_template = \"templates/t.toml\"\n"),
    );
    let tpl = root.path().join("templates");
    std::fs::copy(tpl.join("t.toml"), tpl.join("u.toml")).unwrap();
    let f = sweep_file(
        root.path(),
        &base,
        "\"environment.template\" = [\"templates/t.toml\", \"templates/u.toml\"]\n",
    );
    let sw = Sweep::load(&f).unwrap();
    let no = std::sync::atomic::AtomicBool::new(false);
    let fails = fake_engine(root.path(), "fails.sh", "exit 3\n");
    engine::experiment::sweep::run(&sw, &fails, false, &no, &Vec::new).unwrap();
    let tpl = std::fs::canonicalize(&tpl).unwrap();
    assert_eq!(sw.points.len(), 2);
    for (p, own) in sw.points.iter().zip(["t.toml", "u.toml"]) {
        let exp = Experiment::load(&p.file()).unwrap();
        assert_eq!(exp.environment.template, Some(tpl.join(own)), "{}", p.name);
        assert_eq!(
            exp.training.as_ref().unwrap().eval_template,
            Some(tpl.join("t.toml")),
            "{}",
            p.name
        );
    }
}

#[test]
fn resume_refuses_without_writing_accepts_another_spelling_and_trusts_no_stale_report() {
    let (root, f, sw) = method_sweep();
    // A complete report an earlier run left: neither its figures nor `kept` are this point's.
    let stale = &sw.points[0].dir;
    std::fs::create_dir_all(stale).unwrap();
    std::fs::write(
        stale.join("report.json"),
        r#"{"complete": true, "held_out_clean": {"per_seed": [1.0]}, "held_out_faulted": {"per_seed": [1.0]}}"#,
    )
    .unwrap();
    let no = std::sync::atomic::AtomicBool::new(false);
    let fails = fake_engine(root.path(), "fails.sh", "exit 3\n");
    let run = |sw: &Sweep, engine: &Path, resume: bool| {
        engine::experiment::sweep::run(sw, engine, resume, &no, &Vec::new)
            .map(|(agg, _)| agg)
            .map_err(|e| e.to_string())
    };
    let agg = run(&sw, &fails, false).unwrap();
    assert!(
        agg.points[0].status.starts_with("failed (exit 3"),
        "{agg:?}"
    );
    assert!(agg.points[0].held_out_clean.is_none(), "{agg:?}");
    // The sweep file's path typed another way: the same points, resumed (not refused), and
    // the stale report is not kept (no run of this point's file).
    let other = root.path().join("experiments/../experiments/./sweep.toml");
    let agg = run(&Sweep::load(&other).unwrap(), &fails, true).unwrap();
    assert!(
        agg.points
            .iter()
            .all(|p| p.status.starts_with("failed (exit 3")),
        "{agg:?}"
    );
    // Another configuration over the same points: refused, and the saved sweep is untouched.
    let saved = root.path().join("out/sw/sweep.toml");
    let before = std::fs::read(&saved).unwrap();
    let text = std::fs::read_to_string(&f).unwrap();
    std::fs::write(&f, text.replace("seeds = [1]", "seeds = [2]")).unwrap();
    let e = run(&Sweep::load(&f).unwrap(), &fails, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another sweep configuration"), "{e}");
    assert_eq!(std::fs::read(&saved).unwrap(), before);
    // An engine that cannot start: every point says so, and the aggregate is saved.
    std::fs::write(&f, text).unwrap();
    std::fs::remove_file(root.path().join("out/sw/sweep.json")).unwrap();
    let agg = run(&sw, &root.path().join("no-such-engine"), false).unwrap();
    assert!(
        agg.points
            .iter()
            .all(|p| p.status.starts_with("failed to start")),
        "{agg:?}"
    );
    assert!(root.path().join("out/sw/sweep.json").is_file());
}

#[test]
fn a_stopped_sweep_passes_each_signal_on_once_and_leaves_no_child() {
    let (root, _, sw) = method_sweep();
    // Records every signal; stops a while after the first.
    let waits = fake_engine(
        root.path(),
        "waits.sh",
        "trap 'echo INT >> \"$d/signals\"; n=1' INT\ntrap 'echo TERM >> \"$d/signals\"; n=1' TERM\necho $$ > \"$d/pid\"\nwhile [ -z \"$n\" ]; do sleep 0.1; done\nsleep 0.5\nexit 130\n",
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    let sent = std::sync::atomic::AtomicBool::new(false);
    let pid = |p: &engine::experiment::sweep::Point| {
        std::fs::read_to_string(p.dir.join("pid"))
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
    };
    let agg = std::thread::scope(|s| {
        let sweep = s.spawn(|| {
            let pending = || {
                if stop.load(std::sync::atomic::Ordering::SeqCst)
                    && !sent.swap(true, std::sync::atomic::Ordering::SeqCst)
                {
                    vec![libc::SIGINT]
                } else {
                    Vec::new()
                }
            };
            engine::experiment::sweep::run(&sw, &waits, false, &stop, &pending).unwrap()
        });
        // Both points running (a bound, not a timing: the fakes start at once).
        for _ in 0..600 {
            if sw.points.iter().all(|p| pid(p).is_some()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        sweep.join().unwrap().0
    });
    for p in &agg.points {
        assert!(p.status.starts_with("stopped (exit 130"), "{}", p.status);
        let got = std::fs::read_to_string(p.point.dir.join("signals")).unwrap();
        assert_eq!(got, "INT\n", "{}", p.point.name);
        let pid = pid(&p.point).unwrap();
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "point {} left process {pid} running", p.point.name);
    }
}

#[test]
fn a_two_point_sweep_runs_both_points_and_aggregates_them() {
    if !common::is_root() {
        return;
    }
    let (root, f) = method_sweep_over(
        "method = \"dr\"\nbudget = 1.0\nmax_faults = 1\ncheckpoint_every = 0\n",
        TINY,
    );
    let st = common::TempState::new();
    let engine = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", st.path())
            .args(args)
            .arg(&f)
            .output()
            .unwrap()
    };
    let dry = engine(&["sweep", "--dry-run"]);
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        text.contains("method-dr") && text.contains("method-clean"),
        "{text}"
    );
    assert!(!root.path().join("out/sw/points").exists());
    let o = engine(&["sweep"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = root.path().join("out/sw");
    for p in ["method-dr", "method-clean"] {
        let r: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("points").join(p).join("report.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(r["complete"], true, "{p}: {r}");
        assert_eq!(r["method"], p.trim_start_matches("method-"));
    }
    let agg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    let points = agg["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for p in points {
        assert_eq!(p["status"], "done", "{p}");
        assert_eq!(
            p["held_out_clean"]["per_seed"].as_array().unwrap().len(),
            1,
            "{p}"
        );
        assert!(p["held_out_faulted"]["mean"].is_number(), "{p}");
    }
    assert!(dir.join("report.md").is_file() && dir.join("sweep.png").is_file());
    // --resume keeps both finished points.
    let o = engine(&["sweep", "--resume"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let agg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    assert!(
        agg["points"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"] == "kept"),
        "{agg}"
    );
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the comm may hold spaces, the last `)` ends it.
        let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
        if after.split_whitespace().nth(1) == Some(&pid.to_string()) {
            out.push(p);
        }
    }
    out
}

#[test]
fn two_ctrl_c_at_a_sweep_stop_its_points_wait_for_them_and_save_the_aggregate() {
    if !common::is_root() {
        return;
    }
    // Long runs: they are still running when the signals come.
    let (root, f) = method_sweep_over(
        "method = \"dr\"\nbudget = 1.0\nmax_faults = 1\ncheckpoint_every = 1\n",
        &TINY.replace("total_steps = 16", "total_steps = 100000"),
    );
    let st = common::TempState::new();
    let log = root.path().join("sweep.log");
    let mut sweep = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", st.path())
        .arg("sweep")
        .arg(&f)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let dir = root.path().join("out/sw");
    let points = ["method-dr", "method-clean"].map(|p| dir.join("points").join(p));
    assert!(
        sandbox::testing::eventually(300, || points
            .iter()
            .all(|p| p.join("seed-1/metrics.jsonl").is_file())),
        "the points did not start: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let kids = children_of(sweep.id());
    assert_eq!(kids.len(), 2, "{kids:?}");
    let pid = sweep.id() as i32;
    // SAFETY: kill(2) with integer arguments, to our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    // Both points heard of it (each says so in its log) before the second.
    let heard = |p: &PathBuf| {
        std::fs::read_to_string(p.join("log.txt"))
            .is_ok_and(|l| l.contains("stopping after the running episodes"))
    };
    assert!(sandbox::testing::eventually(60, || points
        .iter()
        .all(heard)));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = sweep.wait().unwrap();
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    let agg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    for p in agg["points"].as_array().unwrap() {
        assert!(
            p["status"].as_str().unwrap().starts_with("stopped"),
            "{p}\n{err}"
        );
    }
    for k in kids {
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(k, 0) } == 0;
        assert!(!alive, "point process {k} left running");
    }
}
