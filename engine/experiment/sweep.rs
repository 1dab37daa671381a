//! `engine sweep CONFIG.toml`: an ablation grid over a base self-play experiment. `[grid]`
//! maps experiment keys (`"selfplay.lambda" = [0.0, 0.5]`) to the values to try; every point
//! of their product is written as its own experiment (`points/<point>/experiment.toml`, the
//! base with the point's values, its name the point's and its output directory the point's
//! directory) and run by `engine run` in a child process, up to `parallel` at once. Before
//! anything runs, every key must be a key of the base experiment and every value of its type,
//! and every point must load as an experiment: errors name the sweep file and the key.
//! Each point runs in a process group of its own; each signal the sweep receives is passed on
//! to the running points once, as itself, and the sweep waits for them before it returns.
//! `--resume` keeps the points that finished (their file, `run.json`, every seed's result and
//! a complete report) and resumes the others from their checkpoints; it checks every point
//! before it writes anything. The aggregate (`sweep.json`, `report.md`, `sweep.png`) reads the
//! `report.json` of each point done or kept: held-out clean and faulted success, mean ± 95%
//! interval over seeds.

use super::config::{bad, default_out, load_named, resolve_template, Experiment};
use super::resume;
use super::study::{write, write_heatmap, write_json, PerSeed};
use super::ExperimentError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The `[sweep]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SweepTable {
    pub name: String,
    /// The base experiment (relative paths against the parent of this file's directory).
    pub base: PathBuf,
    /// Where `name/` goes (relative to the working directory).
    #[serde(default = "default_out")]
    pub out_dir: PathBuf,
    /// Points run at once (child processes).
    #[serde(default = "one")]
    pub parallel: usize,
    /// The seeds of every point (default: the base's `experiment.seeds`).
    pub seeds: Option<Vec<u64>>,
}

fn one() -> usize {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    sweep: SweepTable,
    grid: BTreeMap<String, Vec<toml::Value>>,
}

/// One point of the grid.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub name: String,
    /// The point's value of each grid key.
    pub values: BTreeMap<String, serde_json::Value>,
    /// The point's directory: its experiment file and its run.
    pub dir: PathBuf,
    #[serde(skip)]
    text: String,
}

impl Point {
    pub fn file(&self) -> PathBuf {
        self.dir.join("experiment.toml")
    }
}

/// A checked sweep: its table, its points.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub file: PathBuf,
    pub table: SweepTable,
    pub base: PathBuf,
    pub dir: PathBuf,
    pub points: Vec<Point>,
}

/// The kind of a JSON value, for the type check of grid values.
fn kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "absent",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

/// A value as it reads in a point's name: letters, digits, `.` and `-`.
fn label(v: &toml::Value) -> String {
    let s = match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Set dotted `key` in `table` to `v`, making the tables on the way.
fn set(table: &mut toml::Table, key: &str, v: toml::Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut t = table;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(next) = entry else {
            return;
        };
        t = next;
    }
    t.insert(last.to_string(), v);
}

impl Sweep {
    /// Load `file` and check it, its base and every point; nothing is written.
    pub fn load(file: &Path) -> Result<Self, ExperimentError> {
        let f: SweepFile = load_named(file, "sweep.name", |f: &SweepFile| &f.sweep.name)?;
        let table = f.sweep;
        if !(1..=64).contains(&table.parallel) {
            return Err(bad(file, "sweep.parallel", "between 1 and 64"));
        }
        if table.seeds.as_ref().is_some_and(Vec::is_empty) {
            return Err(bad(file, "sweep.seeds", "at least one seed"));
        }
        if f.grid.is_empty() {
            return Err(bad(file, "grid", "at least one key with values"));
        }
        // Canonical: the points' files (compared by `--resume`) do not depend on how the
        // sweep file's path was typed.
        let base = resolve_template(file, &table.base);
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        let base_exp =
            Experiment::load(&base).map_err(|e| bad(file, "sweep.base", e.to_string()))?;
        if base_exp.selfplay.is_none() {
            return Err(bad(
                file,
                "sweep.base",
                format!(
                    "{} has no [selfplay]: a sweep aggregates self-play reports",
                    base.display()
                ),
            ));
        }
        let full = serde_json::to_value(&base_exp)
            .map_err(|e| ExperimentError::SelfPlay(e.to_string()))?;
        for (key, values) in &f.grid {
            let gk = format!("grid.\"{key}\"");
            if matches!(key.as_str(), "experiment.name" | "experiment.out_dir") {
                return Err(bad(
                    file,
                    &gk,
                    "the sweep sets it (one name and directory per point)",
                ));
            }
            if values.is_empty() {
                return Err(bad(file, &gk, "no values"));
            }
            let mut at = &full;
            for part in key.split('.') {
                let Some(next) = at.as_object().and_then(|o| o.get(part)) else {
                    let keys = at
                        .as_object()
                        .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
                        .unwrap_or_default();
                    return Err(bad(
                        file,
                        &gk,
                        format!(
                            "no key `{part}` in the experiment{}",
                            if keys.is_empty() {
                                String::new()
                            } else {
                                format!(" (there: {keys})")
                            }
                        ),
                    ));
                };
                at = next;
            }
            let want = kind(at);
            for v in values {
                let got = serde_json::to_value(v)
                    .map_err(|e| ExperimentError::SelfPlay(e.to_string()))?;
                let ok = match (want, kind(&got)) {
                    ("absent", _) => true,
                    ("a number", "an integer") => true,
                    (w, g) => w == g,
                };
                if !ok {
                    return Err(bad(
                        file,
                        &gk,
                        format!(
                            "{v} is {}, the key takes {want} (the base has {at})",
                            kind(&got)
                        ),
                    ));
                }
            }
        }
        let dir = std::path::absolute(table.out_dir.join(&table.name)).map_err(|source| {
            ExperimentError::Output {
                dir: table.out_dir.clone(),
                source,
            }
        })?;
        let points_dir = dir.join("points");
        let base_text = crate::text::read_input(&base)?;
        let base_table: toml::Table =
            toml::from_str(&base_text).map_err(|e| bad(file, "sweep.base", e.to_string()))?;
        // The product of the grid, the last key varying fastest.
        let keys: Vec<&String> = f.grid.keys().collect();
        let mut combos: Vec<Vec<&toml::Value>> = vec![Vec::new()];
        for k in &keys {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    f.grid[*k].iter().map(move |v| {
                        let mut c = c.clone();
                        c.push(v);
                        c
                    })
                })
                .collect();
        }
        let mut points: Vec<Point> = Vec::new();
        for combo in combos {
            let mut name = keys
                .iter()
                .zip(&combo)
                .map(|(k, v)| format!("{}-{}", k.rsplit('.').next().unwrap_or(k), label(v)))
                .collect::<Vec<_>>()
                .join("_");
            if points.iter().any(|p| p.name == name) {
                name = format!("{name}_{}", points.len());
            }
            let pdir = points_dir.join(&name);
            let mut t = base_table.clone();
            for (k, v) in keys.iter().zip(&combo) {
                set(&mut t, k, (*v).clone());
            }
            set(&mut t, "experiment.name", toml::Value::String(name.clone()));
            set(
                &mut t,
                "experiment.out_dir",
                toml::Value::String(points_dir.display().to_string()),
            );
            // Template paths, the base's or a grid's, made absolute against the base file
            // (the point's file lives elsewhere).
            for key in ["environment.template", "training.eval_template"] {
                let (table, field) = key.split_once('.').unwrap_or((key, key));
                let Some(toml::Value::String(tpl)) = t.get(table).and_then(|v| v.get(field)) else {
                    continue;
                };
                let abs = resolve_template(&base, Path::new(tpl))
                    .display()
                    .to_string();
                set(&mut t, key, toml::Value::String(abs));
            }
            if let Some(seeds) = &table.seeds {
                set(
                    &mut t,
                    "experiment.seeds",
                    toml::Value::Array(
                        seeds
                            .iter()
                            .map(|&s| toml::Value::Integer(s as i64))
                            .collect(),
                    ),
                );
            }
            let body = toml::to_string(&t).map_err(|e| ExperimentError::SelfPlay(e.to_string()))?;
            let text = format!(
                "# Point {name} of sweep {} (written by `engine sweep`).\n{body}",
                table.name
            );
            let values: BTreeMap<String, serde_json::Value> = keys
                .iter()
                .zip(&combo)
                .map(|(k, v)| ((*k).clone(), serde_json::to_value(v).unwrap_or_default()))
                .collect();
            let point = Point {
                name,
                values,
                dir: pdir,
                text,
            };
            Experiment::parse(&point.text, &point.file()).map_err(|e| {
                let which = keys
                    .iter()
                    .zip(&combo)
                    .map(|(k, v)| format!("{k} = {v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                bad(
                    file,
                    "grid",
                    format!("the point {which} is not a valid experiment: {e}"),
                )
            })?;
            points.push(point);
        }
        Ok(Self {
            file: file.to_path_buf(),
            table,
            base,
            dir,
            points,
        })
    }

    /// What `--dry-run` prints.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}: {} points over {}, {} at a time; output {}\n",
            self.table.name,
            self.points.len(),
            self.base.display(),
            self.table.parallel,
            self.dir.display()
        );
        for p in &self.points {
            let v: Vec<String> = p.values.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            s.push_str(&format!(
                "  {}: {} -> {}\n",
                p.name,
                v.join(", "),
                p.file().display()
            ));
        }
        s
    }
}

/// One point's figures in the aggregate.
#[derive(Debug, Clone, Serialize)]
pub struct PointResult {
    #[serde(flatten)]
    pub point: Point,
    /// `done`, `kept` (finished before, `--resume`), `failed (exit N)`, `failed to start`,
    /// `incomplete` (stopped by a signal, or its run left no complete report), `not run`.
    pub status: String,
    pub held_out_clean: Option<PerSeed>,
    pub held_out_faulted: Option<PerSeed>,
}

/// `sweep.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Aggregate {
    pub name: String,
    pub base: PathBuf,
    pub keys: Vec<String>,
    pub points: Vec<PointResult>,
}

