//! The experiment config (`experiments/*.toml`): loading and validation (errors located
//! through the template's positioned tree), the plan of every episode, and the `Env`
//! configuration of the workers.

use super::ExperimentError;
use crate::env::{EnvConfig, EnvError, RewardConfig};
use crate::instance::Plan;
use crate::template::tree::{line_col, toml_tree, NodeValue};
use crate::template::Template;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Plan seeds of seed `s` start at `s * SEED_STRIDE`.
pub const SEED_STRIDE: u64 = 1_000_003;
/// The most episodes per seed (and per instance) a config may ask for.
/// At most the seed stride, so the plans of two seeds never meet.
pub const MAX_EPISODES: usize = SEED_STRIDE as usize;
/// The most steps of a training run (`total_steps`, `baseline_steps`).
pub const MAX_STEPS: u64 = 1_000_000_000_000;
/// The most of any other count of `[training]` (steps per rollout, levels, epochs).
pub const MAX_COUNT: usize = 1_000_000;
/// The most seeds of one experiment.
pub const MAX_SEEDS: usize = 10_000;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub experiment: Meta,
    pub environment: Environment,
    /// The reward (`engine::env::RewardConfig`); potential-based by default.
    #[serde(default)]
    pub reward: RewardConfig,
    /// PPO training (a study: train per task and seed, evaluate on held-out levels). Without
    /// it the experiment runs `environment.agent`'s episodes.
    pub training: Option<Training>,
    /// Self-play (`engine::experiment::selfplay`): the schedule, the adversaries, the level
    /// space; the protagonist's PPO settings are `[training]`'s.
    pub selfplay: Option<super::selfplay_config::SelfPlay>,
    /// The language model of `environment.agent = "llm"` (`engine::agents::LlmConfig`).
    pub llm: Option<crate::agents::LlmConfig>,
    /// The loaded template, when `environment.template` is given (path resolved).
    #[serde(skip)]
    pub template: Option<Template>,
    /// The loaded `training.eval_template`.
    #[serde(skip)]
    pub eval_template: Option<Template>,
}

/// The `[training]` table: PPO on each task's levels (the unperturbed task, or the
/// environment's template: domain randomisation), one policy per task and seed, evaluated
/// greedily on held-out levels beside the task's catalogue oracle.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Training {
    /// Tasks to train on, one after the other (default: the environment's task).
    pub tasks: Vec<String>,
    /// Environment steps per task and seed.
    pub total_steps: u64,
    /// Vectorised environments (stepped on `environment.workers` threads).
    pub num_envs: usize,
    /// Steps per environment per rollout.
    pub num_steps: usize,
    pub learning_rate: f64,
    pub update_epochs: usize,
    pub num_minibatches: usize,
    /// The learner's discount; the potential-based reward uses the same.
    pub gamma: f64,
    pub gae_lambda: f64,
    pub ent_coef: f64,
    pub hidden: Vec<usize>,
    /// Distinct training levels (plan seeds `seed * SEED_STRIDE + k`).
    pub train_levels: usize,
    /// Consecutive episodes on one level (they share its sandbox).
    pub episodes_per_level: usize,
    /// Held-out levels (plan seeds from `seed * SEED_STRIDE + 500_000`), one greedy episode each.
    pub eval_levels: usize,
    /// Also evaluate on levels sampled from this template (faults of the task), e.g. the
    /// robustness gap of a policy trained on clean instances.
    pub eval_template: Option<PathBuf>,
    /// Environment steps of the random agent's throughput baseline.
    pub baseline_steps: u64,
    /// How the trained policy acts in checks and evaluations: `sampled` (from its action
    /// distribution, as in training) or `greedy` (its most likely action). Held-out levels
    /// are also played greedily when it is `sampled`, for the report's greedy column.
    pub policy: crate::learn::PolicyMode,
    /// Environment steps between checks on validation levels (0: no checks).
    pub check_every: u64,
    /// Validation levels the checks play (plan seeds from `seed * SEED_STRIDE + 400_000`:
    /// neither training nor held-out levels).
    pub check_levels: usize,
    /// Stop training at the first check whose success rate reaches this (none: spend the
    /// whole budget). Checks play validation levels, never held-out ones.
    pub stop_success: Option<f64>,
}

