//! The language-model agent: a model behind any OpenAI-compatible chat-completions endpoint
//! acts with free-text shell commands. The system prompt gives the task's instruction, the
//! step limit and the reply format ([`reply`]); every observation goes back as a user message.
//! Rate limits, 5xx, timeouts and unreadable bodies are retried with bounded exponential
//! backoff ([`client`]); replies without a command are answered with a correction, a few
//! times. Past those bounds the agent fails ([`LlmError`], an agent failure of the episode,
//! never an infrastructure failure). A long conversation is fitted to a context budget
//! ([`context`]); a model may act through the `run_command` function tool instead of fenced
//! blocks ([`tools`], `[llm] tools = true`). The conversation, what each request carried, the
//! requests and the token usage are the [`Transcript`] kept in the episode record.

pub mod client;
pub mod context;
pub mod reply;
pub mod tools;
pub mod transcript;

pub use transcript::{Attempt, Message, Transcript, Turn, Usage, Window};

use crate::env::{Action, Observation};
use crate::instance::TaskSetup;
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, thiserror::Error)]
pub enum LlmError {
    /// `key` is the config's dotted name (`llm.timeout`).
    #[error("{key}: {reason}")]
    Config { key: &'static str, reason: String },
    #[error("{endpoint}: gave up after {attempts} requests (last: {last})")]
    GaveUp {
        endpoint: String,
        attempts: u32,
        last: String,
    },
    #[error("{endpoint}: HTTP {status}: {body}")]
    Status {
        endpoint: String,
        status: u16,
        body: String,
    },
    #[error("the request could not be made: {0}")]
    Transport(String),
    #[error("{replies} replies in a row held no command (last: {last})")]
    Malformed { replies: u32, last: String },
}

impl LlmError {
    /// The model could not go on (its endpoint gave up, refused a request of the episode,
    /// replied without commands): the agent failed the episode. A mistake of the
    /// configuration (a refused key, an unknown model or address, TLS, a bad setting) is not
    /// an outcome of any episode: it stops the run, so that a misconfigured evaluation never
    /// reads as a success rate of 0.
    pub fn is_agent_failure(&self) -> bool {
        match self {
            Self::GaveUp { .. } | Self::Malformed { .. } => true,
            Self::Status { status, .. } => !matches!(status, 401 | 403 | 404),
            Self::Config { .. } | Self::Transport(_) => false,
        }
    }
}

/// The `[llm]` table of an experiment, or `engine episode --llm-*`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8001/v1`; requests
    /// go to `{base_url}/chat/completions`.
    pub base_url: String,
    pub model: String,
    /// The environment variable holding the API key (sent as a bearer token). Unset: the key
    /// is `OPENAI_API_KEY` when that is set, and none otherwise (local servers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Limit of one request, e.g. "60s".
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// Retries of one reply (rate limits, 5xx, timeouts, unreadable bodies).
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    /// The first backoff; it doubles with every retry.
    #[serde(default = "default_backoff")]
    pub backoff: String,
    /// The longest wait between two requests (backoff and `Retry-After` alike).
    #[serde(default = "default_max_wait")]
    pub max_wait: String,
    /// Replies in a row without a command before the agent gives up.
    #[serde(default = "default_malformed")]
    pub max_malformed: u32,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Each message sent to the model (an observation, a reply) is cut to this many
    /// characters, keeping its head and tail.
    #[serde(default = "default_observation_chars")]
    pub max_observation_chars: usize,
    /// The most characters of conversation one request carries (about four a token): the
    /// system prompt and the latest turns; older turns are replaced by a note.
    #[serde(default = "default_context_chars")]
    pub max_context_chars: usize,
    /// Offer the `run_command` function tool (`tools`, `tool_choice: auto`). Off by default:
    /// a fenced block works with every endpoint, while a server without tool support refuses
    /// requests that carry `tools`.
    #[serde(default)]
    pub tools: bool,
}