impl Aggregate {
    /// Every point finished.
    pub fn complete(&self) -> bool {
        self.points
            .iter()
            .all(|p| matches!(p.status.as_str(), "done" | "kept"))
    }
}

/// A point's report, when it finished.
fn finished(p: &Point) -> Option<serde_json::Value> {
    let v: serde_json::Value = resume::read_json(&p.dir.join("report.json")).ok()?;
    (v["complete"] == true).then_some(v)
}

/// A point finished before and can be kept by `--resume`: its file is the point's, its
/// run is of that file (`run.json`), every seed left its result and its report is complete.
fn keep(p: &Point) -> bool {
    let Ok(exp) = Experiment::parse(&p.text, &p.file()) else {
        return false;
    };
    resume::check(&p.dir, &exp).is_ok()
        && exp.experiment.seeds.iter().all(|s| {
            p.dir
                .join(format!("seed-{s}"))
                .join(super::selfplay::RESULT_FILE)
                .is_file()
        })
        && finished(p).is_some()
}

/// The running points; dropping them (an early return, a panic) stops and waits for them.
struct Children(Vec<(usize, std::process::Child)>);

impl Children {
    /// Send `sig` to every running point.
    fn signal(&self, sig: i32) {
        for (_, child) in &self.0 {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) with integer arguments, to our own child (not yet waited
                // for, so its pid is not reused).
                unsafe { libc::kill(pid, sig) };
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        for (_, child) in &mut self.0 {
            if let Err(e) = child.wait() {
                tracing::warn!(error = %e, pid = child.id(), "waiting for a point");
            }
        }
    }
}

/// Start point `p`'s `engine run` in a process group of its own (a signal from a terminal
/// reaches the sweep only, which passes it on once).
fn start(
    p: &Point,
    engine: &Path,
    resume_points: bool,
) -> Result<std::process::Child, std::io::Error> {
    use std::os::unix::process::CommandExt;
    // One open file for both streams (two opens would write over each other).
    let out = std::fs::File::create(p.dir.join("log.txt"))?;
    let err = out.try_clone()?;
    let mut c = std::process::Command::new(engine);
    c.arg("run");
    if resume_points && p.dir.join(resume::RUN_FILE).is_file() {
        c.arg("--resume");
    }
    c.arg(p.file())
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2) and
    // signal(2), which are async-signal-safe. A sweep that dies without passing a signal on
    // (SIGKILL, a crash) takes its points with it: a SIGTERM, on which they checkpoint and
    // stop. The signals the sweep passes on are reset to their default: the sweep catches them
    // even where they were ignored when it started (`nohup`: SIGHUP; `cmd &` in a script:
    // SIGINT), and a point inherits dispositions from it. `engine run` installs its own
    // handlers anyway; a point program that does not (a wrapper script, the tests' fakes: a
    // shell cannot even trap a signal ignored at its start) would never see them.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    c.spawn()
}

