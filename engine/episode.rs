//! The one episode loop: an [`Agent`] acts in an [`Env`] that was just reset until the episode
//! ends (goal, step limit, an infrastructure failure) or the agent has nothing more to do.
//! The CLI's `engine episode`, experiments, the env benchmark and the reward exploit check
//! play their episodes through [`play`]. An agent that can no longer act ends its episode as
//! an agent failure ([`Played::agent_failure`]), with its transcript when it has one.

use crate::agents::{Agent, AgentError};
use crate::env::{Env, EnvError, Observation, Step};

#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error("task `{task}`, instance {instance}, step {step}: {source}")]
    Agent {
        task: String,
        instance: String,
        step: u32,
        source: Box<AgentError>,
    },
    #[error("task `{task}`, instance {instance}, step {step}: {source}")]
    Env {
        task: String,
        instance: String,
        step: u32,
        source: Box<EnvError>,
    },
}

/// How an episode went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Played {
    pub success: bool,
    pub return_: f64,
    pub steps: u32,
    /// The environment failed (the episode is masked).
    pub infra: bool,
    pub error: Option<String>,
    /// The verifier's progress at the end.
    pub progress: f64,
    /// Catalogue indices taken (free-text actions are not listed).
    pub actions: Vec<usize>,
    /// The agent could no longer act ([`AgentError::is_agent_failure`]): why. The episode is
    /// the agent's failure, counted, not masked.
    pub agent_failure: Option<String>,
    /// The agent's conversation, for an agent that has one (a language model).
    pub transcript: Option<crate::agents::Transcript>,
}

/// Play one episode of `env` (just reset, its first observation `first`) with `agent`;
/// `on_step` sees each step with its command text.
pub fn play(
    env: &mut Env,
    first: &Observation,
    agent: &mut dyn Agent,
    on_step: &mut dyn FnMut(&str, &Step),
) -> Result<Played, EpisodeError> {
    let setup = env.task_shared().ok_or(EpisodeError::Env {
        task: String::new(),
        instance: String::new(),
        step: 0,
        source: Box::new(EnvError::NoTask),
    })?;
    let instance = env.instance_id().unwrap_or("-").to_string();
    let where_ = |step: u32| (setup.task.clone(), instance.clone(), step);
    let agent_err = |step: u32, source| {
        let (task, instance, step) = where_(step);
        EpisodeError::Agent {
            task,
            instance,
            step,
            source: Box::new(source),
        }
    };
    agent.begin(&setup).map_err(|e| agent_err(0, e))?;
    let mut played = Played {
        progress: env.progress(),
        ..Played::default()
    };
    let mut obs = first.clone();
    loop {
        let action = match agent.act(&obs) {
            Ok(Some(a)) => a,
            Ok(None) => break,
            Err(e) if e.is_agent_failure() => {
                tracing::info!(task = %setup.task, %instance, step = played.steps, error = %e, "agent failure");
                played.agent_failure = Some(e.to_string());
                break;
            }
            Err(e) => return Err(agent_err(played.steps, e)),
        };
        let env_err = |source| {
            let (task, instance, step) = where_(played.steps + 1);
            EpisodeError::Env {
                task,
                instance,
                step,
                source: Box::new(source),
            }
        };
        let cmd = env.command_of(&action).map_err(env_err)?;
        let s = env.step(&action).map_err(env_err)?;
        played.steps += 1;
        if let crate::env::Action::Index(i) = action {
            played.actions.push(i);
        }
        on_step(&cmd, &s);
        played.progress = s.info.progress;
        if s.info.infra_failure {
            played.infra = true;
            played.error = s.info.error.clone();
            break;
        }
        if s.terminated || s.truncated {
            played.success = s.terminated && s.info.goal_reached;
            break;
        }
        obs = s.observation;
    }
    played.return_ = env.episode_return();
    played.transcript = agent.transcript();
    Ok(played)
}
