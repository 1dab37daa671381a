//! One episode of a task folder: a fresh sandbox of the built image; the agent (sees only
//! the instruction) or the oracle; the reward files deleted; the tests copied in after the
//! agent; the task's test script; the reward read by the host through the sandbox's trusted
//! file requests (`/logs/verifier/reward.txt` or `reward.json`, or pytest's `-rA` summary
//! for the Terminal-Bench layout).

use super::build::merge_env;
use super::{sbx_err, HarborError, Image, Layout, Oracle, Task};
use sandbox::{DynBackend, ExecRequest, ExecResult, SandboxConfig, SandboxOps};
use serde::Serialize;
use std::time::Instant;

/// Who acts in the episode.
#[derive(Clone)]
pub enum Agent {
    /// The task's reference solution.
    Oracle,
    /// Nothing: the tests on the untouched environment.
    Nothing,
    /// Shell commands, one per step, in order (a scripted agent).
    Commands(Vec<String>),
    /// A language model (docs/llm.md): told the instruction only, one command per turn,
    /// at most this many commands.
    Llm(
        std::sync::Arc<std::sync::Mutex<crate::agents::LlmAgent>>,
        u32,
    ),
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Oracle => f.write_str("Oracle"),
            Self::Nothing => f.write_str("Nothing"),
            Self::Commands(c) => f.debug_tuple("Commands").field(c).finish(),
            Self::Llm(_, n) => f.debug_tuple("Llm").field(n).finish(),
        }
    }
}

/// What the language model reads after a command.
fn observation(
    task: &Task,
    wd: &str,
    step: u32,
    max_steps: u32,
    last: Option<(&str, &sandbox::ExecResult)>,
) -> crate::env::Observation {
    let mut text = format!(
        "Task: {}\nWorking directory: {wd}\nStep {step} of {max_steps}\n",
        task.instruction.trim()
    );
    let mut o = crate::env::Observation {
        instruction: task.instruction.clone(),
        cwd: wd.to_string(),
        step,
        max_steps,
        ..Default::default()
    };
    if let Some((cmd, r)) = last {
        o.last_command = Some(cmd.to_string());
        o.exit_code = Some(r.exit_code());
        o.stdout = String::from_utf8_lossy(&r.stdout).into_owned();
        o.stderr = String::from_utf8_lossy(&r.stderr).into_owned();
        text.push_str(&format!(
            "$ {cmd}\nexit status {}\nstdout:\n{}\nstderr:\n{}\n",
            r.exit_code(),
            o.stdout,
            o.stderr
        ));
    }
    o.text = text;
    o
}

/// What one episode (or check) gave.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub task: String,
    pub passed: bool,
    pub reward: f64,
    pub reason: String,
    pub seconds: f64,
    /// Skipped before any sandbox ran (outside the supported subset).
    pub skipped: bool,
    /// Offline substitutions made for the verifier (see docs/harbor.md).
    pub substituted: Vec<String>,
    /// How `FROM` resolved; layers built and found cached.
    pub base: String,
    pub layers_built: usize,
    pub layers_cached: usize,
    /// The factory's perturbations applied to the task's image.
    pub perturbations: Vec<String>,
    /// The episode failed on this host's side, not the agent's (the layer store's I/O, a
    /// sandbox that does not start without the agent's changes either): masked, never a
    /// score. `reward` is then NaN (`null` in JSON), `passed` false, `reason` says why.
    pub infrastructure: bool,
}

const OFFLINE_BIN: &str = "/usr/local/lib/envfactory-offline/bin";

