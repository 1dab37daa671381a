//! `engine bench sandbox` and `engine bench env`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Environment steps/s (random and oracle agents, 1..N workers), setup, reset and
    /// synthesis costs (keys documented in docs/environments.md).
    Env {
        #[arg(long, default_value = "archive-logs")]
        task: String,
        /// Instances synthesized for the synthesis and setup figures.
        #[arg(long, default_value = "20", value_parser = super::count::<100_000>)]
        iterations: usize,
        /// Worker counts to measure (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = super::count::<64>)]
        workers: Vec<usize>,
        /// Seconds of each throughput measurement.
        #[arg(long, default_value = "5", value_parser = super::seconds)]
        seconds: f64,
        /// Rounds the raw-exec and random measurements alternate in (rounded up to an even
        /// count, each `seconds / rounds` long), so that a machine that slows down or speeds
        /// up weighs on both alike.
        #[arg(long, default_value = "4", value_parser = super::count::<100>)]
        rounds: usize,
        #[arg(long)]
        json: bool,
    },
    /// The actor runtime against the direct loop of the same schedule (clean levels, PPO,
    /// one Env per worker), alternating in one run, and an `act` through an actor against the
    /// call in place (docs/selfplay.md).
    Selfplay {
        #[arg(long, default_value = "fix-path")]
        task: String,
        #[arg(long, default_value = "4", value_parser = super::count::<64>)]
        envs: usize,
        #[arg(long, default_value = "16", value_parser = super::count::<4096>)]
        num_steps: usize,
        /// Protagonist updates per measurement.
        #[arg(long, default_value = "6", value_parser = super::count::<100_000>)]
        updates: usize,
        /// Measurements each way, alternating.
        #[arg(long, default_value = "3", value_parser = super::count::<100>)]
        rounds: usize,
        #[arg(long)]
        json: bool,
    },
    /// A step through `engine serve` (a Rust WebSocket client on loopback) against the
    /// in-process `Env::step` on the same instance, and N sessions held at once (keys
    /// documented in docs/serve.md).
    Serve {
        #[arg(long, default_value = "archive-logs")]
        task: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Timed steps each way.
        #[arg(long, default_value = "400", value_parser = super::count::<1_000_000>)]
        steps: usize,
        /// The command of every step.
        #[arg(long, default_value = "true")]
        command: String,
        /// Sessions held at once.
        #[arg(long, default_value = "1000", value_parser = super::count::<100_000>)]
        sessions: usize,
        /// Timed resets per pool policy (0: none).
        #[arg(long, default_value = "40", value_parser = super::count::<100_000>)]
        resets: usize,
        #[arg(long)]
        json: bool,
    },
    /// Whole episodes (start, oracle, tests) of Harbor / Terminal-Bench task folders: the
    /// native sandbox against the Docker backend (`DOCKER_HOST`) on the same built image,
    /// interleaved; the median per task and the ratio (docs/harbor.md).
    Harbor {
        #[arg(required = true)]
        dirs: Vec<std::path::PathBuf>,
        /// Timed episodes per backend and task (after one warm-up each).
        #[arg(long, default_value = "10", value_parser = super::count::<10_000>)]
        iterations: usize,
        /// The rootfs every `FROM` resolves to (else the image of that name in the daemon).
        #[arg(long)]
        base: Option<String>,
        #[command(flatten)]
        net: super::harbor::BuildNetOpts,
        #[arg(long)]
        json: bool,
    },
    /// Sandbox latencies against the host's `sh -c true` measured in the same run.
    Sandbox {
        #[command(flatten)]
        opts: super::sandbox::SandboxOpts,
        #[arg(long, default_value = "50", value_parser = super::count::<1_000_000>)]
        iterations: usize,
        /// Also keep N sandboxes alive at once and run a command in each (stops early, and
        /// says where, when admission control refuses one).
        #[arg(long, value_parser = super::count::<1_000_000>)]
        concurrent: Option<usize>,
        /// Print the report as JSON (keys documented in docs/sandbox.md).
        #[arg(long)]
        json: bool,
        /// Instead: the native backend beside the Docker backend (`DOCKER_HOST`) on the same
        /// `--rootfs docker:IMAGE`, interleaved (keys in docs/docker.md).
        #[arg(long)]
        docker: bool,
    },
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<i32> {
    match cmd {
        BenchCmd::Harbor {
            dirs,
            iterations,
            base,
            net,
            json,
        } => {
            let build = super::harbor::build_options(base.as_deref(), &net)?;
            let rt = super::sandbox::runtime()?;
            let docker = super::sandbox::docker_backend()?;
            let store = engine::harbor::LayerStore::open(rt.state_dir())?;
            let report =
                engine::bench::harbor::run(&rt, &store, &docker, &dirs, &build, iterations)?;
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench::harbor::render(&report));
            }
            Ok(0)
        }
        BenchCmd::Serve {
            task,
            seed,
            steps,
            command,
            sessions,
            resets,
            json,
        } => {
            known_task(&task)?;
            let rt = super::sandbox::runtime()?;
            let opts = engine::bench::serve::ServeBenchOpts {
                task,
                seed,
                steps,
                command,
                sessions,
                resets,
            };
            let server = [std::env::current_exe()?.to_string_lossy().into_owned()];
            let report = engine::bench::serve::run(&rt, &super::sandbox::cache()?, &opts, &server)?;
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench::serve::render(&report));
            }
            Ok(0)
        }
        BenchCmd::Sandbox {
            opts,
            iterations,
            json,
            docker: true,
            ..
        } => {
            let cfg = opts.config()?;
            let rt = super::sandbox::runtime()?;
            let docker = super::sandbox::docker_backend()?;
            let report = engine::bench::backends::run([&rt, &docker], &cfg, iterations)?;
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench::backends::render(&report));
            }
            Ok(0)
        }
        BenchCmd::Sandbox {
            opts,
            iterations,
            concurrent,
            json,
            docker: false,
        } => {
            let cfg = opts.config()?;
            let rt = super::sandbox::runtime()?;
            // The one-shot command with the same options, timed as a whole process: made by
            // itself, and served by a daemon of this binary on a socket of its own.
            let exe = super::front_path()?.to_string_lossy().into_owned();
            let one_shot = |no_daemon: bool| {
                let mut argv: Vec<String> = vec![exe.clone(), "sandbox".into(), "exec".into()];
                if no_daemon {
                    argv.push("--no-daemon".into());
                }
                argv.extend(opts.to_args());
                argv.extend(["--".into(), "/bin/true".into()]);
                argv
            };
            // Without a daemon (it could not start) the report leaves its figure out.
            let daemon = super::daemon::BenchDaemon::start()
                .map_err(|e| {
                    eprintln!("engine: the one-shot daemon's figure is left out: {e:#}");
                })
                .ok();
            let one_shots = engine::bench::sandbox::OneShots {
                own: Some(engine::bench::sandbox::Process {
                    argv: one_shot(true),
                    env: Vec::new(),
                }),
                daemon: daemon.as_ref().map(|d| engine::bench::sandbox::Process {
                    argv: one_shot(false),
                    env: vec![(
                        crate::oneshot::client::SOCKET_ENV.into(),
                        d.socket().to_string_lossy().into_owned(),
                    )],
                }),
            };
            let report =
                engine::bench::sandbox::run(&rt, &cfg, iterations, concurrent, &one_shots)?;
            drop(daemon);
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench::sandbox::render(&report));
            }
            Ok(0)
        }
        BenchCmd::Env {
            task,
            iterations,
            workers,
            seconds,
            rounds,
            json,
        } => {
            let rt = super::sandbox::runtime()?;
            let opts = engine::bench::env::EnvBenchOpts {
                task,
                iterations,
                workers,
                seconds,
                rounds,
            };
            let report = engine::bench::env::run(&rt, &super::sandbox::cache()?, &opts)?;
            if json {
                outln!("{}", serde_json::to_string(&report)?);
            } else {
                out!("{}", engine::bench::env::render(&report));
            }
            Ok(0)
        }
        BenchCmd::Selfplay {
            task,
            envs,
            num_steps,
            updates,
            rounds,
            json,
        } => {
            known_task(&task)?;
            let rt = super::sandbox::runtime()?;
            let opts = engine::bench::selfplay::SelfPlayBenchOpts {
                task,
                envs,
                num_steps,
                updates: updates as u64,
                rounds,
            };
            let r = engine::bench::selfplay::run(&rt, &super::sandbox::cache()?, &opts)?;
            if json {
                outln!("{}", serde_json::to_string(&r)?);
            } else {
                outln!(
                    "selfplay ({}, {} envs, {} steps per update): direct {:?} steps/s, actors {:?} steps/s; actors/direct median {:.3} (p90 {:.3}, {} rounds); act through an actor +{:.0} us median (p90 {:.0})",
                    r.task,
                    r.envs,
                    r.steps_per_update,
                    r.direct_steps_per_s.iter().map(|x| x.round()).collect::<Vec<_>>(),
                    r.actors_steps_per_s.iter().map(|x| x.round()).collect::<Vec<_>>(),
                    r.ratio.median,
                    r.ratio.p90,
                    r.ratio.n,
                    r.act_overhead_us.median,
                    r.act_overhead_us.p90
                );
            }
            Ok(0)
        }
    }
}

/// `--task` names a task family, or a usage error says which there are.
fn known_task(task: &str) -> anyhow::Result<()> {
    if engine::tasks::get(task).is_none() {
        return Err(super::errors::usage(format!(
            "--task: unknown task `{}` (known: {})",
            engine::text::cut(task),
            engine::tasks::names().join(", ")
        )));
    }
    Ok(())
}
