//! What a language-model agent said and heard in one episode, kept in the episode record
//! (`engine episode --json`, `episodes.jsonl`): the conversation, and per turn the requests
//! it took (retries, their outcomes and waits), the part of the conversation each request
//! carried ([`Window`]) and the tokens the endpoint reported.

use serde::{Deserialize, Serialize};

/// One message of the conversation, as sent to the endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// An assistant's call of the `run_command` tool (at most one is ever kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The result of a tool call, answering `call_id`.
    pub fn tool(call_id: &str, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::new("tool", content)
        }
    }

    /// Characters this message puts in a request: its content and its tool calls' names and
    /// arguments (the JSON framing around them is not counted).
    pub fn chars(&self) -> usize {
        self.content.chars().count()
            + self
                .tool_calls
                .iter()
                .map(|c| c.function.name.chars().count() + c.function.arguments.chars().count())
                .sum::<usize>()
    }
}

/// A tool call of an assistant message, in the chat-completions wire form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text (`{"command": "..."}`).
    pub arguments: String,
}

/// What one request carried of the conversation (`engine::agents::llm::context`): the
/// system message, then, when `elided > 0`, one note saying so, then the messages
/// `messages[1 + elided .. history]`, each cut to `cap` characters (head and tail). The
/// transcript's `messages` keep everything; [`super::context::sent`] rebuilds a request
/// from this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// How many messages of the transcript the conversation had (the system prompt included).
    pub history: usize,
    /// Messages after the system prompt left out (the oldest).
    pub elided: usize,
    /// Each message sent was cut to this many characters.
    pub cap: usize,
    /// Characters sent (contents and tool calls, the note included).
    pub chars: usize,
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
    /// What the requests of this turn carried of the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Window>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The command taken from the reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The command came as a `run_command` tool call (not a fenced block).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_call: bool,
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
