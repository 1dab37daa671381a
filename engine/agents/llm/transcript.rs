//! What a language-model agent said and heard in one episode, kept in the episode record
//! (`engine episode --json`, `episodes.jsonl`): the conversation, and per turn the requests
//! it took (retries, their outcomes and waits) and the tokens the endpoint reported.

use serde::{Deserialize, Serialize};

/// One message of the conversation, as sent to the endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Token counts the endpoint reported (`usage` of a chat completion).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, u: &Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(u.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(u.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(u.total_tokens);
    }
}

/// One HTTP request of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// `ok`, `http 429`, `http 503`, `timeout`, `transport: ...`, `bad body: ...`.
    pub outcome: String,
    /// Wall time of the request, milliseconds.
    pub ms: f64,
    /// How long the agent waited before the next request (backoff or `Retry-After`), when it
    /// retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<f64>,
}

/// One reply the agent asked for: the requests it took and what came of the reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The environment step the reply was for (0: before the first command).
    pub step: u32,
    pub attempts: Vec<Attempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The command taken from the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Why the reply held no command (the agent was asked again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub malformed: Option<String>,
    /// The agent said it was done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
}

/// A language-model agent's episode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub model: String,
    /// The endpoint (`.../chat/completions`).
    pub endpoint: String,
    pub messages: Vec<Message>,
    pub turns: Vec<Turn>,
    /// Summed over the replies that reported it.
    pub usage: Usage,
    /// Why the agent gave up (an agent failure), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}