fn default_timeout() -> String {
    "60s".into()
}
fn default_retries() -> u32 {
    5
}
fn default_backoff() -> String {
    "1s".into()
}
fn default_max_wait() -> String {
    "60s".into()
}
fn default_malformed() -> u32 {
    3
}
fn default_observation_chars() -> usize {
    8000
}
fn default_context_chars() -> usize {
    32_000
}

impl LlmConfig {
    /// The defaults for an endpoint and model.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            timeout: default_timeout(),
            max_retries: default_retries(),
            backoff: default_backoff(),
            max_wait: default_max_wait(),
            max_malformed: default_malformed(),
            temperature: None,
            max_tokens: None,
            max_observation_chars: default_observation_chars(),
            max_context_chars: default_context_chars(),
            tools: false,
        }
    }

    /// Checked and resolved; errors name the key (`llm.timeout`) and the reason.
    pub fn settings(&self) -> Result<Settings, LlmError> {
        let bad = |key, reason: String| LlmError::Config { key, reason };
        let url = self.base_url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://"))
            || url.len() <= "https://".len()
        {
            return Err(bad(
                "llm.base_url",
                format!(
                    "`{}` is not an http:// or https:// URL",
                    crate::text::cut(url)
                ),
            ));
        }
        // Credentials in the address would be copied into every transcript (`endpoint`).
        let authority = url.split_once("://").map_or("", |(_, r)| r);
        let authority = authority.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return Err(bad(
                "llm.base_url",
                "holds credentials (user@): give the key through `api_key_env` instead, so \
                 that it stays out of transcripts"
                    .into(),
            ));
        }
        if self.model.trim().is_empty() {
            return Err(bad("llm.model", "empty".into()));
        }
        let duration =
            |key, s: &str| crate::units::parse_duration(s).map_err(|e| bad(key, e.to_string()));
        if self.max_retries > 100 {
            return Err(bad("llm.max_retries", "at most 100".into()));
        }
        if !(1..=100).contains(&self.max_malformed) {
            return Err(bad("llm.max_malformed", "between 1 and 100".into()));
        }
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(bad("llm.temperature", "between 0 and 2".into()));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(bad("llm.max_tokens", "at least 1".into()));
        }
        if !(256..=1 << 20).contains(&self.max_observation_chars) {
            return Err(bad(
                "llm.max_observation_chars",
                "between 256 and 1048576".into(),
            ));
        }
        if !(4096..=1 << 24).contains(&self.max_context_chars) {
            return Err(bad(
                "llm.max_context_chars",
                "between 4096 and 16777216".into(),
            ));
        }
        Ok(Settings {
            base_url: url.to_string(),
            model: self.model.clone(),
            timeout: duration("llm.timeout", &self.timeout)?,
            max_retries: self.max_retries,
            backoff: duration("llm.backoff", &self.backoff)?,
            max_wait: duration("llm.max_wait", &self.max_wait)?,
            max_malformed: self.max_malformed,
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            max_observation_chars: self.max_observation_chars,
            max_context_chars: self.max_context_chars,
            tools: self.tools,
        })
    }

    /// The API key: from `api_key_env` (which must then be set), else `OPENAI_API_KEY` if set.
    pub fn api_key(&self) -> Result<Option<String>, LlmError> {
        match &self.api_key_env {
            Some(var) => match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => Ok(Some(k.trim().to_string())),
                _ => Err(LlmError::Config {
                    key: "llm.api_key_env",
                    reason: format!(
                        "the environment variable `{}` is not set",
                        crate::text::cut(var)
                    ),
                }),
            },
            None => Ok(std::env::var("OPENAI_API_KEY")
                .ok()
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())),
        }
    }
}

/// A checked [`LlmConfig`].
#[derive(Debug, Clone)]
pub struct Settings {
    pub base_url: String,
    pub model: String,
    pub timeout: Duration,
    pub max_retries: u32,
    pub backoff: Duration,
    pub max_wait: Duration,
    pub max_malformed: u32,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub max_observation_chars: usize,
    pub max_context_chars: usize,
    pub tools: bool,
}

