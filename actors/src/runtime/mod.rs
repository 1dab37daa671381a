//! The runtime: a schedule run with every role in its own actor (actix `SyncArbiter`
//! threads, since candle and the sandboxes block), the workers stepped in parallel, and a
//! coordinator that runs the schedule and owns the metrics and checkpoints (through an
//! [`Observer`]).
//!
//! | file | actor |
//! |---|---|
//! | `coordinator.rs` | [`Coordinator`]: the schedule's loop, the observer, checkpoints |
//! | `checkpoint.rs` | checkpoints on disk, written whole or not at all; [`checkpoint::latest`] for a resume |
//! | `agent.rs` | an [`Agent`] (protagonist, antagonist) and its proxy |
//! | `synthesizer.rs` | an adversary and its proxy |
//! | `critic.rs` | the realism critic and its proxy |
//! | `curriculum.rs` | the level buffer and its proxy |
//! | `worker.rs` | one environment worker, supervised (restarted after a panic or an infrastructure failure), and [`ActorWorkers`] |
//!
//! Supervision: a worker's panic is caught in its actor, answered as a
//! [`FailureKind::Crash`](crate::msg::FailureKind) failure (the episode is masked from
//! learning, never scored as a zero reward), and the actor is restarted by actix with a fresh
//! worker from the factory; an infrastructure failure restarts it the same way. The run
//! goes on. A learner that panics ends the run with an error (its state cannot be
//! recovered without a checkpoint).

mod agent;
pub mod checkpoint;
mod coordinator;
mod critic;
mod curriculum;
mod role_actor;
mod synthesizer;
mod worker;

pub use agent::AgentProxy;
pub use coordinator::{save_roles, Control, Coordinator, Observer, Summary};
pub use critic::CriticProxy;
pub use curriculum::CurriculumProxy;
pub use synthesizer::SynthesizerProxy;
pub use worker::{ActorWorkers, WorkerCounts, WorkerFactory};

use crate::roles::{Agent, Critic, Curriculum, RoleError, Synthesizer};
use crate::schedule::{Roles, ScheduleConfig, ScheduleError};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("the {actor} actor is gone ({reason}); the run cannot go on")]
    ActorGone { actor: &'static str, reason: String },
    #[error("the actor system failed: {0}")]
    System(#[from] std::io::Error),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
}

/// The roles to run, before they are put in actors.
pub struct Parts {
    pub protagonist: Box<dyn Agent>,
    pub antagonist: Option<Box<dyn Agent>>,
    pub adversaries: Vec<Box<dyn Synthesizer>>,
    pub critic: Option<Box<dyn Critic>>,
    pub curriculum: Option<Box<dyn Curriculum>>,
    /// Workers to start, and how to make (and remake) worker `i`.
    pub workers: usize,
    pub worker_factory: WorkerFactory,
}

/// How long to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Stop once the protagonist has made this many updates.
    pub updates: u64,
}

/// Run `cfg`'s schedule on `parts` through actors until `budget` is spent or the observer
/// stops it. Blocks the calling thread (it runs its own actix system).
pub fn run(
    cfg: &ScheduleConfig,
    parts: Parts,
    observer: Box<dyn Observer>,
    budget: Budget,
) -> Result<Summary, RuntimeError> {
    run_from(cfg, parts, observer, budget, None)
}

/// [`run`], going on from `resume` when given: the schedule's state and the counts are
/// restored from it (the caller built `parts`' roles from its files), and the run continues
/// until the budget is spent.
pub fn run_from(
    cfg: &ScheduleConfig,
    parts: Parts,
    observer: Box<dyn Observer>,
    budget: Budget,
    resume: Option<checkpoint::Checkpoint>,
) -> Result<Summary, RuntimeError> {
    let cfg = cfg.clone();
    let system = actix::System::new();
    system.block_on(async move {
        let (roles, counts) = start(parts);
        let schedule = crate::schedule::build(&cfg, &roles)?;
        let coordinator = Coordinator::start(schedule, roles, observer, budget, counts, resume);
        coordinator
            .send(coordinator::Run)
            .await
            .map_err(|e| RuntimeError::ActorGone {
                actor: "coordinator",
                reason: e.to_string(),
            })?
    })
}

/// Every role in its actor; the schedule's [`Roles`] are the proxies.
fn start(parts: Parts) -> (Roles, Arc<WorkerCounts>) {
    let workers = ActorWorkers::start(parts.workers, parts.worker_factory);
    let counts = workers.counts();
    let roles = Roles {
        protagonist: Box::new(AgentProxy::start("protagonist", parts.protagonist)),
        antagonist: parts
            .antagonist
            .map(|a| Box::new(AgentProxy::start("antagonist", a)) as Box<dyn Agent>),
        adversaries: parts
            .adversaries
            .into_iter()
            .map(|a| Box::new(SynthesizerProxy::start(a)) as Box<dyn Synthesizer>)
            .collect(),
        critic: parts
            .critic
            .map(|c| Box::new(CriticProxy::start(c)) as Box<dyn Critic>),
        curriculum: parts
            .curriculum
            .map(|c| Box::new(CurriculumProxy::start(c)) as Box<dyn Curriculum>),
        workers: Box::new(workers),
    };
    (roles, counts)
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Wait for `f` on this (synchronous actor) thread. An actix request is a channel's
/// receiving end: it needs no executor, only a waker.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// A request to a role's actor, waited for; a vanished actor is a role error.
pub(crate) fn call<A, M>(
    role: &'static str,
    addr: &actix::Addr<A>,
    msg: M,
) -> Result<M::Result, RoleError>
where
    A: actix::Actor<Context = actix::SyncContext<A>> + actix::Handler<M>,
    M: actix::Message + Send + 'static,
    M::Result: Send,
{
    block_on(addr.send(msg)).map_err(|e| {
        RoleError::new(
            role,
            format!("its actor is gone ({e}): it panicked or was stopped"),
        )
    })
}

/// An actor system on its own thread, for callers that drive proxies themselves (benchmarks,
/// tools): its arbiter forwards the messages to the role actors, and the proxies block their
/// caller, which must therefore not be the system's thread.
pub struct Host {
    system: actix::System,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Host {
    /// Start a system and run `start` inside it (start actors and proxies there); returns what
    /// `start` made.
    pub fn start<T: Send + 'static>(
        start: impl FnOnce() -> T + Send + 'static,
    ) -> Result<(Self, T), RuntimeError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("actors-host".into())
            .spawn(move || {
                let system = actix::System::new();
                system.block_on(async move {
                    let made = start();
                    // The receiver waits for this; if it is gone, nobody needs the system.
                    let _ = tx.send((actix::System::current(), made));
                });
                system.run()
            })?;
        let (system, made) = rx.recv().map_err(|_| RuntimeError::ActorGone {
            actor: "host",
            reason: "its system stopped before it started".into(),
        })?;
        Ok((
            Self {
                system,
                thread: Some(thread),
            },
            made,
        ))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
