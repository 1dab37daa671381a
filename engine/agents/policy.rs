//! A trained PPO policy acting through the task's catalogue.

use super::{Agent, AgentError};
use crate::env::{Action, Observation};
use crate::instance::TaskSetup;
use policies::ppo::PpoAgent;

/// A PPO policy over one task's catalogue: greedy (evaluation) or sampled.
pub struct PolicyAgent {
    ppo: PpoAgent,
    greedy: bool,
    count: usize,
    task: String,
}

impl PolicyAgent {
    pub fn new(ppo: PpoAgent, greedy: bool) -> Self {
        Self {
            ppo,
            greedy,
            count: 0,
            task: String::new(),
        }
    }

    pub fn ppo(&self) -> &PpoAgent {
        &self.ppo
    }
}

impl Agent for PolicyAgent {
    fn name(&self) -> String {
        if self.greedy {
            "policy (greedy)"
        } else {
            "policy"
        }
        .into()
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
        let out = if self.greedy {
            self.ppo.act_greedy(&obs.features, None)?
        } else {
            self.ppo.act(&obs.features, None)?
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
