//! Robust PLR (Jiang et al. 2021, "Replay-Guided Adversarial Environment Design"): each
//! slot's next level is the curriculum's pick: a buffered level to replay, learned from, or
//! a fresh domain-randomised level played only to be scored (no gradient on fresh levels).
//! Every counted episode is handed to the curriculum, which scores its level from the
//! episode's rewards and values; failed episodes are never scored. ACCEL (`accel.rs`) is
//! the same schedule with its replays mutated into new candidates.

use super::{
    rng, Arena, Detail, Iteration, Method, Roles, Schedule, ScheduleConfig, ScheduleError,
    ScheduleState,
};
use crate::msg::{Assignment, Level, Origin, Pick};
use crate::space::LevelSpace;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// Mutations waiting to be played at most (the oldest, of the stalest parents, are dropped
/// first).
const MAX_QUEUED_MUTATIONS: usize = 4096;

/// The protagonist learning on the curriculum's replays (robust PLR, ACCEL).
pub struct Replayed {
    method: Method,
    space: LevelSpace,
    /// ACCEL: mutations of replayed levels, played before fresh DR levels.
    mutations: Option<VecDeque<Level>>,
    arena: Arena,
    rng: ChaCha8Rng,
    updates: u64,
}

impl Replayed {
    pub(super) fn with(method: Method, cfg: &ScheduleConfig, workers: usize) -> Self {
        Self {
            method,
            space: cfg.space.clone(),
            mutations: (method == Method::Accel).then(VecDeque::new),
            arena: Arena::new("protagonist", workers),
            rng: rng(cfg, 5),
            updates: 0,
        }
    }
}

/// Robust PLR's schedule.
pub struct Plr;

impl Plr {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Replayed {
        Replayed::with(Method::Plr, cfg, workers)
    }
}

impl Schedule for Replayed {
    fn method(&self) -> Method {
        self.method
    }

    fn updates(&self) -> u64 {
        self.updates
    }

    fn set_budget(&mut self, budget: f64) {
        self.space.budget = budget;
    }

    fn state(&self) -> ScheduleState {
        ScheduleState {
            pace: None,
            method: self.method,
            updates: self.updates,
            rng: self.rng.clone(),
            detail: match &self.mutations {
                Some(m) => Detail::Accel {
                    mutations: m.iter().cloned().collect(),
                },
                None => Detail::None,
            },
        }
    }

    fn restore(&mut self, state: ScheduleState) -> Result<(), ScheduleError> {
        let st = state.of(self.method)?;
        match (&st.detail, self.mutations.as_mut()) {
            (Detail::None, None) => {}
            (Detail::Accel { mutations }, Some(m)) => *m = mutations.iter().cloned().collect(),
            _ => return Err(st.bad_detail()),
        }
        self.updates = st.updates;
        self.rng = st.rng;
        self.arena.abandon();
        Ok(())
    }

    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let Roles {
            protagonist,
            curriculum,
            workers,
            ..
        } = roles;
        let curriculum = curriculum.as_mut().ok_or(ScheduleError::MissingRole {
            method: self.method.name(),
            what: "a curriculum (level buffer)",
        })?;
        let (space, rng, mutations) = (&self.space, &mut self.rng, &mut self.mutations);
        let mut source = |_: usize| -> Result<Option<Assignment>, ScheduleError> {
            Ok(Some(match curriculum.pick()? {
                Pick::Replay(level) => {
                    if let Some(queue) = mutations.as_mut() {
                        queue.push_back(space.mutate(&level, rng));
                        if queue.len() > MAX_QUEUED_MUTATIONS {
                            queue.pop_front();
                        }
                    }
                    Assignment::new(level, Origin::Replay, true)
                }
                Pick::Fresh => match mutations.as_mut().and_then(VecDeque::pop_front) {
                    Some(level) => Assignment::new(level, Origin::Mutation, false),
                    None => Assignment::new(space.random(rng), Origin::Random, false),
                },
            }))
        };
        let r = self
            .arena
            .learn(protagonist.as_mut(), workers.as_mut(), &mut source)?;
        let mut scored = 0;
        for o in r.outcomes.iter().filter(|o| o.counted()) {
            curriculum.update(o)?;
            scored += 1;
        }
        self.updates += 1;
        tracing::debug!(
            method = self.method.name(),
            scored,
            buffer = curriculum.len(),
            queued = self.mutations.as_ref().map_or(0, VecDeque::len),
            "replay iteration"
        );
        Ok(Iteration {
            buffer: Some(curriculum.len()),
            ..Iteration::learned(r)
        })
    }
}
