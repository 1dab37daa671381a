//! The `engine` command line: the argument model and one file per command group, over the
//! `engine` library. Output goes through [`out`] (it survives `engine ... | head`).

#[macro_use]
pub mod out;
mod bench;
pub mod daemon;
mod episode;
pub mod errors;
mod fingerprint;
mod harbor;
mod perturb;
mod run;
pub mod sandbox;
mod serve;
pub mod signals;
mod synth;
mod task;
mod tournament;

use crate::oneshot::args::OneShotCli;
pub use crate::oneshot::args::{count, LogOpt};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "engine",
    bin_name = "engine",
    version,
    about = "EnvFactory: broken-by-design Linux environments, millisecond sandboxes, robust RL",
    after_help = EXIT_STATUS
)]
pub struct Cli {
    #[command(flatten)]
    pub logging: LogOpt,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run an experiment (the main job) and write its report. Episodes are appended to
    /// `<out_dir>/<name>/.episodes.jsonl.partial` as they finish; SIGINT, SIGTERM or SIGHUP
    /// stop the run after the running episodes and write what was measured (exit 130, 143,
    /// 129; a second signal tears down at once). An experiment with `[selfplay]` trains
    /// through the actor runtime (docs/selfplay.md).
    Run {
        experiment: PathBuf,
        /// Validate the config and print what the run would do, without starting it.
        #[arg(long)]
        dry_run: bool,
        /// Self-play: go on with the run in the experiment's output directory from each
        /// seed's newest checkpoint (finished seeds are kept). The directory must have been
        /// written by the same configuration.
        #[arg(long, conflicts_with = "dry_run")]
        resume: bool,
    },
    /// The cross-play matrix of finished self-play runs: their protagonists (with the
    /// catalogue oracle and the random agent) x their adversaries (with `clean` and `dr`),
    /// its Nash value and mixtures, Nash-averaged scores, Elo; `matrix.json`, `report.md`,
    /// `heatmap.png` in `<out_dir>/<name>` (docs/selfplay.md).
    Tournament { config: PathBuf },
    /// An ablation grid over a base self-play experiment: one `engine run` per point (up to
    /// `parallel` at once), then `sweep.json`, `report.md`, `sweep.png` with each point's
    /// held-out success over seeds. Exit 1 when a point did not finish; a signal is passed on
    /// to the running points (SIGINT: they checkpoint), which are waited for, and the exit is
    /// 128 + the signal.
    Sweep {
        config: PathBuf,
        /// Check the grid and list the points, without running them.
        #[arg(long)]
        dry_run: bool,
        /// Keep the points that finished, resume the others from their checkpoints.
        #[arg(long, conflicts_with = "dry_run")]
        resume: bool,
    },
    /// Play an episode of a self-play run again from its record (its plan and actions in
    /// `episodes.jsonl`) and compare the verdict: `engine replay out/rarl 1:17` (seed 1,
    /// line 17 from 0) or `engine replay out/rarl/seed-1 17`. Exit 1 when the verdict differs.
    Replay {
        run: PathBuf,
        episode: String,
        #[arg(long)]
        json: bool,
    },
    /// Sandbox commands.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCmd),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// One episode of a task: a JSON line per step and a final line with `--json`.
    Episode {
        #[command(flatten)]
        instance: episode::InstanceOpts,
        /// Actions to take, one per line (`@N` = catalogue action N, else a shell command).
        #[arg(long, conflicts_with = "agent")]
        actions_file: Option<PathBuf>,
        /// Built-in agent (default: random).
        #[arg(long, value_enum)]
        agent: Option<episode::Agent>,
        /// Seed of the random agent.
        #[arg(long, default_value_t = 0)]
        agent_seed: u64,
        #[command(flatten)]
        llm: episode::LlmOpts,
        /// Overrides the task's step limit (at least 1).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_steps: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Play one episode of a task yourself, in the terminal.
    Play {
        #[command(flatten)]
        instance: episode::InstanceOpts,
    },
    /// Task families.
    #[command(subcommand)]
    Task(task::TaskCmd),
    /// The perturbation catalogue.
    #[command(subcommand)]
    Perturb(perturb::PerturbCmd),
    /// Synthesize instances of a template (TOML or YAML) and print their ids and applied plans.
    Synth {
        template: PathBuf,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Instances (seeds seed..seed+count), at most 100000.
        #[arg(long, default_value = "1", value_parser = count::<100_000>)]
        count: usize,
        #[arg(long)]
        json: bool,
    },
    /// Measure an environment's feature vector (disk, PATH, packages, tools, services, clock,
    /// locale, ...), optionally after `--start` commands; `--shipped NAME` prints a shipped
    /// reference fingerprint instead; `engine fingerprint auc` reports the realism
    /// classifier's held-out AUC (docs/fingerprints.md).
    Fingerprint(fingerprint::FingerprintArgs),
    /// Harbor and Terminal-Bench task folders (docs/harbor.md).
    #[command(subcommand)]
    Harbor(harbor::HarborCmd),
    /// Remove what crashed runs left behind (also done at every start).
    Reap {
        /// Also unmount and drop the instance cache (synthesized instances, certificates) and
        /// the harbor layer store, and empty the store of built host masks (entries in use
        /// stay).
        #[arg(long)]
        cache: bool,
    },
    /// Serve the environments over the OpenEnv protocol (HTTP, WebSocket /ws, MCP), many
    /// sessions per process (docs/serve.md).
    Serve(serve::ServeOpts),
    /// PID 1 of a sandbox (internal).
    #[command(name = "__sandbox-init", hide = true)]
    SandboxInit,
}

/// The exit statuses, as `engine --help` prints them (docs/architecture.md says the same).
const EXIT_STATUS: &str = "Exit status:
  0        success
  1        the command ran and its answer is no (e.g. `task check` found an unsolvable instance)
  2        usage or input error: a bad option, config, template, action file or fault spec
  124      `sandbox exec`: the command timed out
  125      a sandbox or engine failure
  126, 127 `sandbox exec`: the command cannot be executed, or was not found
  128+N    `sandbox exec`: the command was killed by signal N
  129, 130, 143  interrupted by SIGHUP, SIGINT or SIGTERM (sandboxes torn down, results kept)";

/// A number of seconds, finite and in `(0, 86400]`.
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 86400.0 => Ok(x),
        _ => Err("expected a number of seconds in (0, 86400]".into()),
    }
}

