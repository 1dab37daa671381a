//! `engine tournament CONFIG.toml`: the cross-play matrix of finished self-play runs. Rows
//! are the final PPO protagonists of the listed runs' seeds, with the catalogue oracle and
//! the random agent as reference rows; columns are those seeds' final adversaries, with
//! `clean` (no faults) and `dr` (uniform draws from the level space) as reference columns.
//! Every column proposes `levels` levels once (an adversary samples under its run's masks
//! and budget, from its saved weights), on the same held-out task seeds for every column,
//! and every row plays all of them: a cell is a success rate with its 95% Wilson interval.
//! The learned protagonists against every column are a zero-sum game (success the
//! protagonists' payoff): its Nash value and both mixtures (solved exactly, `nash.rs`), the
//! Nash-averaged scores, and Elo over every row and column as a secondary summary.
//!
//! The runs must share the level space: the same template (as written), budget, fault
//! limit, costs and environment settings; a mismatch names the run and the key.

use super::config::{bad, default_out, load_named, resolve_template, Experiment, SEED_STRIDE};
use super::nash::{self, Nash};
use super::resume;
use super::selfplay::{SeedReport, RESULT_FILE};
use super::study::{write, write_heatmap, write_json};
use super::ExperimentError;
use crate::agents::{Agent, Random};
use crate::env::EnvConfig;
use crate::instance::Plan;
use crate::learn::{self, LevelOutcome, PolicyMode};
use crate::roles::{AdversaryRole, FaultSpace, SpaceSettings};
use crate::synth::Cache;
use actors::msg::Level;
use actors::roles::Synthesizer;
use policies::ppo::PpoAgent;
use rand::SeedableRng;
use sandbox::Runtime;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the tournament's task seeds start in a seed's range (past training, validation,
/// held-out and faulted evaluation levels).
pub const TOURNAMENT_OFFSET: u64 = 900_000;

/// The `[tournament]` table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tournament {
    pub name: String,
    /// Where `name/` goes (relative to the working directory).
    #[serde(default = "default_out")]
    pub out_dir: PathBuf,
    /// The runs: their experiment files (relative paths against the parent of this file's
    /// directory, like templates); each must have finished in its `out_dir/name`.
    pub runs: Vec<PathBuf>,
    /// Levels per cell.
    #[serde(default = "sixteen")]
    pub levels: usize,
    /// Threads, each with its own `Env`.
    #[serde(default = "two")]
    pub workers: usize,
    /// Seeds the levels' task seeds and the `dr` draws.
    #[serde(default)]
    pub seed: u64,
}

fn sixteen() -> usize {
    16
}
fn two() -> usize {
    2
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TournamentFile {
    tournament: Tournament,
}

/// One cell: a row's episodes on a column's levels.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub successes: usize,
    /// Episodes counted (played to a verdict).
    pub counted: usize,
    /// Levels that could not be played (uncertified, not applicable).
    pub skipped: usize,
    /// Episodes the environment failed (not counted).
    pub infra: usize,
    pub rate: f64,
    /// The 95% Wilson interval of `rate`.
    pub lo: f64,
    pub hi: f64,
}

/// What a tournament measured (`matrix.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Matrix {
    pub name: String,
    pub levels: usize,
    pub rows: Vec<String>,
    pub cols: Vec<String>,
    /// `cells[row][col]`.
    pub cells: Vec<Vec<Cell>>,
    /// Rows of the game (the learned protagonists; the reference rows are left out).
    pub game_rows: Vec<String>,
    /// The game: the learned protagonists against every column. `None` when there is no
    /// learned protagonist, or a cell of the game counted no episode.
    pub nash: Option<Nash>,
    /// Each game row's success against the adversaries' Nash mixture.
    pub nash_averaged_rows: Vec<f64>,
    /// Each column's success conceded against the protagonists' Nash mixture (lower is a
    /// stronger adversary).
    pub nash_averaged_cols: Vec<f64>,
    pub elo_rows: Vec<f64>,
    pub elo_cols: Vec<f64>,
}

/// A loaded run: its experiment, directory, finished seeds.
struct Run {
    file: PathBuf,
    exp: Experiment,
    dir: PathBuf,
    seeds: Vec<SeedReport>,
}

/// A row: who plays.
enum Row {
    Policy {
        agent: Arc<PpoAgent>,
        mode: PolicyMode,
        seed: u64,
    },
    Oracle,
    Random,
}

