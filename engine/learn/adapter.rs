//! [`Env`] as a [`policies::rollout::Env`]: catalogue indices in, feature vectors out, levels
//! (instances) drawn from a list, and failures told apart. An infrastructure failure (of the
//! sandbox, the cache, a verifier read) ends the episode as a masked step that no gradient and
//! no bootstrap target comes from, never as a time limit; a level that cannot be used
//! (uncertified, not solvable through the catalogue, a fault that does not apply) is skipped
//! and counted.

use super::LearnError;
use crate::env::{Action, Env};
use crate::instance::Plan;
use policies::rollout::{Step, StepInfo};
use std::collections::VecDeque;
use std::sync::Arc;

/// Consecutive unusable levels before the adapter gives up.
const MAX_SKIPS: u32 = 64;

/// Counts of what the adapter skipped or masked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterCounts {
    /// Levels skipped at reset (uncertified, not catalogue-solvable, not applicable).
    pub skipped_levels: u64,
    /// Episodes ended by an infrastructure failure (masked).
    pub masked_episodes: u64,
    /// Resets that failed on the infrastructure and were retried.
    pub failed_resets: u64,
}

/// A finished episode as it was played.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayedEpisode {
    /// Its level: an index into the adapter's levels.
    pub level: usize,
    /// The catalogue actions taken, in order.
    pub actions: Vec<usize>,
}

/// One learner-facing environment over an [`Env`].
pub struct TrainEnv {
    env: Env,
    levels: Arc<Vec<Plan>>,
    /// Index into `levels` of the next episode, advancing by `stride` every
    /// `episodes_per_level` episodes.
    cursor: usize,
    stride: usize,
    episodes_per_level: usize,
    episode: usize,
    actions: usize,
    /// The current level's catalogue size (at most `actions`: the rest is masked).
    level_actions: usize,
    last: Vec<f32>,
    pub counts: AdapterCounts,
    /// The actions of the episode under way.
    playing: Vec<usize>,
    /// The latest finished episodes (not masked ones), kept while they add up to at least
    /// `keep` steps ([`TrainEnv::record_last`]).
    recorded: VecDeque<PlayedEpisode>,
    recorded_steps: usize,
    keep: usize,
    /// Replaying ([`TrainEnv::replaying`]): the episodes to play, cycled, and the next one's
    /// index.
    script: Option<(Vec<PlayedEpisode>, usize)>,
}

impl TrainEnv {
    /// The `k`-th of `n` adapters over `levels`: it plays levels `k, k + n, k + 2n, ...`
    /// (cycled), each for `episodes_per_level` consecutive episodes (which reuse its sandbox
    /// through the incremental reset). `actions` is the policy's action count: the largest
    /// catalogue of the task's levels (a task's catalogue may grow with its instance, e.g. one
    /// action per setting to repair); a smaller level's extra actions are masked.
    pub fn new(
        env: Env,
        levels: Arc<Vec<Plan>>,
        k: usize,
        n: usize,
        episodes_per_level: usize,
        actions: usize,
    ) -> Result<Self, LearnError> {
        if levels.is_empty() {
            return Err(LearnError::NoLevels);
        }
        Ok(Self {
            env,
            cursor: k % levels.len(),
            levels,
            stride: n.max(1),
            episodes_per_level: episodes_per_level.max(1),
            episode: 0,
            actions,
            level_actions: actions,
            last: Vec::new(),
            counts: AdapterCounts::default(),
            playing: Vec::new(),
            recorded: VecDeque::new(),
            recorded_steps: 0,
            keep: 0,
            script: None,
        })
    }

    /// An adapter that plays `episodes` again, in order and then from the first again,
    /// whatever actions it is given: each reset starts the next one on its level (a level
    /// that cannot be reset passes to the next episode), each step takes its next action, and
    /// an episode whose actions are all played ends there (truncated) if the environment did
    /// not end it first.
    pub fn replaying(
        env: Env,
        levels: Arc<Vec<Plan>>,
        episodes: Vec<PlayedEpisode>,
        actions: usize,
    ) -> Result<Self, LearnError> {
        let mut a = Self::new(env, levels, 0, 1, 1, actions)?;
        // An episode of no action has nothing to replay (training never records one).
        let episodes: Vec<PlayedEpisode> = episodes
            .into_iter()
            .filter(|e| !e.actions.is_empty())
            .collect();
        if episodes.is_empty() {
            return Err(LearnError::NothingToReplay);
        }
        if let Some(bad) = episodes.iter().find(|e| e.level >= a.levels.len()) {
            return Err(LearnError::RecordedLevelOutOfRange {
                level: bad.level,
                levels: a.levels.len(),
            });
        }
        a.script = Some((episodes, 0));
        Ok(a)
    }

    /// Keep the latest finished episodes while they add up to at least `steps` steps.
    pub fn record_last(&mut self, steps: usize) {
        self.keep = steps;
    }

