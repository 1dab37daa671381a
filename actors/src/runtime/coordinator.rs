//! The coordinator: runs the schedule's iterations until the budget is spent, hands each to
//! the [`Observer`] (metrics, progress, when to checkpoint), and writes a checkpoint
//! ([`super::checkpoint`]) when asked; a resumed run starts from one.

use super::checkpoint::{self, Checkpoint, Progress};
use super::worker::WorkerCounts;
use super::{Budget, RuntimeError};
use crate::roles::RoleError;
use crate::schedule::{Iteration, Roles, Schedule};
use actix::{Addr, Handler, Message, SyncContext};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What the observer wants after an iteration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Control {
    /// Write a checkpoint as this directory before going on: every role (`protagonist/`,
    /// `antagonist/`, `adversary-K/`, `critic/`, `curriculum/`), the schedule's state and the
    /// counts ([`super::checkpoint`]).
    pub checkpoint: Option<PathBuf>,
    /// End the run after this iteration (an interruption, a target reached).
    pub stop: bool,
}

/// Where the coordinator reports: metrics, progress, checkpoints.
pub trait Observer: Send {
    /// After iteration `index` (from 0); `updates` is the protagonist's update count.
    fn iteration(&mut self, index: u64, updates: u64, it: &Iteration)
        -> Result<Control, RoleError>;
    /// Write what the observer needs to go on from the checkpoint being written in `dir`
    /// (its metrics so far, say), before the checkpoint is marked complete.
    fn checkpointed(&mut self, _dir: &Path) -> Result<(), RoleError> {
        Ok(())
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub iterations: u64,
    pub updates: u64,
    pub steps: u64,
    pub episodes: u64,
    /// Episodes that failed (masked), by the infrastructure, a crash or an unusable level.
    pub failed_episodes: u64,
    pub worker_restarts: u64,
    pub worker_panics: u64,
    /// The observer asked to stop before the budget was spent.
    pub stopped: bool,
}

type Parts = (
    Box<dyn Schedule>,
    Roles,
    Box<dyn Observer>,
    Budget,
    Arc<WorkerCounts>,
    Option<Checkpoint>,
);

/// The coordinator actor (one `SyncArbiter` thread: the schedule blocks on its roles).
pub struct Coordinator {
    parts: Option<Parts>,
}

impl actix::Actor for Coordinator {
    type Context = SyncContext<Self>;
}

/// Run the schedule to its end.
pub struct Run;
impl Message for Run {
    type Result = Result<Summary, RuntimeError>;
}

impl Coordinator {
    pub(super) fn start(
        schedule: Box<dyn Schedule>,
        roles: Roles,
        observer: Box<dyn Observer>,
        budget: Budget,
        counts: Arc<WorkerCounts>,
        resume: Option<Checkpoint>,
    ) -> Addr<Self> {
        let slot = Mutex::new(Some((schedule, roles, observer, budget, counts, resume)));
        actix::SyncArbiter::start(1, move || Coordinator {
            parts: slot.lock().ok().and_then(|mut s| s.take()),
        })
    }
}

/// Save every role of `roles` under `dir`.
pub fn save_roles(roles: &Roles, dir: &Path) -> Result<(), RoleError> {
    let sub = |name: &str| -> Result<PathBuf, RoleError> {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).map_err(|e| RoleError::wrap("checkpoint", e))?;
        Ok(d)
    };
    roles.protagonist.save(&sub("protagonist")?)?;
    if let Some(a) = &roles.antagonist {
        a.save(&sub("antagonist")?)?;
    }
    for (k, a) in roles.adversaries.iter().enumerate() {
        a.save(&sub(&format!("adversary-{k}"))?)?;
    }
    if let Some(c) = &roles.critic {
        c.save(&sub("critic")?)?;
    }
    if let Some(c) = &roles.curriculum {
        c.save(&sub("curriculum")?)?;
    }
    Ok(())
}

/// The schedule's iterations until the budget is spent or the observer stops the run.
fn run_loop(
    schedule: &mut dyn Schedule,
    roles: &mut Roles,
    observer: &mut dyn Observer,
    budget: Budget,
    s: &mut Summary,
) -> Result<(), RuntimeError> {
    while schedule.updates() < budget.updates {
        let it = schedule.iterate(roles)?;
        s.steps += it.steps;
        s.episodes += it.outcomes.len() as u64;
        s.failed_episodes += it.outcomes.iter().filter(|o| !o.counted()).count() as u64;
        let control = observer
            .iteration(s.iterations, schedule.updates(), &it)
            .map_err(crate::schedule::ScheduleError::from)?;
        s.iterations += 1;
        if let Some(dir) = &control.checkpoint {
            let progress = Progress::of(s, schedule.updates());
            checkpoint::write(dir, roles, schedule, &progress, &mut |d| {
                observer.checkpointed(d)
            })?;
        }
        if control.stop {
            s.stopped = true;
            break;
        }
    }
    Ok(())
}

impl Handler<Run> for Coordinator {
    type Result = Result<Summary, RuntimeError>;

    fn handle(&mut self, _: Run, _: &mut Self::Context) -> Self::Result {
        let (mut schedule, mut roles, mut observer, budget, counts, resume) =
            self.parts.take().ok_or_else(|| RuntimeError::ActorGone {
                actor: "coordinator",
                reason: "it was asked to run twice".into(),
            })?;
        let mut s = Summary::default();
        if let Some(cp) = resume {
            schedule.restore(cp.schedule)?;
            let p = cp.progress;
            s.iterations = p.iterations;
            s.steps = p.steps;
            s.episodes = p.episodes;
            s.failed_episodes = p.failed_episodes;
            tracing::info!(dir = %cp.dir.display(), updates = p.updates, iterations = p.iterations, "resumed from a checkpoint");
        }
        let ran = run_loop(
            schedule.as_mut(),
            &mut roles,
            observer.as_mut(),
            budget,
            &mut s,
        );
        // Every worker's environment is torn down before the run returns, even after an
        // error (a caller may remove the state the sandboxes live in right after).
        roles.workers.shutdown();
        ran?;
        s.updates = schedule.updates();
        s.worker_restarts = counts.restarts.load(Ordering::Relaxed);
        s.worker_panics = counts.panics.load(Ordering::Relaxed);
        tracing::info!(
            method = schedule.method().name(),
            iterations = s.iterations,
            updates = s.updates,
            steps = s.steps,
            restarts = s.worker_restarts,
            "schedule finished"
        );
        Ok(s)
    }
}
