//! A synthesized instance running in a sandbox: the sandbox is created once per instance with
//! the instance's layer above the base, its environment, limits and fault proxies; every
//! episode starts with the sandbox's incremental reset followed by the instance's start steps
//! (a reset kills every process, so services, hogs and zombies are started again).

use crate::instance::{Instance, Plan};
use crate::looks::{Answering, Looks};
use crate::netfault::{start_proxy, NetfaultError, ProxyHandle};
use crate::probe::{SandboxConfirm, SandboxProbe};
use crate::synth::{Cache, PinnedInstance, SynthError};
use crate::tasks::Verdict;
use sandbox::{
    DynBackend, ExecRequest, ExecResult, Limits, RootfsSpec, Runtime, SandboxConfig, SandboxError,
    SandboxOps,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RunningError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Synth(#[from] SynthError),
    #[error("base rootfs `{base}`: {source}")]
    Base {
        base: String,
        // Boxed: the image importer's errors are large, and this one is rare.
        source: Box<sandbox::layers::LayerError>,
    },
    #[error("start step of `{by}` failed (exit {code}): {stderr}")]
    Start {
        by: String,
        code: i32,
        stderr: String,
    },
    #[error(transparent)]
    Proxy(#[from] NetfaultError),
    #[error("verifier: {0}")]
    Probe(#[from] crate::probe::ProbeError),
    #[error("the instance has no task to judge")]
    NoTask,
    #[error("instance {id} cannot run on the {backend} backend: {reason}")]
    Unsupported {
        id: String,
        backend: &'static str,
        reason: &'static str,
    },
}

impl RunningError {
    /// True when the failure is the infrastructure's (sandbox, cache), not the instance's.
    pub fn is_infrastructure(&self) -> bool {
        match self {
            Self::Sandbox(e) => e.is_infrastructure(),
            Self::Synth(e) => e.is_infrastructure(),
            Self::Probe(e) => e.is_infrastructure(),
            Self::Proxy(_) => true,
            _ => false,
        }
    }

    /// The perturbation that cannot take hold in the instance, and why (the plan is skipped,
    /// neither the agent's failure nor the infrastructure's).
    pub fn not_applicable(&self) -> Option<(&str, String)> {
        match self {
            Self::Synth(e) => e.not_applicable(),
            _ => None,
        }
    }
}

/// A plan's base rootfs source (`host`, a directory, `oci:PATH`).
pub fn base_spec(base: &str) -> Result<RootfsSpec, RunningError> {
    base.parse().map_err(|source| RunningError::Base {
        base: base.to_string(),
        source: Box::new(source),
    })
}

/// Resolve a plan's base and synthesize (or find in the cache) its instance.
pub fn synthesize(
    rt: &Runtime,
    cache: &Cache,
    plan: &Plan,
) -> Result<PinnedInstance, RunningError> {
    let rootfs = rt.resolve(&base_spec(&plan.base)?)?;
    Ok(cache.get_or_build(plan, &rootfs)?)
}

/// The sandbox configuration of an instance.
pub fn sandbox_config(instance: &Instance) -> Result<SandboxConfig, RunningError> {
    let base = SandboxConfig::default();
    let spec = base_spec(&instance.plan.base)?;
    let r = &instance.plan.resources;
    Ok(SandboxConfig {
        rootfs: spec,
        layers: vec![instance.layer.clone()],
        limits: Limits {
            memory_bytes: r.memory_bytes,
            pids: r.pids,
            cpus: r.cpus,
        },
        disk_bytes: instance.runtime.disk_bytes.unwrap_or(r.disk_bytes),
        disk_inodes: instance.runtime.disk_inodes,
        readonly_paths: instance.runtime.readonly.clone(),
        env: instance.runtime.apply_env(&base.env),
        nofile: instance.runtime.nofile.unwrap_or(base.nofile),
        ..base
    })
}

/// The default wall-clock limit of one agent command, in milliseconds.
pub const AGENT_STEP_TIMEOUT_MS: u64 = 10_000;
/// The default bytes kept of each output stream of an agent command.
pub const AGENT_OUTPUT_CAP: u64 = 256 << 10;
/// The default bytes of each output stream an agent is shown.
pub const OBSERVATION_BYTES: usize = 2048;

/// What an agent is shown of a command's output: each stream clipped to `max` bytes with its
/// control characters escaped (tabs and newlines kept), the truncation flags, and stderr
/// annotated when the command timed out or ran out of memory. `Env` and the catalogue oracle's
/// certification both show commands this way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

impl Shown {
    pub fn of(res: &ExecResult, timeout_ms: u64, max: usize) -> Self {
        let clip = |b: &[u8]| {
            crate::text::escape_control(&String::from_utf8_lossy(&b[..b.len().min(max)]))
                .into_owned()
        };
        let mut stderr = clip(&res.stderr);
        if res.termination == sandbox::Termination::TimedOut {
            stderr.push_str(&format!(
                "\n[timed out after {timeout_ms} ms; its processes were killed]"
            ));
        }
        if res.oom_killed {
            stderr.push_str("\n[killed: out of memory]");
        }
        Self {
            stdout: clip(&res.stdout),
            stderr,
            stdout_truncated: res.stdout_truncated || res.stdout.len() > max,
            stderr_truncated: res.stderr_truncated || res.stderr.len() > max,
        }
    }
}

/// Marker that ends an agent command's stderr with its final working directory, followed by
/// a fresh nonce per command ([`cwd_mark`]).
const CWD_MARK: &str = "\u{1e}envfactory-cwd:";

/// This command's marker: [`CWD_MARK`] and a random nonce. Only the epilogue's shell holds the
/// nonce; a command that runs without a shell (and so without the epilogue) never sees it, so
/// nothing it prints can pass for the epilogue's report.
fn cwd_mark() -> String {
    format!("{CWD_MARK}{:016x}:", rand::random::<u64>())
}

/// An instance in its sandbox (on the native backend, or another one such as Docker's).
pub struct RunningInstance {
    /// Reached through [`Self::sandbox`] and [`Self::sandbox_mut`], so that no request outside
    /// this type can slip between a command and the answers that came with it.
    sandbox: Box<dyn SandboxOps>,
    pub instance: Instance,
    _pinned: PinnedInstance,
    _proxies: Vec<ProxyHandle>,
    /// Working directory of commands (the task's, else `/root`).
    pub cwd: String,
    pub env: Vec<String>,
    /// The processes alive once this episode's start steps had finished, when the instance
    /// asks for them (`RuntimeSettings::record_start_processes`).
    start_processes: Option<std::collections::BTreeSet<(u32, u64)>>,
    /// What the verifier and the observation asked after the last agent command, sent along
    /// with the next command or reset ([`crate::looks`]). Its answers serve only
    /// [`Self::judge`] and [`Self::overview`] right after [`Self::run_agent`] or
    /// [`Self::restart`].
    looks: Looks,
}

impl RunningInstance {
    /// Create the instance's sandbox on the native backend and start its first episode.
    pub fn start(rt: &Runtime, held: PinnedInstance) -> Result<Self, RunningError> {
        Self::start_on(rt, held)
    }

    /// Create the instance's sandbox on `backend` and start its first episode.
    pub fn start_on(backend: &dyn DynBackend, held: PinnedInstance) -> Result<Self, RunningError> {
        let cfg = sandbox_config(&held.instance)?;
        if !backend.keeps_namespaces_across_resets() && !held.instance.runtime.proxies.is_empty() {
            return Err(RunningError::Unsupported {
                id: held.instance.id.clone(),
                backend: backend.name(),
                reason: "its fault proxies (network faults, a service's front proxy) need a \
                    backend whose resets keep the network namespace: this one recreates the \
                    container, and the proxies would stay in the old one's namespace",
            });
        }
        let sandbox = backend.create_boxed(&cfg)?;
        let mut proxies = Vec::new();
        for p in &held.instance.runtime.proxies {
            proxies.push(start_proxy(sandbox.init_pid(), p)?);
        }
        let instance = held.instance.clone();
        let cwd = start_cwd(&instance);
        let mut running = Self {
            sandbox,
            instance,
            _pinned: held,
            _proxies: proxies,
            cwd,
            env: cfg.env,
            start_processes: None,
            looks: Looks::default(),
        };
        running.run_start_steps()?;
        Ok(running)
    }

    /// Start a new episode: incremental reset, then the start steps; the agent's directory is
    /// the task's start directory again.
    pub fn restart(&mut self) -> Result<(), RunningError> {
        let ended_in = std::mem::replace(&mut self.cwd, start_cwd(&self.instance));
        if self.instance.runtime.start.is_empty() {
            // The start state's verdict and observation mostly ask what the last step's asked:
            // asked again with the reset, they are answered on the fresh state in its own
            // exchange (`looks.rs`). Not when start steps follow: those change the state after.
            // The observation lists the start directory, wherever the last step ended.
            let sent = self.looks.take_asked_for_reset(&ended_in, &self.cwd);
            let answers = self.sandbox.reset_and_look(&sent)?;
            self.looks.keep(sent, answers);
        } else {
            self.looks.clear();
            self.sandbox.reset()?;
        }
        for p in &self._proxies {
            p.new_episode();
        }
        self.run_start_steps()
    }

    fn run_start_steps(&mut self) -> Result<(), RunningError> {
        for step in self.instance.runtime.start.clone() {
            let mut req = ExecRequest::shell(step.shell.clone());
            req.cwd = "/".into();
            req.timeout_ms = 10_000;
            req.output_cap = 64 << 10;
            // Start steps run with a clean, known environment: the instance's perturbed
            // variables are for the agent's commands.
            req.env = Some(SandboxConfig::default().env);
            let r = self.sandbox.exec(&req)?;
            if !r.success() {
                return Err(RunningError::Start {
                    by: step.by,
                    code: r.exit_code(),
                    stderr: String::from_utf8_lossy(&r.stderr).trim().to_string(),
                });
            }
        }
        // Which processes the episode started, before the agent's first command: (pid, start
        // time) pairs, read through init. A failure fails the start (a verifier that needs
        // them must not run without them).
        self.start_processes = None;
        if self.instance.runtime.record_start_processes {
            let procs = crate::probe::processes_of(self.sandbox.as_mut())?;
            self.start_processes = Some(procs.iter().map(|p| (p.pid, p.start_ticks)).collect());
        }
        Ok(())
    }

    /// Run a shell command as the agent would: the instance's environment, the current cwd.
    pub fn run(&mut self, cmd: &str, timeout: Duration) -> Result<ExecResult, RunningError> {
        // What was asked is kept for the next agent command (answers come only after one).
        self.looks.drop_answers();
        let mut req = ExecRequest::shell(cmd);
        req.cwd = self.cwd.clone();
        req.env = Some(self.env.clone());
        req.timeout_ms = timeout.as_millis() as u64;
        Ok(self.sandbox.exec(&req)?)
    }

    /// Run a command the way the agent's commands run: the instance's environment, the current
    /// cwd, and the directory the command ends in becomes the next command's cwd (as in an
    /// interactive shell). The engine's epilogue is removed from the result's stderr.
    pub fn run_agent(
        &mut self,
        cmd: &str,
        timeout_ms: u64,
        output_cap: u64,
    ) -> Result<ExecResult, RunningError> {
        // The command runs as written, parsed alone; the epilogue, the shell's EXIT trap
        // (`ExecRequest::shell_text`), reports the final directory on stderr and keeps the
        // status when the shell exits (by `exit` and `set -e` too; not when the command sets
        // its own EXIT trap, execs or is killed: the cwd then stays). It quiets `set -x` and
        // survives `set -u`, an unset `PWD` and any `IFS` before it reports.
        // A command that needs no shell runs as its words without it (the directory cannot
        // change: only a shell's `cd` changes the shell's), saving the shell's exec.
        let mark = cwd_mark();
        let mut req = ExecRequest::shell(cmd);
        req.shell_epilogue = Some(format!(
            "{{ __ef_rc=$?; set +xeu; }} 2>&-; printf '{mark}%s' \"${{PWD-}}\" >&2; exit \"$__ef_rc\""
        ));
        req.cwd = self.cwd.clone();
        req.env = Some(self.env.clone());
        req.timeout_ms = timeout_ms;
        req.output_cap = output_cap;
        self.looks.attach(&mut req);
        let mut res = self.sandbox.exec(&req)?;
        self.looks
            .received(std::mem::take(&mut req.looks), &mut res);
        if let Some(pos) = find_last(&res.stderr, mark.as_bytes()) {
            // The directory runs to the end of the line: a background process may write to
            // stderr after the epilogue.
            let rest = &res.stderr[pos + mark.len()..];
            let end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
            let dir = String::from_utf8_lossy(&rest[..end]).into_owned();
            if dir.starts_with('/') && !dir.chars().any(char::is_control) {
                self.cwd = dir;
            }
            let tail = rest[end..].to_vec();
            res.stderr.truncate(pos);
            res.stderr.extend_from_slice(&tail);
        }
        Ok(res)
    }

    /// The task's verdict on the current state: its verifier's reads, and when they pass, its
    /// confirmation by the system's own entry points from a clean state ([`Task::confirm`]),
    /// after which the files are as the agent left them and no process runs.
    ///
    /// [`Task::confirm`]: crate::tasks::Task::confirm
    pub fn judge(&mut self) -> Result<Verdict, RunningError> {
        // The fields one by one: the task's setup is borrowed while the sandbox is asked.
        let Self {
            sandbox,
            instance,
            start_processes,
            looks,
            ..
        } = self;
        let Some(setup) = instance.task.as_ref() else {
            return Err(RunningError::NoTask);
        };
        let task = crate::tasks::get(&setup.task).ok_or(RunningError::NoTask)?;
        // The verifier's reads: answered from what came with the agent's command where they
        // did ([`crate::looks`]).
        let contact = AtomicBool::new(false);
        let mut answering = Answering::new(sandbox.as_mut(), looks, Some(&contact));
        let verified = task.verify(
            setup,
            &mut SandboxProbe {
                sandbox: &mut answering,
                start_processes: start_processes.as_ref(),
                contact: Some(&contact),
            },
        );
        looks.after_verify(contact.load(Ordering::Relaxed));
        let mut v = verified?;
        if !v.success {
            // The verifier's checks are the first half of the progress, the confirmation the
            // second ([`Verdict::confirmed_by`]): progress never falls when verify first passes.
            v.progress *= 0.5;
            return Ok(v);
        }
        // The confirmation reads and changes the sandbox as it is now; an observation after
        // it asks afresh.
        looks.drop_answers();
        let mut sys = SandboxConfirm::new(SandboxProbe {
            sandbox: sandbox.as_mut(),
            start_processes: start_processes.as_ref(),
            contact: None,
        });
        let c = task.confirm(setup, &mut sys);
        sys.finish()?;
        Ok(v.confirmed_by(c?))
    }

    /// The sandbox, to read what does not change it (its pids, whether it lives).
    pub fn sandbox(&self) -> &dyn SandboxOps {
        self.sandbox.as_ref()
    }

    /// The sandbox, for any request: the answers that came with the last agent command are
    /// dropped first.
    pub fn sandbox_mut(&mut self) -> &mut dyn SandboxOps {
        self.looks.drop_answers();
        self.sandbox.as_mut()
    }

    /// Requests of the verifier and the observation answered from what came with an agent
    /// command, so far ([`crate::looks`]).
    pub fn looks_answered(&self) -> u64 {
        self.looks.answered()
    }

    /// The overview an observation shows (the listing of `path`, the disk usage): the one that
    /// came with the last agent command or reset when the sandbox has not changed since, else
    /// asked.
    pub fn overview(
        &mut self,
        path: &str,
        max_entries: u32,
    ) -> Result<sandbox::protocol::Overview, RunningError> {
        // After a verifier's TCP contact no answer is used: the overview is not sent ahead
        // either (it would be thrown away at every step).
        let o = if self.looks.contacted() {
            self.sandbox.overview(path, max_entries)
        } else {
            let mut answering = Answering::new(self.sandbox.as_mut(), &mut self.looks, None);
            answering.overview(path, max_entries)
        };
        self.looks.drop_answers();
        Ok(o?)
    }

    /// Trusted reads of the sandbox (for verifiers), as it is now: the answers that came with
    /// the last agent command are dropped first.
    pub fn probe(&mut self) -> SandboxProbe<'_> {
        self.looks.drop_answers();
        SandboxProbe {
            sandbox: self.sandbox.as_mut(),
            start_processes: self.start_processes.as_ref(),
            contact: None,
        }
    }
}

/// The directory an episode's agent starts in.
fn start_cwd(instance: &Instance) -> String {
    instance
        .task
        .as_ref()
        .map_or_else(|| "/root".to_string(), |t| t.cwd.clone())
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| &hay[i..i + needle.len()] == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_marker_wins() {
        let s = b"a\x1eenvfactory-cwd:/x b \x1eenvfactory-cwd:/y";
        let p = find_last(s, CWD_MARK.as_bytes()).unwrap();
        assert_eq!(&s[p + CWD_MARK.len()..], b"/y");
        assert_eq!(find_last(b"ab", b"abc"), None);
    }

    #[test]
    fn every_command_gets_its_own_marker() {
        let (a, b) = (cwd_mark(), cwd_mark());
        assert!(a.starts_with(CWD_MARK) && b.starts_with(CWD_MARK));
        assert_ne!(a, b);
    }
}
