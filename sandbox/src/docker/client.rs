//! The connection to a Docker daemon: bollard's client and a private single-threaded tokio
//! runtime that its futures run on, so callers stay synchronous like the native backend.

use super::DockerError;
use bollard::Docker;
use std::future::Future;
use std::sync::Arc;

/// The daemon's address when `DOCKER_HOST` is unset.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// A connected Docker daemon. Cheap to clone; every clone shares the connection and runtime.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    docker: Docker,
    rt: tokio::runtime::Runtime,
    host: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("host", &self.inner.host)
            .finish()
    }
}

impl Client {
    /// Connect to `DOCKER_HOST` (a `unix://` socket), else [`DEFAULT_HOST`].
    pub fn from_env() -> Result<Self, DockerError> {
        let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| DEFAULT_HOST.to_string());
        Self::connect(&host)
    }

    /// Connect to the daemon at `host` (`unix:///path/docker.sock` or a socket path) and agree
    /// on an API version both sides speak (Debian's dockerd 20.10 speaks 1.41).
    pub fn connect(host: &str) -> Result<Self, DockerError> {
        let fail = |reason: String| DockerError::Connect {
            host: host.to_string(),
            reason,
        };
        let socket = host.strip_prefix("unix://").unwrap_or(host);
        if host.contains("://") && !host.starts_with("unix://") {
            return Err(fail(
                "only unix sockets are supported (the daemon must run on this host)".into(),
            ));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| fail(format!("starting the client runtime: {e}")))?;
        let docker = rt.block_on(async {
            let d = Docker::connect_with_unix(socket, 600, bollard::API_DEFAULT_VERSION)
                .map_err(|e| fail(e.to_string()))?;
            let d = d
                .negotiate_version()
                .await
                .map_err(|e| fail(e.to_string()))?;
            d.ping().await.map_err(|e| fail(e.to_string()))?;
            Ok::<_, DockerError>(d)
        })?;
        tracing::debug!(host, version = ?docker.client_version(), "connected to docker");
        Ok(Self {
            inner: Arc::new(Inner {
                docker,
                rt,
                host: host.to_string(),
            }),
        })
    }

    /// The daemon's address as given.
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    pub(crate) fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// Run a future of bollard's to completion on this client's runtime.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.inner.rt.block_on(f)
    }
}