    /// The episodes kept by [`TrainEnv::record_last`], oldest first.
    pub fn recorded(&self) -> Vec<PlayedEpisode> {
        self.recorded.iter().cloned().collect()
    }

    fn finish_episode(&mut self) {
        let actions = std::mem::take(&mut self.playing);
        if self.keep == 0 || self.script.is_some() {
            return;
        }
        self.recorded_steps += actions.len();
        self.recorded.push_back(PlayedEpisode {
            level: self.cursor,
            actions,
        });
        while let Some(front) = self.recorded.front() {
            if self.recorded_steps - front.actions.len() < self.keep {
                break;
            }
            self.recorded_steps -= front.actions.len();
            self.recorded.pop_front();
        }
    }

    fn advance(&mut self) {
        self.cursor = (self.cursor + self.stride) % self.levels.len();
        self.episode = 0;
    }

    fn masked(&mut self, info: StepInfo) -> Step {
        self.counts.masked_episodes += 1;
        Step {
            obs: self.last.clone(),
            reward: 0.0,
            terminated: false,
            truncated: false,
            masked: true,
            info,
        }
    }
}

impl policies::rollout::Env for TrainEnv {
    type Error = LearnError;

    fn obs_dim(&self) -> usize {
        self.env.obs_dim()
    }

    fn action_dims(&self) -> Vec<usize> {
        vec![self.actions]
    }

    fn reset(&mut self) -> Result<Vec<f32>, LearnError> {
        let mut skips = 0;
        loop {
            self.playing.clear();
            if let Some((episodes, next)) = self.script.as_mut() {
                let e = &episodes[*next % episodes.len()];
                *next += 1;
                self.cursor = e.level;
                // Taken from the end: the last action first.
                self.playing = e.actions.iter().rev().copied().collect();
            } else if self.episode >= self.episodes_per_level {
                self.advance();
            }
            let plan = &self.levels[self.cursor];
            self.episode += 1;
            match self.env.reset(plan) {
                Ok(obs) => {
                    let n = self.env.task().map_or(0, |t| t.actions.len());
                    if n == 0 || n > self.actions {
                        return Err(LearnError::CatalogueSize {
                            task: plan
                                .task
                                .as_ref()
                                .map(|t| t.name.clone())
                                .unwrap_or_default(),
                            seed: plan.seed,
                            got: n,
                            want: self.actions,
                        });
                    }
                    self.level_actions = n;
                    self.last = obs.features;
                    return Ok(self.last.clone());
                }
                Err(e) => {
                    if e.skips_level() {
                        self.counts.skipped_levels += 1;
                    } else if e.is_infrastructure() {
                        self.counts.failed_resets += 1;
                    } else {
                        return Err(LearnError::Env(e));
                    }
                    tracing::debug!(plan_seed = plan.seed, error = %e, "level skipped");
                    if self.script.is_none() {
                        self.advance();
                    }
                    skips += 1;
                    if skips >= MAX_SKIPS {
                        return Err(LearnError::NoUsableLevel {
                            tried: skips,
                            last: e.to_string(),
                        });
                    }
                }
            }
        }
    }

    fn action_mask(&self) -> Option<Vec<f32>> {
        Some(crate::agents::catalogue_mask(
            self.actions,
            self.level_actions,
        ))
    }

    fn step(&mut self, action: &[u32]) -> Result<Step, LearnError> {
        let mut index = action.first().copied().unwrap_or(0) as usize;
        // Replaying, `playing` holds the episode's actions still to take, last first.
        let replay_end = if self.script.is_some() {
            match self.playing.pop() {
                Some(a) => {
                    index = a;
                    self.playing.is_empty()
                }
                None => false,
            }
        } else {
            self.playing.push(index);
            false
        };
        let step = self.step_env(index);
        let Ok(mut s) = step else { return step };
        if replay_end && !(s.terminated || s.truncated || s.masked) {
            s.truncated = true;
        }
        if s.terminated || s.truncated {
            self.finish_episode();
        } else if s.masked {
            self.playing.clear();
        }
        Ok(s)
    }
}

impl TrainEnv {
    fn step_env(&mut self, index: usize) -> Result<Step, LearnError> {
        let level = self.env.instance_id().map(str::to_string);
        match self.env.step(&Action::Index(index)) {
            Ok(s) => {
                let info = StepInfo {
                    level,
                    success: s.info.success,
                    progress: s.info.progress,
                };
                if s.info.infra_failure {
                    return Ok(self.masked(info));
                }
                self.last = s.observation.features;
                Ok(Step {
                    obs: self.last.clone(),
                    reward: s.reward as f32,
                    terminated: s.terminated,
                    truncated: s.truncated,
                    masked: false,
                    info,
                })
            }
            Err(e) if e.is_infrastructure() => Ok(self.masked(StepInfo {
                level,
                ..StepInfo::default()
            })),
            Err(e) => Err(LearnError::Env(e)),
        }
    }
}
