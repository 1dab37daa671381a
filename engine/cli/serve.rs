//! `engine serve`: the environments over the OpenEnv protocol (docs/serve.md).

use engine::serve::{Limits, ServeConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct ServeOpts {
    /// Address to listen on (port 0 picks a free one; the address is printed on stdout).
    /// Anything but loopback needs --token-file.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub bind: SocketAddr,
    /// Sessions open at once (more are refused with CAPACITY_REACHED).
    #[arg(long, default_value = "64", value_parser = super::count::<100_000>)]
    pub max_sessions: usize,
    /// A file holding the bearer token every request must carry (mode 600, at least 16 characters).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Idle environments kept with their sandboxes warm for the next sessions.
    #[arg(long, default_value = "16")]
    pub pool: usize,
    /// Seconds without a message after which a session is closed.
    #[arg(long, default_value = "300", value_parser = super::seconds)]
    pub idle_timeout: f64,
    /// Seconds between WebSocket pings.
    #[arg(long, default_value = "20", value_parser = super::seconds)]
    pub keepalive: f64,
    /// Largest accepted frame or request body, bytes.
    #[arg(long, default_value = "1048576", value_parser = super::count::<{ 64 << 20 }>)]
    pub max_frame_bytes: usize,
    /// The task of a reset that names none.
    #[arg(long, default_value = "archive-logs")]
    pub task: String,
    /// Directory of the templates a reset may name.
    #[arg(long, default_value = "templates")]
    pub templates: PathBuf,
    /// Overrides the tasks' step limits (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,
    /// How a reset picks a pooled environment: `instance` prefers one already running the
    /// instance it names (an incremental reset); `last` takes the one returned last, whatever
    /// it runs (the old policy, for comparisons).
    #[arg(long, default_value = "instance")]
    pub pool_policy: PoolPolicyArg,
    /// Event-loop threads.
    #[arg(long, default_value = "2", value_parser = super::count::<256>)]
    pub threads: usize,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolPolicyArg {
    Instance,
    Last,
}

pub fn run(o: &ServeOpts) -> anyhow::Result<i32> {
    if engine::tasks::get(&o.task).is_none() {
        return Err(super::errors::usage(format!(
            "--task: unknown task `{}` (known: {})",
            engine::text::cut(&o.task),
            engine::tasks::names().join(", ")
        )));
    }
    let token = match &o.token_file {
        Some(f) => Some(
            engine::serve::auth::read_token(f).map_err(|e| super::errors::usage(e.to_string()))?,
        ),
        None => None,
    };
    engine::serve::auth::check_bind(&o.bind, token.as_deref())
        .map_err(|e| super::errors::usage(e.to_string()))?;
    let cfg = ServeConfig {
        bind: o.bind,
        token,
        sessions: engine::serve::sessions::SessionConfig {
            max_sessions: o.max_sessions,
            pool: o.pool,
            idle_timeout: Duration::from_secs_f64(o.idle_timeout),
            templates: o.templates.clone(),
            default_task: o.task.clone(),
            env: engine::env::EnvConfig {
                max_steps: o.max_steps,
                ..Default::default()
            },
            pool_policy: match o.pool_policy {
                PoolPolicyArg::Instance => engine::serve::sessions::PoolPolicy::Instance,
                PoolPolicyArg::Last => engine::serve::sessions::PoolPolicy::Last,
            },
        },
        limits: Limits {
            max_frame_bytes: o.max_frame_bytes,
            keepalive: Duration::from_secs_f64(o.keepalive),
        },
        threads: o.threads,
    };
    let rt = super::sandbox::runtime()?;
    engine::serve::serve(cfg, rt, super::sandbox::cache()?, |addr| {
        outln!("listening on http://{addr}");
    })?;
    Ok(0)
}