impl Default for Training {
    fn default() -> Self {
        Self {
            tasks: Vec::new(),
            total_steps: 20_000,
            num_envs: 8,
            num_steps: 32,
            learning_rate: 1e-3,
            update_epochs: 4,
            num_minibatches: 4,
            gamma: 0.99,
            gae_lambda: 0.95,
            ent_coef: 0.01,
            hidden: vec![64, 64],
            train_levels: 64,
            episodes_per_level: 4,
            eval_levels: 50,
            eval_template: None,
            baseline_steps: 1024,
            policy: crate::learn::PolicyMode::Sampled,
            check_every: 1024,
            check_levels: 16,
            stop_success: None,
        }
    }
}

/// Plan seeds of validation levels (the checks during training) start this far into a
/// seed's range.
pub const VALIDATION_OFFSET: u64 = 400_000;
/// Plan seeds of held-out levels start this far into a seed's range.
pub const HELD_OUT_OFFSET: u64 = 500_000;
/// Plan seeds of faulted evaluation levels start this far into a seed's range.
pub const FAULTED_OFFSET: u64 = 700_000;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub name: String,
    pub seeds: Vec<u64>,
    /// Where the report goes (relative to the working directory).
    #[serde(default = "default_out")]
    pub out_dir: PathBuf,
}

/// The default `out_dir` (of experiments, tournaments and sweeps).
pub(super) fn default_out() -> PathBuf {
    PathBuf::from("out")
}

/// Who acts in the episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    /// Uniformly random actions of the task's catalogue (seeded per episode).
    Random,
    /// The task's oracle solution.
    Oracle,
    /// The task's reactive catalogue oracle (catalogue actions only).
    CatalogueOracle,
    /// A language model behind an OpenAI-compatible endpoint (the `[llm]` table).
    Llm,
}

impl Agent {
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Oracle => "oracle",
            Self::CatalogueOracle => "catalogue-oracle",
            Self::Llm => "llm",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// A template file (TOML or YAML); a relative path is resolved against the parent of the
    /// experiment file's directory (the project root for `experiments/*.toml`).
    pub template: Option<PathBuf>,
    /// A task family: the unperturbed task, or the task of a template that names none.
    pub task: Option<String>,
    /// Episodes per seed (not used by a training study).
    #[serde(default)]
    pub episodes: usize,
    /// Consecutive episodes that share one instance (and its sandbox, reset incrementally).
    #[serde(default = "one")]
    pub episodes_per_instance: usize,
    /// Threads, each with its own `Env`.
    #[serde(default = "two")]
    pub workers: usize,
    #[serde(default = "random")]
    pub agent: Agent,
    /// Skip (and count) instances whose oracle certificate says they are not solvable.
    #[serde(default = "yes")]
    pub require_certified: bool,
    /// Overrides the task's step limit.
    pub max_steps: Option<u32>,
    /// Wall-clock limit of one command, e.g. "10s".
    pub step_timeout: Option<String>,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn random() -> Agent {
    Agent::Random
}
fn yes() -> bool {
    true
}

/// Where `key` (`table.key`, or a top-level key) is set in the config `text`, as a 1-based
/// (line, column): the key itself, or where its table starts when the key is absent, or 1:1
/// when the table is absent too, or when the text has no positioned tree (the tree's TOML
/// reader takes no dotted keys such as `reward.mode = ...`).
fn locate(text: &str, key: &str) -> (usize, usize) {
    let Ok(root) = toml_tree(text) else {
        return (1, 1);
    };
    let (mut node, mut at) = (&root, root.pos);
    let mut parts = key.split('.').peekable();
    while let (Some(part), NodeValue::Map(entries)) = (parts.next(), &node.value) {
        let Some((_, key_pos, value)) = entries.iter().find(|(k, _, _)| k == part) else {
            break;
        };
        at = if parts.peek().is_some() {
            value.pos
        } else {
            *key_pos
        };
        node = value;
    }
    (at.line, at.col)
}

impl Experiment {
    /// Load and validate; errors name the file, line, column, key and reason.
    pub fn load(file: &Path) -> Result<Self, ExperimentError> {
        let text = crate::text::read_input(file)?;
        Self::parse(&text, file)
    }

