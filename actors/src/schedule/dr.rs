//! Domain randomisation: the protagonist learns on levels drawn uniformly from the level
//! space (within its budget and masks). Clean training (`clean.rs`) is the same schedule
//! drawing unperturbed levels.

use super::{
    rng, Arena, Detail, Iteration, Method, Roles, Schedule, ScheduleConfig, ScheduleError,
    ScheduleState,
};
use crate::msg::{Assignment, Origin};
use crate::space::LevelSpace;
use rand_chacha::ChaCha8Rng;

/// The protagonist learning on levels drawn independently (DR, or clean levels).
pub struct Sampled {
    method: Method,
    space: LevelSpace,
    arena: Arena,
    rng: ChaCha8Rng,
    updates: u64,
}

impl Sampled {
    pub(super) fn with(method: Method, cfg: &ScheduleConfig, workers: usize) -> Self {
        Self {
            method,
            space: cfg.space.clone(),
            arena: Arena::new("protagonist", workers),
            rng: rng(cfg, 2),
            updates: 0,
        }
    }
}

/// DR's schedule.
pub struct Dr;

impl Dr {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Sampled {
        Sampled::with(Method::Dr, cfg, workers)
    }
}

impl Schedule for Sampled {
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
            detail: Detail::None,
        }
    }

    fn restore(&mut self, state: ScheduleState) -> Result<(), ScheduleError> {
        let st = state.of(self.method)?;
        if st.detail != Detail::None {
            return Err(st.bad_detail());
        }
        self.updates = st.updates;
        self.rng = st.rng;
        self.arena.abandon();
        Ok(())
    }

    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let (space, rng, clean) = (&self.space, &mut self.rng, self.method == Method::Clean);
        let mut source = |_: usize| {
            Ok(Some(if clean {
                Assignment::new(space.clean(rng), Origin::Clean, true)
            } else {
                Assignment::new(space.random(rng), Origin::Random, true)
            }))
        };
        let r = self.arena.learn(
            roles.protagonist.as_mut(),
            roles.workers.as_mut(),
            &mut source,
        )?;
        self.updates += 1;
        Ok(Iteration::learned(r))
    }
}