/// How `engine run` ends on a signal: killed by it, or exiting 128 + its number.
fn stopped_by_signal(st: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    st.signal().is_some() || st.code().is_some_and(|c| c > 128 && c < 160)
}

/// Run every point of `sw` with `engine` (this program: `engine run`), then aggregate.
/// Once `stop` is set no point starts; every signal `pending` returns is sent to the
/// running points (SIGINT as SIGINT: they checkpoint and stop), which are waited for. A
/// point that cannot start is recorded as such; the aggregate is always saved.
pub fn run(
    sw: &Sweep,
    engine: &Path,
    resume_points: bool,
    stop: &AtomicBool,
    pending: &dyn Fn() -> Vec<i32>,
) -> Result<(Aggregate, PathBuf), ExperimentError> {
    // Every check before anything is written: a refused --resume changes nothing.
    let mut status: Vec<String> = vec!["not run".into(); sw.points.len()];
    let mut queue: Vec<usize> = Vec::new();
    for (i, p) in sw.points.iter().enumerate() {
        let file = p.file();
        let same = std::fs::read_to_string(&file).is_ok_and(|t| t == p.text);
        if resume_points && same && keep(p) {
            tracing::info!(point = %p.name, "finished before: kept");
            status[i] = "kept".into();
            continue;
        }
        if resume_points && !same && file.exists() {
            return Err(ExperimentError::Resume {
                dir: p.dir.clone(),
                reason: format!(
                    "{} was written by another sweep configuration; nothing was changed",
                    file.display()
                ),
            });
        }
        queue.push(i);
    }
    let mkdir = |d: &Path| {
        std::fs::create_dir_all(d).map_err(|source| ExperimentError::Output {
            dir: d.to_path_buf(),
            source,
        })
    };
    mkdir(&sw.dir)?;
    // The sweep as it was run, beside its points.
    let text = crate::text::read_input(&sw.file)?;
    write(&sw.dir.join("sweep.toml"), text.as_bytes())?;
    // Write every point's file before the first runs (a refused write loses nothing).
    for &i in &queue {
        mkdir(&sw.points[i].dir)?;
        write(&sw.points[i].file(), sw.points[i].text.as_bytes())?;
    }
    let mut running = Children(Vec::new());
    let mut next = queue.into_iter();
    loop {
        for sig in pending() {
            running.signal(sig);
        }
        while running.0.len() < sw.table.parallel && !stop.load(Ordering::Relaxed) {
            let Some(i) = next.next() else { break };
            let p = &sw.points[i];
            tracing::info!(point = %p.name, "running");
            match start(p, engine, resume_points) {
                Ok(child) => {
                    eprintln!(
                        "sweep {}: point {} started (log {})",
                        sw.table.name,
                        p.name,
                        p.dir.join("log.txt").display()
                    );
                    running.0.push((i, child));
                }
                Err(e) => {
                    status[i] = format!("failed to start ({} run: {e})", engine.display());
                    tracing::warn!(point = %p.name, error = %e, "a point did not start");
                    eprintln!("sweep {}: point {} {}", sw.table.name, p.name, status[i]);
                }
            }
        }
        if running.0.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut still = Vec::new();
        for (i, mut child) in std::mem::take(&mut running.0) {
            match child.try_wait() {
                Ok(Some(st)) => {
                    status[i] = if st.success() && finished(&sw.points[i]).is_some() {
                        "done".into()
                    } else if st.success() {
                        "incomplete".into()
                    } else if stop.load(Ordering::Relaxed) && stopped_by_signal(&st) {
                        format!(
                            "stopped (exit {}; --resume goes on from its checkpoint)",
                            st.code().map_or("by a signal".into(), |c| c.to_string())
                        )
                    } else {
                        format!(
                            "failed (exit {}, see log.txt)",
                            st.code().map_or("by a signal".into(), |c| c.to_string())
                        )
                    };
                    eprintln!(
                        "sweep {}: point {} {}",
                        sw.table.name, sw.points[i].name, status[i]
                    );
                }
                Ok(None) => still.push((i, child)),
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for a point");
                    still.push((i, child));
                }
            }
        }
        running.0 = still;
    }
    let agg = aggregate(sw, status);
    save(&sw.dir, &agg)?;
    Ok((agg, sw.dir.join("report.md")))
}