    /// Parse and validate the text of `file` (which locates the template and names errors).
    pub fn parse(text: &str, file: &Path) -> Result<Self, ExperimentError> {
        let mut exp: Experiment = parse_toml(text, file)?;
        let invalid = |key: &'static str, reason: String| {
            let (line, column) = locate(text, key);
            ExperimentError::Invalid {
                file: file.into(),
                line,
                column,
                key,
                reason,
            }
        };
        if exp.experiment.seeds.is_empty() {
            return Err(invalid("experiment.seeds", "at least one seed".into()));
        }
        if exp.experiment.seeds.len() > MAX_SEEDS {
            return Err(invalid(
                "experiment.seeds",
                format!(
                    "at most {MAX_SEEDS} seeds, not {}",
                    exp.experiment.seeds.len()
                ),
            ));
        }
        if !dir_name_ok(&exp.experiment.name) {
            return Err(invalid(
                "experiment.name",
                "a name of 1 to 255 bytes without `/` that does not start with `.` (it names the report's directory)".into(),
            ));
        }
        let env = &exp.environment;
        if (env.episodes == 0 && exp.training.is_none() && exp.selfplay.is_none())
            || env.episodes > MAX_EPISODES
        {
            return Err(invalid(
                "environment.episodes",
                format!("between 1 and {MAX_EPISODES}, not {}", env.episodes),
            ));
        }
        if !(1..=MAX_EPISODES).contains(&env.episodes_per_instance) {
            return Err(invalid(
                "environment.episodes_per_instance",
                format!(
                    "between 1 and {MAX_EPISODES}, not {}",
                    env.episodes_per_instance
                ),
            ));
        }
        if !(1..=64).contains(&env.workers) {
            return Err(invalid(
                "environment.workers",
                format!("between 1 and 64, not {}", env.workers),
            ));
        }
        if env.max_steps == Some(0) {
            return Err(invalid("environment.max_steps", "at least 1".into()));
        }
        if let Some(t) = &env.step_timeout {
            // In range (1ms..=30 days) or an error: the conversion to milliseconds is exact.
            crate::units::parse_duration(t)
                .map_err(|e| invalid("environment.step_timeout", e.to_string()))?;
        }
        match (&exp.llm, env.agent) {
            (None, Agent::Llm) => {
                return Err(invalid(
                    "environment.agent",
                    "`llm` needs an `[llm]` table (base_url, model)".into(),
                ))
            }
            (Some(_), a) if a != Agent::Llm => {
                return Err(invalid(
                    "llm",
                    format!("an `[llm]` table, but the agent is `{}`", a.name()),
                ))
            }
            (Some(l), _) => {
                l.settings()
                    .and_then(|_| l.api_key())
                    .map_err(|e| match e {
                        crate::agents::llm::LlmError::Config { key, reason } => {
                            invalid(key, reason)
                        }
                        e => invalid("llm", e.to_string()),
                    })?;
            }
            (None, _) => {}
        }
        if let Some(task) = &env.task {
            if crate::tasks::get(task).is_none() {
                return Err(invalid(
                    "environment.task",
                    format!(
                        "unknown task `{task}` (known: {})",
                        crate::tasks::names().join(", ")
                    ),
                ));
            }
        }
        match (&env.template, &env.task) {
            (None, None) => {
                return Err(invalid(
                    "environment.template",
                    "give a `template` (a file) or a `task` (the unperturbed task)".into(),
                ))
            }
            (Some(t), task) => {
                let path = resolve_template(file, t);
                if !path.is_file() {
                    return Err(invalid(
                        "environment.template",
                        format!(
                            "no template file at {} (a relative path is resolved against the parent of the experiment file's directory)",
                            path.display()
                        ),
                    ));
                }
                let tpl = Template::load(&path)
                    .map_err(|e| invalid("environment.template", e.to_string()))?;
                match (&tpl.task, task) {
                    (None, None) => {
                        return Err(invalid(
                            "environment.template",
                            format!(
                                "the template {} names no task: give `environment.task`",
                                path.display()
                            ),
                        ))
                    }
                    (Some(a), Some(b)) if a != b => {
                        return Err(invalid(
                            "environment.task",
                            format!("`{b}` conflicts with the template's task `{a}`"),
                        ))
                    }
                    _ => {}
                }
                exp.template = Some(tpl);
            }
            (None, Some(_)) => {}
        }
        if let Err(EnvError::BadReward { field, reason }) = exp.reward.validate() {
            let key = match field {
                "goal" => "reward.goal",
                "step" => "reward.step",
                "error" => "reward.error",
                "irrelevant" => "reward.irrelevant",
                "success" => "reward.success",
                "potential" => "reward.potential",
                _ => "reward.gamma",
            };
            return Err(invalid(key, reason));
        }
        if exp.selfplay.is_some() && exp.training.is_none() {
            // The protagonist's settings default like a study's.
            exp.training = Some(Training::default());
        }
        if let Some(t) = exp.training.clone() {
            exp.check_training(&t, file, &invalid)?;
        }
        if let Some(s) = &exp.selfplay {
            super::selfplay_config::check(&exp, s, &invalid)?;
        }
        exp.env_config()
            .map_err(|e| invalid("reward", e.to_string()))?;
        Ok(exp)
    }