/// The offline rule: runners that test scripts download at test time, found in the script,
/// and the shim that stands for each (`uv`/`uvx` and `pip` over the image's own Python with
/// Debian's pytest, the `uv` installer a no-op).
fn offline_shims(script: &str) -> Vec<(&'static str, &'static str, &'static str)> {
    const SHIMS: &[(&str, &str, &str, &str)] = &[
        (
            "astral.sh/uv",
            "curl",
            "curl of the uv installer: a no-op (uv is a shim)",
            "#!/bin/sh\ncase \"$*\" in *astral.sh/uv*) echo 'mkdir -p \"$HOME/.local/bin\" && : > \"$HOME/.local/bin/env\"'; exit 0;; esac\nfor d in /usr/bin /bin /usr/local/bin; do [ -x $d/curl ] && exec $d/curl \"$@\"; done\necho 'curl: not found' >&2; exit 127\n",
        ),
        (
            "uvx",
            "uvx",
            "uvx: the image's python3 -m (Debian's pytest)",
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -p|--python|-w|--with|--from) shift 2;; --*) shift;; *) break;; esac; done\ntool=${1%%==*}; tool=${tool%%@*}; shift; exec python3 -m \"$tool\" \"$@\"\n",
        ),
        (
            "uv",
            "uv",
            "uv: run/pip/init over the image's python3, venv made anew (an activate that sets VIRTUAL_ENV only)",
            "#!/bin/sh\ncmd=$1; shift\ncase \"$cmd\" in\nrun) while [ $# -gt 0 ]; do case \"$1\" in -w|--with|-p|--python) shift 2;; --*) shift;; *) break;; esac; done\n  case \"$1\" in python|python3) shift; exec python3 \"$@\";; pytest) shift; exec python3 -m pytest \"$@\";; *) exec \"$@\";; esac;;\npip) exec pip \"$@\";;\nvenv) dir=.venv; while [ $# -gt 0 ]; do case \"$1\" in -p|--python|--prompt|-i|--index-url|--extra-index-url|--cache-dir) shift 2;; -*) shift;; *) dir=$1; shift;; esac; done\n  while [ \"${dir%/}\" != \"$dir\" ] && [ -n \"${dir%/}\" ]; do dir=${dir%/}; done\n  wd=$(pwd -P); parent=$(cd \"$(dirname \"$dir\")\" 2>/dev/null && pwd -P)\n  if [ -z \"$parent\" ] || case \"$(basename \"$dir\")\" in /|.|..) true;; *) false;; esac || case \"$parent/\" in \"${wd%/}\"/*) false;; *) true;; esac; then echo \"uv shim: refusing uv venv $dir: not under the working directory $wd\" >&2; exit 2; fi\n  if [ -L \"$dir\" ]; then rm -f \"$dir\"; fi\n  rm -rf \"$dir\" && mkdir -p \"$dir/bin\" && printf 'VIRTUAL_ENV=%s\\nexport VIRTUAL_ENV\\n' \"$(cd \"$dir\" && pwd)\" > \"$dir/bin/activate\"; exit $?;;\ninit|sync|add|python) exit 0;;\n*) echo \"uv shim: unsupported: uv $cmd\" >&2; exit 2;;\nesac\n",
        ),
        (
            "pip",
            "pip",
            "pip install: satisfied when the module imports (Debian's packages)",
            "#!/bin/sh\n[ \"$1\" = install ] || { echo \"pip shim: only install\" >&2; exit 2; }\nshift\nfor p in \"$@\"; do case \"$p\" in -*) continue;; esac\n  m=$(echo \"$p\" | sed 's/[<>=!~\\[].*//; s/-/_/g')\n  python3 -c \"import $m\" 2>/dev/null || { echo \"offline: $p is not installed in the image\" >&2; exit 1; }\ndone\nexit 0\n",
        ),
    ];
    let mut out = Vec::new();
    let words: Vec<&str> = script
        .split(|c: char| c.is_whitespace() || ";|&()`$".contains(c))
        .collect();
    for (needle, name, note, body) in SHIMS {
        let hit = if needle.contains('/') {
            script.contains(needle)
        } else {
            words
                .iter()
                .any(|w| w == needle || (*needle == "pip" && *w == "pip3"))
        };
        if hit {
            out.push((*name, *note, *body));
            if *name == "pip" {
                out.push(("pip3", *note, *body));
            }
        }
    }
    out
}

