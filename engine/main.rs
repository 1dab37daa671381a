//! The `engine` command line.

#[macro_use]
mod cli_out;
mod env_cli;
mod sandbox_cli;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "engine",
    version,
    about = "EnvFactory: broken-by-design Linux environments, millisecond sandboxes, robust RL"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `sandbox=debug`.
    #[arg(long, global = true, env = "ENVFACTORY_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run an experiment (the main job) and write its report.
    Run { experiment: PathBuf },
    /// Sandbox commands.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// One episode of a task: a JSON line per step and a final line with `--json`.
    Episode {
        #[command(flatten)]
        instance: env_cli::InstanceOpts,
        /// Actions to take, one per line (`@N` = catalogue action N, else a shell command).
        #[arg(long, conflicts_with = "agent")]
        actions_file: Option<PathBuf>,
        /// Built-in agent (default: random).
        #[arg(long, value_enum)]
        agent: Option<env_cli::Agent>,
        /// Seed of the random agent.
        #[arg(long, default_value_t = 0)]
        agent_seed: u64,
        /// Overrides the task's step limit.
        #[arg(long)]
        max_steps: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Play one episode of a task yourself, in the terminal.
    Play {
        #[command(flatten)]
        instance: env_cli::InstanceOpts,
    },
    /// Task families.
    #[command(subcommand)]
    Task(TaskCmd),
    /// The perturbation catalogue.
    #[command(subcommand)]
    Perturb(PerturbCmd),
    /// Synthesize instances of a template (TOML or YAML) and print their ids and applied plans.
    Synth {
        template: PathBuf,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Instances (seeds seed..seed+count).
        #[arg(long, default_value_t = 1)]
        count: u64,
        #[arg(long)]
        json: bool,
    },
    /// Measure an environment's feature vector (disk, PATH, packages, tools, services, clock,
    /// locale, ...); `--shipped NAME` prints a shipped reference fingerprint instead.
    Fingerprint {
        /// `host`, a directory, or `oci:PATH`.
        #[arg(long, default_value = "host")]
        rootfs: String,
        /// A shipped fingerprint (`host-debian12`, `debootstrap-bookworm-minbase`).
        #[arg(long, conflicts_with = "rootfs")]
        shipped: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove what crashed runs left behind (also done at every start).
    Reap {
        /// Also unmount and drop the instance cache (synthesized instances, certificates).
        #[arg(long)]
        cache: bool,
    },
    /// PID 1 of a sandbox (internal).
    #[command(name = "__sandbox-init", hide = true)]
    SandboxInit,
}

#[derive(Subcommand)]
enum SandboxCmd {
    /// Run CMD in a fresh sandbox; exit with its status (124 timeout, 125 sandbox failure,
    /// 126 cannot execute, 127 not found, 128+N killed by signal N).
    Exec {
        #[command(flatten)]
        opts: sandbox_cli::SandboxOpts,
        /// Wall-clock limit; the whole process tree is killed when it passes.
        #[arg(long, default_value = "10s")]
        timeout: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PerturbCmd {
    /// List every perturbation with its parameters, defaults and realistic ranges.
    List {
        /// A Markdown table (as in docs/environments.md).
        #[arg(long)]
        markdown: bool,
    },
}

#[derive(Subcommand)]
enum TaskCmd {
    /// List the task families.
    List,
    /// Certify solvability: run the oracle under each perturbation and sampled combinations.
    Check {
        task: String,
        /// `all` (every perturbation of the catalogue with default parameters) or `none`.
        #[arg(long, default_value = "all")]
        perturbations: String,
        /// Also this perturbation (`NAME` or `NAME:key=value,...`; repeatable).
        #[arg(long = "perturb", value_name = "SPEC")]
        perturb: Vec<String>,
        /// Seeds 1..=N of each instance.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// Sampled combinations of two or three perturbations.
        #[arg(long, default_value_t = 8)]
        combos: usize,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value = "host")]
        base: String,
        /// A JSON line per instance.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Environment steps/s (random and oracle agents, 1..N workers), setup, reset and
    /// synthesis costs (keys documented in docs/environments.md).
    Env {
        #[arg(long, default_value = "archive-logs")]
        task: String,
        /// Instances synthesized for the synthesis and setup figures.
        #[arg(long, default_value_t = 20)]
        iterations: usize,
        /// Worker counts to measure (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        workers: Vec<usize>,
        /// Seconds of each throughput measurement.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long)]
        json: bool,
    },
    /// Sandbox latencies against the host's `sh -c true` measured in the same run.
    Sandbox {
        #[command(flatten)]
        opts: sandbox_cli::SandboxOpts,
        #[arg(long, default_value_t = 50)]
        iterations: usize,
        /// Also keep N sandboxes alive at once and run a command in each.
        #[arg(long)]
        concurrent: Option<usize>,
        /// Print the report as JSON (keys documented in docs/sandbox.md).
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    // The sandbox init must start before anything else (no threads, no logging).
    if std::env::args().nth(1).as_deref() == Some("__sandbox-init") {
        sandbox::init::main();
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| {
                eprintln!("engine: bad --log filter {:?}; using `warn`", cli.log);
                tracing_subscriber::EnvFilter::new("warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli.command) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("engine: {e:#}");
            std::process::exit(sandbox_cli::EXIT_SANDBOX_FAILURE);
        }
    }
}

fn run(cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::SandboxInit => sandbox::init::main(),
        Cmd::Run { experiment } => {
            let exp = engine::experiment::Experiment::load(&experiment)?;
            let rt = sandbox_cli::runtime()?;
            let (report, path) = engine::experiment::run(&exp, &rt, &env_cli::cache()?)?;
            outln!(
                "{}: task {}{}, agent {}, {} episodes per seed on {} workers",
                report.name,
                report.task,
                report
                    .template
                    .as_ref()
                    .map(|t| format!(" (template {})", t.display()))
                    .unwrap_or_default(),
                match report.agent {
                    engine::experiment::Agent::Random => "random",
                    engine::experiment::Agent::Oracle => "oracle",
                },
                report.episodes_per_seed,
                report.workers
            );
            for s in &report.seeds {
                outln!(
                    "seed {:>4}: {} episodes ({} uncertified, {} not applicable, {} infra), {} steps, {:.0} steps/s, success {:.2}, return {:.1}, reset {:.2} ms",
                    s.seed,
                    s.episodes,
                    s.skipped_uncertified,
                    s.skipped_not_applicable,
                    s.infra_failures,
                    s.steps,
                    s.steps_per_s,
                    s.success_rate,
                    s.mean_return,
                    s.reset_ms_median
                );
            }
            outln!(
                "{}: {:.0} ± {:.0} steps/s, success {:.2} ± {:.2}, return {:.1} ± {:.1}, reset {:.2} ± {:.2} ms (mean ± 95% CI over {} seeds); report: {}, episodes: {}",
                report.name,
                report.steps_per_s.mean,
                report.steps_per_s.ci95,
                report.success_rate.mean,
                report.success_rate.ci95,
                report.mean_return.mean,
                report.mean_return.ci95,
                report.reset_ms.mean,
                report.reset_ms.ci95,
                report.seeds.len(),
                path.display(),
                report.episodes_file.display()
            );
            Ok(0)
        }
        Cmd::Sandbox(SandboxCmd::Exec { opts, timeout, cmd }) => {
            sandbox_cli::exec(&opts, &timeout, &cmd)
        }
        Cmd::Bench(BenchCmd::Sandbox {
            opts,
            iterations,
            concurrent,
            json,
        }) => {
            let cfg = opts.config()?;
            let rt = sandbox_cli::runtime()?;
            let report = engine::bench::sandbox_bench(&rt, &cfg, iterations, concurrent)?;
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench::render(&report));
            }
            Ok(0)
        }
        Cmd::Episode {
            instance,
            actions_file,
            agent,
            agent_seed,
            max_steps,
            json,
        } => env_cli::episode(
            &instance,
            actions_file.as_ref(),
            agent,
            agent_seed,
            max_steps,
            json,
        ),
        Cmd::Play { instance } => env_cli::play(&instance),
        Cmd::Task(TaskCmd::List) => Ok(env_cli::task_list()),
        Cmd::Perturb(PerturbCmd::List { markdown }) => {
            if markdown {
                out!("{}", engine::perturb::catalogue_markdown());
            } else {
                out!("{}", engine::perturb::catalogue_text());
            }
            Ok(0)
        }
        Cmd::Task(TaskCmd::Check {
            task,
            perturbations,
            perturb,
            seeds,
            combos,
            workers,
            base,
            json,
        }) => env_cli::task_check(
            &task,
            &base,
            &perturbations,
            &perturb,
            seeds,
            combos,
            workers,
            json,
        ),
        Cmd::Bench(BenchCmd::Env {
            task,
            iterations,
            workers,
            seconds,
            json,
        }) => {
            let rt = sandbox_cli::runtime()?;
            let opts = engine::bench_env::EnvBenchOpts {
                task,
                iterations: iterations.max(1),
                workers,
                seconds,
            };
            let report = engine::bench_env::run(&rt, &env_cli::cache()?, &opts)?;
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench_env::render(&report));
            }
            Ok(0)
        }
        Cmd::Synth {
            template,
            seed,
            count,
            json,
        } => {
            let t = engine::template::Template::load(&template)?;
            let rt = sandbox_cli::runtime()?;
            let items =
                engine::template::synthesize(&rt, &env_cli::cache()?, &t, seed, count.max(1))?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&engine::template::synth_report(&t, &items))?
                );
            } else {
                out!("{}", engine::template::synth_text(&t, &items));
            }
            Ok(0)
        }
        Cmd::Fingerprint {
            rootfs,
            shipped,
            json,
        } => {
            let fp = match shipped {
                Some(name) => engine::fingerprint::shipped_fingerprint(&name)?,
                None => {
                    let spec: sandbox::RootfsSpec = rootfs.parse()?;
                    let rt = sandbox_cli::runtime()?;
                    engine::fingerprint::fingerprint_rootfs(&rt, &spec)?
                }
            };
            if json {
                outln!("{}", serde_json::to_string_pretty(&fp)?);
            } else {
                out!("{}", fp.text());
            }
            Ok(0)
        }
        Cmd::Reap { cache } => {
            // Creating a runtime reaps; dropping it removes its own (empty) run.
            let rt = sandbox_cli::runtime()?;
            outln!("reaped; state directory {}", rt.state_dir().display());
            if cache && engine::synth::remove_cache(rt.state_dir())? {
                outln!("instance cache removed");
            }
            Ok(0)
        }
    }
}
