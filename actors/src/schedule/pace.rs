//! The difficulty schedule of the level space's budget (a curriculum over the adversary's
//! strength): what a level's faults may cost together grows over the run, from `start` to
//! the space's own budget (the final one, which the held-out faulted levels use).
//!
//! - [`Pace::Fixed`]: the space's budget throughout.
//! - [`Pace::Linear`]: from `start` to the space's budget linearly over the first `updates`
//!   protagonist updates, then flat. A function of the update count, so a resumed run is
//!   where the killed one was.
//! - [`Pace::Adaptive`]: starts at `start`; after every `window` protagonist episodes on
//!   levels drawn from the space (every origin but clean, failed episodes left out), the
//!   budget goes up by `step` when their success rate is above `raise_above` and down by
//!   `step` when it is below `lower_below`, always within `[start, space budget]` (the
//!   success-threshold rule of teacher curricula, Matiisen et al. 2017; Portelas et al.
//!   2020). Its state (budget, the window so far) is part of the schedule's checkpoint.
//!
//! [`Paced`] wraps any method's schedule: before each iteration it sets the budget every
//! draw of that iteration uses (adversaries' proposals, DR draws, ACCEL's mutations, SFL's
//! candidates), and records it in the [`Iteration`].

use super::{Iteration, Method, Roles, Schedule, ScheduleError, ScheduleState};
use crate::msg::{EpisodeOutcome, Origin};
use crate::space::LevelSpace;
use serde::{Deserialize, Serialize};

/// How the budget moves over the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Pace {
    #[default]
    Fixed,
    Linear {
        start: f64,
        /// Protagonist updates over which the budget reaches the space's.
        updates: u64,
    },
    Adaptive {
        start: f64,
        step: f64,
        /// Protagonist episodes per decision.
        window: usize,
        raise_above: f64,
        lower_below: f64,
    },
}

/// An adaptive pace's state between two iterations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PaceState {
    /// The budget now.
    pub budget: f64,
    /// `(successes, episodes)` of the window so far.
    pub successes: usize,
    pub episodes: usize,
    /// Times the budget went up and down so far.
    pub raised: u32,
    pub lowered: u32,
}

fn bad(key: &'static str, reason: String) -> ScheduleError {
    ScheduleError::Config { key, reason }
}

impl Pace {
    /// The budget the pace starts from (`end` for a fixed one).
    pub fn start(&self, end: f64) -> f64 {
        match self {
            Pace::Fixed => end,
            Pace::Linear { start, .. } | Pace::Adaptive { start, .. } => *start,
        }
    }

