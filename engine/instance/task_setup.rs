//! What a task's setup hands to the verifier, the oracle and the environment.

use serde::{Deserialize, Serialize};

/// What a task's setup produced for one seed; stored in the instance manifest and handed to
/// the verifier, the oracle and the environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSetup {
    pub task: String,
    pub seed: u64,
    /// What the agent is told (the only task text it sees).
    pub instruction: String,
    /// Working directory at the start of an episode.
    pub cwd: String,
    /// The discrete action catalogue (shell commands); free text is always accepted too.
    pub actions: Vec<String>,
    /// The cost of each catalogue action in steps, beyond the one every step costs (recovery
    /// actions that do more work declare more; a missing entry is 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub action_costs: Vec<f64>,
    /// Words that make a command relevant to the task (for the "irrelevant command" penalty).
    pub keywords: Vec<String>,
    /// Step limit of an episode.
    pub max_steps: u32,
    /// Whatever the verifier and oracle need (expected contents, secrets, ports), never shown
    /// to the agent.
    pub facts: serde_json::Value,
}

impl TaskSetup {
    /// The extra cost of catalogue action `i` in steps (0 when undeclared).
    pub fn action_cost(&self, i: usize) -> f64 {
        self.action_costs.get(i).copied().unwrap_or(0.0)
    }
}
