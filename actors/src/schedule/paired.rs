//! PAIRED (Dennis et al. 2020): each iteration every adversary proposes `adversary_batch`
//! levels; the protagonist and the antagonist, each in its own arena, make one learning
//! update on rollouts that cycle through the proposals (the protagonist with a `dr_share` of
//! domain-randomised levels mixed in); each adversary then learns from its proposals' regret,
//! the antagonist's best return minus the protagonist's mean return on the level (matched by
//! [`Assignment::tag`]), plus `lambda * log D`. A proposal that cannot be played scores
//! [`UNUSABLE_REWARD`]; one that only failed on the infrastructure, or that one of the two
//! agents did not finish, is not scored. The antagonist skips the proposals the protagonist
//! found unusable, and learns on domain-randomised levels when that leaves none (so a
//! population proposing only unplayable levels does not stop the run).

use super::rarl::log_d;
use super::{
    dr_or, rng, Arena, Detail, Iteration, Method, Roles, Schedule, ScheduleConfig, ScheduleError,
    ScheduleState, PLAYED_FLOOR, UNUSABLE_REWARD,
};
use crate::msg::{Assignment, EpisodeOutcome, FailureKind, Origin, Proposal};
use crate::space::LevelSpace;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

pub struct Paired {
    space: LevelSpace,
    dr_share: f64,
    batch: usize,
    lambda: f64,
    protagonist: Arena,
    antagonist: Arena,
    rng: ChaCha8Rng,
    updates: u64,
}

impl Paired {
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Self {
        Self {
            space: cfg.space.clone(),
            dr_share: cfg.dr_share,
            batch: cfg.adversary_batch,
            lambda: cfg.lambda,
            protagonist: Arena::new("protagonist", workers),
            antagonist: Arena::new("antagonist", workers),
            rng: rng(cfg, 4),
            updates: 0,
        }
    }
}

/// The episodes of `outcomes` played on proposal `i`.
fn on(outcomes: &[EpisodeOutcome], i: usize) -> Vec<&EpisodeOutcome> {
    outcomes
        .iter()
        .filter(|o| o.tag == Some(i as u64))
        .collect()
}

/// Proposal `i % len` of `proposals` (`(adversary, proposal)`) as a learning assignment
/// tagged with its index.
fn assignment(proposals: &[(usize, Proposal)], i: usize) -> Assignment {
    let i = i % proposals.len();
    let (k, p) = &proposals[i];
    Assignment {
        tag: Some(i as u64),
        ..Assignment::new(p.level.clone(), Origin::Adversary(*k), true)
    }
}

/// The adversary's reward for one proposal from the episodes the two agents played on it:
/// `max(antagonist returns) - mean(protagonist returns) + lambda * log_d` over the counted
/// episodes; `UNUSABLE_REWARD` when the level could not be played; `None` when either agent
/// has no counted episode on it.
fn regret_reward(
    protagonist: &[&EpisodeOutcome],
    antagonist: &[&EpisodeOutcome],
    log_d: f64,
    lambda: f64,
) -> Option<f64> {
    let unusable = protagonist
        .iter()
        .chain(antagonist)
        .any(|o| o.failure.as_ref().map(|f| f.kind) == Some(FailureKind::Unusable));
    if unusable {
        return Some(UNUSABLE_REWARD);
    }
    let p: Vec<f64> = protagonist
        .iter()
        .filter(|o| o.counted())
        .map(|o| o.ret)
        .collect();
    let best = antagonist
        .iter()
        .filter(|o| o.counted())
        .map(|o| o.ret)
        .fold(None, |b: Option<f64>, r| Some(b.map_or(r, |b| b.max(r))))?;
    if p.is_empty() {
        return None;
    }
    let mean = p.iter().sum::<f64>() / p.len() as f64;
    Some((best - mean + lambda * log_d).max(PLAYED_FLOOR))
}

