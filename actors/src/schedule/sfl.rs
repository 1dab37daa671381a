//! SFL (Rutherford et al. 2024, "No Regrets"): at the start and after every `sfl_every`
//! protagonist updates, a selection: `sfl_candidates` domain-randomised levels, each played
//! `sfl_rollouts` times by the frozen protagonist, ranked by learnability `p * (1 - p)`
//! (`p` its success rate over its counted episodes; ties broken at random; a level that
//! could not be played, or has no counted episode, is left out), and the `sfl_keep` most
//! learnable kept. The protagonist's updates draw uniformly from the kept levels, with a
//! `dr_share` of domain-randomised levels mixed in.

use super::{
    dr_or, rng, Arena, Detail, Iteration, Method, Phase, Roles, Schedule, ScheduleConfig,
    ScheduleError, ScheduleState,
};
use crate::msg::{Assignment, EpisodeOutcome, FailureKind, Level, Origin};
use crate::space::LevelSpace;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

pub struct Sfl {
    space: LevelSpace,
    dr_share: f64,
    candidates: usize,
    rollouts: usize,
    keep: usize,
    every: u32,
    learner: Arena,
    scorer: Arena,
    rng: ChaCha8Rng,
    kept: Vec<Level>,
    /// Protagonist updates since the last selection (`None`: no selection yet).
    since: Option<u32>,
    updates: u64,
}

impl Sfl {
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Self {
        Self {
            space: cfg.space.clone(),
            dr_share: cfg.dr_share,
            candidates: cfg.sfl_candidates,
            rollouts: cfg.sfl_rollouts,
            keep: cfg.sfl_keep,
            every: cfg.sfl_every,
            learner: Arena::new("protagonist", workers),
            scorer: Arena::new("protagonist", workers),
            rng: rng(cfg, 6),
            kept: Vec::new(),
            since: None,
            updates: 0,
        }
    }

    fn select(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        // The selection resets every worker.
        self.learner.abandon();
        let candidates: Vec<Level> = (0..self.candidates)
            .map(|_| self.space.random(&mut self.rng))
            .collect();
        // Round after round, so a candidate's episodes spread over the workers.
        let mut queue: VecDeque<Assignment> = (0..self.rollouts)
            .flat_map(|_| candidates.iter().enumerate())
            .map(|(i, l)| Assignment {
                tag: Some(i as u64),
                ..Assignment::new(l.clone(), Origin::Random, false)
            })
            .collect();
        let mut source = |_: usize| Ok(queue.pop_front());
        let r = self.scorer.play_out(
            roles.protagonist.as_mut(),
            roles.workers.as_mut(),
            &mut source,
        )?;
        let mut ranked: Vec<(usize, f64)> = (0..candidates.len())
            .filter_map(|i| learnability(&r.outcomes, i as u64).map(|l| (i, l)))
            .collect();
        // A stable sort after a shuffle: equal learnabilities in random order.
        ranked.shuffle(&mut self.rng);
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        self.kept = ranked
            .iter()
            .take(self.keep)
            .map(|&(i, _)| candidates[i].clone())
            .collect();
        self.since = Some(0);
        tracing::debug!(
            candidates = candidates.len(),
            usable = ranked.len(),
            kept = self.kept.len(),
            best = ranked.first().map_or(0.0, |r| r.1),
            "sfl selection"
        );
        let mut it = Iteration {
            phase: Some(Phase::Selection),
            buffer: Some(self.kept.len()),
            ..Iteration::default()
        };
        it.add(r);
        Ok(it)
    }

    fn train(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let (space, rng, share, kept) = (&self.space, &mut self.rng, self.dr_share, &self.kept);
        let mut source = |_: usize| {
            dr_or(space, rng, share, |rng| {
                Ok(match kept.choose(rng) {
                    Some(l) => Assignment::new(l.clone(), Origin::Replay, true),
                    // Every candidate failed: domain randomisation until the next selection.
                    None => Assignment::new(space.random(rng), Origin::Random, true),
                })
            })
        };
        let r = self.learner.learn(
            roles.protagonist.as_mut(),
            roles.workers.as_mut(),
            &mut source,
        )?;
        self.updates += 1;
        self.since = self.since.map(|s| s + 1);
        Ok(Iteration {
            buffer: Some(self.kept.len()),
            ..Iteration::learned(r)
        })
    }
}

/// `p * (1 - p)` of candidate `tag`'s counted episodes; `None` when it could not be played
/// or none of its episodes counted.
fn learnability(outcomes: &[EpisodeOutcome], tag: u64) -> Option<f64> {
    let mine: Vec<_> = outcomes.iter().filter(|o| o.tag == Some(tag)).collect();
    let unusable = mine
        .iter()
        .any(|o| o.failure.as_ref().map(|f| f.kind) == Some(FailureKind::Unusable));
    let counted: Vec<_> = mine.iter().filter(|o| o.counted()).collect();
    if unusable || counted.is_empty() {
        return None;
    }
    let p = counted.iter().filter(|o| o.success).count() as f64 / counted.len() as f64;
    Some(p * (1.0 - p))
}

impl Schedule for Sfl {
    fn method(&self) -> Method {
        Method::Sfl
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
            method: Method::Sfl,
            updates: self.updates,
            rng: self.rng.clone(),
            detail: Detail::Sfl {
                kept: self.kept.clone(),
                since: self.since,
            },
        }
    }

    fn restore(&mut self, state: ScheduleState) -> Result<(), ScheduleError> {
        let st = state.of(Method::Sfl)?;
        let Detail::Sfl { kept, since } = st.detail else {
            return Err(st.bad_detail());
        };
        self.updates = st.updates;
        self.rng = st.rng;
        self.kept = kept;
        self.since = since;
        self.learner.abandon();
        self.scorer.abandon();
        Ok(())
    }

    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        match self.since {
            Some(s) if s < self.every => self.train(roles),
            _ => self.select(roles),
        }
    }
}
