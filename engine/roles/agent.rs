//! `actors::roles::Agent` over PPO: acting samples from the masked policy and remembers the
//! step for the rollout buffer; recording pushes it with the rewards and the validity mask
//! (failed steps and levels played only to be scored give no gradient and no bootstrap
//! target); learning bootstraps from the current observations and runs one PPO update.

use super::RolesError;
use actors::msg::{Acted, LearnStats, Recorded};
use actors::roles::{Agent, RoleError};
use policies::nets::ActorCriticConfig;
use policies::ppo::{ActOutput, PpoAgent, PpoConfig, RolloutBuffer, StepRecord};
use std::path::Path;

const ROLE: &str = "protagonist";

pub struct PpoRole {
    agent: PpoAgent,
    buf: RolloutBuffer,
    pending: Option<(Vec<f32>, Vec<f32>, ActOutput)>,
}

fn role_err(e: impl std::error::Error + Send + Sync + 'static) -> RoleError {
    RoleError::wrap(ROLE, e)
}

impl PpoRole {
    pub fn new(net: &ActorCriticConfig, cfg: &PpoConfig, seed: u64) -> Result<Self, RolesError> {
        Ok(Self {
            agent: PpoAgent::new(net, cfg, seed)?,
            buf: RolloutBuffer::new(cfg.num_steps, cfg.num_envs, net, true),
            pending: None,
        })
    }

    /// The agent saved under `dir` (by [`Agent::save`]), which must have been made with
    /// `net` and `cfg` (a checkpoint of another architecture or other settings is refused).
    pub fn load(dir: &Path, net: &ActorCriticConfig, cfg: &PpoConfig) -> Result<Self, RolesError> {
        let agent = PpoAgent::load(&dir.join("ppo"))?;
        if agent.net_config() != net {
            return Err(RolesError::checkpoint(
                dir,
                format!(
                    "its network is {:?}, this run's is {:?} (a checkpoint of another architecture)",
                    agent.net_config(),
                    net
                ),
            ));
        }
        if agent.config() != cfg {
            return Err(RolesError::checkpoint(
                dir,
                "its PPO settings differ from this run's",
            ));
        }
        Ok(Self {
            buf: RolloutBuffer::new(cfg.num_steps, cfg.num_envs, net, true),
            agent,
            pending: None,
        })
    }

    pub fn agent(&self) -> &PpoAgent {
        &self.agent
    }

    pub fn into_agent(self) -> PpoAgent {
        self.agent
    }
}

impl Agent for PpoRole {
    fn rollout_len(&self) -> usize {
        self.agent.config().num_steps
    }

    fn act(&mut self, obs: &[f32], masks: &[f32], n: usize) -> Result<Acted, RoleError> {
        if n != self.agent.config().num_envs {
            return Err(RoleError::new(
                ROLE,
                format!(
                    "{n} observations for a policy of {} environments",
                    self.agent.config().num_envs
                ),
            ));
        }
        let out = self.agent.act(obs, Some(masks)).map_err(role_err)?;
        let acted = Acted {
            actions: out.actions.clone(),
            values: out.values.clone(),
        };
        self.pending = Some((obs.to_vec(), masks.to_vec(), out));
        Ok(acted)
    }

    fn record(&mut self, s: &Recorded) -> Result<(), RoleError> {
        let (obs, masks, out) = self
            .pending
            .take()
            .ok_or_else(|| RoleError::new(ROLE, "a step was recorded that was not acted"))?;
        let final_values = self
            .agent
            .truncation_values(&s.truncated, &s.final_obs)
            .map_err(role_err)?;
        self.buf
            .push(&StepRecord {
                obs: &obs,
                masks: Some(&masks),
                valid: Some(&s.valid),
                actions: &out.actions,
                log_probs: &out.log_probs,
                values: &out.values,
                rewards: &s.rewards,
                terminated: &s.terminated,
                truncated: &s.truncated,
                final_values: &final_values,
            })
            .map_err(role_err)
    }

    fn learn(&mut self, next_obs: &[f32], _n: usize) -> Result<LearnStats, RoleError> {
        let last = self.agent.values(next_obs).map_err(role_err)?;
        self.buf.set_last_values(&last).map_err(role_err)?;
        let valid = self.buf.valid().iter().filter(|&&v| v).count();
        let stats = if valid == 0 {
            // Every sample was masked (a rollout of levels played only to be scored): no
            // gradient at all, rather than an update on nothing.
            None
        } else {
            Some(self.agent.update(&self.buf).map_err(role_err)?)
        };
        self.buf.clear();
        let mut values = vec![("valid_samples".to_string(), valid as f64)];
        if let Some(u) = stats {
            values.extend([
                ("policy_loss".into(), f64::from(u.policy_loss)),
                ("value_loss".into(), f64::from(u.value_loss)),
                ("entropy".into(), f64::from(u.entropy)),
                ("approx_kl".into(), f64::from(u.approx_kl)),
                ("learning_rate".into(), u.learning_rate),
            ]);
        }
        Ok(LearnStats { values })
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        self.agent.save(&dir.join("ppo")).map_err(role_err)
    }
}
