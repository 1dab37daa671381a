//! Agents: whatever chooses actions in an [`Env`](crate::env::Env) episode, behind one trait,
//! played by one loop (`episode::play`, in the module above this one) that the CLI,
//! experiments, the env benchmark and the reward exploit check all use.
//!
//! | agent | what it does |
//! |---|---|
//! | [`Random`] | uniform catalogue indices, seeded |
//! | [`Oracle`] | the task's free-text oracle commands, then stops |
//! | [`CatalogueOracle`] | the task's reactive catalogue oracle ([`Task::catalogue_step`]) |
//! | [`Script`] | a fixed list of actions, once or cycled (action files, constant policies) |
//! | [`PolicyAgent`] | a trained PPO policy over the catalogue (`policy.rs`) |
//! | [`LlmAgent`] | a language model behind an OpenAI-compatible endpoint, free-text commands ([`llm`]) |
//!
//! An agent that can no longer act (the model's endpoint gave up, its replies held no
//! command) fails with an error for which [`AgentError::is_agent_failure`] holds: the episode
//! ends there as the agent's failure, never as the environment's.
//!
//! [`Task::catalogue_step`]: crate::tasks::Task::catalogue_step

pub mod llm;
mod policy;

pub use llm::{LlmAgent, LlmConfig, Transcript};
pub use policy::{catalogue_mask, PolicyAgent};

use crate::env::{Action, Observation};
use crate::instance::TaskSetup;
use crate::tasks::{Seen, Task};
use rand::{Rng, SeedableRng};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("policy: {0}")]
    Policy(#[from] policies::ppo::PpoError),
    #[error(
        "the policy chose action {index}, but the task `{task}` has {count} catalogue actions"
    )]
    BadIndex {
        index: usize,
        count: usize,
        task: String,
    },
    #[error(
        "task `{task}` (seed {seed}) has {count} catalogue actions, more than the {width} the policy was trained with"
    )]
    CatalogueWider {
        task: String,
        seed: u64,
        count: usize,
        width: usize,
    },
    #[error("the policy expects {expected} features, the observation has {got}")]
    Features { expected: usize, got: usize },
    #[error("unknown task `{0}`")]
    UnknownTask(String),
    #[error("language model: {0}")]
    Llm(#[from] llm::LlmError),
}

impl AgentError {
    /// The agent could not act (its model's endpoint gave up, its replies held no command):
    /// an outcome of the episode (a failure of the agent), not a fault of the program or of
    /// its configuration ([`llm::LlmError::is_agent_failure`]).
    pub fn is_agent_failure(&self) -> bool {
        match self {
            Self::Llm(e) => e.is_agent_failure(),
            _ => false,
        }
    }
}

/// Chooses the actions of episodes.
pub trait Agent: Send {
    /// A short name for reports (`random`, `oracle`, `catalogue-oracle`, `constant 3`, ...).
    fn name(&self) -> String;
    /// A new episode starts on this task instance.
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError>;
    /// The next action given the latest observation, or `None` when the agent has nothing
    /// more to do (the episode ends there, unfinished).
    fn act(&mut self, obs: &Observation) -> Result<Option<Action>, AgentError>;
    /// The conversation of the episode so far, for an agent that has one.
    fn transcript(&self) -> Option<Transcript> {
        None
    }
}

impl Agent for LlmAgent {
    fn name(&self) -> String {
        format!("llm {}", self.model())
    }
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError> {
        self.start(setup);
        Ok(())
    }
    fn act(&mut self, obs: &Observation) -> Result<Option<Action>, AgentError> {
        Ok(self.next(obs)?)
    }
    fn transcript(&self) -> Option<Transcript> {
        Some(LlmAgent::transcript(self).clone())
    }
}

/// Uniformly random catalogue indices from a seeded generator (reseeded by [`Random::new`]).
pub struct Random {
    rng: rand_chacha::ChaCha8Rng,
    count: usize,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            count: 0,
        }
    }
}

impl Agent for Random {
    fn name(&self) -> String {
        "random".into()
    }
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError> {
        self.count = setup.actions.len();
        Ok(())
    }
    fn act(&mut self, _obs: &Observation) -> Result<Option<Action>, AgentError> {
        Ok((self.count > 0).then(|| Action::Index(self.rng.gen_range(0..self.count))))
    }
}

/// The task's free-text oracle: its commands in order, then nothing.
#[derive(Default)]
pub struct Oracle {
    commands: std::collections::VecDeque<String>,
}

impl Agent for Oracle {
    fn name(&self) -> String {
        "oracle".into()
    }
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError> {
        let task = task_of(setup)?;
        self.commands = task.oracle(setup).into();
        Ok(())
    }
    fn act(&mut self, _obs: &Observation) -> Result<Option<Action>, AgentError> {
        Ok(self.commands.pop_front().map(Action::Command))
    }
}

/// The task's catalogue oracle: reacts to what its catalogue actions printed.
#[derive(Default)]
pub struct CatalogueOracle {
    setup: Option<(TaskSetup, &'static dyn Task)>,
    seen: Vec<Seen>,
    last: Option<usize>,
}

impl Agent for CatalogueOracle {
    fn name(&self) -> String {
        "catalogue-oracle".into()
    }
    fn begin(&mut self, setup: &TaskSetup) -> Result<(), AgentError> {
        self.setup = Some((setup.clone(), task_of(setup)?));
        self.seen.clear();
        self.last = None;
        Ok(())
    }
    fn act(&mut self, obs: &Observation) -> Result<Option<Action>, AgentError> {
        let Some((setup, task)) = &self.setup else {
            return Ok(None);
        };
        if let Some(action) = self.last {
            self.seen.push(Seen {
                action,
                exit_code: obs.exit_code.unwrap_or(-1),
                stdout: obs.stdout.clone(),
                stderr: obs.stderr.clone(),
            });
        }
        self.last = task.catalogue_step(setup, &self.seen);
        Ok(self.last.map(Action::Index))
    }
}

/// A fixed list of actions, played once or cycled for the whole episode.
pub struct Script {
    name: String,
    actions: Vec<Action>,
    cycle: bool,
    next: usize,
}

impl Script {
    /// Play `actions` once, in order.
    pub fn once(name: impl Into<String>, actions: Vec<Action>) -> Self {
        Self {
            name: name.into(),
            actions,
            cycle: false,
            next: 0,
        }
    }

    /// Repeat `actions` until the episode ends (a constant policy, a two-action cycle).
    pub fn cycle(actions: Vec<Action>) -> Self {
        let name = match actions.as_slice() {
            [Action::Index(a)] => format!("constant {a}"),
            _ => format!(
                "cycle {}",
                actions
                    .iter()
                    .map(|a| match a {
                        Action::Index(i) => i.to_string(),
                        Action::Command(c) => format!("{c:?}"),
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        Self {
            name,
            actions,
            cycle: true,
            next: 0,
        }
    }
}

impl Agent for Script {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn begin(&mut self, _setup: &TaskSetup) -> Result<(), AgentError> {
        self.next = 0;
        Ok(())
    }
    fn act(&mut self, _obs: &Observation) -> Result<Option<Action>, AgentError> {
        if self.actions.is_empty() || (!self.cycle && self.next >= self.actions.len()) {
            return Ok(None);
        }
        let a = self.actions[self.next % self.actions.len()].clone();
        self.next += 1;
        Ok(Some(a))
    }
}

fn task_of(setup: &TaskSetup) -> Result<&'static dyn Task, AgentError> {
    crate::tasks::get(&setup.task).ok_or_else(|| AgentError::UnknownTask(setup.task.clone()))
}
