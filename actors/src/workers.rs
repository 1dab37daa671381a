//! [`Workers`] on plain threads: each [`EnvWorker`] stepped on its own scoped thread per
//! vectorised step. The direct loop the actor runtime is measured against, and what the
//! schedules' tests run on.

use crate::msg::{Failure, FailureKind, Level, Start, StepResult};
use crate::roles::{EnvWorker, Workers};

/// Workers stepped in parallel on scoped threads (sequentially when there is one).
pub struct ThreadWorkers<W: EnvWorker> {
    workers: Vec<W>,
}

impl<W: EnvWorker> ThreadWorkers<W> {
    pub fn new(workers: Vec<W>) -> Self {
        Self { workers }
    }

    pub fn workers(&self) -> &[W] {
        &self.workers
    }
}

fn panicked(what: &str) -> Failure {
    Failure::new(FailureKind::Crash, format!("the worker panicked in {what}"))
}

impl<W: EnvWorker> Workers for ThreadWorkers<W> {
    fn len(&self) -> usize {
        self.workers.len()
    }

    fn reset(&mut self, levels: &[(usize, Level)]) -> Vec<Result<Start, Failure>> {
        let mut out: Vec<Result<Start, Failure>> = (0..levels.len())
            .map(|_| {
                // A worker index twice or out of range is a schedule bug; it is answered as a
                // failure rather than by touching another worker.
                Err(Failure::new(
                    FailureKind::Crash,
                    "no such worker (or reset twice in one batch)",
                ))
            })
            .collect();
        let mut slots: Vec<Option<&mut W>> = self.workers.iter_mut().map(Some).collect();
        let jobs: Vec<(usize, &mut W, &Level)> = levels
            .iter()
            .enumerate()
            .filter_map(|(k, (i, level))| {
                slots
                    .get_mut(*i)
                    .and_then(Option::take)
                    .map(|w| (k, w, level))
            })
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(k, w, level)| (k, s.spawn(move || w.reset(level))))
                .collect();
            for (k, h) in handles {
                out[k] = h.join().unwrap_or_else(|_| Err(panicked("reset")));
            }
        });
        out
    }

    fn step(&mut self, actions: &[Option<u32>]) -> Vec<Option<StepResult>> {
        let mut out: Vec<Option<StepResult>> = (0..self.workers.len()).map(|_| None).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .workers
                .iter_mut()
                .zip(actions)
                .enumerate()
                .filter_map(|(i, (w, a))| a.map(|a| (i, s.spawn(move || w.step(a)))))
                .collect();
            for (i, h) in handles {
                out[i] = Some(h.join().unwrap_or_else(|_| Err(panicked("step"))));
            }
        });
        out
    }
}
