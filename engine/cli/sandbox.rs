//! Options shared by the sandbox commands, `engine sandbox exec`, and `engine reap`.

use super::errors::usage;
use clap::Subcommand;
use engine::units::{parse_duration, parse_size};
use sandbox::{ExecRequest, ExecResult, InitProgram, Runtime, Sandbox, SandboxConfig, Termination};

/// Exit code of `engine sandbox exec` when the sandbox itself failed.
pub const EXIT_SANDBOX_FAILURE: i32 = 125;
/// Exit code when the command could not be executed (found but not runnable).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// The usage error of a one-shot without a command.
pub const NO_COMMAND: &str = "no command given: engine sandbox exec [OPTIONS] -- CMD...";
/// Exit code when the wall timeout passed.
pub const EXIT_TIMEOUT: i32 = 124;

/// Sandbox options as given on the command line.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct SandboxOpts {
    /// Root filesystem: `host`, a directory, `oci:PATH` (OCI layout or docker-save tarball),
    /// `docker:IMAGE` (an image of the local Docker daemon, exported once) or
    /// `debootstrap:SUITE` (a Debian suite's minimal system, made once from the archive).
    #[arg(long, default_value = "host")]
    pub rootfs: String,
    /// Memory limit (cgroup), e.g. 256M.
    #[arg(long, default_value = "256M")]
    pub memory: String,
    /// Maximum number of processes.
    #[arg(long, default_value_t = 128)]
    pub pids: u64,
    /// CPU quota in cores (0 for none).
    #[arg(long, default_value_t = 1.0)]
    pub cpus: f64,
    /// Size of the writable layer; writes beyond it fail with ENOSPC.
    #[arg(long, default_value = "64M")]
    pub disk: String,
    /// Run as root of a user namespace (an unprivileged uid on the host). System files of
    /// the read-only layers then appear owned by `nobody` and cannot be changed.
    #[arg(long)]
    pub userns: bool,
}

impl SandboxOpts {
    /// The same options as command-line arguments (for a child `engine` process).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--rootfs={}", self.rootfs),
            format!("--memory={}", self.memory),
            format!("--pids={}", self.pids),
            format!("--cpus={}", self.cpus),
            format!("--disk={}", self.disk),
        ];
        if self.userns {
            a.push("--userns".into());
        }
        a
    }

    /// Validate into a sandbox configuration.
    pub fn config(&self) -> anyhow::Result<SandboxConfig> {
        use anyhow::Context;
        let mut c = SandboxConfig {
            rootfs: self.rootfs.parse().context("--rootfs")?,
            ..SandboxConfig::default()
        };
        c.limits.memory_bytes = parse_size(&self.memory).context("--memory")?;
        c.disk_bytes = parse_size(&self.disk).context("--disk")?;
        if !(2..=MAX_PIDS).contains(&self.pids) {
            return Err(usage(format!(
                "--pids: {} is outside 2..={MAX_PIDS} (init and one command at least, the kernel's pid limit at most)",
                self.pids
            )));
        }
        if !(self.cpus >= 0.0 && self.cpus <= MAX_CPUS) {
            return Err(usage(format!(
                "--cpus: {} is not a number of cores in 0..={MAX_CPUS} (0 for no quota)",
                self.cpus
            )));
        }
        c.limits.pids = self.pids;
        c.limits.cpus = self.cpus;
        c.userns = self.userns;
        Ok(c)
    }
}

/// The most processes a sandbox may be given (the kernel's `PID_MAX_LIMIT`).
pub const MAX_PIDS: u64 = 1 << 22;
/// The largest CPU quota, in cores.
pub const MAX_CPUS: f64 = 1024.0;

/// The instance cache of the state directory (mounted on first use).
pub fn cache() -> anyhow::Result<engine::synth::Cache> {
    Ok(engine::synth::Cache::open(
        &sandbox::state::default_state_dir(),
    )?)
}

/// The runtime of this process: init is `envfactory-init` beside the engine binary when
/// present, else the engine binary itself (`engine __sandbox-init`).
pub fn runtime() -> anyhow::Result<Runtime> {
    let init = match InitProgram::locate() {
        Ok(i) => i,
        Err(_) => InitProgram::at(std::env::current_exe()?, vec!["__sandbox-init".into()])?,
    };
    let admission = admission_from_env()?;
    let rt = Runtime::new(&sandbox::state::default_state_dir(), init)?;
    super::signals::track(&rt);
    rt.set_admission(admission);
    Ok(rt)
}