fn sh(
    cmd: &str,
    cwd: &str,
    env: &[String],
    user: Option<(u32, u32)>,
    timeout_s: f64,
) -> ExecRequest {
    let mut r = ExecRequest::shell(cmd.to_string());
    r.cwd = cwd.to_string();
    r.env = Some(env.to_vec());
    r.user = user;
    r.timeout_ms = (timeout_s * 1000.0) as u64;
    r.output_cap = 1 << 20;
    r
}

/// Seconds until `deadline`, `None` once it has passed.
fn seconds_left(deadline: Instant) -> Option<f64> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .as_secs_f64();
    (left > 0.0).then_some(left)
}

/// Parent directories of sandbox paths, quoted for `mkdir -p`.
fn parents<'a>(paths: impl Iterator<Item = &'a str>) -> String {
    let mut dirs: Vec<String> = paths
        .filter_map(|p| p.rsplit_once('/').map(|(d, _)| d.to_string()))
        .filter(|d| !d.is_empty())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs.iter()
        .map(|d| crate::instance::sh_quote(d))
        .collect::<Vec<_>>()
        .join(" ")
}

/// pytest's `-rA` summary: (passed, failed) test names.
pub fn pytest_summary(out: &str) -> (Vec<String>, Vec<String>) {
    let (mut passed, mut failed) = (Vec::new(), Vec::new());
    for l in out.lines() {
        let l = l.trim();
        if let Some(t) = l.strip_prefix("PASSED ") {
            passed.push(t.trim().to_string());
        } else if let Some(t) = l
            .strip_prefix("FAILED ")
            .or_else(|| l.strip_prefix("ERROR "))
        {
            failed.push(t.split(" - ").next().unwrap_or(t).trim().to_string());
        }
    }
    (passed, failed)
}

/// A reward file's number: `reward.txt` holds one; `reward.json` an object with `reward`
/// (or a single numeric value).
fn parse_reward(name: &str, data: &[u8]) -> Result<f64, String> {
    let text = String::from_utf8_lossy(data);
    let v = if name.ends_with(".txt") {
        text.trim().parse::<f64>().map_err(|_| {
            format!(
                "{name} holds `{}`, not a number",
                crate::text::cut(text.trim())
            )
        })?
    } else {
        let j: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{name}: not JSON: {e}"))?;
        let n = match &j {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Object(m) => {
                m.get("reward").and_then(|r| r.as_f64()).or_else(|| {
                    let nums: Vec<f64> = m.values().filter_map(|v| v.as_f64()).collect();
                    (nums.len() == 1).then(|| nums[0])
                })
            }
            _ => None,
        };
        n.ok_or_else(|| format!("{name}: no `reward` number"))?
    };
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{name}: {v} is not a finite reward"))
    }
}

/// The sandbox configuration of an episode of `task` on `img`.
pub fn episode_config(task: &Task, img: &Image) -> SandboxConfig {
    let mut cfg = SandboxConfig {
        rootfs: img.rootfs.clone(),
        layers: img.layers.clone(),
        disk_bytes: task.disk_bytes.unwrap_or(1 << 30).clamp(64 << 20, 16 << 30),
        hostname: "task".into(),
        ..SandboxConfig::default()
    };
    cfg.limits.memory_bytes = task.memory_bytes.unwrap_or(2 << 30).max(64 << 20);
    cfg.limits.cpus = task.cpus.unwrap_or(1.0);
    cfg.limits.pids = 1024;
    cfg.env = img.runtime.apply_env(&merge_env(&cfg.env, &img.env));
    cfg.readonly_paths = img.runtime.readonly.clone();
    if let Some(n) = img.runtime.nofile {
        cfg.nofile = n;
    }
    if let Some(d) = img.runtime.disk_bytes {
        cfg.disk_bytes = d;
    }
    cfg.disk_inodes = img.runtime.disk_inodes;
    cfg
}

