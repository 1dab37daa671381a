//! One chat completion from an OpenAI-compatible endpoint (`POST {base_url}/chat/completions`),
//! with retries: rate limits (429, honouring `Retry-After`), 408, 409, 5xx, timeouts, transport
//! errors and unreadable bodies are retried with bounded exponential backoff; any other status
//! fails at once. Every request is written down as an [`Attempt`].

use super::transcript::{Attempt, Message, Usage};
use super::{LlmError, Settings};
use rand::Rng;
use std::time::{Duration, Instant};

/// Largest response body read (a chat completion is kilobytes).
const MAX_BODY: u64 = 4 << 20;

/// A reply: its text, its tool calls (as sent) and the tokens the endpoint reported.
#[derive(Debug, Clone)]
pub struct Completion {
    pub content: String,
    pub tool_calls: Vec<serde_json::Value>,
    pub usage: Option<Usage>,
}

/// An HTTP client for one endpoint.
pub struct ChatClient {
    http: ureq::Agent,
    pub endpoint: String,
    key: Option<String>,
    settings: Settings,
}

/// What one request came to.
enum Outcome {
    Done(Completion),
    /// Worth another try; the server's `Retry-After`, if it gave one.
    Retry(String, Option<Duration>),
    Fatal(LlmError),
}

impl ChatClient {
    pub fn new(settings: Settings, key: Option<String>) -> Self {
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(settings.timeout))
            .user_agent(concat!("envfactory/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self {
            http,
            endpoint: format!(
                "{}/chat/completions",
                settings.base_url.trim_end_matches('/')
            ),
            key,
            settings,
        }
    }

    /// The next reply to `messages`; each request is appended to `attempts`.
    pub fn complete(
        &self,
        messages: &[Message],
        attempts: &mut Vec<Attempt>,
    ) -> Result<Completion, LlmError> {
        let mut body = serde_json::json!({
            "model": self.settings.model,
            "messages": messages,
        });
        if let Some(t) = self.settings.temperature {
            body["temperature"] = t.into();
        }
        if let Some(m) = self.settings.max_tokens {
            body["max_tokens"] = m.into();
        }
        if self.settings.tools {
            body["tools"] = super::tools::definitions();
            body["tool_choice"] = "auto".into();
        }
        let body = body.to_string();
        let mut backoff = self.settings.backoff;
        let mut n = 0;
        loop {
            let t = Instant::now();
            let outcome = self.once(&body);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let (why, retry_after) = match outcome {
                Outcome::Done(c) => {
                    attempts.push(Attempt {
                        outcome: "ok".into(),
                        ms,
                        wait_ms: None,
                    });
                    return Ok(c);
                }
                Outcome::Fatal(e) => {
                    attempts.push(Attempt {
                        outcome: e.to_string(),
                        ms,
                        wait_ms: None,
                    });
                    return Err(e);
                }
                Outcome::Retry(why, after) => (why, after),
            };
            if n == self.settings.max_retries {
                attempts.push(Attempt {
                    outcome: why.clone(),
                    ms,
                    wait_ms: None,
                });
                return Err(LlmError::GaveUp {
                    endpoint: self.endpoint.clone(),
                    attempts: n + 1,
                    last: why,
                });
            }
            // Equal jitter: half the backoff plus a random part of the other half, so that
            // workers hitting one rate limit spread out; the server's Retry-After wins.
            let jittered = backoff.mul_f64(0.5 + 0.5 * rand::thread_rng().gen::<f64>());
            let wait = retry_after.unwrap_or(jittered).min(self.settings.max_wait);
            tracing::debug!(endpoint = %self.endpoint, attempt = n + 1, reason = %why, wait_ms = wait.as_millis() as u64, "retrying a chat completion");
            attempts.push(Attempt {
                outcome: why,
                ms,
                wait_ms: Some(wait.as_secs_f64() * 1e3),
            });
            std::thread::sleep(wait);
            backoff = (backoff * 2).min(self.settings.max_wait);
            n += 1;
        }
    }

    fn once(&self, body: &str) -> Outcome {
        let mut req = self
            .http
            .post(&self.endpoint)
            .header("content-type", "application/json");
        if let Some(k) = &self.key {
            req = req.header("authorization", &format!("Bearer {k}"));
        }
        let mut resp = match req.send(body) {
            Ok(r) => r,
            Err(e) => return classify(e),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(86_400.0)));
        let text = match resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_string()
        {
            Ok(t) => t,
            Err(e) => return classify(e),
        };
        match status {
            200..=299 => match completion(&text) {
                Ok(c) => Outcome::Done(c),
                Err(why) => Outcome::Retry(format!("bad body: {why}"), None),
            },
            408 | 409 | 429 | 500..=599 => Outcome::Retry(format!("http {status}"), retry_after),
            _ => Outcome::Fatal(LlmError::Status {
                endpoint: self.endpoint.clone(),
                status,
                body: crate::text::cut(text.trim()).into_owned(),
            }),
        }
    }
}

/// A transport error: retried unless it is a mistake of the configuration (a bad URL, TLS).
fn classify(e: ureq::Error) -> Outcome {
    use ureq::Error as E;
    match e {
        E::Timeout(_) => Outcome::Retry("timeout".into(), None),
        E::BadUri(_)
        | E::InvalidProxyUrl
        | E::RequireHttpsOnly(_)
        | E::TlsRequired
        | E::Http(_)
        | E::Tls(_)
        | E::Rustls(_) => Outcome::Fatal(LlmError::Transport(e.to_string())),
        e => Outcome::Retry(format!("transport: {e}"), None),
    }
}

/// The reply text and usage of a chat-completion body.
fn completion(text: &str) -> Result<Completion, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let message = v
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .ok_or("no choices[0].message")?;
    let content = match message.get("content") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(_) => return Err("choices[0].message.content is not a string".into()),
    };
    let tool_calls = match message.get("tool_calls") {
        Some(serde_json::Value::Array(calls)) => calls.clone(),
        Some(serde_json::Value::Null) | None => Vec::new(),
        Some(_) => return Err("choices[0].message.tool_calls is not an array".into()),
    };
    let usage = v
        .get("usage")
        .and_then(|u| serde_json::from_value::<UsageWire>(u.clone()).ok())
        .map(|u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u
                .total_tokens
                .unwrap_or(u.prompt_tokens.saturating_add(u.completion_tokens)),
        });
    Ok(Completion {
        content,
        tool_calls,
        usage,
    })
}

#[derive(serde::Deserialize)]
struct UsageWire {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    total_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_parse_or_say_why_not() {
        let c = completion(
            r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        )
        .unwrap();
        assert_eq!(c.content, "hi");
        assert_eq!(c.usage.unwrap().total_tokens, 5);
        assert!(completion(r#"{"choices":[{"message":{"content":null}}]}"#)
            .unwrap()
            .content
            .is_empty());
        assert!(completion("<html>").unwrap_err().starts_with("not JSON"));
        assert_eq!(
            completion(r#"{"choices":[]}"#).unwrap_err(),
            "no choices[0].message"
        );
        assert!(completion(r#"{"choices":[{"message":{"content":7}}]}"#).is_err());
        let c = completion(
            r#"{"choices":[{"message":{"content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"run_command","arguments":"{}"}}]}}]}"#,
        )
        .unwrap();
        assert_eq!(c.tool_calls.len(), 1);
        assert!(completion(r#"{"choices":[{"message":{"tool_calls":{}}}]}"#).is_err());
    }
}