impl Tournament {
    /// Load and check `[tournament]` (not the runs: [`run`] reads them before playing).
    pub fn load(file: &Path) -> Result<Self, ExperimentError> {
        let t: TournamentFile = load_named(file, "tournament.name", |t: &TournamentFile| {
            &t.tournament.name
        })?;
        let t = t.tournament;
        if t.runs.is_empty() {
            return Err(bad(file, "tournament.runs", "at least one run"));
        }
        if !(1..=100_000).contains(&t.levels) {
            return Err(bad(file, "tournament.levels", "between 1 and 100000"));
        }
        if !(1..=256).contains(&t.workers) {
            return Err(bad(file, "tournament.workers", "between 1 and 256"));
        }
        Ok(t)
    }
}

/// What of a run must agree with the other runs, by key.
fn level_space_identity(exp: &Experiment) -> Result<serde_json::Value, ExperimentError> {
    let js = |v: Result<serde_json::Value, serde_json::Error>| {
        v.map_err(|e| ExperimentError::SelfPlay(e.to_string()))
    };
    let mut tpl = js(serde_json::to_value(&exp.template))?;
    if let Some(t) = tpl.as_object_mut() {
        t.remove("file");
    }
    let sp = exp.selfplay.clone().unwrap_or_default();
    Ok(serde_json::json!({
        "environment.template": tpl,
        "selfplay.budget": sp.budget,
        "selfplay.max_faults": sp.max_faults,
        "selfplay.costs": sp.costs,
        "environment": js(serde_json::to_value(exp.env_config()?))?,
    }))
}

/// Read every run of `t` (from `file`): experiment, directory, finished seeds; the runs
/// must share the level space.
fn load_runs(t: &Tournament, file: &Path) -> Result<Vec<Run>, ExperimentError> {
    let mut runs: Vec<Run> = Vec::new();
    let mut first: Option<serde_json::Value> = None;
    for (i, path) in t.runs.iter().enumerate() {
        let key = format!("tournament.runs[{i}]");
        let run_file = resolve_template(file, path);
        let exp = Experiment::load(&run_file)
            .map_err(|e| bad(file, &key, format!("{}: {e}", run_file.display())))?;
        let Some(sp) = &exp.selfplay else {
            return Err(bad(
                file,
                &key,
                format!("{} has no [selfplay]", run_file.display()),
            ));
        };
        let id = level_space_identity(&exp)?;
        match &first {
            None => first = Some(id),
            Some(f0) => {
                if let Some((k, a, b)) = resume::first_difference(f0, &id, String::new()) {
                    return Err(bad(
                        file,
                        &key,
                        format!(
                            "{} does not share the level space of tournament.runs[0] ({}): key `{k}` is {b} here, {a} there",
                            run_file.display(),
                            t.runs[0].display()
                        ),
                    ));
                }
            }
        }
        let dir = exp.experiment.out_dir.join(&exp.experiment.name);
        resume::check(&dir, &exp).map_err(|e| bad(file, &key, e.to_string()))?;
        let mut seeds = Vec::new();
        for &s in &exp.experiment.seeds {
            let f = dir.join(format!("seed-{s}")).join(RESULT_FILE);
            if !f.is_file() {
                return Err(bad(
                    file,
                    &key,
                    format!(
                        "seed {s} of {} has not finished: no {}",
                        run_file.display(),
                        f.display()
                    ),
                ));
            }
            let r: SeedReport =
                resume::read_json(&f).map_err(|e| bad(file, &key, e.to_string()))?;
            seeds.push(r);
        }
        tracing::info!(run = %run_file.display(), method = %sp.method, seeds = seeds.len(), "run loaded");
        runs.push(Run {
            file: run_file,
            exp,
            dir,
            seeds,
        });
    }
    Ok(runs)
}

/// The level space of one seed of a run, with that seed's masks: its held-out families
/// and the settings its probe masked.
fn seed_space(run: &Run, s: &SeedReport) -> Result<FaultSpace, ExperimentError> {
    let sp = run.exp.selfplay.clone().unwrap_or_default();
    let tpl =
        run.exp.template.clone().ok_or_else(|| {
            ExperimentError::SelfPlay(format!("{}: no template", run.file.display()))
        })?;
    let settings = SpaceSettings {
        costs: sp.costs.clone(),
        budget: sp.budget,
        max_faults: sp.max_faults,
        seed_base: 0,
        seed_count: 1,
    };
    let mut space = FaultSpace::new(tpl, &settings)?;
    let n = space.space.dims.len();
    for (d, dim) in space.space.dims.clone().iter().enumerate() {
        for c in 1..dim.choices() {
            let mut choices = vec![0; n];
            choices[d] = c as u32;
            let label = space.space.describe(&Level { seed: 0, choices });
            if sp.held_out_faults.contains(&dim.name) || s.masked_settings.contains(&label) {
                space.forbid(d, c);
            }
        }
    }
    Ok(space)
}

