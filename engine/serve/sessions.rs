//! Sessions: one environment per client, on pooled environments whose sandboxes stay warm.
//!
//! A session holds no sandbox until its first reset, which takes an idle environment from the
//! pool or makes a new one. The pool prefers an environment that already runs the instance the
//! reset names (same task, seed and plan): its reset is the sandbox's incremental reset (about
//! a millisecond) instead of a new sandbox. A session whose own environment runs another
//! instance trades it for such a pooled one. Without a match, the environment returned
//! longest ago is taken, so that the instances used last stay warm. Closing a session (the client's `close`, a disconnect, the idle timeout)
//! returns its environment to the pool. A session can only step an episode it reset itself:
//! a pooled environment's last episode belongs to its previous session, and the reset that
//! starts the new one drops everything that session wrote and kills its processes.

use super::protocol::{observation_data, ErrorCode, ProtocolError, ResetArgs, StepView};
use crate::env::{Action, Env, EnvConfig, EnvError, Info};
use crate::instance::Plan;
use crate::synth::Cache;
use sandbox::Runtime;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Limits and defaults of the sessions of one server.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub max_sessions: usize,
    /// Idle environments kept warm (at most).
    pub pool: usize,
    /// A session with no message for this long is closed.
    pub idle_timeout: Duration,
    /// Where `reset(template = NAME)` finds `NAME.toml` (or `.yaml`).
    pub templates: PathBuf,
    /// The task of a reset that names none.
    pub default_task: String,
    pub env: EnvConfig,
    /// How a reset picks its environment from the pool.
    pub pool_policy: PoolPolicy,
}

/// How a reset picks its environment from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolPolicy {
    /// One that already runs the instance the reset names, else the one returned longest ago;
    /// a session's own environment when it runs that instance or the pool has none that does.
    #[default]
    Instance,
    /// The session's own environment, else the one returned last, whatever it runs (the
    /// policy before `Instance`; kept for `engine bench serve`'s comparison).
    Last,
}

/// The episode a session started.
struct Episode {
    id: Option<String>,
    task: String,
    seed: u64,
    steps: u32,
    done: bool,
    features: bool,
    episode_return: f64,
    progress: f64,
}

#[derive(Default)]
struct Slot {
    env: Option<Env>,
    episode: Option<Episode>,
}

/// One client's session.
pub struct Session {
    pub id: String,
    slot: tokio::sync::Mutex<Slot>,
    last_active: Mutex<Instant>,
    closed: AtomicBool,
    /// Woken when the server closes the session (idle timeout).
    pub closed_notify: tokio::sync::Notify,
}

impl Session {
    fn touch(&self) {
        if let Ok(mut t) = self.last_active.lock() {
            *t = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        self.last_active
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

struct Inner {
    live: HashMap<String, Arc<Session>>,
    pool: Vec<Env>,
}

/// Counts for `/metadata` and the tests.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Counts {
    pub active_sessions: usize,
    pub max_sessions: usize,
    pub pooled_envs: usize,
    /// Resets whose environment already ran the instance (incremental resets).
    pub warm_resets: u64,
    /// Resets that started a sandbox (and synthesized, unless the instance was cached).
    pub cold_resets: u64,
}

/// Every session of a server.
pub struct Sessions {
    inner: Mutex<Inner>,
    pub cfg: SessionConfig,
    rt: Runtime,
    cache: Cache,
    warm_resets: AtomicU64,
    cold_resets: AtomicU64,
}

fn execution(e: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::new(ErrorCode::ExecutionError, e.to_string())
}

/// A refused reset or step: the client's mistake (a bad action, an invalid plan) is a
/// validation error, the sandbox's failure an execution error marked `infra_failure`.
fn env_error(e: EnvError) -> ProtocolError {
    if e.is_infrastructure() {
        let mut p = execution(&e);
        p.infra_failure = true;
        return p;
    }
    let code = match e {
        EnvError::NotReset | EnvError::EpisodeOver => ErrorCode::ExecutionError,
        _ => ErrorCode::ValidationError,
    };
    ProtocolError::new(code, e.to_string())
}

/// Run an environment's blocking work off the event loop; a panic in it is the
/// infrastructure's failure (the environment is lost with it).
async fn on_blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ProtocolError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        let mut p = execution(format!("the {what} crashed: {e}"));
        p.infra_failure = true;
        p
    })
}