/// One episode: returns the reward and why. A failure of this host's side (before the
/// agent acts: the sandbox does not start, a host file cannot be read; after: see
/// [`HarborError::Infrastructure`]) is a masked outcome, never a score; one after the agent
/// acted inside its sandbox is the agent's (reward 0).
pub fn run_episode(
    backend: &dyn DynBackend,
    store: &super::LayerStore,
    task: &Task,
    img: &Image,
    agent: &Agent,
) -> Result<Outcome, HarborError> {
    let t0 = Instant::now();
    match episode(backend, store, task, img, agent, t0) {
        Err(e) if !e.is_bad_input() => {
            tracing::warn!(task = %task.name, error = %e, "an infrastructure failure: the episode is masked");
            Ok(masked(task, img, t0, &e))
        }
        r => r,
    }
}

/// The outcome of an episode that failed on this host's side: no reward.
fn masked(task: &Task, img: &Image, t0: Instant, e: &HarborError) -> Outcome {
    let mut o = outcome(task, img, t0, f64::NAN, String::new(), vec![]);
    o.reason = match e {
        HarborError::Infrastructure { .. } => e.to_string(),
        _ => format!("infrastructure failure (not the agent's): {e}"),
    };
    o.infrastructure = true;
    o
}

fn episode(
    backend: &dyn DynBackend,
    store: &super::LayerStore,
    task: &Task,
    img: &Image,
    agent: &Agent,
    t0: Instant,
) -> Result<Outcome, HarborError> {
    let cfg = episode_config(task, img);
    // The layer store must have the task's disk free before the agent acts (its diff is
    // exported there): a store found full after the agent is then never the agent's doing. A
    // store with less is this host's failure, masked, never a smaller disk for the agent.
    if let Ok(free) = super::verifier::store_free(store) {
        if free < cfg.disk_bytes {
            return Err(HarborError::Infrastructure {
                what: task.name.clone(),
                reason: format!(
                    "the layer store has {free} bytes free, less than the task's disk of {} bytes: the agent's diff may not fit (masked before the agent acts)",
                    cfg.disk_bytes
                ),
            });
        }
    }
    let mut sbx = backend
        .create_boxed(&cfg)
        .map_err(sbx_err(format!("{}: starting the sandbox", task.name)))?;
    let root_env = cfg.env.clone();
    let run = runner(task);
    // The compose service's tmpfs mounts: empty at the start, whatever the image has there.
    let tmpfs: String = task
        .tmpfs
        .iter()
        .map(|(p, mode)| {
            let q = crate::instance::sh_quote(p);
            format!(" && rm -rf {q} && mkdir -p {q} && chmod {mode:o} {q}")
        })
        .collect();
    run(
        &mut sbx,
        &sh(
            &format!(
                "mkdir -p /logs/verifier /logs/agent {} && chmod 777 /logs /logs/verifier /logs/agent{tmpfs}",
                crate::instance::sh_quote(&img.workdir)
            ),
            "/",
            &root_env,
            None,
            30.0,
        ),
        "preparing /logs",
    )?;
    // The perturbations' steps at every episode start (as root, before the agent).
    super::verifier::start_steps(&mut sbx, task, img, &root_env)?;
    if matches!(agent, Agent::Oracle) && task.oracle.is_none() {
        return Ok(outcome(
            task,
            img,
            t0,
            0.0,
            "the task has no oracle".into(),
            vec![],
        ));
    }
    // From here on the agent acts: a sandbox that fails now is the agent's doing (it deleted
    // the shell, broke its init, filled what the verifier needs): the task scores 0 with the
    // reason, and the other tasks of a check go on. What fails on the host's side instead
    // (`Infrastructure`, a host file) is masked by the caller.
    match act_and_verify(backend, store, &cfg, sbx, task, img, agent, t0) {
        Err(e @ HarborError::Sandbox { .. }) => {
            tracing::warn!(task = %task.name, error = %e, "the agent broke its sandbox");
            Ok(outcome(
                task,
                img,
                t0,
                0.0,
                format!("the agent broke its sandbox: {e}"),
                vec![],
            ))
        }
        r => r,
    }
}

