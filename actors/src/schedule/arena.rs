//! Where an agent plays: one slot per worker, episodes that run across learning rollouts
//! (PPO's fixed-length rollouts), resets as episodes end, failures masked, and every finished
//! or failed episode returned as an [`EpisodeOutcome`]. Every schedule plays through this.

use super::ScheduleError;
use crate::msg::{Assignment, EpisodeOutcome, Failure, LearnStats, Recorded};
use crate::roles::{Agent, Workers};

/// Failed resets in a row on one slot before the schedule gives up.
const MAX_FAILED_RESETS: u32 = 64;

/// What a rollout returns.
#[derive(Debug, Default)]
pub struct Rollout {
    /// Episodes that finished or failed during it, in the order they ended.
    pub outcomes: Vec<EpisodeOutcome>,
    /// Environment steps taken (on live slots).
    pub steps: u64,
    /// The learner's statistics, when it learned.
    pub learned: Option<LearnStats>,
}

struct Live {
    assignment: Assignment,
    obs: Vec<f32>,
    mask: Vec<f32>,
    outcome: EpisodeOutcome,
}

/// The slots of one agent over a batch of workers.
pub struct Arena {
    agent: String,
    slots: Vec<Option<Live>>,
    /// Widths learned from the first reset.
    obs_dim: Option<usize>,
    mask_dim: Option<usize>,
    /// Episodes cut by [`abandon`](Arena::abandon) (not the agent's results; not reported).
    pub abandoned: u64,
    /// Environment steps taken over the arena's life.
    pub steps: u64,
}

impl Arena {
    /// Slots for `workers` workers; outcomes are labelled with `agent`.
    pub fn new(agent: &str, workers: usize) -> Self {
        Self {
            agent: agent.into(),
            slots: (0..workers).map(|_| None).collect(),
            obs_dim: None,
            mask_dim: None,
            abandoned: 0,
            steps: 0,
        }
    }

    /// Drop the live episodes (before another arena uses the same workers).
    pub fn abandon(&mut self) {
        for s in &mut self.slots {
            if s.take().is_some() {
                self.abandoned += 1;
            }
        }
    }

    /// Live slots.
    pub fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn outcome_of(&self, a: &Assignment) -> EpisodeOutcome {
        EpisodeOutcome {
            level: a.level.clone(),
            origin: a.origin,
            agent: self.agent.clone(),
            learn: a.learn,
            tag: a.tag,
            ret: 0.0,
            success: false,
            steps: 0,
            progress: 0.0,
            truncated: false,
            actions: Vec::new(),
            rewards: Vec::new(),
            values: Vec::new(),
            failure: None,
        }
    }

    fn check_width(
        &mut self,
        what: &'static str,
        obs: usize,
        mask: usize,
    ) -> Result<(), ScheduleError> {
        let o = *self.obs_dim.get_or_insert(obs);
        let m = *self.mask_dim.get_or_insert(mask);
        if o != obs || m != mask {
            return Err(ScheduleError::Shape(format!(
                "a worker's {what} gave {obs} features and a mask of {mask}; earlier ones gave {o} and {m}"
            )));
        }
        Ok(())
    }

    /// Reset every empty slot to the source's next assignment; failed resets become failed
    /// outcomes and the slot tries the next assignment.
    fn fill(
        &mut self,
        workers: &mut dyn Workers,
        source: &mut dyn FnMut(usize) -> Result<Option<Assignment>, ScheduleError>,
        outcomes: &mut Vec<EpisodeOutcome>,
    ) -> Result<(), ScheduleError> {
        let mut failed = vec![0u32; self.slots.len()];
        let mut exhausted = vec![false; self.slots.len()];
        loop {
            let mut want = Vec::new();
            for (i, done) in exhausted.iter_mut().enumerate() {
                if self.slots[i].is_none() && !*done {
                    match source(i)? {
                        Some(a) => want.push((i, a)),
                        None => *done = true,
                    }
                }
            }
            if want.is_empty() {
                return Ok(());
            }
            let levels: Vec<_> = want.iter().map(|(i, a)| (*i, a.level.clone())).collect();
            let starts = workers.reset(&levels);
            if starts.len() != want.len() {
                return Err(ScheduleError::Shape(format!(
                    "{} resets answered for {} asked",
                    starts.len(),
                    want.len()
                )));
            }
            for ((i, a), start) in want.into_iter().zip(starts) {
                match start {
                    Ok(s) => {
                        self.check_width("reset", s.obs.len(), s.mask.len())?;
                        let outcome = self.outcome_of(&a);
                        self.slots[i] = Some(Live {
                            assignment: a,
                            obs: s.obs,
                            mask: s.mask,
                            outcome,
                        });
                    }
                    Err(f) => {
                        tracing::debug!(worker = i, level = %a.level.key(), kind = ?f.kind, reason = %f.message, "reset failed");
                        failed[i] += 1;
                        let mut o = self.outcome_of(&a);
                        o.failure = Some(f.clone());
                        outcomes.push(o);
                        if failed[i] >= MAX_FAILED_RESETS {
                            return Err(ScheduleError::NoUsableLevel {
                                tried: failed[i],
                                last: f,
                            });
                        }
                    }
                }
            }
        }
    }