    /// Validate `[training]` (and load its evaluation template).
    fn check_training(
        &mut self,
        t: &Training,
        file: &Path,
        invalid: &dyn Fn(&'static str, String) -> ExperimentError,
    ) -> Result<(), ExperimentError> {
        if self.reward.mode == crate::env::RewardMode::Shaped {
            return Err(invalid(
                "reward.mode",
                "`shaped` pays more for repeating a harmless command than for solving (see `engine task check --rewards --reward-mode shaped`); train with `potential` or `sparse`".into(),
            ));
        }
        if (self.reward.gamma - t.gamma).abs() > 1e-12 {
            return Err(invalid(
                "reward.gamma",
                format!(
                    "{} differs from training.gamma {}: potential-based shaping keeps the optimal policies only under the learner's own discount",
                    self.reward.gamma, t.gamma
                ),
            ));
        }
        for task in &t.tasks {
            if crate::tasks::get(task).is_none() {
                return Err(invalid(
                    "training.tasks",
                    format!(
                        "unknown task `{task}` (known: {})",
                        crate::tasks::names().join(", ")
                    ),
                ));
            }
        }
        if self.template.is_some() && t.tasks.iter().any(|x| x != self.task()) {
            return Err(invalid(
                "training.tasks",
                format!(
                    "a template's study trains its own task `{}` only",
                    self.task()
                ),
            ));
        }
        for (key, ok, what) in [
            (
                "training.total_steps",
                (1..=MAX_STEPS).contains(&t.total_steps),
                "between 1 and 10^12",
            ),
            (
                "training.baseline_steps",
                t.baseline_steps <= MAX_STEPS,
                "at most 10^12",
            ),
            (
                "training.num_envs",
                (1..=256).contains(&t.num_envs),
                "between 1 and 256",
            ),
            (
                "training.num_steps",
                (1..=MAX_COUNT).contains(&t.num_steps),
                "between 1 and 1000000",
            ),
            (
                "training.train_levels",
                (1..=VALIDATION_OFFSET as usize).contains(&t.train_levels),
                "between 1 and 400000 (more would reach the validation levels' plan seeds)",
            ),
            (
                "training.eval_levels",
                (1..=(FAULTED_OFFSET - HELD_OUT_OFFSET) as usize).contains(&t.eval_levels),
                "between 1 and 200000 (more would reach the faulted levels' plan seeds)",
            ),
            (
                "training.num_steps",
                t.num_envs.saturating_mul(t.num_steps) <= 1 << 22,
                "num_envs * num_steps at most 4194304 samples per rollout",
            ),
            (
                "training.episodes_per_level",
                (1..=MAX_COUNT).contains(&t.episodes_per_level),
                "between 1 and 1000000",
            ),
            (
                "training.update_epochs",
                t.update_epochs <= MAX_COUNT,
                "at most 1000000",
            ),
            (
                "training.hidden",
                (1..=16).contains(&t.hidden.len())
                    && t.hidden.iter().all(|h| (1..=65_536).contains(h)),
                "1 to 16 hidden layer widths, each in 1..=65536",
            ),
            (
                "training.check_every",
                t.check_every <= MAX_STEPS,
                "at most 10^12 (0: no checks)",
            ),
            (
                "training.check_levels",
                t.check_levels <= (HELD_OUT_OFFSET - VALIDATION_OFFSET) as usize,
                "at most 100000 (more would reach the held-out levels' plan seeds)",
            ),
            (
                "training.stop_success",
                t.stop_success
                    .is_none_or(|x| x > 0.0 && x <= 1.0 && t.check_every > 0 && t.check_levels > 0),
                "in (0, 1], with check_every and check_levels above 0 (it is judged at the checks)",
            ),
            (
                "training.num_minibatches",
                t.num_minibatches > 0
                    && t.num_envs
                        .checked_mul(t.num_steps)
                        .is_some_and(|n| n.is_multiple_of(t.num_minibatches)),
                "at least 1, dividing num_envs * num_steps",
            ),
        ] {
            if !ok {
                return Err(invalid(key, what.into()));
            }
        }
        self.ppo_config(t)
            .validate()
            .map_err(|e| invalid("training", e.to_string()))?;
        if let Some(path) = &t.eval_template {
            let path = resolve_template(file, path);
            let tpl = Template::load(&path)
                .map_err(|e| invalid("training.eval_template", e.to_string()))?;
            self.eval_template = Some(tpl);
        }
        Ok(())
    }

    /// The PPO hyper-parameters of `[training]`.
    pub fn ppo_config(&self, t: &Training) -> policies::ppo::PpoConfig {
        policies::ppo::PpoConfig {
            num_envs: t.num_envs,
            num_steps: t.num_steps,
            learning_rate: t.learning_rate,
            update_epochs: t.update_epochs,
            num_minibatches: t.num_minibatches,
            gamma: t.gamma,
            gae_lambda: t.gae_lambda,
            ent_coef: t.ent_coef,
            ..policies::ppo::PpoConfig::default()
        }
    }

    /// The tasks of a training study.
    pub fn training_tasks(&self) -> Vec<String> {
        match &self.training {
            Some(t) if !t.tasks.is_empty() => t.tasks.clone(),
            _ => vec![self.task().to_string()],
        }
    }

    /// The plan of level `k` of seed `seed` at `offset` of its range: the template's sample,
    /// or the unperturbed `task`.
    pub fn level(
        &self,
        task: &str,
        seed: u64,
        offset: u64,
        k: u64,
        template: Option<&Template>,
    ) -> Plan {
        let s = seed
            .wrapping_mul(SEED_STRIDE)
            .wrapping_add(offset)
            .wrapping_add(k);
        match template {
            Some(t) => {
                let mut p = t.sample(s);
                if p.task.is_none() {
                    p.task = Some(crate::instance::TaskRef {
                        name: task.to_string(),
                        seed: s,
                    });
                }
                p
            }
            None => Plan::for_task(task, s, vec![]),
        }
    }

    /// The task of the episodes.
    pub fn task(&self) -> &str {
        self.environment
            .task
            .as_deref()
            .or_else(|| self.template.as_ref().and_then(|t| t.task.as_deref()))
            .unwrap_or_default()
    }

    /// The plan of episode `episode` of seed `seed`.
    pub fn plan(&self, seed: u64, episode: usize) -> Plan {
        let k = self.environment.episodes_per_instance.max(1);
        self.level(
            self.task(),
            seed,
            0,
            (episode / k) as u64,
            self.template.as_ref(),
        )
    }

    /// The configuration of every worker's `Env`.
    pub fn env_config(&self) -> Result<EnvConfig, EnvError> {
        let e = &self.environment;
        let mut c = EnvConfig {
            reward: self.reward.clone(),
            max_steps: e.max_steps,
            require_certified: e.require_certified,
            ..EnvConfig::default()
        };
        if let Some(t) = &e.step_timeout {
            // Checked at parse; the default stays if an unchecked config slips through.
            if let Ok(d) = crate::units::parse_duration(t) {
                c.step_timeout_ms = d.as_millis().max(1) as u64;
            }
        }
        // Reject what Env would reject (bad dangerous-command patterns cannot occur today).
        for p in &c.dangerous {
            regex::Regex::new(p).map_err(|source| EnvError::BadPattern {
                pattern: p.clone(),
                source,
            })?;
        }
        Ok(c)
    }
}

/// `text` (of `file`) as TOML into `T`; a syntax or shape error names the file, line and
/// column.
pub(super) fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &Path,
) -> Result<T, ExperimentError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
        ExperimentError::Parse {
            file: file.into(),
            line,
            column,
            message: e.message().to_string(),
        }
    })
}