/// The Docker backend on the daemon of `DOCKER_HOST` (else the default socket); creating it
/// removes the containers of runs that are gone.
pub fn docker_backend() -> anyhow::Result<sandbox::docker::DockerBackend> {
    let client = sandbox::docker::Client::from_env()?;
    super::signals::track_docker(&client);
    let work = sandbox::state::default_state_dir().join("docker-work");
    Ok(sandbox::docker::DockerBackend::new(client, &work))
}

/// Admission control from the environment: `ENVFACTORY_MAX_SANDBOXES` (a count; unset: no
/// cap) and `ENVFACTORY_MEMORY_RESERVE` (a size such as `2G`, a share such as `5%`, or `0`
/// for none; unset: 3% of the machine's memory).
pub fn admission_from_env() -> anyhow::Result<sandbox::Admission> {
    admission_env(true)
}

/// Check the admission variables without reading the machine's memory for the default
/// reserve (a one-shot a daemon serves makes no sandbox itself).
pub fn check_admission_env() -> anyhow::Result<()> {
    admission_env(false).map(drop)
}

fn admission_env(default_reserve: bool) -> anyhow::Result<sandbox::Admission> {
    let mut a = if default_reserve {
        sandbox::Admission::default()
    } else {
        sandbox::Admission {
            max_sandboxes: None,
            memory_reserve_bytes: 0,
        }
    };
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(v) = var("ENVFACTORY_MAX_SANDBOXES") {
        a.max_sandboxes = Some(super::count::<1_000_000>(&v).map_err(|e| {
            usage(format!(
                "ENVFACTORY_MAX_SANDBOXES: `{}`: {e}",
                engine::text::cut(&v)
            ))
        })?);
    }
    if let Some(v) = var("ENVFACTORY_MEMORY_RESERVE") {
        let bad = |why: String| usage(format!("ENVFACTORY_MEMORY_RESERVE: {why}"));
        a.memory_reserve_bytes = match v.trim() {
            "0" => 0,
            t if t.ends_with('%') => {
                let pct: u64 = t[..t.len() - 1]
                    .trim()
                    .parse()
                    .ok()
                    .filter(|p| *p <= 90)
                    .ok_or_else(|| {
                        bad(format!(
                            "`{}` is not a share of memory in 0%..=90%",
                            engine::text::cut(t)
                        ))
                    })?;
                sandbox::admission::host_memory_bytes().unwrap_or(0) / 100 * pct
            }
            t => parse_size(t).map_err(|e| bad(e.to_string()))?,
        };
    }
    Ok(a)
}

/// `engine sandbox exec`: run CMD in a fresh sandbox, print its output, return its exit code.
/// A daemon listening on the state directory's socket (`engine sandbox daemon`) runs it
/// unless `no_daemon` (see `daemon/`); else this process makes the sandbox.
pub fn exec(
    opts: &SandboxOpts,
    timeout: &str,
    cmd: &[String],
    no_daemon: bool,
) -> anyhow::Result<i32> {
    if cmd.is_empty() {
        return Err(usage(NO_COMMAND));
    }
    let cfg = opts.config()?;
    let timeout = anyhow::Context::context(parse_duration(timeout), "--timeout")?;
    // The environment's admission settings are input, checked whoever makes the sandbox.
    check_admission_env()?;
    if !no_daemon {
        if let Some(outcome) = super::daemon::ask(opts, &cfg, timeout, cmd)? {
            return outcome.report(&opts.memory, timeout);
        }
    }
    let rt = runtime()?;
    // Its init forked from this process, which has a single thread until the signal watcher
    // starts, right after init does (an init program named by ENVFACTORY_INIT is always
    // exec'd); if the create fails before, `signals::before_exit` starts it when a signal
    // came meanwhile.
    rt.set_forked_inits(std::env::var_os("ENVFACTORY_INIT").is_none());
    rt.after_next_init_start(Box::new(|| {
        super::signals::start_watcher();
    }));
    let mut sb = rt.create(&cfg)?;
    one_shot(&mut sb, timeout, cmd).report(&opts.memory, timeout)
}

/// What a one-shot's command came to, wherever its sandbox was made.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// It ran (and exited, was killed or timed out).
    Ran(ExecResult),
    /// It did not run: its sandbox could not be made, or could not execute it. The exit
    /// status and the message `engine` prints.
    NotRun { code: i32, message: String },
}

/// Run `cmd` as a one-shot's command in `sb`.
pub fn one_shot(sb: &mut Sandbox, timeout: std::time::Duration, cmd: &[String]) -> Outcome {
    let mut req = ExecRequest::argv(cmd.iter().cloned());
    req.timeout_ms = timeout.as_millis() as u64;
    req.output_cap = OUTPUT_CAP;
    match sb.exec(&req) {
        Ok(r) => Outcome::Ran(r),
        Err(e) => Outcome::NotRun {
            code: match &e {
                sandbox::SandboxError::Request {
                    kind: sandbox::protocol::FailureKind::NotFound,
                    ..
                } => EXIT_NOT_FOUND,
                sandbox::SandboxError::Request { .. } => EXIT_CANNOT_EXECUTE,
                _ => EXIT_SANDBOX_FAILURE,
            },
            message: e.to_string(),
        },
    }
}