fn per_seed(v: &serde_json::Value) -> Option<PerSeed> {
    let per: Vec<f64> = v["per_seed"]
        .as_array()?
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect();
    Some(PerSeed::of(per))
}

/// The aggregate of the points' reports.
pub fn aggregate(sw: &Sweep, status: Vec<String>) -> Aggregate {
    let points = sw
        .points
        .iter()
        .zip(status)
        .map(|(p, status)| {
            // Figures only of a point that finished in this sweep (a report left by an
            // earlier run is not this point's).
            let r = matches!(status.as_str(), "done" | "kept")
                .then(|| resume::read_json::<serde_json::Value>(&p.dir.join("report.json")).ok())
                .flatten();
            PointResult {
                point: p.clone(),
                status,
                held_out_clean: r.as_ref().and_then(|r| per_seed(&r["held_out_clean"])),
                held_out_faulted: r.as_ref().and_then(|r| per_seed(&r["held_out_faulted"])),
            }
        })
        .collect();
    Aggregate {
        name: sw.table.name.clone(),
        base: sw.base.clone(),
        keys: sw
            .points
            .first()
            .map(|p| p.values.keys().cloned().collect())
            .unwrap_or_default(),
        points,
    }
}

fn save(dir: &Path, a: &Aggregate) -> Result<(), ExperimentError> {
    write_json(&dir.join("sweep.json"), a)?;
    let mean = |p: &Option<PerSeed>| p.as_ref().map_or(f64::NAN, |p| p.mean);
    let rows: Vec<Vec<f64>> = a
        .points
        .iter()
        .map(|p| vec![mean(&p.held_out_clean), mean(&p.held_out_faulted)])
        .collect();
    write(&dir.join("report.md"), render(a).as_bytes())?;
    // Last; a grid too large to draw is skipped (the table has it).
    write_heatmap(&dir.join("sweep.png"), &rows)
}

/// `report.md`.
pub fn render(a: &Aggregate) -> String {
    let f = |p: &Option<PerSeed>| {
        p.as_ref().map_or("-".into(), |p| {
            format!("{:.3} ± {:.3} (n={})", p.mean, p.ci95, p.per_seed.len())
        })
    };
    let mut s = format!(
        "# Sweep {} over {}\n\nHeld-out success of each point's final protagonist, mean ± 95% Student-t interval over seeds (each point's `report.json`).\n\n| point | {} | status | clean | faulted |\n|---|{}---|---|---|\n",
        a.name,
        a.base.display(),
        a.keys.join(" | "),
        "---|".repeat(a.keys.len()),
    );
    for p in &a.points {
        let vals: Vec<String> = a
            .keys
            .iter()
            .map(|k| p.point.values.get(k).map_or("-".into(), |v| v.to_string()))
            .collect();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            p.point.name,
            vals.join(" | "),
            p.status,
            f(&p.held_out_clean),
            f(&p.held_out_faulted)
        ));
    }
    s.push_str("\n![the points (rows, in the table's order) x clean, faulted: red 0, yellow 0.5, green 1](sweep.png)\n");
    s
}