/// `sbx.exec`, its failure named with the task and what was being done.
fn runner(
    task: &Task,
) -> impl Fn(&mut Box<dyn SandboxOps>, &ExecRequest, &str) -> Result<ExecResult, HarborError> + '_ {
    move |sbx, req, what| {
        sbx.exec(req)
            .map_err(sbx_err(format!("{}: {what}", task.name)))
    }
}

/// The agent's phase, then the verifier's (`verifier::isolate` between them).
#[allow(clippy::too_many_arguments)]
fn act_and_verify(
    backend: &dyn DynBackend,
    store: &super::LayerStore,
    cfg: &SandboxConfig,
    mut sbx: Box<dyn SandboxOps>,
    task: &Task,
    img: &Image,
    agent: &Agent,
    t0: Instant,
) -> Result<Outcome, HarborError> {
    let agent_note = act(&mut sbx, task, img, agent, &cfg.env)?;
    let verifier_env = super::verifier::verifier_env(task, &cfg.env);
    let mut v = super::verifier::isolate(
        backend,
        store,
        cfg,
        sbx,
        task,
        img,
        &verifier_env,
        matches!(agent, Agent::Oracle),
    )?;
    let note = [agent_note, std::mem::take(&mut v.note)]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    verify(&mut v.sbx, task, img, &cfg.env, verifier_env, &note, t0)
}

/// The shell of the sandbox's root, absolute: `/bin/bash` where there is one.
fn shell_of(sbx: &mut Box<dyn SandboxOps>) -> &'static str {
    if sbx.stat("/bin/bash").is_ok() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