/// A configuration error at `file`'s `key` (tournaments, sweeps).
pub(super) fn bad(
    file: &Path,
    key: impl Into<String>,
    reason: impl Into<String>,
) -> ExperimentError {
    ExperimentError::config(file, key, reason)
}

/// Read and parse `file` (a tournament or a sweep) and check that its name (`key`, which
/// `name` picks) names an output directory.
pub(super) fn load_named<T: serde::de::DeserializeOwned>(
    file: &Path,
    key: &str,
    name: impl Fn(&T) -> &str,
) -> Result<T, ExperimentError> {
    let text = crate::text::read_input(file)?;
    let t: T = parse_toml(&text, file)?;
    if !dir_name_ok(name(&t)) {
        return Err(bad(
            file,
            key,
            "1 to 255 bytes without `/` that do not start with `.` (it names the output directory)",
        ));
    }
    Ok(t)
}

/// A name that names a directory: 1 to 255 bytes, no `/`, not starting with `.`.
pub(super) fn dir_name_ok(name: &str) -> bool {
    !(name.is_empty() || name.len() > 255 || name.contains(['/', '\0']) || name.starts_with('.'))
}

/// A template path of an experiment file: absolute as given, else relative to the parent of
/// the experiment file's directory (`experiments/rarl.toml` -> the project root).
pub fn resolve_template(experiment_file: &Path, template: &Path) -> PathBuf {
    if template.is_absolute() {
        return template.to_path_buf();
    }
    let file = std::path::absolute(experiment_file).unwrap_or_else(|_| experiment_file.into());
    let root = file
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    root.join(template)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
[experiment]
name = "t"
seeds = [1, 2]

[environment]
task = "archive-logs"
episodes = 2
"#;

    fn err(text: &str) -> String {
        Experiment::parse(text, Path::new("exp.toml"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_valid_config_parses_with_defaults() {
        let e = Experiment::parse(OK, Path::new("x.toml")).unwrap();
        assert_eq!(e.environment.workers, 2);
        assert_eq!(e.environment.agent, Agent::Random);
        assert!(e.environment.require_certified);
        assert_eq!(e.environment.episodes_per_instance, 1);
        assert_eq!(e.reward, RewardConfig::default());
        assert_eq!(e.task(), "archive-logs");
        let c = e.env_config().unwrap();
        assert!(c.require_certified);
        assert_eq!(c.max_steps, None);
    }

    #[test]
    fn options_reach_the_env_config() {
        let text = OK.replace(
            "episodes = 2",
            "episodes = 2\nmax_steps = 7\nstep_timeout = \"3s\"\nagent = \"oracle\"\nrequire_certified = false\n[reward]\nmode = \"sparse\"\ngoal = 5.0",
        );
        let e = Experiment::parse(&text, Path::new("x.toml")).unwrap();
        let c = e.env_config().unwrap();
        assert_eq!(c.max_steps, Some(7));
        assert_eq!(c.step_timeout_ms, 3000);
        assert!(!c.require_certified);
        assert_eq!(c.reward.mode, crate::env::RewardMode::Sparse);
        assert_eq!(c.reward.goal, 5.0);
        assert_eq!(e.environment.agent, Agent::Oracle);
    }

    #[test]
    fn training_and_held_out_levels_never_share_plan_seeds() {
        let t = |extra: &str| format!("{OK}[training]\n{extra}\n");
        assert!(Experiment::parse(&t("train_levels = 400000"), Path::new("exp.toml")).is_ok());
        let e = err(&t("train_levels = 400001"));
        assert!(
            e.contains("training.train_levels") && e.contains("validation"),
            "{e}"
        );
        let e = err(&t("check_levels = 100001"));
        assert!(
            e.contains("training.check_levels") && e.contains("held-out"),
            "{e}"
        );
        let e = err(&t("eval_levels = 200001"));
        assert!(
            e.contains("training.eval_levels") && e.contains("faulted"),
            "{e}"
        );
        let e = err(&t("num_envs = 256\nnum_steps = 100000"));
        assert!(e.contains("4194304"), "{e}");
        let e = err(&t("gamma = 0.9"));
        assert!(e.contains("reward.gamma"), "{e}");
        let e = err(&format!(
            "{OK}[reward]\nmode = \"shaped\"\nsuccess = 10.0\n[training]\n"
        ));
        assert!(e.contains("reward.mode") && e.contains("shaped"), "{e}");
    }

    #[test]
    fn errors_name_file_line_key_and_reason() {
        let e = err(&OK.replace("episodes = 2", "episodes = 2\ncuont = 3"));
        assert!(e.starts_with("exp.toml:9:1: unknown field `cuont`"), "{e}");
        let e = err(&OK.replace("seeds = [1, 2]", "seeds = []"));
        assert_eq!(e, "exp.toml:4:1: key `experiment.seeds`: at least one seed");
        let e = err(&OK.replace("episodes = 2", "episodes = 0"));
        assert_eq!(
            e,
            "exp.toml:8:1: key `environment.episodes`: between 1 and 1000003, not 0"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\nworkers = 65"));
        assert_eq!(
            e,
            "exp.toml:9:1: key `environment.workers`: between 1 and 64, not 65"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\n  workers = 0"));
        assert!(
            e.starts_with("exp.toml:9:3: key `environment.workers`"),
            "{e}"
        );
        let e = err(&OK.replace("archive-logs", "archive-log"));
        assert!(
            e.starts_with("exp.toml:7:1: key `environment.task`: unknown task `archive-log`")
                && e.contains("archive-logs"),
            "{e}"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\nagent = \"smart\""));
        assert!(
            e.starts_with("exp.toml:9:9: unknown variant `smart`") && e.contains("oracle"),
            "{e}"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 2\nstep_timeout = \"soon\""));
        assert!(
            e.starts_with("exp.toml:9:1: key `environment.step_timeout`"),
            "{e}"
        );
        let e = err(&format!("{OK}[reward]\nmode = \"dense\"\n"));
        assert!(
            e.starts_with("exp.toml:10:8: unknown variant `dense`"),
            "{e}"
        );
        let e = err(&format!("{OK}[reward]\nbonus = 1.0\n"));
        assert!(e.starts_with("exp.toml:10:1: unknown field `bonus`"), "{e}");
        let e = err(&OK.replace("task = \"archive-logs\"\n", ""));
        assert!(
            e.starts_with("exp.toml:6:1: key `environment.template`: give a `template`"),
            "{e}"
        );
        let e = err(&OK.replace(
            "episodes = 2",
            "episodes = 2\nstep_timeout = \"18446744073709551615s\"",
        ));
        assert!(
            e.starts_with("exp.toml:9:1: key `environment.step_timeout`: `18446744073709551615s` is out of range"),
            "{e}"
        );
        let e = err(&OK.replace("episodes = 2", "episodes = 99999999999"));
        assert!(
            e.contains("environment.episodes") && e.contains("between 1 and"),
            "{e}"
        );
        for bad in ["nan", "inf", "-inf"] {
            let e = err(&format!("{OK}[reward]\ngoal = {bad}\n"));
            assert!(
                e.starts_with("exp.toml:10:1: key `reward.goal`")
                    && e.contains("is not a finite number"),
                "{bad}: {e}"
            );
        }
        let train = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/ppo-clean.toml"),
        )
        .unwrap()
        .replace("num_steps = 32", "num_steps = 9223372036854775807");
        let e = Experiment::parse(
            &train,
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/x.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("key `training.num_steps`: between 1 and 1000000"),
            "{e}"
        );
        let e = err(&OK.replace("name = \"t\"", &format!("name = \"{}\"", "n".repeat(300))));
        assert!(e.contains("experiment.name") && e.len() < 300, "{e}");
        let e = err(&OK.replace("[environment]", "[environment]\nepisodes_per_instance = 0"));
        assert!(
            e.starts_with("exp.toml:7:1: key `environment.episodes_per_instance`"),
            "{e}"
        );
    }

    #[test]
    fn episodes_per_instance_groups_plans() {
        let text = OK.replace("episodes = 2", "episodes = 5\nepisodes_per_instance = 2");
        let e = Experiment::parse(&text, Path::new("x.toml")).unwrap();
        assert_eq!(e.plan(1, 0), e.plan(1, 1));
        assert_ne!(e.plan(1, 1), e.plan(1, 2));
        assert_eq!(e.plan(1, 4).seed, SEED_STRIDE + 2);
        assert_eq!(
            e.plan(2, 0),
            Plan::for_task("archive-logs", 2 * SEED_STRIDE, vec![])
        );
    }

    #[test]
    fn the_shipped_experiment_loads_from_the_project_root() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/rarl.toml");
        let e = Experiment::load(&file).unwrap();
        assert_eq!(e.experiment.name, "rarl");
        assert_eq!(e.task(), "archive-logs");
        assert!(e.template.is_some());
        assert!(e.environment.require_certified);
        assert_eq!(e.reward, RewardConfig::default());
    }
}
