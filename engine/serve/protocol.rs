//! The OpenEnv wire format (`openenv-core` 0.3): WebSocket frames in, observations, states and
//! errors out, and the reset arguments and actions of this factory.
//!
//! A client frame is a JSON object with a `type` (`reset`, `step`, `state`, `close`, `mcp`)
//! and, for `reset`, `step` and `mcp`, a `data` object. The server answers `{"type":
//! "observation", "data": {"observation": {...}, "reward": r, "done": d}}`, `{"type":
//! "state", "data": {...}}`, `{"type": "mcp", "data": <JSON-RPC response>}` or `{"type":
//! "error", "data": {"message": ..., "code": ...}}` with the protocol's error codes.

use crate::env::{Action, Info, Observation};
use crate::instance::{PerturbationChoice, Plan};
use serde_json::{json, Map, Value};
use std::path::Path;

/// The protocol's error codes (`openenv.core.env_server.types.WSErrorCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidJson,
    UnknownType,
    ValidationError,
    ExecutionError,
    CapacityReached,
    SessionError,
}

impl ErrorCode {
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidJson => "INVALID_JSON",
            Self::UnknownType => "UNKNOWN_TYPE",
            Self::ValidationError => "VALIDATION_ERROR",
            Self::ExecutionError => "EXECUTION_ERROR",
            Self::CapacityReached => "CAPACITY_REACHED",
            Self::SessionError => "SESSION_ERROR",
        }
    }
}

/// A refused frame, reset or action: the code and a message naming the place and reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {message}", code.name())]
pub struct ProtocolError {
    pub code: ErrorCode,
    pub message: String,
    /// The infrastructure (sandbox, cache), not the client, failed.
    pub infra_failure: bool,
}

impl ProtocolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            infra_failure: false,
        }
    }

    fn invalid(place: &str, reason: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::ValidationError, format!("{place}: {reason}"))
    }

    /// The error frame (`{"type": "error", "data": {...}}`).
    pub fn frame(&self) -> Value {
        json!({"type": "error", "data": self.data()})
    }

    /// The error's `data` object.
    pub fn data(&self) -> Value {
        json!({
            "message": self.message,
            "code": self.code.name(),
            "infra_failure": self.infra_failure,
        })
    }
}

/// A parsed client frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Reset(ResetArgs),
    Step(Action),
    State,
    Close,
    /// A JSON-RPC request carried over the WebSocket.
    Mcp(Value),
}

/// What a reset chooses: the task, the seed, a template (by name) or an explicit list of
/// perturbations. Every field is optional; `episode_id` is the client's label.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResetArgs {
    pub task: Option<String>,
    pub seed: Option<u64>,
    pub template: Option<String>,
    pub perturbations: Option<Vec<PerturbationChoice>>,
    pub episode_id: Option<String>,
    /// Send the feature vector with each observation (default true).
    pub features: bool,
    /// The step limit of this episode (default: the server's `--max-steps`, else the task's).
    pub max_steps: Option<u32>,
}

/// The largest step limit a reset may ask for.
pub const MAX_RESET_STEPS: u64 = 1_000_000;

/// Longest accepted `episode_id` (as `openenv-core`'s `ResetRequest`).
pub const MAX_EPISODE_ID: usize = 255;
/// Most perturbations one reset may name.
pub const MAX_PERTURBATIONS: usize = 16;

/// Parse one WebSocket text frame.
pub fn parse_message(text: &str) -> Result<Incoming, ProtocolError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ProtocolError::new(ErrorCode::InvalidJson, format!("Invalid JSON: {e}")))?;
    let Value::Object(mut m) = v else {
        return Err(ProtocolError::invalid(
            "message",
            "expected a JSON object with a `type`",
        ));
    };
    let ty = match m.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ProtocolError::invalid("type", "expected a string")),
        None => String::new(),
    };
    let data = m.remove("data");
    let allowed: &[&str] = match ty.as_str() {
        "reset" | "step" | "mcp" => &["type", "data"],
        "state" | "close" => &["type"],
        _ => {
            return Err(ProtocolError::new(
                ErrorCode::UnknownType,
                format!("Unknown message type: {}", crate::text::cut(&ty)),
            ))
        }
    };
    if let Some(extra) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ProtocolError::invalid(
            &format!("{ty} message"),
            format!("unknown field `{}`", crate::text::cut(extra)),
        ));
    }
    if matches!(ty.as_str(), "state" | "close") && data.is_some() {
        return Err(ProtocolError::invalid(
            &format!("{ty} message"),
            "unknown field `data`",
        ));
    }
    Ok(match ty.as_str() {
        "reset" => Incoming::Reset(parse_reset(data.as_ref().unwrap_or(&Value::Null))?),
        "step" => match data {
            Some(d) => Incoming::Step(parse_action(&d)?),
            None => return Err(ProtocolError::invalid("step message", "`data` is required")),
        },
        "mcp" => match data {
            Some(d @ Value::Object(_)) => Incoming::Mcp(d),
            _ => {
                return Err(ProtocolError::invalid(
                    "mcp message",
                    "`data` must be a JSON-RPC request object",
                ))
            }
        },
        "state" => Incoming::State,
        _ => Incoming::Close,
    })
}