/// The random agent reseeded by each level's task seed: its actions on a level do not
/// depend on which worker played it, and are the same in every column (the columns share
/// their task seeds).
struct LevelRandom {
    seed: u64,
    inner: Random,
}

impl Agent for LevelRandom {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn begin(
        &mut self,
        setup: &crate::instance::TaskSetup,
    ) -> Result<(), crate::agents::AgentError> {
        self.inner = Random::new(self.seed ^ setup.seed);
        self.inner.begin(setup)
    }
    fn act(
        &mut self,
        obs: &crate::env::Observation,
    ) -> Result<Option<crate::env::Action>, crate::agents::AgentError> {
        self.inner.act(obs)
    }
}

/// The 95% Wilson interval of `k` successes in `n`.
pub fn wilson(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let (z, n, p) = (1.96f64, n as f64, k as f64 / n as f64);
    let d = 1.0 + z * z / n;
    let c = (p + z * z / (2.0 * n)) / d;
    let h = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / d;
    ((c - h).max(0.0), (c + h).min(1.0))
}

fn cell(outcomes: &[LevelOutcome]) -> Cell {
    let e = learn::tally(outcomes);
    let counted = e.episodes - e.infra;
    let (lo, hi) = wilson(e.successes, counted);
    Cell {
        successes: e.successes,
        counted,
        skipped: e.skipped,
        infra: e.infra,
        rate: e.success_rate,
        lo,
        hi,
    }
}

