//! `engine serve`: the factory's environments over the OpenEnv wire protocol
//! (`openenv-core` 0.3), many sessions per process.
//!
//! | module | what it is |
//! |---|---|
//! | [`protocol`] | frames, reset arguments, actions and observations; the error codes |
//! | [`sessions`] | one environment per session, pooled warm environments, capacity, idle reaping |
//! | [`websocket`] | `/ws`: the stateful session, keepalive, frame limit |
//! | [`routes`] | the HTTP routes (`/reset`, `/step`, `/state`, `/schema`, `/metadata`, `/health`, `/mcp`) |
//! | [`mcp`] | JSON-RPC: `tools/list`, `tools/call`, session create and close |
//! | [`schema`] | the JSON schemas and the OpenAPI document |
//! | [`auth`] | loopback by default; a bearer token for anything else |
//!
//! Protocol, session lifecycle and security: docs/serve.md.

pub mod auth;
pub mod mcp;
pub mod protocol;
pub mod routes;
pub mod schema;
pub mod sessions;
pub mod websocket;

use axum::routing::{get, post};
use sessions::{SessionConfig, Sessions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
pub use websocket::Limits;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--bind {addr}: not a loopback address, so a bearer token is required (--token-file)")]
    NeedsToken { addr: SocketAddr },
    #[error("--token-file {}: {reason}", file.display())]
    Token { file: PathBuf, reason: String },
    #[error("--bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the server's event loop: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),
}

/// Everything `engine serve` is configured with.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub bind: SocketAddr,
    pub token: Option<String>,
    pub sessions: SessionConfig,
    pub limits: Limits,
    /// Event-loop threads (the environments' work runs on blocking threads beside them).
    pub threads: usize,
}

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    pub sessions: Arc<Sessions>,
    pub limits: Limits,
}

/// The router of a server (its routes, body limit and, with a token, the bearer check).
pub fn router(app: AppState, token: Option<&str>) -> axum::Router {
    let limit = app.limits.max_frame_bytes;
    let r = axum::Router::new()
        .route("/health", get(routes::health))
        .route("/metadata", get(routes::metadata))
        .route("/schema", get(routes::schema))
        .route("/openapi.json", get(routes::openapi))
        .route("/reset", post(routes::reset))
        .route("/step", post(routes::step))
        .route("/state", get(routes::state))
        .route("/mcp", post(routes::mcp_http))
        .route("/ws", get(websocket::upgrade))
        .fallback(routes::not_found)
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(app);
    match token {
        Some(t) => r.layer(axum::middleware::from_fn_with_state(
            Arc::<str>::from(t),
            auth::require,
        )),
        None => r,
    }
}

/// Serve until the process is stopped; `ready` gets the bound address (port 0 picks one).
pub fn serve(
    cfg: ServeConfig,
    rt: sandbox::Runtime,
    cache: crate::synth::Cache,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    auth::check_bind(&cfg.bind, cfg.token.as_deref())?;
    let sessions = Arc::new(Sessions::new(cfg.sessions.clone(), rt, cache)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.threads.max(1))
        .max_blocking_threads(cfg.sessions.max_sessions.clamp(4, 1024))
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(cfg.bind)
            .await
            .map_err(|source| ServeError::Bind {
                addr: cfg.bind,
                source,
            })?;
        let addr = listener.local_addr()?;
        tracing::info!(%addr, max_sessions = cfg.sessions.max_sessions, "serving");
        ready(addr);
        let reaper = {
            let sessions = sessions.clone();
            let every = (cfg.sessions.idle_timeout / 4)
                .clamp(Duration::from_millis(50), Duration::from_secs(5));
            tokio::spawn(async move {
                let mut t = tokio::time::interval(every);
                loop {
                    t.tick().await;
                    sessions.reap_idle().await;
                }
            })
        };
        let app = AppState {
            sessions: sessions.clone(),
            limits: cfg.limits,
        };
        let r = axum::serve(listener, router(app, cfg.token.as_deref())).await;
        reaper.abort();
        sessions.shutdown().await;
        r.map_err(ServeError::Io)
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}
