//! The environment worker actors, supervised, and [`ActorWorkers`], the schedule's
//! [`Workers`] over them: every worker stepped in parallel, one message each.
//!
//! A worker that panics (caught in its actor) or reports an infrastructure failure answers
//! the failure and stops; actix's `SyncContext` then restarts the actor, and the next
//! request builds a fresh worker from the factory. A worker the factory cannot build
//! answers an infrastructure failure and is tried again at the next request.

use super::block_on;
use crate::msg::{Failure, FailureKind, Level, Start, StepResult};
use crate::roles::{EnvWorker, Workers};
use actix::{ActorContext, Addr, Handler, Message, SyncContext};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Makes (and remakes, after a restart) worker `i`.
pub type WorkerFactory = Arc<dyn Fn(usize) -> Result<Box<dyn EnvWorker>, Failure> + Send + Sync>;

/// What supervision did.
#[derive(Debug, Default)]
pub struct WorkerCounts {
    /// Workers restarted (after a panic or an infrastructure failure).
    pub restarts: AtomicU64,
    /// Panics caught.
    pub panics: AtomicU64,
    /// Workers built by the factory (the first ones included).
    pub built: AtomicU64,
}

struct WorkerActor {
    index: usize,
    factory: WorkerFactory,
    worker: Option<Box<dyn EnvWorker>>,
    counts: Arc<WorkerCounts>,
}

impl actix::Actor for WorkerActor {
    type Context = SyncContext<Self>;
}

struct Reset(Level);
impl Message for Reset {
    type Result = Result<Start, Failure>;
}

struct Step(u32);
impl Message for Step {
    type Result = StepResult;
}

/// Drop the worker (and its environment) now.
struct Shutdown;
impl Message for Shutdown {
    type Result = ();
}

impl Handler<Shutdown> for WorkerActor {
    type Result = ();
    fn handle(&mut self, _: Shutdown, _: &mut Self::Context) {
        self.worker = None;
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

impl WorkerActor {
    /// Run `f` on the worker (built first if needed) under supervision.
    fn supervised<T>(
        &mut self,
        ctx: &mut SyncContext<Self>,
        what: &'static str,
        f: impl FnOnce(&mut dyn EnvWorker) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        if self.worker.is_none() {
            let built = catch_unwind(AssertUnwindSafe(|| (self.factory)(self.index)));
            match built {
                Ok(Ok(w)) => {
                    self.counts.built.fetch_add(1, Ordering::Relaxed);
                    self.worker = Some(w);
                }
                Ok(Err(f)) => {
                    tracing::warn!(worker = self.index, reason = %f.message, "worker could not be built");
                    return Err(Failure::new(FailureKind::Infrastructure, f.message));
                }
                Err(p) => {
                    self.counts.panics.fetch_add(1, Ordering::Relaxed);
                    return Err(Failure::new(
                        FailureKind::Crash,
                        format!(
                            "worker {} panicked while being built: {}",
                            self.index,
                            panic_text(&*p)
                        ),
                    ));
                }
            }
        }
        let Some(w) = self.worker.as_deref_mut() else {
            return Err(Failure::new(FailureKind::Crash, "no worker"));
        };
        let r = match catch_unwind(AssertUnwindSafe(|| f(w))) {
            Ok(r) => r,
            Err(p) => {
                self.counts.panics.fetch_add(1, Ordering::Relaxed);
                Err(Failure::new(
                    FailureKind::Crash,
                    format!(
                        "worker {} panicked in {what}: {}",
                        self.index,
                        panic_text(&*p)
                    ),
                ))
            }
        };
        if let Err(f) = &r {
            if matches!(f.kind, FailureKind::Crash | FailureKind::Infrastructure) {
                tracing::warn!(worker = self.index, kind = ?f.kind, reason = %f.message, "worker restarted");
                self.counts.restarts.fetch_add(1, Ordering::Relaxed);
                // Drop the worker now (its sandbox goes with it); actix restarts the actor.
                self.worker = None;
                ctx.stop();
            }
        }
        r
    }
}

impl Handler<Reset> for WorkerActor {
    type Result = Result<Start, Failure>;
    fn handle(&mut self, m: Reset, ctx: &mut Self::Context) -> Self::Result {
        self.supervised(ctx, "reset", |w| w.reset(&m.0))
    }
}

impl Handler<Step> for WorkerActor {
    type Result = StepResult;
    fn handle(&mut self, m: Step, ctx: &mut Self::Context) -> Self::Result {
        self.supervised(ctx, "step", |w| w.step(m.0))
    }
}

/// The workers as actors, one thread each.
pub struct ActorWorkers {
    addrs: Vec<Addr<WorkerActor>>,
    factory: WorkerFactory,
    counts: Arc<WorkerCounts>,
}

fn start_one(
    index: usize,
    factory: &WorkerFactory,
    counts: &Arc<WorkerCounts>,
) -> Addr<WorkerActor> {
    let (factory, counts) = (factory.clone(), counts.clone());
    actix::SyncArbiter::start(1, move || WorkerActor {
        index,
        factory: factory.clone(),
        worker: None,
        counts: counts.clone(),
    })
}

impl ActorWorkers {
    /// `n` worker actors (inside a running actix system); each builds its worker at its
    /// first request.
    pub fn start(n: usize, factory: WorkerFactory) -> Self {
        let counts = Arc::new(WorkerCounts::default());
        let addrs = (0..n).map(|i| start_one(i, &factory, &counts)).collect();
        Self {
            addrs,
            factory,
            counts,
        }
    }

    pub fn counts(&self) -> Arc<WorkerCounts> {
        self.counts.clone()
    }

    /// A failure for a request whose actor vanished; the actor is started again.
    fn gone(&mut self, i: usize, e: actix::MailboxError) -> Failure {
        self.counts.restarts.fetch_add(1, Ordering::Relaxed);
        self.addrs[i] = start_one(i, &self.factory, &self.counts);
        Failure::new(
            FailureKind::Crash,
            format!("worker {i}'s actor is gone ({e}); started again"),
        )
    }
}

impl Workers for ActorWorkers {
    fn len(&self) -> usize {
        self.addrs.len()
    }

    fn reset(&mut self, levels: &[(usize, Level)]) -> Vec<Result<Start, Failure>> {
        // Every request is queued before any is waited for: the workers run in parallel.
        let pending: Vec<_> = levels
            .iter()
            .map(|(i, l)| (*i, self.addrs.get(*i).map(|a| a.send(Reset(l.clone())))))
            .collect();
        pending
            .into_iter()
            .map(|(i, req)| match req {
                None => Err(Failure::new(FailureKind::Crash, format!("no worker {i}"))),
                Some(req) => block_on(req).unwrap_or_else(|e| Err(self.gone(i, e))),
            })
            .collect()
    }

    fn step(&mut self, actions: &[Option<u32>]) -> Vec<Option<StepResult>> {
        let pending: Vec<_> = self
            .addrs
            .iter()
            .zip(actions)
            .map(|(a, act)| act.map(|x| a.send(Step(x))))
            .collect();
        pending
            .into_iter()
            .enumerate()
            .map(|(i, req)| req.map(|r| block_on(r).unwrap_or_else(|e| Err(self.gone(i, e)))))
            .collect()
    }

    fn shutdown(&mut self) {
        let pending: Vec<_> = self.addrs.iter().map(|a| a.send(Shutdown)).collect();
        for p in pending {
            // A worker whose actor is already gone has nothing left to tear down.
            let _ = block_on(p);
        }
    }
}
