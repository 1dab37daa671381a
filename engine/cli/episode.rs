//! `engine episode` and `engine play`: the environment from the command line.

use anyhow::Context;
use engine::env::{Action, Env, EnvConfig, Step};
use engine::instance::Plan;
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Options shared by the commands that build an instance of a task.
#[derive(clap::Args, Debug, Clone)]
pub struct InstanceOpts {
    /// Task family (`engine task list`).
    #[arg(long)]
    pub task: String,
    /// Seed of the task's generation and of the instance.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A perturbation: `NAME` or `NAME:key=value,key=value` (repeatable; see
    /// docs/environments.md for the catalogue).
    #[arg(long = "perturb", value_name = "SPEC")]
    pub perturb: Vec<String>,
    /// Base root filesystem: `host`, a directory, `oci:PATH`, `docker:IMAGE` or
    /// `debootstrap:SUITE`.
    #[arg(long, default_value = "host")]
    pub base: String,
    /// Where episodes run: `native` sandboxes, or `docker` containers of the daemon of
    /// `DOCKER_HOST` (needs `--base docker:IMAGE`; docs/docker.md).
    #[arg(long, value_enum, default_value = "native")]
    pub backend: BackendKind,
}

/// The sandbox backend of `--backend`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Native,
    Docker,
}

impl InstanceOpts {
    pub fn plan(&self) -> anyhow::Result<Plan> {
        if engine::tasks::get(&self.task).is_none() {
            return Err(super::errors::usage(format!(
                "--task: unknown task `{}` (known: {})",
                engine::text::cut(&self.task),
                engine::tasks::names().join(", ")
            )));
        }
        let mut chosen = Vec::new();
        for s in &self.perturb {
            chosen.push(engine::perturb::parse_spec(s).context("--perturb")?);
        }
        let mut p = Plan::for_task(&self.task, self.seed, chosen);
        p.base = self.base.clone();
        Ok(p)
    }

    /// An `Env` on the chosen backend.
    pub fn env(&self, cfg: EnvConfig) -> anyhow::Result<Env> {
        let rt = crate::cli::sandbox::runtime()?;
        let env = Env::new(rt, super::sandbox::cache()?, cfg)?;
        Ok(match self.backend {
            BackendKind::Native => env,
            BackendKind::Docker => {
                env.with_backend(std::sync::Arc::new(super::sandbox::docker_backend()?))
            }
        })
    }
}

/// Who acts in `engine episode`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    /// The task's free-text oracle solution.
    Oracle,
    /// The task's reactive catalogue oracle (catalogue actions only).
    CatalogueOracle,
    /// Uniformly random catalogue actions.
    Random,
    /// A language model behind an OpenAI-compatible endpoint (`--llm-base-url`, `--llm-model`).
    Llm,
}

/// The language model of `--agent llm` (the `[llm]` table of an experiment; docs/llm.md).
#[derive(clap::Args, Debug, Clone)]
pub struct LlmOpts {
    /// The API root: requests go to URL/chat/completions (e.g. https://api.openai.com/v1).
    #[arg(long, value_name = "URL")]
    pub llm_base_url: Option<String>,
    #[arg(long, value_name = "NAME")]
    pub llm_model: Option<String>,
    /// The environment variable holding the API key (default: OPENAI_API_KEY when it is set,
    /// else no key).
    #[arg(long, value_name = "VAR")]
    pub llm_api_key_env: Option<String>,
    /// Limit of one request.
    #[arg(long, default_value = "60s")]
    pub llm_timeout: String,
    /// Retries of one reply (429, 5xx, timeouts, unreadable bodies).
    #[arg(long, default_value_t = 5)]
    pub llm_max_retries: u32,
    /// The first backoff (it doubles per retry, up to --llm-max-wait).
    #[arg(long, default_value = "1s")]
    pub llm_backoff: String,
    #[arg(long, default_value = "60s")]
    pub llm_max_wait: String,
    #[arg(long)]
    pub llm_temperature: Option<f64>,
    #[arg(long)]
    pub llm_max_tokens: Option<u32>,
    /// Each message sent to the model is cut to this many characters (head and tail).
    #[arg(long, default_value_t = 8000)]
    pub llm_max_observation_chars: usize,
    /// The most characters of conversation one request carries (about four a token); older
    /// turns are replaced by a note.
    #[arg(long, default_value_t = 32_000)]
    pub llm_max_context_chars: usize,
    /// Offer the `run_command` function tool (`tools`, `tool_choice: auto`).
    #[arg(long)]
    pub llm_tools: bool,
}

