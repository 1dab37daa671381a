//! A trained PPO policy acting through the task's catalogue: sampling from its action
//! distribution as it did in training (seeded per level), or greedily (its most likely action).

use super::{Agent, AgentError};
use crate::env::{Action, Observation};
use crate::instance::TaskSetup;
use policies::ppo::PpoAgent;
use std::sync::Arc;

/// A PPO policy over one task's catalogue; the weights are shared by every agent made from
/// them.
pub struct PolicyAgent {
    ppo: Arc<PpoAgent>,
    count: usize,
    task: String,
    /// Sampling: the generator's seed (mixed with each level's task seed at `begin`, so an
    /// episode's actions depend on its level, not on which worker played it).
    sample: Option<(u64, policies::rng::Rng)>,
}

impl PolicyAgent {
    /// The most likely action at every step.
    pub fn new(ppo: Arc<PpoAgent>) -> Self {
        Self {
            ppo,
            count: 0,
            task: String::new(),
            sample: None,
        }
    }

    /// Actions sampled from the policy's distribution, as in training.
    pub fn sampled(ppo: Arc<PpoAgent>, seed: u64) -> Self {
        Self {
            sample: Some((seed, policies::rng::seeded(seed))),
            ..Self::new(ppo)
        }
    }
}

impl PolicyAgent {
    /// The policy's action count.
    fn width(&self) -> usize {
        self.ppo
            .net_config()
            .action_dims
            .first()
            .copied()
            .unwrap_or(0)
    }
}

impl Agent for PolicyAgent {
    fn name(&self) -> String {
        match self.sample {
            Some(_) => "policy (sampled)".into(),
            None => "policy (greedy)".into(),
        }
    }
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError> {
        let width = self.width();
        if setup.actions.len() > width {
            // Its last actions would be out of the policy's reach: not a fair episode.
            return Err(AgentError::CatalogueWider {
                task: setup.task.clone(),
                seed: setup.seed,
                count: setup.actions.len(),
                width,
            });
        }
        self.count = setup.actions.len();
        self.task = setup.task.clone();
        if let Some((seed, rng)) = &mut self.sample {
            *rng = policies::rng::derived(*seed, setup.seed);
        }
        Ok(())
    }
    fn act(&mut self, obs: &Observation) -> Result<Option<Action>, AgentError> {
        let want = self.ppo.net_config().obs_dim;
        if obs.features.len() != want {
            return Err(AgentError::Features {
                expected: want,
                got: obs.features.len(),
            });
        }
        // A level whose catalogue is smaller than the policy's width masks the rest.
        let width = self.width();
        let mask = (self.count < width).then(|| catalogue_mask(width, self.count));
        let out = match &mut self.sample {
            Some((_, rng)) => self.ppo.act_with(&obs.features, mask.as_deref(), rng)?,
            None => self.ppo.act_greedy(&obs.features, mask.as_deref())?,
        };
        let index = out.actions.first().copied().unwrap_or(0) as usize;
        if index >= self.count {
            return Err(AgentError::BadIndex {
                index,
                count: self.count,
                task: self.task.clone(),
            });
        }
        Ok(Some(Action::Index(index)))
    }
}

/// The 0/1 action mask of a policy with `width` actions on a level with `level` catalogue
/// actions (a task's catalogue may grow with its instance; the policy is as wide as the
/// largest it trained on).
pub fn catalogue_mask(width: usize, level: usize) -> Vec<f32> {
    (0..width).map(|i| f32::from(u8::from(i < level))).collect()
}