impl Cmd {
    /// `engine sandbox exec`: one sandbox, one command, then the process ends.
    pub fn is_one_shot(&self) -> bool {
        matches!(self, Cmd::Sandbox(sandbox::SandboxCmd::Exec(_)))
    }
}

impl Cli {
    /// The command line of this process. `engine sandbox exec` is taken by [`OneShotCli`] when
    /// that parser accepts it whole; anything else (help, a bad or unknown option, `--log`
    /// before `sandbox`, every other command) goes to the whole parser, which prints and
    /// exits as it always did.
    pub fn from_args() -> Self {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        if let Some(c) = Self::parse_one_shot(&args) {
            return c;
        }
        Self::parse_from(args)
    }

    /// [`OneShotCli::parse`], as a whole command line.
    fn parse_one_shot(args: &[std::ffi::OsString]) -> Option<Self> {
        let o = OneShotCli::parse(args)?;
        Some(Cli {
            logging: o.logging,
            command: Cmd::Sandbox(sandbox::SandboxCmd::Exec(o.exec)),
        })
    }
}

/// The `engine` front beside this program, as users run it; this program where there is none
/// of the same build (`cargo run` builds only this program), saying so.
pub fn front_path() -> std::io::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let front = me.with_file_name("engine");
    let build = std::process::Command::new(&front)
        .arg("__front-build")
        .stderr(std::process::Stdio::null())
        .output();
    match build {
        Ok(o)
            if o.status.success() && o.stdout.trim_ascii() == crate::oneshot::BUILD.as_bytes() =>
        {
            Ok(front)
        }
        _ => {
            eprintln!(
                "engine: no `engine` front of this build beside {}: its one-shots are timed \
                 without it (`cargo build` builds both)",
                me.display()
            );
            Ok(me)
        }
    }
}

/// When the `engine` front handed this process its command line, its build must be this
/// program's: the two were built from different sources otherwise (`cargo run` builds only
/// this program; `cargo build --bin engine` only the front). Exits with 125 and says so. The
/// front's variable is removed: the commands this process runs do not see it.
pub fn front_build_matches() {
    let Some(front) = std::env::var_os(crate::oneshot::FRONT_BUILD_ENV) else {
        return;
    };
    // Single-threaded still: nothing reads the environment meanwhile.
    std::env::remove_var(crate::oneshot::FRONT_BUILD_ENV);
    if front != crate::oneshot::BUILD {
        eprintln!(
            "engine: the engine program {} is from another build than the `engine` beside it \
             (build {}, the front's {}): build both with `cargo build`",
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| crate::oneshot::CORE.into()),
            crate::oneshot::BUILD,
            front.to_string_lossy()
        );
        std::process::exit(sandbox::EXIT_SANDBOX_FAILURE);
    }
}