/// Play the tournament of `file` and write `matrix.json`, `report.md` and `heatmap.png`
/// into `out_dir/name`; the matrix and the report's path.
pub fn run(file: &Path, rt: &Runtime, cache: &Cache) -> Result<(Matrix, PathBuf), ExperimentError> {
    let t = Tournament::load(file)?;
    let runs = load_runs(&t, file)?;
    let dir = t.out_dir.join(&t.name);
    std::fs::create_dir_all(&dir).map_err(|source| ExperimentError::Output {
        dir: dir.clone(),
        source,
    })?;
    let task_seeds: Vec<u64> = (0..t.levels as u64)
        .map(|k| {
            t.seed
                .wrapping_mul(SEED_STRIDE)
                .wrapping_add(TOURNAMENT_OFFSET)
                .wrapping_add(k)
        })
        .collect();
    let at_seeds = |levels: Vec<Level>| -> Vec<Level> {
        levels
            .into_iter()
            .zip(&task_seeds)
            .map(|(l, &seed)| Level { seed, ..l })
            .collect()
    };
    // Rows and columns; every seed's space with its masks, and their union for `dr`.
    let mut rows: Vec<(String, Row)> = Vec::new();
    let mut cols: Vec<(String, Vec<Level>)> = Vec::new();
    let mut union: Option<FaultSpace> = None;
    for run in &runs {
        let sp = run.exp.selfplay.clone().unwrap_or_default();
        let training = run.exp.training.clone().unwrap_or_default();
        let task = run.exp.template.as_ref().and_then(|t| t.task.as_deref());
        let adv = sp.adversary_settings(task.unwrap_or_default());
        for s in &run.seeds {
            let space = seed_space(run, s)?;
            let name = format!("{}/{}", run.exp.experiment.name, s.seed);
            let final_dir = run.dir.join(format!("seed-{}", s.seed)).join("final");
            let ppo = final_dir.join("protagonist").join("ppo");
            let agent = PpoAgent::load(&ppo).map_err(|e| {
                ExperimentError::SelfPlay(format!(
                    "{}: loading {}: {e}",
                    run.file.display(),
                    ppo.display()
                ))
            })?;
            rows.push((
                name.clone(),
                Row::Policy {
                    agent: Arc::new(agent),
                    mode: training.policy,
                    seed: s.seed,
                },
            ));
            let needs_adv = sp.method().is_some_and(|m| m.needs().adversaries);
            for k in 0..if needs_adv { sp.population } else { 0 } {
                let d = final_dir.join(format!("adversary-{k}"));
                let mut a = AdversaryRole::load(&d, &space.space, &adv)?;
                // Under the space's own (final) budget, as the held-out faulted levels are.
                let proposed = a
                    .propose(t.levels, space.space.budget)
                    .map_err(|e| ExperimentError::SelfPlay(format!("{}: {e}", d.display())))?;
                cols.push((
                    format!("{name}/adversary-{k}"),
                    at_seeds(proposed.into_iter().map(|p| p.level).collect()),
                ));
            }
            match &mut union {
                None => union = Some(space),
                Some(u) => {
                    for (d, dim) in space.space.dims.iter().enumerate() {
                        for (c, ok) in dim.allowed.iter().enumerate() {
                            if !ok {
                                u.forbid(d, c);
                            }
                        }
                    }
                }
            }
        }
    }
    let space = union.ok_or_else(|| bad(file, "tournament.runs", "no finished seed"))?;
    rows.push(("catalogue-oracle".into(), Row::Oracle));
    rows.push(("random".into(), Row::Random));
    let n_dims = space.space.dims.len();
    cols.push((
        "clean".into(),
        task_seeds
            .iter()
            .map(|&seed| Level {
                seed,
                choices: vec![0; n_dims],
            })
            .collect(),
    ));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t.seed ^ 0xd7);
    cols.push((
        "dr".into(),
        at_seeds(
            (0..t.levels)
                .map(|_| space.space.random(&mut rng))
                .collect(),
        ),
    ));
    // Every column's levels as plans, the columns one after the other.
    let plans: Vec<Plan> = cols
        .iter()
        .flat_map(|(_, ls)| ls.iter().map(|l| space.plan(l)))
        .collect();
    let env_cfg: EnvConfig = runs[0].exp.env_config()?;
    let mut cells = Vec::new();
    for (name, row) in &rows {
        tracing::info!(row = %name, levels = plans.len(), "playing");
        let make = || -> Box<dyn Agent> {
            match row {
                Row::Policy { agent, mode, seed } => learn::policy_agent(agent, *mode, *seed),
                Row::Oracle => learn::catalogue_oracle(),
                Row::Random => Box::new(LevelRandom {
                    seed: t.seed ^ 0x7a4d,
                    inner: Random::new(0),
                }),
            }
        };
        let outcomes = learn::evaluate_each(rt, cache, &env_cfg, &plans, t.workers, &make)?;
        cells.push(outcomes.chunks(t.levels).map(cell).collect::<Vec<Cell>>());
    }
    let game_n = rows
        .iter()
        .filter(|(_, r)| matches!(r, Row::Policy { .. }))
        .count();
    let game: Vec<Vec<f64>> = cells[..game_n]
        .iter()
        .map(|r| r.iter().map(|c| c.rate).collect())
        .collect();
    let solved = nash::solve(&game);
    let (nash_averaged_rows, nash_averaged_cols) = solved.as_ref().map_or_else(
        || (Vec::new(), Vec::new()),
        |g| {
            (
                nash::row_scores(&game, &g.cols),
                nash::col_scores(&game, &g.rows),
            )
        },
    );
    let wins: Vec<Vec<(usize, usize)>> = cells
        .iter()
        .map(|r| r.iter().map(|c| (c.successes, c.counted)).collect())
        .collect();
    let (elo_rows, elo_cols) = nash::elo(&wins);
    let m = Matrix {
        name: t.name.clone(),
        levels: t.levels,
        rows: rows.iter().map(|(n, _)| n.clone()).collect(),
        cols: cols.iter().map(|(n, _)| n.clone()).collect(),
        cells,
        game_rows: rows[..game_n].iter().map(|(n, _)| n.clone()).collect(),
        nash: solved,
        nash_averaged_rows,
        nash_averaged_cols,
        elo_rows,
        elo_cols,
    };
    save(&dir, &m)?;
    Ok((m, dir.join("report.md")))
}

fn save(dir: &Path, m: &Matrix) -> Result<(), ExperimentError> {
    write_json(&dir.join("matrix.json"), m)?;
    let rates: Vec<Vec<f64>> = m
        .cells
        .iter()
        .map(|r| r.iter().map(|c| c.rate).collect())
        .collect();
    write(&dir.join("report.md"), render(m).as_bytes())?;
    write_heatmap(&dir.join("heatmap.png"), &rates)
}

fn pct(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "-".into()
    }
}

