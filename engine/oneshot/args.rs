//! The one-shot's command line (`engine sandbox exec [OPTIONS] -- CMD...`), its sandbox
//! options, and the environment's admission settings: parsed and checked the same way by the
//! front and by the engine program.

use clap::Parser;
use engine::units::{parse_duration, parse_size};
use sandbox::SandboxConfig;

/// A usage error of the command line, as opposed to a failure while running.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// A usage error for `?`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    Usage(msg.into()).into()
}

// The log option, the same in `Cli` and `OneShotCli`. (A plain comment: clap takes a doc
// comment here for the `about` of every command this is flattened into.)
#[derive(Debug, PartialEq, clap::Args)]
pub struct LogOpt {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `sandbox=debug`.
    #[arg(long, global = true, env = "ENVFACTORY_LOG", default_value = "warn")]
    pub log: String,
}

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

/// The arguments of `engine sandbox exec` (also parsed alone: [`OneShotCli`]).
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

impl ExecArgs {
    /// The sandbox configuration and the timeout, checked (a usage error otherwise), with the
    /// environment's admission settings: input, checked whoever makes the sandbox.
    pub fn checked(&self) -> anyhow::Result<(SandboxConfig, std::time::Duration)> {
        if self.cmd.is_empty() {
            return Err(usage(super::outcome::NO_COMMAND));
        }
        let cfg = self.opts.config()?;
        let timeout = anyhow::Context::context(parse_duration(&self.timeout), "--timeout")?;
        check_admission_env()?;
        Ok((cfg, timeout))
    }
}

/// `engine sandbox exec ...` alone: a parser of that subcommand's arguments only. The parser
/// of the whole command line builds every subcommand's arguments first, about 0.6 ms of a
/// one-shot's 2 ms start (docs/sandbox.md, "The one-shot daemon").
#[derive(Parser)]
#[command(
    name = "engine",
    bin_name = "engine sandbox exec",
    disable_help_flag = true,
    disable_version_flag = true
)]
pub struct OneShotCli {
    #[command(flatten)]
    pub logging: LogOpt,
    #[command(flatten)]
    pub exec: ExecArgs,
}

impl OneShotCli {
    /// The one-shot's parse of `args` (a whole command line, program name first), when they
    /// are `engine sandbox exec` and valid; `None` for anything else (help, a bad or unknown
    /// option, `--log` before `sandbox`, every other command), which the whole parser takes.
    pub fn parse(args: &[std::ffi::OsString]) -> Option<Self> {
        if args.get(1)? != "sandbox" || args.get(2)? != "exec" {
            return None;
        }
        let rest =
            std::iter::once(std::ffi::OsString::from("engine")).chain(args[3..].iter().cloned());
        OneShotCli::try_parse_from(rest).ok()
    }
}

/// A count option in `1..=MAX` (a violation is a usage error: exit 2).
pub fn count<const MAX: usize>(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number in 1..={MAX}")),
    }
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
        a.max_sandboxes = Some(count::<1_000_000>(&v).map_err(|e| {
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