/// The most output a one-shot keeps per stream.
pub const OUTPUT_CAP: u64 = 64 << 20;

impl Outcome {
    /// A failure to make the sandbox, as `engine` reports it (message and exit status).
    pub fn failed(e: &anyhow::Error) -> Self {
        Outcome::NotRun {
            code: super::errors::exit_code(e),
            message: super::errors::message(e),
        }
    }

    /// Print the command's output and what ended it; the exit status of `engine`.
    pub fn report(self, memory: &str, timeout: std::time::Duration) -> anyhow::Result<i32> {
        let result = match self {
            Outcome::Ran(r) => r,
            Outcome::NotRun { code, message } => {
                eprintln!("engine: {message}");
                return Ok(code);
            }
        };
        use std::io::Write;
        std::io::stdout().write_all(&result.stdout)?;
        std::io::stderr().write_all(&result.stderr)?;
        if result.stdout_truncated || result.stderr_truncated {
            eprintln!("engine: output truncated at {OUTPUT_CAP} bytes per stream");
        }
        match result.termination {
            Termination::TimedOut => {
                eprintln!(
                    "engine: timed out after {timeout:?}; the command's process tree was killed"
                );
            }
            Termination::Signaled(s) if result.oom_killed => {
                eprintln!("engine: killed by signal {s}: out of memory (limit {memory})");
            }
            Termination::Signaled(s) => eprintln!("engine: killed by signal {s}"),
            Termination::Exited(_) => {}
        }
        Ok(match result.termination {
            Termination::TimedOut => EXIT_TIMEOUT,
            _ => result.exit_code(),
        })
    }
}

/// The arguments of `engine sandbox exec` (also parsed alone: [`super::Cli::from_args`]).
#[derive(Debug, PartialEq, clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub opts: SandboxOpts,
    /// Wall-clock limit; the whole process tree is killed when it passes.
    #[arg(long, default_value = "10s")]
    pub timeout: String,
    /// Make the sandbox in this process even when a daemon serves the state directory.
    #[arg(long)]
    pub no_daemon: bool,
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

#[derive(Subcommand)]
pub enum SandboxCmd {
    /// Run CMD in a fresh sandbox; exit with its status (2 bad option, 124 timeout, 125
    /// sandbox failure, 126 cannot execute, 127 not found, 128+N killed by signal N; 130, 143,
    /// 129 when the engine itself gets SIGINT, SIGTERM, SIGHUP: the sandbox is torn down).
    Exec(ExecArgs),
    /// Serve `engine sandbox exec` from this process (in the foreground; SIGINT or SIGTERM
    /// stop it): a one-shot then pays neither a runtime's start nor, once a configuration
    /// was asked for, its sandbox's creation (docs/sandbox.md, "The one-shot daemon").
    Daemon(super::daemon::DaemonOpts),
}

pub fn run(cmd: SandboxCmd) -> anyhow::Result<i32> {
    match cmd {
        SandboxCmd::Exec(a) => exec(&a.opts, &a.timeout, &a.cmd, a.no_daemon),
        SandboxCmd::Daemon(o) => super::daemon::daemon(&o),
    }
}

/// `engine reap`: creating a runtime reaps; dropping it removes its own (empty) run.
pub fn reap(cache: bool) -> anyhow::Result<i32> {
    let rt = runtime()?;
    outln!("reaped; state directory {}", rt.state_dir().display());
    // Containers of the Docker backend whose run is gone, when a daemon answers.
    if let Ok(client) = sandbox::docker::Client::from_env() {
        let work = rt.state_dir().join("docker-work");
        let removed = sandbox::docker::DockerBackend::new(client, &work).reaped_at_start();
        outln!("docker: {removed} containers of runs that are gone removed");
    }
    if cache && engine::synth::remove_cache(rt.state_dir())? {
        outln!("instance cache removed");
    }
    if cache && engine::harbor::LayerStore::remove(rt.state_dir())? {
        outln!("harbor layer store removed");
    }
    if let Some(store) = cache
        .then(sandbox::mask_store::default_dir)
        .as_deref()
        .and_then(sandbox::mask_store::MaskStore::open)
    {
        store.prune(0, "");
        outln!(
            "host mask store {} emptied (entries in use kept)",
            store.dir().display()
        );
    }
    Ok(0)
}