/// The system prompt of an episode (`tools`: the model may call `run_command`).
pub fn system_prompt(setup: &TaskSetup, tools: bool) -> String {
    let format = if tools {
        "Reply format: think briefly if you like, then call the run_command function once with the command, or give exactly one command in a fenced block:\n"
    } else {
        "Reply format: think briefly if you like, then give exactly one command in a fenced block:\n"
    };
    format!(
        "You operate a Linux machine through a shell to complete a task. Each of your replies \
runs one shell command (with `sh -c`, as root, in the working directory shown, without a \
terminal: no editors, pagers or prompts), and the next message shows its exit status, output, \
the working directory and its listing.\n\n\
Task: {instruction}\n\n\
{format}```sh\n<command>\n```\n\
Only the first fenced block runs; a block may hold several lines. The episode ends when the \
task is verified as done, or after {max_steps} commands. If you believe the task is complete, \
reply with the single word DONE.",
        instruction = setup.instruction,
        max_steps = setup.max_steps,
    )
}

/// A language model as an agent ([`crate::agents::Agent`]).
pub struct LlmAgent {
    client: client::ChatClient,
    settings: Settings,
    transcript: Transcript,
    /// The tool call the next observation answers.
    pending_call: Option<String>,
}

impl LlmAgent {
    /// Check the config and read the key (errors are bad input, not agent failures).
    pub fn new(cfg: &LlmConfig) -> Result<Self, LlmError> {
        let settings = cfg.settings()?;
        let client = client::ChatClient::new(settings.clone(), cfg.api_key()?);
        let transcript = Transcript {
            model: settings.model.clone(),
            endpoint: client.endpoint.clone(),
            ..Transcript::default()
        };
        Ok(Self {
            client,
            settings,
            transcript,
            pending_call: None,
        })
    }

    pub fn model(&self) -> &str {
        &self.settings.model
    }

    /// Begin a conversation.
    pub fn start(&mut self, setup: &TaskSetup) {
        self.transcript.messages = vec![Message::new(
            "system",
            system_prompt(setup, self.settings.tools),
        )];
        self.pending_call = None;
        self.transcript.turns.clear();
        self.transcript.usage = Usage::default();
        self.transcript.failure = None;
    }

    /// The next command for `obs`, `None` when the model says it is done.
    pub fn next(&mut self, obs: &Observation) -> Result<Option<Action>, LlmError> {
        let r = self.ask(obs);
        if let Err(e) = &r {
            self.transcript.failure = Some(e.to_string());
        }
        r
    }

