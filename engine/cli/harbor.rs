//! `engine harbor check DIR...` and `engine harbor run DIR`: Harbor and Terminal-Bench task
//! folders in the factory's sandboxes (docs/harbor.md).

use clap::{Subcommand, ValueEnum};
use engine::harbor::{self, Agent, Outcome};
use std::path::{Path, PathBuf};

// Parsed once per process: the size of `Run` (the language-model options) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum HarborCmd {
    /// Build each task, run its oracle then its tests; pass/fail per task (exit 1 if any
    /// failed; tasks outside the supported subset are skipped with the reason).
    Check {
        #[arg(required_unless_present = "template")]
        dirs: Vec<PathBuf>,
        #[command(flatten)]
        opts: Opts,
        /// One JSON line per task: task, passed, reward, reason, seconds (and more).
        #[arg(long)]
        json: bool,
    },
    /// One episode of a task with an agent.
    Run {
        #[arg(required_unless_present = "template")]
        dir: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "oracle")]
        agent: AgentKind,
        /// `--agent commands`: a file of shell commands, one per line.
        #[arg(long, required_if_eq("agent", "commands"))]
        commands: Option<PathBuf>,
        #[command(flatten)]
        llm: super::episode::LlmOpts,
        /// `--agent llm`: the most commands the model may run.
        #[arg(long, default_value = "50", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        max_steps: u32,
        #[command(flatten)]
        opts: Opts,
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct Opts {
    /// The rootfs every `FROM` resolves to (`host`, `oci:PATH`, `docker:IMAGE`,
    /// `debootstrap:SUITE`); default: the local Docker image of that name, else for
    /// `debian:SUITE` of another suite than the host's that suite made with debootstrap,
    /// else `host` for a Debian-family base.
    #[arg(long)]
    base: Option<String>,
    #[command(flatten)]
    net: BuildNetOpts,
    /// A perturbation of the factory's catalogue on the task's image: `NAME` or
    /// `NAME:key=value,...` (repeatable; `engine perturb list`).
    #[arg(long = "perturb", value_name = "SPEC")]
    perturb: Vec<String>,
    /// Run the episodes on this backend.
    #[arg(long, value_enum, default_value = "native")]
    backend: super::episode::BackendKind,
    /// A template (`task = { harbor = "DIR" }` names the folder, run when no DIR is given):
    /// its perturbation space, sampled for `--seed`, applies to every task's image, after
    /// the `--perturb`s.
    #[arg(long, value_name = "FILE")]
    template: Option<PathBuf>,
    /// The seed the template's space is sampled with (and the faults synthesized with).
    #[arg(long, default_value = "1")]
    seed: u64,
}

/// How a task's `RUN` steps reach the network (docs/harbor.md, "The build network").
#[derive(clap::Args)]
pub struct BuildNetOpts {
    /// A host a `RUN` step may reach besides the default package registries: `HOST` (ports
    /// 80 and 443) or `HOST:PORT` (repeatable).
    #[arg(long = "registry", value_name = "HOST[:PORT]", value_parser = parse_registry)]
    registry: Vec<harbor::Registry>,
    /// `RUN` steps get no network at all (not even the package registries).
    #[arg(long, conflicts_with = "registry")]
    offline_build: bool,
}

fn parse_registry(s: &str) -> Result<harbor::Registry, String> {
    s.parse()
}

/// `--base` and the build network, as build options (a usage error names a bad `--base`).
pub fn build_options(
    base: Option<&str>,
    net: &BuildNetOpts,
) -> anyhow::Result<harbor::BuildOptions> {
    Ok(harbor::BuildOptions {
        base: base_opt(base)?,
        network: if net.offline_build {
            harbor::BuildNetwork::Offline
        } else {
            harbor::BuildNetwork::with(&net.registry)
        },
    })
}