/// Run a parsed command; the exit status of the process.
pub fn run(cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::SandboxInit => ::sandbox::init::main(),
        Cmd::Run {
            experiment,
            dry_run,
            resume,
        } => run::run(&experiment, dry_run, resume),
        Cmd::Replay { run, episode, json } => run::replay(&run, &episode, json),
        Cmd::Tournament { config } => tournament::tournament(&config),
        Cmd::Sweep {
            config,
            dry_run,
            resume,
        } => tournament::sweep(&config, dry_run, resume),
        Cmd::Sandbox(c) => sandbox::run(c),
        Cmd::Bench(c) => bench::run(c),
        Cmd::Episode {
            instance,
            actions_file,
            agent,
            agent_seed,
            llm,
            max_steps,
            json,
        } => episode::episode(
            &instance,
            actions_file.as_ref(),
            agent,
            agent_seed,
            &llm,
            max_steps,
            json,
        ),
        Cmd::Play { instance } => episode::play(&instance),
        Cmd::Task(c) => task::run(c),
        Cmd::Perturb(c) => perturb::run(c),
        Cmd::Synth {
            template,
            seed,
            count,
            json,
        } => synth::run(&template, seed, count as u64, json),
        Cmd::Fingerprint(a) => fingerprint::run(a),
        Cmd::Harbor(c) => harbor::run(c),
        Cmd::Reap { cache } => sandbox::reap(cache),
        Cmd::Serve(o) => serve::run(&o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    /// The one-shot's parser takes a command line only when the whole parser takes it too,
    /// and then parses it the same; everything else is left to the whole parser.
    #[test]
    fn the_one_shot_parser_takes_only_what_the_whole_parser_takes_and_the_same_way() {
        let taken = [
            &["engine", "sandbox", "exec", "--", "/bin/true"][..],
            &[
                "engine",
                "sandbox",
                "exec",
                "--memory",
                "512M",
                "--pids=10",
                "--",
                "sh",
                "-c",
                "x",
            ],
            &[
                "engine", "sandbox", "exec", "--cpus", "0.5", "--disk", "1M", "--userns", "--", "a",
            ],
            &[
                "engine",
                "sandbox",
                "exec",
                "--timeout",
                "3s",
                "--no-daemon",
                "--",
                "--help",
            ],
            &[
                "engine",
                "sandbox",
                "exec",
                "--log",
                "debug",
                "--rootfs=/srv/r",
                "--",
                "-V",
            ],
            &[
                "engine",
                "sandbox",
                "exec",
                "--log=info",
                "--",
                "--",
                "--version",
            ],
        ];
        let refused = [
            &["engine", "sandbox", "exec", "--help"][..],
            &["engine", "sandbox", "exec", "-h"],
            &["engine", "sandbox", "exec", "--version"],
            &["engine", "sandbox", "exec", "-V", "--", "true"],
            &["engine", "sandbox", "exec", "--bogus", "--", "true"],
            &["engine", "sandbox", "exec", "--pids", "many", "--", "true"],
            &["engine", "sandbox", "exec", "true"],
            &["engine", "sandbox", "exec"],
            &["engine", "sandbox", "exec", "--"],
            &[
                "engine", "sandbox", "exec", "--memory", "1G", "--memory", "2G", "--", "true",
            ],
            &["engine", "--log", "debug", "sandbox", "exec", "--", "true"],
            &["engine", "sandbox", "daemon"],
            &["engine", "sandbox"],
            &["engine"],
        ];
        for (case, fast_expected) in taken
            .iter()
            .map(|c| (c, true))
            .chain(refused.iter().map(|c| (c, false)))
        {
            let a = args(case);
            let fast = Cli::parse_one_shot(&a);
            let whole = Cli::try_parse_from(&a);
            assert_eq!(fast.is_some(), fast_expected, "{case:?}");
            let Some(fast) = fast else { continue };
            let whole = whole
                .unwrap_or_else(|e| panic!("{case:?}: taken by the one-shot's parser only: {e}"));
            assert_eq!(fast.logging, whole.logging, "{case:?}");
            match (fast.command, whole.command) {
                (
                    Cmd::Sandbox(sandbox::SandboxCmd::Exec(f)),
                    Cmd::Sandbox(sandbox::SandboxCmd::Exec(w)),
                ) => assert_eq!(f, w, "{case:?}"),
                _ => panic!("{case:?}: not a one-shot for both parsers"),
            }
        }
    }
}