impl LlmOpts {
    /// The agent, its config checked (errors name the flag).
    pub fn agent(&self) -> anyhow::Result<engine::agents::LlmAgent> {
        let (Some(url), Some(model)) = (&self.llm_base_url, &self.llm_model) else {
            return Err(super::errors::usage(
                "--agent llm needs --llm-base-url and --llm-model",
            ));
        };
        let mut c = engine::agents::LlmConfig::new(url, model);
        c.api_key_env = self.llm_api_key_env.clone();
        c.timeout = self.llm_timeout.clone();
        c.max_retries = self.llm_max_retries;
        c.backoff = self.llm_backoff.clone();
        c.max_wait = self.llm_max_wait.clone();
        c.temperature = self.llm_temperature;
        c.max_tokens = self.llm_max_tokens;
        c.max_observation_chars = self.llm_max_observation_chars;
        c.max_context_chars = self.llm_max_context_chars;
        c.tools = self.llm_tools;
        engine::agents::LlmAgent::new(&c).map_err(|e| match e {
            engine::agents::llm::LlmError::Config { key, reason } => {
                super::errors::usage(format!("--{}: {reason}", key.replace(['.', '_'], "-")))
            }
            e => super::errors::usage(e.to_string()),
        })
    }

    fn given(&self) -> bool {
        self.llm_base_url.is_some() || self.llm_model.is_some()
    }
}

fn step_line(n: u32, cmd: &str, s: &Step) -> serde_json::Value {
    serde_json::json!({
        "step": n,
        "action": cmd,
        "exit": s.observation.exit_code,
        "reward": s.reward,
        "terminated": s.terminated,
        "truncated": s.truncated,
        "done": s.terminated || s.truncated,
        "timeout": s.info.timeout,
        "dangerous": s.info.dangerous.is_some(),
        "infra_failure": s.info.infra_failure,
        "progress": s.info.progress,
    })
}

/// `engine episode`: one episode, a JSON line per step and a final line (with `--json`).
pub fn episode(
    opts: &InstanceOpts,
    actions_file: Option<&PathBuf>,
    agent: Option<Agent>,
    agent_seed: u64,
    llm: &LlmOpts,
    max_steps: Option<u32>,
    json: bool,
) -> anyhow::Result<i32> {
    let plan = opts.plan()?;
    let llm_agent = match agent {
        Some(Agent::Llm) => Some(llm.agent()?),
        _ if llm.given() => {
            return Err(super::errors::usage(
                "--llm-base-url and --llm-model are for --agent llm",
            ))
        }
        _ => None,
    };
    let cfg = EnvConfig {
        max_steps,
        ..EnvConfig::default()
    };
    let mut env = opts.env(cfg)?;
    let obs = env.reset(&plan)?;
    let setup = env.task().cloned().context("the instance has no task")?;
    if !json {
        outln!("{}", obs.text);
    }
    let mut agent: Box<dyn engine::agents::Agent> = match (actions_file, llm_agent, agent) {
        (Some(f), _, _) => Box::new(engine::agents::Script::once(
            "actions file",
            engine::actions::read(f)?,
        )),
        (None, Some(a), _) => Box::new(a),
        (None, None, Some(Agent::Oracle)) => Box::new(engine::agents::Oracle::default()),
        (None, None, Some(Agent::CatalogueOracle)) => {
            Box::new(engine::agents::CatalogueOracle::default())
        }
        // `--agent llm` always has its agent (built above, before the sandbox starts).
        (None, None, _) => Box::new(engine::agents::Random::new(agent_seed)),
    };
    let mut last: Option<Step> = None;
    let played = engine::episode::play(&mut env, &obs, agent.as_mut(), &mut |cmd, s| {
        if json {
            outln!("{}", step_line(s.observation.step, cmd, s));
        } else {
            outln!("{}", s.observation.text);
            outln!("reward {:+.3}\n", s.reward);
        }
        last = Some(s.clone());
    })?;
    let infra = played.infra;
    let success = played.success;
    let summary = serde_json::json!({
        "success": success,
        "progress": played.progress,
        "checks": last.as_ref().map(|s| s.info.checks.clone()).unwrap_or_default(),
        "return": env.episode_return(),
        "steps": env.steps(),
        "instance": env.instance_id(),
        "task": setup.task,
        "seed": setup.seed,
        "infra_failure": infra,
        "agent": agent.name(),
        "agent_failure": played.agent_failure.is_some(),
        "error": played.agent_failure.as_ref().or(played.error.as_ref()),
        "transcript": played.transcript,
    });
    if json {
        outln!("{summary}");
    } else {
        if let Some(why) = &played.agent_failure {
            outln!("agent failure: {why}");
        }
        outln!(
            "episode over: success {success}, return {:.3}, {} steps, instance {}",
            env.episode_return(),
            env.steps(),
            env.instance_id().unwrap_or("-")
        );
    }
    Ok(if infra {
        crate::cli::sandbox::EXIT_SANDBOX_FAILURE
    } else {
        0
    })
}

