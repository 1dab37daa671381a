//! The JSON schemas of `/schema` (action, observation, state) and the OpenAPI document of
//! `/openapi.json`, whose `info.version` is the protocol's (`openenv validate` reads it).

use serde_json::{json, Value};

/// The OpenEnv runtime API version this server speaks (`openenv-core` 0.3 serves 1.0.0: profile `openenv-http/1.x`).
pub const API_VERSION: &str = "1.0.0";

pub fn action() -> Value {
    json!({
        "title": "EnvFactoryAction",
        "description": "A free-text shell command or an index into the task's action catalogue.",
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1, "description": "A shell command, run in the episode's current directory."},
            "index": {"type": "integer", "minimum": 0, "description": "Catalogue action N (the reset's observation lists `catalogue`)."},
            "metadata": {"type": "object"}
        },
        "oneOf": [{"required": ["command"]}, {"required": ["index"]}],
        "additionalProperties": false
    })
}

pub fn observation() -> Value {
    json!({
        "title": "EnvFactoryObservation",
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "What a language agent reads: all of the below, rendered."},
            "instruction": {"type": "string"},
            "cwd": {"type": "string"},
            "last_command": {"type": ["string", "null"]},
            "exit_code": {"type": ["integer", "null"]},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "listing": {"type": "array", "items": {"type": "string"}},
            "disk": {"type": "object", "properties": {"used_bytes": {"type": "integer"}, "size_bytes": {"type": "integer"}}},
            "step": {"type": "integer"},
            "max_steps": {"type": "integer"},
            "features": {"type": "array", "items": {"type": "number"}, "description": "Hashed text and numeric features (absent when the reset asked `features: false`)."},
            "catalogue": {"type": "array", "items": {"type": "string"}, "description": "The task's action catalogue (in the reset's observation)."},
            "progress": {"type": "number", "minimum": 0, "maximum": 1},
            "terminated": {"type": "boolean"},
            "truncated": {"type": "boolean"},
            "info": {"type": "object", "properties": {
                "infra_failure": {"type": "boolean", "description": "The sandbox failed, not the agent: mask this step from learning."},
                "error": {"type": ["string", "null"]}, "timeout": {"type": "boolean"},
                "dangerous": {"type": ["string", "null"]}, "irrelevant": {"type": "boolean"},
                "goal_reached": {"type": "boolean"}, "success": {"type": "boolean"},
                "progress": {"type": "number"}, "checks": {"type": "array"},
                "duration_us": {"type": "integer"}, "instance": {"type": "string"}
            }}
        }
    })
}

pub fn reset() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task": {"type": "string"}, "seed": {"type": "integer", "minimum": 0},
            "template": {"type": "string", "description": "A template of the server's templates directory, sampled at the seed."},
            "perturbations": {"type": "array", "items": {"type": ["string", "object"]}, "maxItems": super::protocol::MAX_PERTURBATIONS},
            "episode_id": {"type": "string", "maxLength": super::protocol::MAX_EPISODE_ID},
            "features": {"type": "boolean"},
            "max_steps": {"type": "integer", "minimum": 1, "maximum": super::protocol::MAX_RESET_STEPS, "description": "The step limit of this episode (default: the server's, else the task's)."},
            "session_id": {"type": "string"}
        },
        "additionalProperties": false
    })
}

pub fn state() -> Value {
    json!({
        "title": "EnvFactoryState",
        "type": "object",
        "properties": {
            "episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer", "minimum": 0},
            "session_id": {"type": "string"}, "started": {"type": "boolean"}, "task": {"type": "string"},
            "seed": {"type": "integer"}, "instance": {"type": ["string", "null"]}, "done": {"type": "boolean"},
            "progress": {"type": "number"}, "episode_return": {"type": "number"}
        },
        "additionalProperties": true
    })
}

pub fn all() -> Value {
    json!({"action": action(), "observation": observation(), "state": state()})
}

fn op(summary: &str, request: Option<Value>, response: Value) -> Value {
    let mut o = json!({
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": response}}},
                      "422": {"description": "Validation error"}}
    });
    if let Some(r) = request {
        o["requestBody"] = json!({"content": {"application/json": {"schema": r}}});
    }
    o
}

/// The OpenAPI 3.1 document.
pub fn openapi() -> Value {
    let result = json!({"type": "object", "properties": {
        "observation": observation(), "reward": {"type": ["number", "null"]}, "done": {"type": "boolean"}}});
    let step_req = json!({"type": "object", "properties": {
        "action": action(), "session_id": {"type": "string"}, "timeout_s": {"type": "number"},
        "request_id": {"type": "string"}}, "required": ["action"]});
    let any = json!({"type": "object"});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "EnvFactory (OpenEnv)", "version": API_VERSION,
                 "description": "OpenEnv-compatible server of EnvFactory's environments; the stateful session is the WebSocket /ws."},
        "paths": {
            "/reset": {"post": op("Reset the environment", Some(reset()), result.clone())},
            "/step": {"post": op("Execute an action (in a session)", Some(step_req), result)},
            "/state": {"get": op("Current state (of `session_id`)", None, state())},
            "/schema": {"get": op("Action, observation and state schemas", None, any.clone())},
            "/metadata": {"get": op("Environment metadata", None, any.clone())},
            "/health": {"get": op("Health check", None, json!({"type": "object", "properties": {"status": {"type": "string"}}}))},
            "/mcp": {"post": op("MCP JSON-RPC: tools/list, tools/call, openenv/session/create|close", Some(any.clone()), any)}
        }
    })
}