fn object<'a>(v: &'a Value, place: &str) -> Result<Option<&'a Map<String, Value>>, ProtocolError> {
    match v {
        Value::Null => Ok(None),
        Value::Object(m) => Ok(Some(m)),
        _ => Err(ProtocolError::invalid(place, "expected an object")),
    }
}

fn opt_str(m: &Map<String, Value>, key: &str, max: usize) -> Result<Option<String>, ProtocolError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() <= max => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(ProtocolError::invalid(
            key,
            format!("longer than {max} bytes"),
        )),
        Some(_) => Err(ProtocolError::invalid(key, "expected a string")),
    }
}

/// Parse reset arguments (`data` of a reset frame, or the body of `POST /reset`). Unknown
/// keys are refused, except `session_id` (the HTTP body's session).
pub fn parse_reset(v: &Value) -> Result<ResetArgs, ProtocolError> {
    let mut args = ResetArgs {
        features: true,
        ..ResetArgs::default()
    };
    let Some(m) = object(v, "reset data")? else {
        return Ok(args);
    };
    const KNOWN: &[&str] = &[
        "task",
        "seed",
        "template",
        "perturbations",
        "episode_id",
        "features",
        "max_steps",
        "session_id",
    ];
    if let Some(k) = m.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ProtocolError::invalid(
            "reset data",
            format!(
                "unknown field `{}` (known: {})",
                crate::text::cut(k),
                KNOWN.join(", ")
            ),
        ));
    }
    args.task = opt_str(m, "task", 64)?;
    args.template = opt_str(m, "template", 64)?;
    args.episode_id = opt_str(m, "episode_id", MAX_EPISODE_ID)?;
    args.seed =
        match m.get("seed") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
                ProtocolError::invalid("seed", "expected a whole number in 0..2^64")
            })?),
            Some(_) => return Err(ProtocolError::invalid("seed", "expected a whole number")),
        };
    args.max_steps = match m.get("max_steps") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k @ 1..=MAX_RESET_STEPS) => Some(k as u32),
            _ => {
                return Err(ProtocolError::invalid(
                    "max_steps",
                    format!("expected a whole number in 1..={MAX_RESET_STEPS}"),
                ))
            }
        },
        Some(_) => {
            return Err(ProtocolError::invalid(
                "max_steps",
                "expected a whole number",
            ))
        }
    };
    args.features = match m.get("features") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ProtocolError::invalid("features", "expected true or false")),
    };
    args.perturbations = match m.get("perturbations") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.len() <= MAX_PERTURBATIONS => Some(
            a.iter()
                .enumerate()
                .map(|(i, p)| perturbation(i, p))
                .collect::<Result<_, _>>()?,
        ),
        Some(Value::Array(_)) => {
            return Err(ProtocolError::invalid(
                "perturbations",
                format!("at most {MAX_PERTURBATIONS}"),
            ))
        }
        Some(_) => {
            return Err(ProtocolError::invalid(
                "perturbations",
                "expected a list of specs (`NAME:key=value`) or {name, params} objects",
            ))
        }
    };
    if args.template.is_some() && args.perturbations.is_some() {
        return Err(ProtocolError::invalid(
            "reset data",
            "`template` and `perturbations` exclude each other (a template samples its own)",
        ));
    }
    Ok(args)
}