/// `report.md`.
pub fn render(m: &Matrix) -> String {
    let mut s = format!(
        "# Tournament {}\n\nSuccess of each row (protagonist) on {} levels proposed by each column (adversary), the same held-out task seeds in every column; 95% Wilson interval in brackets, counted episodes after it when some level was skipped or failed.\n\n| protagonist \\ adversary | {} |\n|---|{}\n",
        m.name,
        m.levels,
        m.cols.join(" | "),
        "---|".repeat(m.cols.len())
    );
    for (name, row) in m.rows.iter().zip(&m.cells) {
        let cells: Vec<String> = row
            .iter()
            .map(|c| {
                let n = if c.counted < m.levels {
                    format!(" (n={})", c.counted)
                } else {
                    String::new()
                };
                format!("{} [{}, {}]{n}", pct(c.rate), pct(c.lo), pct(c.hi))
            })
            .collect();
        s.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    s.push_str("\n![the matrix: red 0, yellow 0.5, green 1; rows and columns as in the table](heatmap.png)\n\n");
    match &m.nash {
        Some(g) => {
            let mix = |names: &[String], p: &[f64]| {
                names
                    .iter()
                    .zip(p)
                    .filter(|(_, p)| **p > 1e-9)
                    .map(|(n, p)| format!("{n} {p:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            s.push_str(&format!(
                "## The game\n\nThe learned protagonists (rows {}) against every column, success the protagonists' payoff (zero-sum; the reference rows are left out: the oracle is privileged, the random agent does not learn).\n\n- Nash value: **{:.3}** (duality gap {:.1e}; an exact simplex solve)\n- protagonists' mixture: {}\n- adversaries' mixture: {}\n\nNash-averaged scores (against the other side's Nash mixture):\n\n| player | score |\n|---|---|\n",
                m.game_rows.join(", "),
                g.value,
                g.gap,
                mix(&m.game_rows, &g.rows),
                mix(&m.cols, &g.cols),
            ));
            for (n, v) in m.game_rows.iter().zip(&m.nash_averaged_rows) {
                s.push_str(&format!("| {n} (success vs the adversaries' mixture) | {v:.3} |\n"));
            }
            for (n, v) in m.cols.iter().zip(&m.nash_averaged_cols) {
                s.push_str(&format!("| {n} (success conceded vs the protagonists' mixture) | {v:.3} |\n"));
            }
        }
        None => s.push_str("## The game\n\nNot solved: no learned protagonist, or a cell of the game counted no episode.\n"),
    }
    s.push_str("\n## Elo (secondary)\n\nA Bradley-Terry fit over every episode (the protagonist wins on success), mean 1000:\n\n| player | Elo |\n|---|---|\n");
    for (n, e) in m
        .rows
        .iter()
        .zip(&m.elo_rows)
        .chain(m.cols.iter().zip(&m.elo_cols))
    {
        s.push_str(&format!("| {n} | {e:.0} |\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_random_row_acts_on_a_level_as_its_task_seed_says() {
        let setup = |seed| crate::instance::TaskSetup {
            task: "t".into(),
            seed,
            instruction: String::new(),
            cwd: "/".into(),
            actions: (0..50).map(|i| format!("a{i}")).collect(),
            action_costs: Vec::new(),
            keywords: Vec::new(),
            max_steps: 10,
            facts: serde_json::Value::Null,
        };
        let actions = |agent: &mut LevelRandom, seed| {
            agent.begin(&setup(seed)).unwrap();
            (0..8)
                .map(|_| agent.act(&Default::default()).unwrap())
                .collect::<Vec<_>>()
        };
        let fresh = || LevelRandom {
            seed: 1,
            inner: Random::new(0),
        };
        // One worker played level 7 first, another plays level 9 first: the same actions.
        let mut a = fresh();
        actions(&mut a, 7);
        let mut b = fresh();
        assert_eq!(actions(&mut a, 9), actions(&mut b, 9));
        assert_ne!(actions(&mut a, 9), actions(&mut b, 10));
    }

    #[test]
    fn wilson_intervals_hold_the_rate_and_stay_in_bounds() {
        let (lo, hi) = wilson(8, 10);
        assert!(lo < 0.8 && 0.8 < hi && lo > 0.4 && hi < 0.97, "{lo} {hi}");
        let (lo, hi) = wilson(0, 16);
        assert!(lo == 0.0 && hi > 0.1 && hi < 0.25, "{lo} {hi}");
        assert!(wilson(0, 0).0.is_nan());
    }
}