    /// Play `steps` vectorised steps, or, with `learn`, the agent's rollout length followed
    /// by a learning step. Episodes continue across calls.
    pub fn rollout(
        &mut self,
        agent: &mut dyn Agent,
        workers: &mut dyn Workers,
        source: &mut dyn FnMut(usize) -> Result<Option<Assignment>, ScheduleError>,
        steps: usize,
        learn: bool,
    ) -> Result<Rollout, ScheduleError> {
        if workers.len() != self.slots.len() {
            return Err(ScheduleError::Shape(format!(
                "the arena has {} slots and the workers are {}",
                self.slots.len(),
                workers.len()
            )));
        }
        let steps = if learn { agent.rollout_len() } else { steps };
        let mut out = Rollout::default();
        for _ in 0..steps {
            self.fill(workers, source, &mut out.outcomes)?;
            if self.live() == 0 {
                if learn {
                    return Err(ScheduleError::Shape(
                        "no level to learn on: the source ran dry in a learning rollout".into(),
                    ));
                }
                break;
            }
            self.step(agent, workers, learn, &mut out)?;
        }
        if learn {
            self.fill(workers, source, &mut out.outcomes)?;
            let next = self.observations();
            out.learned = Some(agent.learn(&next.0, self.slots.len())?);
        }
        Ok(out)
    }

    /// One learning rollout: the agent's rollout length, then its learning step.
    pub fn learn(
        &mut self,
        agent: &mut dyn Agent,
        workers: &mut dyn Workers,
        source: &mut dyn FnMut(usize) -> Result<Option<Assignment>, ScheduleError>,
    ) -> Result<Rollout, ScheduleError> {
        self.rollout(agent, workers, source, 0, true)
    }

    /// Play until the source runs dry and every live episode ended (an evaluation).
    pub fn play_out(
        &mut self,
        agent: &mut dyn Agent,
        workers: &mut dyn Workers,
        source: &mut dyn FnMut(usize) -> Result<Option<Assignment>, ScheduleError>,
    ) -> Result<Rollout, ScheduleError> {
        let mut out = Rollout::default();
        loop {
            self.fill(workers, source, &mut out.outcomes)?;
            if self.live() == 0 {
                return Ok(out);
            }
            self.step(agent, workers, false, &mut out)?;
        }
    }

    /// Observations and masks of every slot (an idle slot repeats zeros and an all-ones mask;
    /// its sample is invalid).
    fn observations(&self) -> (Vec<f32>, Vec<f32>) {
        let (od, md) = (self.obs_dim.unwrap_or(0), self.mask_dim.unwrap_or(0));
        let mut obs = Vec::with_capacity(self.slots.len() * od);
        let mut masks = Vec::with_capacity(self.slots.len() * md);
        for s in &self.slots {
            match s {
                Some(l) => {
                    obs.extend_from_slice(&l.obs);
                    masks.extend_from_slice(&l.mask);
                }
                None => {
                    obs.extend(std::iter::repeat_n(0.0, od));
                    masks.extend(std::iter::repeat_n(1.0, md));
                }
            }
        }
        (obs, masks)
    }

    fn step(
        &mut self,
        agent: &mut dyn Agent,
        workers: &mut dyn Workers,
        record: bool,
        out: &mut Rollout,
    ) -> Result<(), ScheduleError> {
        let n = self.slots.len();
        let (obs, masks) = self.observations();
        let acted = agent.act(&obs, &masks, n)?;
        if acted.actions.len() != n || acted.values.len() != n {
            return Err(ScheduleError::Shape(format!(
                "the agent answered {} actions and {} values for {n} observations",
                acted.actions.len(),
                acted.values.len()
            )));
        }
        let actions: Vec<Option<u32>> = self
            .slots
            .iter()
            .zip(&acted.actions)
            .map(|(s, &a)| s.as_ref().map(|_| a))
            .collect();
        let results = workers.step(&actions);
        if results.len() != n {
            return Err(ScheduleError::Shape(format!(
                "{} step results for {n} workers",
                results.len()
            )));
        }
        let mut rec = Recorded {
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
            valid: vec![false; n],
            final_obs: vec![None; n],
        };
        for (i, r) in results.into_iter().enumerate() {
            let Some(mut live) = self.slots[i].take() else {
                continue;
            };
            let o = &mut live.outcome;
            o.actions.push(acted.actions[i]);
            o.values.push(acted.values[i]);
            o.steps += 1;
            out.steps += 1;
            self.steps += 1;
            let ended = match r {
                Some(Ok(t)) => {
                    self.check_width("step", t.obs.len(), t.mask.len())?;
                    o.ret += f64::from(t.reward);
                    o.rewards.push(t.reward);
                    o.success |= t.success;
                    o.progress = t.progress;
                    let ended = t.terminated || t.truncated;
                    rec.rewards[i] = t.reward;
                    rec.terminated[i] = t.terminated;
                    rec.truncated[i] = t.truncated && !t.terminated;
                    rec.valid[i] = live.assignment.learn;
                    if rec.truncated[i] {
                        rec.final_obs[i] = Some(t.obs.clone());
                        o.truncated = true;
                    }
                    live.obs = t.obs;
                    live.mask = t.mask;
                    ended
                }
                Some(Err(f)) => {
                    o.rewards.push(0.0);
                    o.failure = Some(f);
                    true
                }
                None => {
                    o.rewards.push(0.0);
                    o.failure = Some(Failure::new(
                        crate::msg::FailureKind::Crash,
                        "the worker gave no answer to a step",
                    ));
                    true
                }
            };
            if ended {
                out.outcomes.push(live.outcome);
            } else {
                self.slots[i] = Some(live);
            }
        }
        if record {
            agent.record(&rec)?;
        }
        Ok(())
    }
}