fn perturbation(i: usize, v: &Value) -> Result<PerturbationChoice, ProtocolError> {
    let place = format!("perturbations[{i}]");
    let choice = match v {
        Value::String(s) => {
            crate::perturb::parse_spec(s).map_err(|e| ProtocolError::invalid(&place, e))?
        }
        Value::Object(_) => serde_json::from_value::<PerturbationChoice>(v.clone())
            .map_err(|e| ProtocolError::invalid(&place, e))?,
        _ => {
            return Err(ProtocolError::invalid(
                &place,
                "expected a string or an object",
            ))
        }
    };
    if crate::perturb::get(&choice.name).is_none() {
        return Err(ProtocolError::invalid(
            &place,
            format!(
                "unknown perturbation `{}` (`engine perturb list`)",
                crate::text::cut(&choice.name)
            ),
        ));
    }
    Ok(choice)
}

/// Parse an action: `{"command": "ls -la"}` (a shell command) or `{"index": N}` (catalogue
/// action N); a `metadata` object is allowed beside it, as in `openenv-core`'s `Action`.
pub fn parse_action(v: &Value) -> Result<Action, ProtocolError> {
    let Some(m) = object(v, "action")?.filter(|m| !m.is_empty()) else {
        return Err(ProtocolError::invalid(
            "action",
            "expected {\"command\": \"...\"} or {\"index\": N}",
        ));
    };
    if let Some(k) = m
        .keys()
        .find(|k| !matches!(k.as_str(), "command" | "index" | "metadata"))
    {
        return Err(ProtocolError::invalid(
            "action",
            format!("unknown field `{}`", crate::text::cut(k)),
        ));
    }
    if let Some(md) = m.get("metadata") {
        if !md.is_object() {
            return Err(ProtocolError::invalid(
                "action.metadata",
                "expected an object",
            ));
        }
    }
    match (m.get("command"), m.get("index")) {
        (Some(_), Some(_)) => Err(ProtocolError::invalid(
            "action",
            "give either `command` or `index`, not both",
        )),
        (Some(Value::String(s)), None) if s.trim().is_empty() => {
            Err(ProtocolError::invalid("action.command", "is empty"))
        }
        (Some(Value::String(s)), None) if s.contains('\0') => Err(ProtocolError::invalid(
            "action.command",
            "contains a NUL byte",
        )),
        (Some(Value::String(s)), None) => Ok(Action::Command(s.clone())),
        (Some(_), None) => Err(ProtocolError::invalid(
            "action.command",
            "expected a string",
        )),
        (None, Some(Value::Number(n))) => n
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .map(Action::Index)
            .ok_or_else(|| ProtocolError::invalid("action.index", "expected a whole number >= 0")),
        (None, Some(_)) => Err(ProtocolError::invalid(
            "action.index",
            "expected a whole number",
        )),
        (None, None) => Err(ProtocolError::invalid(
            "action",
            "expected {\"command\": \"...\"} or {\"index\": N}",
        )),
    }
}

/// True when `name` can name a file of the templates directory (no path, no dot file).
fn template_name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.contains("..")
}

impl ResetArgs {
    /// The plan these arguments choose: a template of `templates` (sampled at the seed), or
    /// the task (else `default_task`) with the given perturbations.
    pub fn plan(
        &self,
        templates: &Path,
        default_task: &str,
        seed: u64,
    ) -> Result<Plan, ProtocolError> {
        if let Some(name) = &self.template {
            if !template_name_ok(name) {
                return Err(ProtocolError::invalid(
                    "template",
                    "a template name (letters, digits, `-`, `_`), not a path",
                ));
            }
            let file = ["toml", "yaml", "yml"]
                .iter()
                .map(|ext| templates.join(format!("{name}.{ext}")))
                .find(|f| f.is_file())
                .ok_or_else(|| {
                    ProtocolError::invalid(
                        "template",
                        format!(
                            "no template `{name}` in {} (known: {})",
                            templates.display(),
                            template_names(templates).join(", ")
                        ),
                    )
                })?;
            let t = crate::template::Template::load(&file)
                .map_err(|e| ProtocolError::invalid("template", e))?;
            let plan = t.sample(seed);
            if let Some(task) = &self.task {
                if plan.task.as_ref().map(|t| t.name.as_str()) != Some(task.as_str()) {
                    return Err(ProtocolError::invalid(
                        "task",
                        format!("the template `{name}` does not have the task `{task}`"),
                    ));
                }
            }
            if plan.task.is_none() {
                return Err(ProtocolError::invalid(
                    "template",
                    format!("the template `{name}` has no task: an episode needs one"),
                ));
            }
            return Ok(plan);
        }
        let task = self.task.as_deref().unwrap_or(default_task);
        if crate::tasks::get(task).is_none() {
            return Err(ProtocolError::invalid(
                "task",
                format!(
                    "unknown task `{}` (known: {})",
                    crate::text::cut(task),
                    crate::tasks::names().join(", ")
                ),
            ));
        }
        Ok(Plan::for_task(
            task,
            seed,
            self.perturbations.clone().unwrap_or_default(),
        ))
    }
}