#[derive(Clone, Copy, ValueEnum)]
pub enum AgentKind {
    Oracle,
    /// Do nothing: the tests on the untouched environment.
    Nothing,
    /// Shell commands from `--commands FILE`.
    Commands,
    /// A language model (`--llm-base-url`, `--llm-model`; docs/llm.md).
    Llm,
}

/// `--base` parsed (a usage error names it).
pub fn base_opt(base: Option<&str>) -> anyhow::Result<Option<sandbox::RootfsSpec>> {
    base.map(|b| {
        b.parse::<sandbox::RootfsSpec>()
            .map_err(|e| super::errors::usage(format!("--base: {e}")))
    })
    .transpose()
}

fn print(o: &Outcome, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string(o)?);
    } else {
        let status = if o.skipped {
            "SKIP"
        } else if o.infrastructure {
            "INFRA"
        } else if o.passed {
            "PASS"
        } else {
            "FAIL"
        };
        let reward = if o.infrastructure {
            "-".to_string()
        } else {
            o.reward.to_string()
        };
        outln!(
            "{status} {} reward {reward} ({:.2} s): {}",
            o.task,
            o.seconds,
            o.reason
        );
        for s in &o.substituted {
            outln!("     offline: {s}");
        }
        for p in &o.perturbations {
            outln!("     perturbed: {p}");
        }
    }
    Ok(())
}

fn each(dirs: &[PathBuf], opts: &Opts, agent: &Agent, json: bool) -> anyhow::Result<i32> {
    let build = build_options(opts.base.as_deref(), &opts.net)?;
    let mut perturb = Vec::new();
    for s in &opts.perturb {
        perturb.push(
            engine::perturb::parse_spec(s)
                .map_err(|e| super::errors::usage(format!("--perturb: {e}")))?,
        );
    }
    let mut dirs = dirs.to_vec();
    if let Some(file) = &opts.template {
        let t = engine::template::Template::load_any(file)?;
        perturb.extend(t.sample(opts.seed).perturbations);
        match (&t.harbor, dirs.is_empty()) {
            (Some((dir, _)), true) => dirs.push(dir.clone()),
            (None, true) => {
                return Err(super::errors::usage(format!(
                    "{}: names no task folder (`task = {{ harbor = \"DIR\" }}`); give DIR",
                    file.display()
                )))
            }
            _ => {}
        }
    }
    let rt = super::sandbox::runtime()?;
    let store = harbor::LayerStore::open(rt.state_dir())?;
    let docker;
    let backend: &dyn sandbox::DynBackend = match opts.backend {
        super::episode::BackendKind::Native => &rt,
        super::episode::BackendKind::Docker => {
            docker = super::sandbox::docker_backend()?;
            &docker
        }
    };
    let mut failed = false;
    for d in &dirs {
        let o = harbor::check_task(&rt, backend, &store, d, &build, agent, &perturb, opts.seed)?;
        failed |= !o.passed && !o.skipped;
        print(&o, json)?;
    }
    Ok(i32::from(failed))
}

fn commands(file: &Path) -> anyhow::Result<Vec<String>> {
    let text = engine::text::read_input(file)?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

pub fn run(cmd: HarborCmd) -> anyhow::Result<i32> {
    match cmd {
        HarborCmd::Check { dirs, opts, json } => each(&dirs, &opts, &Agent::Oracle, json),
        HarborCmd::Run {
            dir,
            agent,
            commands: file,
            llm,
            max_steps,
            opts,
            json,
        } => {
            let agent = match agent {
                AgentKind::Oracle => Agent::Oracle,
                AgentKind::Nothing => Agent::Nothing,
                AgentKind::Commands => {
                    Agent::Commands(commands(file.as_deref().unwrap_or(Path::new("/dev/null")))?)
                }
                AgentKind::Llm => Agent::Llm(
                    std::sync::Arc::new(std::sync::Mutex::new(llm.agent()?)),
                    max_steps,
                ),
            };
            each(&dir.into_iter().collect::<Vec<_>>(), &opts, &agent, json)
        }
    }
}
