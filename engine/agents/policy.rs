//! A trained PPO policy acting greedily through the task's catalogue.

use super::{Agent, AgentError};
use crate::env::{Action, Observation};
use crate::instance::TaskSetup;
use policies::ppo::PpoAgent;
use std::sync::Arc;

/// A PPO policy over one task's catalogue, taking its most likely action (evaluation); the
/// weights are shared by every agent made from them.
pub struct PolicyAgent {
    ppo: Arc<PpoAgent>,
    count: usize,
    task: String,
}

impl PolicyAgent {
    pub fn new(ppo: Arc<PpoAgent>) -> Self {
        Self {
            ppo,
            count: 0,
            task: String::new(),
        }
    }
}

impl Agent for PolicyAgent {
    fn name(&self) -> String {
        "policy (greedy)".into()
    }
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError> {
        self.count = setup.actions.len();
        self.task = setup.task.clone();
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
        let out = self.ppo.act_greedy(&obs.features, None)?;
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