/// The agent's (or the oracle's) phase; returns what it did, for the reason.
fn act(
    sbx: &mut Box<dyn SandboxOps>,
    task: &Task,
    img: &Image,
    agent: &Agent,
    root_env: &[String],
) -> Result<String, HarborError> {
    let run = runner(task);
    let wd = img.workdir.clone();
    // The agent's phase: its environment and user, the instruction only.
    let agent_env = merge_env(root_env, &task.agent_env);
    let shell = shell_of(sbx);
    let mut agent_note = String::new();
    match agent {
        Agent::Nothing => {}
        Agent::Oracle => match &task.oracle {
            None => {}
            Some(Oracle::Script { dir, files, entry }) => {
                let dests: Vec<String> = files
                    .iter()
                    .map(|f| format!("/solution/{}", f.display()))
                    .collect();
                run(
                    sbx,
                    &sh(
                        &format!(
                            "mkdir -p /solution {}",
                            parents(dests.iter().map(String::as_str))
                        ),
                        "/",
                        root_env,
                        None,
                        30.0,
                    ),
                    "preparing /solution",
                )?;
                for (f, d) in files.iter().zip(&dests) {
                    let host = dir.join(f);
                    let data = std::fs::read(&host).map_err(|source| HarborError::Io {
                        path: host.clone(),
                        source,
                    })?;
                    sbx.write_file(d, &data, 0o755)
                        .map_err(sbx_err(format!("{}: copying the oracle", task.name)))?;
                }
                let r = run(
                    sbx,
                    &sh(
                        &format!("{shell} /solution/{entry}"),
                        &wd,
                        &agent_env,
                        img.user,
                        task.agent_timeout_s,
                    ),
                    "the oracle",
                )?;
                agent_note = format!("oracle exit {}", r.exit_code());
            }
            Some(Oracle::Keystrokes(cmds)) => {
                let mut req = sh(shell, &wd, &agent_env, img.user, task.agent_timeout_s);
                req.stdin = (cmds.join("\n") + "\n").into_bytes();
                let r = run(sbx, &req, "the oracle's keystrokes")?;
                agent_note = format!("oracle keystrokes exit {}", r.exit_code());
            }
        },
        Agent::Llm(llm, max_steps) => {
            let mut llm = llm.lock().unwrap_or_else(|p| p.into_inner());
            llm.start(&crate::instance::TaskSetup {
                task: task.name.clone(),
                seed: 0,
                instruction: task.instruction.clone(),
                cwd: wd.clone(),
                actions: Vec::new(),
                action_costs: Vec::new(),
                keywords: Vec::new(),
                max_steps: *max_steps,
                facts: serde_json::Value::Null,
            });
            let deadline =
                Instant::now() + std::time::Duration::from_secs_f64(task.agent_timeout_s);
            let mut obs = observation(task, &wd, 0, *max_steps, None);
            let mut steps = 0;
            agent_note = format!("the model used all {max_steps} commands");
            while steps < *max_steps {
                let Some(left) = seconds_left(deadline) else {
                    agent_note = "the agent's time ran out".into();
                    break;
                };
                let cmd = match llm.next(&obs) {
                    Ok(Some(crate::env::Action::Command(c))) => c,
                    Ok(_) => {
                        agent_note = format!("the model said DONE after {steps} commands");
                        break;
                    }
                    Err(e) => {
                        agent_note = format!("agent failure: {e}");
                        break;
                    }
                };
                steps += 1;
                let r = run(
                    sbx,
                    &sh(&cmd, &wd, &agent_env, img.user, left),
                    "an agent command",
                )?;
                obs = observation(task, &wd, steps, *max_steps, Some((&cmd, &r)));
            }
        }
        Agent::Commands(cmds) => {
            let deadline =
                Instant::now() + std::time::Duration::from_secs_f64(task.agent_timeout_s);
            for c in cmds {
                let Some(left) = seconds_left(deadline) else {
                    agent_note = "the agent's time ran out".into();
                    break;
                };
                run(
                    sbx,
                    &sh(c, &wd, &agent_env, img.user, left),
                    "an agent command",
                )?;
            }
        }
    }
    Ok(agent_note)
}

