//! `POST /mcp` and the WebSocket's `mcp` frames: JSON-RPC 2.0 with `tools/list`, `tools/call`
//! and `openenv-core`'s session methods (`openenv/session/create`, `openenv/session/close`).
//!
//! The tools are the environment's operations: `reset`, `run_command` (a free-text shell
//! command), `catalogue_action` (an index into the task's catalogue) and `state`. Over HTTP a
//! call names its session (`params.session_id`, from `openenv/session/create`); over the
//! WebSocket the socket's session is used.

use super::protocol::{parse_action, parse_reset, ProtocolError};
use super::sessions::{Session, Sessions};
use serde_json::{json, Value};
use std::sync::Arc;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const SERVER_ERROR: i64 = -32000;

/// A JSON-RPC error response.
pub fn error(id: &Value, code: i64, message: impl Into<String>, data: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message.into()});
    if let (Some(d), Some(m)) = (data, e.as_object_mut()) {
        m.insert("data".into(), d);
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

fn invalid_params(id: &Value, message: impl Into<String>) -> Value {
    error(id, INVALID_PARAMS, message, None)
}

fn invalid_request(id: &Value, message: impl Into<String>) -> Value {
    error(id, INVALID_REQUEST, message, None)
}

fn success(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The tools, with their input schemas.
pub fn tools() -> Value {
    json!([
        {
            "name": "reset",
            "description": "Start an episode: a task (default: the server's), a seed, a template name or a list of perturbation specs (`NAME:key=value`).",
            "inputSchema": {"type": "object", "properties": {
                "task": {"type": "string"}, "seed": {"type": "integer", "minimum": 0},
                "template": {"type": "string"},
                "perturbations": {"type": "array", "items": {"type": "string"}},
                "episode_id": {"type": "string"}, "features": {"type": "boolean"}
            }, "additionalProperties": false}
        },
        {
            "name": "run_command",
            "description": "Run a shell command in the episode's sandbox (in its current directory); returns the observation.",
            "inputSchema": {"type": "object", "properties": {"command": {"type": "string"}},
                "required": ["command"], "additionalProperties": false}
        },
        {
            "name": "catalogue_action",
            "description": "Take action N of the task's catalogue (the reset's observation lists it).",
            "inputSchema": {"type": "object", "properties": {"index": {"type": "integer", "minimum": 0}},
                "required": ["index"], "additionalProperties": false}
        },
        {
            "name": "state",
            "description": "The episode's state: episode id, steps, task, seed, instance, progress, return.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}
        }
    ])
}

/// A tool's result as MCP content: the observation's text and the whole data.
fn tool_result(data: Value) -> Value {
    let text = data
        .pointer("/observation/text")
        .and_then(Value::as_str)
        .map(String::from)
        .unwrap_or_else(|| data.to_string());
    json!({"content": [{"type": "text", "text": text}], "structuredContent": data, "isError": false})
}

fn tool_error(e: &ProtocolError) -> Value {
    json!({"content": [{"type": "text", "text": e.to_string()}], "structuredContent": e.data(), "isError": true})
}

/// Answer one JSON-RPC request (already parsed as JSON).
pub async fn handle(sessions: &Arc<Sessions>, req: &Value, socket: Option<&Arc<Session>>) -> Value {
    let null = Value::Null;
    let Some(m) = req.as_object() else {
        return error(
            &null,
            INVALID_REQUEST,
            "Invalid Request: expected an object",
            None,
        );
    };
    let id = match m.get("id") {
        None => &null,
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Null)) => v,
        Some(_) => {
            return error(
                &null,
                INVALID_REQUEST,
                "Invalid Request: `id` must be a string or a number",
                None,
            )
        }
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid_request(id, "Invalid Request: `jsonrpc` must be \"2.0\"");
    }
    let Some(method) = m.get("method").and_then(Value::as_str) else {
        return invalid_request(id, "Invalid Request: `method` must be a string");
    };
    if let Some(k) = m
        .keys()
        .find(|k| !matches!(k.as_str(), "jsonrpc" | "method" | "params" | "id"))
    {
        return invalid_request(
            id,
            format!("Invalid Request: unknown field `{}`", crate::text::cut(k)),
        );
    }
    let empty = json!({});
    let params = m.get("params").unwrap_or(&empty);
    let Some(p) = params.as_object() else {
        return invalid_params(id, "Params must be an object");
    };
    match method {
        "tools/list" => success(id, json!({"tools": tools()})),
        "openenv/session/create" => match socket {
            Some(s) => success(id, json!({"session_id": s.id})),
            None => match sessions.open() {
                Ok(s) => success(id, json!({"session_id": s.id})),
                Err(e) => error(id, SERVER_ERROR, e.message.clone(), Some(e.data())),
            },
        },
        "openenv/session/close" => {
            let Some(sid) = p.get("session_id").and_then(Value::as_str) else {
                return invalid_params(id, "Invalid params - 'session_id' is required");
            };
            if socket.is_some_and(|s| s.id == sid) {
                return invalid_params(
                    id,
                    "Cannot close active WebSocket-managed session via MCP method",
                );
            }
            match sessions.get(sid) {
                Ok(s) => {
                    sessions.close(&s).await;
                    success(id, json!({"session_id": sid, "closed": true}))
                }
                Err(e) => invalid_params(id, e.message),
            }
        }
        "tools/call" => {
            let Some(name) = p.get("name").and_then(Value::as_str) else {
                return invalid_params(id, "Missing 'name' in params");
            };
            let args = p.get("arguments").cloned().unwrap_or_else(|| json!({}));
            if !args.is_object() {
                return invalid_params(id, "`arguments` must be an object");
            }
            let session = match (socket, p.get("session_id").and_then(Value::as_str)) {
                (Some(s), _) => s.clone(),
                (None, Some(sid)) => match sessions.get(sid) {
                    Ok(s) => s,
                    Err(e) => return invalid_params(id, e.message),
                },
                (None, None) => {
                    return invalid_params(
                        id,
                        "tools/call over HTTP needs `session_id` (from openenv/session/create)",
                    )
                }
            };
            let r = match name {
                "reset" => match parse_reset(&args) {
                    Ok(a) => sessions.reset(&session, a).await,
                    Err(e) => Err(e),
                },
                "run_command" | "catalogue_action" => {
                    let wanted = if name == "run_command" {
                        "command"
                    } else {
                        "index"
                    };
                    match args.get(wanted) {
                        None => return invalid_params(id, format!("`{name}` needs `{wanted}`")),
                        Some(_) => match parse_action(&args) {
                            Ok(a) => sessions.step(&session, a).await,
                            Err(e) => Err(e),
                        },
                    }
                }
                "state" => {
                    let st = sessions.state(&session).await;
                    let text = st.to_string();
                    return success(
                        id,
                        json!({"content": [{"type": "text", "text": text}], "structuredContent": st, "isError": false}),
                    );
                }
                _ => {
                    return invalid_params(
                        id,
                        format!("Tool not found: {}", crate::text::cut(name)),
                    )
                }
            };
            success(
                id,
                match r {
                    Ok(d) => tool_result(d),
                    Err(e) => tool_error(&e),
                },
            )
        }
        _ => error(
            id,
            METHOD_NOT_FOUND,
            format!("Method not found: {}", crate::text::cut(method)),
            None,
        ),
    }
}