impl Sessions {
    pub fn new(cfg: SessionConfig, rt: Runtime, cache: Cache) -> Result<Self, EnvError> {
        // Check the environment configuration once, at start (bad patterns, rewards).
        drop(Env::new(rt.clone(), cache.clone(), cfg.env.clone())?);
        Ok(Self {
            inner: Mutex::new(Inner {
                live: HashMap::new(),
                pool: Vec::new(),
            }),
            cfg,
            rt,
            cache,
            warm_resets: AtomicU64::new(0),
            cold_resets: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves maps that are still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn counts(&self) -> Counts {
        let g = self.lock();
        Counts {
            active_sessions: g.live.len(),
            max_sessions: self.cfg.max_sessions,
            pooled_envs: g.pool.len(),
            warm_resets: self.warm_resets.load(Ordering::Relaxed),
            cold_resets: self.cold_resets.load(Ordering::Relaxed),
        }
    }

    /// Open a session, or `CAPACITY_REACHED` when `max_sessions` are open.
    pub fn open(&self) -> Result<Arc<Session>, ProtocolError> {
        let mut g = self.lock();
        if g.live.len() >= self.cfg.max_sessions {
            return Err(ProtocolError::new(
                ErrorCode::CapacityReached,
                format!(
                    "Server at capacity: {} of {} sessions open",
                    g.live.len(),
                    self.cfg.max_sessions
                ),
            ));
        }
        let id = format!("{:032x}", rand::random::<u128>());
        let s = Arc::new(Session {
            id: id.clone(),
            slot: tokio::sync::Mutex::new(Slot::default()),
            last_active: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            closed_notify: tokio::sync::Notify::new(),
        });
        g.live.insert(id, s.clone());
        tracing::debug!(session = %s.id, active = g.live.len(), "session opened");
        Ok(s)
    }

    /// The open session of an id (`SESSION_ERROR` when there is none).
    pub fn get(&self, id: &str) -> Result<Arc<Session>, ProtocolError> {
        self.lock().live.get(id).cloned().ok_or_else(|| {
            ProtocolError::new(
                ErrorCode::SessionError,
                format!("Unknown session_id: {}", crate::text::cut(id)),
            )
        })
    }

    /// Close a session (idempotent) and return its environment to the pool once any running
    /// call of it has finished.
    pub async fn close(self: &Arc<Self>, s: &Arc<Session>) {
        if s.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        s.closed_notify.notify_waiters();
        let env = s.slot.lock().await.env.take();
        // The closed session's processes and files go now (an incremental reset), not at
        // some later session's reset: a pooled environment holds no CPU, memory or pids of
        // a session that left. One that cannot be reset is torn down instead.
        let env = match env {
            Some(mut env) => tokio::task::spawn_blocking(move || {
                let ok = env.running().is_none_or(|r| r.restart().is_ok());
                ok.then_some(env)
            })
            .await
            .ok()
            .flatten(),
            None => None,
        };
        // The session counts as live until its environment is back in the pool (or gone), so
        // `active_sessions == 0` means every environment has been returned.
        let leftover = env.and_then(|env| {
            let mut g = self.lock();
            g.live.remove(&s.id);
            if g.pool.len() < self.cfg.pool {
                g.pool.push(env);
                None
            } else {
                Some(env)
            }
        });
        self.lock().live.remove(&s.id);
        if let Some(env) = leftover {
            // Dropping an environment tears its sandbox down: not on the event loop.
            let _ = tokio::task::spawn_blocking(move || drop(env)).await;
        }
        tracing::debug!(session = %s.id, "session closed");
    }

    /// Close every session idle for longer than the timeout (not those inside a call).
    pub async fn reap_idle(self: &Arc<Self>) -> usize {
        let idle: Vec<Arc<Session>> = self
            .lock()
            .live
            .values()
            .filter(|s| s.idle_for() > self.cfg.idle_timeout && s.slot.try_lock().is_ok())
            .cloned()
            .collect();
        for s in &idle {
            tracing::info!(session = %s.id, "idle timeout: session closed");
            self.close(s).await;
        }
        idle.len()
    }

    /// The environment a reset of `plan` runs on, given the session's own (`mine`), and the
    /// session's environment it gave up for a pooled one, if it did.
    fn pick(&self, mine: Option<Env>, plan: &Plan) -> Result<(Env, Option<Env>), ProtocolError> {
        if self.cfg.pool_policy == PoolPolicy::Last {
            return match mine {
                Some(env) => Ok((env, None)),
                None => Ok((self.take_any(|pool| pool.pop())?, None)),
            };
        }
        let mine = match mine {
            Some(env) if env.runs(plan) => return Ok((env, None)),
            mine => mine,
        };
        let matched = {
            let mut g = self.lock();
            // The most recently returned match (the pool is in return order).
            let at = g.pool.iter().rposition(|e| e.runs(plan));
            at.map(|i| g.pool.remove(i))
        };
        match (matched, mine) {
            (Some(env), mine) => Ok((env, mine)),
            (None, Some(env)) => Ok((env, None)),
            (None, None) => Ok((
                self.take_any(|pool| (!pool.is_empty()).then(|| pool.remove(0)))?,
                None,
            )),
        }
    }

    /// An environment from the pool (`choose` picks it), else a new one.
    fn take_any(
        &self,
        choose: impl FnOnce(&mut Vec<Env>) -> Option<Env>,
    ) -> Result<Env, ProtocolError> {
        if let Some(env) = choose(&mut self.lock().pool) {
            return Ok(env);
        }
        Env::new(self.rt.clone(), self.cache.clone(), self.cfg.env.clone()).map_err(env_error)
    }

    /// Return an environment a session gave up to the pool, its processes and files gone
    /// first (as on close); torn down when the pool is full or it cannot be reset.
    fn give_back(&self, mut env: Env) {
        let ok = env.running().is_none_or(|r| r.restart().is_ok());
        if ok {
            let mut g = self.lock();
            if g.pool.len() < self.cfg.pool {
                g.pool.push(env);
                return;
            }
        }
        drop(env);
    }

    /// Start an episode in a session.
    pub async fn reset(
        self: &Arc<Self>,
        s: &Session,
        args: ResetArgs,
    ) -> Result<Value, ProtocolError> {
        s.touch();
        let seed = args.seed.unwrap_or_else(|| rand::random::<u32>().into());
        let templates = self.cfg.templates.clone();
        let default_task = self.cfg.default_task.clone();
        let max_steps = args.max_steps.or(self.cfg.env.max_steps);
        let mut slot = s.slot.lock().await;
        // Closed while this call waited for the slot (idle reaper, MCP close): no new
        // environment for a session nobody will return it from.
        if s.is_closed() {
            return Err(ProtocolError::new(
                ErrorCode::SessionError,
                "the session is closed",
            ));
        }
        let mine = slot.env.take();
        slot.episode = None;
        let me = self.clone();
        let (env, result) = on_blocking("reset", move || {
            let plan = match args.plan(&templates, &default_task, seed) {
                Ok(p) => p,
                Err(e) => return (mine, Err(e)),
            };
            let (mut env, spare) = match me.pick(mine, &plan) {
                Ok(p) => p,
                Err(e) => return (None, Err(e)),
            };
            let warm = env.runs(&plan);
            let r = Ok::<_, ProtocolError>(plan)
                .and_then(|plan| {
                    // Per episode: a pooled environment keeps nothing of its last session's.
                    env.set_max_steps(max_steps);
                    let obs = env.reset(&plan).map_err(env_error)?;
                    let info = Info {
                        progress: env.progress(),
                        instance: env.instance_id().unwrap_or_default().to_string(),
                        ..Info::default()
                    };
                    let catalogue = env.task().map(|t| t.actions.clone()).unwrap_or_default();
                    let data = observation_data(&StepView {
                        observation: &obs,
                        reward: None,
                        terminated: false,
                        truncated: false,
                        info: &info,
                        catalogue: Some(&catalogue),
                        features: args.features,
                    });
                    let task = plan.task.map(|t| t.name).unwrap_or_default();
                    Ok((data, task, info.progress))
                })
                .map(|(data, task, progress)| {
                    let ep = Episode {
                        id: args.episode_id.clone(),
                        task,
                        seed,
                        steps: 0,
                        done: false,
                        features: args.features,
                        episode_return: 0.0,
                        progress,
                    };
                    (data, ep)
                });
            if r.is_ok() {
                let counter = if warm {
                    &me.warm_resets
                } else {
                    &me.cold_resets
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(spare) = spare {
                me.give_back(spare);
            }
            (Some(env), r)
        })
        .await?;
        slot.env = env;
        s.touch();
        let (data, ep) = result?;
        slot.episode = Some(ep);
        Ok(data)
    }

    /// One step of the session's episode.
    pub async fn step(&self, s: &Session, action: Action) -> Result<Value, ProtocolError> {
        s.touch();
        let mut slot = s.slot.lock().await;
        if s.is_closed() {
            return Err(ProtocolError::new(
                ErrorCode::SessionError,
                "the session is closed",
            ));
        }
        let features = match &slot.episode {
            None => return Err(execution("step called before reset")),
            Some(ep) if ep.done => return Err(execution(EnvError::EpisodeOver)),
            Some(ep) => ep.features,
        };
        let Some(mut env) = slot.env.take() else {
            return Err(execution("step called before reset"));
        };
        let (env, result) = on_blocking("step", move || {
            let r = env.step(&action).map_err(env_error).map(|st| {
                let data = observation_data(&StepView {
                    observation: &st.observation,
                    reward: Some(st.reward),
                    terminated: st.terminated,
                    truncated: st.truncated,
                    info: &st.info,
                    catalogue: None,
                    features,
                });
                (
                    data,
                    st.terminated || st.truncated,
                    st.reward,
                    st.info.progress,
                )
            });
            (env, r)
        })
        .await?;
        slot.env = Some(env);
        s.touch();
        let (data, done, reward, progress) = result?;
        if let Some(ep) = slot.episode.as_mut() {
            ep.steps += 1;
            ep.done = done;
            ep.episode_return += reward;
            ep.progress = progress;
        }
        Ok(data)
    }

    /// The session's state (`openenv-core`'s `State`: `episode_id`, `step_count`, and ours).
    pub async fn state(&self, s: &Session) -> Value {
        s.touch();
        let slot = s.slot.lock().await;
        let instance = slot
            .env
            .as_ref()
            .filter(|_| slot.episode.is_some())
            .and_then(|e| e.instance_id().map(String::from));
        match &slot.episode {
            None => json!({
                "episode_id": null,
                "step_count": 0,
                "session_id": s.id,
                "started": false,
            }),
            Some(ep) => json!({
                "episode_id": ep.id,
                "step_count": ep.steps,
                "session_id": s.id,
                "started": true,
                "task": ep.task,
                "seed": ep.seed,
                "instance": instance,
                "done": ep.done,
                "progress": ep.progress,
                "episode_return": ep.episode_return,
            }),
        }
    }

    /// Close every session and drop the pool (the sandboxes go with their environments).
    pub async fn shutdown(self: &Arc<Self>) {
        let all: Vec<Arc<Session>> = self.lock().live.values().cloned().collect();
        for s in &all {
            self.close(s).await;
        }
        let pool = std::mem::take(&mut self.lock().pool);
        let _ = tokio::task::spawn_blocking(move || drop(pool)).await;
    }
}
