//! The HTTP routes: `/health`, `/metadata`, `/schema`, `/openapi.json`, `/reset`, `/step`,
//! `/state` and `/mcp`.
//!
//! As in `openenv-core`, `POST /reset` without a session runs in a session of its own that
//! closes after the answer. A body's `session_id` (from `openenv/session/create` over `/mcp`)
//! makes `/reset`, `/step` and `/state` act on that session; a step without one is refused
//! (422): only a session holds an episode.

use super::protocol::{parse_action, parse_reset, ProtocolError};
use super::{mcp, AppState};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

fn status_of(e: &ProtocolError) -> StatusCode {
    use super::protocol::ErrorCode::*;
    match e.code {
        InvalidJson | UnknownType | ValidationError => StatusCode::UNPROCESSABLE_ENTITY,
        CapacityReached => StatusCode::SERVICE_UNAVAILABLE,
        SessionError => StatusCode::NOT_FOUND,
        ExecutionError => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn refuse(e: ProtocolError) -> Response {
    (status_of(&e), Json(json!({"detail": e.data()}))).into_response()
}

/// A body as a JSON object (empty: `{}`).
fn body(b: &Bytes) -> Result<Value, ProtocolError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(b).map_err(|e| {
        ProtocolError::new(
            super::protocol::ErrorCode::InvalidJson,
            format!("Invalid JSON: {e}"),
        )
    })
}

fn session_id(v: &Value) -> Result<Option<&str>, ProtocolError> {
    match v.get("session_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ProtocolError::new(
            super::protocol::ErrorCode::ValidationError,
            "session_id: expected a string",
        )),
    }
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "healthy"}))
}

pub async fn metadata(State(app): State<AppState>) -> Json<Value> {
    Json(json!({
        "name": "envfactory",
        "description": "Deliberately broken Linux systems to repair with shell commands, in millisecond sandboxes; a verifier judges the result.",
        "version": env!("CARGO_PKG_VERSION"),
        "author": "EnvFactory",
        "documentation_url": null,
        "readme_content": null,
        "tasks": crate::tasks::names(),
        "default_task": app.sessions.cfg.default_task,
        "templates": super::protocol::template_names(&app.sessions.cfg.templates),
        "perturbations": crate::perturb::catalogue().iter().map(|p| p.info().name).collect::<Vec<_>>(),
        "capacity": app.sessions.counts(),
        "max_frame_bytes": app.limits.max_frame_bytes,
    }))
}

pub async fn reset(State(app): State<AppState>, b: Bytes) -> Response {
    let v = match body(&b) {
        Ok(v) => v,
        Err(e) => return refuse(e),
    };
    let (args, sid) = match parse_reset(&v).and_then(|a| Ok((a, session_id(&v)?))) {
        Ok(x) => x,
        Err(e) => return refuse(e),
    };
    let r = match sid {
        Some(id) => match app.sessions.get(id) {
            Ok(s) => app.sessions.reset(&s, args).await,
            Err(e) => Err(e),
        },
        None => match app.sessions.open() {
            Ok(s) => {
                let r = app.sessions.reset(&s, args).await;
                app.sessions.close(&s).await;
                r
            }
            Err(e) => Err(e),
        },
    };
    match r {
        Ok(d) => Json(d).into_response(),
        Err(e) => refuse(e),
    }
}

pub async fn step(State(app): State<AppState>, b: Bytes) -> Response {
    let v = match body(&b) {
        Ok(v) => v,
        Err(e) => return refuse(e),
    };
    let known = ["action", "session_id", "timeout_s", "request_id"];
    if let Some(k) = v
        .as_object()
        .and_then(|m| m.keys().find(|k| !known.contains(&k.as_str())))
    {
        return refuse(ProtocolError::new(
            super::protocol::ErrorCode::ValidationError,
            format!("step body: unknown field `{}`", crate::text::cut(k)),
        ));
    }
    let action = match v.get("action") {
        Some(a) => match parse_action(a) {
            Ok(a) => a,
            Err(e) => return refuse(e),
        },
        None => {
            return refuse(ProtocolError::new(
                super::protocol::ErrorCode::ValidationError,
                "step body: `action` is required",
            ))
        }
    };
    let sid = match session_id(&v) {
        Ok(Some(s)) => s,
        Ok(None) => {
            return refuse(ProtocolError::new(
                super::protocol::ErrorCode::ValidationError,
                "an HTTP step needs `session_id` (POST /mcp openenv/session/create), or use the WebSocket /ws",
            ))
        }
        Err(e) => return refuse(e),
    };
    match app.sessions.get(sid) {
        Ok(s) => match app.sessions.step(&s, action).await {
            Ok(d) => Json(d).into_response(),
            Err(e) => refuse(e),
        },
        Err(e) => refuse(e),
    }
}

#[derive(serde::Deserialize)]
pub struct StateQuery {
    session_id: Option<String>,
}

pub async fn state(State(app): State<AppState>, Query(q): Query<StateQuery>) -> Response {
    match q.session_id {
        None => {
            Json(json!({"episode_id": null, "step_count": 0, "capacity": app.sessions.counts()}))
                .into_response()
        }
        Some(id) => match app.sessions.get(&id) {
            Ok(s) => Json(app.sessions.state(&s).await).into_response(),
            Err(e) => refuse(e),
        },
    }
}

pub async fn mcp_http(State(app): State<AppState>, b: Bytes) -> Json<Value> {
    let req: Value = match serde_json::from_slice(&b) {
        Ok(v) => v,
        Err(_) => {
            return Json(mcp::error(
                &Value::Null,
                mcp::PARSE_ERROR,
                "Parse error",
                None,
            ))
        }
    };
    Json(mcp::handle(&app.sessions, &req, None).await)
}

pub async fn schema() -> Json<Value> {
    Json(super::schema::all())
}

pub async fn openapi() -> Json<Value> {
    Json(super::schema::openapi())
}

/// Any other path.
pub async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))).into_response()
}