/// `engine play`: a person plays one episode in the terminal.
pub fn play(opts: &InstanceOpts) -> anyhow::Result<i32> {
    let plan = opts.plan()?;
    let mut env = opts.env(EnvConfig::default())?;
    let obs = env.reset(&plan)?;
    let setup = env.task().cloned().context("the instance has no task")?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", obs.text)?;
    writeln!(
        out,
        "Type shell commands. `:actions` lists the catalogue, `:N` runs catalogue action N, \
         `:verify` asks the verifier, `:quit` ends.\n"
    )?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        write!(
            out,
            "{}$ ",
            env.running().map(|l| l.cwd.clone()).unwrap_or_default()
        )?;
        out.flush()?;
        let Some(line) = lines.next() else {
            writeln!(out)?;
            break;
        };
        let line = line?;
        let l = line.trim();
        let action = match l {
            "" => continue,
            ":quit" | ":q" => break,
            ":actions" => {
                for (i, a) in setup.actions.iter().enumerate() {
                    writeln!(out, "  :{i:<3} {a}")?;
                }
                continue;
            }
            ":verify" => {
                let v = env.verify()?;
                writeln!(
                    out,
                    "verifier: {} ({:.0}% of checks pass){}",
                    if v.success { "solved" } else { "not solved" },
                    100.0 * v.progress,
                    if v.reasons.is_empty() {
                        String::new()
                    } else {
                        format!("\n  {}", v.reasons.join("\n  "))
                    }
                )?;
                continue;
            }
            l if l.starts_with(':') => match l[1..].parse::<usize>() {
                Ok(i) => Action::Index(i),
                Err(_) => {
                    writeln!(out, "unknown command {l}; try :actions, :N, :verify, :quit")?;
                    continue;
                }
            },
            l => Action::Command(l.to_string()),
        };
        let s = match env.step(&action) {
            Ok(s) => s,
            Err(e @ engine::env::EnvError::BadAction { .. }) => {
                writeln!(out, "{e}")?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        writeln!(out, "{}", s.observation.text)?;
        writeln!(
            out,
            "reward {:+.1}, return {:.1}",
            s.reward,
            env.episode_return()
        )?;
        if s.terminated {
            writeln!(out, "Goal reached in {} steps. Well done.", env.steps())?;
            break;
        }
        if s.truncated {
            writeln!(
                out,
                "Episode over ({}).",
                if s.info.infra_failure {
                    "environment failure"
                } else {
                    "step limit"
                }
            )?;
            break;
        }
    }
    Ok(0)
}