/// The names of the templates of a directory.
pub fn template_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let ext = p.extension()?.to_str()?;
            matches!(ext, "toml" | "yaml" | "yml")
                .then(|| p.file_stem()?.to_str().map(String::from))
                .flatten()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What the observation of a reset or a step carries beside the sandbox's observation.
pub struct StepView<'a> {
    pub observation: &'a Observation,
    pub reward: Option<f64>,
    pub terminated: bool,
    pub truncated: bool,
    pub info: &'a Info,
    /// The task's catalogue (sent with the reset's observation).
    pub catalogue: Option<&'a [String]>,
    pub features: bool,
}

/// The `data` of an observation frame (and the body of `POST /reset` and `POST /step`):
/// `{"observation": {...}, "reward": r, "done": terminated || truncated}`.
pub fn observation_data(v: &StepView<'_>) -> Value {
    let o = v.observation;
    let mut obs = json!({
        "text": o.text,
        "instruction": o.instruction,
        "cwd": o.cwd,
        "last_command": o.last_command,
        "exit_code": o.exit_code,
        "stdout": o.stdout,
        "stderr": o.stderr,
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
        "listing": o.listing,
        "disk": o.disk,
        "step": o.step,
        "max_steps": o.max_steps,
        "progress": v.info.progress,
        "terminated": v.terminated,
        "truncated": v.truncated,
        "info": v.info,
    });
    if let Some(m) = obs.as_object_mut() {
        if v.features {
            m.insert("features".into(), json!(o.features));
        }
        if let Some(c) = v.catalogue {
            m.insert("catalogue".into(), json!(c));
        }
    }
    json!({
        "observation": obs,
        "reward": v.reward,
        "done": v.terminated || v.truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_codes() {
        assert_eq!(parse_message("{").unwrap_err().code, ErrorCode::InvalidJson);
        assert_eq!(
            parse_message(r#"{"type":"jump"}"#).unwrap_err().code,
            ErrorCode::UnknownType
        );
        assert_eq!(
            parse_message(r#"{"type":"step","data":{"index":"x"}}"#)
                .unwrap_err()
                .code,
            ErrorCode::ValidationError
        );
        assert_eq!(
            parse_message(r#"{"type":"step","data":{"index":3}}"#).unwrap(),
            Incoming::Step(Action::Index(3))
        );
        assert_eq!(
            parse_message(r#"{"type":"step","data":{"command":"ls","metadata":{}}}"#).unwrap(),
            Incoming::Step(Action::Command("ls".into()))
        );
        assert_eq!(
            parse_message(r#"{"type":"state","data":{}}"#)
                .unwrap_err()
                .code,
            ErrorCode::ValidationError
        );
        let r = parse_message(
            r#"{"type":"reset","data":{"task":"archive-logs","seed":3,"perturbations":["tool-missing:tool=tar"]}}"#,
        )
        .unwrap();
        let Incoming::Reset(a) = r else {
            panic!("{r:?}")
        };
        assert_eq!(a.seed, Some(3));
        assert_eq!(a.perturbations.unwrap()[0].name, "tool-missing");
        assert!(parse_reset(&json!({"perturbations": ["no-such-fault"]})).is_err());
        assert!(parse_reset(&json!({"seed": -1})).is_err());
        assert!(parse_reset(&json!({"template": "x", "perturbations": []})).is_err());
        assert_eq!(
            parse_reset(&json!({"max_steps": 7})).unwrap().max_steps,
            Some(7)
        );
        assert_eq!(parse_reset(&json!({})).unwrap().max_steps, None);
        for bad in [
            json!(0),
            json!(-3),
            json!(2.5),
            json!(1_000_001),
            json!("7"),
        ] {
            let e = parse_reset(&json!({ "max_steps": bad })).unwrap_err();
            assert_eq!(e.code, ErrorCode::ValidationError);
            assert!(e.to_string().contains("max_steps"), "{e}");
        }
    }

    #[test]
    fn template_names_are_not_paths() {
        for bad in ["../etc/passwd", "/etc/x", ".hidden", "a/b", ""] {
            assert!(!template_name_ok(bad), "{bad}");
        }
        assert!(template_name_ok("archive-logs"));
    }
}