/// The verifier's phase in its sandbox: the reward files cleared, the tests copied in, the
/// test script run, the reward read.
#[allow(clippy::too_many_arguments)]
fn verify(
    sbx: &mut Box<dyn SandboxOps>,
    task: &Task,
    img: &Image,
    root_env: &[String],
    mut verifier_env: Vec<String>,
    agent_note: &str,
    t0: Instant,
) -> Result<Outcome, HarborError> {
    let run = runner(task);
    let wd = img.workdir.clone();
    let shell = shell_of(sbx);
    // The verifier: reward files deleted first (a reward the agent wrote must not count),
    // checked gone by the host, then the tests copied in (their folders made by the same
    // command: one exec less).
    let dests: Vec<String> = task
        .tests
        .iter()
        .map(|(rel, _)| format!("/tests/{rel}"))
        .collect();
    run(
        sbx,
        &sh(
            &format!(
                "rm -rf /logs/verifier /tests; mkdir -p /logs/verifier {} {OFFLINE_BIN} /tests {} && chmod 777 /logs/verifier",
                super::verifier::SAFE_PATH_DIR,
                parents(dests.iter().map(String::as_str))
            ),
            "/",
            root_env,
            None,
            30.0,
        ),
        "clearing /logs/verifier, preparing /tests",
    )?;
    for f in ["/logs/verifier/reward.txt", "/logs/verifier/reward.json"] {
        if sbx.stat(f).is_ok() {
            return Ok(outcome(
                task,
                img,
                t0,
                0.0,
                format!("{f} survived its deletion before the verifier: reward 0"),
                vec![],
            ));
        }
    }
    let mut script_text = String::new();
    for ((_, host), d) in task.tests.iter().zip(&dests) {
        let data = std::fs::read(host).map_err(|source| HarborError::Io {
            path: host.clone(),
            source,
        })?;
        if d == &task.test_script {
            script_text = String::from_utf8_lossy(&data).into_owned();
        }
        sbx.write_file(d, &data, 0o755)
            .map_err(sbx_err(format!("{}: copying the tests", task.name)))?;
    }
    // The verifier's Python start-up file (older Pythons ignore PYTHONSAFEPATH).
    sbx.write_file(
        &format!("{}/sitecustomize.py", super::verifier::SAFE_PATH_DIR),
        super::verifier::SAFE_PATH_SITECUSTOMIZE.as_bytes(),
        0o644,
    )
    .map_err(sbx_err(format!(
        "{}: the verifier's sitecustomize",
        task.name
    )))?;
    let shims = offline_shims(&script_text);
    let mut substituted = Vec::new();
    if !shims.is_empty() {
        for (name, note, body) in &shims {
            sbx.write_file(&format!("{OFFLINE_BIN}/{name}"), body.as_bytes(), 0o755)
                .map_err(sbx_err(format!("{}: offline shims", task.name)))?;
            if !substituted.iter().any(|s: &String| s == note) {
                substituted.push(note.to_string());
            }
        }
        let path = verifier_env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or(crate::instance::DEFAULT_PATH)
            .to_string();
        verifier_env = merge_env(
            &verifier_env,
            &[("PATH".into(), format!("{OFFLINE_BIN}:{path}"))],
        );
    }
    let r = run(
        sbx,
        &sh(
            &format!("{shell} {}", task.test_script),
            &wd,
            &verifier_env,
            img.user,
            task.verifier_timeout_s,
        ),
        "the verifier",
    )?;
    let exit = if r.termination == sandbox::Termination::TimedOut {
        format!("the verifier timed out after {} s", task.verifier_timeout_s)
    } else {
        format!("test script exit {}", r.exit_code())
    };
    let note = |s: String| {
        if agent_note.is_empty() {
            s
        } else {
            format!("{agent_note}; {s}")
        }
    };
    let (reward, reason) = match task.layout {
        Layout::TerminalBench => {
            let (passed, failed) = pytest_summary(&String::from_utf8_lossy(&r.stdout));
            if passed.is_empty() && failed.is_empty() {
                (
                    0.0,
                    note(format!("no pytest -rA results in the output ({exit})")),
                )
            } else if failed.is_empty() {
                (1.0, note(format!("{} tests passed", passed.len())))
            } else {
                (
                    0.0,
                    note(format!("failed: {}", crate::text::cut(&failed.join(", ")))),
                )
            }
        }
        Layout::Harbor => {
            let mut found = None;
            for name in ["reward.txt", "reward.json"] {
                let path = format!("/logs/verifier/{name}");
                if let Ok((data, _)) = sbx.read_file_nofollow(&path, 1 << 16) {
                    found = Some(parse_reward(name, &data).map(|v| (v, name)));
                    break;
                }
            }
            match found {
                Some(Ok((v, name))) => (v, note(format!("{name}: {v} ({exit})"))),
                Some(Err(e)) => (0.0, note(e)),
                None => (
                    0.0,
                    note(format!("the verifier wrote no reward file ({exit})")),
                ),
            }
        }
    };
    let mut o = outcome(task, img, t0, reward, reason, substituted);
    o.seconds = t0.elapsed().as_secs_f64();
    Ok(o)
}