impl Schedule for Paired {
    fn method(&self) -> Method {
        Method::Paired
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
            method: Method::Paired,
            updates: self.updates,
            rng: self.rng.clone(),
            detail: Detail::None,
        }
    }

    fn restore(&mut self, state: ScheduleState) -> Result<(), ScheduleError> {
        let st = state.of(Method::Paired)?;
        if st.detail != Detail::None {
            return Err(st.bad_detail());
        }
        self.updates = st.updates;
        self.rng = st.rng;
        self.protagonist.abandon();
        self.antagonist.abandon();
        Ok(())
    }

    fn iterate(&mut self, roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        let Roles {
            protagonist,
            antagonist,
            adversaries,
            critic,
            workers,
            ..
        } = roles;
        let antagonist = antagonist.as_mut().ok_or(ScheduleError::MissingRole {
            method: "paired",
            what: "an antagonist",
        })?;
        // Tags are indices into `proposals`: adversary 0's batch first, then 1's, ...
        let mut proposals: Vec<(usize, Proposal)> = Vec::new();
        for (k, a) in adversaries.iter_mut().enumerate() {
            let batch = a.propose(self.batch, self.space.budget)?;
            if batch.is_empty() {
                return Err(ScheduleError::Shape(format!(
                    "adversary {k} proposed no level"
                )));
            }
            proposals.extend(batch.into_iter().map(|p| (k, p)));
        }
        if proposals.is_empty() {
            return Err(ScheduleError::MissingRole {
                method: "paired",
                what: "a population of at least one adversary",
            });
        }

        let (space, rng, share) = (&self.space, &mut self.rng, self.dr_share);
        let mut next = 0;
        let mut source = |_: usize| {
            dr_or(space, rng, share, |_| {
                next += 1;
                Ok(assignment(&proposals, next - 1))
            })
        };
        let pr = self
            .protagonist
            .learn(protagonist.as_mut(), workers.as_mut(), &mut source)?;
        // The antagonist plays on the same workers next.
        self.protagonist.abandon();
        let unusable: HashSet<u64> = pr
            .outcomes
            .iter()
            .filter(|o| o.failure.as_ref().map(|f| f.kind) == Some(FailureKind::Unusable))
            .filter_map(|o| o.tag)
            .collect();
        let usable: Vec<usize> = (0..proposals.len())
            .filter(|&i| !unusable.contains(&(i as u64)))
            .collect();
        let (space, rng) = (&self.space, &mut self.rng);
        let mut next = 0;
        let mut source = |_: usize| {
            next += 1;
            Ok(Some(if usable.is_empty() {
                Assignment::new(space.random(rng), Origin::Random, true)
            } else {
                assignment(&proposals, usable[(next - 1) % usable.len()])
            }))
        };
        let ar = self
            .antagonist
            .learn(antagonist.as_mut(), workers.as_mut(), &mut source)?;
        self.antagonist.abandon();
        for a in adversaries.iter_mut() {
            a.observe(&pr.outcomes)?;
        }

        let levels: Vec<_> = proposals.iter().map(|(_, p)| p.level.clone()).collect();
        let log_d = log_d(&levels, critic.as_deref_mut(), self.lambda)?;
        let mut scored: Vec<Vec<(Proposal, f64)>> = vec![Vec::new(); adversaries.len()];
        for (i, (k, p)) in proposals.iter().enumerate() {
            let reward = regret_reward(
                &on(&pr.outcomes, i),
                &on(&ar.outcomes, i),
                log_d[i],
                self.lambda,
            );
            if let Some(r) = reward {
                scored[*k].push((p.clone(), r));
            }
        }
        let mut it = Iteration {
            antagonist: ar.learned.clone(),
            ..Iteration::learned(pr)
        };
        for (k, s) in scored.iter().enumerate() {
            if !s.is_empty() {
                it.adversaries.push((k, adversaries[k].learn(s)?));
            }
        }
        if let Some(c) = critic.as_mut() {
            if self.lambda != 0.0 {
                it.critic = Some(c.learn(&levels)?);
            }
        }
        tracing::debug!(
            proposals = proposals.len(),
            scored = scored.iter().map(Vec::len).sum::<usize>(),
            "paired iteration"
        );
        it.add(ar);
        self.updates += 1;
        Ok(it)
    }
}
