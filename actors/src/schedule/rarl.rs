//! RARL (Pinto et al. 2017) as the minimax-adversary curriculum: strict alternation of a
//! protagonist phase (`protagonist_updates` PPO updates on levels the adversaries propose,
//! round robin over the population, with a `dr_share` of domain-randomised levels mixed in)
//! and an adversary phase (each adversary proposes `adversary_batch` levels, the frozen
//! protagonist plays each once, and the adversary learns from [`adversary_reward`]).

use super::{
    adversary_reward, dr_or, rng, Arena, Detail, Iteration, Method, Phase, Roles, Schedule,
    ScheduleConfig, ScheduleError, ScheduleState,
};
use crate::msg::{Assignment, EpisodeOutcome, Level, Origin, Proposal};
use crate::roles::Critic;
use crate::space::LevelSpace;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

pub struct Rarl {
    space: LevelSpace,
    dr_share: f64,
    phase_updates: u32,
    batch: usize,
    lambda: f64,
    learner: Arena,
    scorer: Arena,
    rng: ChaCha8Rng,
    /// Protagonist updates left in the current protagonist phase (0: the adversaries' turn).
    left: u32,
    next_adversary: usize,
    updates: u64,
}

impl Rarl {
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Self {
        Self {
            space: cfg.space.clone(),
            dr_share: cfg.dr_share,
            phase_updates: cfg.protagonist_updates,
            batch: cfg.adversary_batch,
            lambda: cfg.lambda,
            learner: Arena::new("protagonist", workers),
            scorer: Arena::new("protagonist", workers),
            rng: rng(cfg, 3),
            left: cfg.protagonist_updates,
            next_adversary: 0,
            updates: 0,
        }
    }

    fn protagonist_phase(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let (space, rng, share) = (&self.space, &mut self.rng, self.dr_share);
        let adversaries = &mut roles.adversaries;
        let next = &mut self.next_adversary;
        let mut source = |_: usize| -> Result<Option<Assignment>, ScheduleError> {
            dr_or(space, rng, share, |_| {
                let k = *next % adversaries.len();
                *next = (*next + 1) % adversaries.len();
                let p = adversaries[k].propose(1, space.budget)?;
                let level = p.into_iter().next().map(|p| p.level).ok_or_else(|| {
                    ScheduleError::Shape(format!("adversary {k} proposed no level"))
                })?;
                Ok(Assignment::new(level, Origin::Adversary(k), true))
            })
        };
        let r = self.learner.learn(
            roles.protagonist.as_mut(),
            roles.workers.as_mut(),
            &mut source,
        )?;
        for a in roles.adversaries.iter_mut() {
            a.observe(&r.outcomes)?;
        }
        self.updates += 1;
        self.left -= 1;
        if self.left == 0 {
            // The adversaries' phase resets every worker.
            self.learner.abandon();
        }
        Ok(Iteration::learned(r))
    }

    fn adversary_phase(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let mut it = Iteration {
            phase: Some(Phase::Adversary),
            ..Iteration::default()
        };
        let mut generated = Vec::new();
        for k in 0..roles.adversaries.len() {
            let proposals = roles.adversaries[k].propose(self.batch, self.space.budget)?;
            let outcomes =
                play_proposals(&mut self.scorer, roles, &proposals, Origin::Adversary(k))?;
            let scored = score(
                &proposals,
                &outcomes,
                roles.critic.as_deref_mut(),
                self.lambda,
            )?;
            if !scored.is_empty() {
                let stats = roles.adversaries[k].learn(&scored)?;
                it.adversaries.push((k, stats));
            }
            generated.extend(proposals.into_iter().map(|p| p.level));
            it.steps += outcomes.iter().map(|o| u64::from(o.steps)).sum::<u64>();
            it.outcomes.extend(outcomes);
        }
        if let Some(c) = roles.critic.as_mut() {
            if self.lambda != 0.0 {
                it.critic = Some(c.learn(&generated)?);
            }
        }
        self.left = self.phase_updates;
        Ok(it)
    }
}

/// Play each proposal once with the frozen protagonist; outcomes come back in proposal order
/// (`tag` = the proposal's index).
pub(super) fn play_proposals(
    arena: &mut Arena,
    roles: &mut Roles,
    proposals: &[Proposal],
    origin: Origin,
) -> Result<Vec<EpisodeOutcome>, ScheduleError> {
    let mut queue: VecDeque<Assignment> = proposals
        .iter()
        .enumerate()
        .map(|(i, p)| Assignment {
            tag: Some(i as u64),
            ..Assignment::new(p.level.clone(), origin, false)
        })
        .collect();
    let mut source = |_: usize| Ok(queue.pop_front());
    let r = arena.play_out(
        roles.protagonist.as_mut(),
        roles.workers.as_mut(),
        &mut source,
    )?;
    let mut outcomes = r.outcomes;
    outcomes.sort_by_key(|o| o.tag);
    Ok(outcomes)
}

/// `(proposal, reward)` for every proposal whose episode can be scored.
pub(super) fn score(
    proposals: &[Proposal],
    outcomes: &[EpisodeOutcome],
    critic: Option<&mut (dyn Critic + '_)>,
    lambda: f64,
) -> Result<Vec<(Proposal, f64)>, ScheduleError> {
    let levels: Vec<_> = proposals.iter().map(|p| p.level.clone()).collect();
    let log_d = log_d(&levels, critic, lambda)?;
    // An unusable level's reset fails before it is played: its outcome may come with no
    // tag of a played episode, so outcomes are matched by tag.
    Ok(outcomes
        .iter()
        .filter_map(|o| {
            let i = o.tag? as usize;
            let p = proposals.get(i)?;
            adversary_reward(o, log_d[i], lambda).map(|r| (p.clone(), r))
        })
        .collect())
}

/// The critic's `log D` of each level, or zeros when `lambda` is 0 (the critic is then not
/// consulted) or there is no critic.
pub(super) fn log_d(
    levels: &[Level],
    critic: Option<&mut (dyn Critic + '_)>,
    lambda: f64,
) -> Result<Vec<f64>, ScheduleError> {
    match critic {
        Some(c) if lambda != 0.0 => {
            let d = c.realism(levels)?;
            if d.len() != levels.len() {
                return Err(ScheduleError::Shape(format!(
                    "the critic scored {} of {} levels",
                    d.len(),
                    levels.len()
                )));
            }
            Ok(d)
        }
        _ => Ok(vec![0.0; levels.len()]),
    }
}

impl Schedule for Rarl {
    fn method(&self) -> Method {
        Method::Rarl
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
            method: Method::Rarl,
            updates: self.updates,
            rng: self.rng.clone(),
            detail: Detail::Rarl {
                left: self.left,
                next_adversary: self.next_adversary,
            },
        }
    }

    fn restore(&mut self, state: ScheduleState) -> Result<(), ScheduleError> {
        let st = state.of(Method::Rarl)?;
        let Detail::Rarl {
            left,
            next_adversary,
        } = st.detail
        else {
            return Err(st.bad_detail());
        };
        if left > self.phase_updates {
            return Err(ScheduleError::Config {
                key: "protagonist_updates",
                reason: format!(
                    "the checkpoint has {left} updates left in a phase of {}",
                    self.phase_updates
                ),
            });
        }
        self.updates = st.updates;
        self.rng = st.rng;
        self.left = left;
        self.next_adversary = next_adversary;
        self.learner.abandon();
        self.scorer.abandon();
        Ok(())
    }

    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        if self.left > 0 {
            self.protagonist_phase(roles)
        } else {
            self.adversary_phase(roles)
        }
    }
}