fn outcome(
    task: &Task,
    img: &Image,
    t0: Instant,
    reward: f64,
    reason: String,
    substituted: Vec<String>,
) -> Outcome {
    Outcome {
        task: task.name.clone(),
        passed: reward >= 1.0,
        reward,
        reason,
        seconds: t0.elapsed().as_secs_f64(),
        skipped: false,
        substituted,
        base: img.base_note.clone(),
        layers_built: img.built,
        layers_cached: img.cached,
        perturbations: img.applied.clone(),
        infrastructure: false,
    }
}

/// Load, build and run `agent` on one task folder, the perturbations synthesized with `seed`;
/// a folder outside the supported subset is a skipped outcome, this host's failures masked
/// outcomes, other errors (bad input) errors.
#[allow(clippy::too_many_arguments)]
pub fn check_task(
    rt: &sandbox::Runtime,
    backend: &dyn DynBackend,
    store: &super::LayerStore,
    dir: &std::path::Path,
    build: &super::BuildOptions,
    agent: &Agent,
    perturb: &[crate::instance::PerturbationChoice],
    seed: u64,
) -> Result<Outcome, HarborError> {
    let t0 = Instant::now();
    let skipped = |e: HarborError| Outcome {
        task: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        passed: false,
        reward: 0.0,
        reason: e.to_string(),
        seconds: t0.elapsed().as_secs_f64(),
        skipped: true,
        substituted: vec![],
        base: String::new(),
        layers_built: 0,
        layers_cached: 0,
        perturbations: vec![],
        infrastructure: false,
    };
    let task = match super::load(dir) {
        Ok(t) => t,
        Err(e) if e.is_unsupported() => return Ok(skipped(e)),
        Err(e) => return Err(e),
    };
    let text =
        crate::text::read_input(&task.dockerfile).map_err(|e| HarborError::Read(Box::new(e)))?;
    let df = match super::dockerfile::parse(&text) {
        Ok(d) => d,
        Err(source) => {
            let e = HarborError::Dockerfile {
                file: task.dockerfile.clone(),
                source,
            };
            return if e.is_unsupported() {
                Ok(skipped(e))
            } else {
                Err(e)
            };
        }
    };
    // This host's failures (a build sandbox that does not start, the store's I/O) are masked
    // outcomes: the other tasks of a check go on.
    let infra = |e: HarborError| {
        let mut o = skipped(HarborError::Infrastructure {
            what: task.name.clone(),
            reason: e.to_string(),
        });
        o.skipped = false;
        o.infrastructure = true;
        o.reward = f64::NAN;
        o
    };
    let img = match super::build_image(rt, store, &task, &df, build) {
        Ok(i) => i,
        Err(e) if !e.is_bad_input() => return Ok(infra(e)),
        Err(e) => return Err(e),
    };
    let img = match super::perturb_image(rt, store, &img, perturb, seed) {
        Ok(i) => i,
        Err(e) if e.is_unsupported() => return Ok(skipped(e)),
        Err(e) if !e.is_bad_input() => return Ok(infra(e)),
        Err(e) => return Err(e),
    };
    run_episode(backend, store, &task, &img, agent)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pytest_and_reward_files() {
        let out = "=== short test summary info ===\nPASSED tests/test_a.py::test_one\nFAILED tests/test_a.py::test_two - assert 1 == 2\n";
        let (p, f) = pytest_summary(out);
        assert_eq!(p, vec!["tests/test_a.py::test_one"]);
        assert_eq!(f, vec!["tests/test_a.py::test_two"]);
        assert_eq!(parse_reward("reward.txt", b"1\n").unwrap(), 1.0);
        assert_eq!(
            parse_reward("reward.json", br#"{"reward": 0.5}"#).unwrap(),
            0.5
        );
        assert!(parse_reward("reward.txt", b"yes")
            .unwrap_err()
            .contains("not a number"));
        assert!(parse_reward("reward.txt", b"NaN").is_err());
        assert_eq!(offline_shims("uvx pytest /tests").len(), 1);
        assert!(offline_shims("pytest -rA").is_empty());
    }
}