    fn ask(&mut self, obs: &Observation) -> Result<Option<Action>, LlmError> {
        let text = context::cut_middle(&obs.text, self.settings.max_observation_chars);
        self.transcript
            .messages
            .push(match self.pending_call.take() {
                Some(id) => Message::tool(&id, text),
                None => Message::new("user", text),
            });
        let mut malformed = 0;
        loop {
            let (messages, window) = context::window(
                &self.transcript.messages,
                self.settings.max_context_chars,
                self.settings.max_observation_chars,
            );
            if window.elided > 0 {
                tracing::debug!(model = %self.settings.model, step = obs.step, elided = window.elided, chars = window.chars, "older turns left out of the request");
            }
            let mut turn = Turn {
                step: obs.step,
                context: Some(window),
                ..Turn::default()
            };
            let got = self.client.complete(&messages, &mut turn.attempts);
            let c = match got {
                Ok(c) => c,
                Err(e) => {
                    self.transcript.turns.push(turn);
                    return Err(e);
                }
            };
            if let Some(u) = &c.usage {
                self.transcript.usage.add(u);
            }
            turn.usage = c.usage;
            let parsed = self.understand(&c);
            let mut said = Message::new("assistant", c.content.clone());
            match parsed {
                Parsed::Call(cmd, call) => {
                    said.tool_calls = vec![call.clone()];
                    self.transcript.messages.push(said);
                    self.pending_call = Some(call.id);
                    turn.command = Some(cmd.clone());
                    turn.tool_call = true;
                    self.transcript.turns.push(turn);
                    return Ok(Some(Action::Command(cmd)));
                }
                Parsed::Text(reply::Reply::Command(cmd)) => {
                    self.transcript.messages.push(said);
                    turn.command = Some(cmd.clone());
                    self.transcript.turns.push(turn);
                    return Ok(Some(Action::Command(cmd)));
                }
                Parsed::Text(reply::Reply::Done) => {
                    self.transcript.messages.push(said);
                    turn.done = true;
                    self.transcript.turns.push(turn);
                    return Ok(None);
                }
                Parsed::Text(reply::Reply::Malformed(why)) | Parsed::BadCall(why) => {
                    if !c.tool_calls.is_empty() {
                        // Kept as text: a malformed call sent back as a call could make the
                        // server refuse every later request.
                        let calls = tools::describe(&c.tool_calls);
                        said.content = if said.content.trim().is_empty() {
                            calls
                        } else {
                            format!("{}\n{calls}", said.content)
                        };
                    }
                    self.transcript.messages.push(said);
                    malformed += 1;
                    tracing::debug!(model = %self.settings.model, step = obs.step, reason = %why, "a reply without a command");
                    turn.malformed = Some(why.clone());
                    self.transcript.turns.push(turn);
                    if malformed >= self.settings.max_malformed {
                        return Err(LlmError::Malformed {
                            replies: malformed,
                            last: why,
                        });
                    }
                    let how = if self.settings.tools {
                        "Call run_command once with {\"command\": \"...\"}, or reply with \
                         exactly one command in a ```sh fenced block, or DONE."
                    } else {
                        "Reply with exactly one command in a ```sh fenced block, or DONE."
                    };
                    self.transcript.messages.push(Message::new(
                        "user",
                        format!("Your reply held no command: {why}. {how}"),
                    ));
                }
            }
        }
    }

    /// What a reply asks for: a tool call when it has `tool_calls`, else its text.
    fn understand(&self, c: &client::Completion) -> Parsed {
        if c.tool_calls.is_empty() {
            return Parsed::Text(reply::parse(&c.content));
        }
        if !self.settings.tools {
            return Parsed::BadCall(
                "a tool call, but no tools are offered: give the command in a ```sh block".into(),
            );
        }
        match tools::parse(&c.tool_calls) {
            Ok((cmd, call)) => Parsed::Call(cmd, call),
            Err(why) => Parsed::BadCall(why),
        }
    }

    pub fn transcript(&self) -> &Transcript {
        &self.transcript
    }
}

/// A reply, understood.
enum Parsed {
    /// One valid `run_command` call: the command, and the call as kept.
    Call(String, transcript::ToolCall),
    /// Tool calls that are not one valid call: why.
    BadCall(String),
    /// A reply without tool calls.
    Text(reply::Reply),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked_by_key() {
        let ok = LlmConfig::new("http://127.0.0.1:9/v1", "m");
        let s = ok.settings().unwrap();
        assert_eq!(s.timeout, Duration::from_secs(60));
        let err = |f: &dyn Fn(&mut LlmConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            c.settings().unwrap_err().to_string()
        };
        assert!(err(&|c| c.base_url = "127.0.0.1:8000".into()).starts_with("llm.base_url: "));
        assert!(
            err(&|c| c.base_url = "https://me:sk-secret@api.example/v1".into())
                .contains("holds credentials")
        );
        assert!(err(&|c| c.model = " ".into()).starts_with("llm.model: "));
        assert!(err(&|c| c.timeout = "soon".into()).starts_with("llm.timeout: "));
        assert!(err(&|c| c.max_retries = 1000).starts_with("llm.max_retries: "));
        assert!(err(&|c| c.temperature = Some(f64::NAN)).starts_with("llm.temperature: "));
        assert!(err(&|c| c.max_context_chars = 100).starts_with("llm.max_context_chars: "));
        let mut c = ok.clone();
        c.api_key_env = Some("ENVFACTORY_SURELY_UNSET_KEY_VAR".into());
        assert!(c
            .api_key()
            .unwrap_err()
            .to_string()
            .starts_with("llm.api_key_env: "));
    }
}