    /// Settings in range over `space` (whose budget is the final one): the start must be
    /// a number no greater than the space's budget that some allowed fault fits in.
    pub fn validate(&self, space: &LevelSpace) -> Result<(), ScheduleError> {
        let start = self.start(space.budget);
        let end = space.budget;
        if !(start.is_finite() && start > 0.0 && start <= end + 1e-9) {
            return Err(bad(
                "budget_schedule.start",
                format!("is {start}; must be a number > 0 and at most the budget {end}"),
            ));
        }
        let cheapest = crate::space::cheapest(&space.dims);
        if cheapest.is_finite() && cheapest > start + 1e-9 {
            return Err(bad(
                "budget_schedule.start",
                format!("is {start}; no fault fits: the cheapest allowed costs {cheapest}"),
            ));
        }
        match *self {
            Pace::Fixed => Ok(()),
            Pace::Linear { updates, .. } => {
                if updates == 0 {
                    return Err(bad(
                        "budget_schedule.over",
                        "reaches the budget in 0 updates; must be at least 1".into(),
                    ));
                }
                Ok(())
            }
            Pace::Adaptive {
                step,
                window,
                raise_above,
                lower_below,
                ..
            } => {
                if !(step.is_finite() && step > 0.0) {
                    return Err(bad(
                        "budget_schedule.step",
                        format!("is {step}; must be a finite number > 0"),
                    ));
                }
                if window == 0 {
                    return Err(bad("budget_schedule.window", "must be at least 1".into()));
                }
                for (key, v) in [
                    ("budget_schedule.raise_above", raise_above),
                    ("budget_schedule.lower_below", lower_below),
                ] {
                    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                        return Err(bad(key, format!("is {v}; must be in [0, 1]")));
                    }
                }
                if lower_below >= raise_above {
                    return Err(bad(
                        "budget_schedule.lower_below",
                        format!("is {lower_below}; must be below raise_above {raise_above}"),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The budget before protagonist update `updates` (from 0), for a pace whose state is
    /// `st`, ending at `end`.
    pub fn budget(&self, updates: u64, st: &PaceState, end: f64) -> f64 {
        match *self {
            Pace::Fixed => end,
            Pace::Linear { start, updates: n } => {
                let f = (updates as f64 / n.max(1) as f64).min(1.0);
                start + (end - start) * f
            }
            Pace::Adaptive { .. } => st.budget,
        }
    }

    /// An adaptive pace takes the iteration's episodes into its window, and moves the
    /// budget when the window is full (the window then starts over).
    pub fn observe(&self, outcomes: &[EpisodeOutcome], st: &mut PaceState, end: f64) {
        let Pace::Adaptive {
            start,
            step,
            window,
            raise_above,
            lower_below,
        } = *self
        else {
            return;
        };
        for o in outcomes
            .iter()
            .filter(|o| o.agent == "protagonist" && o.counted() && o.origin != Origin::Clean)
        {
            st.episodes += 1;
            st.successes += usize::from(o.success);
            if st.episodes >= window {
                let rate = st.successes as f64 / st.episodes as f64;
                let before = st.budget;
                if rate > raise_above {
                    st.budget = (st.budget + step).min(end);
                } else if rate < lower_below {
                    st.budget = (st.budget - step).max(start);
                }
                if st.budget > before {
                    st.raised += 1;
                } else if st.budget < before {
                    st.lowered += 1;
                }
                tracing::debug!(rate, before, after = st.budget, "adaptive budget");
                st.successes = 0;
                st.episodes = 0;
            }
        }
    }

    /// A line for `--dry-run`.
    pub fn describe(&self, end: f64) -> String {
        match *self {
            Pace::Fixed => format!("fixed at {end}"),
            Pace::Linear { start, updates } => format!(
                "linear from {start} to {end} over the first {updates} protagonist updates"
            ),
            Pace::Adaptive {
                start,
                step,
                window,
                raise_above,
                lower_below,
            } => format!(
                "adaptive from {start}, within [{start}, {end}]: +{step} when the protagonist's success over {window} episodes on drawn levels is above {raise_above}, -{step} when below {lower_below}"
            ),
        }
    }
}

/// A schedule run under a pace.
pub struct Paced {
    inner: Box<dyn Schedule>,
    pace: Pace,
    end: f64,
    state: PaceState,
}

impl Paced {
    pub fn new(inner: Box<dyn Schedule>, pace: Pace, end: f64) -> Self {
        let state = PaceState {
            budget: pace.start(end),
            ..PaceState::default()
        };
        Self {
            inner,
            pace,
            end,
            state,
        }
    }

    /// The budget the next iteration draws under.
    pub fn budget(&self) -> f64 {
        self.pace
            .budget(self.inner.updates(), &self.state, self.end)
    }
}

impl Schedule for Paced {
    fn method(&self) -> Method {
        self.inner.method()
    }

    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let budget = self.budget();
        self.inner.set_budget(budget);
        let mut it = self.inner.iterate(roles)?;
        it.budget = Some(budget);
        self.pace.observe(&it.outcomes, &mut self.state, self.end);
        Ok(it)
    }

    fn updates(&self) -> u64 {
        self.inner.updates()
    }

    fn set_budget(&mut self, budget: f64) {
        self.inner.set_budget(budget);
    }

    fn state(&self) -> ScheduleState {
        ScheduleState {
            pace: Some(self.state.clone()),
            ..self.inner.state()
        }
    }

    fn restore(&mut self, mut state: ScheduleState) -> Result<(), ScheduleError> {
        let start = self.pace.start(self.end);
        match state.pace.take() {
            Some(p) => {
                if !(p.budget.is_finite()
                    && p.budget > 0.0
                    && p.budget >= start - 1e-9
                    && p.budget <= self.end + 1e-9)
                {
                    return Err(bad(
                        "budget_schedule",
                        format!(
                            "the checkpoint's budget {} is outside this schedule's [{start}, {}]",
                            p.budget, self.end
                        ),
                    ));
                }
                self.state = p;
            }
            // An adaptive pace has state of its own; a checkpoint without it cannot be
            // resumed as if it started over.
            None if matches!(self.pace, Pace::Adaptive { .. }) => {
                return Err(bad(
                    "budget_schedule",
                    "the checkpoint holds no adaptive budget state (written without this \
                     schedule)"
                        .into(),
                ));
            }
            None => {}
        }
        self.inner.restore(state)
    }
}
