//! Options shared by the sandbox commands, `engine sandbox exec`, and `engine reap`.

use clap::Subcommand;
use sandbox::{ExecRequest, InitProgram, Runtime, Sandbox};

pub use crate::oneshot::args::{admission_from_env, ExecArgs, SandboxOpts};
pub use crate::oneshot::outcome::{
    Outcome, EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SANDBOX_FAILURE, OUTPUT_CAP,
};

/// The instance cache of the state directory (mounted on first use).
pub fn cache() -> anyhow::Result<engine::synth::Cache> {
    Ok(engine::synth::Cache::open(
        &sandbox::state::default_state_dir(),
    )?)
}

/// The runtime of this process: init is `envfactory-init` beside the engine program when
/// present, else the engine program itself (`engine-core __sandbox-init`).
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

/// `engine sandbox exec`: run CMD in a fresh sandbox, print its output, return its exit code.
/// A daemon listening on the state directory's socket (`engine sandbox daemon`) runs it
/// unless `no_daemon` (see `daemon/`); else this process makes the sandbox.
pub fn exec(a: &ExecArgs) -> anyhow::Result<i32> {
    let (cfg, timeout) = a.checked()?;
    if !a.no_daemon {
        let exe = crate::oneshot::protocol::ExeId::of_self();
        let ask = crate::oneshot::client::ask(
            exe,
            &a.opts,
            &cfg,
            timeout,
            &a.cmd,
            super::signals::exit_at_once,
        );
        if let crate::oneshot::client::Asked::Answered(outcome) = ask? {
            return outcome.report(&a.opts.memory, timeout);
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
    one_shot(&mut sb, timeout, &a.cmd).report(&a.opts.memory, timeout)
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

impl Outcome {
    /// A failure to make the sandbox, as `engine` reports it (message and exit status).
    pub fn failed(e: &anyhow::Error) -> Self {
        Outcome::NotRun {
            code: super::errors::exit_code(e),
            message: super::errors::message(e),
        }
    }
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
        SandboxCmd::Exec(a) => exec(&a),
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
