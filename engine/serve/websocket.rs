//! `/ws`: the stateful session of `openenv-core`'s `EnvClient`, one session per socket.
//!
//! Frames are answered in order. A frame over the stated limit closes the socket (code 1009,
//! "message too big"); every other bad frame is answered with an error frame and the session
//! goes on. The server pings every `keepalive`; a socket silent (no frame, no pong) for three
//! keepalives, or idle past the idle timeout, is closed and its session's environment
//! returned to the pool, as on `close` and on disconnect.

use super::protocol::{parse_message, Incoming, ProtocolError};
use super::{mcp, AppState};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub async fn upgrade(State(app): State<AppState>, ws: WebSocketUpgrade) -> Response {
    let limit = app.limits.max_frame_bytes;
    // Small buffers: a held session costs kilobytes, not the 256 KiB of the defaults; frames
    // are written at once (no write buffering), which is also the lowest latency.
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .read_buffer_size(4096)
        .write_buffer_size(0)
        .on_upgrade(move |socket| run(app, socket))
}

async fn send(socket: &mut WebSocket, v: &Value) -> bool {
    socket
        .send(Message::Text(v.to_string().into()))
        .await
        .is_ok()
}

async fn run(app: AppState, mut socket: WebSocket) {
    let session = match app.sessions.open() {
        Ok(s) => s,
        Err(e) => {
            let mut frame = e.frame();
            let c = app.sessions.counts();
            frame["data"]["active_sessions"] = json!(c.active_sessions);
            frame["data"]["max_sessions"] = json!(c.max_sessions);
            let _ = send(&mut socket, &frame).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
    };
    let keepalive = app.limits.keepalive;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    let mut heard = Instant::now();
    loop {
        let msg = tokio::select! {
            m = socket.recv() => m,
            _ = ticker.tick() => {
                if heard.elapsed() > keepalive * 3 {
                    tracing::info!(session = %session.id, "no answer to keepalive pings: closing");
                    break;
                }
                if socket.send(Message::Ping(Default::default())).await.is_err() {
                    break;
                }
                continue;
            }
            _ = session.closed_notify.notified() => {
                let e = ProtocolError::new(super::protocol::ErrorCode::SessionError, "session closed by the server: idle timeout");
                let _ = send(&mut socket, &e.frame()).await;
                break;
            }
        };
        heard = Instant::now();
        let text = match msg {
            None | Some(Ok(Message::Close(_))) => break,
            Some(Err(e)) => {
                // Past the frame limit: say so with 1009 (message too big), as the RFC asks.
                let text = e.to_string();
                if text.contains("too long") || text.contains("too big") {
                    tracing::info!(session = %session.id, error = %text, "frame over the limit: closing");
                    let _ = socket
                        .send(Message::Close(Some(CloseFrame {
                            code: 1009,
                            reason: "message too big".into(),
                        })))
                        .await;
                }
                break;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Text(t))) => t.to_string(),
            Some(Ok(Message::Binary(b))) => match String::from_utf8(b.to_vec()) {
                Ok(t) => t,
                Err(_) => {
                    let e = ProtocolError::new(
                        super::protocol::ErrorCode::InvalidJson,
                        "Invalid JSON: a binary frame that is not UTF-8",
                    );
                    if !send(&mut socket, &e.frame()).await {
                        break;
                    }
                    continue;
                }
            },
        };
        if session.is_closed() {
            break;
        }
        let reply = match parse_message(&text) {
            Err(e) => e.frame(),
            Ok(Incoming::Close) => break,
            Ok(Incoming::Reset(args)) => match app.sessions.reset(&session, args).await {
                Ok(d) => json!({"type": "observation", "data": d}),
                Err(e) => e.frame(),
            },
            Ok(Incoming::Step(a)) => match app.sessions.step(&session, a).await {
                Ok(d) => json!({"type": "observation", "data": d}),
                Err(e) => e.frame(),
            },
            Ok(Incoming::State) => {
                json!({"type": "state", "data": app.sessions.state(&session).await})
            }
            Ok(Incoming::Mcp(req)) => {
                json!({"type": "mcp", "data": mcp::handle(&app.sessions, &req, Some(&session)).await})
            }
        };
        if !send(&mut socket, &reply).await {
            break;
        }
    }
    app.sessions.close(&session).await;
    let _ = socket.send(Message::Close(None)).await;
}

/// The keepalive and frame limits of the sockets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_frame_bytes: usize,
    pub keepalive: Duration,
}
